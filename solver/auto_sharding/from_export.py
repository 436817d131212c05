"""The tensor-parallel plan of an exported model's transformer block, searched by the sharding ILP and
returned as a `graph_extract.plan.Plan` the plan pass (`graph_extract.plan_pass.apply_plan`) accepts.

The blocks are grouped by structure (a model's first dense blocks and its mixture-of-experts blocks
are two kinds); the first block of each kind becomes a `ShardingGraph` (`export_graph.block_graph`:
its mixture of experts and latent attention included) and is searched on its own, the blocks
between them exchanging the replicated residual stream. A module's style is one wildcard entry
(`<blocks>.*.<path>`) where the kinds that hold it agree, else one entry per block.

The search is restricted to what the plan pass can express (PyTorch's `ColwiseParallel` and
`RowwiseParallel`): the mesh has one axis of the t tensor-parallel ranks whose all-reduces are ring
all-reduces (`AlphaBeta`: a link's bandwidth and latency), and whose all-gathers, reduce-scatters and
all-to-alls, which the plan pass never inserts, are priced above the all-replicated plan (so the
optimum pays none); the block's input and output are `replicated` (the residual stream between
blocks); products may be computed whole (`replicated_compute`), each FLOP priced at one over the
chip's rate times its efficiency. The gradients of a tensor read by several products are summed
before their conversion (resharding.py), so q, k and v reading one normed input pay one backward
all-reduce, as the plan pass inserts one copy (Megatron's `copy_to_tensor_parallel_region`) per
tensor and module. The experts' tensor-parallel group is the t ranks (expert parallelism, which
divides the experts among ranks, is the placement search's, not this ILP's: each rank holds every
expert's share).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from phaze_common.checks import InputError, positive_integer, positive_number
from graph_extract.plan import COLWISE, ROWWISE, Plan, derived_plan, vocabulary_styles
from graph_extract.verify import lockstep_error, plan_ranks, tiny_spec, zoo_model
from graph_extract.zoo import get_spec

from .costs import CostModel
from .export_graph import BlockGraph, block_graph, kind_graphs
from .ilp import ShardingPlan, solve
from .mesh import AlphaBeta, DeviceMesh, MeshAxis
from .resharding import REPLICATE
from .shrink import follow
from .strategies import CostSettings, Strategy

#: The tensor-parallel mesh axis.
AXIS = "tensor"


@dataclass(frozen=True, kw_only=True)
class PlanPassCollectives:
    """The tensor-parallel axis as the plan pass uses it: all-reduces priced by `ring`; a conversion it
    never inserts (all-gather, reduce-scatter, all-to-all) costs `refused` seconds."""

    ring: AlphaBeta
    refused: float

    def all_reduce(self, full_bytes: float) -> float:
        return self.ring.all_reduce(full_bytes)

    def _refused(self) -> float:
        return self.refused if self.ring.devices > 1 else 0.0

    def all_gather(self, full_bytes: float) -> float:
        return self._refused()

    def reduce_scatter(self, full_bytes: float) -> float:
        return self._refused()

    def all_to_all(self, full_bytes: float) -> float:
        return self._refused()


def tensor_parallel_mesh(width: int, link_bandwidth: float = 450e9, link_latency: float = 3.4e-6,
                         refused: float = 1.0) -> DeviceMesh:
    """One axis of `width` ranks: ring all-reduces over links of `link_bandwidth` [bytes/s] and
    `link_latency` [s] a step (defaults: NVLink 4, 450 GB/s a direction; 3.4 µs), other collectives
    `refused` seconds."""
    positive_integer("width", width)
    positive_number("link_bandwidth", link_bandwidth, "bytes/s")
    ring = AlphaBeta(devices=width, alpha=link_latency, beta=1.0 / link_bandwidth)
    return DeviceMesh(axes=(MeshAxis(name=AXIS, size=width, collectives=PlanPassCollectives(ring=ring,
                                                                                            refused=refused)),))


def cost_settings(chip_flops: float = 400e12, efficiency: float = 0.5) -> CostSettings:
    """Replicated compute allowed, a FLOP at 1 / (chip_flops · efficiency) seconds."""
    positive_number("chip_flops", chip_flops, "FLOP/s")
    positive_number("efficiency", efficiency, "", maximum=1.0)
    return CostSettings(seconds_per_flop=1.0 / (chip_flops * efficiency), replicated_compute=True)


# --- plans --------------------------------------------------------------------------------------

def _relative(block: BlockGraph, module_path: str) -> str:
    return module_path.removeprefix(f"{block.blocks}.{block.index}.")


def block_styles(block: BlockGraph, strategies: Mapping[str, Strategy]) -> dict[str, str | None]:
    """Module path below the block -> style of each weight product (None: replicated)."""
    found: dict[str, str | None] = {}
    for op, path in block.products.items():
        dim = strategies[op].splits[0]
        style = None if dim is None else COLWISE if dim == block.out_dims[op] else ROWWISE
        if found.setdefault(_relative(block, path), style) != style:
            raise InputError(f"plan search: {path}: its products split two ways")
    return found


def plan_strategies(block: BlockGraph, plan: Plan, model: CostModel) -> dict[str, Strategy]:
    """Each operator's strategy under `plan`: a weight product's by its style, any other operator's
    the split of its first operand written by an operator (Replicate for the block's input)."""
    chosen: dict[str, Strategy] = {}
    graph = block.graph
    for v, op in enumerate(graph.ops):
        if op.name in block.products:
            style = plan.style(block.products[op.name])
            dim = None if style is None else block.out_dims[op.name] if style == COLWISE else block.in_dims[op.name]
            wanted = Strategy(splits=(dim,))
            if wanted not in model.strategies[v]:
                raise InputError(f"plan: {block.products[op.name]}: {style} does not split at this width")
            chosen[op.name] = wanted
            continue
        written = [(operand, graph.producer[operand.tensor]) for operand in op.inputs if operand.tensor in graph.producer]
        if written:
            operand, u = written[0]
            output = model.cost(u, model.strategies[u].index(chosen[graph.ops[u].name])).output
        else:
            operand, output = op.inputs[0], (REPLICATE,)
        chosen[op.name] = model.strategies[v][follow(model.strategies[v], operand.dims, output)]
    return chosen


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """The prices of the search: the chip's rate [FLOP/s] and efficiency, the link's bandwidth
    [bytes/s] and latency per ring step [s] (defaults: an H100's dense bf16 rate at half, NVLink 4),
    the element size [bytes] and the ILP's time limit [s]."""

    chip_flops: float = 400e12
    efficiency: float = 0.5
    link_bandwidth: float = 450e9
    link_latency: float = 3.4e-6
    element_bytes: int = 2
    time_limit: float = 10.0


def search_model(block: BlockGraph, width: int, search: SearchSettings = SearchSettings()
                 ) -> tuple[DeviceMesh, CostSettings]:
    """The mesh and prices of the search, a refused collective costing twice the all-replicated
    plan (so that any plan paying one is worse than that plan, which needs no collective)."""
    settings = cost_settings(search.chip_flops, search.efficiency)
    probe = CostModel(block.graph, tensor_parallel_mesh(width, search.link_bandwidth, search.link_latency), settings)
    replicated = probe.evaluate({op.name: Strategy(splits=(None,)) for op in block.graph.ops}).total
    return tensor_parallel_mesh(width, search.link_bandwidth, search.link_latency, 2 * replicated or 1.0), settings


@dataclass(frozen=True, kw_only=True)
class BlockSearch:
    """The blocks of one kind (their indices), the sharding graph of the first and the ILP's plan of it."""

    indices: tuple[int, ...]
    block: BlockGraph
    result: ShardingPlan


def search_blocks(module: fx.GraphModule, blocks: str, width: int, search: SearchSettings = SearchSettings()
                  ) -> tuple[BlockSearch, ...]:
    """The ILP's plan of least time per step of each kind of block of an exported graph at `width` ranks."""
    found = []
    for indices, block in kind_graphs(module, blocks, width, search.element_bytes):
        mesh, settings = search_model(block, width, search)
        result = solve(block.graph, mesh, settings, time_limit=search.time_limit)
        if result.status == "infeasible":
            raise InputError(f"plan search: no plan of {blocks}.{indices[0]} at width {width}")
        found.append(BlockSearch(indices=indices, block=block, result=result))
    return tuple(found)


def searched_styles(searched: Sequence[BlockSearch]) -> tuple[tuple[str, str], ...]:
    """The plan entries of the searched kinds: `<blocks>.*.<path>` where every kind holding the
    module splits it alike, else `<blocks>.<i>.<path>` for each block of a kind that splits it."""
    styles = [block_styles(kind.block, kind.result.strategies) for kind in searched]
    entries: dict[str, str] = {}
    for path in dict.fromkeys(path for kind in styles for path in kind):
        chosen = {kind[path] for kind in styles if path in kind}
        for kind, found in zip(searched, styles):
            style = found.get(path)
            if style is not None and len(chosen) == 1:
                entries[f"{kind.block.blocks}.*.{path}"] = style
            elif style is not None:
                entries.update((f"{kind.block.blocks}.{index}.{path}", style) for index in kind.indices)
    return tuple(entries.items())


def search_plan(module: fx.GraphModule, blocks: str, width: int, search: SearchSettings = SearchSettings()
                ) -> tuple[Plan, ShardingPlan]:
    """The plan of least time per step of the blocks of an exported graph at `width` ranks: the ILP's
    styles for each kind of block's weight products (`searched_styles`), then the embedding's and
    output projection's (`graph_extract.plan.vocabulary_styles`); with the ILP's result of the first
    block (`search_blocks` gives every kind's)."""
    searched = search_blocks(module, blocks, width, search)
    outside = tuple(vocabulary_styles(module, blocks).items())
    return Plan(styles=(*searched_styles(searched), *outside)), searched[0].result


@dataclass(frozen=True, kw_only=True)
class PlanSearch:
    """A searched plan and its cost by the ILP's model, `derived_plan`'s (Megatron's split,
    `megatron`) and its cost by the same model [s per step of the searched blocks: each kind's block
    times its blocks], and the ILP's result of each kind of block."""

    plan: Plan
    searched: tuple[BlockSearch, ...]
    objective: float
    megatron: Plan
    megatron_objective: float
    megatron_priced: bool


def search_against_megatron(module: fx.GraphModule, blocks: str, width: int,
                            search: SearchSettings = SearchSettings()) -> PlanSearch:
    """`search_plan`'s plan with its cost and Megatron's (`derived_plan` of `module`, priced on each
    kind's block by the ILP's cost model); `megatron_priced` is false where Megatron's plan pays a
    conversion the ILP prices as refused (one the plan pass makes otherwise, as the all-reduced mean
    of squares of a norm over split heads): its cost is then no measure of it."""
    searched = search_blocks(module, blocks, width, search)
    derived = derived_plan(module, blocks)
    objective = megatron = 0.0
    priced = True
    for kind in searched:
        mesh, settings = search_model(kind.block, width, search)
        model = CostModel(kind.block.graph, mesh, settings)
        cost = model.evaluate(plan_strategies(kind.block, derived, model)).total
        priced &= cost < mesh.axes[0].collectives.refused
        megatron += len(kind.indices) * cost
        objective += len(kind.indices) * kind.result.objective
    outside = tuple(vocabulary_styles(module, blocks).items())
    return PlanSearch(plan=Plan(styles=(*searched_styles(searched), *outside)), searched=searched,
                      objective=objective, megatron=derived, megatron_objective=megatron, megatron_priced=priced)


# --- verification -------------------------------------------------------------------------------

def rank_graphs(model: nn.Module, inputs: Mapping[str, torch.Tensor], plan: Plan, width: int
                ) -> list[fx.GraphModule]:
    """The `width` ranks' graphs of `model` (real weights) under `plan`, their parameters the ranks' shares."""
    return plan_ranks(model, inputs, plan, width)


def agrees(model: nn.Module, inputs: Mapping[str, torch.Tensor], ranks: Sequence[fx.GraphModule],
           tolerance: float = 1e-4) -> bool:
    """Whether the ranks' graphs run in lockstep (`graph_extract.verify`) give `model(**inputs)`'s outputs
    to within `tolerance`."""
    return lockstep_error(model, inputs, list(ranks)) < tolerance


def verified(plan: Plan, model: nn.Module, inputs: Mapping[str, torch.Tensor], width: int,
             tolerance: float = 1e-4) -> bool:
    """Whether `plan`'s `width` ranks, run in lockstep on `model`'s real (small) weights, compute the
    unsharded model's outputs."""
    return agrees(model, inputs, rank_graphs(model, inputs, plan, width), tolerance)


def tiny_zoo_model(name: str, width: int, device: str = "cpu", seed: int = 0, **overrides: object
                   ) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The tiny configuration of a zoo model that `graph_extract.verify.verify_tensor_parallel` checks
    (`graph_extract.verify.tiny_spec`), with `overrides`, built for `width` ranks on `device` (random
    weights from `seed`), and its inputs; the module paths are the full model's, so that a plan
    searched on the full model applies to it."""
    model, inputs, _ = zoo_model(tiny_spec(get_spec(name), overrides), width, seed, device)
    return model, inputs