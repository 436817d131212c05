"""Reading a calibration set: every field phaze reads checked before any prediction (a file that is
not a list of runs, a run without one of its sections, a field with a value it cannot take)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


from phaze_common.checks import InputError
from solver.training_step import RECOMPUTE_MODES


@dataclass(frozen=True)
class Kind:
    """What a run's field holds when stated: `allowed` in words, `accepts` the test."""

    allowed: str
    accepts: Callable[[object], bool]


def _positive_integer(value: object) -> bool:
    return type(value) is int and value > 0


def _positive_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


COUNT = Kind("a positive integer", _positive_integer)
SECONDS = Kind("a positive finite number of seconds", _positive_number)
TOKENS = Kind("a positive finite number of tokens/s", _positive_number)
TEXT = Kind("a string", lambda value: isinstance(value, str))
FLAG = Kind("true or false", lambda value: isinstance(value, bool))
RECOMPUTE = Kind(f"one of {', '.join(map(json.dumps, RECOMPUTE_MODES))}", lambda value: value in RECOMPUTE_MODES)
ANY = Kind("any value", lambda value: True)

#: The fields of a run phaze reads, by section, and what each holds. A field may be absent or null
#: (not stated: the run is left out when phaze needs it) except the REQUIRED ones; fields not listed
#: here (sources, notes, other figures) are not read.
RUN_FIELDS: dict[str, dict[str, Kind]] = {
    "model": {"name": TEXT, "architecture": TEXT, "hidden_size": COUNT, "num_layers": COUNT,
              "num_attention_heads": COUNT, "num_kv_heads": COUNT, "head_dim": COUNT, "ffn_hidden_size": COUNT,
              "vocab_size": COUNT, "seq_length_tokens": COUNT, "moe_num_experts": COUNT, "moe_top_k": COUNT,
              "moe_ffn_hidden_size": COUNT},
    "hardware": {"device_type": TEXT, "num_devices": COUNT},
    "parallelism": {"tensor_parallel": COUNT, "pipeline_parallel": COUNT, "data_parallel": COUNT,
                    "context_parallel": COUNT, "sequence_parallel": FLAG, "virtual_pipeline_chunks_per_device": COUNT,
                    "expert_parallel": COUNT, "expert_tensor_parallel": COUNT, "fsdp_parallel": ANY},
    "batch": {"micro_batch_size_seqs": COUNT, "global_batch_size_seqs": COUNT},
    "training": {"precision": TEXT, "activation_recompute": RECOMPUTE, "optimizer_sharding": TEXT, "framework": TEXT,
                 "other_settings": TEXT},
    "measured": {"seconds_per_iteration": SECONDS, "seconds_per_iteration_derived": SECONDS,
                 "tokens_per_sec_per_device": TOKENS, "tokens_per_sec_total": TOKENS,
                 "tflop_per_s_per_device": Kind("a positive finite number of TFLOP/s", _positive_number)},
}
#: Top-level fields of a run phaze reads besides its sections.
RUN_TOP_FIELDS: dict[str, Kind] = {"run_id": Kind("a non-empty string", lambda value: isinstance(value, str)
                                                   and value != ""), "source_group": TEXT}
#: The fields every run states.
REQUIRED = {"run_id", "hardware.device_type", "hardware.num_devices"}


def shown(value: object) -> str:
    """A value as the message quotes it, in JSON's words (null, true, NaN), short."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def field_error(name: str, value: object, kind: Kind) -> str | None:
    """Why a stated field's value is not of its kind, or None; a required field must be stated."""
    if value is None and name not in REQUIRED:
        return None
    if value is None or not kind.accepts(value):
        return f"{name}: must be {kind.allowed}, got {shown(value)}"
    return None


