"""What each operator computes, forward and backward: GEMMs for the tensor cores and vector-core
cycles. Also the operator classes that core assignment and fusion use. Collectives (the
tensor-parallel all-reduces) do no core work here: the training-step model prices them on the
cluster's links (`solver.training_step`).

The vector-core cycle tables are the original's (msr-fiddle/phaze at fed7cde: stand-alone ops in
`third_party_for_phaze/wham/perf_wrappers/vector_core_estimator.py`, fused ops in
`third_party_for_phaze/wham/op_to_compute.py` lines 274-340), with its bugs fixed: every gradient of
a binary op is costed at the output size (the original counts the larger operand twice when the
first is the smaller, e.g. lines 3007-3008 for Add), a mean costs its rows once (the original
divides the output size by the reduced dimension again, line 1639), SiLU has its own entry (the
original has none and exits on a stand-alone SiLU, line 2795), and sums/maxima are reductions
rather than free. Comparisons cost one cycle per element forward and nothing backward (no gradient
flows through them).
A GEMM's backward is its data-gradient and weight-gradient GEMMs (the original computes the
weight-gradient dimensions but returns only the data gradient's:
`wham/perf_wrappers/tensor_core_wrapper.py` line 795).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass

from graph_extract.opgraph import GemmDims, OpGraph, OpNode

FORWARD, BACKWARD = "forward", "backward"
DIRECTIONS = (FORWARD, BACKWARD)

# Core types of a fused operator (what the scheduler places).
TC, VC, TC_AND_VC, COLLECTIVE, NOP = "TC", "VC", "TCandVC", "collective", "Nop"

#: Unary elementwise ops: (forward, backward) cycles per element.
UNARY_CYCLES = {
    "neg": (1, 1), "relu": (1, 1), "gelu": (1, 1), "masked_fill": (1, 1), "dropout": (2, 1),
    "exp": (15, 16), "log": (15, 16), "pow": (15, 16), "sqrt": (15, 16), "rsqrt": (15, 16),
    "tanh": (27, 2), "cos": (13, 2), "sin": (13, 2), "sigmoid": (12, 22), "silu": (14, 15),
    "clamp": (2, 1),  # a minimum and a maximum; its gradient passes where the value was inside the bounds
}
#: Binary elementwise ops: forward cycles per element, backward cycles per element for the
#: gradient of the first and of every further operand.
BINARY_CYCLES = {"add": (1, 1, 1), "sub": (1, 1, 1), "mul": (1, 1, 1), "div": (10, 10, 11)}
#: Ops without a gradient: one cycle per element forward.
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne", "logical_or", "logical_and", "logical_not")
REDUCTIONS = ("sum", "amax", "mean", "topk")
#: Index operators: free, as in the original (row copies and the routing plan's integer bookkeeping).
INDEX_OPS = ("gather", "index_select", "route")
MEAN_DIVIDE_CYCLES = 10
SOFTMAX_EXP_CYCLES, SOFTMAX_ROW_CYCLES, SOFTMAX_BACKWARD_CYCLES = 10, 10, 2
NORMS = ("layernorm", "rmsnorm")
FREE_KINDS = ("shape", "embedding", "index")  # free, as in the original

# Fusion classes (the original's `op_to_opr_dict`, `wham/op_to_compute.py` lines 99-207), named for our op vocabulary.
ACTIVATIONS = ("relu", "gelu", "tanh", "cos", "sin", "sigmoid", "silu")
INJECTIVE = ("add", "sub", "mul", "div", "neg", "exp", "log", "pow", "sqrt", "rsqrt", "where", "clamp") + COMPARISONS


@dataclass(frozen=True)
class Gemm:
    """`batch` independent products [n x c]·[c x k] (n rows, c reduced, k columns)."""

    batch: int
    n: int
    c: int
    k: int

    @property
    def macs(self) -> int:
        return self.batch * self.n * self.c * self.k


@dataclass(frozen=True)
class VectorTerm:
    """`repeat` · `cycles` · ceil(`elements` / lanes) vector-core cycles."""

    repeat: int
    elements: int
    cycles: int

    @property
    def operations(self) -> int:
        """Lane operations actually performed (no rounding to full lanes)."""
        return self.repeat * self.elements * self.cycles


@dataclass(frozen=True)
class Work:
    """The work of an operator (or a fused group) in one direction."""

    gemms: tuple[Gemm, ...] = ()
    vector: tuple[VectorTerm, ...] = ()

    @property
    def macs(self) -> int:
        return sum(gemm.macs for gemm in self.gemms)


def _unknown(node: OpNode, known: tuple[str, ...]) -> ValueError:
    return ValueError(f"op: unknown {node.op!r} of kind {node.kind!r} (node {node.name!r}); "
                      f"known: {', '.join(sorted(known))}")


def core_type(node: OpNode) -> str:
    """Which core runs the operator alone: TC, VC, collective, or Nop (free)."""
    if node.kind in ("gemm", "bmm"):
        return TC
    if node.kind in ("allreduce", "alltoall"):
        return COLLECTIVE
    if node.kind in FREE_KINDS:
        return NOP
    return VC


def fusion_class(node: OpNode) -> str:
    """The operator's class in the fusion rules (the original's `op_to_opr_dict`)."""
    if node.kind in ("gemm", "bmm"):
        return "gemm"
    if node.op in ACTIVATIONS:
        return "activation"
    if node.op in INJECTIVE:
        return "injective"
    if node.op == "dropout":
        return "dropout"
    if node.op == "masked_fill":
        return "transformation"
    return {"norm": "norm", "reduction": "reduction", "softmax": "softmax"}.get(node.kind, "other")


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _gemm_work(node: OpNode, direction: str) -> Work:
    if node.gemm is None:
        raise ValueError(f"gemm: missing dimensions on {node.kind} node {node.name!r}")
    b, m, k, n = node.gemm.batch, node.gemm.m, node.gemm.k, node.gemm.n
    if direction == FORWARD:
        return Work(gemms=(Gemm(b, m, k, n),))
    # dX = dY·Wᵀ ([m x n]·[n x k]) and dW = Xᵀ·dY ([k x m]·[m x n]): each as many MACs as forward.
    return Work(gemms=(Gemm(b, m, n, k), Gemm(b, k, m, n)))


def _elementwise_work(node: OpNode, direction: str) -> Work:
    out = _numel(node.output_shape)
    operands = len(node.input_shapes) + len(node.weight_shapes)
    forward = direction == FORWARD
    if node.op in UNARY_CYCLES:
        cycles = UNARY_CYCLES[node.op][0 if forward else 1]
        return Work(vector=(VectorTerm(1, out, cycles),))
    if node.op in BINARY_CYCLES:
        fwd, first, rest = BINARY_CYCLES[node.op]
        if forward:
            return Work(vector=(VectorTerm(1, out, fwd),))
        return Work(vector=tuple(VectorTerm(1, out, first if i == 0 else rest) for i in range(max(operands, 1))))
    if node.op == "where":  # where(condition, x, y): gradients for x and y, not the condition
        if forward:
            return Work(vector=(VectorTerm(1, out, 1),))
        return Work(vector=tuple(VectorTerm(1, out, 1) for _ in range(max(operands - 1, 0))))
    if node.op in COMPARISONS:
        return Work(vector=(VectorTerm(1, out, 1),) if forward else ())
    raise _unknown(node, tuple(UNARY_CYCLES) + tuple(BINARY_CYCLES) + ("where",) + COMPARISONS)


def _reduction_work(node: OpNode, direction: str) -> Work:
    if node.op not in REDUCTIONS:
        raise _unknown(node, REDUCTIONS)
    rows = max(_numel(node.output_shape), 1)
    source = _numel(node.input_shapes[0]) if node.input_shapes else rows
    reduced = max(source // rows, 1)
    if node.op == "mean":  # each row: ceil(d / lanes) adds, then a divide (same cost backward, as the original)
        return Work(vector=(VectorTerm(rows, reduced, 1), VectorTerm(rows, 1, MEAN_DIVIDE_CYCLES)))
    if direction == FORWARD:
        return Work(vector=(VectorTerm(rows, reduced, 1),))
    return Work(vector=(VectorTerm(1, source, 1),))  # broadcast (sum) or routed (max) gradient


def _softmax_work(node: OpNode, direction: str) -> Work:
    if node.op != "softmax":
        raise _unknown(node, ("softmax",))
    out = _numel(node.output_shape)
    if direction == BACKWARD:
        return Work(vector=(VectorTerm(1, out, SOFTMAX_BACKWARD_CYCLES),))
    dim = node.attr("dim", -1)
    row = node.output_shape[dim if isinstance(dim, int) else -1] if node.output_shape else 1
    return Work(vector=(VectorTerm(out // max(row, 1), row, 1), VectorTerm(1, 1, SOFTMAX_ROW_CYCLES),
                        VectorTerm(1, out, SOFTMAX_EXP_CYCLES)))


def _check_collective(node: OpNode) -> None:
    when = node.attr("direction")
    if when not in DIRECTIONS:
        raise ValueError(f"allreduce.direction: must be 'forward' or 'backward', got {when!r} (node {node.name!r})")
    group = node.attr("group_size")
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise ValueError(f"allreduce.group_size: must be a positive integer, got {group!r} (node {node.name!r})")


def op_work(node: OpNode, direction: str) -> Work:
    """The work of one operator in `direction` ("forward" or "backward")."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: must be 'forward' or 'backward', got {direction!r}")
    if node.kind in ("gemm", "bmm"):
        return _gemm_work(node, direction)
    if node.kind == "elementwise":
        return _elementwise_work(node, direction)
    if node.kind == "reduction":
        return _reduction_work(node, direction)
    if node.kind == "softmax":
        return _softmax_work(node, direction)
    if node.kind == "norm":
        if node.op not in NORMS:
            raise _unknown(node, NORMS)
        return Work(vector=(VectorTerm(1, _numel(node.output_shape), 1),))
    if node.kind == "allreduce":
        _check_collective(node)
    if node.kind == "embedding" and node.op != "embedding":
        raise _unknown(node, ("embedding",))
    if node.kind == "index" and node.op not in INDEX_OPS:
        raise _unknown(node, INDEX_OPS)
    return Work()


