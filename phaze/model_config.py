"""The model of a run from its configuration: a zoo model, or `model=custom` with a model file or a
factory (phaze.custom_model), with `model.overrides` on top, and its fixed Megatron baseline.
ModelSpec checks every value itself; here the errors get the place they came from (the override's
key, the file and its own key)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from phaze_common.checks import InputError, is_integer, positive_integer
from graph_extract import ModelSpec, get_spec
from graph_extract.zoo import is_factory_reference
from phaze.config_keys import CUSTOM_MODEL, MODEL_CONFIG_ONLY_CUSTOM, model_name_error, unknown_key_error
from phaze.plan_settings import check_plan_file, exportable
from phaze.custom_model import NAME_PATTERN, built_by_transformers, folder_error, read_factory, read_model_file
from solver.layout import Layout, MegatronSplit

#: The ModelSpec fields a factory model (`model.config=MODULE:FUNCTION`) may override: the others are its module's.
FACTORY_OVERRIDES = ("name", "num_layers", "default_sequence_length")
#: The fields of `model.fixed_megatron`, the fixed Megatron-style baseline (p, t, d).
FIXED_MEGATRON_FIELDS = ("pipeline_parallel_width", "tensor_parallel_width", "data_parallel_width")
#: What a published layout may add (Megatron's --num-layers-per-virtual-pipeline-stage as v,
#: --expert-model-parallel-size, --expert-tensor-parallel-size, the split flags of `MegatronSplit`).
FIXED_MEGATRON_OPTIONAL = ("virtual_stages", "expert_parallel_width", "expert_tensor_parallel_width",
                           "account_for_embedding_and_loss", "first_stage_blocks", "last_stage_blocks")
#: Largest width of the fixed baseline: a million devices.
MAX_WIDTH = 1_048_576


def checked_spec(base: ModelSpec | None, fields: Mapping, where: str,
                 key: Callable[[str], str] = lambda field: field) -> ModelSpec:
    """`base` with `fields` set (no base: a spec of `fields` alone), checked by ModelSpec. Errors start
    with `where` and name a field by `key(field)` (a config.json's own key)."""
    known = {field.name for field in dataclasses.fields(ModelSpec)}
    for name in fields:
        if name not in known:
            raise unknown_key_error(f"{where}{name}", known)
    if fields.get("factory") is not None:
        raise InputError(f"{where}factory: set by model=custom model.config=MODULE:FUNCTION only")
    try:
        return ModelSpec(**fields) if base is None else base.with_overrides(**fields)
    except TypeError as problem:  # a required field missing from a file
        raise InputError(f"{where}{problem}") from None
    except ValueError as problem:  # ModelSpec's own checks start with the field (num_kv_heads: ...)
        field, _, rest = str(problem).partition(": ")
        raise InputError(f"{where}{key(field)}: {rest}") from None


def custom_spec(model: Mapping) -> tuple[ModelSpec, int | None]:
    """The spec of `model=custom`: the file or factory `model.config` names (phaze.custom_model), and
    the file's sliding attention window [tokens] (None: full attention)."""
    reference = model.get("config")
    if reference is None or reference == "???":  # hydra's mark of a value not given
        raise InputError("model.config: missing; model=custom reads the model from a file: model.config=PATH "
                         "(a ModelSpec .yaml or a Hugging Face config.json), or model.config=MODULE:FUNCTION (a Python "
                         "nn.Module factory)")
    if not isinstance(reference, str) or not reference:
        raise InputError(f"model.config: must be the path of a .yaml or config.json file or a MODULE:FUNCTION, got "
                         f"{reference!r}")
    path = Path(reference)
    where = f"model.config: {path}: "
    if not is_factory_reference(reference) and path.is_dir():
        raise InputError(folder_error(path))
    try:
        if is_factory_reference(reference) or built_by_transformers(path):
            return read_factory(reference), None
        model_file = read_model_file(path)
    except (ValueError, OSError) as problem:
        raise InputError(f"{where}{problem}") from None
    name = model_file.fields.get("name")
    if isinstance(name, str) and not NAME_PATTERN.fullmatch(name):
        raise InputError(f"{where}name: {name!r} names files; allowed: letters, digits, '.', '_', '-'")
    return checked_spec(None, model_file.fields, where, model_file.key), model_file.attention_window


def model_spec(model: Mapping, sequence_length: object = None) -> ModelSpec:
    """The spec of the `model` node: a zoo model or a custom one, with `overrides` applied; InputError
    when the run's sequence (`sequence_length`, None: the spec's default) is longer than the sliding
    attention window of the model's file, an attention phaze does not price."""
    if error := model_name_error(model.get("name")):
        raise error
    if model["name"] != CUSTOM_MODEL and "config" in model:
        raise InputError(MODEL_CONFIG_ONLY_CUSTOM)
    overrides = model.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise InputError(f"model.overrides: must be a mapping of ModelSpec fields, got {overrides!r}")
    base, window = custom_spec(model) if model["name"] == CUSTOM_MODEL else (get_spec(model["name"]), None)
    if model.get("plan") is not None:
        base = base.with_overrides(plan=_plan_file(model["plan"], base))
    if base.factory is not None and (fixed := sorted(set(overrides) - set(FACTORY_OVERRIDES))):
        raise InputError(f"model.overrides.{fixed[0]}: a factory's model has its module's shape; allowed: "
                         f"{', '.join(FACTORY_OVERRIDES)}")
    spec = checked_spec(base, overrides, "model.overrides.")
    sequence = spec.default_sequence_length if sequence_length is None else sequence_length
    if window is not None and is_integer(sequence) and sequence > window:
        raise InputError(f"model.config: {Path(model['config'])}: sliding_window: {window:,} tokens, shorter than the "
                         f"{sequence:,}-token sequence, is a windowed attention phaze does not price (it prices full "
                         f"attention over the sequence); allowed: sequence_length at most {window}")
    return spec


def _plan_file(plan: object, spec: ModelSpec) -> str:
    """`model.plan`, checked: a readable YAML plan of a model phaze splits by a plan."""
    if not exportable(spec):
        raise InputError("model.plan: only for a model phaze splits by a plan (the zoo's, model=custom with a factory "
                         "that takes no tensor_parallel_width, or a config.json transformers builds); allowed: null")
    return check_plan_file("model.plan", plan, ("null",))


def fixed_megatron(model: Mapping, devices: int) -> tuple[Layout | None, MegatronSplit]:
    """The model's fixed Megatron baseline as a layout on `devices` devices (None: none) and how it
    splits the blocks: its (t, p) with the data-parallel width that fills the cluster (its file's d
    when t·p·d is the cluster's devices: the published layouts are for 1,024), so that the search
    and the baseline use the same devices; a published layout's v, e, τ and split when given
    (`FIXED_MEGATRON_OPTIONAL`)."""
    fixed = model.get("fixed_megatron")
    if fixed is None:
        return None, MegatronSplit()
    unknown = sorted(set(fixed) - set(FIXED_MEGATRON_FIELDS) - set(FIXED_MEGATRON_OPTIONAL))
    if unknown:
        raise InputError(f"model.fixed_megatron.{unknown[0]}: unknown key; allowed: "
                         f"{', '.join((*FIXED_MEGATRON_FIELDS, *FIXED_MEGATRON_OPTIONAL))}")
    p, t, d = (positive_integer(f"model.fixed_megatron.{name}", fixed.get(name), MAX_WIDTH)
               for name in FIXED_MEGATRON_FIELDS)
    given = {name: positive_integer(f"model.fixed_megatron.{name}", fixed[name], MAX_WIDTH)
             for name in ("virtual_stages", "expert_parallel_width", "expert_tensor_parallel_width")
             if fixed.get(name) is not None}
    ends = fixed.get("account_for_embedding_and_loss", False)
    if not isinstance(ends, bool):
        raise InputError(f"model.fixed_megatron.account_for_embedding_and_loss: {ends!r}; allowed: true, false")
    try:
        split = MegatronSplit(ends, fixed.get("first_stage_blocks"), fixed.get("last_stage_blocks"))
    except InputError as error:
        raise InputError(f"model.fixed_megatron.{error}") from None
    return Layout(t, p, d if t * p * d == devices or t * p > devices else devices // (t * p), **given), split
