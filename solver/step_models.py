"""Two models of a training step behind one interface (`StepModel`): today's (`solver.training_step`:
a cluster of link tiers, Megatron's layout, mixed-precision memory, interleaving) and the original
program's (`solver.training_step.original`: one flat link, its DP, kept bit for bit as
`system=original`). Whatever asks for a placement, a baseline or a bound asks the question's model;
no caller tells them apart.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from phaze_common.checks import InputError, choice
from graph_extract.opgraph import TRAINING_DTYPE_BYTES
from solver.layout import Layout, allowed_virtual_stages, data_parallel_widths
from solver.placement import PlacementEdge, PlacementGraph, PlacementLayer, PlacementResult, PlacementSettings
from solver.placement.best import best_placement, fixed_megatron
from solver.placement.inputs import FixedStrategy
from solver.placement.original_baseline import baseline_stages
from solver.placement.original_dp import place_original
from solver.question import Axes, Question
from solver.training_step import RECOMPUTE_MODES, Device, StepGraph, TrainingStep, original
from solver.training_step.over_chips import time_lower_bound


class StepModel(Protocol):
    """What a step model answers (module docstring). `axes` name one micro-batch size and one HBM
    size; `graphs` are the layer graphs with their costs, one per tensor-parallel width."""

    name: str
    #: the recomputation modes it prices, and what to say of them beside the field's name ("" nothing);
    #: whether it also prices Megatron-Core's recompute modules (`solver.training_step.recompute_mode`)
    recompute_modes: tuple[str, ...]
    recompute_note: str
    prices_recompute_modules: bool
    #: whether it prices a given layout (`phaze predict`)
    prices_layouts: bool

    def virtual_stages(self, blocks: int) -> tuple[int, ...]:
        """The v values it can interleave a model of `blocks` blocks with."""

    def default_virtual_stages(self) -> tuple[int, ...] | None:
        """The v values searched when none are given (None: every v that fits)."""

    def check(self, question: Question) -> None:
        """InputError for what in the question it cannot price."""

    def check_axes(self, question: Question, axes: Axes) -> None:
        """InputError for what in the swept axes it cannot price."""

    def place(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float,
              upper_bound: float = math.inf) -> PlacementResult:
        """The fastest placement in the axes' one recomputation mode (only one faster than
        `upper_bound` [s]; none: an infeasible result)."""

    def fixed(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float
              ) -> tuple[PlacementResult | None, str | None]:
        """The question's baseline layout in the axes' one recomputation mode: (result, None), or
        (None, why it cannot run)."""

    def lower_bound(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], work: np.ndarray,
                    width: int, hbm_bandwidth: float) -> np.ndarray:
        """A lower bound on the time per batch of every placement at tensor-parallel width `width` in
        any mode, for layers of forward + backward compute at least `work` [layer x candidate]."""


class TrainingStepModel:
    """Today's model: `solver.training_step.TrainingStep`, the placement DP and Megatron's layouts."""

    name = "training_step"
    recompute_modes = RECOMPUTE_MODES
    recompute_note = ""
    prices_recompute_modules = True
    prices_layouts = True

    def virtual_stages(self, blocks: int) -> tuple[int, ...]:
        return allowed_virtual_stages(blocks)

    def default_virtual_stages(self) -> tuple[int, ...] | None:
        return None

    def check(self, question: Question) -> None:
        return None

    def check_axes(self, question: Question, axes: Axes) -> None:
        return None

    @staticmethod
    def step(question: Question, axes: Axes, graph: StepGraph, hbm_bandwidth: float, shard: Layout,
             sharding: str | None = None) -> TrainingStep:
        """The step model of one shard at the axes' micro-batch size, HBM size and recomputation mode,
        with the data-parallel sharding `sharding` (None: the question's)."""
        (recompute,) = axes.recompute
        training = question.training if sharding is None else question.training.with_sharding(sharding)
        return TrainingStep(graph, question.cluster, training, question.kernels,
                            Device(axes.memory_capacity, hbm_bandwidth, question.host_link_bandwidth),
                            question.micro_batches(axes.micro_batch_size), recompute, shard)

    def steps(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float
              ) -> list[TrainingStep]:
        """The step models of every data-parallel sharding and shard of the axes (`Axes.shards` order)
        whose width has a graph."""
        return [self.step(question, axes, graphs[shard.tensor_parallel_width], hbm_bandwidth, shard, sharding)
                for sharding in axes.shardings(question) for shard in axes.shards()
                if shard.tensor_parallel_width in graphs]

    def place(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float,
              upper_bound: float = math.inf) -> PlacementResult:
        return best_placement(self.steps(question, axes, graphs, hbm_bandwidth), axes.virtual_stages,
                              upper_bound=upper_bound)

    def fixed(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float
              ) -> tuple[PlacementResult | None, str | None]:
        """The baseline as given (its e, τ and v, its blocks split as `question.baseline_split`); a
        mixture's baseline that gives no e takes the widest of the axes' that divides its d."""
        layout = question.baseline
        if layout.expert_parallel_width == 1:
            degree = layout.data_parallel_width
            layout = layout.replace(expert_parallel_width=max(
                (e for e in axes.expert_parallel_widths if degree % e == 0), default=1))
        step = self.step(question, axes, graphs[layout.tensor_parallel_width], hbm_bandwidth, layout.shard)
        return fixed_megatron(step, layout, question.baseline_split)

    def lower_bound(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], work: np.ndarray,
                    width: int, hbm_bandwidth: float) -> np.ndarray:
        time = np.full(work.shape[1:], np.inf)
        for sharding in axes.shardings(question):
            for shard in (shard for shard in axes.shards() if shard.tensor_parallel_width == width):
                step = self.step(question, axes.at(recompute="none"), graphs[width], hbm_bandwidth, shard, sharding)
                time = np.minimum(time, time_lower_bound(step, work, data_parallel_widths(step.fit_rules(), shard)))
        return time


