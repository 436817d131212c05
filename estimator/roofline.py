"""The time of a layer on a GPU: a roofline per fused operator, the operators one after another.

The operators are fused as on the template (`estimator.fusion`: a GEMM with its epilogue, chains of
elementwise operators), each group one kernel. Forward, a group takes

    max(Σ over its GEMMs of FLOPs / (peak · efficiency · waves),  bytes / (HBM bandwidth · memory_efficiency))

* FLOPs: 2 per multiply-accumulate; `waves` is the wave quantisation of the GEMM's 128 × 128 output
  tiles over the streaming multiprocessors (tiles / (⌈tiles / SMs⌉ · SMs)); a mixture's grouped
  expert products are one kernel over the experts a device holds, each expert's tiles at its real
  token count (`estimator.work.expert_shaped`: with expert parallelism, fewer experts of more
  tokens each). In 8-bit training the blocks' weight products (`KernelOptions.fp8_operators`) run
  at the chip's dense peak for the precision times its GEMM efficiency for it (FP8's, or MXFP8's)
  and read their inputs and weights in `KernelOptions.narrow_bytes` an element (one byte; MXFP8's
  with its block's scale byte, 1 + 1/32; Transformer Engine casts them in the kernels that produce
  them); every other product runs at the 16-bit rate.
* bytes: what the group reads from HBM (inputs made outside it, weights) and writes (outputs used
  outside it).
Backward, a GEMM gives its data- and weight-gradient GEMMs (as many FLOPs each as forward) and a
group moves twice its forward bytes (it reads the output gradient and what it saved, and writes the
input gradient). With a fused attention kernel (`graph_extract.attention`) an attention core is one
kernel: its two products on the tiles a causal mask leaves, at the chip's attention efficiency, and
Q, K, V, O and the softmax statistics in HBM (re-reads of K and V are served by the L2 cache);
backward 2.5 times its products (the scores recomputed) and twice its bytes. Collectives take no
time here: the training-step model charges them on the cluster. The operators the kernel options
split (sequence parallelism: those replicated over the tensor-parallel group) move 1/t of their
bytes. The casts to 8 bits around an 8-bit product are kernels of their own (`cast_bytes`); with
FP8 current scaling each first reads its tensor once more for the amax (the amax's all-reduce over
the tensor-parallel group is a collective: the training-step model's).

Every kernel takes at least its launch (`kernel_floor`): eager PyTorch issues kernels asynchronously,
so a kernel shorter than the host's time to issue one (the framework's per-operator dispatch and the
CUDA launch, the chip's `kernel_host_seconds`) leaves the GPU idle; replayed from a CUDA graph
(`KernelOptions.cuda_graphs`) the host issues none and each kernel takes at least the graph's own
per-kernel cost (`graph_kernel_seconds`). A fused group issuing k kernels takes
max(its roofline time, k · floor) (`launched`): one forward, one per GEMM of its direction backward
(data and weight gradient), one more for an 8-bit cast; a fused attention kernel one each way; a
collective none here (the training-step model prices it on the cluster). What the floor adds is the
layer's `launch_forward` / `launch_backward`.

A layer's pass also takes at least the host's time to issue all its kernels (`issue_seconds`; the
training-step model takes the larger, `solver.training_step.layer_terms.issued`): the host runs
ahead of the device over long kernels within a pass, but not past a mixture's token dispatcher,
which copies the tokens per expert to the host every forward (Megatron-Core's
MoEAlltoAllTokenDispatcher syncs at `cuda_sync_point`; DeepEP's dispatch waits on the host for the
received count; Transformer Engine's GroupedLinear takes its `m_splits` as a host list). The
experts' share is counted for every expert of the graph (`expert_issue_forward` /
`expert_issue_backward`: the step model divides it by the layout's e, each device issuing its E/e
local experts'): Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP, the default
grouped GEMM) runs one cuBLASLt GEMM per local expert, looping over them on a few compute streams
(transformer_engine/common/gemm/cublaslt_gemm.cu `multi_stream_cublas_gemm` @ v2.9; the CUTLASS
grouped kernel only on Hopper, in BF16/FP16, behind NVTE_USE_CUTLASS_GROUPED_GEMM), each in the
chip's `expert_gemm_seconds`, and in MXFP8 or with FP8 current scaling casts each expert's input
(forward) and output gradient (backward) in a kernel of its own (pytorch/csrc/extensions/cast.cpp
`split_quantize` → `multi_tensor_quantize_impl`, fused into one kernel for FP8 delayed scaling
only), each in `kernel_host_seconds`; every other kernel in `kernel_host_seconds`; nothing with CUDA
graphs. Simplifications: vector arithmetic is never the bound, caches do not keep tensors between
kernels, a group's floor stands alone (the host running ahead over longer kernels of other groups is
taken only by the pass's issue time), a grouped expert product's own floor counts its kernels as for
one expert (its experts' kernels are in the pass's issue time), the graph's per-kernel cost is a
floor as the host's is, a cast counts one kernel (current scaling's amax and scale are two more),
and delayed scaling's amax bookkeeping (a history of a few numbers a tensor) costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from estimator.fusion import FusedOp, fuse_layers
from estimator.work import BACKWARD, COLLECTIVE, FORWARD, Gemm, expert_shaped, op_work
from graph_extract.attention import TILE as ATTENTION_TILE
from graph_extract.attention import AttentionKernel, attention_kernels
from graph_extract.kernels import KernelOptions
from graph_extract.opgraph import OpGraph
from graph_extract.regions import block_weight_products
from phaze_hardware import KnownChip

#: Output tile of a GEMM kernel (rows x columns), for the wave quantisation.
TILE = 128
#: The kernel options of a caller that gives none: 16-bit, no 8-bit casts.
DEFAULT_KERNELS = KernelOptions()


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of a layer per micro-batch on one device: forward, backward, and the forward of its
    attention core (what selective recomputation re-runs)."""

    forward: float
    backward: float
    attention_core_forward: float
    matrix_forward: float = 0.0  # of `forward`, the transformer blocks' weight products
    matrix_backward: float = 0.0
    attention_forward: float = 0.0  # of `forward`, the fused attention kernels
    attention_backward: float = 0.0
    launch_forward: float = 0.0  # of `forward`, what the kernels' launch floor adds (`launched`)
    launch_backward: float = 0.0
    # the host's seconds to issue the pass's kernels but the experts' (`issue_seconds`), and every
    # expert's GEMMs and casts (all E of the graph; a device holding E/e issues 1/e of it)
    issue_forward: float = 0.0
    issue_backward: float = 0.0
    expert_issue_forward: float = 0.0
    expert_issue_backward: float = 0.0
    # (module, forward seconds of the kernels holding its operators) per recompute module of the layer
    module_forward: tuple[tuple[str, float], ...] = ()


