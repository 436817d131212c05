"""The records of the training-step model: a layer and a graph as a device runs them, the device,
the per-stage terms the placement search sums, a placement and its priced result."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from graph_extract.layergraph import RecomputedModule
from solver.layout import Layout

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
                "regathers": "regathers", "regathered": "regathered", "launch": "launch",
                "offloaded_activations": "offloaded"}
#: The terms of `StepResult.breakdown`, in the order they happen.
BREAKDOWN_KEYS = ("compute", "kernel_launch", "recompute", "tensor_parallel", "context_parallel", "expert_parallel",
                  "sharded_data_parallel", "activation_offload", "bubble", "pipeline_transfer", "data_parallel_sync",
                  "optimizer")


@dataclass(frozen=True, kw_only=True)
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
    fused_replicated_activation_bytes: float | None = None  # its replicated part where it differs (None: the same)
    matrix_input_activation_bytes: float = 0.0  # kept only by weight products (FP8: one byte an element)
    replicated_matrix_input_activation_bytes: float = 0.0
    matrix_parameters: float = 0.0  # of `parameters`, those weight products read (FP8: an 8-bit copy)
    matrix_forward: float = 0.0  # of `forward`, the weight products' time (what overlapped collectives hide behind)
    matrix_backward: float = 0.0  # of `backward`, the weight products' time
    attention_forward: float = 0.0  # of `forward`, the attention core's time (what ring attention hides behind)
    attention_backward: float = 0.0  # of `backward`, the attention core's time
    launch_forward: float = 0.0  # of `forward`, what the kernels' launch floor adds (`estimator.roofline`)
    launch_backward: float = 0.0  # of `backward`, likewise
    # the host's seconds to issue a pass's kernels but the experts', and every expert's GEMMs and casts
    # (all of the graph's: a device holding E/e of them issues 1/e; `estimator.roofline.issue_seconds`)
    issue_forward: float = 0.0
    issue_backward: float = 0.0
    expert_issue_forward: float = 0.0
    expert_issue_backward: float = 0.0
    key_value_bytes: float = 0.0  # the keys and values the attention core reads (what ring attention passes on)
    # the weight products' outputs a block keeps besides its input with `product_outputs`, and their
    # replicated part (`graph_extract.Layer`)
    product_output_bytes: float = 0.0
    replicated_product_output_bytes: float = 0.0
    # (s, forward, backward, matrix_forward, matrix_backward, launch_forward, launch_backward) with a
    # device holding 1/s of a width-t rank's experts (s = e·τ/t, `Layout.expert_split`), where they
    # differ from s = 1 (a GPU's roofline: 1/s of the expert weights read a micro-batch)
    expert_parallel_times: tuple[tuple[float, ...], ...] = ()
    expert_forward_collective_bytes: tuple[float, ...] = ()  # the routed experts' own all-reduces (τ ranks)
    expert_backward_collective_bytes: tuple[float, ...] = ()
    # its recompute modules but the attention core (what recomputing each drops and re-runs), and
    # (module, forward seconds) of each at e = 1 (a mixture's experts at this shard's split differ by the
    # layer's own difference)
    recompute_modules: tuple[RecomputedModule, ...] = ()
    module_forward: tuple[tuple[str, float], ...] = ()
    parameter_tensors: tuple[int, ...] = ()  # elements of each weight tensor it reads (`graph_extract.Layer`)
    dispatched_activation_bytes: float = 0.0  # of the replicated part, the routed tokens the experts keep
    combined_activation_bytes: float = 0.0  # what the combine keeps of the experts' outputs (`graph_extract.Layer`)


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
    """The accelerator as the step sees it: HBM capacity [bytes] and bandwidth [bytes/s], and the
    bandwidth of its link to host memory [bytes/s per direction] (None: not known; only activation
    offload reads it)."""

    memory_capacity: float
    hbm_bandwidth: float
    host_link_bandwidth: float | None = None


@dataclass(frozen=True, kw_only=True)
class StageTerms:
    """Per-micro-batch costs of several stages (arrays over stages) on one device of each."""

    compute: np.ndarray  # forward + backward [s]
    launch: np.ndarray  # of `compute`, what the kernels' launch floor adds
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
    offloaded_activations: np.ndarray  # bytes per micro-batch copied to host memory and back (`activation_offload`)
    working_activations: np.ndarray  # bytes a recomputed layer adds at its peak (`stages.recompute_peak`)
    largest_parameters: np.ndarray  # the parameters of the stage's largest layer (what `full` sharding gathers at once)
    largest_offloaded: np.ndarray  # the offloaded bytes of the stage's largest offloaded block (one micro-batch's)
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
