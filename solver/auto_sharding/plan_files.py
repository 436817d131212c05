"""The searched tensor-parallel plans of a model at several widths, written once as a plan file the
extraction reads (`graph_extract.plan.read_plan`), with a record of each width's search beside it.

At each width above one the sharding ILP (`from_export.search_plan`) prices every plan of the first
block the plan pass expresses, Megatron's (`graph_extract.plan.derived_plan`) among them; the
searched plan is kept only when its cost is lower than Megatron's by more than `TIE` of it, else
Megatron's is written (a tie keeps the plan every framework runs, and its graphs). A plan that does
not compute the unsharded model when its ranks run side by side on a small model of the family
(`graph_extract.verify.verify_tensor_parallel`) is never written: Megatron's is, and the record
says so. One rank holds the model whole under any plan; its graph holds the plan's collectives (of
size 1), so it is given the plan searched at two ranks (Megatron's for a model that does not split
in two).

The prices are the chip's matrix rate and the tensor-parallel group's link (bandwidth and latency
of the cluster's first tier); the file's name is a digest of the model, shapes, widths and prices,
so a run asking the same again reads it. Several prices (the run chip's, then the corners of the
box of an architecture search's candidates: `search_width_at_prices`) write the first one's plan and
record whether every price chose it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from graph_extract import ModelSpec
from graph_extract.extraction import exported_model, valid_tensor_parallel_widths
from graph_extract.plan import Plan, derived_plan, write_plan
from graph_extract.verify import verify_tensor_parallel
from phaze_common.checks import InputError
from phaze_common.files import atomic_write
from phaze_common.log import warn_once

from .from_export import SearchSettings, search_against_megatron

log = logging.getLogger(__name__)

#: Relative margin under Megatron's cost a searched plan must beat to be kept.
TIE = 1e-6
#: The width whose plan one rank is given: every collective is in a graph at every width (of size 1
#: at one rank, `graph_extract.plan_pass`), so one rank's graph is that of the plan of the other widths.
ONE_RANK_PLAN_WIDTH = 2


@dataclass(frozen=True, kw_only=True)
class WidthSearch:
    """The search at one width: the ILP's status (the worst of its kinds of block), its plan's cost
    and Megatron's plan's by the same model [s a step of the traced blocks], its largest optimality
    gap and its solves' seconds, whether the written plan is the searched one (else Megatron's), and
    whether the searched plan computed the unsharded model (None: not run, as when it is not better).
    A block the search cannot express (an operator its graph does not handle) is `status` "refused",
    with the reason in `refused` and no costs: Megatron's plan is written. Where Megatron's plan pays
    a conversion the ILP prices as refused (`megatron_priced` false: the plan pass makes it otherwise,
    as a split norm's all-reduced mean of squares), the ILP's comparison is no measure and Megatron's
    plan is written too. With
    several prices, `prices_searched` counts them and `same_plan_at_every_price` says whether each
    chose the written plan (the first price's; its costs are recorded)."""

    width: int
    status: str
    objective: float | None
    megatron_objective: float | None
    gap: float | None
    solve_seconds: float
    searched: bool
    searched_verified: bool | None
    refused: str | None = None
    megatron_priced: bool = True
    prices_searched: int = 1
    same_plan_at_every_price: bool = True


def _digest(spec: ModelSpec, micro_batch_size: int, sequence_length: int, widths: Sequence[int],
            prices: Sequence[SearchSettings]) -> str:
    fields = (repr(spec), micro_batch_size, sequence_length, tuple(sorted(widths)), repr(tuple(prices)))
    return hashlib.sha1(repr(fields).encode()).hexdigest()[:12]


def searched_plan_path(cache_dir: Path, spec: ModelSpec, micro_batch_size: int, sequence_length: int,
                       widths: Sequence[int], prices: Sequence[SearchSettings]) -> Path:
    """Where the searched plans of these widths are written."""
    name = f"{spec.name}_{_digest(spec, micro_batch_size, sequence_length, widths, prices)}.yaml"
    return Path(cache_dir) / "plans" / name


def search_width(spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int,
                 prices: SearchSettings, cache_dir: Path | None) -> tuple[Plan, WidthSearch]:
    """The plan written for `width` and the record of its search."""
    _, blocks, graph = exported_model(spec, micro_batch_size, sequence_length, width)
    try:
        found = search_against_megatron(graph, blocks, width, prices)
    except InputError as refusal:
        warn_once(("plan search refused", spec.name), "%s; Megatron's plan is used", refusal)
        return derived_plan(graph, blocks), WidthSearch(
            width=width, status="refused", objective=None, megatron_objective=None, gap=None, solve_seconds=0.0,
            searched=False, searched_verified=None, refused=str(refusal))
    better = found.megatron_priced and found.objective < found.megatron_objective * (1.0 - TIE)
    verified = verify_tensor_parallel(spec, width, plan=found.plan, cache_dir=cache_dir).passed if better else None
    results = [kind.result for kind in found.searched]
    status = "optimal" if all(result.status == "optimal" for result in results) else "feasible"
    record = WidthSearch(width=width, status=status, objective=found.objective,
                         megatron_objective=found.megatron_objective, gap=max(result.gap for result in results),
                         solve_seconds=sum(result.solve_seconds for result in results),
                         searched=bool(better and verified), searched_verified=verified,
                         megatron_priced=found.megatron_priced)
    if better and not verified:
        log.warning("plan search: the searched plan of %s at width %d does not compute the model; Megatron's is used",
                    spec.name, width)
    return (found.plan if record.searched else found.megatron), record


def search_width_at_prices(spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int,
                           prices: Sequence[SearchSettings], cache_dir: Path | None) -> tuple[Plan, WidthSearch]:
    """`search_width` at the first of `prices` (the run chip's), its plan and record, the record
    saying whether the other prices (the corners of a box of prices) chose the same plan. The ILP's
    cost of any one plan is linear in the seconds per FLOP, the seconds per byte of the link and its
    latency (`from_export.search_model`: a refused conversion too, as twice the replicated plan's), so
    the least cost over the plans is concave in them: a plan least at every corner of a box is least
    everywhere in it, and so is the written plan (the margin `TIE` over Megatron's is linear too)."""
    plan, record = search_width(spec, micro_batch_size, sequence_length, width, prices[0], cache_dir)
    chosen = dict(plan.styles)
    same = all(dict(search_width(spec, micro_batch_size, sequence_length, width, price, cache_dir)[0].styles)
               == chosen for price in prices[1:])
    if not same:
        warn_once(("plan differs across prices", spec.name, width),
                  "plan search: the best plan of %s at width %d differs among the candidate chips; each is priced "
                  "with the plan of the run's chip", spec.name, width)
    return plan, replace(record, prices_searched=len(prices), same_plan_at_every_price=same)


def searched_plan_file(spec: ModelSpec, micro_batch_size: int, sequence_length: int, widths: Sequence[int],
                       prices: Sequence[SearchSettings], cache_dir: Path) -> Path:
    """The plan file of `spec` at `widths` (searched, else Megatron's; width 1 two ranks'), written
    once under `cache_dir`/plans with its records (`<file>.json`: a `WidthSearch` per width), the
    plans those of the first of `prices` (`search_width_at_prices`)."""
    path = searched_plan_path(cache_dir, spec, micro_batch_size, sequence_length, widths, prices)
    if path.exists() and path.with_suffix(".json").exists():
        return path
    plans, records = {}, []
    one_rank = {ONE_RANK_PLAN_WIDTH} if 1 in widths and ONE_RANK_PLAN_WIDTH in valid_tensor_parallel_widths(
        spec, ONE_RANK_PLAN_WIDTH) else set()
    for width in sorted((set(widths) | one_rank) - {1}):
        plans[width], record = search_width_at_prices(spec, micro_batch_size, sequence_length, width, prices,
                                                      cache_dir)
        records.append(asdict(record))
        log.info("plan search of %s at width %d: %s, %s", spec.name, width, record.status,
                 "searched plan kept" if record.searched else "Megatron's plan kept")
    if 1 in widths:
        if ONE_RANK_PLAN_WIDTH in plans:
            plans[1] = plans[ONE_RANK_PLAN_WIDTH]
        else:
            _, blocks, graph = exported_model(spec, micro_batch_size, sequence_length, 1)
            plans[1] = derived_plan(graph, blocks)
    try:
        _write(path, plans, widths, records)
    except OSError as error:  # a read-only cache: the plans written where this process can
        warn_once(("unwritable", path.parent), "plan cache: cannot write to %s (%s); the searched plans are kept in "
                  "a temporary folder", path.parent, error.strerror or error)
        path = Path(tempfile.mkdtemp(prefix="phaze-plans-")) / path.name
        _write(path, plans, widths, records)
    return path


def _write(path: Path, plans: dict[int, Plan], widths: Sequence[int], records: list[dict]) -> None:
    write_plan(path, {width: plans[width] for width in sorted(set(widths))})
    atomic_write(path.with_suffix(".json"), json.dumps({"records": records}, indent=1))


def search_records(path: Path) -> dict[int, WidthSearch]:
    """The records written beside a searched plan file, by width (none for a file phaze did not search)."""
    try:
        records = json.loads(Path(path).with_suffix(".json").read_text())["records"]
    except (OSError, ValueError, KeyError):
        return {}
    return {record["width"]: WidthSearch(**record) for record in records}