def waves(gemm: Gemm, processors: int) -> float:
    """The fraction of the GPU a GEMM's output tiles keep busy over its waves."""
    tiles = gemm.batch * math.ceil(gemm.n / TILE) * math.ceil(gemm.k / TILE)
    return tiles / (math.ceil(tiles / processors) * processors)


def group_bytes(graph: OpGraph, op: FusedOp, split: Sequence[float], narrow: Sequence[bool] = (),
                expert_width: float = 1, narrow_bytes: float = 1.0) -> float:
    """Bytes a fused group reads and writes forward; `split[v]` scales what operator v moves; an
    operator marked in `narrow` (an 8-bit product) reads its inputs and weights in `narrow_bytes` an
    element (`KernelOptions.narrow_bytes`);
    a grouped expert product split `expert_width` = s more ways than the graph's (s = e·τ/t: e
    expert-parallel ranks, each expert over τ ranks) reads 1/s of the experts' weights (E/s of the
    graph's experts for s times their tokens each; s < 1 when τ < t: more experts, fewer tokens each)."""
    members = set(op.members)
    total = 0.0
    for member in op.members:
        node = graph.nodes[member]
        read = sum(math.prod(shape) * (graph.nodes[source].dtype_bytes if source is not None else node.dtype_bytes)
                   for shape, source in zip(node.input_shapes, node.inputs or [None] * len(node.input_shapes))
                   if source not in members)
        weights = sum(math.prod(shape) for shape in node.weight_shapes) * node.dtype_bytes
        read += weights / expert_width if node.op == "grouped_linear" else weights
        if narrow and narrow[member]:
            read = read / node.dtype_bytes * narrow_bytes
        moved = read
        if not graph.successors(member) or any(user not in members for user in graph.successors(member)):
            moved += node.output_bytes
        total += moved * split[member]
    return total


