"""`phaze predict`: one training step of a given layout on a chip that exists.

The model, the system (`system=`), the chip (`chip=a100_80gb|h100_sxm|tpuv4`; by default the
system's) and the layout (t, p, d, v, e, micro-batch, recomputation, ...) are given; it prints one
table and writes `prediction.json` into the run directory. A placement that does not fit in memory
is still priced and written (its time, and the memory it would need, show why), without the
throughput it would not reach, and the command exits 2 with one line saying why, as `run_solver`
does when nothing fits. The prediction is `phaze.api`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from rich.table import Table

from phaze_common.files import atomic_write
from phaze import results
from graph_extract import ExtractedModel
from phaze.api import graphs, run_prediction
from phaze.console import setup_logging, show, show_table
from phaze.settings import Settings
from phaze.sweep import Infeasible
from solver.layout import Layout
from solver.layout_step import Prediction
from solver.training_step import MEMORY_KINDS
from solver.training_step.options import pipeline_sharding_note

PREDICTION = "prediction.json"

log = logging.getLogger(__name__)


def prediction_record(settings: Settings, prediction: Prediction, extracted: ExtractedModel) -> dict:
    """What prediction.json holds: the inputs, the model's parameters (`extracted`: its graphs), the
    step, the throughput figures (null when the placement does not fit: it does not run) and notes on
    the frameworks that run the layout."""
    step, question, axes, layout = prediction.step, settings.question, settings.axes, prediction.layout
    placement, fits = prediction.placement, prediction.fits
    note = pipeline_sharding_note(question.training.data_parallel_sharding, layout.pipeline_parallel_width)
    return {
        "inputs": {
            "model": question.model.name,
            "model_spec": dataclasses.asdict(question.model),
            "accelerator": settings.known_chip.record(),
            **results.question_record(question),
            "num_devices": settings.devices,
            **dataclasses.asdict(layout),
            "micro_batch_size": axes.micro_batch_size,
            "global_batch_size": question.global_batch_size,
            "sequence_length": question.sequence_length,
            "recompute": placement.recompute,
            "memory_capacity_bytes": axes.memory_capacity,
        },
        "parameters": {"total": extracted.parameter_count, "active": extracted.active_parameter_count},
        "feasible": fits,
        "reason": prediction.reason,
        "notes": [note] if note else [],
        "time_per_batch_s": prediction.time_per_batch_s,
        "breakdown_s": prediction.breakdown_s,
        "hidden_s": prediction.step.hidden,
        "memory_bytes": prediction.memory_bytes,
        "most_loaded_stage": prediction.busiest_device,
        "group_tiers": prediction.group_tiers,
        **settings.plan_record(axes.micro_batch_size, layout.tensor_parallel_width),
        "stages": [
            {"layers": list(placement.device_layers(device)), "devices": layout.tensor_parallel_width,
             "parameters": parameters, "memory_bytes": memory}
            for device, (parameters, memory) in enumerate(zip(step.parameters, step.memory))
        ],
        "tokens_per_s": prediction.tokens_per_s if fits else None,
        "model_flops_per_batch": prediction.model_flops_per_batch,
        "hardware_flops_per_batch": prediction.hardware_flops_per_batch,
        "mfu": prediction.mfu if fits else None,
        "hardware_flops_per_s_per_device": prediction.hardware_flops_per_s_per_device if fits else None,
    }


def parameter_text(parameters: dict) -> str:
    """"8.03B parameters", and the active ones of a mixture: "46.7B parameters, 12.9B active"."""
    def count(number: int) -> str:
        return next(f"{number / scale:.3g}{unit}" for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"),
                                                                       (1, "")) if number >= scale or scale == 1)

    active = "" if parameters["active"] == parameters["total"] else f", {count(parameters['active'])} active"
    return f"{count(parameters['total'])} parameters{active}"


def title(record: dict) -> str:
    """The table's title: the model and its parameters, the chips, the layout, the batch and sequence."""
    inputs = record["inputs"]
    layout = Layout(**{name: inputs[name] for name in results.LAYOUT_FIELDS})
    return (f"{inputs['model']} ({parameter_text(record['parameters'])}) on {inputs['num_devices']} x "
            f"{inputs['accelerator']['name']} ({inputs['system']['name']}): {layout.text()}, micro-batch "
            f"{inputs['micro_batch_size']}, batch {inputs['global_batch_size']}, sequence "
            f"{inputs['sequence_length']:,}, recompute={inputs['recompute']}")


def report(record: dict) -> None:
    table = Table(title=title(record), show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    verdict = "fits" if record["feasible"] else f"does not fit: {record['reason']}"
    table.add_row("time per batch", f"{record['time_per_batch_s']:.4g} s ({verdict})")
    for name, seconds in record["breakdown_s"].items():
        table.add_row(f"  {name.replace('_', ' ')}", f"{seconds:.4g} s")
    for name, seconds in record.get("hidden_s", {}).items():
        if seconds > 0:
            table.add_row(f"  ({name.replace('_', ' ')} hidden by overlap)", f"{seconds:.4g} s")
    if record["feasible"]:
        table.add_row("tokens per second", f"{record['tokens_per_s']:,.0f}")
        table.add_row("model FLOPs utilisation", f"{record['mfu']:.1%}")
        table.add_row("hardware TFLOP/s per device", f"{record['hardware_flops_per_s_per_device'] / 1e12:.1f}")
    else:
        table.add_row("tokens per second", "none: the placement does not fit in memory")
    memory = record["memory_bytes"]
    table.add_row(f"memory, stage {record['most_loaded_stage']} (GiB)",
                  " + ".join(f"{memory[kind] / 2**30:.3g} {kind.replace('_', ' ')}"
                             for kind in MEMORY_KINDS if kind in memory)
                  + f" = {memory['total'] / 2**30:.3g} of {record['inputs']['memory_capacity_bytes'] / 2**30:.3g}")
    show_table(table)
    for note in record["notes"]:
        show(f"note: {note}")


def run(settings: Settings) -> None:
    setup_logging()
    directory = Path(HydraConfig.get().runtime.output_dir)
    prediction = run_prediction(settings)
    record = prediction_record(settings, prediction, graphs(settings))
    atomic_write(directory / PREDICTION, results.dumps(record))
    report(record)
    show(f"wrote {directory / PREDICTION}")
    if not prediction.fits:
        raise Infeasible(f"{prediction.layout.text()} does not fit: {prediction.reason}; its time and memory are in "
                         f"{directory / PREDICTION}")
