"""`phaze validate FILE`: phaze's predictions against published measured training runs.

FILE is a calibration set (arch_configs/calibration/runs.json). A run is predicted when it is a
dense model on A100 or H100 GPUs whose configuration is given: the model's shape, t, p, d, the
micro-batch and batch sizes, the recomputation, 16-bit precision, a measured time per iteration,
and a parallelism phaze models (not ZeRO-3 or FSDP). Every other run is listed with why it is left
out. The model is a Megatron GPT of the run's shape; the cluster is DGX A100 or DGX H100 nodes; the
gradient sync overlaps the backward pass where the run says so (PyTorch DDP, --overlap-grad-reduce).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from estimator.known import KnownChip, known_chip
from graph_extract import extract, get_spec
from phaze.settings import system_cluster
from solver.job import Job
from solver.predict import Prediction, chip_costs, predict
from solver.training_step import Cluster, Training

GIB = 2**30
#: device type in the calibration set -> (known chip, cluster preset)
HARDWARE = {"A100": ("a100_80gb", "dgx_a100"), "H100": ("h100_sxm", "dgx_h100")}


@dataclass(frozen=True)
class Case:
    """A calibration run phaze predicts: its inputs and its measured seconds per iteration."""

    run_id: str
    chip: str
    system: str
    overrides: dict
    sequence_length: int
    devices: int
    width: int
    stages: int
    degree: int
    virtual_stages: int
    micro_batch_size: int
    global_batch_size: int
    recompute: str
    sequence_parallel: bool
    sharded_optimizer: bool
    overlap_grad_reduce: bool
    measured: float


def case(run: dict) -> Case | str:
    """The run as phaze predicts it, or why it is left out."""
    model, parallel, batch = run["model"], run["parallelism"], run["batch"]
    training, measured, hardware = run["training"], run["measured"], run["hardware"]
    kind = next((name for name in HARDWARE if name in hardware["device_type"]), None)
    if kind is None:
        return f"hardware {hardware['device_type']}: not an A100 or H100"
    if model["moe_num_experts"] or "MoE" in (model["architecture"] or ""):
        return "mixture of experts (a later issue)"
    precision = training["precision"] or ""
    if "FP8" in precision.upper():
        return "FP8 precision (phaze prices 16-bit training)"
    sharding = training["optimizer_sharding"] or ""
    if "ZeRO-3" in sharding or sharding.startswith("FSDP") or "FSDP on" in sharding:
        return "fully sharded weights (ZeRO-3 / FSDP) are not modelled"
    needed = {"model.num_layers": model["num_layers"], "model.hidden_size": model["hidden_size"],
              "model.num_attention_heads": model["num_attention_heads"], "model.seq_length_tokens": model["seq_length_tokens"],
              "model.vocab_size": model["vocab_size"], "parallelism.tensor_parallel": parallel["tensor_parallel"],
              "parallelism.pipeline_parallel": parallel["pipeline_parallel"],
              "parallelism.data_parallel": parallel["data_parallel"],
              "batch.micro_batch_size_seqs": batch["micro_batch_size_seqs"],
              "batch.global_batch_size_seqs": batch["global_batch_size_seqs"],
              "training.activation_recompute": training["activation_recompute"], "training.precision": training["precision"]}
    missing = [name for name, value in needed.items() if value is None]
    if missing:
        return f"not stated: {', '.join(missing)}"
    seconds = measured["seconds_per_iteration"] or measured["seconds_per_iteration_derived"]
    if seconds is None:
        return "no time per iteration measured or derived"
    if (parallel["context_parallel"] or 1) > 1:
        return "context parallelism is not modelled"
    sequence = model["seq_length_tokens"]
    chip, system = HARDWARE[kind]
    return Case(
        run_id=run["run_id"], chip=chip, system=system,
        overrides={"num_layers": model["num_layers"], "hidden_size": model["hidden_size"],
                   "num_heads": model["num_attention_heads"],
                   "ffn_hidden_size": model["ffn_hidden_size"] or 4 * model["hidden_size"],
                   "vocab_size": model["vocab_size"], "max_position_embeddings": sequence},
        sequence_length=sequence, devices=hardware["num_devices"], width=parallel["tensor_parallel"],
        stages=parallel["pipeline_parallel"], degree=parallel["data_parallel"],
        virtual_stages=parallel["virtual_pipeline_chunks_per_device"] or 1,
        micro_batch_size=batch["micro_batch_size_seqs"], global_batch_size=batch["global_batch_size_seqs"],
        recompute=training["activation_recompute"], sequence_parallel=bool(parallel["sequence_parallel"]),
        sharded_optimizer="distributed" in sharding.lower(),
        overlap_grad_reduce=any(flag in (training["other_settings"] or "")
                                for flag in ("DDP impl=torch", "--overlap-grad-reduce")),
        measured=float(seconds),
    )


def prediction(item: Case, cache_dir: Path, chip: KnownChip | None = None, cluster: Cluster | None = None
               ) -> Prediction:
    """The run predicted by phaze: a Megatron GPT of its shape on its cluster (by default the chip
    and cluster presets; others to calibrate them)."""
    spec = get_spec("megatrongpt3").with_overrides(**item.overrides)
    cluster = cluster or system_cluster(item.system, item.devices)
    job = Job(spec, item.sequence_length, item.micro_batch_size, item.global_batch_size, (item.width,), cluster,
              (80 * GIB,), Training("adam", item.sharded_optimizer, item.sequence_parallel, item.overlap_grad_reduce),
              (item.recompute,))
    graphs = extract(spec, item.micro_batch_size, item.sequence_length, item.width, cache_dir=cache_dir)
    chip = chip or known_chip(item.chip)
    costs = chip_costs(job, {item.width: graphs}, chip, cache_dir)
    return predict(job, graphs, costs, chip, item.stages, item.degree, item.virtual_stages)


def validate(runs: list[dict], cache_dir: Path) -> tuple[list[tuple[Case, Prediction]], list[tuple[str, str]]]:
    """(predicted cases with their predictions, (run id, why left out))."""
    predicted, left_out = [], []
    for run in runs:
        found = case(run)
        if isinstance(found, str):
            left_out.append((run["run_id"], found))
        else:
            predicted.append((found, prediction(found, cache_dir)))
    return predicted, left_out


def main(arguments: list[str]) -> int:
    if len(arguments) != 1:
        print("usage: phaze validate FILE   (a calibration set of measured runs, e.g. "
              "arch_configs/calibration/runs.json)", file=sys.stderr)
        return 2
    if not Path(arguments[0]).is_file():
        print(f"phaze: error: FILE: no such file: {arguments[0]}", file=sys.stderr)
        return 2
    try:
        runs = json.loads(Path(arguments[0]).read_text())
        predicted, left_out = validate(runs, Path("outputs/cache"))
    except (ValueError, KeyError, TypeError) as problem:
        print(f"phaze: error: FILE: {problem}", file=sys.stderr)
        return 2
    table = Table(title=f"phaze validate {arguments[0]}")
    for header in ("run", "chip", "devices", "t p d v", "mbs", "batch", "recompute", "measured s", "predicted s",
                   "error"):
        table.add_column(header, justify="left" if header in ("run", "chip", "recompute") else "right")
    errors = []
    for item, result in predicted:
        error = result.step.time_per_batch / item.measured - 1
        errors.append(abs(error))
        table.add_row(item.run_id, item.chip, str(item.devices),
                      f"{item.width} {item.stages} {item.degree} {item.virtual_stages}", str(item.micro_batch_size),
                      str(item.global_batch_size), item.recompute, f"{item.measured:.4g}",
                      f"{result.step.time_per_batch:.4g}", f"{error:+.1%}")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    if errors:
        console.print(f"{len(errors)} runs: mean absolute error {sum(errors) / len(errors):.1%}, "
                      f"max {max(errors):.1%}")
    reasons: dict[str, list[str]] = {}
    for run, why in left_out:
        reasons.setdefault(why, []).append(run)
    console.print(f"left out ({len(left_out)}):")
    for why, names in reasons.items():
        console.print(f"  {why}: {len(names)} ({', '.join(names) if len(names) <= 4 else names[0] + ', ...'})")
    return 0
