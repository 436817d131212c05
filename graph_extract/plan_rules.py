"""The operator rules of the plan pass (`graph_extract.plan_pass`): for an operator with a split
input, its output's placement and the rank's operator (sizes rewritten to the rank's share, a
reduction or a norm over the split dimension completed by an all-reduce, a lookup into a split
table masked and all-reduced). Each rule is a function of the rank's graph under construction and
the original node (module docstring of `graph_extract.plan`)."""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import fx
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from phaze_common.checks import InputError
from graph_extract.parallel import all_reduce
from graph_extract.plan import REPLICATE, _normal, _shape

aten = torch.ops.aten


class RankGraph(Protocol):
    """What a rule reads and writes of one rank's graph under construction (`plan_pass.Rank`)."""

    width: int
    rank: int
    env: dict[fx.Node, fx.Node]
    placement: dict[fx.Node, object]
    replicas: dict[fx.Node, int]
    partial_group: dict[fx.Node, str]
    pending_masks: dict[fx.Node, fx.Node | None]
    mask_shapes: dict[fx.Node, int]

    def fail(self, node: fx.Node, what: str) -> InputError: ...

    def emit(self, target: object, args: tuple, kwargs: dict | None, path: str) -> fx.Node: ...

    def collective(self, target: object, value: fx.Node, path: str, *extra: object, group: str = "tensor"
                   ) -> fx.Node: ...

    def copy(self, node: fx.Node, placement: object, args: tuple | None = None, kwargs: dict | None = None
             ) -> None: ...

    def single_shard(self, node: fx.Node) -> tuple[fx.Node, int]: ...

    def split_operand(self, node: fx.Node, argument: fx.Node, dim: int) -> fx.Node: ...

    def unsqueezed(self, value: fx.Node, path: str) -> fx.Node: ...


class Resplit(Exception):
    """A replicated parameter turned out to be split with an activation: start again with it split."""

    def __init__(self, target: str, dim: int) -> None:
        super().__init__(target)
        self.target, self.dim = target, dim


def parameter_dim(parameter: fx.Node, argument: fx.Node, dim: int) -> int:
    """The parameter's dimension that becomes `dim` of `argument` through views and row picks: the one
    of the same size, else the one aligned from the end."""
    shape, seen = _shape(parameter), _shape(argument)
    same = [index for index, size in enumerate(shape) if size == seen[dim]]
    return same[0] if len(same) == 1 else len(shape) - (len(seen) - dim)


#: Operators that cut a tensor into pieces along one dimension, read through `operator.getitem`.
CUTS = (aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)


