"""One training step of a transformer under Megatron-style parallelism on a cluster: time per batch
with its breakdown and memory per device by kind.

    time      = pipeline + exposed data-parallel sync + optimizer step
    pipeline  = (m + (p − 1)/v) · ℓ        1F1B; v model chunks per device with interleaving
    ℓ         = max over devices of, per micro-batch: forward + backward + recomputation
                + tensor-parallel collectives + pipeline transfers

(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC'21; Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022.)
The layout (`solver.layout.Layout`) says which devices form each group; the cluster prices each
group's collectives on the tiers it spans.

* m = micro-batches per batch / d; every stage runs on t devices (a tensor-parallel group).
* Tensor-parallel all-reduces (2 per block and direction) run on the tier the group spans and do
  not overlap compute (Megatron issues them blocking); with sequence parallelism each becomes a
  reduce-scatter + all-gather of the same bytes, so the time is the same. Full recomputation
  repeats the forward all-reduces. With `tensor_parallel_overlap` a layer's collectives of one
  direction hide behind its weight products of that direction: exposed = max(collectives −
  products, 0) per layer (a simplification: Transformer Engine pairs each collective with one
  product, so the exposed part can be larger when they are unbalanced).
* Pipeline transfers: each stage receives its input activations and its output gradients every
  micro-batch (1/t of the tensor with Megatron's scatter/gather), on the tier of the slowest link
  between stages, without overlap in 1F1B (Megatron's sends and receives blocking). Interleaving
  multiplies them by v and, with `overlap_pipeline_transfers`, hides them behind the device's
  compute: exposed = max(transfers − compute, 0) per micro-batch.
* Data-parallel sync: after the last backward every stage reduces its gradients over its
  replicas (all-reduce; reduce-scatter of the gradients + all-gather of the weights with a sharded
  optimizer), all stages at once on the tier their group spans; the exposed time is the largest.
  Each class of parameters syncs over its own group: the dense ones over the d replicas, a mixture
  of experts' over the d/e replicas holding the same experts; classes whose groups are the same
  sync as one. With `overlap_grad_reduce` a stage's gradient reduction hides behind its last
  micro-batch's backward pass; with `overlap_param_gather` the sharded optimizer's weight
  all-gather hides behind the next step's first forward pass (exposed = the excess, never < 0).
  The hidden parts are `StepResult.hidden`.
* Optimizer step: each device reads and writes its optimizer state once at HBM bandwidth.
* Mixture of experts with expert-parallel width e (Megatron's layout: the experts of a stage are
  split over e of its d data-parallel replicas, e | d): a device holds 1/e of the experts; each MoE
  block's token dispatch and combine are all-to-alls over the e replicas, 1/t of the routed tokens
  per device, twice forward and twice backward (and again when fully recomputed), blocking like the
  tensor-parallel collectives. With an expert tensor-parallel width τ ≠ t (`solver.layout`) a
  device holds 1/(e·τ) of the experts, the all-to-alls run over e ranks τ apart, and the routed
  experts' all-reduces over τ ranks on τ/t of a width-t rank's tokens (none at τ = 1). The experts'
  saved activations stay those of the width-t graph (a simplification: at τ < t a device keeps the
  same expert-width activations but fewer dispatched-token copies).
* Sharded data parallelism (`TrainingOptions.data_parallel_sharding`, ZeRO stages 1-3 / FSDP):
  the ranks holding the same weights (c·d with context parallelism, or groups of
  `data_parallel_shard_width` of them) split the optimizer state, the gradients and the weights;
  `sync_times` (once a step) and `sharded_traffic` (every micro-batch, exposed beyond the compute it
  is prefetched behind, or all of it as DeepSpeed's early ZeRO-3 ran them: `sharded_collectives`)
  price their collectives.
* Context parallelism (width c): 1/c of every per-token cost (`token_share`), plus ring attention's
  K, V transfers on the context group's tier, exposed beyond the attention step they overlap
  (`ring_attention`).
Simplifications: recomputation applies to every stage (as Megatron does); the embedding-gradient
all-reduce between the first and last stage and the scatter/gather's all-gather are not charged;
interleaved chunks are charged their average activations (`memory.in_flight`).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from graph_extract.kernels import KernelOptions
from graph_extract.layergraph import RecomputedModule
from phaze_hardware import Collective, Group, Network
from solver.layout import FitRules, Layout
from solver.training_step.memory import (FP8_WEIGHT_COPY_BYTES, held_activations, in_flight, recompute_mode,
                                         recomputed_modules)
from solver.training_step.options import (GATHER_COPY_PASSES, GATHER_HOST_TIME, LIST_MEMBER_HOST_TIME,
                                          PERSISTENCE_THRESHOLD, REDUCE_COPY_PASSES, REUSE_DISTANCE,
                                          TrainingOptions)

#: What keeps a device busy each micro-batch (`TrainingStep.busy`): compute, recomputation and the
#: blocking collectives, summed in this order.
BUSY_TERMS = ("compute", "recompute", "tensor_parallel", "expert_parallel", "context_parallel")
#: The fields of `StageTerms` that sum their layers' values, and the per-layer values each sums.
SUMMED_TERMS = {"compute": "compute", "recompute": "recompute", "tensor_parallel": "tensor_parallel",
                "tensor_parallel_hidden": "tensor_parallel_hidden", "context_parallel": "context_parallel",
                "context_parallel_hidden": "context_parallel_hidden", "expert_parallel": "expert_parallel",
                "expert_parallel_hidden": "expert_parallel_hidden", "forward": "forward", "backward": "backward",
                "parameters": "parameters", "expert_parameters": "expert_parameters",
                "matrix_parameters": "matrix_parameters", "held_activations": "held", "gathers": "gathers",
                "regathers": "regathers", "regathered": "regathered"}
#: The terms of `StepResult.breakdown`, in the order they happen.
BREAKDOWN_KEYS = ("compute", "recompute", "tensor_parallel", "context_parallel", "expert_parallel",
                  "sharded_data_parallel", "bubble", "pipeline_transfer", "data_parallel_sync", "optimizer")


@dataclass(frozen=True)
class StepLayer:
    """One layer as one device of a width-t stage runs it, per micro-batch.

    Times [s] are compute only (collectives are charged by the model); `attention_core_forward` is
    the forward time of the attention core (what selective recomputation re-runs). Activation
    bytes and collectives are `graph_extract.Layer`'s; `parameters` are held per device.
    """

    id: int
    forward: float
    backward: float
    attention_core_forward: float
    parameters: float
    activation_bytes: float
    replicated_activation_bytes: float = 0.0
    attention_core_activation_bytes: float = 0.0
    input_bytes: float = 0.0
    replicated_input_bytes: float = 0.0
    is_block: bool = False
    forward_collective_bytes: tuple[float, ...] = ()
    backward_collective_bytes: tuple[float, ...] = ()
    expert_parameters: float = 0.0  # of `parameters`, the experts' (all of them, before expert parallelism)
    all_to_all_bytes: tuple[float, ...] = ()  # the token all-to-alls of one forward pass
    fused_attention_activation_bytes: float | None = None  # `activation_bytes` with a fused attention kernel
    # (None: the same)
    matrix_input_activation_bytes: float = 0.0  # kept only by weight products (FP8: one byte an element)
    replicated_matrix_input_activation_bytes: float = 0.0
    matrix_parameters: float = 0.0  # of `parameters`, those weight products read (FP8: an 8-bit copy)
    matrix_forward: float = 0.0  # of `forward`, the weight products' time (what overlapped collectives hide behind)
    matrix_backward: float = 0.0  # of `backward`, the weight products' time
    attention_forward: float = 0.0  # of `forward`, the attention core's time (what ring attention hides behind)
    attention_backward: float = 0.0  # of `backward`, the attention core's time
    key_value_bytes: float = 0.0  # the keys and values the attention core reads (what ring attention passes on)
    # (s, forward, backward, matrix_forward, matrix_backward) with a device holding 1/s of a width-t rank's
    # experts (s = e·τ/t, `Layout.expert_split`), where they differ from s = 1 (a GPU's roofline: 1/s of
    # the expert weights read a micro-batch)
    expert_parallel_times: tuple[tuple[float, float, float, float, float], ...] = ()
    expert_forward_collective_bytes: tuple[float, ...] = ()  # the routed experts' own all-reduces (τ ranks)
    expert_backward_collective_bytes: tuple[float, ...] = ()
    # its recompute modules but the attention core (what recomputing each drops and re-runs), and
    # (module, forward seconds) of each at e = 1 (a mixture's experts at this shard's split differ by the
    # layer's own difference)
    recompute_modules: tuple[RecomputedModule, ...] = ()
    module_forward: tuple[tuple[str, float], ...] = ()
    parameter_tensors: tuple[int, ...] = ()  # elements of each weight tensor it reads (`graph_extract.Layer`)


@dataclass(frozen=True)
class StepGraph:
    """The layers of one tensor-parallel width in a topological order (their positions), the bytes
    per micro-batch on each edge (source position, dest position, bytes) and the weights two layers
    share (first position, second position, parameters): held once by a device holding both."""

    width: int
    layers: tuple[StepLayer, ...]
    edges: tuple[tuple[int, int, float], ...]
    tied: tuple[tuple[int, int, float], ...] = ()
    experts_per_token: int = 1  # a mixture's top-k (what a deduplicated dispatch sends once a node)

    @property
    def n(self) -> int:
        return len(self.layers)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(layer.id for layer in self.layers)

    @cached_property
    def in_edges(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        """(source position, bytes) of the edges into each position."""
        return self._adjacency(into=True)

    @cached_property
    def out_edges(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        """(dest position, bytes) of the edges out of each position."""
        return self._adjacency(into=False)

    def _adjacency(self, into: bool) -> tuple[tuple[tuple[int, float], ...], ...]:
        found: list[list[tuple[int, float]]] = [[] for _ in self.layers]
        for source, dest, size in self.edges:
            here, there = (dest, source) if into else (source, dest)
            found[here].append((there, float(size)))
        return tuple(tuple(items) for items in found)

    @cached_property
    def chain(self) -> bool:
        """Each position is fed by the previous one (a unique topological order)."""
        return all(any(u == v - 1 for u, _ in self.in_edges[v]) for v in range(1, self.n))

    def is_chain(self) -> bool:
        return self.chain


@dataclass(frozen=True)
class Device:
    """The accelerator as the step sees it: HBM capacity [bytes] and bandwidth [bytes/s]."""

    memory_capacity: float
    hbm_bandwidth: float


@dataclass(frozen=True)
class StageTerms:
    """Per-micro-batch costs of several stages (arrays over stages) on one device of each."""

    compute: np.ndarray  # forward + backward [s]
    recompute: np.ndarray
    tensor_parallel: np.ndarray  # exposed
    tensor_parallel_hidden: np.ndarray  # hidden behind weight products (`tensor_parallel_overlap`)
    context_parallel: np.ndarray  # ring attention's transfers, exposed
    context_parallel_hidden: np.ndarray  # ring attention's transfers hidden behind the attention
    expert_parallel: np.ndarray  # token all-to-alls [s]
    expert_parallel_hidden: np.ndarray  # those hidden behind another micro-batch's compute
    forward: np.ndarray  # forward compute: what an overlapped weight all-gather can hide behind
    backward: np.ndarray  # backward compute + its collectives: what an overlapped sync can hide behind
    transfer_bytes: np.ndarray  # received per micro-batch (activations in, gradients back)
    transfer_messages: np.ndarray
    parameters: np.ndarray
    expert_parameters: np.ndarray  # of `parameters`, the experts' (after expert parallelism)
    matrix_parameters: np.ndarray  # of `parameters`, those FP8 products read
    held_activations: np.ndarray  # bytes per micro-batch in flight
    working_activations: np.ndarray  # bytes while a layer is recomputed
    largest_parameters: np.ndarray  # the parameters of the stage's largest layer (what `full` sharding gathers at once)
    gathers: np.ndarray  # the gathers `blocking_tensors` sharding issues a pass (`TrainingOptions.sharded_collectives`)
    regathers: np.ndarray  # of them, those a backward after a recomputed forward issues again
    regathered: np.ndarray  # and their parameters


@dataclass(frozen=True)
class Placement:
    """A layout with its model chunks (layer positions, first to last): p·v chunks, chunk j on
    pipeline device j mod p (Megatron's interleaved layout; v = 1: the chunks are the stages), and a
    recomputation mode."""

    layout: Layout
    chunks: tuple[tuple[int, ...], ...]
    recompute: str = "none"

    def __post_init__(self) -> None:
        layout = self.layout
        if len(self.chunks) != layout.pipeline_parallel_width * layout.virtual_stages:
            raise ValueError(f"chunks: {len(self.chunks)} chunks for pipeline_parallel_width="
                             f"{layout.pipeline_parallel_width} x virtual_stages={layout.virtual_stages}")

    def device_layers(self, device: int) -> tuple[int, ...]:
        stages = self.layout.pipeline_parallel_width
        return tuple(p for chunk in self.chunks[device :: stages] for p in chunk)


@dataclass(frozen=True)
class StepResult:
    """Time per batch [s] with its breakdown (sums to it) and, per pipeline device, the parameters
    it holds and its peak memory by kind [bytes]; `infeasible_reason` is None when it fits."""

    time_per_batch: float
    breakdown: dict[str, float]
    parameters: tuple[float, ...]
    memory: tuple[dict[str, float], ...]
    infeasible_reason: str | None = None
    hidden: dict[str, float] = field(default_factory=dict)  # communication hidden by the overlaps [s]

    @property
    def feasible(self) -> bool:
        return self.infeasible_reason is None


def blocking_gathers(layers) -> tuple[np.ndarray, np.ndarray]:
    """DeepSpeed's early ZeRO-3 (`TrainingOptions.sharded_collectives` = `blocking_tensors`): per layer,
    ([the weight tensors it gathers a pass, those a backward after a recomputed forward gathers again],
    their parameters). A tensor of at least `PERSISTENCE_THRESHOLD` elements is gathered; after the
    recomputed forward it is freed and gathered again unless the tensors used before its backward — the
    layer's later tensors, in the forward and again in the backward — hold fewer than `REUSE_DISTANCE`
    elements (a layer's tensors in the order its forward reads them)."""
    counts, regathered = np.zeros((2, len(layers))), np.zeros(len(layers))
    for index, layer in enumerate(layers):
        sizes = layer.parameter_tensors
        for position, size in enumerate(sizes):
            if size < PERSISTENCE_THRESHOLD:
                continue
            counts[0, index] += 1
            if 2 * sum(sizes[position + 1:]) >= REUSE_DISTANCE:
                counts[1, index] += 1
                regathered[index] += size
    return counts, regathered


def list_collective_overhead(members: int, collectives, size, copy_passes: int, hbm_bandwidth: float,
                             fetch: float = 0.0):
    """Seconds DeepSpeed's ZeRO-3 of 2021 (`blocking_tensors`) spends on `collectives` collectives of
    `size` bytes over a group of `members`, besides their transfer; 0 for no bytes. Each was a list
    collective: DeepSpeed built one view per member in a Python loop, and PyTorch 1.8's
    ProcessGroupNCCL copied each list entry out of (all-gather) or into (reduce-scatter) its flat
    buffer, one copy each, on the host's critical path as every gather synchronised the device:
    `LIST_MEMBER_HOST_TIME` per member and collective, and `fetch` more per collective (a gather's:
    `GATHER_HOST_TIME`); the device meanwhile makes `copy_passes` passes over the bytes at HBM
    bandwidth (`GATHER_COPY_PASSES`, `REDUCE_COPY_PASSES`)."""
    return np.where(np.asarray(size) > 0,
                    (fetch + LIST_MEMBER_HOST_TIME * members) * collectives + copy_passes * size / hbm_bandwidth,
                    0.0)


def ordered_sum(members: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Σ values over each stage's layers: values[i, v] summed over the positions v of stage k
    (members[v, k]) in position order, for each row i, so that one stage gets the same
    floating-point sum however many stages are costed at once."""
    total = np.zeros((values.shape[0], members.shape[1]))
    for v in range(members.shape[0]):
        total = total + np.where(members[v], values[:, v : v + 1], 0.0)
    return total


def stage_sum(members: np.ndarray, values) -> np.ndarray:
    """`ordered_sum` of one row of per-layer values."""
    return ordered_sum(members, np.asarray(values, float)[None, :])[0]


def per_device(values: np.ndarray, stages: int) -> np.ndarray:
    """Chunk values (last axis, first to last) summed per pipeline device, chunk j on device j mod
    `stages`, in chunk order (with one chunk per device, the values themselves)."""
    result = values[..., :stages]
    for start in range(stages, values.shape[-1], stages):
        result = result + values[..., start : start + stages]
    return result


def stage_max(members: np.ndarray, values) -> np.ndarray:
    total = np.zeros(members.shape[1])
    for v, value in enumerate(values):
        total = np.maximum(total, np.where(members[v], value, 0.0))
    return total


@dataclass(frozen=True)
class TrainingStep:
    """The step model of one shard shape (`shard`: the widths t, e, c that split each layer; the
    graph is width t's) in one recomputation mode, on a cluster: it prices every pipeline and
    data-parallel width of that shard (the placement search costs many at once, vectorised).

    `micro_batches` is the number per batch (global batch / micro-batch size).
    """

    graph: StepGraph
    cluster: Network
    training: TrainingOptions
    kernels: KernelOptions
    device: Device
    micro_batches: int
    recompute: str
    shard: Layout
    _layers: dict = field(init=False, repr=False, compare=False)
    _collectives: dict = field(init=False, repr=False, compare=False)
    _data_groups: dict = field(init=False, repr=False, compare=False)
    _tail_floors: dict = field(init=False, repr=False, compare=False)
    _class_groups: dict = field(init=False, repr=False, compare=False)
    _pipeline_tiers: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if recompute_mode(self.recompute) != self.recompute:
            raise ValueError(f"recompute: {self.recompute!r} is not a recomputation mode's one name "
                             f"({recompute_mode(self.recompute)!r})")
        if self.shard != self.shard.shard or self.shard.tensor_parallel_width != self.graph.width:
            raise ValueError(f"shard: {self.shard.text()} is not the shard of a width-{self.graph.width} graph "
                             "(t its width, p = d = v = 1)")
        layers, width = self.graph.layers, self.graph.width
        tokens = self.token_share
        tensor = self.tensor_parallel_collective
        full = self.recompute == "full"
        blocks = np.array([layer.is_block for layer in layers], bool)

        # the times at this shard's expert-parallel width, where a layer's depend on it: their place in
        # an `expert_parallel_times` entry, and each layer's entry (None: its own times)
        position = {name: index for index, name in enumerate(("forward", "backward", "matrix_forward",
                                                               "matrix_backward"), start=1)}
        split = self.shard.expert_split
        at_width = [next((entry for entry in layer.expert_parallel_times if entry[0] == split), None)
                    for layer in layers] if split != 1 else [None] * len(layers)

        def each(name: str) -> np.ndarray:
            """The layers' `name` (their times at this shard's expert-parallel width)."""
            if name not in position or not any(at_width):
                return np.array([getattr(layer, name) for layer in layers], float)
            return np.array([getattr(layer, name) if found is None else found[position[name]]
                             for layer, found in zip(layers, at_width)], float)

        # the routed experts' collectives: over the τ ranks splitting each expert, on the tokens of τ/t
        # of a width-t rank (τ = t: the tensor-parallel group's, on the same tokens)
        experts_tensor, experts_tokens = self.expert_tensor_collective, tokens * self.shard.expert_tensor_width / width

        def collectives(plain, expert) -> float:
            """Seconds of the tensor-parallel collectives of `plain` bytes and the experts' of `expert`."""
            return (sum(tensor.scalar(b * tokens) for b in plain)
                    + sum(experts_tensor.scalar(b * experts_tokens) for b in expert))

        forward_tp = np.array([collectives(layer.forward_collective_bytes, layer.expert_forward_collective_bytes)
                               for layer in layers], float)
        backward_tp = np.array([collectives(layer.backward_collective_bytes, layer.expert_backward_collective_bytes)
                                for layer in layers], float)
        forward, backward = each("forward") * tokens, each("backward") * tokens
        # what a recompute-modules mode re-runs: each layer's recomputed modules, their forward
        # collectives again (none for `none`, `selective` and `full`, which re-runs whole blocks)
        recomputed = recomputed_modules(self.recompute)
        chosen = [[module for module in layer.recompute_modules if module.name in recomputed] for layer in layers]
        tp_again = np.array([sum(collectives(module.forward_collective_bytes, module.expert_forward_collective_bytes)
                                 for module in found) for found in chosen], float)
        raw_forward_tp = forward_tp
        raw_tp = forward_tp + backward_tp + np.where(blocks & full, forward_tp, 0.0) + tp_again
        if self.training.tensor_parallel_overlap:
            forward_tp = np.maximum(forward_tp - each("matrix_forward") * tokens, 0.0)
            backward_tp = np.maximum(backward_tp - each("matrix_backward") * tokens, 0.0)
            # the re-run collectives hide as much as the forward's do
            tp_again = tp_again * np.divide(forward_tp, raw_forward_tp, out=np.ones(len(layers)),
                                            where=raw_forward_tp > 0)
        exposed_tp = forward_tp + backward_tp + np.where(blocks & full, forward_tp, 0.0) + tp_again
        ring_forward, ring_backward, sent_forward, sent_backward = self.ring_attention(
            each("key_value_bytes") * tokens, each("attention_forward") * tokens, each("attention_backward") * tokens)
        exposed_ring = ring_forward + ring_backward + np.where(blocks & full, ring_forward, 0.0)
        raw_ring = sent_forward + sent_backward + np.where(blocks & full, sent_forward, 0.0)
        experts = self.expert_parallel_collective

        def exchanges(sizes) -> float:
            """Seconds of token all-to-alls of `sizes` bytes (a width-t rank's: 1/t of them each device's)."""
            return sum(experts.scalar(b * tokens / width) for b in sizes)

        all_to_all = np.array([exchanges(layer.all_to_all_bytes) for layer in layers], float)
        dispatch_again = np.array([sum(exchanges(module.all_to_all_bytes) for module in found) for found in chosen],
                                  float)
        raw_experts = 2 * all_to_all + np.where(blocks & full, all_to_all, 0.0) + dispatch_again
        exposed_experts = raw_experts
        if self.training.overlap_expert_dispatch:  # behind another micro-batch's compute of the layer, on
            # the share of the device the dispatch's kernels leave it: compute C and exchanges R take
            # max(C + share·R, R), so max(R − C, share·R) of R stays exposed
            exposed_experts = np.maximum(raw_experts - (forward + backward),
                                         self.training.expert_dispatch_compute_share * raw_experts)
        all_to_all = all_to_all * np.divide(exposed_experts, raw_experts, out=np.zeros(len(layers)),
                                            where=raw_experts > 0)  # its backward share, exposed
        expert_parameters = each("expert_parameters") / split
        if full:
            rerun = forward
        else:  # the modules' forward (a mixture's experts at this shard's split differ by the layer's own
            # difference: only the experts' products read what the split changes), the attention core's
            at_split = each("forward") - np.array([layer.forward for layer in layers], float)
            rerun = tokens * np.array([sum(dict(layer.module_forward).get(module.name, 0.0)
                                           + (shift if module.name == "moe" else 0.0) for module in found)
                                       for layer, found, shift in zip(layers, chosen, at_split)], float)
            if "core_attn" in recomputed:
                rerun = rerun + each("attention_core_forward") * tokens
        held, working = held_activations(layers, self.recompute, width, self.kernels)
        gathers, regathered = blocking_gathers(layers) if self.training.sharded_collectives == "blocking_tensors" \
            else (np.zeros((2, len(layers))), np.zeros(len(layers)))
        object.__setattr__(self, "_collectives", {})
        object.__setattr__(self, "_data_groups", {})
        object.__setattr__(self, "_tail_floors", {})
        object.__setattr__(self, "_class_groups", {})
        object.__setattr__(self, "_pipeline_tiers", {})
        object.__setattr__(self, "_layers", {
            "compute": forward + backward,
            "recompute": np.where(blocks, rerun, 0.0),
            "tensor_parallel": exposed_tp,
            "tensor_parallel_hidden": raw_tp - exposed_tp,
            "context_parallel": exposed_ring,
            "context_parallel_hidden": raw_ring - exposed_ring,
            "expert_parallel": exposed_experts,
            "expert_parallel_hidden": raw_experts - exposed_experts,
            "forward": forward,
            "backward": backward + backward_tp + ring_backward + all_to_all,
            "parameters": each("parameters") - each("expert_parameters") + expert_parameters,
            "expert_parameters": expert_parameters,
            "matrix_parameters": each("matrix_parameters") - each("expert_parameters") + expert_parameters,
            "held": held * tokens,
            "working": working * tokens,
            "gathers": gathers[0],
            "regathers": gathers[1],
            "regathered": regathered,
        })

    @property
    def token_share(self) -> float:
        """The share of each sequence's tokens one device of the context-parallel group runs: 1/c.
        Every per-token cost of the width-t graph (its layers' times, activations, collectives and
        transfers) is divided by c; the causal attention too, as the 2c load-balanced chunks give each
        device 1/c of the score tiles (Megatron-Core / Transformer Engine's context parallelism)."""
        return 1.0 / self.shard.context_parallel_width

    def ring_attention(self, key_value_bytes: np.ndarray, attention_forward: np.ndarray,
                       attention_backward: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per layer: (exposed forward, exposed backward, all forward, all backward) seconds of ring
        attention's transfers over the c ranks of the context-parallel group, given a device's K and
        V chunk and its attention time (after the 1/c split).

        Forward, c − 1 times each device passes its K and V chunk to the next rank while it computes
        the attention of the chunk in hand, 1/c of its attention; backward it passes K, V and their
        gradients (twice the bytes) behind 1/c of the backward attention (Transformer Engine's ring
        exchange, Liu et al. 2023). Each transfer hides behind the step it overlaps: exposed = (c − 1)
        · max(transfer − step, 0) per direction; the point-to-point sends are on the tier the
        context-parallel group spans.
        """
        c = self.shard.context_parallel_width
        if c == 1:
            zero = np.zeros(len(key_value_bytes))
            return zero, zero, zero, zero
        link = self.cluster.send(self.cluster.tier_joining(self.shard.groups()["context"]))
        forward_send, backward_send = link.time(key_value_bytes), link.time(2 * key_value_bytes)
        exposed_forward = (c - 1) * np.maximum(forward_send - attention_forward / c, 0.0)
        exposed_backward = (c - 1) * np.maximum(backward_send - attention_backward / c, 0.0)
        return exposed_forward, exposed_backward, (c - 1) * forward_send, (c - 1) * backward_send

    @property
    def width(self) -> int:
        return self.graph.width

    @property
    def stage_devices(self) -> int:
        """Devices of one pipeline stage of one replica: the t·c ranks splitting its layers."""
        return self.graph.width * self.shard.context_parallel_width

    def layout(self, stages: int = 1, degree: int = 1, virtual_stages: int = 1) -> Layout:
        """The layout of this shard with p stages, d replicas and v chunks per device."""
        return self.shard.replace(pipeline_parallel_width=stages, data_parallel_width=degree,
                                  virtual_stages=virtual_stages)

    def fit_rules(self) -> FitRules:
        """The layout rules of this step's question (the model's experts are checked where it is known)."""
        return self._fit_rules

    @cached_property
    def _fit_rules(self) -> FitRules:
        blocks = sum(layer.is_block for layer in self.graph.layers)
        return FitRules(self.cluster.num_devices, self.micro_batches, self.graph.n, blocks, None)

    def data_groups(self, degree: int) -> tuple[Group, Group]:
        """(the ranks holding the same dense weights, those holding the same experts) at width d:
        with context parallelism, c·d ranks and c·d/e (`Layout.groups`)."""
        found = self._data_groups.get(degree)
        if found is None:
            groups = self.layout(1, degree).groups()
            found = self._data_groups[degree] = (groups["weights"], groups["expert_weights"])
        return found

    def shard_groups(self, group: Group) -> tuple[Group, Group]:
        """(shard group, replica group) of the ranks `group` holding the same weights: all of them and
        none (`data_parallel_shard_width` None), or groups of that width and the ranks holding the
        same shard across them (hybrid sharding); a group the width does not divide (a class of
        experts) is sharded over the largest common divisor."""
        width = self.training.data_parallel_shard_width
        if width is None or width >= group.size:
            return group, Group(1, group.stride * group.size)
        width = math.gcd(width, group.size)
        return Group(width, group.stride), Group(group.size // width, group.stride * width)

    def sharding_problem(self, degree: int) -> str | None:
        """Why the shard width cannot split the c·d ranks of width d, or None."""
        return self.training.shard_problem(self.data_groups(degree)[0].size)

    @cached_property
    def tensor_parallel_collective(self) -> Collective:
        return self.cluster.all_reduce(self.shard.groups()["tensor"])

    @cached_property
    def expert_tensor_collective(self) -> Collective:
        """The routed experts' all-reduce (or reduce-scatter and all-gather) over the τ ranks splitting
        each expert."""
        return self.cluster.all_reduce(self.shard.groups()["expert_tensor"])

    @cached_property
    def expert_parallel_collective(self) -> Collective:
        """A token dispatch or combine over the expert group (`TrainingOptions.expert_dispatch`)."""
        group = self.shard.groups()["expert"]
        if self.training.expert_dispatch == "deduplicated":
            return self.cluster.dispatch(group, self.graph.experts_per_token)
        return self.cluster.all_to_all(group)

    # Stages, vectorised: the DP costs every candidate stage with these.

    def partition_terms(self, chunks: tuple[tuple[int, ...], ...]) -> StageTerms:
        """`stage_terms` of chunks that split the layers (each position in one chunk)."""
        members = np.zeros((self.graph.n, len(chunks)), bool)
        for index, chunk in enumerate(chunks):
            members[list(chunk), index] = True
        return self.stage_terms(members)

    @cached_property
    def terms_key(self) -> tuple:
        """What `stage_terms` depends on: steps of equal keys (the data-parallel shardings of one shard
        and mode) have equal terms."""
        return self.graph, self.token_share, tuple(values.tobytes() for values in self._layers.values())

    @cached_property
    def _summed(self) -> np.ndarray:
        """The per-layer values `stage_terms` sums, a row per name of SUMMED_TERMS."""
        return np.array([self._layers[name] for name in SUMMED_TERMS.values()], float)

    @cached_property
    def _edge_bytes(self) -> np.ndarray:
        """The bytes each edge carries to or from one device per micro-batch."""
        return np.array([size * self.token_share / self.width for _, _, size in self.graph.edges], float)

    def stage_terms(self, members: np.ndarray) -> StageTerms:
        """The terms of the stages given by `members[v, k]` (position v in stage k). Each stage's sums
        run in position order (edges: in edge order), so a stage gets the same floating-point sum
        however many stages are costed at once."""
        members = np.asarray(members, bool)
        values = self._layers
        summed = ordered_sum(members, self._summed)
        edges = self.graph.edges
        if edges:
            sources, dests = (np.array([edge[i] for edge in edges], dtype=np.int64) for i in (0, 1))
            crossing = members[dests] != members[sources]  # into one stage, out of the other
            transfer_bytes = np.cumsum(np.where(crossing, self._edge_bytes[:, None], 0.0), axis=0)[-1]
            messages = crossing.sum(axis=0).astype(float)
        else:
            transfer_bytes = messages = np.zeros(members.shape[1])
        terms = dict(zip(SUMMED_TERMS, summed))
        for first, second, shared in self.graph.tied:
            terms["parameters"] = terms["parameters"] - np.where(members[first] & members[second], shared, 0.0)
        return StageTerms(**terms, transfer_bytes=transfer_bytes, transfer_messages=messages,
                          working_activations=stage_max(members, values["working"]),
                          largest_parameters=stage_max(members, values["parameters"]))

    def pipeline_tier(self, stages: int, degree: int) -> int:
        """The tier of the slowest link between consecutive stages."""
        found = self._pipeline_tiers.get((stages, degree))
        if found is None:
            found = self._pipeline_tiers[stages, degree] = self.cluster.tier_joining(
                self.layout(stages, degree).groups()["pipeline"])
        return found

    def pipeline_tier_depths(self, degree: int, most: int) -> list[tuple[int, int, int]]:
        """(tier, fewest stages, most stages): the depths whose slowest stage boundary is on each tier."""
        return self.cluster.size_ranges(self.layout(1, degree).groups()["pipeline"].stride, most)

    def transfer_time(self, terms: StageTerms, tier: int) -> np.ndarray:
        link = self.cluster.send(tier)
        return link.per_byte * terms.transfer_bytes + link.fixed * terms.transfer_messages

    def load(self, terms: StageTerms, tier: int) -> np.ndarray:
        """Time per micro-batch of each stage with its transfers on `tier`, before the exposed part of
        sharded data parallelism's collectives (`sharded_traffic`, which depends on d)."""
        return self.busy(terms) + self.transfer_time(terms, tier)

    @staticmethod
    def busy(terms: StageTerms) -> np.ndarray:
        """Per micro-batch: compute, recomputation and the blocking collectives of each stage."""
        return functools.reduce(operator.add, (getattr(terms, name) for name in BUSY_TERMS))

    def activation_bytes(self, terms: StageTerms, micro_batches_in_flight) -> np.ndarray:
        return micro_batches_in_flight * terms.held_activations + terms.working_activations

    def memory_bytes(self, terms: StageTerms, micro_batches_in_flight, degree: int) -> np.ndarray:
        """Peak bytes per device of each stage holding this many micro-batches' activations."""
        return self.static_bytes(terms, degree) + self.activation_bytes(terms, micro_batches_in_flight)

    def parameter_classes(self, parameters, degree: int, expert_parameters=0.0) -> list[tuple[Group, Group, object]]:
        """(shard group, replica group, parameters) of each class of parameters per device: the dense
        ones over the c·d ranks holding them, the experts' over the c·d/e holding the same experts
        (`shard_groups` splits each into shard and replica groups); classes of the same groups as one
        (their counts are whole numbers: the sum is exact)."""
        classes = []
        for shard, replicas, dense, experts in self.class_groups(degree):
            if dense:
                count = parameters - expert_parameters
                classes.append((shard, replicas, count + expert_parameters if experts else count))
            else:
                classes.append((shard, replicas, expert_parameters))
        return classes

    def class_groups(self, degree: int) -> tuple[tuple[Group, Group, bool, bool], ...]:
        """(shard group, replica group, holds dense weights, holds experts) of each class at width d."""
        found = self._class_groups.get(degree)
        if found is None:
            data, expert_data = self.data_groups(degree)
            found = (((*self.shard_groups(data), True, True),) if data == expert_data else
                     ((*self.shard_groups(data), True, False), (*self.shard_groups(expert_data), False, True)))
            self._class_groups[degree] = found
        return found

    def state_bytes(self, kind: str, parameters, degree: int, expert_parameters=0.0):
        """Bytes per device of one kind of model state ("weights", "gradients", "optimizer_state") of
        `parameters`, each class sharded over its shard group when the sharding splits that kind."""
        state, total = self.training.model_state, 0.0
        for shard, _, count in self.parameter_classes(parameters, degree, expert_parameters):
            total = total + count * state.share(kind, shard.size)
        return total

    def optimizer_state_bytes(self, parameters, degree: int, expert_parameters=0.0):
        """Optimizer state of `parameters` per device, of which `expert_parameters` are experts'."""
        return self.state_bytes("optimizer_state", parameters, degree, expert_parameters)

    def gathered_weight_bytes(self, terms: StageTerms) -> np.ndarray:
        """The whole weights a device holds besides its shards with `full` sharding: those of the layer
        running and of the one prefetched (twice its largest layer's), or with
        `reshard_after_forward` false every weight of the stage, kept all step."""
        if not self.training.model_state.splits("weights"):
            return np.zeros_like(terms.parameters)
        whole = terms.parameters if not self.training.reshard_after_forward else 2.0 * terms.largest_parameters
        return whole * self.training.model_state.weights

    def weight_bytes(self, terms: StageTerms, degree: int):
        """16-bit weights (their shards and what `full` sharding gathers), and in FP8 the 8-bit copies
        of the weights FP8 products read (sharded as the weights)."""
        weights = self.state_bytes("weights", terms.parameters, degree, terms.expert_parameters)
        if self.kernels.fp8:
            share = weights / np.where(terms.parameters > 0, terms.parameters, 1.0) / self.training.model_state.weights
            weights = weights + FP8_WEIGHT_COPY_BYTES * terms.matrix_parameters * share
        return weights + self.gathered_weight_bytes(terms)

    def static_bytes(self, terms: StageTerms, degree: int):
        """Weights, gradients and optimizer state per device of each stage, and the framework's
        reserve."""
        return (self.weight_bytes(terms, degree)
                + self.state_bytes("gradients", terms.parameters, degree, terms.expert_parameters)
                + self.optimizer_state_bytes(terms.parameters, degree, terms.expert_parameters)
                + self.training.framework_reserve)

    def memory_floor(self, terms: StageTerms, micro_batches_in_flight) -> np.ndarray:
        """A lower bound on `memory_bytes` of each stage at every data-parallel width: the kinds of
        model state the sharding does not split (the same at any d), what `full` gathers, the
        activations and the reserve."""
        state = self.training.model_state
        whole = sum(getattr(state, kind) for kind in ("weights", "gradients", "optimizer_state")
                    if not state.splits(kind))
        floor = (whole * terms.parameters + self.gathered_weight_bytes(terms)
                 + self.activation_bytes(terms, micro_batches_in_flight) + self.training.framework_reserve)
        return floor * (1 - self.FLOOR_SLACK)

    def deepest_position(self, terms: StageTerms, degree: int, limit: int) -> np.ndarray:
        """Per stage, the largest q ≤ `limit` such that the stage fits in memory as the q-th from the
        end of a 1F1B pipeline (holding min(q, m) micro-batches); 0 if it never fits."""
        if self.sharding_problem(degree) is not None:
            return np.zeros(len(terms.parameters), dtype=np.int64)
        micro_batches = self.micro_batches // degree
        capacity = self.device.memory_capacity
        fits_all = self.memory_bytes(terms, min(limit, micro_batches), degree) <= capacity
        room = capacity - self.memory_bytes(terms, 0, degree)
        held = terms.held_activations
        with np.errstate(divide="ignore", invalid="ignore"):
            guess = np.floor(np.where(held > 0, room / np.where(held > 0, held, 1.0), 0.0))
        guess = np.clip(guess, 0, limit).astype(np.int64)
        # the closed form may be off by one in floating point: settle it with the model itself
        guess = np.where(self.memory_bytes(terms, guess, degree) <= capacity, guess, guess - 1)
        above = np.minimum(guess + 1, limit)
        guess = np.where((above > guess) & (self.memory_bytes(terms, above, degree) <= capacity), above, guess)
        return np.where(fits_all, limit, np.maximum(guess, 0))

    def collectives(self, shard: Group, replicas: Group) -> dict[str, Collective]:
        """The collectives of a class's shard and replica groups: all-reduce over the whole of them,
        reduce-scatter and all-gather within the shard group, all-reduce across the replicas."""
        found = self._collectives.get((shard, replicas))
        if found is None:
            whole = Group(shard.size * replicas.size, shard.stride)
            found = {"all_reduce": self.cluster.all_reduce(whole), "reduce_scatter": self.cluster.reduce_scatter(shard),
                     "all_gather": self.cluster.all_gather(shard), "across": self.cluster.all_reduce(replicas)}
            self._collectives[(shard, replicas)] = found
        return found

    def sync_times(self, parameters, degree: int, expert_parameters=0.0):
        """(gradient reduction, weight all-gather) once a step, after the last backward, of stages
        holding `parameters` per device, not overlapped, each class over its own groups:

            none       all-reduce of the gradients over the ranks holding the weights
            optimizer  reduce-scatter within the shard group, all-reduce of the shard across the
                       replicas, all-gather of the updated weights within the shard group
            gradients  (reduce-scattered every micro-batch: `sharded_traffic`) the all-reduce across
                       the replicas and the all-gather of the updated weights
            full       the all-reduce across the replicas; with `reshard_after_forward` false the one
                       all-gather of the weights a step (before the next step's first forward)
        """
        state, sharding, reduction, gather = self.training.model_state, self.training.data_parallel_sharding, 0.0, 0.0
        for shard, replicas, count in self.parameter_classes(parameters, degree, expert_parameters):
            collective = self.collectives(shard, replicas)
            gradients, weights = count * state.gradients, count * state.weights
            if sharding == "none":
                reduction = reduction + collective["all_reduce"].time(gradients)
                continue
            if sharding == "optimizer":
                reduction = reduction + collective["reduce_scatter"].time(gradients)
            reduction = reduction + collective["across"].time(gradients / shard.size)
            if sharding != "full" or not self.training.reshard_after_forward:
                gather = gather + collective["all_gather"].time(weights)
        return reduction, gather

    def sharded_traffic(self, terms: StageTerms, degree: int) -> tuple[np.ndarray, np.ndarray]:
        """Per micro-batch of each stage: (exposed, hidden) seconds of the collectives sharded model
        state runs every micro-batch. `gradients` and `full` reduce-scatter each micro-batch's
        gradients within the shard group (into the device's gradient shard); `full` with
        `reshard_after_forward` also all-gathers the weights before the forward and again before the
        backward, each pass's as one collective of a class's weights (`prefetched_layers`: a
        simplification, FSDP issues one a layer, each paying the group's latency) or one a weight
        tensor (`blocking_tensors`, `blocking_gathers`). With `prefetched_layers`, `full` prefetches
        them behind the compute as FSDP does: the forward's gathers hide behind the forward compute,
        the backward's gathers and reduce-scatters behind the backward and recomputation, exposed =
        the excess (the first layer's gather, which nothing precedes, is not charged apart: a
        simplification); with `blocking_tensors` every one is exposed, a full recomputation
        gathers the stage's weights once more (its embedding too: a simplification) and their freed
        share a third time, and each collective also costs what DeepSpeed's of 2021 did besides the
        transfer (`list_collective_overhead`). `gradients` hides its reduce-scatters behind
        the backward with `overlap_grad_reduce` (DeepSpeed's overlap_comm), else they are exposed."""
        zero = np.zeros_like(terms.parameters)
        sharding = self.training.data_parallel_sharding
        if sharding not in ("gradients", "full"):
            return zero, zero
        state, forward, backward = self.training.model_state, 0.0, 0.0
        regather = sharding == "full" and self.training.reshard_after_forward
        blocking = sharding == "full" and self.training.sharded_collectives == "blocking_tensors"
        collectives = terms.gathers if blocking else 1
        # with `blocking_tensors` and full recomputation the backward's gathers are the recomputed
        # forward's and, for the share of the weights freed before their backward, its own
        third = blocking and self.recompute == "full"
        regathered = np.divide(terms.regathered, terms.parameters, out=np.zeros_like(terms.parameters),
                               where=terms.parameters > 0) if third else zero
        regathers = terms.regathers if third else zero
        hbm = self.device.hbm_bandwidth
        for shard, replicas, count in self.parameter_classes(terms.parameters, degree, terms.expert_parameters):
            collective = self.collectives(shard, replicas)

            def priced(kind: str, size, number):
                """`number` collectives of `kind` moving `size` bytes, with DeepSpeed's own costs
                when `blocking`."""
                time = collective[kind].repeated(size, number)
                if not blocking:
                    return time
                passes, fetch = ((GATHER_COPY_PASSES, GATHER_HOST_TIME) if kind == "all_gather"
                                 else (REDUCE_COPY_PASSES, 0.0))
                return time + list_collective_overhead(shard.size, number, size, passes, hbm, fetch)

            reduced, weights = count * state.gradients, count * state.weights
            backward = backward + priced("reduce_scatter", reduced, collectives)
            if regather:
                gathered = priced("all_gather", weights, collectives)
                again = priced("all_gather", weights * regathered, regathers)
                forward, backward = forward + gathered, backward + gathered + again
        forward, backward = forward + zero, backward + zero
        if blocking:
            exposed = forward + backward
        elif sharding == "full":
            exposed = (np.maximum(forward - terms.forward, 0.0)
                       + np.maximum(backward - (terms.backward + terms.recompute), 0.0))
        elif self.training.overlap_grad_reduce:
            exposed = np.maximum(backward - (terms.backward + terms.recompute), 0.0)
        else:
            exposed = forward + backward
        return exposed, forward + backward - exposed

    def sync_time(self, parameters, degree: int, expert_parameters=0.0):
        """Data-parallel sync once a step of stages holding `parameters` per device, not overlapped."""
        reduction, gather = self.sync_times(parameters, degree, expert_parameters)
        return reduction + gather

    def optimizer_time(self, parameters, degree: int, expert_parameters=0.0):
        """Reading and writing the device's optimizer state once at HBM bandwidth."""
        return 2.0 * self.optimizer_state_bytes(parameters, degree, expert_parameters) / self.device.hbm_bandwidth

    def tail_time(self, parameters, degree: int, expert_parameters=0.0):
        """Sync and optimizer step of stages holding `parameters` per device, the sync not hidden:
        what such a stage adds after the last backward (it grows with the parameters)."""
        return (self.sync_time(parameters, degree, expert_parameters)
                + self.optimizer_time(parameters, degree, expert_parameters))

    def tail(self, terms: StageTerms, degree: int) -> tuple[np.ndarray, np.ndarray]:
        """(exposed sync, optimizer step) of each stage after the last backward: the gradient reduction
        less the last backward pass it hides behind (`overlap_grad_reduce`), the weight all-gather less
        the next step's first forward pass (`overlap_param_gather`, and `full` sharding's one gather a
        step, prefetched), each never below zero."""
        reduction, gather = self.sync_times(terms.parameters, degree, terms.expert_parameters)
        if self.training.overlap_grad_reduce:
            reduction = np.maximum(reduction - terms.backward, 0.0)
        if self.training.overlap_param_gather or self.training.data_parallel_sharding == "full":
            gather = np.maximum(gather - terms.forward, 0.0)
        return reduction + gather, self.optimizer_time(terms.parameters, degree, terms.expert_parameters)

    @property
    def sync_overlaps(self) -> bool:
        return (self.training.overlap_grad_reduce or self.training.overlap_param_gather
                or self.training.data_parallel_sharding == "full")

    def tail_keys_are_parameters(self) -> bool:
        """Whether every stage's tail grows with its parameters alone (so a cap on parameters is a
        cap on the tail); not so when the sync overlaps the backward pass, nor when the experts sync
        over other replicas than the rest."""
        data, expert_data = self.data_groups(self.shard.expert_parallel_width)
        return not self.sync_overlaps and expert_data == data

    @staticmethod
    def pipeline_time(micro_batches, stages, virtual_stages, load):
        return (micro_batches + (stages - 1) / virtual_stages) * load

    # Bounds: no placement is faster (the architecture search's, over chips; the placement search's).

    #: Relative slack of `time_floor`: its sums run in another order than a stage's (a last-bit difference).
    FLOOR_SLACK = 1e-9

    def tail_floor(self, degrees) -> np.ndarray:
        """No stage's tail at width d is shorter (for each of `degrees`, an array): that of the layer
        with the most parameters (a stage holding it holds at least its parameters; only its
        optimizer step when the sync may hide)."""
        degrees, known = np.asarray(degrees), self._tail_floors
        parameters, experts = self._layers["parameters"], self._layers["expert_parameters"]
        tail = self.optimizer_time if self.sync_overlaps else self.tail_time
        for degree in set(degrees.flat) - known.keys():
            known[degree] = float(np.max(tail(parameters, int(degree), experts), initial=0.0))
        return np.array([known[degree] for degree in degrees.flat]).reshape(degrees.shape)

    @cached_property
    def layer_busy(self) -> np.ndarray:
        """`busy` of each layer alone (the same terms, summed in the same order)."""
        return functools.reduce(operator.add, (self._layers[name] for name in BUSY_TERMS))

    def time_floor(self, degrees, stages, virtual_stages=1, heaviest_load: float | None = None) -> np.ndarray:
        """A lower bound on the time per batch [s] of every placement of this shard in its mode at
        widths d (`degrees`) with `stages` pipeline stages and `virtual_stages` (arrays that
        broadcast): each device's load is at least its compute, recomputation and blocking
        collectives (`busy`), so the slowest one's at least `heaviest_load` when given, else
        max(heaviest layer, all layers / p); transfers, sharded traffic and the exposed sync beyond
        `tail_floor` only add."""
        stages, degrees = np.asarray(stages), np.asarray(degrees)
        load = (np.maximum(self.layer_busy.max(), self.layer_busy.sum() / stages) if heaviest_load is None
                else heaviest_load)
        time = self.pipeline_time(self.micro_batches // degrees, stages, virtual_stages, load)
        return (time + self.tail_floor(degrees)) * (1 - self.FLOOR_SLACK)

    def time_lower_bound(self, compute: np.ndarray, degrees) -> np.ndarray:
        """A lower bound on the time per batch of every placement of this shard, in any
        recomputation mode, for layers whose forward + backward compute is at least `compute[v]`
        (an array per layer, e.g. over candidate chips); `degrees` are the data-parallel widths.

        Each device of p carries at least its layers' compute and collectives, so
        ℓ ≥ max(M, W/p) (M the heaviest layer, W all layers); the pipeline is at least
        (m + (p − 1)/v)·ℓ with v at most blocks/p (collectives that may overlap counted as 0); and the stage holding the layer with the most
        parameters P* has at least the tail of P* (its optimizer step only, when the sync may
        hide behind the backward pass). Minimised over d and p ≤ min(layers, devices/(t·d)).
        """
        compute = np.asarray(compute, float) * self.token_share  # the device's 1/c of each sequence
        # overlapped tensor-parallel collectives may hide entirely behind a chip's weight products
        tensor = 0.0 if self.training.tensor_parallel_overlap else self._layers["tensor_parallel"]
        # overlapped dispatches may hide entirely behind a chip's compute of another micro-batch
        experts = 0.0 if self.training.overlap_expert_dispatch else self._layers["expert_parallel"]
        collectives = tensor + experts
        per_layer = compute + collectives.reshape((-1,) + (1,) * (compute.ndim - 1))
        total, heaviest = per_layer.sum(axis=0), per_layer.max(axis=0)
        blocks = sum(layer.is_block for layer in self.graph.layers)
        best = np.full(total.shape, np.inf)
        for degree in degrees:
            devices = self.cluster.num_devices // (self.stage_devices * degree)
            stages = np.arange(1, min(self.graph.n, devices) + 1)
            if not len(stages):
                continue
            interleave = np.maximum(1, blocks // stages) if self.graph.is_chain() else np.ones(len(stages))
            factor = (self.micro_batches // degree + (stages - 1) / interleave).reshape((-1,) + (1,) * total.ndim)
            load = np.maximum(heaviest, total / stages.reshape(factor.shape))
            best = np.minimum(best, (factor * load).min(axis=0) + float(self.tail_floor(degree)))
        return best

    # One layout (chunks on devices) for many data-parallel widths at once, and one placement.

    @staticmethod
    def device_terms(chunk_terms: StageTerms, stages: int) -> StageTerms:
        """Each pipeline device's terms: its chunks' (chunk j on device j mod p) summed in chunk
        order; its working memory is the largest of its chunks'."""
        fields = {name: per_device(getattr(chunk_terms, name), stages) for name in StageTerms.__dataclass_fields__}
        fields["working_activations"] = chunk_terms.working_activations.reshape(-1, stages).max(axis=0)
        fields["largest_parameters"] = chunk_terms.largest_parameters.reshape(-1, stages).max(axis=0)
        return StageTerms(**fields)

    def score(self, chunk_terms: StageTerms, layouts: list[Layout]) -> dict:
        """Time per batch and its parts for chunks (`chunk_terms`, first to last) laid out as each of
        `layouts` (one p and v, any d): arrays [layout] and [layout, device]."""
        stages, virtual_stages = layouts[0].pipeline_parallel_width, layouts[0].virtual_stages
        degrees = np.array([layout.data_parallel_width for layout in layouts])
        terms = self.device_terms(chunk_terms, stages)
        micro_batches = self.micro_batches // degrees
        tiers = [self.pipeline_tier(stages, int(d)) for d in degrees]
        transfer = per_device(np.array([self.transfer_time(chunk_terms, tier) for tier in tiers]), stages)
        hidden = np.zeros_like(transfer)
        if virtual_stages > 1 and self.training.overlap_pipeline_transfers:
            hidden = np.minimum(transfer, terms.compute + terms.recompute)
        transfer = transfer - hidden
        sharded = [self.sharded_traffic(terms, int(d)) for d in degrees]
        sharded_exposed, sharded_hidden = np.array([t[0] for t in sharded]), np.array([t[1] for t in sharded])
        loads = self.busy(terms) + transfer + sharded_exposed  # [layout, device]
        flight = np.array([in_flight(stages, virtual_stages, int(m)) for m in micro_batches])
        memory = np.array([self.memory_bytes(terms, flight[i], int(d)) for i, d in enumerate(degrees)])
        tails = [self.tail(terms, int(d)) for d in degrees]
        sync, optimizer = np.array([t[0] for t in tails]), np.array([t[1] for t in tails])
        time = self.pipeline_time(micro_batches, stages, virtual_stages, loads.max(axis=1))
        time = time + (sync + optimizer).max(axis=1)
        rules = self.fit_rules()
        fits = (memory <= self.device.memory_capacity).all(axis=1)
        fits &= np.array([rules.widths_problem(layout) is None and self.sharding_problem(layout.data_parallel_width)
                          is None for layout in layouts])
        return {"time": time, "fits": fits, "loads": loads, "transfer": transfer, "transfer_hidden": hidden,
                "sharded": sharded_exposed, "sharded_hidden": sharded_hidden,
                "memory": memory,
                "in_flight": flight, "sync": sync, "optimizer": optimizer, "terms": terms}

    def price(self, placement: Placement) -> StepResult:
        """Time per batch and memory per device of a placement (module docstring)."""
        layout = placement.layout
        if placement.recompute != self.recompute:
            raise ValueError(f"placement.recompute: {placement.recompute!r} but this model is {self.recompute!r}")
        if layout.shard != self.shard:
            raise ValueError(f"placement.layout: {layout.text()} is not of this model's shard {self.shard.text()}")
        degree, stages, v = layout.data_parallel_width, layout.pipeline_parallel_width, layout.virtual_stages
        scored = self.score(self.partition_terms(placement.chunks), [layout])
        terms, micro_batches = scored["terms"], self.micro_batches // degree
        loads, transfer = scored["loads"][0], scored["transfer"][0]
        tails = scored["sync"][0] + scored["optimizer"][0]
        slowest, last_out = int(np.argmax(loads)), int(np.argmax(tails))
        breakdown = {
            "compute": micro_batches * float(terms.compute[slowest]),
            "recompute": micro_batches * float(terms.recompute[slowest]),
            "tensor_parallel": micro_batches * float(terms.tensor_parallel[slowest]),
            "context_parallel": micro_batches * float(terms.context_parallel[slowest]),
            "expert_parallel": micro_batches * float(terms.expert_parallel[slowest]),
            "sharded_data_parallel": micro_batches * float(scored["sharded"][0][slowest]),
            "bubble": (stages - 1) / v * float(loads[slowest]),
            "pipeline_transfer": micro_batches * float(transfer[slowest]),
            "data_parallel_sync": float(scored["sync"][0][last_out]),
            "optimizer": float(scored["optimizer"][0][last_out]),
        }
        hidden = {
            "tensor_parallel": micro_batches * float(terms.tensor_parallel_hidden[slowest]),
            "context_parallel": micro_batches * float(terms.context_parallel_hidden[slowest]),
            "expert_parallel": micro_batches * float(terms.expert_parallel_hidden[slowest]),
            "sharded_data_parallel": micro_batches * float(scored["sharded_hidden"][0][slowest]),
            "pipeline_transfer": micro_batches * float(scored["transfer_hidden"][0][slowest]),
            "data_parallel_sync": float(self.sync_time(terms.parameters[last_out], degree,
                                                       terms.expert_parameters[last_out])
                                        - scored["sync"][0][last_out]),
        }
        activations = self.activation_bytes(terms, scored["in_flight"][0])
        weights = self.weight_bytes(terms, degree)
        gradients = self.state_bytes("gradients", terms.parameters, degree, terms.expert_parameters)
        optimizer_state = self.optimizer_state_bytes(terms.parameters, degree, terms.expert_parameters)
        memory = []
        for index in range(stages):
            memory.append({"weights": float(weights[index]), "gradients": float(gradients[index]),
                           "optimizer_state": float(optimizer_state[index]),
                           "activations": float(activations[index]),
                           "framework_reserve": self.training.framework_reserve,
                           "total": float(scored["memory"][0][index])})
        return StepResult(float(scored["time"][0]), breakdown, tuple(float(p) for p in terms.parameters),
                          tuple(memory), None if scored["fits"][0] else self.why_not(memory, layout), hidden)

    def why_not(self, memory: list[dict[str, float]], layout: Layout) -> str:
        """Why a placement with this memory per device cannot run."""
        problem = self.fit_rules().widths_problem(layout) or self.sharding_problem(layout.data_parallel_width)
        if problem is not None:
            return problem
        i = max(range(len(memory)), key=lambda index: memory[index]["total"])
        return (f"memory: stage {i} needs {memory[i]['total'] / 2**30:.4g} GiB per device, "
                f"{self.device.memory_capacity / 2**30:.4g} GiB available")