class OriginalStepModel:
    """The original program's model: its DP on one flat link, its fixed baseline, its bound."""

    name = "original"
    recompute_modes = ("none", "full")
    recompute_note = "system=original: the original's off or on"
    prices_recompute_modules = False
    prices_layouts = False

    def virtual_stages(self, blocks: int) -> tuple[int, ...]:
        return (1,)

    def default_virtual_stages(self) -> tuple[int, ...] | None:
        return (1,)

    def check(self, question: Question) -> None:
        """One flat link; none of the options it has no cost for."""
        if len(question.cluster.tiers) != 1:
            raise InputError("system.tiers: the original's model has one flat link; give one tier")
        for key, value, allowed in (("sequence_parallel", question.kernels.sequence_parallel, False),
                                    ("flash_attention", question.kernels.flash_attention, False),
                                    ("cuda_graphs", question.kernels.cuda_graphs, False),
                                    ("data_parallel_sharding", question.training.data_parallel_sharding, "none"),
                                    ("overlap_grad_reduce", question.training.overlap_grad_reduce, False),
                                    ("grad_reduce_in_bf16", question.training.grad_reduce_in_bf16, False),
                                    ("overlap_param_gather", question.training.overlap_param_gather, False),
                                    ("tensor_parallel_overlap", question.training.tensor_parallel_overlap, False),
                                    ("master_weight_remainders", question.training.master_weight_remainders, False),
                                    ("framework_reserve_gb", question.training.framework_reserve, 0.0),
                                    ("expert_dispatch", question.training.expert_dispatch, "all_to_all"),
                                    ("overlap_expert_dispatch", question.training.overlap_expert_dispatch, False),
                                    ("fp8_recipe", question.kernels.fp8_recipe, "delayed"),
                                    ("fp8_parameters", question.training.fp8_parameters, False),
                                    ("activation_offload", question.training.activation_offload, "none"),
                                    ("weight_dtype", question.training.weight_dtype, "mixed")):
            if value != allowed:
                shown = str(allowed).lower() if isinstance(allowed, bool) else allowed
                raise InputError(f"{key}: system=original has no cost for it; allowed: {shown}")
        if question.kernels.fp8:
            raise InputError("precision: system=original prices 16-bit training only; allowed: bf16, fp16")

    def check_axes(self, question: Question, axes: Axes) -> None:
        """No context parallelism and one data-parallel sharding (none): it has no cost for either."""
        if axes.context_parallel_widths != (1,):
            raise InputError("context_parallel_width: system=original has no cost for it; allowed: 1")
        if len(axes.shardings(question)) > 1:
            raise InputError("data_parallel_sharding: system=original has no cost for it; allowed: none")

    @staticmethod
    def graphs(question: Question, graphs: dict[int, StepGraph]) -> dict[int, PlacementGraph]:
        """The original program's inputs: latencies with the collectives on the flat link inside."""
        result = {}
        for width, graph in graphs.items():
            link = question.cluster.all_reduce(Layout(width).groups()["tensor"])
            layers = []
            for layer in graph.layers:
                forward = sum(link.scalar(size) for size in layer.forward_collective_bytes)
                backward = sum(link.scalar(size) for size in layer.backward_collective_bytes)
                layers.append(PlacementLayer(
                    id=layer.id,
                    parameter_bytes=layer.parameters * TRAINING_DTYPE_BYTES,
                    activation_bytes=layer.activation_bytes,
                    forward_latency=layer.forward + forward,
                    backward_latency=layer.backward + backward,
                    tensor_parallel=width > 1,
                    collective_latency=forward + backward,
                ))
            edges = tuple(PlacementEdge(graph.ids[s], graph.ids[d], size) for s, d, size in graph.edges)
            result[width] = PlacementGraph(tuple(layers), edges)
        return result

    @staticmethod
    def settings(question: Question, axes: Axes) -> PlacementSettings:
        """The original's settings at the axes' micro-batch size, HBM size and recomputation mode."""
        (recompute,) = axes.recompute
        baseline = question.baseline
        return PlacementSettings(
            devices=question.cluster.num_devices,
            memory_per_device=axes.memory_capacity,
            bandwidth=question.cluster.tiers[0].effective_bandwidth,
            micro_batches_per_batch=question.micro_batches(axes.micro_batch_size),
            activation_recomputation=choice("recompute", recompute, OriginalStepModel.recompute_modes) == "full",
            optimizer={"sgd": "SGD", "adam": "Adam"}[question.training.optimizer],
            fixed_baseline=None if baseline is None else FixedStrategy(
                baseline.pipeline_parallel_width, baseline.tensor_parallel_width, baseline.data_parallel_width,
                question.model.num_layers),
        )

    def place(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float,
              upper_bound: float = math.inf) -> PlacementResult:
        return place_original(self.graphs(question, graphs), self.settings(question, axes))

    def fixed(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], hbm_bandwidth: float
              ) -> tuple[PlacementResult | None, str | None]:
        """The baseline laid out as the original does: ceil(blocks / p) blocks per stage."""
        baseline, layers = question.baseline, graphs[question.baseline.tensor_parallel_width].n
        blocks, stages = question.model.num_layers, baseline.pipeline_parallel_width
        layout = baseline_stages(layers, self.settings(question, axes).fixed_baseline)
        empty = next((stage for stage, positions in enumerate(layout) if not positions), None)
        if empty is not None:
            return None, (f"{stages} pipeline stages of ceil({blocks} / {stages}) = {-(-blocks // stages)} of the "
                          f"{blocks} blocks of {question.model.name} (the original's layout): stage {empty} would "
                          "be empty")
        result = self.place(question, axes, graphs, hbm_bandwidth)
        if result.fixed_baseline_time is None:
            return None, result.fixed_baseline_infeasible_reason
        return PlacementResult((), baseline, result.fixed_baseline_time, axes.recompute[0]), None

    def lower_bound(self, question: Question, axes: Axes, graphs: dict[int, StepGraph], work: np.ndarray,
                    width: int, hbm_bandwidth: float) -> np.ndarray:
        """Its layer latencies carry the collectives on the flat link."""
        ((_, placement_graph),) = self.graphs(question, {width: graphs[width]}).items()
        collectives = np.array([layer.collective_latency for layer in placement_graph.layers])[:, None]
        latency = work + collectives
        devices = np.array([width if layer.tensor_parallel else 1 for layer in placement_graph.layers])[:, None]
        sources = {layer.id for layer in placement_graph.layers} - {edge.dest for edge in placement_graph.edges}
        source_parameters = min(layer.parameter_bytes for layer in placement_graph.layers if layer.id in sources)
        step = self.settings(question, axes.at(recompute="none"))
        return original.time_lower_bound(latency.sum(axis=0), latency.max(axis=0), (latency * devices).sum(axis=0),
                                         source_parameters, step)


#: The step models by name (`system.step_model`).
STEP_MODELS: dict[str, StepModel] = {model.name: model for model in (TrainingStepModel(), OriginalStepModel())}


def step_model(question: Question) -> StepModel:
    """The model that prices the question."""
    return STEP_MODELS[question.step_model]