def cast_bytes(graph: OpGraph, op: FusedOp, direction: str, split: Sequence[float], narrow: Sequence[bool] = (),
               kernels: KernelOptions = DEFAULT_KERNELS) -> float:
    """Bytes of Transformer Engine's casts to 8 bits around an 8-bit product, each its own kernel:
    forward the activation input read in 16 bits and written in 8 bits twice (row-wise, and the
    column-wise copy the weight gradient reads: FP8's transpose on Hopper, MXFP8's column-wise blocks,
    each `kernels.narrow_bytes` an element), backward the output gradient likewise; with current
    scaling (`kernels.current_scaling`) the 16-bit tensor is read once more first, for its amax; 0 for
    other groups. (The weights' casts, once per step, are not charged.)"""
    head = op.members[0]
    if not (narrow and narrow[head]):
        return 0.0
    node = graph.nodes[head]
    if direction == BACKWARD:
        elements = node.output_bytes / node.dtype_bytes
    else:
        elements = sum(math.prod(shape) for shape in node.input_shapes)
    reads = 2 if kernels.current_scaling else 1
    return elements * (reads * node.dtype_bytes + 2 * kernels.narrow_bytes) * split[head]


def op_seconds(graph: OpGraph, op: FusedOp, direction: str, chip: KnownChip, split: Sequence[float],
               narrow: Sequence[bool] = (), expert_width: float = 1, kernels: KernelOptions = DEFAULT_KERNELS
               ) -> float:
    """The roofline time of one fused group in one direction (module docstring), with the 8-bit casts
    of an 8-bit product after it (`kernels`: its precision and recipe), its expert products at
    expert-parallel width `expert_width`."""
    gemms = op_work(expert_shaped(graph.nodes[op.members[0]], expert_width), direction).gemms
    low = narrow and narrow[op.members[0]]
    rate = chip.narrow_matrix_flops(kernels.precision) if low else chip.matrix_flops
    compute = sum(2 * gemm.macs / (rate * waves(gemm, chip.streaming_multiprocessors)) for gemm in gemms)
    moved = group_bytes(graph, op, split, narrow, expert_width, kernels.narrow_bytes)
    moved *= 2 if direction == BACKWARD else 1
    bandwidth = chip.hbm_bandwidth * chip.memory_efficiency
    return max(compute, moved / bandwidth) + cast_bytes(graph, op, direction, split, narrow, kernels) / bandwidth


def kernel_floor(chip: KnownChip, kernels: KernelOptions) -> float:
    """The least seconds of a kernel on `chip` (module docstring): the graph's per-kernel cost with
    CUDA graphs, else the host's time to issue one (0 on a chip that states neither)."""
    return chip.graph_kernel_seconds if kernels.cuda_graphs else chip.kernel_host_seconds


