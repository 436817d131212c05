"""A sharding graph: tensors with named dims, and operators written as einsums over named iteration
dims.

An operator reads its operands and writes one output; each operand names, for each of its tensor's
dims in order, the operator's iteration dim it runs along (`x[b,s,k] w[k,n] -> y[b,s,n]`). Kinds:

- `product`: an einsum (a linear layer, attention's batched products, the grouped products and the
  dispatch/combine of a mixture of experts); an iteration dim absent from the output is contracted:
  splitting it leaves the output Partial (a sum still to be taken over the axis). Products are the
  heavy operators.
- `elementwise`: an output element from the same-index elements of the operands (ReLU, GeLU,
  residual add); an operand may broadcast (lack some dims).
- `normalise`: softmax or layer norm, reducing over its `fixed` dims, which may not be split.
- `view`: a selection or reshape without arithmetic (e.g. Q, K or V out of a fused QKV tensor); the
  dims it drops are fixed.
- `route`: a mixture of experts' top-k routing with capacity: builds the dispatch mask from the
  gate's probabilities; the expert and capacity dims (and the tokens of a group, whose capacity
  slots are counted in order) are fixed.

In every kind but `product`, a dim absent from the output is fixed (its result is not a sum of
partial results). FLOPs are the forward pass's: 2 per multiply-add of a product (the product of all
its iteration dims' sizes, times 2), one per output element otherwise, 0 for a view (a builder may
give its own count). Every operator's output carries a gradient (every builder's operators lie
downstream of a parameter); a graph input is either `any` (data: it arrives in whatever placement
its consumers want and needs no gradient) or `replicated` (as a layer inside a stack: it arrives
whole on every device and its gradient must be returned whole); a graph output is either `any`
(left in its placement, a Partial one all-reduced) or `replicated` (gathered whole; its gradient
arrives whole). Each parameter is read by exactly one operator.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

from phaze_common.checks import InputError, positive_integer

KINDS = ("product", "elementwise", "normalise", "view", "route")
BOUNDARIES = ("any", "replicated")
_OPERAND = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\[([^\]]*)\]\s*")


@dataclass(frozen=True, kw_only=True)
class Tensor:
    """A tensor: its dims' names and sizes, its element size [bytes], whether it is a parameter."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    element_bytes: int
    parameter: bool = False

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.elements * self.element_bytes


@dataclass(frozen=True, kw_only=True)
class Operand:
    """A tensor as an operator sees it: the operator's iteration dim along each of its dims."""

    tensor: str
    dims: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Op:
    """One operator: its kind (`KINDS`), operands, output, iteration dims with sizes, the dims it
    may not split and its forward FLOPs."""

    name: str
    kind: str
    inputs: tuple[Operand, ...]
    output: Operand
    sizes: tuple[tuple[str, int], ...]
    fixed: frozenset[str] = frozenset()
    flops: float = 0.0

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(dim for dim, _ in self.sizes)

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    @property
    def heavy(self) -> bool:
        """A product: Alpa's rule never leaves one computed whole on every device."""
        return self.kind == "product"

    @property
    def contracted(self) -> frozenset[str]:
        """The iteration dims absent from the output."""
        return frozenset(self.dims) - frozenset(self.output.dims)


