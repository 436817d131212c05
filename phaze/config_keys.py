"""The keys of phaze's configuration: which exist (the default composition and any ModelSpec field under
model.overrides), and the one-line error for a key that does not, with the closest valid key as a
hint. The values are checked by phaze.settings."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from pathlib import Path

from phaze_common.checks import InputError
from graph_extract import MODELS, ModelSpec
from phaze_hardware import SYSTEMS
from phaze_hardware.chips import is_path

#: The model group option of a user's model file (`model=custom model.config=PATH`).
CUSTOM_MODEL = "custom"
#: The error of `model.config` set with a zoo model.
MODEL_CONFIG_ONLY_CUSTOM = (f"model.config: only with model={CUSTOM_MODEL}; a zoo model's hyper-parameters are "
                            "graph_extract/zoo.py's (change them with +model.overrides.<field>=...)")
#: The options of the `system` group: the hardware's systems and phaze's own presets (phaze/conf/system/).
SYSTEM_OPTIONS = tuple(sorted({*SYSTEMS, *(path.stem for path in (Path(__file__).parent / "conf" / "system").glob(
    "*.yaml"))}))


def model_name_error(name: object) -> InputError | None:
    """The error for an unknown model name, or None."""
    if name in MODELS or name == CUSTOM_MODEL:
        return None
    return InputError(f"model: unknown {name!r}; allowed: {', '.join(MODELS)}, {CUSTOM_MODEL} (model.config=PATH)")


#: The system group's option of a system file (phaze/conf/system/file.yaml), and its key.
SYSTEM_FILE = "file"


def system_name_error(name: object) -> InputError | None:
    """The error for an unknown cluster preset (a system file's path is one), or None."""
    if name in SYSTEM_OPTIONS or is_path(name):
        return None
    presets = ", ".join(option for option in SYSTEM_OPTIONS if option != SYSTEM_FILE)
    return InputError(f"system: unknown {name!r}; allowed: {presets} or a system file's path (system=path/to/system.yaml)")


def system_group(name: str) -> tuple[str, str | None]:
    """The system group's option of a `system` value and the system file's path (None for a preset)."""
    return (SYSTEM_FILE, name) if is_path(name) else (name, None)


def system_file_overrides(override: str) -> list[str]:
    """A command line's `system=PATH` (or a sweep of paths, `system=a.yaml,b.yaml`) as hydra's group
    option of a system file and its path (`system=file`, `system.file=PATH`); any other override as
    given. InputError for a sweep mixing paths and presets."""
    key, equals, value = override.partition("=")
    if key != "system" or not equals:
        return [override]
    values = [item.strip().strip("'\"") for item in value.split(",")]
    paths = [is_path(item) for item in values]
    if not any(paths):
        return [override]
    if not all(paths):
        raise InputError(f"system: {value!r} mixes system files and presets; sweep either (give files as paths)")
    return [f"system={SYSTEM_FILE}", f"system.file={value}"]


def unknown_key_error(path: str, allowed: Iterable[str]) -> InputError:
    """The error for a key the config does not have, with the closest of `allowed` as a hint."""
    if path == "model.config":  # a zoo model's group option has no model file
        return InputError(MODEL_CONFIG_ONLY_CUSTOM)
    parent, _, key = path.rpartition(".")
    valid = [name for name in allowed if name != "mode"]  # the mode is the subcommand
    match = difflib.get_close_matches(key, valid, n=1)
    hint = f" did you mean {parent + '.' if parent else ''}{match[0]}?" if match else ""
    return InputError(f"{path}: unknown key;{hint} allowed: {', '.join(valid)}")


def config_schema(default: dict) -> dict:
    """The keys a command line may set: the default composition (a plain container) and any
    ModelSpec field under model.overrides (checked by the settings)."""
    model = {**default.get("model", {}), "overrides": {field.name: None for field in dataclasses.fields(ModelSpec)}}
    return {**default, "model": model}


def _optional(path: str) -> bool:
    """Keys phaze can do without: ModelSpec overrides and the fixed baseline (null or removed: none)."""
    return path.startswith(("model.overrides.", "model.fixed_megatron"))


def config_key_error(config: dict, schema: dict, prefix: str = "") -> InputError | None:
    """The first key of the composed `config` (plain containers) that `schema` (config_schema) lacks,
    a mapping replaced by a value, or a key removed (~key) that phaze needs; None if there is none."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if key not in schema:
            return unknown_key_error(path, schema)
        expected = schema[key]
        if isinstance(expected, dict) and not (value is None and _optional(path)):
            if not isinstance(value, dict):
                return InputError(f"{path}: must be a mapping of {', '.join(expected)}, got {value!r}")
            if error := config_key_error(value, expected, f"{path}."):
                return error
    for key in schema:
        if key not in config and not _optional(f"{prefix}{key}"):
            return InputError(f"{prefix}{key}: missing; phaze reads it: set a value ({prefix}{key}=...) rather than "
                               f"remove it")
    return None


def override_key_error(path: str, schema: dict) -> InputError | None:
    """The error for an override of a dotted `path` that `schema` (config_schema) does not have."""
    node, parts = schema, path.split(".")
    for depth, key in enumerate(parts):
        if not isinstance(node, dict):
            return None  # inside a list or a value: hydra's or the settings' error
        if key not in node:
            return unknown_key_error(".".join(parts[: depth + 1]), node)
        node = node[key]
    return None
