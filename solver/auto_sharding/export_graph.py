"""The sharding graph of an exported model's first transformer block (the search of
`solver.auto_sharding.from_export`).

The first block's nodes of the exported, unsharded graph (`graph_extract.export`: module path
`<blocks>.0` or under it) become a `ShardingGraph`, one operator per node, each tensor with the
node's shape; an operator's iteration dims are named by position:

- a weight product (aten.linear, mm or matmul of a `get_attr` weight): `x[..,k] w[n,k] -> y[..,n]`;
  splitting n is `colwise`, k `rowwise`, nothing is replicated compute;
- an activation product (matmul, bmm: the explicit attention core) and
  aten.scaled_dot_product_attention (and its flash and efficient variants) over (b, heads, s,
  head_dim): only the heads may split;
- element-wise operators (operands aligned from the last dim; a broadcast size-1 dim is its own,
  unsplit dim), norms (rms_norm, layer_norm) and softmax and reductions (their reduced dims unsplit);
- views (view, reshape, unflatten, flatten, unsqueeze, squeeze, expand, transpose, permute, slice,
  cat): dims mapped by their sizes, a merged dim (heads·head_dim) and its leading factor (heads)
  being one iteration dim that splits as many ways as the factor (a split of the merged dim is a
  split of its leading factor); the other factors, a sliced or concatenated dim and an expanded one
  do not split.

The batch and sequence dims (those of the block's input but its last, and every dim they flow into)
and the head dim never split: data and context parallelism are other axes of phaze's search. A dim
of size n splits t ways if t divides n or, as a grouped-query attention's key/value heads under
Megatron's rule, n divides t (each of the n parts then held by t/n ranks; the ILP prices such a split
as t ways). Parameters other than the weight products' (norms' scales, biases) and buffers (masks,
rotary tables) are constants outside the graph. A mixture of experts (grouped products, routing) is
refused: its placement is expert parallelism's.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import fx

from phaze_common.checks import InputError, positive_integer

from .graph import Op, Operand, ShardingGraph, Tensor

aten = torch.ops.aten
#: Labels of a tensor dim: a batch or sequence dim, another dim that never splits, or one that may.
TOKENS, FIXED, FREE = "tokens", "fixed", None

_WEIGHT_PRODUCTS = (aten.linear.default, aten.mm.default, aten.matmul.default)
_ACTIVATION_PRODUCTS = (aten.matmul.default, aten.bmm.default, aten.mm.default)
_ATTENTION = (aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention.default,
              aten._scaled_dot_product_efficient_attention.default,
              aten._scaled_dot_product_flash_attention_for_cpu.default)
_MIXTURE = (aten._grouped_mm.default, aten.index_select.default, aten.index.Tensor, aten.topk.default)
_NORMS = (aten.rms_norm.default, aten.layer_norm.default)
_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_REDUCTIONS = (aten.mean.dim, aten.sum.dim_IntList, aten.amax.default)
_RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unflatten.int,
             aten.flatten.using_ints, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
             aten.squeeze.default)
_IDENTITIES = (aten.clone.default, aten.contiguous.default, aten._to_copy.default, aten.to.dtype,
               aten.alias.default, aten.detach.default, aten.dropout.default, aten.type_as.default)


@dataclass(frozen=True, kw_only=True)
class BlockGraph:
    """A block's sharding graph, the module of each weight product (operator name -> module path in
    the first block) and the product's output dim (its split: colwise) and contracted dim (rowwise)."""

    graph: ShardingGraph
    blocks: str
    products: Mapping[str, str]
    out_dims: Mapping[str, str]
    in_dims: Mapping[str, str]


def _shape(node: object) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    if not hasattr(meta, "shape"):  # none, or a tuple of outputs
        return None
    return tuple(int(size) for size in meta.shape)


def _in_block(node: fx.Node, prefix: str) -> bool:
    path = node.meta.get("module_path", "")
    return path == prefix or path.startswith(prefix + ".")


