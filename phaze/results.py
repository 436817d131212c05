"""Result records of a run_solver run: the evaluation table, best.json, and how to read them back."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd

from estimator import AcceleratorConfig
from graph_extract.serialize import atomic_write
from solver.codesign import CandidateOutcome
from solver.evaluate import Evaluation

GIB = 1024**3


def gibibytes(num_bytes: int) -> float:
    """HBM size in GiB as the user wrote it (the byte count was rounded to a whole number)."""
    return round(num_bytes / GIB, 9)


TABLE = "results"  # results.parquet and results.csv
BEST = "best.json"


def accelerator_record(accelerator: AcceleratorConfig, index: int) -> dict:
    return {
        "candidate_index": index,
        "num_tc": accelerator.num_tc,
        "num_vc": accelerator.num_vc,
        "tc_width": accelerator.tc_width,
        "tc_depth": accelerator.tc_depth,
        "vc_width": accelerator.vc_width,
        "glb_bytes": accelerator.glb_bytes,
        "area": accelerator.area,
    }


def placement_record(evaluation: Evaluation) -> dict:
    result = evaluation.placement
    return {
        "pipeline_stages": len(result.stages),
        "tensor_parallel_width": result.tensor_parallel_width,
        "data_parallel_degree": result.data_parallel_degree,
        "stages": [
            {"layers": list(stage.layer_ids), "devices": stage.devices, "memory_bytes": stage.memory_bytes}
            for stage in result.stages
        ],
    }


def evaluation_row(outcome: CandidateOutcome, micro_batch_size: int, hbm_bytes: int, evaluation: Evaluation) -> dict:
    """One row of the results table: an (architecture, micro-batch, HBM, recompute) evaluation."""
    result = evaluation.placement
    feasible = evaluation.feasible
    return {
        **accelerator_record(outcome.accelerator, outcome.index),
        "micro_batch_size": micro_batch_size,
        "hbm_size_gib": gibibytes(hbm_bytes),
        "activation_recomputation": evaluation.activation_recomputation,
        "feasible": feasible,
        "throughput": evaluation.throughput,
        "time_per_batch_s": result.time_per_batch if feasible else math.nan,
        "pipeline_stages": len(result.stages) if feasible else 0,
        "tensor_parallel_width": result.tensor_parallel_width or 0,
        "data_parallel_degree": result.data_parallel_degree or 0,
        "energy_per_batch_j": evaluation.energy_per_batch if feasible else math.nan,
        "tc_utilisation": evaluation.tc_utilisation,
        "vc_utilisation": evaluation.vc_utilisation,
        "tc_peak_utilisation": evaluation.tc_peak,
        "vc_peak_utilisation": evaluation.vc_peak,
        "schedule_gap": evaluation.schedule_gap,
    }


def best_record(outcome: CandidateOutcome, micro_batch_size: int, hbm_bytes: int) -> dict:
    """The best evaluation of an outcome for one setting, as best.json states it."""
    evaluation = outcome.best(hbm_bytes)
    return {
        "micro_batch_size": micro_batch_size,
        "hbm_size_gib": gibibytes(hbm_bytes),
        "feasible": evaluation.feasible,
        "activation_recomputation": evaluation.activation_recomputation,
        "accelerator": accelerator_record(outcome.accelerator, outcome.index),
        "placement": placement_record(evaluation),
        "throughput": evaluation.throughput,
        "time_per_batch_s": evaluation.placement.time_per_batch if evaluation.feasible else None,
        "energy_per_batch_j": evaluation.energy_per_batch if evaluation.feasible else None,
        "tc_utilisation": evaluation.tc_utilisation,
        "vc_utilisation": evaluation.vc_utilisation,
    }


def write_frame(directory: Path, name: str, frame: pd.DataFrame) -> None:
    """NAME.csv and NAME.parquet, each written to a temporary file and renamed."""
    atomic_write(directory / f"{name}.csv", frame.to_csv(index=False))
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write(directory / f"{name}.parquet", buffer.getvalue())


def write_table(directory: Path, rows: list[dict]) -> pd.DataFrame:
    """The evaluation table: results.parquet and results.csv."""
    frame = pd.DataFrame(rows)
    write_frame(directory, TABLE, frame)
    return frame


def write_best(directory: Path, record: dict) -> None:
    atomic_write(directory / BEST, json.dumps(record, indent=2, allow_nan=False) + "\n")


def read_run(directory: Path) -> tuple[dict, pd.DataFrame]:
    """best.json and the results table of a run directory."""
    best = json.loads((directory / BEST).read_text())
    table = directory / f"{TABLE}.parquet"
    return best, pd.read_parquet(table) if table.exists() else pd.DataFrame()