def cut_pieces(node: fx.Node) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The dimension a cut (`CUTS`) runs along and each piece's (start, size) on it (unbind: pieces of
    one element, the dimension dropped from each)."""
    rank = len(_shape(node.args[0]))
    position = 1 if node.target is aten.unbind.int else 2
    dim = _normal(node.args[position] if len(node.args) > position else node.kwargs.get("dim", 0), rank)
    sizes = [1] * _shape(node.args[0])[dim] if node.target is aten.unbind.int else [
        int(piece.shape[dim]) for piece in node.meta["val"]]
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    return dim, tuple(zip(starts, sizes))


def slice_bounds(node: fx.Node) -> tuple[int, int, int, int]:
    """A slice's dimension and its first index, length and step on it (Python's rules: negative and
    past-the-end bounds normalised)."""
    shape = _shape(node.args[0])
    dim = _normal(node.args[1] if len(node.args) > 1 else 0, len(shape))
    start, end, step = (node.args[index] if len(node.args) > index else default
                        for index, default in ((2, None), (3, None), (4, 1)))
    picked = range(shape[dim])[slice(start, end, step)]
    return dim, picked.start, len(picked), picked.step


def fused_parts(node: fx.Node) -> tuple[tuple[int, int], ...]:
    """The parts (start, size) a linear map's users cut its output's features into when every user is
    such a cut (slices of step 1, chunks and splits of its last dimension: a fused q, k, v or gate and
    up projection), in order; none unless there are several and their sizes add up to the features.
    Under a colwise split each rank holds its share of every part (`plan_pass.Rank.local_parameter`),
    as Megatron lays a fused projection out, so that a part's slice or piece on a rank is its share
    of the part."""
    if node.target is not aten.linear.default:
        return ()
    last = len(_shape(node)) - 1
    parts: set[tuple[int, int]] = set()
    for user in node.users:
        if user.target is aten.slice.Tensor and user.args[0] is node:
            at, start, size, step = slice_bounds(user)
            if (at, step) != (last, 1):
                return ()
            parts.add((start, size))
        elif user.target in CUTS and user.target is not aten.unbind.int and user.args[0] is node:
            at, pieces = cut_pieces(user)
            if at != last:
                return ()
            parts.update(pieces)
        else:
            return ()
    return tuple(sorted(parts)) if len(parts) > 1 and sum(size for _, size in parts) == _shape(node)[-1] else ()


def interleaved(start: int, size: int, step: int, full: int) -> bool:
    """Whether a slice of `size` elements from `start` every `step` of a dimension of `full` is every
    step-th element from one of the first `step` to the end (an interleaved part, as GPT-OSS's gate
    and up): on a rank holding a contiguous share of a multiple of `step`, every step-th of its own."""
    return step > 1 and start < step and size == len(range(start, full, step))


def _part_of_split(rank: RankGraph, node: fx.Node, source: fx.Node, pieces: tuple[tuple[int, int], ...]) -> None:
    """Refuse a slice or cut along the split dimension other than into a fused projection's parts
    (`fused_parts`), each a multiple of the ranks."""
    if set(pieces) - set(fused_parts(source)) or any(start % rank.width or size % rank.width
                                                     for start, size in pieces):
        raise rank.fail(node, "a cut of a split dimension other than into a fused projection's parts, each a "
                              f"multiple of {rank.width}")


def _local_sizes(rank: RankGraph, node: fx.Node, dim: int, replicas: int = 1) -> list[int]:
    """The node's sizes on one rank, dimension `dim` split in width / `replicas` slices."""
    sizes, slices = list(_shape(node)), rank.width // replicas
    if sizes[dim] % slices:
        raise rank.fail(node, f"dimension {dim} of {sizes[dim]} does not split over {rank.width} ranks")
    sizes[dim] //= slices
    return sizes


