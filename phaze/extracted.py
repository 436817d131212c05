"""The graphs a run's settings ask for: every micro-batch size and tensor-parallel width, traced or
read from the cache, with progress."""

from __future__ import annotations

import logging

from phaze_common.progress import Progress
from graph_extract import ExtractedModel, extract
from phaze.settings import Settings

log = logging.getLogger(__name__)


def extract_all(settings: Settings) -> dict[int, dict[int, ExtractedModel]]:
    """micro-batch size -> width -> graphs, from the cache when possible, with progress."""
    axes = settings.axes
    jobs = [(b, t) for b in axes.micro_batch_sizes for t in axes.tensor_parallel_widths]
    extracted: dict[int, dict[int, ExtractedModel]] = {}
    with Progress(f"graph extraction of {settings.spec.name}", len(jobs), "graphs", log) as progress:
        for micro_batch_size, width in jobs:
            extracted.setdefault(micro_batch_size, {})[width] = extract(
                settings.spec,
                micro_batch_size,
                settings.question.sequence_length,
                width,
                cache_dir=settings.cache_dir,
                force=settings.force_reextract,
            )
            progress.advance()
    return extracted
