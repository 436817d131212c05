"""`phaze predict`: one training step of a given layout on a chip that exists.

The model, the system (`system=`), the chip (`chip=a100_80gb|h100_sxm|tpuv4`; by default the
system's) and the layout (t, p, d, v, e, micro-batch, recomputation, ...) are given; it prints one
table and writes `prediction.json` into the run directory. A placement that does not fit is not an
error: the result says so, why, and the memory it would need. The prediction is `phaze.api`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from rich.table import Table

from phaze_common.files import atomic_write
from phaze import results
from phaze.api import run_prediction
from phaze.console import setup_logging, show, show_table
from phaze.settings import Settings
from solver.predict import Prediction
from solver.training_step import MEMORY_KINDS

PREDICTION = "prediction.json"

log = logging.getLogger(__name__)


def prediction_record(settings: Settings, prediction: Prediction) -> dict:
    """What prediction.json holds: the inputs, the step and the throughput figures."""
    step, question, axes, layout = prediction.step, settings.question, settings.axes, prediction.layout
    placement = prediction.placement
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
        "feasible": prediction.fits,
        "reason": prediction.reason,
        "time_per_batch_s": prediction.time_per_batch_s,
        "breakdown_s": prediction.breakdown_s,
        "hidden_s": prediction.step.hidden,
        "memory_bytes": prediction.memory_bytes,
        "most_loaded_stage": prediction.busiest_device,
        "group_tiers": question.cluster.spans(layout.groups()),
        "stages": [
            {"layers": list(placement.device_layers(device)), "devices": layout.tensor_parallel_width,
             "parameters": parameters, "memory_bytes": memory}
            for device, (parameters, memory) in enumerate(zip(step.parameters, step.memory))
        ],
        "tokens_per_s": prediction.tokens_per_s,
        "model_flops_per_batch": prediction.model_flops_per_batch,
        "hardware_flops_per_batch": prediction.hardware_flops_per_batch,
        "mfu": prediction.mfu,
        "hardware_flops_per_s_per_device": prediction.hardware_flops_per_s_per_device,
    }


def report(record: dict) -> None:
    inputs = record["inputs"]
    title = (f"{inputs['model']} on {inputs['num_devices']} x {inputs['accelerator']['name']} ({inputs['system']['name']}): "
             f"t={inputs['tensor_parallel_width']} p={inputs['pipeline_parallel_width']} "
             f"d={inputs['data_parallel_width']} v={inputs['virtual_stages']}"
             + (f" e={inputs['expert_parallel_width']}" if inputs['expert_parallel_width'] > 1 else "")
             + (f" et={inputs['expert_tensor_parallel_width']}"
                if inputs.get('expert_tensor_parallel_width') is not None else "")
             + f", micro-batch {inputs['micro_batch_size']}, "
             f"batch {inputs['global_batch_size']}, recompute={inputs['recompute']}")
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    verdict = "fits" if record["feasible"] else f"does not fit: {record['reason']}"
    table.add_row("time per batch", f"{record['time_per_batch_s']:.4g} s ({verdict})")
    for name, seconds in record["breakdown_s"].items():
        table.add_row(f"  {name.replace('_', ' ')}", f"{seconds:.4g} s")
    for name, seconds in record.get("hidden_s", {}).items():
        if seconds > 0:
            table.add_row(f"  ({name.replace('_', ' ')} hidden by overlap)", f"{seconds:.4g} s")
    table.add_row("tokens per second", f"{record['tokens_per_s']:,.0f}")
    table.add_row("model FLOPs utilisation", f"{record['mfu']:.1%}")
    table.add_row("hardware TFLOP/s per device", f"{record['hardware_flops_per_s_per_device'] / 1e12:.1f}")
    memory = record["memory_bytes"]
    table.add_row(f"memory, stage {record['most_loaded_stage']} (GiB)",
                  " + ".join(f"{memory[kind] / 2**30:.3g} {kind.replace('_', ' ')}"
                             for kind in MEMORY_KINDS if kind in memory)
                  + f" = {memory['total'] / 2**30:.3g} of {inputs['memory_capacity_bytes'] / 2**30:.3g}")
    show_table(table)


def run(settings: Settings) -> None:
    setup_logging()
    directory = Path(HydraConfig.get().runtime.output_dir)
    record = prediction_record(settings, run_prediction(settings))
    atomic_write(directory / PREDICTION, results.dumps(record))
    report(record)
    show(f"wrote {directory / PREDICTION}")
