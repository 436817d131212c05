"""Result records of a run_solver run: the evaluation table, best.json, and how to read them back."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import pandas as pd

from phaze_common.files import atomic_write
from phaze_hardware import AcceleratorConfig, KnownChip
from solver import pareto
from solver.search import CandidateOutcome
from solver.evaluate import Evaluation
from solver.layout import Layout
from solver.question import Axes, Question
from solver.training_step import BREAKDOWN_KEYS

GIB = 1024**3
#: The widths of a layout, as best.json's placement names them.
LAYOUT_FIELDS = tuple(field.name for field in dataclasses.fields(Layout))


def gibibytes(num_bytes: int) -> float:
    """HBM size in GiB as the user wrote it (the byte count was rounded to a whole number)."""
    return round(num_bytes / GIB, 9)


TABLE = "results"  # results.parquet and results.csv
BEST = "best.json"


def accelerator_record(accelerator: AcceleratorConfig | KnownChip, index: int) -> dict:
    """A candidate chip's dimensions and area, or a known chip's name and figures."""
    if isinstance(accelerator, KnownChip):
        return {"candidate_index": index, **accelerator.record()}
    return {"candidate_index": index, **accelerator.dimensions(), "area": accelerator.area}


def question_record(question: Question) -> dict:
    """What a result states of the question besides the model: the cluster and how it trains (the
    precision options and the offload and weight dtype written at their defaults too)."""
    return {
        "system": {"name": question.cluster.name, "step_model": question.step_model,
                   "tiers": [tier.to_dict() for tier in question.cluster.tiers]},
        **question.training.record(),
        **question.kernels.record(),
        "fp8_recipe": question.kernels.fp8_recipe,
        "cuda_graphs": question.kernels.cuda_graphs,
        "activation_offload": question.training.activation_offload,
        "weight_dtype": question.training.weight_dtype,
    }


def placement_record(evaluation: Evaluation) -> dict:
    """The placement's layout (every width; none when nothing fits), recomputation and stages."""
    result = evaluation.placement
    widths = dataclasses.asdict(result.layout) if result.layout else dict.fromkeys(LAYOUT_FIELDS)
    return {
        **widths,
        "recompute": result.recompute,
        "data_parallel_sharding": result.data_parallel_sharding,
        "stages": [
            {"layers": list(stage.layer_ids), "devices": stage.devices, "parameters": stage.parameters,
             "memory_bytes": stage.memory}
            for stage in result.stages
        ],
    }


def best_record(outcome: CandidateOutcome, question: Question, axes: Axes, hbm_bytes: int,
                evaluation: Evaluation | None = None) -> dict:
    """An evaluation of an outcome for one setting (its best by default), as best.json states it."""
    evaluation = evaluation or outcome.best(hbm_bytes)
    feasible = evaluation.feasible
    return {
        "micro_batch_size": axes.micro_batch_size,
        "hbm_size_gib": gibibytes(hbm_bytes),
        "memory_capacity_bytes": hbm_bytes,
        **question_record(question),
        "feasible": feasible,
        "accelerator": accelerator_record(outcome.accelerator, outcome.index),
        "placement": placement_record(evaluation),
        "throughput": evaluation.throughput,
        "time_per_batch_s": evaluation.placement.time_per_batch if feasible else None,
        "breakdown_s": dict(evaluation.placement.breakdown) if feasible else None,
        "energy_per_batch_j": evaluation.energy_per_batch if feasible else None,
        "tc_utilisation": evaluation.tc_utilisation,
        "vc_utilisation": evaluation.vc_utilisation,
        "tc_peak_utilisation": evaluation.tc_peak,
        "vc_peak_utilisation": evaluation.vc_peak,
        "schedule_gap": evaluation.schedule_gap,
    }


def flatten(record: dict, prefix: str = "") -> dict:
    """Nested keys joined with "." (lists as JSON text): one row of the results table."""
    row = {}
    for key, value in record.items():
        if isinstance(value, dict):
            row.update(flatten(value, f"{prefix}{key}."))
        else:
            row[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return row


def evaluation_row(outcome: CandidateOutcome, question: Question, axes: Axes, hbm_bytes: int,
                   evaluation: Evaluation) -> dict:
    """One row of the results table: an (architecture, micro-batch, HBM, recompute) evaluation, its
    best.json record flattened (the accelerator's fields without a prefix)."""
    record = best_record(outcome, question, axes, hbm_bytes, evaluation)
    if not evaluation.feasible:
        record.update(time_per_batch_s=math.nan, energy_per_batch_j=math.nan,
                      breakdown_s=dict.fromkeys(BREAKDOWN_KEYS, math.nan))
    accelerator = record.pop("accelerator")
    return {**accelerator, **flatten(record)}


def write_frame(directory: Path, name: str, frame: pd.DataFrame) -> None:
    """NAME.csv and NAME.parquet, each written to a temporary file and renamed."""
    atomic_write(directory / f"{name}.csv", frame.to_csv(index=False))
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write(directory / f"{name}.parquet", buffer.getvalue())


def write_table(directory: Path, rows: list[dict]) -> pd.DataFrame:
    """The evaluation table: results.parquet and results.csv (with its header when no row)."""
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(TABLE_COLUMNS))
    write_frame(directory, TABLE, frame)
    return frame


