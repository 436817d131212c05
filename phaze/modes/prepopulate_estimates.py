"""`phaze prepopulate_estimates`: extract (or load) the graphs and fill the estimate table."""

from __future__ import annotations

import time

from estimator import prepopulate
from phaze.console import setup_logging, show
from phaze.extracted import extract_all
from phaze.settings import Settings


def run(settings: Settings) -> None:
    setup_logging()
    started = time.perf_counter()
    models = [graphs for by_width in extract_all(settings).values() for graphs in by_width.values()]
    table = prepopulate(models, settings.accelerator, cache_dir=settings.cache_dir / "estimates",
                        area_budget=settings.area_budget)
    cached = len(table.gemm_shapes) - table.computed
    show(
        f"{settings.spec.name}: {len(table.gemm_shapes)} GEMM shapes x {len(table.tc_cores):,} tensor-core configurations: "
        f"{table.computed} computed, {cached} cached, {time.perf_counter() - started:.1f} s"
    )
