"""Validated run settings: the hydra config turned into typed values, or a one-line ConfigError."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from estimator import AcceleratorConfig, accelerator_names, candidate_space, named_accelerator
from estimator.accelerator import DEFAULT_BUDGET
from estimator.known import KNOWN_CHIPS, KnownChip
from graph_extract import MODELS, ModelSpec, get_spec, valid_tensor_parallel_widths
from graph_extract.extraction import check_request
from graph_extract.factory import is_factory_reference
from phaze.custom_model import NAME_PATTERN, folder_error, read_factory, read_model_file
from phaze.results import GIB
from solver.codesign import EXECUTORS, STRATEGIES, ScheduleSettings
from solver.job import STEP_MODELS, Job
from solver.placement import FixedStrategy
from solver.placement.layouts import allowed_virtual_stages
from solver.schedule import BACKENDS, MILP_SOLVERS
from solver.training_step import OPTIMIZERS, RECOMPUTE_MODES, Cluster, Training

MODES = ("extract_graph", "prepopulate_estimates", "run_solver", "predict")
#: HBM per device [GiB] of the template chips (a TPU v4's), when `hbm_size` is null.
TEMPLATE_HBM_GIB = 32
#: The cluster presets of phaze/conf/system/.
SYSTEMS = tuple(sorted(path.stem for path in (Path(__file__).parent / "conf" / "system").glob("*.yaml")))
#: Largest HBM per device [GiB] taken: 1 PiB, far beyond any chip (the largest have hundreds of GiB).
MAX_HBM_GIB = 1_048_576
#: Largest cluster [devices]: a million accelerators, beyond any training cluster built.
MAX_DEVICES = 1_048_576
#: Largest batch [samples] (global or micro-batch).
MAX_BATCH = 16_777_216
#: Largest integer ModelSpec field (layers, widths, heads, vocabulary, positions).
MAX_MODEL_SIZE = 16_777_216
#: Largest worker-process count of `n_jobs`.
MAX_JOBS = 1024
#: Seconds to wait for a Ray cluster's GCS port to take a connection.
RAY_CONNECT_TIMEOUT_S = 5.0
#: Largest time limit of one layer schedule [s]: a day.
MAX_TIME_LIMIT_S = 86_400.0
#: Ranges of the template's technology fields (unit, largest value): 100 GHz, 1 PB/s.
ACCELERATOR_NUMBERS = {"clock_hz": ("Hz", 1e11), "hbm_bandwidth": ("B/s", 1e15)}
#: The package each MILP solver needs (CBC ships with PuLP).
MILP_PACKAGES = {"cbc": "pulp", "highs": "highspy", "gurobi": "gurobipy"}
#: The values a ModelSpec text field takes (see graph_extract.zoo.ModelSpec).
SPEC_CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post"),
    "activation": ("gelu", "gelu_tanh", "relu", "swiglu"),
    "position_embedding": ("learned", "rotary"),
    "head": ("lm", "pooler", "bert_pretraining"),
}
#: ModelSpec integer fields that may be zero.
SPEC_MAY_BE_ZERO = ("position_offset", "token_types")
#: The model group option of a user's model file (`model=custom model.config=PATH`).
CUSTOM_MODEL = "custom"
#: The error of `model.config` set with a zoo model.
MODEL_CONFIG_ONLY_CUSTOM = (f"model.config: only with model={CUSTOM_MODEL}; a zoo model's hyper-parameters are "
                            "graph_extract/zoo.py's (change them with +model.overrides.<field>=...)")
#: The ModelSpec fields a factory model (`model.config=MODULE:FUNCTION`) may override: the others are its module's.
FACTORY_OVERRIDES = ("name", "num_layers", "default_sequence_length")
#: The fields of `model.fixed_megatron`, the fixed Megatron-style baseline (p, t, d).
FIXED_MEGATRON_FIELDS = ("pipeline_stages", "tensor_parallel_width", "data_parallel_degree")


class ConfigError(ValueError):
    """Wrong user input; the message is one line that names the field and what is allowed."""


@dataclass(frozen=True)
class Settings:
    mode: str
    spec: ModelSpec
    micro_batch_sizes: tuple[int, ...]
    sequence_length: int
    tensor_parallel_widths: tuple[int, ...]
    hbm_sizes_gib: tuple[float, ...]
    force_reextract: bool
    cache_dir: Path
    accelerator: AcceleratorConfig  # the template: technology, and the area budget unless area_budget
    area_budget: float | None  # µm²
    search: str
    global_batch_size: int
    system: Cluster
    step_model: str
    training: Training
    recompute: tuple[str, ...]
    virtual_stages: tuple[int, ...] | None
    schedule: ScheduleSettings
    candidate_sample: int | None
    n_jobs: int
    fixed_megatron: FixedStrategy | None
    known_chip: KnownChip | None = None  # a chip that exists: no architecture search
    pipeline_parallel_width: int | None = None  # predict only
    data_parallel_width: int | None = None  # predict only
    expert_parallel_widths: tuple[int, ...] = (1,)  # searched (predict: the one priced)
    executor: str = "local"  # where run_solver evaluates candidates: local processes or Ray actors
    ray_address: str | None = None  # executor=ray: a cluster to join (auto, host:port); None: a private Ray

    @staticmethod
    def hbm_bytes(gib: float) -> int:
        return round(gib * GIB)

    @property
    def devices(self) -> int:
        return self.system.num_devices

    def job(self, micro_batch_size: int) -> Job:
        """The training job of one micro-batch size (every HBM size of the run)."""
        return Job(
            spec=self.spec,
            sequence_length=self.sequence_length,
            micro_batch_size=micro_batch_size,
            global_batch_size=self.global_batch_size,
            tensor_parallel_widths=self.tensor_parallel_widths,
            system=self.system,
            memory_capacities=tuple(self.hbm_bytes(gib) for gib in self.hbm_sizes_gib),
            training=self.training,
            recompute=self.recompute,
            virtual_stages=self.virtual_stages,
            step_model=self.step_model,
            fixed_megatron=self.fixed_megatron,
            expert_parallel_widths=self.expert_parallel_widths,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _amount(value: float) -> str:
    """A limit as people read it: 1,048,576 (a count, seconds) or 1e+15 (a float this large)."""
    return f"{value:g}" if isinstance(value, float) and value >= 1e7 else f"{value:,.0f}"


def _positive_int(name: str, value: object, maximum: int | None = None) -> int:
    if not _is_int(value) or value <= 0 or (maximum is not None and value > maximum):
        limit = "" if maximum is None else f" at most {_amount(maximum)}"
        raise ConfigError(f"{name}: must be a positive integer{limit}, got {value!r}")
    return value


def _is_finite_number(value: object) -> bool:
    """An int or a finite float (not a bool, inf or nan)."""
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _positive_number(name: str, value: object, unit: str, maximum: float | None = None) -> float:
    if not _is_finite_number(value) or value <= 0 or (maximum is not None and value > maximum):
        allowed = "a finite positive number of" if maximum is None else f"a finite number in (0, {_amount(maximum)}]"
        raise ConfigError(f"{name}: must be {allowed} {unit}, got {value!r}")
    return float(value)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name}: unknown {value!r}; valid: {', '.join(allowed)}")
    return value


def _values(name: str, value: object) -> list:
    """A scalar or a list from the config, as a non-empty list."""
    values = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
    if not values:
        raise ConfigError(f"{name}: must be a value or a non-empty list")
    return values


def model_name_error(name: object) -> ConfigError | None:
    """The error for an unknown model name, or None."""
    if name in MODELS or name == CUSTOM_MODEL:
        return None
    return ConfigError(f"model: unknown {name!r}; valid: {', '.join(MODELS)}, {CUSTOM_MODEL} (model.config=PATH)")


def system_name_error(name: object) -> ConfigError | None:
    """The error for an unknown cluster preset, or None."""
    if name in SYSTEMS:
        return None
    return ConfigError(f"system: unknown {name!r}; valid: {', '.join(SYSTEMS)}")


def unknown_key_error(path: str, allowed: Iterable[str]) -> ConfigError:
    """The error for a key the config does not have, with the closest of `allowed` as a hint."""
    if path == "model.config":  # a zoo model's group option has no model file
        return ConfigError(MODEL_CONFIG_ONLY_CUSTOM)
    parent, _, key = path.rpartition(".")
    valid = [name for name in allowed if name != "mode"]  # the mode is the subcommand
    match = difflib.get_close_matches(key, valid, n=1)
    hint = f" did you mean {parent + '.' if parent else ''}{match[0]}?" if match else ""
    return ConfigError(f"{path}: unknown key;{hint} valid: {', '.join(valid)}")


def config_schema(default: dict) -> dict:
    """The keys a command line may set: the default composition (a plain container) and any
    ModelSpec field under model.overrides (checked by the settings)."""
    model = {**default.get("model", {}), "overrides": {field.name: None for field in dataclasses.fields(ModelSpec)}}
    return {**default, "model": model}


def _optional(path: str) -> bool:
    """Keys phaze can do without: ModelSpec overrides and the fixed baseline (null or removed: none)."""
    return path.startswith(("model.overrides.", "model.fixed_megatron"))


def config_key_error(config: dict, schema: dict, prefix: str = "") -> ConfigError | None:
    """The first key of the composed `config` (plain containers) that `schema` (config_schema) lacks,
    a mapping replaced by a value, or a key removed (~key) that phaze needs; None if there is none."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if key not in schema:
            return unknown_key_error(path, schema)
        expected = schema[key]
        if isinstance(expected, dict) and not (value is None and _optional(path)):
            if not isinstance(value, dict):
                return ConfigError(f"{path}: must be a mapping of {', '.join(expected)}, got {value!r}")
            if error := config_key_error(value, expected, f"{path}."):
                return error
    for key in schema:
        if key not in config and not _optional(f"{prefix}{key}"):
            return ConfigError(f"{prefix}{key}: missing; phaze reads it: set a value ({prefix}{key}=...) rather than "
                               f"remove it")
    return None


