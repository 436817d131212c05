"""The tensors, operators and element moves (views, picks, parts, permutations) of a block's
sharding graph as `solver.auto_sharding.export_graph` builds it from the exported graph's nodes:
each tensor's dims labelled as batch or sequence dims (`TOKENS`), dims that never split (`FIXED`) or
dims that may (`FREE`); the rules of each move are the module docstring of `export_graph`'s."""

from __future__ import annotations

import math

from torch import fx

from phaze_common.checks import InputError
from graph_extract.plan_rules import fused_parts, interleaved

from .export_nodes import dim_groups, node_shape, weight_of
from .graph import Op, Operand, Tensor

#: Labels of a tensor dim: a batch or sequence dim, another dim that never splits, or one that may.
TOKENS, FIXED, FREE = "tokens", "fixed", None

_shape = node_shape


class ViewBuilder:
    """The block's operators, one per node, with each tensor's dim labels: tensors, operators, and the
    moves of a tensor's elements (views, permutations)."""

    def __init__(self, width: int, element_bytes: int, inside: set[fx.Node], routers: frozenset[fx.Node]) -> None:
        self.width, self.element_bytes, self.inside, self.routers = width, element_bytes, inside, routers
        self.tensors: dict[str, Tensor] = {}
        self.labels: dict[str, list[str | None]] = {}
        self.alias: dict[fx.Node, str] = {}
        self.ops: list[Op] = []
        self.products: dict[str, str] = {}
        self.out_dims: dict[str, str] = {}
        self.in_dims: dict[str, str] = {}
        self.dispatched: dict[fx.Node, str] = {}  # a dispatch's rows -> the tokens tensor they are picked from
        self.combines: dict[fx.Node, tuple[fx.Node, list[fx.Node]]] = {}  # a combine's end -> (product, chain)
        self.folded: set[fx.Node] = set()  # nodes that are part of an expert product's operator
        self.cuts: set[fx.Node] = set()  # cuts of a graph tensor (chunk, split, unbind): read by their pieces

    def refuse(self, node: fx.Node, what: str) -> InputError:
        """The one line refusing an operator the graph does not handle."""
        return InputError(f"plan search: {node.target} at {node.meta.get('module_path', '')}: {what} is not handled")

    def reads(self, node: fx.Node) -> bool:
        """Whether `node` is an operator of the graph: a weight product, the end of a combine, or an
        operator reading a graph tensor or a dispatch."""
        return weight_of(node) is not None or node in self.combines or any(
            self.name(argument) is not None or argument in self.dispatched or argument in self.cuts
            for argument in node.all_input_nodes)

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
        for left, right in dim_groups(a, b):
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

    def pick(self, node: fx.Node, source: fx.Node, at: int) -> None:
        """One index of dim `at` (select, a piece of unbind): that dim consumed, the others mapped."""
        name = self.name(source)
        shape = self.tensors[name].shape
        at %= len(shape)
        dims = tuple(f"i{i}" for i in range(len(shape)))
        self.add_op(node, "view", [(name, dims)], dims[:at] + dims[at + 1:], dict(zip(dims, shape)), set(),
                    [label for i, label in enumerate(self.labels[name]) if i != at], 0)

    def indexed(self, node: fx.Node, source: fx.Node, count: int) -> None:
        """x[i₀, .., iₖ₋₁] (indices of constant integers, not a dispatch): the first k dims replaced by
        the indices' dims, which do not split; the later dims mapped (the plan pass's row pick)."""
        name = self.name(source)
        shape, out = self.tensors[name].shape, _shape(node)
        rank, lead = len(shape), len(out) - (len(shape) - count)
        dims = tuple(f"i{i}" for i in range(rank))
        new = tuple(f"p{j}" for j in range(lead))
        sizes = {**dict(zip(dims, shape)), **dict(zip(new, out[:lead]))}
        labels = [FIXED] * lead + list(self.labels[name][count:])
        self.add_op(node, "view", [(name, dims)], new + dims[count:], sizes, set(dims[:count]) | set(new), labels, 0)

    def part(self, node: fx.Node, source: fx.Node, at: int, start: int, size: int, step: int) -> None:
        """`size` elements of dim `at` from `start` every `step` (a slice, a piece of chunk or split):
        the other dims mapped; dim `at` splits with the part where the plan pass splits it so
        (`splits_through`), else not."""
        name = self.name(source)
        shape = self.tensors[name].shape
        at %= len(shape)
        dims = tuple(f"i{i}" for i in range(len(shape)))
        sizes, labels, fixed = dict(zip(dims, shape)), list(self.labels[name]), set()
        out = list(dims)
        if labels[at] is FREE and self.splits_through(source, at, start, size, step):
            sizes[dims[at]] = size
        else:
            out[at], sizes["part"], labels[at] = "part", size, FIXED
            fixed.add(dims[at])
        self.add_op(node, "view", [(name, dims)], tuple(out), sizes, fixed, labels, 0)

    def splits_through(self, source: fx.Node, at: int, start: int, size: int, step: int) -> bool:
        """Whether a part of `source` splits t ways with it on dim `at`, as the plan pass splits it
        (`graph_extract.plan_rules`): a part of a fused projection's output (`fused_parts`: each rank
        holds its share of every part, each a multiple of t), or every step-th element from one of
        the first `step` to the end (each rank's contiguous share a multiple of `step`)."""
        full, parts = _shape(source)[at], fused_parts(source)
        if step > 1:
            return interleaved(start, size, step, full) and full % (self.width * step) == 0 and not parts
        return at == len(_shape(source)) - 1 and (start, size) in parts and all(
            offset % self.width == 0 and length % self.width == 0 for offset, length in parts)

    def permute(self, node: fx.Node, source: fx.Node, order: list[int]) -> None:
        name = self.name(source)
        shape = self.tensors[name].shape
        dims = tuple(f"i{i}" for i in range(len(shape)))
        self.add_op(node, "view", [(name, dims)], tuple(dims[i] for i in order), dict(zip(dims, shape)), set(),
                    [self.labels[name][i] for i in order], 0)
