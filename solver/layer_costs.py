"""The cost of every layer of a model on one chip, per micro-batch: what the step model prices.

On a template chip, per tensor-parallel width, the representative of each repeat group is scheduled
forward and backward on the chip's cores (and its attention core forward, what selective
recomputation re-runs); every layer of the group gets that cost. On a GPU the roofline gives them
(`estimator.roofline`). Collectives take no core time here: the training-step model charges them on
the cluster. `step_graphs` joins the costs with the layer graphs' facts for the step model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from estimator import EstimateTable, FusedLayer, layer_workload
from estimator.roofline import layer_times
from estimator.work import expert_split_graph
from graph_extract import KernelOptions
from graph_extract.regions import block_weight_products
from graph_extract.opgraph import TRAINING_DTYPE_BYTES
from phaze_hardware import AcceleratorConfig, KnownChip
from solver.schedule import ScheduleProblem, ScheduleResult, critical_path_and_work
from solver.schedule.cache import SCHEDULE_DIGITS
from solver.training_step.memory import Recompute
from solver.training_step.records import StepGraph, StepLayer

DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """One layer of one shard on one accelerator, per micro-batch [s, J].

    `attention_core_forward` is the forward time of its attention core (0 without one). Busy
    core-seconds (summed over forward and backward) give the utilisation over many layers. On a
    template chip a recompute module's forward (`module_forward`) is its operators' latencies split
    over all the cores, as the overlaps' products are (`marked_seconds`), not a schedule of its own.
    """

    forward: float
    backward: float
    attention_core_forward: float
    energy: float
    tc_busy: float
    vc_busy: float
    tc_peak: float
    vc_peak: float
    gap: float  # the largest relative optimality gap of its schedules
    matrix_forward: float = 0.0  # of `forward`, the blocks' weight products (what overlapped collectives hide behind)
    matrix_backward: float = 0.0
    attention_forward: float = 0.0  # of `forward`, the attention cores (what ring attention's transfers hide behind)
    attention_backward: float = 0.0
    launch_forward: float = 0.0  # of `forward`, what the kernels' launch floor adds (a GPU's roofline)
    launch_backward: float = 0.0
    # the host's seconds to issue its kernels but the experts', and every expert's (a GPU's roofline,
    # eager: `estimator.roofline.issue_seconds`; 0 on a template chip)
    issue_forward: float = 0.0
    issue_backward: float = 0.0
    expert_issue_forward: float = 0.0
    expert_issue_backward: float = 0.0
    # (s, forward, backward, matrix_forward, matrix_backward, launch_forward, launch_backward) with a
    # device holding 1/s of a width-t rank's experts (`Layout.expert_split`; a GPU's roofline; empty:
    # the same at every split)
    expert_parallel_times: tuple[tuple[float, ...], ...] = ()
    # (module, forward seconds) of each recompute module of the layer but the attention core (what
    # recomputing it re-runs; `graph_extract.regions.recompute_modules`)
    module_forward: tuple[tuple[str, float], ...] = ()

    def recomputed(self, mode: str) -> float:
        """The forward seconds recomputation mode `mode` re-runs of this layer (if it is a block):
        `full` all of it, `product_outputs` all but its weight products, a set of recompute modules
        each module's (`selective`: the attention core)."""
        recompute = Recompute.of(mode)
        if recompute.full:
            return self.forward
        if recompute.product_outputs:
            return self.forward - self.matrix_forward
        modules = recompute.modules
        return ((self.attention_core_forward if "core_attn" in modules else 0.0)
                + sum(seconds for name, seconds in self.module_forward if name in modules))

    def record(self) -> dict:
        """Its fields by name, as JSON stores them (what `dataclasses.asdict` gives, without its deep copy)."""
        return {name: getattr(self, name) for name in _COST_FIELDS}


_COST_FIELDS = tuple(item.name for item in dataclasses.fields(LayerCost))
#: What a layer's schedules tell besides its times (none for a roofline or a bound: zero).
SCHEDULE_FIGURES = ("energy", "tc_busy", "vc_busy", "tc_peak", "vc_peak", "gap")

#: width -> layer id -> cost
LayerCosts = dict[int, dict[int, LayerCost]]

#: A scheduler: problem -> result (e.g. a ScheduleCache's solve with fixed backend options).
Scheduler = Callable[[ScheduleProblem], ScheduleResult]