def override_key_error(path: str, schema: dict) -> ConfigError | None:
    """The error for an override of a dotted `path` that `schema` (config_schema) does not have."""
    node, parts = schema, path.split(".")
    for depth, key in enumerate(parts):
        if not isinstance(node, dict):
            return None  # inside a list or a value: hydra's or the settings' error
        if key not in node:
            return unknown_key_error(".".join(parts[: depth + 1]), node)
        node = node[key]
    return None


def _boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: must be true or false, got {value!r}")
    return value


def system_cluster(name: str, devices: int) -> Cluster:
    """The cluster of a preset of phaze/conf/system/ with `devices` devices."""
    system = OmegaConf.to_container(OmegaConf.load(Path(__file__).parent / "conf" / "system" / f"{name}.yaml"))
    return Cluster.build(name, devices, system["node_size"], system["tiers"])


def _system(cfg: DictConfig, devices: int) -> tuple[Cluster, str]:
    system = OmegaConf.to_container(cfg.system)
    unknown = sorted(set(system) - {"name", "step_model", "node_size", "tiers"})
    if unknown:
        raise ConfigError(f"system: unknown field {unknown[0]!r}; allowed: name, step_model, node_size, tiers")
    step_model = _choice("system.step_model", system.get("step_model", "training_step"), STEP_MODELS)
    node_size = _positive_int("system.node_size", system.get("node_size"))
    tiers = system.get("tiers")
    if not isinstance(tiers, list) or not all(isinstance(tier, dict) for tier in tiers):
        raise ConfigError(f"system.tiers: must be a list of tiers (name, bandwidth, latency, efficiency), got {tiers!r}")
    try:
        cluster = Cluster.build(str(system.get("name", "custom")), devices, node_size, tiers)
    except ValueError as problem:
        raise ConfigError(str(problem)) from None
    if step_model == "original" and len(cluster.tiers) != 1:
        raise ConfigError("system.tiers: the original's model has one flat link; give one tier")
    return cluster, step_model


