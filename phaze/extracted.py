"""The graphs a run's settings ask for: every micro-batch size and tensor-parallel width, traced or
read from the cache, with progress."""

from __future__ import annotations

import logging
from pathlib import Path

from phaze_common.progress import Progress
from estimator.table import Call
from graph_extract import ExtractedModel, ModelSpec, extract
from graph_extract.extraction import cache_path
from phaze.settings import Settings

log = logging.getLogger(__name__)


def extract_widths(spec: ModelSpec, micro_batch_size: int, sequence_length: int, widths: list[int],
                   cache_dir: Path) -> None:
    """Trace the graphs of one micro-batch size at these widths into the cache (one export for all)."""
    for width in widths:
        extract(spec, micro_batch_size, sequence_length, width, cache_dir=cache_dir)


def extract_all(settings: Settings, call: Call | None = None) -> dict[int, dict[int, ExtractedModel]]:
    """micro-batch size -> width -> graphs, from the cache when possible, with progress. `call`
    (worker processes, see `estimator.table.Call`) first traces side by side, into the cache, the
    micro-batch sizes whose graphs it lacks (unless the settings force a new trace)."""
    axes = settings.axes
    jobs = [(b, t) for b in axes.micro_batch_sizes for t in axes.tensor_parallel_widths]
    sequence, widths = settings.question.sequence_length, list(axes.tensor_parallel_widths)
    traced = [] if call is None or settings.force_reextract else [  # the micro-batch sizes not all in the cache
        b for b in axes.micro_batch_sizes
        if not all(cache_path(settings.cache_dir, settings.spec, b, sequence, t).exists() for t in widths)]
    side_by_side = len(traced) > 1
    extracted: dict[int, dict[int, ExtractedModel]] = {}
    with Progress(f"graph extraction of {settings.spec.name}", len(jobs), "graphs", log) as progress:
        if side_by_side:
            call(extract_widths, [(settings.spec, b, sequence, widths, settings.cache_dir) for b in traced],
                 lambda index, value: progress.advance(len(widths)))
            progress.advance(len(jobs) - len(traced) * len(widths))
        for micro_batch_size, width in jobs:
            extracted.setdefault(micro_batch_size, {})[width] = extract(
                settings.spec,
                micro_batch_size,
                sequence,
                width,
                cache_dir=settings.cache_dir,
                force=settings.force_reextract,
            )
            if not side_by_side:
                progress.advance()
    return extracted