@dataclass(frozen=True, kw_only=True)
class ShardingGraph:
    """Tensors and operators (in topological order) of one layer, with its boundary rules."""

    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    input_boundary: str = "any"
    output_boundary: str = "any"

    def __post_init__(self) -> None:
        for field, value in (("input_boundary", self.input_boundary), ("output_boundary", self.output_boundary)):
            if value not in BOUNDARIES:
                raise InputError(f"{field}: must be one of {', '.join(BOUNDARIES)}, got {value!r}")
        names = [op.name for op in self.ops]
        if len(set(names)) != len(names):
            raise InputError("ops: operator names must be unique")
        produced: set[str] = set()
        for op in self.ops:
            for operand in op.inputs:
                tensor = self.tensor(operand.tensor)
                if not tensor.parameter and operand.tensor not in produced and operand.tensor in self.producer:
                    raise InputError(f"ops: {op.name} reads {operand.tensor} before it is written")
            if op.output.tensor in produced:
                raise InputError(f"ops: {op.output.tensor} is written twice")
            produced.add(op.output.tensor)
        for tensor in self.tensors:
            if tensor.parameter and len(self.consumers.get(tensor.name, ())) != 1:
                raise InputError(f"tensors: parameter {tensor.name} must be read by exactly one operator")

    @cached_property
    def by_name(self) -> dict[str, Tensor]:
        return {tensor.name: tensor for tensor in self.tensors}

    def tensor(self, name: str) -> Tensor:
        if name not in self.by_name:
            raise InputError(f"tensor: no tensor named {name!r}")
        return self.by_name[name]

    @cached_property
    def producer(self) -> dict[str, int]:
        """Tensor name -> index of the operator that writes it."""
        return {op.output.tensor: index for index, op in enumerate(self.ops)}

    @cached_property
    def consumers(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Tensor name -> (operator index, operand index) of each read."""
        found: dict[str, list[tuple[int, int]]] = {}
        for index, op in enumerate(self.ops):
            for position, operand in enumerate(op.inputs):
                found.setdefault(operand.tensor, []).append((index, position))
        return {name: tuple(reads) for name, reads in found.items()}

    @cached_property
    def outputs(self) -> tuple[str, ...]:
        """The tensors written and never read."""
        return tuple(op.output.tensor for op in self.ops if op.output.tensor not in self.consumers)

    def op_index(self, name: str) -> int:
        for index, op in enumerate(self.ops):
            if op.name == name:
                return index
        raise InputError(f"op: no operator named {name!r}")


def _parse(spec: str) -> tuple[list[tuple[str, tuple[str, ...]]], tuple[str, tuple[str, ...]]]:
    if spec.count("->") != 1:
        raise InputError(f"spec: must read 'x[a,b] w[b,c] -> y[a,c]', got {spec!r}")
    left, right = spec.split("->")

    def operands(text: str) -> list[tuple[str, tuple[str, ...]]]:
        found = [(m.group(1), tuple(d.strip() for d in m.group(2).split(",") if d.strip()))
                 for m in _OPERAND.finditer(text)]
        if not found or "".join(m.group(0) for m in _OPERAND.finditer(text)).replace(" ", "") != text.replace(" ", ""):
            raise InputError(f"spec: must read 'x[a,b] w[b,c] -> y[a,c]', got {spec!r}")
        return found

    outputs = operands(right)
    if len(outputs) != 1:
        raise InputError(f"spec: must name one output, got {spec!r}")
    return operands(left), outputs[0]


class GraphBuilder:
    """Builds a `ShardingGraph` operator by operator; tensors' sizes follow from their writers."""

    def __init__(self, element_bytes: int = 1):
        self.element_bytes = positive_integer("element_bytes", element_bytes)
        self._tensors: dict[str, Tensor] = {}
        self._ops: list[Op] = []

    def _add_tensor(self, name: str, shape: dict[str, int], parameter: bool) -> None:
        if name in self._tensors:
            raise InputError(f"tensor: {name} is declared twice")
        for dim, size in shape.items():
            positive_integer(f"tensor {name} dim {dim}", size)
        self._tensors[name] = Tensor(name=name, dims=tuple(shape), shape=tuple(shape.values()),
                                     element_bytes=self.element_bytes, parameter=parameter)

    def input(self, name: str, shape: dict[str, int]) -> None:
        """A graph input (activations or data) of the given dims and sizes."""
        self._add_tensor(name, shape, parameter=False)

    def parameter(self, name: str, shape: dict[str, int]) -> None:
        """A weight of the given dims and sizes."""
        self._add_tensor(name, shape, parameter=True)

    def op(self, kind: str, name: str, spec: str, *, sizes: dict[str, int] | None = None,
           fixed: tuple[str, ...] = (), flops: float | None = None) -> None:
        """An operator from an einsum-like `spec`; `sizes` gives the dims no operand holds."""
        if kind not in KINDS:
            raise InputError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
        inputs, (out_name, out_dims) = _parse(spec)
        dims: dict[str, int] = {}
        for tensor_name, op_dims in inputs:
            if tensor_name not in self._tensors:
                raise InputError(f"spec of {name}: no tensor named {tensor_name!r} yet")
            tensor = self._tensors[tensor_name]
            if len(op_dims) != len(tensor.shape):
                raise InputError(f"spec of {name}: {tensor_name} has {len(tensor.shape)} dims, got {len(op_dims)}")
            for dim, size in zip(op_dims, tensor.shape):
                if dims.setdefault(dim, size) != size:
                    raise InputError(f"spec of {name}: dim {dim} is {dims[dim]} and {size}")
        for dim, size in (sizes or {}).items():
            if dims.setdefault(dim, positive_integer(f"sizes[{dim}]", size)) != size:
                raise InputError(f"sizes of {name}: dim {dim} is {dims[dim]} in an operand, got {size}")
        missing = [dim for dim in out_dims if dim not in dims]
        if missing:
            raise InputError(f"spec of {name}: output dims {missing} need sizes")
        self._add_tensor(out_name, {dim: dims[dim] for dim in out_dims}, parameter=False)
        all_dims = tuple(dims)
        volume = math.prod(dims.values())
        if flops is None:
            flops = {"product": 2 * volume, "view": 0}.get(kind, math.prod(dims[d] for d in out_dims))
        unsplit = frozenset(fixed)
        if kind != "product":
            unsplit |= frozenset(all_dims) - frozenset(out_dims)
        unknown = unsplit - frozenset(all_dims)
        if unknown:
            raise InputError(f"fixed of {name}: {sorted(unknown)} are not dims of {spec!r}")
        self._ops.append(Op(name=name, kind=kind, inputs=tuple(Operand(tensor=t, dims=d) for t, d in inputs),
                            output=Operand(tensor=out_name, dims=out_dims),
                            sizes=tuple((dim, dims[dim]) for dim in all_dims), fixed=unsplit, flops=float(flops)))

    def product(self, name: str, spec: str, **keys) -> None:
        self.op("product", name, spec, **keys)

    def elementwise(self, name: str, spec: str, **keys) -> None:
        self.op("elementwise", name, spec, **keys)

    def normalise(self, name: str, spec: str, over: tuple[str, ...], **keys) -> None:
        self.op("normalise", name, spec, fixed=over, **keys)

    def view(self, name: str, spec: str, **keys) -> None:
        self.op("view", name, spec, **keys)

    def build(self, input_boundary: str = "any", output_boundary: str = "any") -> ShardingGraph:
        return ShardingGraph(tensors=tuple(self._tensors.values()), ops=tuple(self._ops),
                             input_boundary=input_boundary, output_boundary=output_boundary)