def _training(cfg: DictConfig, spec: ModelSpec, step_model: str) -> tuple[Training, tuple[str, ...], tuple[int, ...] | None]:
    training = Training(
        optimizer=_choice("optimizer", cfg.optimizer, OPTIMIZERS),
        sharded_optimizer=_boolean("sharded_optimizer", cfg.sharded_optimizer),
        sequence_parallel=_boolean("sequence_parallel", cfg.sequence_parallel),
        overlap_grad_reduce=_boolean("overlap_grad_reduce", cfg.overlap_grad_reduce),
    )
    allowed = ("none", "full") if step_model == "original" else RECOMPUTE_MODES
    name = "recompute (system=original: the original's off or on)" if step_model == "original" else "recompute"
    recompute = tuple(dict.fromkeys(_choice(name, mode, allowed) for mode in _values("recompute", cfg.recompute)))
    virtual = cfg.virtual_stages
    if virtual is None:
        return training, recompute, (1,) if step_model == "original" else None
    choices = allowed_virtual_stages(spec.num_layers) if step_model == "training_step" else (1,)
    values = tuple(dict.fromkeys(_values("virtual_stages", virtual)))
    for value in values:
        if cfg.mode == "predict" and _is_int(value) and value > 0:
            continue  # checked against the given pipeline (_predict_placement)
        if value not in choices:
            raise ConfigError(f"virtual_stages: {value!r} divides no pipeline of two or more stages of the "
                              f"{spec.num_layers} blocks of {spec.name}; allowed: {', '.join(map(str, choices))}")
    return training, recompute, values