def launches(graph: OpGraph, op: FusedOp, direction: str, narrow: Sequence[bool] = ()) -> int:
    """The kernels a fused group issues in one direction, what its floor counts: one per GEMM of the
    direction (at least one), and Transformer Engine's FP8 cast of an FP8 product (`cast_bytes`); a
    grouped expert product's as for one expert (its experts' kernels are the pass's issue time,
    `issue_seconds`); none for a collective (the training-step model prices it on the cluster)."""
    if op.core_type == COLLECTIVE:
        return 0
    gemms = op_work(graph.nodes[op.members[0]], direction).gemms
    return max(1, len(gemms)) + (1 if narrow and narrow[op.members[0]] else 0)


def per_expert_casts(kernels: KernelOptions) -> bool:
    """Whether Transformer Engine casts each expert's tensor to 8 bits in a kernel of its own (MXFP8,
    FP8 current scaling) rather than all of a grouped product's in one fused kernel (FP8 delayed
    scaling) (module docstring)."""
    return kernels.precision == "mxfp8" or kernels.current_scaling


def issue_seconds(graph: OpGraph, op: FusedOp, direction: str, chip: KnownChip, narrow: Sequence[bool] = (),
                  kernels: KernelOptions = DEFAULT_KERNELS) -> tuple[float, float]:
    """The host's seconds to issue a fused group's kernels in one direction (module docstring):
    (its kernels but the experts' at `kernel_host_seconds` each, its experts' GEMMs and casts for
    every expert of the graph); (0, 0) with CUDA graphs. A grouped expert product of E experts issues
    E GEMMs per GEMM of the direction at the chip's `expert_gemm_seconds` each and, 8-bit, E casts
    (`per_expert_casts`) or one shared."""
    if kernels.cuda_graphs:
        return 0.0, 0.0
    node = graph.nodes[op.members[0]]
    if node.op != "grouped_linear" or op.core_type == COLLECTIVE:
        return launches(graph, op, direction, narrow) * chip.kernel_host_seconds, 0.0
    gemms = len(op_work(node, direction).gemms)
    cast = bool(narrow and narrow[node.id])
    apart = cast and per_expert_casts(kernels)
    each = gemms * chip.expert_gemm_seconds + (chip.kernel_host_seconds if apart else 0.0)
    return (chip.kernel_host_seconds if cast and not apart else 0.0), node.gemm.batch * each


def launched(device_seconds: float, kernels: int, floor: float) -> float:
    """The seconds of `kernels` kernels that take `device_seconds` on the device when each takes at
    least `floor`: max(device_seconds, kernels · floor)."""
    return max(device_seconds, kernels * floor)


def attention_seconds(graph: OpGraph, kernel: AttentionKernel, direction: str, chip: KnownChip) -> float:
    """The roofline time of a fused attention kernel in one direction (module docstring): its units
    of work, one per (sequence, head, query tile), in waves over the streaming multiprocessors."""
    scores = graph.nodes[kernel.products[0]].gemm
    macs = sum(graph.nodes[product].gemm.macs for product in kernel.products) * kernel.fraction
    units = scores.batch * math.ceil(scores.m / ATTENTION_TILE)
    processors = chip.streaming_multiprocessors
    busy = units / (math.ceil(units / processors) * processors)
    flops = 2 * macs * (2.5 if direction == BACKWARD else 1.0)
    moved = kernel.forward_bytes * (2 if direction == BACKWARD else 1)
    return max(flops / (chip.attention_flops * busy), moved / (chip.hbm_bandwidth * chip.memory_efficiency))


def module_kernels(ops: Sequence[FusedOp], module: frozenset[int]) -> list[FusedOp]:
    """The kernels that re-run a recompute module: each fused group's operators in `module`, as a
    group of their own (a GEMM's fused activation re-runs without the GEMM)."""
    parts = [tuple(member for member in op.members if member in module) for op in ops]
    return [FusedOp(members, op.core_type) for op, members in zip(ops, parts) if members]


