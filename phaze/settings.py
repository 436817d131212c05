"""Validated run settings: the hydra config turned into typed values, or a one-line ConfigError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from estimator import AcceleratorConfig, candidate_space, named_accelerator
from graph_extract import MODELS, ModelSpec, get_spec, valid_tensor_parallel_widths
from graph_extract.extraction import check_request

MODES = ("extract_graph", "prepopulate_estimates", "run_solver")
GIB = 1024**3


class ConfigError(ValueError):
    """Wrong user input; the message is one line that names the field and what is allowed."""


@dataclass(frozen=True)
class Settings:
    mode: str
    spec: ModelSpec
    micro_batch_size: int
    sequence_length: int
    tensor_parallel_widths: tuple[int, ...]
    hbm_size_bytes: int
    force_reextract: bool
    cache_dir: Path
    accelerator: AcceleratorConfig  # the template: technology, and the area budget unless area_budget
    area_budget: float | None  # µm²


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
    return value


def model_name_error(name: object) -> ConfigError | None:
    """The error for an unknown model name, or None."""
    if name in MODELS:
        return None
    return ConfigError(f"model: unknown {name!r}; valid: {', '.join(MODELS)}")


def settings_from_config(cfg: DictConfig) -> Settings:
    """Check every user-facing key of the composed config."""
    if cfg.mode not in MODES:
        raise ConfigError(f"mode: unknown {cfg.mode!r}; valid: {', '.join(MODES)}")
    error = model_name_error(cfg.model.name)
    if error:
        raise error
    overrides = OmegaConf.to_container(cfg.model.overrides) if "overrides" in cfg.model else {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"model.overrides: must be a mapping of ModelSpec fields, got {overrides!r}")
    try:
        spec = get_spec(cfg.model.name).with_overrides(**overrides)
    except (TypeError, ValueError) as problem:
        raise ConfigError(f"model.overrides: {problem}") from None
    micro_batch_size = _positive_int("micro_batch_size", cfg.micro_batch_size)
    sequence_length = spec.default_sequence_length if cfg.sequence_length is None else cfg.sequence_length
    maximum = _positive_int("max_tensor_parallel_width", cfg.max_tensor_parallel_width)
    if cfg.tensor_parallel_width is None:
        widths = valid_tensor_parallel_widths(spec, maximum)
    else:
        width = cfg.tensor_parallel_width
        if isinstance(width, int) and not isinstance(width, bool) and width > maximum:
            raise ConfigError(f"tensor_parallel_width: {width} exceeds max_tensor_parallel_width={maximum}")
        widths = (width,)
    try:
        for width in widths:
            check_request(spec, micro_batch_size, sequence_length, width)
    except ValueError as problem:
        raise ConfigError(str(problem)) from None
    hbm_size = cfg.hbm_size
    if isinstance(hbm_size, bool) or not isinstance(hbm_size, (int, float)) or hbm_size <= 0:
        raise ConfigError(f"hbm_size: must be a positive number of GiB, got {hbm_size!r}")
    if not isinstance(cfg.force_reextract, bool):
        raise ConfigError(f"force_reextract: must be true or false, got {cfg.force_reextract!r}")
    accelerator_fields = OmegaConf.to_container(cfg.accelerator)
    preset = accelerator_fields.pop("preset")
    try:
        accelerator = named_accelerator(preset, **{k: v for k, v in accelerator_fields.items() if v is not None})
    except (TypeError, ValueError) as problem:
        raise ConfigError(str(problem)) from None
    area_budget = cfg.area_budget
    if area_budget is not None and (isinstance(area_budget, bool) or not isinstance(area_budget, (int, float))
                                    or area_budget <= 0):
        raise ConfigError(f"area_budget: must be a positive area in µm² or null, got {area_budget!r}")
    try:
        candidate_space(accelerator, area_budget)
    except ValueError as problem:
        raise ConfigError(str(problem)) from None
    return Settings(
        mode=cfg.mode,
        spec=spec,
        micro_batch_size=micro_batch_size,
        sequence_length=sequence_length,
        tensor_parallel_widths=widths,
        hbm_size_bytes=int(hbm_size * GIB),
        force_reextract=cfg.force_reextract,
        cache_dir=Path(cfg.cache_dir),
        accelerator=accelerator,
        area_budget=None if area_budget is None else float(area_budget),
    )
