"""The operator graph of one tensor-parallel shard: what the cost models read.

An `OpGraph` is the forward computation of rank 0 of a model at one tensor-parallel width, one
node per traced operator in program order. Parameters, buffers and model inputs are not nodes:
an operator lists the parameters it reads as `weight_shapes` and its other tensor inputs as
`input_shapes`. Edges are data dependences between operators.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

Shape = tuple[int, ...]

#: Bytes per element of floating-point activations and weights in training (fp16, as the original).
TRAINING_DTYPE_BYTES = 2

#: Operator kinds, the coarse class a cost model dispatches on.
#: gemm: a product with a weight matrix; bmm: a product of two activations;
#: elementwise: one output element per input element (add, gelu, dropout, masked_fill, ...);
#: reduction: sum/max/mean over one dimension; softmax; norm: layernorm/rmsnorm;
#: embedding: row lookup in a weight table; index: gather of single elements;
#: shape: views, layout changes and copies without arithmetic (cost nothing, as in the original);
#: allreduce: a tensor-parallel collective; alltoall: an expert-parallel token exchange.
OP_KINDS = (
    "gemm",
    "bmm",
    "elementwise",
    "reduction",
    "softmax",
    "norm",
    "embedding",
    "index",
    "shape",
    "allreduce",
    "alltoall",
)


@dataclass(frozen=True)
class GemmDims:
    """A (batched) matrix product: `batch` independent [m x k] @ [k x n] products."""

    batch: int
    m: int
    k: int
    n: int

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.k * self.n


#: The group of the routed experts' tensor-parallel collectives (a collective's ("group", ...) attribute):
#: traced at the block's width t, priced at the expert tensor-parallel width (Megatron's
#: --expert-tensor-parallel-size; `solver.layout`).
EXPERT_TENSOR = "expert_tensor"


@dataclass(frozen=True)
class OpNode:
    """One forward operator of a shard.

    `op` is the specific operator within `kind` ("linear", "matmul", "add", "gelu", "dropout",
    "layernorm", "rmsnorm", "softmax", "sum", "amax", "embedding", "gather", "view", "allreduce",
    ...). `attrs` holds what else decides the cost, as sorted (name, value) pairs, e.g. for an
    all-reduce ("direction", "forward" | "backward"), ("group_size", t), ("reduce_op", "sum");
    for dropout ("p", 0.1); for reductions and softmax ("dim", -1).
    `weight_names` are the parameters' paths in the model (not part of the signature).
    `inputs`, when given, names the producing operator of each entry of `input_shapes` (None for a
    model input or a buffer); it is how `LayerGraph` tells which tensors are activations.
    `dtype_bytes` is the size of one element of the output in training precision (2 for the fp16
    activations the original assumes; 1 for bool masks; 8 for int64 indices).
    """

    id: int
    kind: str
    op: str
    layer: int
    name: str
    module_path: str
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    weight_shapes: tuple[Shape, ...] = ()
    weight_names: tuple[str, ...] = ()
    inputs: tuple[int | None, ...] = ()
    dtype_bytes: int = 2
    gemm: GemmDims | None = None
    attrs: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"kind: unknown {self.kind!r}; allowed: {', '.join(OP_KINDS)}")

    @property
    def output_shape(self) -> Shape:
        """Shape of the (first) output tensor; () for an operator without a tensor result."""
        return self.output_shapes[0] if self.output_shapes else ()

    @property
    def input_elements(self) -> int:
        return sum(math.prod(s) for s in self.input_shapes)

    @property
    def output_elements(self) -> int:
        return sum(math.prod(s) for s in self.output_shapes)

    @property
    def weight_elements(self) -> int:
        return sum(math.prod(s) for s in self.weight_shapes)

    @property
    def output_bytes(self) -> int:
        return self.output_elements * self.dtype_bytes

    @property
    def flops(self) -> int:
        """Matrix-product FLOPs (2 per multiply-accumulate); elementwise work is not counted.

        This is the usual accounting behind "24·b·s·h² + 4·b·s²·h per GPT block".
        """
        return 2 * self.gemm.macs if self.gemm is not None else 0

    def attr(self, name: str, default: object = None) -> object:
        return dict(self.attrs).get(name, default)

    @cached_property
    def signature(self) -> str:
        """Stable identity of the cost: equal signatures cost the same on any accelerator."""
        key = (
            self.kind,
            self.op,
            self.input_shapes,
            self.output_shapes,
            self.weight_shapes,
            self.dtype_bytes,
            None if self.gemm is None else (self.gemm.batch, self.gemm.m, self.gemm.k, self.gemm.n),
            self.attrs,
        )
        return hashlib.sha1(repr(key).encode()).hexdigest()[:16]


def weight_sizes(nodes: Iterable[OpNode]) -> dict[str, int]:
    """Elements of each parameter the operators read, by parameter path (a shared weight once)."""
    return {name: math.prod(shape) for node in nodes for name, shape in zip(node.weight_names, node.weight_shapes)}


@dataclass(frozen=True)
class OpGraph:
    """All operators of one shard in program order, with their data dependences.

    `sharded_parameters` names the parameters split over the tensor-parallel ranks (each rank holds
    a slice); the others are replicated.
    """

    nodes: tuple[OpNode, ...]
    edges: tuple[tuple[int, int], ...]
    tensor_parallel_width: int
    sharded_parameters: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for position, node in enumerate(self.nodes):
            if node.id != position:
                raise ValueError(f"nodes: node ids must be 0..n-1 in order, found {node.id} at {position}")
        for src, dst in self.edges:
            if not 0 <= src < dst < len(self.nodes):
                raise ValueError(f"edges: ({src}, {dst}) does not go forward between existing nodes")

    @property
    def layers(self) -> tuple[int, ...]:
        """Layer ids in program order of first appearance."""
        return tuple(dict.fromkeys(node.layer for node in self.nodes))

    def layer_nodes(self, layer: int) -> tuple[OpNode, ...]:
        return tuple(node for node in self.nodes if node.layer == layer)

    @cached_property
    def _successor_map(self) -> dict[int, tuple[int, ...]]:
        succ: dict[int, list[int]] = {}
        for src, dst in self.edges:
            succ.setdefault(src, []).append(dst)
        return {node: tuple(users) for node, users in succ.items()}

    def successors(self, node_id: int) -> tuple[int, ...]:
        return self._successor_map.get(node_id, ())

    @property
    def flops(self) -> int:
        return sum(node.flops for node in self.nodes)