def layout_error(run: dict) -> str | None:
    """Why the run's t, p, d and context parallel width do not make its devices, or its d replicas of
    micro-batches its global batch, or None. Checked where t and p are stated and FSDP is not (an
    FSDP width counts devices its framework's way: MaxText's multiplies t·p·d, Megatron's lies within
    d); where d is not stated, t·p·cp must divide the devices (d is then devices / (t·p·cp))."""
    parallel, batch, devices = run["parallelism"], run["batch"], run["hardware"]["num_devices"]
    t, p, d = parallel.get("tensor_parallel"), parallel.get("pipeline_parallel"), parallel.get("data_parallel")
    context = parallel.get("context_parallel") or 1
    if t is None or p is None or parallel.get("fsdp_parallel") is not None:
        return None
    names, widths = (["t", "p", "d"], [t, p, d]) if d is not None else (["t", "p"], [t, p])
    if context > 1:
        names, widths = names + ["cp"], widths + [context]
    product = math.prod(widths)
    formula = f"{'·'.join(names)} = {'·'.join(map(str, widths))} = {product}"
    if d is not None and product != devices:
        return f"parallelism: {formula} must equal hardware.num_devices, {devices}"
    if d is None and devices % product:
        return f"parallelism: {formula} must divide hardware.num_devices, {devices} (d = devices / {'·'.join(names)})"
    degree = d if d is not None else devices // product
    micro, size = batch.get("micro_batch_size_seqs"), batch.get("global_batch_size_seqs")
    if micro is not None and size is not None and size % (micro * degree):
        return (f"batch.global_batch_size_seqs: {size} must be a multiple of micro_batch_size_seqs × d = "
                f"{micro}·{degree} = {micro * degree}")
    return None


def run_error(run: object) -> str | None:
    """Why a run cannot be read, naming the field and what it allows, or None. Every field phaze reads
    is checked here, before any prediction."""
    if not isinstance(run, dict):
        return f"must be an object with {', '.join(['run_id', *RUN_FIELDS])}, got {shown(run)}"
    if "run_id" not in run:
        return f"run_id: missing; a run has {', '.join(['run_id', *RUN_FIELDS])}"
    for name, kind in RUN_TOP_FIELDS.items():
        if problem := field_error(name, run.get(name), kind):
            return problem
    for section, fields in RUN_FIELDS.items():
        if section not in run:
            return f"{section}: missing; a run has {', '.join(['run_id', *RUN_FIELDS])}"
        if not isinstance(run[section], dict):
            return f"{section}: must be an object, got {shown(run[section])}"
        for name, kind in fields.items():
            if f"{section}.{name}" in REQUIRED and name not in run[section]:
                return f"{section}.{name}: missing; must be {kind.allowed}"
            if problem := field_error(f"{section}.{name}", run[section].get(name), kind):
                return problem
    return layout_error(run)


def stated(run: dict) -> dict:
    """A checked run with every field phaze reads present: an absent one is null (not stated)."""
    return {**run, **{name: run.get(name) for name in RUN_TOP_FIELDS},
            **{section: {**dict.fromkeys(fields), **run[section]} for section, fields in RUN_FIELDS.items()}}


def checked_runs(data: object, name: str) -> list[dict]:
    """The runs of a calibration file's JSON, every field phaze reads checked (InputError naming the
    run and the field otherwise)."""
    if not isinstance(data, list):
        kind = {dict: "an object", str: "a string", bool: "true or false", type(None): "null"}.get(
            type(data), "a number")
        raise InputError(f"FILE: {name}: must be a JSON list of runs, got {kind}")
    if not data:
        raise InputError(f"FILE: {name}: the list of runs is empty")
    seen: dict[str, int] = {}
    for index, run in enumerate(data):
        named = isinstance(run, dict) and isinstance(run.get("run_id"), str) and run["run_id"]
        where = f"run {run['run_id']!r}" if named else f"runs[{index}]"
        if problem := run_error(run):
            raise InputError(f"FILE: {where}: {problem}")
        if run["run_id"] in seen:
            raise InputError(f"FILE: {where}: run_id: given twice, by runs[{seen[run['run_id']]}] and runs[{index}]; "
                             "run ids must be unique")
        seen[run["run_id"]] = index
    return [stated(run) for run in data]


def read_runs(name: str) -> list[dict]:
    """The checked runs of the calibration file `name` (InputError naming FILE otherwise)."""
    path = Path(name)
    try:
        data = json.loads(path.read_bytes())  # bytes: UTF-8 (with or without a BOM), UTF-16 or UTF-32
    except FileNotFoundError:
        raise InputError(f"FILE: no such file: {name}") from None
    except IsADirectoryError:
        raise InputError(f"FILE: {name} is a folder, not a file") from None
    except OSError as error:
        raise InputError(f"FILE: cannot read {name}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise InputError(f"FILE: {name}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise InputError(f"FILE: {name}: not JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise InputError(f"FILE: {name}: JSON nested too deep to read (arrays or objects more than about "
                         f"{sys.getrecursionlimit()} levels deep)") from None
    except MemoryError:
        raise InputError(f"FILE: {name}: too large to read into memory") from None
    except ValueError as error:  # json's other refusals (an integer of more than 4,300 digits)
        raise InputError(f"FILE: {name}: not JSON phaze can read ({' '.join(str(error).split())})") from None
    return checked_runs(data, name)