def expert_shaped(node: OpNode, split: float) -> OpNode:
    """A grouped expert product as a device split `split` = s more ways than the graph runs it
    (s = e·τ/t: `solver.layout.Layout.expert_split`) runs it: E/s experts of ⌈s·C⌉ token rows each
    instead of E of C (the same multiply-accumulates up to the rounding to whole rows; fewer weights
    to read, and the tiles of the real per-expert token counts); any other operator as it is."""
    if split == 1 or node.op != "grouped_linear":
        return node
    gemm = node.gemm
    return dataclasses.replace(node, gemm=GemmDims(round(gemm.batch / split), math.ceil(gemm.m * split), gemm.k, gemm.n))


#: Expert splits made in this process: (graph id, split) -> (the graph, weakly; its split), so that one
#: split of one graph is one object (what the estimate table's prepared layers are kept by).
_SPLITS: dict[tuple[int, float], tuple[weakref.ref, OpGraph]] = {}
#: Splits kept at most (of graphs still alive or not): the cache is emptied beyond.
SPLITS_KEPT = 256


def expert_split_graph(graph: OpGraph, split: float) -> OpGraph:
    """`graph` with its grouped expert products as a device split `split` more ways runs them
    (`expert_shaped`): the same object for the same graph and split."""
    if split == 1:
        return graph
    found = _SPLITS.get((id(graph), split))
    if found is not None and found[0]() is graph:
        return found[1]
    if len(_SPLITS) >= SPLITS_KEPT:
        _SPLITS.clear()
    made = dataclasses.replace(graph, nodes=tuple(expert_shaped(node, split) for node in graph.nodes))
    _SPLITS[id(graph), split] = (weakref.ref(graph), made)
    return made