def _same(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    rank.copy(node, Shard(dim + len(_shape(node)) - len(_shape(source))))


def _view(rank: RankGraph, node: fx.Node) -> None:
    """view / reshape / expand: the split dimension is the output dimension that starts at the same
    element offset; the sizes given become the rank's."""
    source, dim = rank.single_shard(node)
    before = math.prod(_shape(source)[:dim])
    out, replicas = _shape(node), rank.replicas.get(source, 1)
    if node.target._overloadpacket is aten.expand:
        after = dim + len(out) - len(_shape(source))
        sizes = _local_sizes(rank, node, after, replicas)
        if replicas > 1 and after + 1 < len(out) and _shape(source)[dim + 1] == 1 < out[after + 1]:
            sizes[after + 1] //= replicas  # a replicated key/value head repeated for the rank's query heads
            rank.replicas[node] = replicas
        return rank.copy(node, Shard(after), args=(node.args[0], sizes, *node.args[2:]))
    # the first output dimension at that offset of more than one element; of key/value heads held by
    # `replicas` ranks each, the heads' dimension even where it holds one head
    after = next((j for j in range(len(out)) if math.prod(out[:j]) == before and (out[j] > 1 or replicas > 1)),
                 None)
    if after is None or (out[after] % (rank.width // replicas)):
        raise rank.fail(node, f"a reshape of {Shard(dim)} to {list(out)}")
    if replicas > 1 and out[after] > _shape(source)[dim]:  # replicated heads merged with their repeats
        rank.replicas[node], replicas = 1, 1
    rank.copy(node, Shard(after), args=(node.args[0], _local_sizes(rank, node, after, replicas), *node.args[2:]))


def _unflatten(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1], len(_shape(source)))
    if at < dim:
        return rank.copy(node, Shard(dim + len(node.args[2]) - 1))
    if at > dim:
        return rank.copy(node, Shard(dim))
    sizes = _local_sizes(rank, node, at, rank.replicas.get(source, 1))
    rank.copy(node, Shard(at), args=(node.args[0], node.args[1], sizes[at:at + len(node.args[2])]))


def _flatten(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    length = len(_shape(source))
    start = _normal(node.args[1] if len(node.args) > 1 else 0, length)
    end = _normal(node.args[2] if len(node.args) > 2 else -1, length)
    if dim < start:
        return rank.copy(node, Shard(dim))
    if dim > end:
        return rank.copy(node, Shard(dim - (end - start)))
    if dim != start:
        raise rank.fail(node, f"a flatten of {Shard(dim)} inside dimensions {start}-{end}")
    if end > start:  # replicated key/value heads merged with their repeats: evenly split
        rank.replicas[node] = 1
    rank.copy(node, Shard(start))


def _transpose(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    length = len(_shape(source))
    a, b = _normal(node.args[1], length), _normal(node.args[2], length)
    rank.copy(node, Shard(b if dim == a else a if dim == b else dim))


def _permute(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    order = [_normal(d, len(_shape(source))) for d in node.args[1]]
    rank.copy(node, Shard(order.index(dim)))


def _unsqueeze(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1], len(_shape(node)))
    rank.copy(node, Shard(dim + 1 if at <= dim else dim))


def _squeeze(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    shape = _shape(source)
    dims = node.args[1] if len(node.args) > 1 else [d for d, size in enumerate(shape) if size == 1]
    dims = [dims] if isinstance(dims, int) else dims
    removed = [_normal(d, len(shape)) for d in dims if shape[_normal(d, len(shape))] == 1]
    rank.copy(node, Shard(dim - sum(1 for d in removed if d < dim)))


def _slice(rank: RankGraph, node: fx.Node) -> None:
    """A slice along the split dimension: every step-th element from one of the first `step` (an
    interleaved part: every step-th of the rank's), or a fused projection's part (`fused_parts`:
    the rank's share of the part)."""
    source, dim = rank.single_shard(node)
    at, start, size, step = slice_bounds(node)
    if at != dim:
        return rank.copy(node, Shard(dim))
    full = _shape(source)[dim]
    if interleaved(start, size, step, full):
        if full % (rank.width // rank.replicas.get(source, 1) * step):
            raise rank.fail(node, f"every {step}th element of a dimension of {full} split over {rank.width} ranks")
        return rank.copy(node, Shard(dim))
    if step != 1:
        raise rank.fail(node, f"a slice of step {step} from {start} of a split dimension")
    _part_of_split(rank, node, source, ((start, size),))
    rank.copy(node, Shard(dim), args=(node.args[0], at, start // rank.width, (start + size) // rank.width))


def _index(rank: RankGraph, node: fx.Node) -> None:
    """tensor[indices] (rows picked by replicated indices) of a tensor split on a later dimension."""
    source, indices = node.args[0], node.args[1]
    placement = rank.placement[source]
    if any(index is not None and not isinstance(rank.placement[index], Replicate) for index in indices) or \
            not isinstance(placement, Shard):
        raise rank.fail(node, "an indexing by split indices")
    dim = _normal(placement.dim, len(_shape(source)))
    if dim < len(indices):
        raise rank.fail(node, f"an indexing along the split dimension {dim}")
    rank.copy(node, Shard(dim + len(_shape(node)) - len(_shape(source))))


def _select(rank: RankGraph, node: fx.Node) -> None:
    """x.select(dim, index) along another dimension than the split one."""
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1], len(_shape(source)))
    if at == dim:
        raise rank.fail(node, "a pick along the split dimension")
    rank.copy(node, Shard(dim - (at < dim)))


def _cut(rank: RankGraph, node: fx.Node) -> None:
    """chunk, split, split_with_sizes, unbind (`CUTS`): along another dimension than the split one,
    each piece split as the input; along it, a fused projection's parts (`fused_parts`), each piece
    the rank's share of its part."""
    source, dim = rank.single_shard(node)
    at, pieces = cut_pieces(node)
    if at != dim:
        after = dim - 1 if node.target is aten.unbind.int and at < dim else dim
        return rank.copy(node, tuple(Shard(after) for _ in pieces))
    if node.target is aten.unbind.int:
        raise rank.fail(node, "an unbind of the split dimension")
    _part_of_split(rank, node, source, pieces)
    sizes = node.args[1]  # a chunk's count; a split's size or sizes: the rank's
    if node.target._overloadpacket is not aten.chunk:
        sizes = sizes // rank.width if isinstance(sizes, int) else [size // rank.width for size in sizes]
    rank.copy(node, tuple(Shard(dim) for _ in pieces), args=(node.args[0], sizes, *node.args[2:]))


def _cat(rank: RankGraph, node: fx.Node) -> None:
    tensors = node.args[0]
    length = len(_shape(node))
    at = _normal(node.args[1] if len(node.args) > 1 else 0, length)
    dims = {_normal(rank.placement[t].dim, length) for t in tensors if isinstance(rank.placement[t], Shard)}
    if len(dims) != 1 or at in dims:
        raise rank.fail(node, f"a concatenation of {[str(rank.placement[t]) for t in tensors]} on {at}")
    dim = dims.pop()
    args = list(tensors)
    for index, tensor in enumerate(tensors):
        if isinstance(rank.placement[tensor], Replicate) and _shape(tensor)[dim] > 1:
            args[index] = rank.split_operand(node, tensor, dim)
    rank.copy(node, Shard(dim), args=(args, *node.args[1:]))


def _matmul(rank: RankGraph, node: fx.Node) -> None:
    """A product of activations split on a batch dimension (the heads) is split there."""
    a, b = node.args[0], node.args[1]
    pa, pb = rank.placement[a], rank.placement[b]
    la, lb, lo = len(_shape(a)), len(_shape(b)), len(_shape(node))
    if isinstance(pa, Shard) and isinstance(pb, Shard):
        da, db = _normal(pa.dim, la) + lo - la, _normal(pb.dim, lb) + lo - lb
        if da == db and da < lo - 2:
            return rank.copy(node, Shard(da))
    raise rank.fail(node, f"a product of {pa} and {pb} activations")


def _softmax(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    if _normal(node.args[1], len(_shape(source))) == dim:
        raise rank.fail(node, "a softmax over the split dimension")
    rank.copy(node, Shard(dim))


def _no_grad(rank: RankGraph, node: fx.Node) -> None:
    raise rank.fail(node, "a no-grad region reading a split tensor")


def reduction(rank: RankGraph, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    ndim = len(_shape(source))
    reduced = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    reduced = [reduced] if isinstance(reduced, int) else list(reduced or range(ndim))
    keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
    if dim not in {_normal(d, ndim) for d in reduced}:
        after = dim - sum(1 for d in reduced if _normal(d, ndim) < dim) * (not keep)
        return rank.copy(node, Shard(after))
    name = node.target._overloadpacket.__name__
    if name not in ("amax", "sum", "mean"):
        raise rank.fail(node, f"a {name} over the split dimension")
    path = node.meta.get("module_path", "")
    rank.copy(node, REPLICATE)
    if name == "mean":  # the mean of the ranks' means
        rank.env[node] = rank.emit(aten.div.Scalar, (rank.env[node], rank.width), {}, path)
    rank.env[node] = rank.collective(all_reduce, rank.env[node], path, "max" if name == "amax" else "sum")


def values_and_indices(rank: RankGraph, node: fx.Node) -> None:
    """max(x, dim) / topk(x, k, dim): both outputs split as the input, the dimension not the split one."""
    source, dim = rank.single_shard(node)
    ndim = len(_shape(source))
    reduced = _normal(node.args[1] if node.target._overloadpacket is aten.max else (
        node.args[2] if len(node.args) > 2 else -1), ndim)
    keep = node.target._overloadpacket is aten.topk or (len(node.args) > 2 and bool(node.args[2]))
    if reduced == dim:
        raise rank.fail(node, "a maximum over the split dimension")
    after = dim if keep or reduced > dim else dim - 1
    rank.copy(node, (Shard(after), Shard(after)))


def lookup(rank: RankGraph, node: fx.Node) -> None:
    """embedding(table, ids) or gather(source, dim, ids) into a table split on the looked-up dimension."""
    embedding = node.target is aten.embedding.default
    table, ids = (node.args[0], node.args[1]) if embedding else (node.args[0], node.args[2])
    placement = rank.placement[table]
    looked_up = 0 if embedding else _normal(node.args[1], len(_shape(table)))
    if not isinstance(rank.placement[ids], Replicate) or not isinstance(placement, Shard):
        raise rank.fail(node, f"a lookup of {rank.placement[ids]} indices")
    if _normal(placement.dim, len(_shape(table))) != looked_up:
        if embedding:
            raise rank.fail(node, f"an embedding table split on {placement}")
        return rank.copy(node, placement)
    path = node.meta.get("module_path", "")
    unsqueeze = ids.target is aten.unsqueeze.default and _normal(ids.args[1], len(_shape(ids))) == len(
        _shape(ids)) - 1
    if unsqueeze:  # mask the indices before they gain the lookup's dimension
        ids = ids.args[0]
    local_ids, outside = rank.env[ids], None
    if rank.width > 1:  # the indices outside the rank's rows look up its row 0, then are zeroed
        rows = _shape(table)[looked_up] // rank.width
        start, end = rank.rank * rows, (rank.rank + 1) * rows
        below = rank.emit(aten.lt.Scalar, (local_ids, start), {}, path)
        above = rank.emit(aten.ge.Scalar, (local_ids, end), {}, path)
        outside = rank.emit(aten.bitwise_or.Tensor, (below, above), {}, path)
        shifted = rank.emit(aten.sub.Tensor, (local_ids, start), {}, path)
        local_ids = rank.emit(aten.masked_fill.Scalar, (shifted, outside, 0), {}, path)
    index = rank.unsqueezed(local_ids, path) if unsqueeze else local_ids
    args = (rank.env[table], index) if embedding else (rank.env[table], node.args[1], index)
    rank.env[node] = rank.emit(node.target, (*args, *node.args[len(args):]), {}, path)
    rank.placement[node], rank.partial_group[node] = Partial(), "tensor"
    rank.pending_masks[node], rank.mask_shapes[node] = outside, len(_shape(ids))


def norm(rank: RankGraph, node: fx.Node) -> None:
    """rms_norm(x, shape, weight, eps) over a split last dimension: the mean of squares all-reduced."""
    source, dim = rank.single_shard(node)
    ndim = len(_shape(source))
    if node.target is not aten.rms_norm.default or dim != ndim - 1:
        if dim < ndim - len(node.args[1]):
            return rank.copy(node, Shard(dim))
        raise rank.fail(node, "a layer norm over the split dimension")
    path = node.meta.get("module_path", "")
    x = rank.env[source]
    size = _shape(source)[-1]
    squares = rank.emit(aten.pow.Tensor_Scalar, (x, 2), {}, path)
    total = rank.emit(aten.sum.dim_IntList, (squares, [-1], True), {}, path)
    total = rank.collective(all_reduce, total, path, "sum")
    eps = node.args[3] if len(node.args) > 3 and node.args[3] is not None else torch.finfo(torch.float32).eps
    mean = rank.emit(aten.div.Scalar, (total, size), {}, path)
    scale = rank.emit(aten.rsqrt.default, (rank.emit(aten.add.Scalar, (mean, eps), {}, path),), {}, path)
    out = rank.emit(aten.mul.Tensor, (x, scale), {}, path)
    weight = node.args[2] if len(node.args) > 2 else None
    if weight is not None:
        if not isinstance(rank.placement[weight], Shard):
            raise Resplit(weight.target, 0)
        out = rank.emit(aten.mul.Tensor, (out, rank.env[weight]), {}, path)
    rank.env[node] = out
    rank.placement[node] = Shard(dim)


#: The rules an operator's overload packet follows (an operator without one: pointwise, or refused).
RULES = {
    aten.view: _view, aten.reshape: _view, aten._unsafe_view: _view, aten.expand: _view,
    aten.unflatten: _unflatten, aten.flatten: _flatten, aten.transpose: _transpose, aten.permute: _permute,
    aten.unsqueeze: _unsqueeze, aten.squeeze: _squeeze, aten.slice: _slice, aten.select: _select,
    aten.chunk: _cut, aten.split: _cut, aten.split_with_sizes: _cut, aten.unbind: _cut,
    aten.cat: _cat, aten.index: _index, aten.matmul: _matmul, aten.bmm: _matmul, aten.softmax: _softmax, aten._softmax: _softmax,
    **{op: _same for op in (aten.contiguous, aten.clone, aten.to, aten._to_copy, aten.type_as, aten.alias,
                            aten.detach, aten.dropout, aten._assert_tensor_metadata)},
    aten.max: values_and_indices, aten.topk: values_and_indices,
    aten.amax: reduction, aten.sum: reduction, aten.mean: reduction,
    aten.embedding: lookup, aten.gather: lookup,
    aten.rms_norm: norm, aten.layer_norm: norm,
}
#: The rules through which a split operand is still a view of its parameter (`Rank.split_operand`).
VIEWS = frozenset({_view, _same, _unsqueeze, _index})