PARETO = "pareto"  # pareto.parquet and pareto.csv
#: The objectives of the system space's front: maximised, minimised, minimised.
PARETO_OBJECTIVES = {"throughput": True, "power_w": False, "cost_usd": False}


def write_pareto(directory: Path, chips: list[dict]) -> pd.DataFrame:
    """pareto.parquet and .csv: the chips (one row each: its fields, throughput, power_w, cost_usd)
    that no other chip evaluated beats in throughput, peak power and cost at once (feasible ones)."""
    frame = pd.DataFrame(chips)
    if len(frame):
        frame = frame[frame["throughput"] > 0]
    if not len(frame):
        front = pd.DataFrame(columns=list(PARETO_OBJECTIVES))
    else:
        kept = pareto.front([frame[name] for name in PARETO_OBJECTIVES], list(PARETO_OBJECTIVES.values()))
        front = frame.iloc[kept].sort_values("power_w").reset_index(drop=True)
    write_frame(directory, PARETO, front)
    return front


def dumps(record: dict) -> str:
    """JSON of a result file (indented; no NaN or infinity)."""
    return json.dumps(record, indent=2, allow_nan=False) + "\n"


def write_best(directory: Path, record: dict) -> None:
    atomic_write(directory / BEST, dumps(record))


class DamagedRun(ValueError):
    """A file of a run directory that cannot be used (unreadable, truncated, or lacking fields)."""


NUMBER = (int, float)
#: what best.json states of a run, and of each of its settings (of a feasible one, also FEASIBLE_FIELDS)
RUN_FIELDS = {"model": str, "complete": bool, "per_setting": list}
SETTING_FIELDS = {"micro_batch_size": int, "hbm_size_gib": NUMBER, "feasible": bool}
FEASIBLE_FIELDS = {"throughput": NUMBER, "accelerator": dict, "placement": dict, "system": dict}
PLACEMENT_FIELDS = {"pipeline_parallel_width": int, "tensor_parallel_width": int, "data_parallel_width": int,
                    "virtual_stages": int, "recompute": str}
#: columns every non-empty results table has
TABLE_COLUMNS = ("candidate_index", "micro_batch_size", "hbm_size_gib", "feasible", "throughput")


def _require(record: dict, fields: dict, where: str) -> None:
    for key, kind in fields.items():
        if not isinstance(record.get(key), kind):
            names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
            raise DamagedRun(f"{where} has no {key!r} ({names})")


def read_best(directory: Path) -> dict:
    """best.json of a run directory, checked for what a summary of it needs; DamagedRun says why not.

    A failed job's best.json (`"error": "<reason>"`) needs only its error."""
    try:
        best = json.loads((directory / BEST).read_text())
    except OSError as error:
        raise DamagedRun(f"{BEST} cannot be read ({error.strerror})") from error
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedRun(f"{BEST} is truncated or not JSON ({error})") from error
    if not isinstance(best, dict):
        raise DamagedRun(f"{BEST} is not a JSON object")
    if "error" in best:
        _require(best, {"error": str}, BEST)
        return best
    _require(best, RUN_FIELDS, BEST)
    for index, setting in enumerate(best["per_setting"]):
        where = f"{BEST} per_setting[{index}]"
        if not isinstance(setting, dict):
            raise DamagedRun(f"{where} is not a JSON object")
        _require(setting, SETTING_FIELDS, where)
        if setting["feasible"]:
            _require(setting, FEASIBLE_FIELDS, where)
            _require(setting["placement"], PLACEMENT_FIELDS, f"{where} placement")
        baselines = setting.get("baselines", {})
        if not isinstance(baselines, dict) or not all(isinstance(b, dict) for b in baselines.values()):
            raise DamagedRun(f"{where} baselines is not an object of objects")
    return best


def _read_frame(directory: Path, name: str, columns) -> pd.DataFrame:
    """NAME.parquet of a run directory (empty if there is none), with `columns` when not empty;
    DamagedRun if it cannot be read or lacks one."""
    path = directory / f"{name}.parquet"
    if not path.exists():
        return pd.DataFrame()
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise DamagedRun(f"{path.name} cannot be read ({str(error).splitlines()[0]})") from error
    missing = [column for column in columns if column not in frame]
    if len(frame) and missing:
        raise DamagedRun(f"{path.name} has no column {missing[0]!r}")
    return frame


def read_table(directory: Path) -> pd.DataFrame:
    """The results table of a run directory (empty if there is none); DamagedRun if it cannot be read."""
    return _read_frame(directory, TABLE, TABLE_COLUMNS)


def read_pareto(directory: Path) -> pd.DataFrame:
    """The Pareto front of a system-space run (empty if it has none); DamagedRun if it cannot be read."""
    return _read_frame(directory, PARETO, PARETO_OBJECTIVES)


def read_run(directory: Path) -> tuple[dict, pd.DataFrame]:
    """best.json and the results table of a run directory; DamagedRun if either cannot be used."""
    return read_best(directory), read_table(directory)
