"""`phaze extract_graph`: trace the model at every micro-batch size and width, summarise the graphs."""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from rich.table import Table

from phaze_common.files import atomic_write
from graph_extract import ExtractedModel
from phaze.console import setup_logging, show_table
from phaze.extracted import extract_all
from phaze.settings import Settings

log = logging.getLogger(__name__)

#: Summary columns and their printed headers.
COLUMNS = {
    "micro_batch_size": "micro-batch",
    "tensor_parallel_width": "width",
    "layers": "layers",
    "repeat_groups": "repeat groups",
    "parameters": "parameters (model)",
    "parameters_per_device": "parameters/device",
    "forward_flops_per_micro_batch": "fwd FLOPs/device/micro-batch",
    "activation_bytes_per_micro_batch": "activation bytes/device/micro-batch",
}


def summary_row(graphs: ExtractedModel) -> dict[str, int]:
    """One width's totals per device (rank 0) and for the whole model."""
    layers = graphs.layer_graph.layers
    return {
        "micro_batch_size": graphs.micro_batch_size,
        "tensor_parallel_width": graphs.tensor_parallel_width,
        "layers": len(layers),
        "repeat_groups": len(graphs.repeat_groups),
        "parameters": graphs.parameter_count,
        "parameters_per_device": graphs.parameters_per_device,
        "forward_flops_per_micro_batch": sum(layer.forward_flops for layer in layers),
        "activation_bytes_per_micro_batch": sum(layer.activation_bytes for layer in layers),
    }


def run(settings: Settings) -> None:
    setup_logging()
    rows = [summary_row(graphs) for by_width in extract_all(settings).values() for graphs in by_width.values()]
    table = Table(title=f"{settings.spec.name}, sequence {settings.question.sequence_length}")
    for header in COLUMNS.values():
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(f"{row[column]:,}" for column in COLUMNS))
    show_table(table)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(COLUMNS))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(Path(HydraConfig.get().runtime.output_dir) / "extract_summary.csv", text.getvalue())