def layer_times(graph: OpGraph, layer: int, chip: KnownChip, kernels: KernelOptions,
                core: frozenset[int] = frozenset(), expert_width: float = 1,
                modules: Mapping[str, frozenset[int]] | None = None) -> LayerTimes:
    """Forward, backward and attention-core forward seconds of `layer` of `graph` on `chip` (with a
    fused attention kernel the core is not re-run by selective recomputation: 0), its experts split
    `expert_width` more ways than the graph's (`group_bytes`), the forward seconds of each of
    `modules` (recompute modules: operator ids) it holds (`module_kernels`), and the host's seconds
    to issue each pass's kernels, its experts' apart for all the graph's experts (`issue_seconds`)."""
    width = graph.tensor_parallel_width
    divided = kernels.split_operators(graph)
    split = [1.0 / width if divided and divided[node.id] else 1.0 for node in graph.nodes]
    narrow = kernels.fp8_operators(graph)
    (fused,) = fuse_layers(graph, (layer,))
    fused_kernels = [kernel for kernel in attention_kernels(graph) if kernel.layer == layer] \
        if kernels.flash_attention else []
    inside = frozenset().union(*(kernel.members for kernel in fused_kernels))
    ops = [op for op in fused.ops if op.members[0] not in inside]
    floor = kernel_floor(chip, kernels)

    def seconds(op: FusedOp, direction: str) -> tuple[float, float]:
        """(the group's seconds with its launch floor, without it)."""
        device = op_seconds(graph, op, direction, chip, split, narrow, expert_width, kernels)
        return launched(device, launches(graph, op, direction, narrow), floor), device

    def attention_kernel(kernel: AttentionKernel, direction: str) -> tuple[float, float]:
        device = attention_seconds(graph, kernel, direction, chip)
        return launched(device, 1, floor), device

    timed = {direction: [seconds(op, direction) for op in ops] for direction in (FORWARD, BACKWARD)}
    attention_issue = 0.0 if kernels.cuda_graphs else len(fused_kernels) * chip.kernel_host_seconds
    issued = {direction: [issue_seconds(graph, op, direction, chip, narrow, kernels) for op in ops]
              for direction in (FORWARD, BACKWARD)}
    issue = {direction: (attention_issue + sum(own for own, _ in issued[direction]),
                         sum(experts for _, experts in issued[direction])) for direction in (FORWARD, BACKWARD)}
    fused = {direction: [attention_kernel(kernel, direction) for kernel in fused_kernels]
             for direction in (FORWARD, BACKWARD)}
    forward, backward = ([time for time, _ in timed[direction]] for direction in (FORWARD, BACKWARD))
    attention_forward, attention_backward = ([time for time, _ in fused[direction]] for direction in (FORWARD, BACKWARD))
    idle = {direction: sum(time - device for time, device in timed[direction] + fused[direction])
            for direction in (FORWARD, BACKWARD)}
    attention = [seconds for op, seconds in zip(ops, forward) if op.members[0] in core]
    products = block_weight_products(graph)
    matrix = [any(products[member] for member in op.members) for op in ops]
    parts = {name: module_kernels(ops, ids) for name, ids in (modules or {}).items()}
    module_forward = tuple((name, sum(seconds(part, FORWARD)[0] for part in kernels_of))
                           for name, kernels_of in parts.items() if kernels_of)
    total_forward, total_backward = sum(forward) + sum(attention_forward), sum(backward) + sum(attention_backward)
    return LayerTimes(total_forward, total_backward, sum(attention),
                      matrix_forward=sum(time for time, is_matrix in zip(forward, matrix) if is_matrix),
                      matrix_backward=sum(time for time, is_matrix in zip(backward, matrix) if is_matrix),
                      attention_forward=sum(attention_forward), attention_backward=sum(attention_backward),
                      launch_forward=idle[FORWARD], launch_backward=idle[BACKWARD],
                      issue_forward=issue[FORWARD][0], issue_backward=issue[BACKWARD][0],
                      expert_issue_forward=issue[FORWARD][1], expert_issue_backward=issue[BACKWARD][1],
                      module_forward=module_forward)