def _spec_field(field: dataclasses.Field, value: object, name: str) -> None:
    """Check one ModelSpec value (`name` in the errors) against its field's type and range."""
    if field.name == "factory" and value is not None:
        raise ConfigError(f"{name}: set by model=custom model.config=MODULE:FUNCTION only")
    if field.name in SPEC_CHOICES:
        _choice(name, value, SPEC_CHOICES[field.name])
    elif field.type == "bool":
        _boolean(name, value)
    elif field.name == "capacity_factor":
        if not _is_finite_number(value) or value <= 0:
            raise ConfigError(f"{name}: must be a number > 0 (an expert's token slots over its even share), "
                              f"got {value!r}")
    elif field.type == "float":
        if not _is_finite_number(value) or not 0 <= value < 1:
            raise ConfigError(f"{name}: must be a number in [0, 1), got {value!r}")
    elif field.type == "str":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name}: must be a non-empty text, got {value!r}")
    elif field.name in SPEC_MAY_BE_ZERO:
        if not _is_int(value) or not 0 <= value <= MAX_MODEL_SIZE:
            raise ConfigError(f"{name}: must be an integer from 0 to {_amount(MAX_MODEL_SIZE)}, got {value!r}")
    elif not (field.type in ("int | None", "str | None") and value is None):
        _positive_int(name, value, MAX_MODEL_SIZE)


def _checked_spec(base: ModelSpec | None, fields: dict, where: str,
                  key: Callable[[str], str] = lambda field: field) -> ModelSpec:
    """`base` with `fields` checked and set (no base: a spec of `fields` alone). Errors start with
    `where` and name a field by `key(field)` (a config.json's own key)."""
    known = {field.name: field for field in dataclasses.fields(ModelSpec)}
    for name, value in fields.items():
        if name not in known:
            raise unknown_key_error(f"{where}{name}", known)
        _spec_field(known[name], value, f"{where}{key(name)}")
    try:
        spec = ModelSpec(**fields) if base is None else base.with_overrides(**fields)
    except ValueError as problem:  # ModelSpec's own checks start with the field (num_kv_heads: ...)
        field, _, rest = str(problem).partition(": ")
        raise ConfigError(f"{where}{key(field)}: {rest}") from None
    if spec.hidden_size % spec.num_heads:
        raise ConfigError(f"{where}{key('num_heads')}: {spec.num_heads} heads do not divide {key('hidden_size')}="
                          f"{spec.hidden_size}; allowed: a divisor of {spec.hidden_size}")
    if spec.position_embedding == "rotary" and spec.head_dim % 2:
        raise ConfigError(f"{where}{key('num_heads')}: rotary positions need an even head size, got "
                          f"{key('hidden_size')} / {key('num_heads')} = {spec.hidden_size} / {spec.num_heads} = "
                          f"{spec.head_dim}")
    return spec


