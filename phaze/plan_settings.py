"""`tensor_parallel_plan`: how a model phaze exports is split over the tensor-parallel ranks.

* `megatron` (default): Megatron-LM's split, found by structure (`graph_extract.plan.derived_plan`),
  or the model's own plan file (`model.plan`);
* `searched`: at each width the plan of least time by the sharding ILP
  (`solver.auto_sharding.plan_files`), priced on the run's chip and the tensor-parallel group's
  link; Megatron's where it is not strictly better or does not compute the model;
* a path: a plan file (module pattern: ColwiseParallel / RowwiseParallel, or one such mapping per
  width), as `model.plan`.

A model whose own code builds its shards (a factory taking `tensor_parallel_width`) has Megatron's
split written in: only `megatron` applies to it. The plan of a run is recorded with whether it was
verified (`plan_record`): its ranks, run side by side on a small model of the family, compute the
unsharded model (`graph_extract.verify`).

The prices of the search (`search_prices`) are the run chip's (a known chip's matrix rate, the
template chip's tensor cores) and its tensor-parallel link's; an architecture search adds the corners
of the box of its candidates' prices (the candidates' tensor-core rates, and the scale-up links of the
system space's options): a plan the ILP finds best at every corner is the best plan of every
candidate, the cost of a plan being linear in those prices (`plan_files.search_width_at_prices`).
Simplification: where the corners' plans differ, every candidate is priced with the run chip's.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

from phaze_common.checks import InputError
from graph_extract import ModelSpec
from graph_extract.extraction import is_exported
from estimator import CandidateSpace
from phaze_hardware import AcceleratorConfig, KnownChip, Network

#: The named values of `tensor_parallel_plan` (anything else: a plan file's path).
PLAN_NAMES = ("megatron", "searched")


def exportable(spec: ModelSpec) -> bool:
    """Whether phaze splits the model by a plan: the zoo's models, a factory that builds the whole
    model, a config.json."""
    return spec.factory is None or is_exported(spec)


def check_plan_file(key: str, path: object, names: Sequence[str]) -> str:
    """A readable plan file's path (every width it holds read), else InputError naming `key` and the
    values allowed besides a file (`names`)."""
    from graph_extract.plan import plan_widths, read_plan  # torch.distributed.tensor: loaded when a plan is given

    if not isinstance(path, str) or not Path(path).is_file():
        raise InputError(f"{key}: {path!r} is not a file; allowed: {', '.join(names)}, or a YAML plan file "
                         "(module pattern: ColwiseParallel or RowwiseParallel)")
    for width in plan_widths(path) or (None,):
        read_plan(path, width)
    return path


def search_prices(known: KnownChip | None, accelerator: AcceleratorConfig | None, cluster: Network,
                  candidates: CandidateSpace | None = None, clusters: Sequence[Network] = ()) -> tuple:
    """The sharding ILP's prices (`SearchSettings`): first the run chip's, its 16-bit matrix rate (a
    known chip's, else the template `accelerator`'s tensor cores) and the first tier's link bandwidth
    (times its efficiency) and latency; then, for an architecture search over `candidates` (their
    tensor-core rates) and the scale-up tiers of `clusters` (the system space's options; the run's
    cluster without), the corners of the box of their prices, each once."""
    from solver.auto_sharding.from_export import SearchSettings  # OR-Tools: loaded when a plan is searched

    tier = cluster.tiers[0]
    rate = known.matrix_flops if known is not None else accelerator.matrix_flops
    prices = [SearchSettings(chip_flops=rate, efficiency=1.0, link_bandwidth=tier.effective_bandwidth,
                             link_latency=tier.latency)]
    if candidates is not None:
        tiers = [each.tiers[0] for each in clusters or (cluster,)]
        ranges = [candidates.matrix_flops.tolist(), [tier.effective_bandwidth for tier in tiers],
                  [tier.latency for tier in tiers]]
        for flops, bandwidth, latency in itertools.product(*[(min(values), max(values)) for values in ranges]):
            corner = SearchSettings(chip_flops=flops, efficiency=1.0, link_bandwidth=bandwidth, link_latency=latency)
            if corner not in prices:
                prices.append(corner)
    return tuple(prices)


def planned_spec(value: object, spec: ModelSpec, micro_batch_size: int, sequence_length: int,
                 widths: Sequence[int], prices: Callable[[], tuple], cache_dir: Path) -> ModelSpec:
    """`spec` split by the plan `tensor_parallel_plan` names (its plan file in `ModelSpec.plan`);
    `prices`: the search's prices (`search_prices`), asked for when the plan is searched."""
    if value == "megatron":
        return spec
    if not exportable(spec):
        raise InputError(f"tensor_parallel_plan: {spec.name} builds its own shards (a factory taking "
                         "tensor_parallel_width: Megatron's split written in); allowed: megatron")
    if spec.plan is not None:
        raise InputError("tensor_parallel_plan: the model has its own plan (model.plan); allowed: megatron "
                         "(model.plan's), or model.plan=null")
    if value != "searched":
        return spec.with_overrides(plan=check_plan_file("tensor_parallel_plan", value, PLAN_NAMES))
    from solver.auto_sharding.plan_files import searched_plan_file  # OR-Tools: loaded when a plan is searched

    path = searched_plan_file(spec, micro_batch_size, sequence_length, widths, prices(), cache_dir)
    return spec.with_overrides(plan=str(path))


def plan_record(spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int,
                cache_dir: Path | None) -> dict:
    """What prediction.json and best.json record of the plan at `width`: `plan` (module pattern ->
    style; None for a model that builds its own shards), `plan_verified` (its ranks compute the
    unsharded small model; one rank is the model itself; None where no plan applies) and, for a plan
    phaze searched, `plan_search` (the width's `solver.auto_sharding.plan_files.WidthSearch`)."""
    if not exportable(spec):
        return {"plan": None, "plan_verified": None}
    from graph_extract.extraction import exported_model
    from graph_extract.plan import derived_plan, read_plan
    from graph_extract.verify import verify_tensor_parallel

    if spec.plan is not None:
        plan = read_plan(spec.plan, width)
    else:
        _, blocks, graph = exported_model(spec, micro_batch_size, sequence_length, width)
        plan = derived_plan(graph, blocks)
    verified = width == 1 or verify_tensor_parallel(spec, width, plan=plan, cache_dir=cache_dir).passed
    record = {"plan": dict(plan.styles), "plan_verified": verified}
    if spec.plan is not None and (searched := _search_record(spec.plan, width)) is not None:
        record["plan_search"] = searched
    return record


def _search_record(path: str, width: int) -> dict | None:
    """The record of the search of a searched plan file at `width` (`plan_files.WidthSearch`)."""
    from solver.auto_sharding.plan_files import search_records

    found = search_records(Path(path)).get(width)
    return None if found is None else dataclasses.asdict(found)