#: Costs of a layer that takes no time (the graph facts alone).
NO_COST = LayerCost(forward=0.0, backward=0.0, attention_core_forward=0.0, **dict.fromkeys(SCHEDULE_FIGURES, 0.0))


def schedule_problem(fused: FusedLayer, accelerator: AcceleratorConfig) -> ScheduleProblem:
    """The scheduling problem of a fused layer on the accelerator's cores."""
    return ScheduleProblem.from_workload(fused, accelerator.num_tc, accelerator.num_vc)


def core_problem(fused: FusedLayer, core: frozenset[int], accelerator: AcceleratorConfig) -> ScheduleProblem | None:
    """The scheduling problem of the attention-core operators of a forward layer, or None."""
    keep = [index for index, op in enumerate(fused.ops) if op.members[0] in core]
    if not keep:
        return None
    position = {old: new for new, old in enumerate(keep)}
    edges = tuple((position[a], position[b]) for a, b in fused.edges if a in position and b in position)
    part = FusedLayer(fused.layer, fused.direction, tuple(fused.ops[i] for i in keep), edges)
    return schedule_problem(part, accelerator)


def marked_seconds(fused: FusedLayer, marked: tuple[bool, ...]) -> float:
    """The time of a fused layer's operators that hold a marked one (`marked`: per operator of the op
    graph), each split over all the cores: its block weight products (what overlapped
    tensor-parallel collectives can hide behind) or its attention core (what ring attention's
    transfers hide behind)."""
    return sum(op.parallel_latency for op in fused.ops if any(marked[member] for member in op.members))


def _layer_problems(kernels: KernelOptions, graphs, op_graph, accelerator: AcceleratorConfig, table: EstimateTable,
                    groups):
    """(group, forward, backward, attention core or None, weight products' forward and backward
    seconds, attention cores' forward and backward seconds, recompute modules' forward seconds) of
    each of the repeat groups `groups` of one width's `graphs`, on `op_graph` (their own, or it with
    the experts split: `estimator.work.expert_split_graph`)."""
    products = block_weight_products(op_graph)
    core = tuple(node.id in graphs.attention_core for node in op_graph.nodes)
    modules = {name: tuple(node.id in ids for node in op_graph.nodes) for name, ids in graphs.recompute_modules.items()}
    for group in groups:
        forward, backward = (layer_workload(op_graph, group[0], direction, accelerator, table, kernels)
                             for direction in DIRECTIONS)
        held = {member for op in forward.ops for member in op.members}
        yield (group, schedule_problem(forward, accelerator), schedule_problem(backward, accelerator),
               core_problem(forward, kernels.recomputed_core(graphs.attention_core), accelerator),
               (marked_seconds(forward, products), marked_seconds(backward, products)),
               (marked_seconds(forward, core), marked_seconds(backward, core)),
               tuple((name, marked_seconds(forward, marks)) for name, marks in modules.items()
                     if any(marks[member] for member in held)))


def expert_groups(graphs) -> tuple[tuple[int, ...], ...]:
    """The repeat groups of one width's graphs whose layers hold experts."""
    return tuple(group for group in graphs.repeat_groups if graphs.layer_graph.layer(group[0]).expert_parameter_bytes)