def _custom_spec(cfg: DictConfig) -> ModelSpec:
    """The spec of `model=custom`: the file `model.config` names (phaze.custom_model)."""
    if OmegaConf.is_missing(cfg.model, "config") or cfg.model.get("config") is None:
        raise ConfigError("model.config: missing; model=custom reads the model from a file: model.config=PATH "
                          "(a ModelSpec .yaml or a Hugging Face config.json), or model.config=MODULE:FUNCTION (a Python "
                          "nn.Module factory)")
    if not isinstance(cfg.model.config, str) or not cfg.model.config:
        raise ConfigError(f"model.config: must be the path of a .yaml or config.json file or a MODULE:FUNCTION, got "
                          f"{cfg.model.config!r}")
    path = Path(cfg.model.config)
    where = f"model.config: {path}: "
    if not is_factory_reference(cfg.model.config) and path.is_dir():
        raise ConfigError(folder_error(path))
    try:
        if is_factory_reference(cfg.model.config):
            return read_factory(cfg.model.config)
        model_file = read_model_file(path)
    except (ValueError, OSError) as problem:
        raise ConfigError(f"{where}{problem}") from None
    name = model_file.fields.get("name")
    if isinstance(name, str) and not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{where}name: {name!r} names files; allowed: letters, digits, '.', '_', '-'")
    return _checked_spec(None, model_file.fields, where, model_file.key)


def _spec(cfg: DictConfig) -> ModelSpec:
    error = model_name_error(cfg.model.name)
    if error:
        raise error
    if cfg.model.name != CUSTOM_MODEL and "config" in cfg.model:
        raise ConfigError(MODEL_CONFIG_ONLY_CUSTOM)
    overrides = OmegaConf.to_container(cfg.model.overrides) if "overrides" in cfg.model else {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"model.overrides: must be a mapping of ModelSpec fields, got {overrides!r}")
    base = _custom_spec(cfg) if cfg.model.name == CUSTOM_MODEL else get_spec(cfg.model.name)
    if base.factory is not None and (fixed := sorted(set(overrides) - set(FACTORY_OVERRIDES))):
        raise ConfigError(f"model.overrides.{fixed[0]}: a factory's model has its module's shape; allowed: "
                          f"{', '.join(FACTORY_OVERRIDES)}")
    return _checked_spec(base, overrides, "model.overrides.")


def _widths(cfg: DictConfig, spec: ModelSpec) -> tuple[int, ...]:
    maximum = _positive_int("max_tensor_parallel_width", cfg.max_tensor_parallel_width, MAX_DEVICES)
    if cfg.tensor_parallel_width is None:
        return valid_tensor_parallel_widths(spec, maximum)
    width = cfg.tensor_parallel_width
    if _is_int(width) and width > maximum:
        raise ConfigError(f"tensor_parallel_width: {width} exceeds max_tensor_parallel_width={maximum}")
    return (width,)


def _expert_widths(cfg: DictConfig, spec: ModelSpec) -> tuple[int, ...]:
    """The expert-parallel widths searched: the given ones (each divides the experts), or every power
    of two that divides them (predict: 1); 1 for a dense model."""
    experts = spec.num_experts or 1
    value = cfg.get("expert_parallel_width")
    if value is None:
        if cfg.mode == "predict":
            return (1,)
        return tuple(e for e in (2**i for i in range(experts.bit_length())) if experts % e == 0)
    widths = tuple(dict.fromkeys(_values("expert_parallel_width", value)))
    for width in widths:
        if not _is_int(width) or width < 1 or experts % width:
            what = f"the {experts} experts of {spec.name}" if spec.num_experts else f"{spec.name} (no experts)"
            allowed = [e for e in range(1, experts + 1) if experts % e == 0]
            raise ConfigError(f"expert_parallel_width: {width!r} does not divide {what}; "
                              f"allowed: {', '.join(map(str, allowed))}")
    return widths


