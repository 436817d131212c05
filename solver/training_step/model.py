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
  tensor-parallel collectives.
Simplifications: recomputation applies to every stage (as Megatron does); the embedding-gradient
all-reduce between the first and last stage and the scatter/gather's all-gather are not charged;
interleaved chunks are charged their average activations (`memory.in_flight`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from graph_extract.kernels import KernelOptions
from hardware import Collective, Group, Network
from solver.layout import FitRules, Layout
from solver.training_step.memory import FP8_WEIGHT_COPY_BYTES, RECOMPUTE_MODES, held_activations, in_flight
from solver.training_step.options import TrainingOptions

#: The terms of `StepResult.breakdown`, in the order they happen.
BREAKDOWN_KEYS = ("compute", "recompute", "tensor_parallel", "expert_parallel", "bubble", "pipeline_transfer",
                  "data_parallel_sync", "optimizer")


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


@dataclass(frozen=True)
class StepGraph:
    """The layers of one tensor-parallel width in a topological order (their positions), the bytes
    per micro-batch on each edge (source position, dest position, bytes) and the weights two layers
    share (first position, second position, parameters): held once by a device holding both."""

    width: int
    layers: tuple[StepLayer, ...]
    edges: tuple[tuple[int, int, float], ...]
    tied: tuple[tuple[int, int, float], ...] = ()

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
    expert_parallel: np.ndarray  # token all-to-alls [s]
    forward: np.ndarray  # forward compute: what an overlapped weight all-gather can hide behind
    backward: np.ndarray  # backward compute + its collectives: what an overlapped sync can hide behind
    transfer_bytes: np.ndarray  # received per micro-batch (activations in, gradients back)
    transfer_messages: np.ndarray
    parameters: np.ndarray
    expert_parameters: np.ndarray  # of `parameters`, the experts' (after expert parallelism)
    matrix_parameters: np.ndarray  # of `parameters`, those FP8 products read
    held_activations: np.ndarray  # bytes per micro-batch in flight
    working_activations: np.ndarray  # bytes while a layer is recomputed


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


def stage_sum(members: np.ndarray, values) -> np.ndarray:
    """Σ values over each stage's layers (members[v, k]: position v in stage k), in position order,
    so that one stage gets the same floating-point sum however many stages are costed at once."""
    total = np.zeros(members.shape[1])
    for v, value in enumerate(values):
        total = total + np.where(members[v], value, 0.0)
    return total


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

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute: unknown {self.recompute!r}; allowed: {', '.join(RECOMPUTE_MODES)}")
        if self.shard != self.shard.shard or self.shard.tensor_parallel_width != self.graph.width:
            raise ValueError(f"shard: {self.shard.text()} is not the shard of a width-{self.graph.width} graph "
                             "(t its width, p = d = v = 1)")
        layers, width = self.graph.layers, self.graph.width
        tensor = self.tensor_parallel_collective
        full = self.recompute == "full"
        blocks = np.array([layer.is_block for layer in layers], bool)
        forward_tp = np.array([sum(map(tensor.scalar, layer.forward_collective_bytes)) for layer in layers], float)
        backward_tp = np.array([sum(map(tensor.scalar, layer.backward_collective_bytes)) for layer in layers], float)
        forward = np.array([layer.forward for layer in layers], float)
        backward = np.array([layer.backward for layer in layers], float)
        raw_tp = forward_tp + backward_tp + np.where(blocks & full, forward_tp, 0.0)
        if self.training.tensor_parallel_overlap:
            forward_tp = np.maximum(forward_tp - np.array([layer.matrix_forward for layer in layers], float), 0.0)
            backward_tp = np.maximum(backward_tp - np.array([layer.matrix_backward for layer in layers], float), 0.0)
        exposed_tp = forward_tp + backward_tp + np.where(blocks & full, forward_tp, 0.0)
        experts = self.expert_parallel_collective
        all_to_all = np.array([sum(experts.scalar(b / width) for b in layer.all_to_all_bytes) for layer in layers],
                              float)
        expert_parameters = (np.array([layer.expert_parameters for layer in layers], float)
                             / self.shard.expert_parallel_width)
        rerun = {"none": np.zeros(len(layers)), "full": forward,
                 "selective": np.array([layer.attention_core_forward for layer in layers], float)}[self.recompute]
        held, working = held_activations(layers, self.recompute, width, self.kernels)
        object.__setattr__(self, "_collectives", {})
        object.__setattr__(self, "_data_groups", {})
        object.__setattr__(self, "_layers", {
            "compute": forward + backward,
            "recompute": np.where(blocks, rerun, 0.0),
            "tensor_parallel": exposed_tp,
            "tensor_parallel_hidden": raw_tp - exposed_tp,
            "expert_parallel": 2 * all_to_all + np.where(blocks & full, all_to_all, 0.0),
            "forward": forward,
            "backward": backward + backward_tp + all_to_all,
            "parameters": np.array([layer.parameters - layer.expert_parameters for layer in layers], float)
            + expert_parameters,
            "expert_parameters": expert_parameters,
            "matrix_parameters": np.array([layer.matrix_parameters - layer.expert_parameters for layer in layers], float)
            + expert_parameters,
            "held": held,
            "working": working,
        })

    @property
    def width(self) -> int:
        return self.graph.width

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
        """(the data-parallel group, the group of replicas holding the same experts) at width d."""
        found = self._data_groups.get(degree)
        if found is None:
            groups = self.layout(1, degree).groups()
            found = self._data_groups[degree] = (groups["data"], groups["expert_data"])
        return found

    @cached_property
    def tensor_parallel_collective(self) -> Collective:
        return self.cluster.all_reduce(self.shard.groups()["tensor"])

    @cached_property
    def expert_parallel_collective(self) -> Collective:
        return self.cluster.all_to_all(self.shard.groups()["expert"])

    # Stages, vectorised: the DP costs every candidate stage with these.

    def partition_terms(self, chunks: tuple[tuple[int, ...], ...]) -> StageTerms:
        """`stage_terms` of chunks that split the layers (each position in one chunk), summed the same
        way (each chunk's values in position order, so the sums are the same to the last bit)."""
        n, count = self.graph.n, len(chunks)
        chunk_of = np.empty(n, dtype=np.int64)
        for index, chunk in enumerate(chunks):
            chunk_of[list(chunk)] = index
        values = self._layers

        def summed(name: str) -> np.ndarray:
            return np.bincount(chunk_of, weights=values[name], minlength=count)

        crossing = [(source, dest, size) for source, dest, size in self.graph.edges
                    if chunk_of[source] != chunk_of[dest]]
        ends = np.array([chunk_of[node] for source, dest, _ in crossing for node in (dest, source)], dtype=np.int64)
        sizes = np.array([size / self.width for _, _, size in crossing for _ in (0, 1)], float)
        working = np.zeros(count)
        np.maximum.at(working, chunk_of, values["working"])
        parameters = summed("parameters")
        for first, second, shared in self.graph.tied:
            if chunk_of[first] == chunk_of[second]:
                parameters[chunk_of[first]] -= shared
        return StageTerms(
            compute=summed("compute"),
            recompute=summed("recompute"),
            tensor_parallel=summed("tensor_parallel"),
            tensor_parallel_hidden=summed("tensor_parallel_hidden"),
            expert_parallel=summed("expert_parallel"),
            forward=summed("forward"),
            backward=summed("backward"),
            transfer_bytes=np.bincount(ends, weights=sizes, minlength=count) if len(ends) else np.zeros(count),
            transfer_messages=np.bincount(ends, minlength=count).astype(float),
            parameters=parameters,
            expert_parameters=summed("expert_parameters"),
            matrix_parameters=summed("matrix_parameters"),
            held_activations=summed("held"),
            working_activations=working,
        )

    def stage_terms(self, members: np.ndarray) -> StageTerms:
        """The terms of the stages given by `members[v, k]` (position v in stage k)."""
        values = self._layers
        transfer_bytes = np.zeros(members.shape[1])
        messages = np.zeros(members.shape[1])
        for source, dest, size in self.graph.edges:
            crossing = members[dest] != members[source]  # into one stage, out of the other
            transfer_bytes = transfer_bytes + np.where(crossing, size / self.width, 0.0)
            messages = messages + crossing
        parameters = stage_sum(members, values["parameters"])
        for first, second, shared in self.graph.tied:
            parameters = parameters - np.where(members[first] & members[second], shared, 0.0)
        return StageTerms(
            compute=stage_sum(members, values["compute"]),
            recompute=stage_sum(members, values["recompute"]),
            tensor_parallel=stage_sum(members, values["tensor_parallel"]),
            tensor_parallel_hidden=stage_sum(members, values["tensor_parallel_hidden"]),
            expert_parallel=stage_sum(members, values["expert_parallel"]),
            forward=stage_sum(members, values["forward"]),
            backward=stage_sum(members, values["backward"]),
            transfer_bytes=transfer_bytes,
            transfer_messages=messages,
            parameters=parameters,
            expert_parameters=stage_sum(members, values["expert_parameters"]),
            matrix_parameters=stage_sum(members, values["matrix_parameters"]),
            held_activations=stage_sum(members, values["held"]),
            working_activations=stage_max(members, values["working"]),
        )

    def pipeline_tier(self, stages: int, degree: int) -> int:
        """The tier of the slowest link between consecutive stages."""
        return self.cluster.tier_joining(self.layout(stages, degree).groups()["pipeline"])

    def pipeline_tier_depths(self, degree: int, most: int) -> list[tuple[int, int, int]]:
        """(tier, fewest stages, most stages): the depths whose slowest stage boundary is on each tier."""
        return self.cluster.size_ranges(self.layout(1, degree).groups()["pipeline"].stride, most)

    def transfer_time(self, terms: StageTerms, tier: int) -> np.ndarray:
        link = self.cluster.send(tier)
        return link.per_byte * terms.transfer_bytes + link.fixed * terms.transfer_messages

    def load(self, terms: StageTerms, tier: int) -> np.ndarray:
        """Time per micro-batch of each stage with its transfers on `tier`."""
        return self.busy(terms) + self.transfer_time(terms, tier)

    @staticmethod
    def busy(terms: StageTerms) -> np.ndarray:
        """Per micro-batch: compute, recomputation and the blocking collectives of each stage."""
        return ((terms.compute + terms.recompute) + terms.tensor_parallel) + terms.expert_parallel

    def activation_bytes(self, terms: StageTerms, micro_batches_in_flight) -> np.ndarray:
        return micro_batches_in_flight * terms.held_activations + terms.working_activations

    def memory_bytes(self, terms: StageTerms, micro_batches_in_flight, degree: int) -> np.ndarray:
        """Peak bytes per device of each stage holding this many micro-batches' activations."""
        return self.static_bytes(terms.parameters, degree, terms.expert_parameters,
                                 terms.matrix_parameters) + self.activation_bytes(terms, micro_batches_in_flight)

    def parameter_classes(self, parameters, degree: int, expert_parameters=0.0) -> list[tuple[Group, object]]:
        """(data-parallel group, parameters) of each class of parameters per device: the dense ones
        over the d replicas, the experts' over the d/e replicas holding the same experts; classes of
        the same group as one (their counts are whole numbers: the sum is exact)."""
        data, expert_data = self.data_groups(degree)
        merged: dict[Group, object] = {}
        for group, count in ((data, parameters - expert_parameters), (expert_data, expert_parameters)):
            merged[group] = merged[group] + count if group in merged else count
        return list(merged.items())

    def optimizer_state_bytes(self, parameters, degree: int, expert_parameters=0.0):
        """Optimizer state of `parameters` per device, of which `expert_parameters` are experts' (each
        class sharded over its own replicas)."""
        state, total = self.training.model_state, 0.0
        for group, count in self.parameter_classes(parameters, degree, expert_parameters):
            total = total + count * state.optimizer_share(group.size)
        return total

    def weight_bytes(self, parameters, matrix_parameters=0.0):
        """16-bit weights, and in FP8 the 8-bit copies of those FP8 products read."""
        copies = FP8_WEIGHT_COPY_BYTES * matrix_parameters if self.kernels.fp8 else 0.0
        return parameters * self.training.model_state.weights + copies

    def static_bytes(self, parameters, degree: int, expert_parameters=0.0, matrix_parameters=0.0):
        """Weights, gradients and optimizer state of `parameters` per device (`expert_parameters` of
        them experts', `matrix_parameters` read by weight products), and the framework's reserve."""
        return (self.weight_bytes(parameters, matrix_parameters) + parameters * self.training.model_state.gradients
                + self.optimizer_state_bytes(parameters, degree, expert_parameters) + self.training.framework_reserve)

    def deepest_position(self, terms: StageTerms, degree: int, limit: int) -> np.ndarray:
        """Per stage, the largest q ≤ `limit` such that the stage fits in memory as the q-th from the
        end of a 1F1B pipeline (holding min(q, m) micro-batches); 0 if it never fits."""
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

    def sync_collectives(self, group: Group) -> tuple[Collective, Collective]:
        """(gradient collective, weight collective) of a data-parallel group: an all-reduce of the
        gradients, or with a sharded optimizer a reduce-scatter of them and an all-gather of the
        updated weights."""
        found = self._collectives.get(group)
        if found is None:
            if self.training.model_state.sharded:
                found = (self.cluster.reduce_scatter(group), self.cluster.all_gather(group))
            else:
                found = (self.cluster.all_reduce(group), Collective(0.0, 0.0))
            self._collectives[group] = found
        return found

    def sync_times(self, parameters, degree: int, expert_parameters=0.0):
        """(gradient reduction, weight all-gather) of stages holding `parameters` per device, not
        overlapped, each class of parameters over its own group."""
        state, reduction, gather = self.training.model_state, 0.0, 0.0
        for group, count in self.parameter_classes(parameters, degree, expert_parameters):
            gradients, weights = self.sync_collectives(group)
            reduction = reduction + gradients.time(count * state.gradients)
            gather = gather + weights.time(count * state.weights)
        return reduction, gather

    def sync_time(self, parameters, degree: int, expert_parameters=0.0):
        """Data-parallel sync of stages holding `parameters` per device, not overlapped."""
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
        the next step's first forward pass (`overlap_param_gather`), each never below zero."""
        reduction, gather = self.sync_times(terms.parameters, degree, terms.expert_parameters)
        if self.training.overlap_grad_reduce:
            reduction = np.maximum(reduction - terms.backward, 0.0)
        if self.training.overlap_param_gather:
            gather = np.maximum(gather - terms.forward, 0.0)
        return reduction + gather, self.optimizer_time(terms.parameters, degree, terms.expert_parameters)

    @property
    def sync_overlaps(self) -> bool:
        return self.training.overlap_grad_reduce or self.training.overlap_param_gather

    def tail_keys_are_parameters(self) -> bool:
        """Whether every stage's tail grows with its parameters alone (so a cap on parameters is a
        cap on the tail); not so when the sync overlaps the backward pass, nor when the experts sync
        over other replicas than the rest."""
        data, expert_data = self.data_groups(self.shard.expert_parallel_width)
        return not self.sync_overlaps and expert_data == data

    @staticmethod
    def pipeline_time(micro_batches, stages, virtual_stages, load):
        return (micro_batches + (stages - 1) / virtual_stages) * load

    # A bound for the architecture search: no placement of any mode is faster.

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
        compute = np.asarray(compute, float)
        # overlapped tensor-parallel collectives may hide entirely behind a chip's weight products
        tensor = 0.0 if self.training.tensor_parallel_overlap else self._layers["tensor_parallel"]
        collectives = tensor + self._layers["expert_parallel"]
        per_layer = compute + collectives.reshape((-1,) + (1,) * (compute.ndim - 1))
        total, heaviest = per_layer.sum(axis=0), per_layer.max(axis=0)
        parameters, experts = self._layers["parameters"], self._layers["expert_parameters"]
        blocks = sum(layer.is_block for layer in self.graph.layers)
        best = np.full(total.shape, np.inf)
        for degree in degrees:
            stages = np.arange(1, min(self.graph.n, self.cluster.num_devices // (self.width * degree)) + 1)
            if not len(stages):
                continue
            interleave = np.maximum(1, blocks // stages) if self.graph.is_chain() else np.ones(len(stages))
            factor = (self.micro_batches // degree + (stages - 1) / interleave).reshape((-1,) + (1,) * total.ndim)
            load = np.maximum(heaviest, total / stages.reshape(factor.shape))
            tail = float((self.optimizer_time(parameters, degree, experts) if self.sync_overlaps
                          else self.tail_time(parameters, degree, experts)).max())
            best = np.minimum(best, (factor * load).min(axis=0) + tail)
        return best

    # One layout (chunks on devices) for many data-parallel widths at once, and one placement.

    @staticmethod
    def device_terms(chunk_terms: StageTerms, stages: int) -> StageTerms:
        """Each pipeline device's terms: its chunks' (chunk j on device j mod p) summed in chunk
        order; its working memory is the largest of its chunks'."""
        fields = {name: per_device(getattr(chunk_terms, name), stages) for name in StageTerms.__dataclass_fields__}
        fields["working_activations"] = chunk_terms.working_activations.reshape(-1, stages).max(axis=0)
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
        loads = self.busy(terms) + transfer  # [layout, device]
        flight = np.array([in_flight(stages, virtual_stages, int(m)) for m in micro_batches])
        memory = np.array([self.memory_bytes(terms, flight[i], int(d)) for i, d in enumerate(degrees)])
        tails = [self.tail(terms, int(d)) for d in degrees]
        sync, optimizer = np.array([t[0] for t in tails]), np.array([t[1] for t in tails])
        time = self.pipeline_time(micro_batches, stages, virtual_stages, loads.max(axis=1))
        time = time + (sync + optimizer).max(axis=1)
        rules = self.fit_rules()
        fits = (memory <= self.device.memory_capacity).all(axis=1)
        fits &= np.array([rules.widths_problem(layout) is None for layout in layouts])
        return {"time": time, "fits": fits, "loads": loads, "transfer": transfer, "transfer_hidden": hidden,
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
            "expert_parallel": micro_batches * float(terms.expert_parallel[slowest]),
            "bubble": (stages - 1) / v * float(loads[slowest]),
            "pipeline_transfer": micro_batches * float(transfer[slowest]),
            "data_parallel_sync": float(scored["sync"][0][last_out]),
            "optimizer": float(scored["optimizer"][0][last_out]),
        }
        hidden = {
            "tensor_parallel": micro_batches * float(terms.tensor_parallel_hidden[slowest]),
            "pipeline_transfer": micro_batches * float(scored["transfer_hidden"][0][slowest]),
            "data_parallel_sync": float(self.sync_time(terms.parameters[last_out], degree,
                                                       terms.expert_parameters[last_out])
                                        - scored["sync"][0][last_out]),
        }
        state = self.training.model_state
        activations = self.activation_bytes(terms, scored["in_flight"][0])
        memory = []
        for index in range(stages):
            parameters = float(terms.parameters[index])
            optimizer_state = self.optimizer_state_bytes(parameters, degree, float(terms.expert_parameters[index]))
            weights = float(self.weight_bytes(parameters, float(terms.matrix_parameters[index])))
            memory.append({"weights": weights, "gradients": parameters * state.gradients,
                           "optimizer_state": float(optimizer_state),
                           "activations": float(activations[index]),
                           "framework_reserve": self.training.framework_reserve,
                           "total": float(scored["memory"][0][index])})
        return StepResult(float(scored["time"][0]), breakdown, tuple(float(p) for p in terms.parameters),
                          tuple(memory), None if scored["fits"][0] else self.why_not(memory, layout), hidden)

    def why_not(self, memory: list[dict[str, float]], layout: Layout) -> str:
        """Why a placement with this memory per device cannot run."""
        problem = self.fit_rules().widths_problem(layout)
        if problem is not None:
            return problem
        i = max(range(len(memory)), key=lambda index: memory[index]["total"])
        return (f"memory: stage {i} needs {memory[i]['total'] / 2**30:.4g} GiB per device, "
                f"{self.device.memory_capacity / 2**30:.4g} GiB available")