def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The dims of two shapes of the same elements in consecutive groups of equal products (a size-1
    dim alone in its group)."""
    i = j = 0
    found: list[tuple[list[int], list[int]]] = []
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1:
            found.append(([i], []))
            i += 1
            continue
        if j < len(b) and b[j] == 1:
            found.append(([], [j]))
            j += 1
            continue
        left, right, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                left.append(i)
                pa *= a[i]
                i += 1
            else:
                right.append(j)
                pb *= b[j]
                j += 1
        found.append((left, right))
    return found


class _Builder:
    """The block's operators, one per node, with each tensor's dim labels."""

    def __init__(self, width: int, element_bytes: int) -> None:
        self.width, self.element_bytes = width, element_bytes
        self.tensors: dict[str, Tensor] = {}
        self.labels: dict[str, list[str | None]] = {}
        self.alias: dict[fx.Node, str] = {}
        self.ops: list[Op] = []
        self.products: dict[str, str] = {}
        self.out_dims: dict[str, str] = {}
        self.in_dims: dict[str, str] = {}

    def name(self, node: object) -> str | None:
        """The graph tensor of a node, None for a constant."""
        if not isinstance(node, fx.Node):
            return None
        name = self.alias.get(node, node.name)
        return name if name in self.tensors and not self.tensors[name].parameter else None

    def add_tensor(self, name: str, shape: tuple[int, ...], labels: list[str | None], parameter: bool = False) -> None:
        self.tensors[name] = Tensor(name=name, dims=tuple(f"d{i}" for i in range(len(shape))), shape=shape,
                                    element_bytes=self.element_bytes, parameter=parameter)
        self.labels[name] = labels

    def capacity(self, size: int) -> int:
        """Ways a dim of `size` may split: t if t divides it or (Megatron's key/value rule) it divides t."""
        return self.width if size > 1 and self.width % size == 0 else size

    def add_op(self, node: fx.Node, kind: str, inputs: list[tuple[str, tuple[str, ...]]], out_dims: tuple[str, ...],
               sizes: dict[str, int], fixed: set[str], labels: list[str | None], flops: float,
               shape: tuple[int, ...] | None = None) -> None:
        self.add_tensor(node.name, shape or _shape(node), labels)
        fixed = set(fixed) | {dim for dim, label in zip(out_dims, labels) if label is not FREE}
        if kind != "product":
            fixed |= set(sizes) - set(out_dims)
        self.ops.append(Op(name=node.name, kind=kind,
                           inputs=tuple(Operand(tensor=t, dims=d) for t, d in inputs),
                           output=Operand(tensor=node.name, dims=out_dims),
                           sizes=tuple((dim, self.capacity(size) if dim not in fixed else size)
                                       for dim, size in sizes.items()),
                           fixed=frozenset(fixed), flops=float(flops)))

    # operators ---------------------------------------------------------------------------------
    def aligned(self, node: fx.Node, kind: str, operands: list[fx.Node], fixed_positions: set[int] = frozenset(),
                flops: float | None = None) -> None:
        """Operands aligned with the output from the last dim; a broadcast dim is its own."""
        out = _shape(node)
        rank = len(out)
        sizes = {f"i{i}": size for i, size in enumerate(out)}
        labels: list[str | None] = [FIXED if i in fixed_positions else FREE for i in range(rank)]
        seen = [False] * rank
        inputs, fixed = [], {f"i{i}" for i in fixed_positions}
        for index, operand in enumerate(operands):
            name = self.name(operand)
            if name is None:
                continue
            shape, dims = self.tensors[name].shape, []
            for j, size in enumerate(shape):
                i = j + rank - len(shape)
                if size == out[i] and i not in fixed_positions:
                    dims.append(f"i{i}")
                    label = self.labels[name][j]
                    if label is not FREE and labels[i] is not TOKENS:
                        labels[i] = label
                    seen[i] = True
                else:
                    dims.append(f"u{index}_{j}")
                    sizes[f"u{index}_{j}"] = size
                    fixed.add(f"u{index}_{j}")
            inputs.append((name, tuple(dims)))
        for i in range(rank):
            if not seen[i] and labels[i] is FREE:
                labels[i] = FIXED  # a dim only constants hold
        if flops is None:
            flops = 0 if kind == "view" else math.prod(out)
        self.add_op(node, kind, inputs, tuple(f"i{i}" for i in range(rank)), sizes, fixed, labels, flops)

    def reshape(self, node: fx.Node, source: fx.Node) -> None:
        """A view: dims grouped by sizes, each group's leading factors one dim."""
        name = self.name(source)
        a, b = self.tensors[name].shape, _shape(node)
        if math.prod(a) != math.prod(b):
            raise self.refuse(node, f"a view of {list(a)} as {list(b)}")
        in_dims, out_dims = [f"a{i}" for i in range(len(a))], [f"b{j}" for j in range(len(b))]
        sizes = {**{f"a{i}": s for i, s in enumerate(a)}, **{f"b{j}": s for j, s in enumerate(b)}}
        labels: list[str | None] = [FIXED] * len(b)
        fixed = set(sizes)
        for left, right in _groups(a, b):
            lead_a = next((i for i in left if a[i] > 1), None)
            lead_b = next((j for j in right if b[j] > 1), None)
            if lead_a is None or lead_b is None:
                continue
            shared = f"g{lead_a}"
            in_dims[lead_a] = out_dims[lead_b] = shared
            del sizes[f"a{lead_a}"], sizes[f"b{lead_b}"]
            sizes[shared] = min(a[lead_a], b[lead_b])
            labels[lead_b] = self.labels[name][lead_a]
            for j in right:
                if j != lead_b and self.labels[name][lead_a] is TOKENS:
                    labels[j] = TOKENS
            if labels[lead_b] is FREE:
                fixed.discard(shared)
            fixed -= {f"a{lead_a}", f"b{lead_b}"}
        self.add_op(node, "view", [(name, tuple(in_dims))], tuple(out_dims), sizes, fixed & set(sizes), labels, 0)

    def permute(self, node: fx.Node, source: fx.Node, order: list[int]) -> None:
        name = self.name(source)
        shape = self.tensors[name].shape
        dims = tuple(f"i{i}" for i in range(len(shape)))
        self.add_op(node, "view", [(name, dims)], tuple(dims[i] for i in order), dict(zip(dims, shape)), set(),
                    [self.labels[name][i] for i in order], 0)

    def weight_product(self, node: fx.Node, source: fx.Node, weight: fx.Node, transposed: bool) -> None:
        """x[.., k] · w -> y[.., n], w [n, k] (a linear map) or [k, n]."""
        name = self.name(source)
        if name is None:
            raise self.refuse(node, "a product of a weight and a constant")
        x = self.tensors[name].shape
        (n, k) = weight_shape = _shape(weight) if transposed else tuple(reversed(_shape(weight)))
        if len(weight_shape) != 2 or x[-1] != k:
            raise self.refuse(node, f"a product of {list(x)} and a weight of {list(_shape(weight))}")
        lead = tuple(f"i{i}" for i in range(len(x) - 1))
        parameter = weight.target
        self.add_tensor(parameter, _shape(weight), [FREE, FREE], parameter=True)
        sizes = {**dict(zip(lead, x[:-1])), "k": k, "n": n}
        labels = [*self.labels[name][:-1], FREE]
        self.add_op(node, "product", [(name, (*lead, "k")), (parameter, ("n", "k") if transposed else ("k", "n"))],
                    (*lead, "n"), sizes, {"k"} if self.labels[name][-1] is not FREE else set(), labels,
                    2 * math.prod(x) * n)
        self.products[node.name] = parameter.rpartition(".")[0]
        self.out_dims[node.name], self.in_dims[node.name] = "n", "k"

    def activation_product(self, node: fx.Node, left: fx.Node, right: fx.Node) -> None:
        """a[.., m, k] · b[.., k, n] -> [.., m, n] (batch dims aligned)."""
        out = _shape(node)
        names = [self.name(left), self.name(right)]
        if None in names or len(out) < 3:
            raise self.refuse(node, "a product of an activation and a constant")
        shapes = [self.tensors[name].shape for name in names]
        rank = len(out)
        batch = [f"i{i}" for i in range(rank - 2)]
        sizes = {**dict(zip(batch, out[:-2])), "m": out[-2], "k": shapes[0][-1], "n": out[-1]}
        inputs, fixed = [], set()
        labels: list[str | None] = [FREE] * (rank - 2) + [self.labels[names[0]][-2], self.labels[names[1]][-1]]
        for index, (name, shape, tail) in enumerate(zip(names, shapes, (("m", "k"), ("k", "n")))):
            dims = []
            for j, size in enumerate(shape[:-2]):
                i = j + rank - len(shape)
                if size == out[i]:
                    dims.append(batch[i])
                    if self.labels[name][j] is not FREE:
                        labels[i] = self.labels[name][j]
                else:
                    dims.append(f"u{index}_{j}")
                    sizes[f"u{index}_{j}"] = size
                    fixed.add(f"u{index}_{j}")
            inputs.append((name, (*dims, *tail)))
        if self.labels[names[0]][-1] is not FREE:
            fixed.add("k")
        self.add_op(node, "product", inputs, (*batch, "m", "n"), sizes, fixed, labels,
                    2 * math.prod(out) * shapes[0][-1])

    def attention(self, node: fx.Node) -> None:
        """softmax(q·kᵀ)·v over q [.., s, d], k [.., r, d], v [.., r, dv] -> [.., s, dv]."""
        names = [self.name(argument) for argument in node.args[:3]]
        if None in names:
            raise self.refuse(node, "an attention of constants")
        q, k, v = (self.tensors[name].shape for name in names)
        batch = [f"i{i}" for i in range(len(q) - 2)]
        sizes = {**dict(zip(batch, q[:-2])), "s": q[-2], "r": k[-2], "d": q[-1], "dv": v[-1]}
        inputs = [(names[0], (*batch, "s", "d")), (names[1], (*batch, "r", "d")), (names[2], (*batch, "r", "dv"))]
        labels = [*self.labels[names[0]][:-1], FIXED]
        self.add_op(node, "product", inputs, (*batch, "s", "dv"), sizes, {"s", "r", "d", "dv"}, labels,
                    2 * math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1]), shape=(*q[:-1], v[-1]))

    def reduced(self, node: fx.Node, kind: str, source: fx.Node, reduced: list[int], keep: bool) -> None:
        """A norm or reduction of `source` over its `reduced` dims (kept as size-1 dims with `keep`)."""
        name = self.name(source)
        shape = self.tensors[name].shape
        dims = tuple(f"i{i}" for i in range(len(shape)))
        reduced = sorted({d % len(shape) for d in reduced})
        sizes = dict(zip(dims, shape))
        if keep is None:  # a norm: the output has the input's dims
            out_dims, labels = dims, list(self.labels[name])
        else:
            out_dims = tuple(dim if i not in reduced else f"o{i}" for i, dim in enumerate(dims) if keep or i not in reduced)
            sizes.update({f"o{i}": 1 for i in reduced if keep})
            labels = [label if i not in reduced else FIXED for i, label in enumerate(self.labels[name])
                      if keep or i not in reduced]
        self.add_op(node, kind, [(name, dims)], out_dims, sizes, {dims[i] for i in reduced}, labels, math.prod(shape))

    def refuse(self, node: fx.Node, what: str) -> InputError:
        return InputError(f"plan search: {node.target} at {node.meta.get('module_path', '')}: {what} is not handled")

    def node(self, node: fx.Node) -> None:
        target, args = node.target, node.args
        if target in _MIXTURE:
            raise InputError(f"plan search: {target} at {node.meta.get('module_path', '')}: a mixture of experts "
                             "(grouped products, routing) is not handled; its split is expert parallelism's")
        if target is operator.getitem:
            if args[1] != 0 or self.name(args[0]) is None:
                raise self.refuse(node, f"output {args[1]} of {args[0].target}")
            self.alias[node] = self.name(args[0])
            return
        if target in _WEIGHT_PRODUCTS and isinstance(args[1], fx.Node) and args[1].op == "get_attr":
            return self.weight_product(node, args[0], args[1], transposed=target is aten.linear.default)
        if _shape(node) is None and not node.users:  # a check without a value (_assert_tensor_metadata)
            return
        if _shape(node) is None and target not in _ATTENTION:
            raise self.refuse(node, "an operator without one tensor output")
        if target in _ACTIVATION_PRODUCTS:
            return self.activation_product(node, args[0], args[1])
        if target in _ATTENTION:
            return self.attention(node)
        if target in _NORMS:
            return self.reduced(node, "normalise", args[0], list(range(-len(args[1]), 0)), None)
        if target in _SOFTMAX:
            return self.reduced(node, "normalise", args[0], [args[1]], None)
        if target in _REDUCTIONS:
            dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or range(len(_shape(args[0]))))
            keep = bool(args[2]) if len(args) > 2 else bool(node.kwargs.get("keepdim", False))
            return self.reduced(node, "normalise", args[0], dims, keep)
        if target in _RESHAPES:
            return self.reshape(node, args[0])
        if target is aten.transpose.int:
            order = list(range(len(_shape(node))))
            a, b = args[1] % len(order), args[2] % len(order)
            order[a], order[b] = order[b], order[a]
            return self.permute(node, args[0], order)
        if target is aten.permute.default:
            return self.permute(node, args[0], [d % len(_shape(node)) for d in args[1]])
        if target is aten.expand.default:
            source = _shape(args[0])
            rank = len(_shape(node))
            grown = {i + rank - len(source) for i, size in enumerate(source) if size != _shape(node)[i + rank - len(source)]}
            return self.aligned(node, "view", [args[0]], grown | set(range(rank - len(source))), 0)
        if target is aten.slice.Tensor:
            return self.aligned(node, "view", [args[0]], {(args[1] if len(args) > 1 else 0) % len(_shape(node))}, 0)
        if target is aten.cat.default:
            return self.aligned(node, "view", list(args[0]), {(args[1] if len(args) > 1 else 0) % len(_shape(node))}, 0)
        if target in _IDENTITIES:
            return self.aligned(node, "view", [args[0]], set(), 0)
        if torch.Tag.pointwise in getattr(target, "tags", ()):
            return self.aligned(node, "elementwise", [a for a in node.all_input_nodes])
        raise self.refuse(node, "this operator")