def _accelerator(cfg: DictConfig) -> tuple[AcceleratorConfig, float | None, KnownChip | None]:
    """The template (technology and area budget), the area budget, and the known chip if one is named."""
    fields = OmegaConf.to_container(cfg.accelerator)
    preset = fields.pop("preset")
    overrides = {k: v for k, v in fields.items() if v is not None}
    known = KNOWN_CHIPS.get(preset)
    if preset not in KNOWN_CHIPS and preset not in accelerator_names():
        raise ConfigError(f"accelerator.preset: unknown {preset!r}; valid: "
                          f"{', '.join((*accelerator_names(), *KNOWN_CHIPS))}")
    if known is not None and known.template is None:  # a GPU: no template chip, the search's default technology
        if overrides:
            raise ConfigError(f"accelerator.{sorted(overrides)[0]}: {preset} is priced by its roofline; the "
                              "template's fields apply to template chips only")
        name = DEFAULT_BUDGET
    else:
        name = known.template_name if known is not None else preset
    for key, (unit, maximum) in ACCELERATOR_NUMBERS.items():
        if key in overrides:
            _positive_number(f"accelerator.{key}", overrides[key], f"{unit} or null", maximum)
    try:
        accelerator = named_accelerator(name, **overrides)
    except (TypeError, ValueError) as problem:
        raise ConfigError(str(problem)) from None
    area_budget = cfg.area_budget
    if area_budget is not None:
        area_budget = _positive_number("area_budget", area_budget, "µm² or null")
    try:
        candidate_space(accelerator, area_budget)
    except ValueError as problem:
        raise ConfigError(str(problem)) from None
    return accelerator, area_budget, known


