"""`phaze predict`: one training step of a fixed placement on a chip that exists.

The model, the cluster (`system=`), the chip (`accelerator.preset=a100_80gb|h100_sxm|tpuv4`) and the
placement (t, p, d, v, micro-batch, recomputation, ...) are given; it prints one table and writes
`prediction.json` into the run directory. A placement that does not fit is not an error: the result
says so, why, and the memory it would need.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from rich.table import Table

from graph_extract import extract
from graph_extract.serialize import atomic_write
from phaze import results
from phaze.progress import Progress, setup_logging, show, show_table
from phaze.settings import Settings
from solver.predict import Prediction, chip_costs, predict

PREDICTION = "prediction.json"

log = logging.getLogger(__name__)


def prediction_record(settings: Settings, prediction: Prediction) -> dict:
    """What prediction.json holds: the inputs, the step and the throughput figures."""
    step, job = prediction.step, settings.job(settings.micro_batch_sizes[0])
    loaded = max(range(len(step.memory)), key=lambda device: step.memory[device]["total"])
    placement = prediction.placement
    return {
        "inputs": {
            "model": settings.spec.name,
            "model_spec": dataclasses.asdict(settings.spec),
            "accelerator": settings.known_chip.record(),
            **results.job_record(job),
            "num_devices": settings.devices,
            "tensor_parallel_width": settings.tensor_parallel_widths[0],
            "pipeline_parallel_width": settings.pipeline_parallel_width,
            "data_parallel_width": settings.data_parallel_width,
            "expert_parallel_width": settings.expert_parallel_widths[0],
            "virtual_stages": placement.virtual_stages,
            "micro_batch_size": job.micro_batch_size,
            "global_batch_size": job.global_batch_size,
            "sequence_length": job.sequence_length,
            "recompute": placement.recompute,
            "sequence_parallel": job.training.sequence_parallel,
            "memory_capacity_bytes": job.memory_capacities[0],
        },
        "feasible": step.feasible,
        "reason": step.infeasible_reason,
        "time_per_batch_s": step.time_per_batch,
        "breakdown_s": step.breakdown,
        "memory_bytes": step.memory[loaded],
        "most_loaded_stage": loaded,
        "stages": [
            {"layers": list(placement.device_layers(device)), "devices": settings.tensor_parallel_widths[0],
             "parameters": parameters, "memory_bytes": memory}
            for device, (parameters, memory) in enumerate(zip(step.parameters, step.memory))
        ],
        "tokens_per_s": prediction.tokens_per_s,
        "model_flops_per_batch": prediction.model_flops_per_batch,
        "hardware_flops_per_batch": prediction.hardware_flops_per_batch,
        "mfu": prediction.mfu,
        "hardware_flops_per_s_per_device": prediction.hardware_flops_per_s_per_device,
    }


def run_prediction(settings: Settings) -> Prediction:
    """Extract (or load) the graphs, cost the layers on the chip and price the placement."""
    job = settings.job(settings.micro_batch_sizes[0])
    width = settings.tensor_parallel_widths[0]
    with Progress(f"graph extraction of {settings.spec.name}", 1, "graphs", log) as progress:
        graphs = extract(settings.spec, job.micro_batch_size, settings.sequence_length, width,
                         cache_dir=settings.cache_dir, force=settings.force_reextract)
        progress.advance()
    costs = chip_costs(job, {width: graphs}, settings.known_chip, settings.cache_dir, settings.schedule)
    return predict(job, graphs, costs, settings.known_chip, settings.pipeline_parallel_width,
                   settings.data_parallel_width, (settings.virtual_stages or (1,))[0])


def report(record: dict) -> None:
    inputs = record["inputs"]
    title = (f"{inputs['model']} on {inputs['num_devices']} x {inputs['accelerator']['name']} ({inputs['system']['name']}): "
             f"t={inputs['tensor_parallel_width']} p={inputs['pipeline_parallel_width']} "
             f"d={inputs['data_parallel_width']} v={inputs['virtual_stages']}"
             + (f" e={inputs['expert_parallel_width']}" if inputs['expert_parallel_width'] > 1 else "")
             + f", micro-batch {inputs['micro_batch_size']}, "
             f"batch {inputs['global_batch_size']}, recompute={inputs['recompute']}")
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    verdict = "fits" if record["feasible"] else f"does not fit: {record['reason']}"
    table.add_row("time per batch", f"{record['time_per_batch_s']:.4g} s ({verdict})")
    for name, seconds in record["breakdown_s"].items():
        table.add_row(f"  {name.replace('_', ' ')}", f"{seconds:.4g} s")
    table.add_row("tokens per second", f"{record['tokens_per_s']:,.0f}")
    table.add_row("model FLOPs utilisation", f"{record['mfu']:.1%}")
    table.add_row("hardware TFLOP/s per device", f"{record['hardware_flops_per_s_per_device'] / 1e12:.1f}")
    memory = record["memory_bytes"]
    table.add_row(f"memory, stage {record['most_loaded_stage']} (GiB)",
                  " + ".join(f"{memory[kind] / 2**30:.3g} {kind.replace('_', ' ')}"
                             for kind in ("weights", "gradients", "optimizer_state", "activations"))
                  + f" = {memory['total'] / 2**30:.3g} of {inputs['memory_capacity_bytes'] / 2**30:.3g}")
    show_table(table)


def run(settings: Settings) -> None:
    setup_logging()
    directory = Path(HydraConfig.get().runtime.output_dir)
    record = prediction_record(settings, run_prediction(settings))
    atomic_write(directory / PREDICTION, results.dumps(record))
    report(record)
    show(f"wrote {directory / PREDICTION}")
