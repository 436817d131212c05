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
* Activation offload (`TrainingOptions.activation_offload`): the blocks' kept activations leave HBM
  for host memory, two blocks' worth staying (`offload.buffered_bytes`); their copies out and back
  are exposed beyond the forward and the backward compute of each micro-batch
  (`offload.offload_seconds`, the breakdown's `activation_offload`).
Simplifications: recomputation applies to every stage (as Megatron does); the embedding-gradient
all-reduce between the first and last stage and the scatter/gather's all-gather are not charged;
interleaved chunks are charged their average activations (`memory.in_flight`).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from graph_extract.kernels import KernelOptions
from phaze_hardware import Network
from solver.layout import FitRules, Layout
from solver.training_step.data_parallel import DataParallel
from solver.training_step.layer_terms import Shard, layer_terms
from solver.training_step.memory import Recompute, in_flight, recompute_mode
from solver.training_step.offload import buffered_bytes, stage_offload_seconds
from solver.training_step.options import TrainingOptions
from solver.training_step.records import (BUSY_TERMS, SUMMED_TERMS, Device, Placement, StageTerms, StepGraph,
                                          StepResult)
from solver.training_step.stages import chunk_members, device_terms, per_device, stage_terms


#: Tail floors kept for this many (data-parallel concern, layer parameters): a search's widths, modes
#: and HBM sizes.
SHARED_TAIL_FLOORS = 256


@functools.lru_cache(maxsize=SHARED_TAIL_FLOORS)
def _shared_tail_floors(key: tuple) -> dict[int, float]:
    """A memo of tail floors per width d, the same one for equal keys while kept."""
    return {}


@dataclass(frozen=True)
class TrainingStep:
    """The step model of one shard shape (`shard`: the widths t, e, c that split each layer; the
    graph is width t's) in one recomputation mode, on a cluster: it prices every pipeline and
    data-parallel width of that shard (the placement search costs many at once, vectorised).

    `micro_batches` is the number per batch (global batch / micro-batch size). The per-layer terms
    (`layer_values`, `solver.training_step.layer_terms`) are computed once; the data-parallel
    concern is `data_parallel`.
    """

    graph: StepGraph
    cluster: Network
    training: TrainingOptions
    kernels: KernelOptions
    device: Device
    micro_batches: int
    recompute: str
    shard: Layout
    layers_split: Shard = field(init=False, repr=False, compare=False)  # what the per-layer terms read
    layer_values: dict = field(init=False, repr=False, compare=False)
    _pipeline_tiers: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if recompute_mode(self.recompute) != self.recompute:
            raise ValueError(f"recompute: {self.recompute!r} is not a recomputation mode's one name "
                             f"({recompute_mode(self.recompute)!r})")
        if self.shard != self.shard.shard or self.shard.tensor_parallel_width != self.graph.width:
            raise ValueError(f"shard: {self.shard.text()} is not the shard of a width-{self.graph.width} graph "
                             "(t its width, p = d = v = 1)")
        object.__setattr__(self, "layers_split", Shard(graph=self.graph, cluster=self.cluster, training=self.training,
                                                      kernels=self.kernels, recompute=Recompute.of(self.recompute),
                                                      shard=self.shard))
        object.__setattr__(self, "layer_values", layer_terms(self.layers_split))
        object.__setattr__(self, "_pipeline_tiers", {})

    @cached_property
    def data_parallel(self) -> DataParallel:
        return DataParallel(cluster=self.cluster, training=self.training, kernels=self.kernels, device=self.device,
                            shard=self.shard, recompute=Recompute.of(self.recompute))

    @property
    def token_share(self) -> float:
        return self.layers_split.token_share

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

    def sharding_problem(self, degree: int) -> str | None:
        return self.data_parallel.sharding_problem(degree)

    # Stages, vectorised: the DP costs every candidate stage with these.

    def partition_terms(self, chunks: tuple[tuple[int, ...], ...]) -> StageTerms:
        """`stage_terms` of chunks that split the layers (each position in one chunk)."""
        return self.stage_terms(chunk_members(self.graph.n, chunks))

    @cached_property
    def terms_key(self) -> tuple:
        """What `stage_terms` depends on: steps of equal keys (the data-parallel shardings of one shard
        and mode) have equal terms."""
        return self.graph, self.token_share, tuple(values.tobytes() for values in self.layer_values.values())

    @cached_property
    def _summed(self) -> np.ndarray:
        return np.array([self.layer_values[name] for name in SUMMED_TERMS.values()], float)

    @cached_property
    def _edge_bytes(self) -> np.ndarray:
        return np.array([size * self.token_share / self.width for _, _, size in self.graph.edges], float)

    def stage_terms(self, members: np.ndarray) -> StageTerms:
        """The terms of the stages given by `members[v, k]` (position v in stage k)."""
        return stage_terms(self.graph, self.layer_values, self._summed, self._edge_bytes, members)

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
        load = self.busy(terms) + self.transfer_time(terms, tier)
        return load + stage_offload_seconds(terms, self.training, self.device)[0]

    @staticmethod
    def busy(terms: StageTerms) -> np.ndarray:
        """Per micro-batch: compute, recomputation and the blocking collectives of each stage."""
        return functools.reduce(operator.add, (getattr(terms, name) for name in BUSY_TERMS))

    def activation_bytes(self, terms: StageTerms, micro_batches_in_flight) -> np.ndarray:
        """Activation bytes per device: those kept per micro-batch in flight, what a recomputed layer's
        working memory adds beyond the later layers' activations freed before it (`stages.recompute_peak`),
        and with `activation_offload` the blocks in transfer (`offload.buffered_bytes`)."""
        held = micro_batches_in_flight * terms.held_activations + terms.working_activations
        return held + buffered_bytes(terms.largest_offloaded) if self.training.offloads_activations else held

    def memory_bytes(self, terms: StageTerms, micro_batches_in_flight, degree: int) -> np.ndarray:
        """Peak bytes per device of each stage holding this many micro-batches' activations."""
        return self.data_parallel.static_bytes(terms, degree) + self.activation_bytes(terms, micro_batches_in_flight)

    def memory_floor(self, terms: StageTerms, micro_batches_in_flight) -> np.ndarray:
        """A lower bound on `memory_bytes` of each stage at every data-parallel width: the kinds of
        model state the sharding does not split (the same at any d), what `full` gathers, the
        activations and the reserve."""
        state = self.training.model_state
        whole = sum(getattr(state, kind) for kind in ("weights", "gradients", "optimizer_state")
                    if not state.splits(kind))
        floor = (whole * terms.parameters + self.data_parallel.gathered_weight_bytes(terms)
                 + self.activation_bytes(terms, micro_batches_in_flight) + self.training.framework_reserve)
        return floor * (1 - self.FLOOR_SLACK)

    @staticmethod
    def pipeline_time(micro_batches, stages, virtual_stages, load):
        return (micro_batches + (stages - 1) / virtual_stages) * load

    # Bounds: no placement is faster (the architecture search's, over chips; the placement search's).

    #: Relative slack of `time_floor`: its sums run in another order than a stage's (a last-bit difference).
    FLOOR_SLACK = 1e-9

    @cached_property
    def _tail_floors(self) -> dict[int, float]:
        """`tail_floor` per width d, shared by every step of the same data-parallel concern and layer
        parameters (the chips of a search: they differ only in the layers' costs)."""
        values = self.layer_values
        return _shared_tail_floors((self.data_parallel, values["parameters"].tobytes(),
                                    values["expert_parameters"].tobytes(), values["matrix_parameters"].tobytes()))

    def tail_floor(self, degrees) -> np.ndarray:
        """No stage's tail at width d is shorter (for each of `degrees`, an array): that of the layer
        with the most parameters (a stage holding it holds at least its parameters; only its
        optimizer step when the sync may hide)."""
        degrees, known = np.asarray(degrees), self._tail_floors
        parameters, experts = self.layer_values["parameters"], self.layer_values["expert_parameters"]
        matrix = self.layer_values["matrix_parameters"]
        for degree in set(degrees.flat) - known.keys():
            if self.data_parallel.sync_overlaps:
                tail = self.data_parallel.optimizer_time(parameters, int(degree), experts)
            else:
                tail = self.data_parallel.tail_time(parameters, int(degree), experts, matrix)
            known[degree] = float(np.max(tail, initial=0.0))
        return np.array([known[degree] for degree in degrees.flat]).reshape(degrees.shape)

    @cached_property
    def layer_busy(self) -> np.ndarray:
        """`busy` of each layer alone (the same terms, summed in the same order)."""
        return functools.reduce(operator.add, (self.layer_values[name] for name in BUSY_TERMS))

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

    # One layout (chunks on devices) for many data-parallel widths at once, and one placement.

    device_terms = staticmethod(device_terms)

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
        sharded = [self.data_parallel.sharded_traffic(terms, int(d)) for d in degrees]
        sharded_exposed, sharded_hidden = np.array([t[0] for t in sharded]), np.array([t[1] for t in sharded])
        loads = self.busy(terms) + transfer + sharded_exposed  # [layout, device]
        offload_exposed, offload_hidden = stage_offload_seconds(terms, self.training, self.device)
        loads = loads + offload_exposed
        flight = np.array([in_flight(stages, virtual_stages, int(m)) for m in micro_batches])
        memory = np.array([self.memory_bytes(terms, flight[i], int(d)) for i, d in enumerate(degrees)])
        tails = [self.data_parallel.tail(terms, int(d)) for d in degrees]
        sync, optimizer = np.array([t[0] for t in tails]), np.array([t[1] for t in tails])
        time = self.pipeline_time(micro_batches, stages, virtual_stages, loads.max(axis=1))
        time = time + (sync + optimizer).max(axis=1)
        rules = self.fit_rules()
        fits = (memory <= self.device.memory_capacity).all(axis=1)
        fits &= np.array([rules.widths_problem(layout) is None and self.sharding_problem(layout.data_parallel_width)
                          is None for layout in layouts])
        return {"time": time, "fits": fits, "loads": loads, "transfer": transfer, "transfer_hidden": hidden,
                "sharded": sharded_exposed, "sharded_hidden": sharded_hidden,
                "offload": offload_exposed, "offload_hidden": offload_hidden,
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
            "compute": micro_batches * float(terms.compute[slowest] - terms.launch[slowest]),
            "kernel_launch": micro_batches * float(terms.launch[slowest]),
            "recompute": micro_batches * float(terms.recompute[slowest]),
            "tensor_parallel": micro_batches * float(terms.tensor_parallel[slowest]),
            "context_parallel": micro_batches * float(terms.context_parallel[slowest]),
            "expert_parallel": micro_batches * float(terms.expert_parallel[slowest]),
            "sharded_data_parallel": micro_batches * float(scored["sharded"][0][slowest]),
            "activation_offload": micro_batches * float(scored["offload"][slowest]),
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
            **({"activation_offload": micro_batches * float(scored["offload_hidden"][slowest])}
               if self.training.offloads_activations else {}),
            "data_parallel_sync": float(self.data_parallel.sync_time(terms.parameters[last_out], degree,
                                                                     terms.expert_parameters[last_out],
                                                                     terms.matrix_parameters[last_out])
                                        - scored["sync"][0][last_out]),
        }
        activations = self.activation_bytes(terms, scored["in_flight"][0])
        weights = self.data_parallel.weight_bytes(terms, degree)
        gradients = self.data_parallel.state_bytes("gradients", terms.parameters, degree, terms.expert_parameters)
        optimizer_state = self.data_parallel.optimizer_state_bytes(terms.parameters, degree, terms.expert_parameters)
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