def _predict_placement(cfg: DictConfig, spec: ModelSpec, settings: dict) -> tuple[int, int]:
    """Check the fixed placement of `phaze predict`; (pipeline_parallel_width, data_parallel_width)."""
    if cfg.tensor_parallel_width is None:
        raise ConfigError("tensor_parallel_width: predict prices one placement; give tensor_parallel_width=t")
    width = settings["tensor_parallel_widths"][0]
    stages = _positive_int("pipeline_parallel_width", cfg.pipeline_parallel_width)
    degree = _positive_int("data_parallel_width", cfg.data_parallel_width)
    devices = settings["system"].num_devices
    if width * stages * degree != devices:
        raise ConfigError(f"data_parallel_width: tensor x pipeline x data parallel = {width} x {stages} x {degree} = "
                          f"{width * stages * degree}, must equal num_devices={devices}")
    for name in ("micro_batch_sizes", "hbm_sizes_gib", "recompute"):
        if len(settings[name]) != 1:
            key = {"micro_batch_sizes": "micro_batch_size", "hbm_sizes_gib": "hbm_size"}.get(name, name)
            hint = f" ({', '.join(RECOMPUTE_MODES)})" if name == "recompute" else ""
            raise ConfigError(f"{key}: predict prices one placement; give one value{hint}, got {list(settings[name])}")
    virtual = settings["virtual_stages"] or (1,)
    if len(virtual) != 1:
        raise ConfigError(f"virtual_stages: predict prices one placement; give one value, got {list(virtual)}")
    blocks = spec.num_layers

    def splits(chunks: int) -> bool:  # evenly, or with the embedding and the loss counted as a block each
        return blocks % chunks == 0 or (blocks + 2) % chunks == 0

    if not splits(stages):
        allowed = [p for p in range(1, blocks + 3) if splits(p)]
        raise ConfigError(f"pipeline_parallel_width: {stages} stages divide neither the {blocks} blocks of {spec.name} "
                          f"nor {blocks} + 2 (embedding and loss counted); allowed: {', '.join(map(str, allowed))}")
    if not splits(stages * virtual[0]) or (virtual[0] > 1 and stages < 2):
        allowed = [v for v in range(1, (blocks + 2) // stages + 1) if splits(stages * v) and (v == 1 or stages > 1)]
        raise ConfigError(f"virtual_stages: {stages} stages x {virtual[0]} virtual stages divide neither the {blocks} "
                          f"blocks of {spec.name} nor {blocks} + 2; allowed with pipeline_parallel_width={stages}: "
                          f"{', '.join(map(str, allowed))}")
    if len(settings["expert_parallel_widths"]) != 1:
        raise ConfigError(f"expert_parallel_width: predict prices one placement; give one value, got "
                          f"{list(settings['expert_parallel_widths'])}")
    (experts,) = settings["expert_parallel_widths"]
    if degree % experts:
        raise ConfigError(f"expert_parallel_width: {experts} does not divide data_parallel_width={degree} (the "
                          f"experts are split over data-parallel replicas); allowed: a divisor of both {degree} and "
                          f"the model's experts")
    micro_batch_size, batch = settings["micro_batch_sizes"][0], settings["global_batch_size"]
    if batch % (micro_batch_size * degree):
        raise ConfigError(f"micro_batch_size: global_batch_size={batch} is not a multiple of micro_batch_size x "
                          f"data_parallel_width = {micro_batch_size} x {degree}")
    if settings["step_model"] != "training_step":
        raise ConfigError("system: predict prices with the training-step model; system=original has none")
    return stages, degree


def _fixed_megatron(cfg: DictConfig, spec: ModelSpec) -> FixedStrategy | None:
    fixed = cfg.model.get("fixed_megatron")
    if fixed is None:
        return None
    return FixedStrategy(
        *(_positive_int(f"model.fixed_megatron.{name}", fixed.get(name), MAX_DEVICES) for name in FIXED_MEGATRON_FIELDS),
        spec.num_layers,
    )


def _schedule(cfg: DictConfig) -> ScheduleSettings:
    gap = cfg.schedule.relative_gap
    if not _is_finite_number(gap) or not 0 <= gap < 1:
        raise ConfigError(f"schedule.relative_gap: must be in [0, 1), got {gap!r}")
    backend = _choice("schedule.backend", cfg.schedule.backend, BACKENDS)
    milp_solver = _choice("schedule.milp_solver", cfg.schedule.milp_solver, MILP_SOLVERS)
    if backend == "milp" and importlib.util.find_spec(MILP_PACKAGES[milp_solver]) is None:
        available = [name for name in MILP_SOLVERS if importlib.util.find_spec(MILP_PACKAGES[name]) is not None]
        raise ConfigError(f"schedule.milp_solver: {milp_solver} needs the {MILP_PACKAGES[milp_solver]} package "
                          f"(pip install {MILP_PACKAGES[milp_solver]}); available here: {', '.join(available) or 'none'}")
    return ScheduleSettings(
        backend=backend,
        time_limit=_positive_number("schedule.time_limit", cfg.schedule.time_limit, "seconds", MAX_TIME_LIMIT_S),
        milp_solver=milp_solver,
        relative_gap=float(gap),
    )


def _cache_dir(value: object) -> Path:
    """`cache_dir` if it is a directory or can be made one (checked, not created: a wrong input writes
    nothing); else a ConfigError naming the file in the way or the folder that is not writable."""
    path = Path(str(value))
    existing = next(parent for parent in (path, *path.parents) if os.path.lexists(parent))
    if not os.path.isdir(existing):
        kind = "a file" if os.path.isfile(existing) else "not a folder"
        where = "" if existing == path else f" ({existing} is {kind})"
        raise ConfigError(f"cache_dir: {path} is not a directory{where}; give a folder for the caches")
    if existing != path and not os.access(existing, os.W_OK | os.X_OK,
                                          effective_ids=os.access in os.supports_effective_ids):
        raise ConfigError(f"cache_dir: {path} cannot be created ({existing} is not writable); give a writable folder")
    return path


def _ray_address(executor: str, value: object) -> str | None:
    """`ray_address` checked: only with executor=ray, which needs ray importable; None (a private
    Ray), or auto / host:port of a cluster that answers (its GCS port takes a connection)."""
    if executor != "ray":
        if value is not None:
            raise ConfigError(f"ray_address: only with executor=ray, got {value!r} with executor={executor}")
        return None
    try:
        import ray._private.services as services
    except ImportError as error:
        raise ConfigError(f"executor: ray cannot be imported ({error}); install it with pip install "
                          "'phaze[ray]', or give executor=local") from None
    if value is None:
        return None
    start = "start one with `ray start --head` or give executor=local"
    text = str(value)
    if text == "auto":
        try:
            found = services.canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError) as error:
            raise ConfigError(f"ray_address: auto finds no running Ray cluster ({error}); {start}") from None
    else:
        found = text
    host, _, port = str(found).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"ray_address: must be auto or host:port (a Ray cluster's GCS address), got {value!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise ConfigError(f"ray_address: cannot reach {found} ({error.strerror or error}); {start}") from None
    return text


def settings_from_config(cfg: DictConfig) -> Settings:
    """Check every user-facing key of the composed config."""
    mode = _choice("mode", cfg.mode, MODES)
    spec = _spec(cfg)
    micro_batch_sizes = tuple(_positive_int("micro_batch_size", v, MAX_BATCH)
                              for v in _values("micro_batch_size", cfg.micro_batch_size))
    sequence_length = spec.default_sequence_length if cfg.sequence_length is None else cfg.sequence_length
    widths = _widths(cfg, spec)
    try:
        for micro_batch_size in micro_batch_sizes:
            for width in widths:
                check_request(spec, micro_batch_size, sequence_length, width)
    except ValueError as problem:
        raise ConfigError(str(problem)) from None
    if not isinstance(cfg.force_reextract, bool):
        raise ConfigError(f"force_reextract: must be true or false, got {cfg.force_reextract!r}")
    accelerator, area_budget, known = _accelerator(cfg)
    hbm = cfg.hbm_size if cfg.hbm_size is not None else known.hbm_capacity / GIB if known else TEMPLATE_HBM_GIB
    hbm_sizes = tuple(_positive_number("hbm_size", v, "GiB", MAX_HBM_GIB) for v in _values("hbm_size", hbm))
    global_batch_size = _positive_int("global_batch_size", cfg.global_batch_size, MAX_BATCH)
    system, step_model = _system(cfg, _positive_int("num_devices", cfg.num_devices, MAX_DEVICES))
    training, recompute, virtual_stages = _training(cfg, spec, step_model)
    if mode in ("run_solver", "predict"):
        for micro_batch_size in micro_batch_sizes:
            if global_batch_size % micro_batch_size:
                raise ConfigError(
                    f"micro_batch_size: {micro_batch_size} does not divide global_batch_size={global_batch_size}"
                )
    sample = cfg.candidate_sample
    n_jobs = cfg.n_jobs
    if not _is_int(n_jobs) or n_jobs == 0 or n_jobs < -1 or n_jobs > MAX_JOBS:
        raise ConfigError(f"n_jobs: must be a positive integer at most {_amount(MAX_JOBS)} or -1 (all cores), got {n_jobs!r}")
    executor = _choice("executor", cfg.executor, EXECUTORS)
    ray_address = _ray_address(executor, cfg.ray_address)
    if n_jobs == -1 and executor == "local":  # with Ray: the cluster's CPUs, counted when the run joins it
        n_jobs = os.cpu_count() or 1
    fields = dict(
        mode=mode,
        spec=spec,
        micro_batch_sizes=micro_batch_sizes,
        sequence_length=sequence_length,
        tensor_parallel_widths=widths,
        hbm_sizes_gib=hbm_sizes,
        force_reextract=cfg.force_reextract,
        cache_dir=_cache_dir(cfg.cache_dir),
        accelerator=accelerator,
        area_budget=area_budget,
        search=_choice("search", cfg.search, STRATEGIES),
        global_batch_size=global_batch_size,
        system=system,
        step_model=step_model,
        training=training,
        recompute=recompute,
        virtual_stages=virtual_stages,
        schedule=_schedule(cfg),
        candidate_sample=None if sample is None else _positive_int("candidate_sample", sample),
        n_jobs=n_jobs,
        fixed_megatron=_fixed_megatron(cfg, spec),
        known_chip=known,
        expert_parallel_widths=_expert_widths(cfg, spec),
        executor=executor,
        ray_address=ray_address,
    )
    if mode == "predict":
        if known is None:
            raise ConfigError(f"accelerator.preset: predict prices a chip that exists; valid: {', '.join(KNOWN_CHIPS)}")
        fields["pipeline_parallel_width"], fields["data_parallel_width"] = _predict_placement(cfg, spec, fields)
    return Settings(**fields)