def layer_costs(kernels: KernelOptions, graphs_by_width, accelerator: AcceleratorConfig, table: EstimateTable,
                schedule: Scheduler, on_layer: Callable[[], None] = lambda: None,
                splits: Callable[[int], tuple[float, ...]] = lambda width: ()) -> LayerCosts:
    """Schedule each repeat group's representative on a template chip; its cost is the group's.
    A group holding experts is also priced at each expert split of `splits(width)` (a device
    holding 1/s of a width-t rank's experts: E/s experts of s times the tokens,
    `estimator.work.expert_split_graph`), its `expert_parallel_times`: its schedule's makespan
    scaled by the ratio of the schedule lower bounds (`solver.schedule.critical_path_and_work`:
    critical path and work per core type, on the latencies as the scheduler rounds them) of the split
    layer and of the layer (a simplification: the schedule's
    efficiency over its bound carries over to the split shape, so a split costs no solve; a split's
    price is never below its bound, so the group bounds hold). `on_layer` is called after each
    group (progress)."""
    costs: LayerCosts = {}
    for width, graphs in graphs_by_width.items():
        problems: dict[tuple[int, ...], tuple[ScheduleProblem, ScheduleProblem]] = {}
        for group, forward, backward, core, matrix, attention, module_forward in _layer_problems(
                kernels, graphs, graphs.op_graph, accelerator, table, graphs.repeat_groups):
            problems[group] = (forward, backward)
            results = [schedule(forward), schedule(backward)]
            core_result = schedule(core) if core is not None else None
            busy = [
                sum(getattr(r, f"{kind}_utilisation").mean * r.makespan for r in results) * count
                for kind, count in (("tc", accelerator.num_tc), ("vc", accelerator.num_vc))
            ]
            cost = LayerCost(
                forward=results[0].makespan,
                backward=results[1].makespan,
                attention_core_forward=core_result.makespan if core_result else 0.0,
                energy=results[0].energy + results[1].energy,
                tc_busy=busy[0],
                vc_busy=busy[1],
                tc_peak=max(r.tc_utilisation.peak for r in results),
                vc_peak=max(r.vc_utilisation.peak for r in results),
                gap=max(r.gap for r in results + ([core_result] if core_result else [])),
                matrix_forward=min(matrix[0], results[0].makespan),
                matrix_backward=min(matrix[1], results[1].makespan),
                attention_forward=min(attention[0], results[0].makespan),
                attention_backward=min(attention[1], results[1].makespan),
                module_forward=tuple((name, min(seconds, results[0].makespan)) for name, seconds in module_forward),
            )
            costs.setdefault(width, {}).update({layer: cost for layer in group})
            on_layer()
        split_times: dict[tuple[int, ...], list] = {}
        bounds: dict[tuple[int, ...], list[float]] = {}  # the whole layer's, once per group
        for split in splits(width):
            for group, forward, backward, _, matrix, _, _ in _layer_problems(
                    kernels, graphs, expert_split_graph(graphs.op_graph, split), accelerator, table,
                    expert_groups(graphs)):
                whole = costs[width][group[0]]
                if group not in bounds:
                    bounds[group] = [critical_path_and_work(problem.rounded(SCHEDULE_DIGITS))
                                     for problem in problems[group]]
                seconds = [made * critical_path_and_work(problem.rounded(SCHEDULE_DIGITS)) / bound if bound > 0
                           else made for made, problem, bound in zip((whole.forward, whole.backward),
                                                                     (forward, backward), bounds[group])]
                split_times.setdefault(group, []).append(
                    (split, *seconds, min(matrix[0], seconds[0]), min(matrix[1], seconds[1]), 0.0, 0.0))
        for group, times in split_times.items():
            cost = dataclasses.replace(costs[width][group[0]], expert_parallel_times=tuple(times))
            costs[width].update(dict.fromkeys(group, cost))
    return costs


def expert_splits(experts: int, width: int) -> tuple[float, ...]:
    """Every `Layout.expert_split` e·τ/t ≠ 1 of a width-t graph: e dividing the experts, τ dividing t."""
    return tuple(sorted({e * tau / width for e in range(1, experts + 1) if experts % e == 0
                         for tau in range(1, width + 1) if width % tau == 0} - {1.0}))


def roofline_costs(kernels: KernelOptions, graphs_by_width, chip: KnownChip) -> LayerCosts:
    """Every layer's cost on a GPU (`estimator.roofline`), per width; a repeat group shares its
    representative's."""
    costs: LayerCosts = {}
    for width, graphs in graphs_by_width.items():
        experts = graphs.spec.num_experts or 1
        for group in graphs.repeat_groups:
            core = kernels.recomputed_core(graphs.attention_core)
            times = layer_times(graphs.op_graph, group[0], chip, kernels, core, modules=graphs.recompute_modules)
            split = ()
            if group in expert_groups(graphs):
                split = tuple((s, found.forward, found.backward, found.matrix_forward, found.matrix_backward,
                               found.launch_forward, found.launch_backward)
                              for s in expert_splits(experts, width)
                              for found in (layer_times(graphs.op_graph, group[0], chip, kernels, core, s),))
            cost = LayerCost(forward=times.forward, backward=times.backward,
                             attention_core_forward=times.attention_core_forward, **dict.fromkeys(SCHEDULE_FIGURES, 0.0),
                             matrix_forward=times.matrix_forward, matrix_backward=times.matrix_backward,
                             attention_forward=times.attention_forward, attention_backward=times.attention_backward,
                             launch_forward=times.launch_forward, launch_backward=times.launch_backward,
                             issue_forward=times.issue_forward, issue_backward=times.issue_backward,
                             expert_issue_forward=times.expert_issue_forward,
                             expert_issue_backward=times.expert_issue_backward,
                             expert_parallel_times=split, module_forward=times.module_forward)
            costs.setdefault(width, {}).update({layer: cost for layer in group})
    return costs