def block_graph(module: fx.GraphModule, blocks: str, width: int, element_bytes: int = 2) -> BlockGraph:
    """The sharding graph of the first block (`<blocks>.0`) of an exported graph at `width` ranks."""
    positive_integer("width", width)
    prefix = f"{blocks}.0"
    nodes = [node for node in module.graph.nodes if node.op == "call_function" and _in_block(node, prefix)]
    if not nodes:
        raise InputError(f"blocks: no node of module {prefix} in the exported graph")
    inside = set(nodes)
    outputs = [node for node in nodes if any(user not in inside for user in node.users)]
    if len(outputs) != 1 or _shape(outputs[0]) is None:
        raise InputError(f"blocks: {prefix} must hand one tensor to what follows, got {[n.name for n in outputs]}")
    shape = _shape(outputs[0])
    builder = _Builder(width, element_bytes)
    for node in nodes:
        for argument in node.all_input_nodes:
            if argument not in inside and argument.op != "get_attr" and _shape(argument) == shape \
                    and argument.name not in builder.tensors:
                builder.add_tensor(argument.name, shape, [TOKENS] * (len(shape) - 1) + [FREE])
    if not builder.tensors:
        raise InputError(f"blocks: {prefix} reads no tensor of its output's shape {list(shape)}")
    for node in nodes:
        is_product = node.target in _WEIGHT_PRODUCTS and len(node.args) > 1 and isinstance(node.args[1], fx.Node) \
            and node.args[1].op == "get_attr"
        if is_product or any(builder.name(argument) is not None for argument in node.all_input_nodes):
            builder.node(node)
    graph = ShardingGraph(tensors=tuple(builder.tensors.values()), ops=tuple(builder.ops),
                          input_boundary="replicated", output_boundary="replicated")
    return BlockGraph(graph=graph, blocks=blocks, products=MappingProxyType(builder.products),
                      out_dims=MappingProxyType(builder.out_dims), in_dims=MappingProxyType(builder.in_dims))