def step_graphs(graphs_by_width, costs: LayerCosts | None) -> dict[int, StepGraph]:
    """The layer graph of every width with the layers' costs (positions: program order); without
    `costs`, every layer takes no time."""
    graphs = {}
    for width, extracted in graphs_by_width.items():
        layer_graph = extracted.layer_graph
        position = {layer.id: index for index, layer in enumerate(layer_graph.layers)}
        cost = {layer.id: costs[width][layer.id] if costs else NO_COST for layer in layer_graph.layers}
        layers = tuple(
            StepLayer(
                id=layer.id,
                forward=cost[layer.id].forward,
                backward=cost[layer.id].backward,
                attention_core_forward=cost[layer.id].attention_core_forward,
                parameters=layer.parameter_bytes / TRAINING_DTYPE_BYTES,
                activation_bytes=layer.activation_bytes,
                replicated_activation_bytes=layer.replicated_activation_bytes,
                attention_core_activation_bytes=layer.attention_core_activation_bytes,
                input_bytes=layer.input_bytes,
                replicated_input_bytes=layer.replicated_input_bytes,
                is_block=layer.is_block,
                forward_collective_bytes=layer.forward_collective_bytes,
                backward_collective_bytes=layer.backward_collective_bytes,
                expert_parameters=layer.expert_parameter_bytes / TRAINING_DTYPE_BYTES,
                all_to_all_bytes=layer.all_to_all_bytes,
                fused_attention_activation_bytes=layer.fused_attention_activation_bytes,
                fused_replicated_activation_bytes=layer.fused_replicated_activation_bytes,
                matrix_input_activation_bytes=layer.matrix_input_activation_bytes,
                replicated_matrix_input_activation_bytes=layer.replicated_matrix_input_activation_bytes,
                matrix_parameters=layer.matrix_parameter_bytes / TRAINING_DTYPE_BYTES,
                matrix_forward=cost[layer.id].matrix_forward,
                matrix_backward=cost[layer.id].matrix_backward,
                attention_forward=cost[layer.id].attention_forward,
                attention_backward=cost[layer.id].attention_backward,
                launch_forward=cost[layer.id].launch_forward,
                launch_backward=cost[layer.id].launch_backward,
                issue_forward=cost[layer.id].issue_forward,
                issue_backward=cost[layer.id].issue_backward,
                expert_issue_forward=cost[layer.id].expert_issue_forward,
                expert_issue_backward=cost[layer.id].expert_issue_backward,
                key_value_bytes=layer.key_value_bytes,
                product_output_bytes=layer.product_output_bytes,
                replicated_product_output_bytes=layer.replicated_product_output_bytes,
                expert_parallel_times=cost[layer.id].expert_parallel_times,
                expert_forward_collective_bytes=layer.expert_forward_collective_bytes,
                expert_backward_collective_bytes=layer.expert_backward_collective_bytes,
                recompute_modules=layer.recompute_modules,
                module_forward=cost[layer.id].module_forward,
                parameter_tensors=layer.parameter_tensors,
                dispatched_activation_bytes=layer.dispatched_activation_bytes,
                combined_activation_bytes=layer.combined_activation_bytes,
            )
            for layer in layer_graph.layers
        )
        edges = tuple((position[e.source], position[e.dest], float(e.bytes)) for e in layer_graph.edges)
        if any(source >= dest for source, dest, _ in edges):
            raise ValueError(f"layer graph of width {width}: an edge goes backwards in program order")
        tied = tuple((position[weight.first], position[weight.second], weight.bytes / TRAINING_DTYPE_BYTES)
                     for weight in layer_graph.tied)
        spec = extracted.spec
        graphs[width] = StepGraph(width, layers, edges, tied, spec.experts_per_token if spec.num_experts else 1)
    return graphs
