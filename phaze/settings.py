"""A run's settings: its configuration (hydra's, or the Python API's keywords on the same defaults)
turned into typed values — the question (solver.question.Question), the swept axes
(solver.question.Axes), the chip, the search's and the scheduler's options — or one InputError
naming the field and what is allowed.

What each key means is written beside it in phaze/conf/config.yaml; the checks of values are
phaze_common.checks', ModelSpec's own (phaze.model_config), the layout's (solver.layout.FitRules), the
step model's (solver.step_models); those that touch the world (files, packages, sockets) are
phaze.environment's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from phaze_common.checks import (
    InputError,
    boolean,
    choice,
    fraction,
    integer,
    is_integer,
    non_negative_number,
    positive_integer,
    positive_number,
    unknown_fields,
    values,
)
from estimator import candidate_space
from graph_extract import KernelOptions, ModelSpec, valid_tensor_parallel_widths
from graph_extract.kernels import PRECISIONS
from graph_extract.extraction import check_request
from phaze_hardware import (
    DEFAULT_BUDGET,
    KNOWN_CHIPS,
    AcceleratorConfig,
    KnownChip,
    Network,
    accelerator_names,
    named_accelerator,
)
from phaze_hardware.systems import TOPOLOGIES
from phaze import environment
from phaze.model_config import fixed_megatron, model_spec
from solver.codesign import EXECUTORS, STRATEGIES, ScheduleSettings, SearchContext
from solver.layout import Layout
from solver.predict import check_layout
from solver.question import Axes, Question, check_context_widths, check_expert_widths, check_micro_batches, context_widths
from solver.schedule import BACKENDS, MILP_SOLVERS
from solver.step_models import STEP_MODELS
from solver.system_search import ARCHITECTURE_SPACES, OBJECTIVES, SYSTEM_STRATEGIES, SystemDesign, system_design
from solver.training_step import (DISPATCH_SMS, EXPERT_DISPATCHES, SHARDED_COLLECTIVES, SHARDINGS, TrainingOptions,
                                  recompute_mode)
from solver.training_step.memory import OPTIMIZERS

MODES = ("extract_graph", "prepopulate_estimates", "run_solver", "predict")
#: HBM per device [GiB] of the template chips (a TPU v4's), when `hbm_size` is null.
TEMPLATE_HBM_GIB = 32
#: Bytes per GiB.
GIB = 2**30
#: Largest HBM per device [GiB] taken: 1 PiB, far beyond any chip (the largest have hundreds of GiB).
MAX_HBM_GIB = 1_048_576
#: Largest cluster [devices]: a million accelerators, beyond any training cluster built.
MAX_DEVICES = 1_048_576
#: Largest batch [samples] (global or micro-batch).
MAX_BATCH = 16_777_216
#: Largest worker-process count of `n_jobs`.
MAX_JOBS = 1024
#: Largest time limit of one layer schedule [s]: a day.
MAX_TIME_LIMIT_S = 86_400.0
#: Ranges of the template's technology fields (unit, largest value): 100 GHz, 1 PB/s, a million words a cycle.
ACCELERATOR_NUMBERS = {"clock_hz": ("Hz", 1e11), "hbm_bandwidth": ("B/s", 1e15),
                       "core_buffer_words_per_cycle": ("words/cycle", 1e6)}
#: The fields of a system (a hardware system's, or a preset of phaze/conf/system/).
SYSTEM_FIELDS = ("name", "chip", "step_model", "node_size", "topology", "tiers", "slices")


@dataclass(frozen=True)
class Settings:
    """A run: its mode, question and axes, the chip (a known one, or the template of the architecture
    search and its area budget [µm²]), the search's, the scheduler's and the workers' options, and
    for `predict` the layout priced."""

    mode: str
    question: Question
    axes: Axes
    force_reextract: bool
    cache_dir: Path
    accelerator: AcceleratorConfig  # the template: technology, and the area budget unless area_budget
    area_budget: float | None
    search: str
    schedule: ScheduleSettings
    candidate_sample: int | None
    n_jobs: int
    known_chip: KnownChip | None = None  # a chip that exists: no architecture search
    layout: Layout | None = None  # predict: the layout priced
    executor: str = "local"  # where run_solver evaluates candidates: local processes or Ray actors
    ray_address: str | None = None  # executor=ray: a cluster to join (auto, host:port); None: a private Ray
    system_design: SystemDesign | None = None  # architecture_space=system: the memories, links, budgets, objective

    @property
    def spec(self) -> ModelSpec:
        return self.question.model

    @property
    def devices(self) -> int:
        return self.question.cluster.num_devices

    def search_context(self, micro_batch_size: int) -> SearchContext:
        """What evaluating a chip at one micro-batch size depends on."""
        return SearchContext(self.question, self.axes.at(micro_batch_size=micro_batch_size), self.accelerator,
                             self.area_budget, self.cache_dir, self.schedule)


def hbm_bytes(gib: float) -> int:
    return round(gib * GIB)


def _system(system: Mapping, devices: int) -> tuple[Network, str]:
    """The cluster of the `system` node with `devices` devices, and its step model's name."""
    unknown_fields("system", system, SYSTEM_FIELDS)
    step_model = choice("system.step_model", system.get("step_model", "training_step"), tuple(STEP_MODELS))
    node_size = positive_integer("system.node_size", system.get("node_size"))
    tiers = system.get("tiers")
    if not isinstance(tiers, list) or not all(isinstance(tier, dict) for tier in tiers):
        raise InputError(f"system.tiers: must be a list of tiers (name, bandwidth, latency, efficiency), got {tiers!r}")
    topology = choice("system.topology", system.get("topology", "tiers"), tuple(TOPOLOGIES))
    return TOPOLOGIES[topology].build(str(system.get("name", "custom")), devices, node_size, tiers,
                                      system.get("slices", 1)), step_model


def _chip(config: Mapping) -> tuple[AcceleratorConfig, float | None, KnownChip | None]:
    """The template (technology and area budget), the area budget, and the known chip if one is
    named (null: the system's chip for predict, the default template otherwise)."""
    name = config["chip"]
    if name is None:
        name = (config["mode"] == "predict" and config["system"].get("chip")) or DEFAULT_BUDGET
    overrides = {key: value for key, value in config["accelerator"].items() if value is not None}
    known = KNOWN_CHIPS.get(name)
    if known is None and name not in accelerator_names():
        raise InputError(chip_error(name))
    if known is not None and overrides:  # a chip that exists is priced with its own figures
        how = "by its roofline" if known.template is None else "with its own figures"
        raise InputError(f"accelerator.{sorted(overrides)[0]}: {name} is a chip that exists, priced {how}; the "
                         f"template's fields apply to template chips only ({', '.join(accelerator_names())}); "
                         "allowed here: null")
    if known is not None and known.template is None:  # a GPU: no template chip, the search's default technology
        template = DEFAULT_BUDGET
    else:
        template = known.template_name if known is not None else name
    for key, (unit, maximum) in ACCELERATOR_NUMBERS.items():
        if key in overrides:
            positive_number(f"accelerator.{key}", overrides[key], f"{unit} or null", maximum)
    try:
        accelerator = named_accelerator(template, **overrides)
    except TypeError as problem:
        raise InputError(f"accelerator: {problem}") from None
    area_budget = config["area_budget"]
    if area_budget is not None:
        area_budget = positive_number("area_budget", area_budget, "µm² or null")
    candidate_space(accelerator, area_budget)
    return accelerator, area_budget, known


def chip_error(name: object) -> InputError:
    """The error for a `chip` that is neither a chip that exists nor a template, saying where chips are
    defined (a chip is added as a file there, not given by path)."""
    allowed = ", ".join(dict.fromkeys((*accelerator_names(), *KNOWN_CHIPS)))
    where = ("chips that exist are phaze_hardware/chips/<name>.yaml, one YAML file each with the source of "
             "every figure, templates phaze_hardware/templates/<name>.yaml")
    if isinstance(name, str) and ("/" in name or name.endswith((".yaml", ".yml"))):
        return InputError(f"chip: {name!r} is a path; a chip by path is not supported yet ({where}: add one there "
                          f"and give its name); allowed: {allowed}")
    return InputError(f"chip: unknown {name!r}; allowed: {allowed} ({where})")


def _widths(config: Mapping, spec: ModelSpec) -> tuple[int, ...]:
    maximum = positive_integer("max_tensor_parallel_width", config["max_tensor_parallel_width"], MAX_DEVICES)
    width = config["tensor_parallel_width"]
    if width is None:
        return valid_tensor_parallel_widths(spec, maximum)
    if is_integer(width) and width > maximum and config["mode"] != "predict":  # predict prices the t given
        raise InputError(f"tensor_parallel_width: {width} exceeds max_tensor_parallel_width={maximum}")
    return (width,)


def _expert_widths(config: Mapping, spec: ModelSpec) -> tuple[int, ...]:
    """The expert-parallel widths searched: the given ones, or every power of two that divides the
    experts (predict: 1); 1 for a dense model."""
    experts = spec.num_experts or 1
    value = config.get("expert_parallel_width")
    if value is None:
        if config["mode"] == "predict":
            return (1,)
        return tuple(e for e in (2**i for i in range(experts.bit_length())) if experts % e == 0)
    return tuple(dict.fromkeys(integer("expert_parallel_width", width, 1)
                               for width in values("expert_parallel_width", value)))


#: Tokens per context-parallel rank the default search keeps at least (Llama 3's 128K-token stage ran
#: c = 16: 8K tokens a rank; Dubey et al. 2024, Sec. 3.3.2).
CONTEXT_CHUNK_TOKENS = 4096


def _expert_tensor_widths(config: Mapping, spec: ModelSpec) -> tuple[int | None, ...]:
    """The experts' tensor-parallel widths searched (None: t): the given ones, or, for a search over
    a mixture of experts, t and 1 (Megatron-Core's recommendation for fine-grained experts); t
    alone for predict and a dense model."""
    value = config.get("expert_tensor_parallel_width")
    if value is None:
        return (None, 1) if spec.num_experts and config["mode"] != "predict" else (None,)
    widths = tuple(dict.fromkeys(integer("expert_tensor_parallel_width", width, 1)
                                 for width in values("expert_tensor_parallel_width", value)))
    if not spec.num_experts and widths != (1,):
        raise InputError(f"expert_tensor_parallel_width: {spec.name} has no experts; allowed: null")
    return widths


def _dispatch_share(config: Mapping, known: KnownChip | None) -> float:
    """`TrainingOptions.expert_dispatch_compute_share`: `expert_dispatch_sms` (null: `DISPATCH_SMS`) of
    a GPU's streaming multiprocessors (0 on a chip without them: a template or a TPU, where a given
    value is refused)."""
    processors = known.streaming_multiprocessors if known is not None else 0
    given = config["expert_dispatch_sms"]
    sms = integer("expert_dispatch_sms", DISPATCH_SMS if given is None else given, 0,
                  processors - 1 if processors else None)
    if given is not None and not processors:
        chip = known.name if known is not None else "a template chip"
        raise InputError(f"expert_dispatch_sms: {chip} has no streaming multiprocessors (a GPU's only); "
                         "allowed here: null")
    return sms / processors if processors else 0.0


def _check_options_apply(config: Mapping, spec: ModelSpec, shardings: tuple[str, ...]) -> None:
    """InputError for an option given a value other than its default where it changes nothing: the
    expert dispatch's options on a model without experts, the dispatch's SMs without the overlap that
    holds them, `full` sharding's options when no sharding priced is `full`, a shard width when none
    is sharded."""
    if not spec.num_experts:
        for key, default in (("overlap_expert_dispatch", False), ("expert_dispatch", "all_to_all"),
                             ("expert_dispatch_sms", None)):
            if config[key] != default:
                raise InputError(f"{key}: {spec.name} has no experts, so no tokens are dispatched; allowed: "
                                 f"{shown(default)}")
    if config["expert_dispatch_sms"] is not None and config["overlap_expert_dispatch"] is not True:
        raise InputError("expert_dispatch_sms: the SMs an overlapped dispatch holds; needs "
                         "overlap_expert_dispatch=true; allowed here: null")
    sharded = f"data_parallel_sharding={shown(shardings[0] if len(shardings) == 1 else shardings)}"
    if "full" not in shardings:
        if config["reshard_after_forward"] is False:
            raise InputError(f"reshard_after_forward: false keeps the weights data_parallel_sharding=full gathers; "
                             f"{sharded} gathers none; allowed here: true")
        if config["sharded_collectives"] != "prefetched_layers":
            raise InputError(f"sharded_collectives: {config['sharded_collectives']} is how "
                             f"data_parallel_sharding=full issues its gathers and reduce-scatters; {sharded} issues "
                             "none; allowed here: prefetched_layers")
    if shardings == ("none",) and config["data_parallel_shard_width"] is not None:
        raise InputError("data_parallel_shard_width: data_parallel_sharding=none shards nothing (hybrid sharding "
                         "splits a sharded state within groups); allowed here: null")


def shown(value: object) -> str:
    """A configuration value as it is written on the command line (null, true, [a, b])."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(shown, value))}]"
    return str(value)


def _context_widths(config: Mapping, sequence_length: int) -> tuple[int, ...]:
    """The context-parallel widths searched: the given ones, or every power of two up to
    `max_context_parallel_width` (null: the largest leaving each rank `CONTEXT_CHUNK_TOKENS` tokens) that
    splits the sequence into 2c chunks (predict: 1)."""
    value = config.get("context_parallel_width")
    if value is not None:
        return tuple(dict.fromkeys(integer("context_parallel_width", width, 1)
                                   for width in values("context_parallel_width", value)))
    if config["mode"] == "predict":
        return (1,)
    most = config.get("max_context_parallel_width")
    most = (max(1, sequence_length // CONTEXT_CHUNK_TOKENS) if most is None
            else positive_integer("max_context_parallel_width", most, MAX_DEVICES))
    return context_widths(sequence_length, most)


def _shardings(config: Mapping) -> tuple[str, ...]:
    """The data-parallel shardings: one, or a list searched in one run."""
    return tuple(dict.fromkeys(choice("data_parallel_sharding", mode, SHARDINGS)
                               for mode in values("data_parallel_sharding", config["data_parallel_sharding"])))


def _virtual_stages(config: Mapping, spec: ModelSpec, step_model: str) -> tuple[int, ...] | None:
    model = STEP_MODELS[step_model]
    if config["virtual_stages"] is None:
        return model.default_virtual_stages()
    choices = model.virtual_stages(spec.num_layers)
    given = tuple(dict.fromkeys(values("virtual_stages", config["virtual_stages"])))
    for value in given:
        if config["mode"] == "predict" and is_integer(value) and value > 0:
            continue  # the layout's rules check it against the given pipeline (solver.predict.fit_rules)
        if value not in choices:
            raise InputError(f"virtual_stages: {value!r} divides no pipeline of two or more stages of the "
                             f"{spec.num_layers} blocks of {spec.name}; allowed: {', '.join(map(str, choices))}")
    return given


#: The recomputation mode `phaze predict` prices when `recompute` is null: none, as Megatron-LM and
#: NeMo run unless told to recompute.
PREDICT_RECOMPUTE = "none"


def _recompute(config: Mapping, step_model: str) -> tuple[str, ...]:
    """The recomputation modes searched, each by its one name (Megatron-Core's modules joined by '+'
    where the step model prices them: `solver.training_step.recompute_mode`); null: every mode the
    step model prices (predict: `PREDICT_RECOMPUTE`)."""
    model = STEP_MODELS[step_model]
    name = f"recompute ({model.recompute_note})" if model.recompute_note else "recompute"
    given = config["recompute"]
    if given is None:
        return (PREDICT_RECOMPUTE,) if config["mode"] == "predict" else model.recompute_modes
    given = values("recompute", given)
    if model.prices_recompute_modules:
        return tuple(dict.fromkeys(recompute_mode(mode, name) for mode in given))
    return tuple(dict.fromkeys(choice(name, mode, model.recompute_modes) for mode in given))


def _schedule(schedule: Mapping) -> ScheduleSettings:
    gap = fraction("schedule.relative_gap", schedule["relative_gap"], closed_at_zero=True)
    backend = choice("schedule.backend", schedule["backend"], BACKENDS)
    milp_solver = choice("schedule.milp_solver", schedule["milp_solver"], MILP_SOLVERS)
    if backend == "milp":
        environment.milp_solver_installed(milp_solver)
    return ScheduleSettings(
        backend=backend,
        time_limit=positive_number("schedule.time_limit", schedule["time_limit"], "seconds", MAX_TIME_LIMIT_S),
        milp_solver=milp_solver,
        relative_gap=gap,
    )


def _predicted_layout(config: Mapping, question: Question, axes: Axes, known: KnownChip | None) -> Layout:
    """`phaze predict`'s layout: one value of every axis, a chip that exists, the training-step model,
    and the layout's rules (solver.predict.check_layout)."""
    step_model = question.step_model
    if not STEP_MODELS[step_model].prices_layouts:
        raise InputError(f"system: predict prices with the training-step model; system={step_model} has none")
    if known is None:
        raise InputError(f"chip: predict prices a chip that exists; allowed: {', '.join(KNOWN_CHIPS)}")
    if config["tensor_parallel_width"] is None:
        raise InputError("tensor_parallel_width: predict prices one placement; give tensor_parallel_width=t")
    for key, given in (("micro_batch_size", axes.micro_batch_sizes), ("hbm_size", axes.memory_capacities),
                       ("recompute", axes.recompute), ("virtual_stages", axes.virtual_stages or (1,)),
                       ("expert_parallel_width", axes.expert_parallel_widths),
                       ("context_parallel_width", axes.context_parallel_widths),
                       ("expert_tensor_parallel_width", axes.expert_tensor_parallel_widths),
                       ("data_parallel_sharding", axes.shardings(question))):
        if len(given) != 1:
            shown = [round(size / GIB, 9) for size in given] if key == "hbm_size" else list(given)
            hint = f" ({', '.join(STEP_MODELS[step_model].recompute_modes)})" if key == "recompute" else ""
            raise InputError(f"{key}: predict prices one placement; give one value{hint}, got {shown}")
    layout = Layout(axes.tensor_parallel_widths[0],
                    positive_integer("pipeline_parallel_width", config["pipeline_parallel_width"]),
                    positive_integer("data_parallel_width", config["data_parallel_width"]),
                    (axes.virtual_stages or (1,))[0], axes.expert_parallel_widths[0], axes.context_parallel_widths[0],
                    axes.expert_tensor_parallel_widths[0])
    return check_layout(question, axes, layout)


def _scaled_system(system: Mapping, scale: float) -> dict:
    """The system with its scale-up (first) tier's bandwidth × scale."""
    tiers = [dict(tier) for tier in system["tiers"]]
    tiers[0]["bandwidth"] = tiers[0]["bandwidth"] * scale
    return {**system, "tiers": tiers}


def _system_design(config: Mapping, known: KnownChip | None, accelerator, area_budget: float | None,
                   devices: int) -> SystemDesign | None:
    """architecture_space=system's design, checked; None for the original space (whose search has
    no power, cost or objective other than the throughput: those keys are refused there)."""
    space = choice("architecture_space", config["architecture_space"], ARCHITECTURE_SPACES)
    budgets = {name: config[name] for name in ("power_budget", "cost_budget")}
    for name, unit in (("power_budget", "W"), ("cost_budget", "US dollars")):
        if budgets[name] is not None:
            budgets[name] = positive_number(name, budgets[name], f"{unit} or null")
    objective = choice("objective", config["objective"], OBJECTIVES)
    if space == "original":
        for name, value in budgets.items():
            if value is not None:
                raise InputError(f"{name}: needs architecture_space=system (the original space prices no power or "
                                 f"cost); allowed here: null")
        if objective != "throughput":
            raise InputError(f"objective: {objective} needs architecture_space=system; allowed here: throughput")
        return None
    if known is not None:
        raise InputError(f"architecture_space: {known.name} is a chip that exists, with its own memory and links; "
                         f"allowed with chip={config['chip']}: original")
    search = config["search"]
    if search not in SYSTEM_STRATEGIES:
        raise InputError(f"search: architecture_space=system searches with {' or '.join(SYSTEM_STRATEGIES)}; "
                         f"got {search}")
    if config["hbm_size"] is not None:
        raise InputError("hbm_size: architecture_space=system takes the HBM capacity from the stacks; allowed: null")
    system = config["system"]
    return system_design(str(system.get("name", "custom")),
                         lambda scale: _system(_scaled_system(system, scale), devices)[0], accelerator, objective,
                         area_budget, budgets["power_budget"], budgets["cost_budget"],
                         {name: value for name, value in config["system_space"].items() if value is not None})


#: The keys every mode reads (the model and system groups are each mode's own).
COMMON_KEYS = ("mode", "model", "system", "micro_batch_size", "sequence_length", "cache_dir", "force_reextract")
#: The keys of the widths the graphs are traced at.
GRAPH_KEYS = ("max_tensor_parallel_width", "tensor_parallel_width")
#: The keys of a training step (the question, its options and the axes priced).
STEP_KEYS = ("hbm_size", "chip", "schedule", "global_batch_size", "num_devices", "optimizer", "data_parallel_sharding",
             "data_parallel_shard_width", "reshard_after_forward", "sharded_collectives", "expert_dispatch",
             "overlap_expert_dispatch", "expert_dispatch_sms", "recompute", "sequence_parallel", "flash_attention",
             "precision", "grad_reduce_in_bf16", "virtual_stages", "overlap_grad_reduce", "overlap_param_gather",
             "tensor_parallel_overlap", "master_weight_remainders", "framework_reserve_gb",
             "overlap_pipeline_transfers", "expert_parallel_width", "expert_tensor_parallel_width",
             "context_parallel_width")
#: The keys of the co-design search: the chips searched, the widths tried, the workers.
SEARCH_KEYS = ("max_context_parallel_width", "accelerator", "area_budget", "architecture_space", "power_budget",
               "cost_budget", "objective", "system_space", "search", "candidate_sample", "n_jobs", "executor",
               "ray_address")
#: The keys each mode reads, and what it does instead of reading the others (a key a mode does not read
#: is refused unless it keeps its default).
MODE_KEYS = {
    "extract_graph": ((*COMMON_KEYS, *GRAPH_KEYS), "it traces the model's graphs only"),
    "prepopulate_estimates": ((*COMMON_KEYS, *GRAPH_KEYS, "chip", "accelerator", "area_budget"),
                              "it fills the template chip's GEMM estimates only"),
    "predict": ((*COMMON_KEYS, *STEP_KEYS, "tensor_parallel_width", "pipeline_parallel_width", "data_parallel_width"),
                "it prices the one placement given; the search's keys are run_solver's"),
    "run_solver": ((*COMMON_KEYS, *GRAPH_KEYS, *STEP_KEYS, *SEARCH_KEYS),
                   "it searches the pipeline and data-parallel widths; predict prices given ones"),
}
#: What run_solver does not read on a chip that exists: it searches the placement only.
KNOWN_CHIP_UNREAD = ("accelerator", "area_budget", "architecture_space", "power_budget", "cost_budget", "objective",
                     "system_space", "search", "candidate_sample")


def unread_keys(settings: Settings) -> dict[str, str]:
    """The keys the run of `settings` does not read (beyond its mode's: those of a search of chips on a
    chip that exists, the layer schedules' on a chip priced by its roofline), each with what the run does
    instead."""
    mode = settings.mode
    read, why = MODE_KEYS[mode]
    unread = {key: why for key in (*COMMON_KEYS, *GRAPH_KEYS, *STEP_KEYS, *SEARCH_KEYS, "pipeline_parallel_width",
                                   "data_parallel_width") if key not in read}
    chip = settings.known_chip
    if chip is not None and mode == "run_solver":
        unread.update({key: f"{chip.name} is a chip that exists: no chip is searched, only the placement"
                       for key in KNOWN_CHIP_UNREAD})
    if chip is not None and chip.template is None and mode in ("run_solver", "predict"):
        unread["schedule"] = f"{chip.name} is priced by its roofline: no layer is scheduled"
    return unread


def _difference(key: str, value: object, default: object) -> tuple[str, object] | None:
    """The first (dotted key, default value) where `value` is not `default`, or None."""
    if isinstance(value, Mapping) and isinstance(default, Mapping):
        for inner in value:
            if found := _difference(f"{key}.{inner}", value[inner], default.get(inner)):
                return found
        return None
    return None if value == default else (key, default)


def unread_key_error(settings: Settings, config: Mapping, default: Mapping) -> InputError | None:
    """The error for the first key the run does not read (`unread_keys`) whose value in `config` is not
    the one of `default` (the same model and system's configuration without the user's keys; both
    plain, interpolations resolved), or None."""
    for key, why in unread_keys(settings).items():
        if found := _difference(key, config.get(key), default.get(key)):
            name, value = found
            return InputError(f"{name}: phaze {settings.mode} does not read it ({why}); allowed: {shown(value)} "
                              "(the default)")
    return None


def settings_from_config(config: Mapping, spec: ModelSpec | None = None) -> Settings:
    """Check every user-facing key of a composed configuration (plain containers, interpolations
    resolved; hydra's DictConfig is converted); `spec`: the model, given as a value (the Python API),
    instead of the `model` node's."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    mode = choice("mode", config["mode"], MODES)
    spec = model_spec(config["model"], config["sequence_length"]) if spec is None else spec
    micro_batch_sizes = tuple(positive_integer("micro_batch_size", size, MAX_BATCH)
                              for size in values("micro_batch_size", config["micro_batch_size"]))
    sequence_length = spec.default_sequence_length if config["sequence_length"] is None else config["sequence_length"]
    widths = _widths(config, spec)
    for micro_batch_size in micro_batch_sizes:
        for width in widths:
            check_request(spec, micro_batch_size, sequence_length, width)
    boolean("force_reextract", config["force_reextract"])
    accelerator, area_budget, known = _chip(config)
    hbm = config["hbm_size"]
    if hbm is None:
        hbm = known.hbm_capacity / GIB if known else TEMPLATE_HBM_GIB
    largest = known.hbm_capacity / GIB if known else MAX_HBM_GIB  # a chip that exists has the HBM it has
    hbm_sizes = tuple(positive_number("hbm_size", size, f"GiB (the HBM of {known.name})" if known else "GiB", largest)
                      for size in values("hbm_size", hbm))
    global_batch_size = positive_integer("global_batch_size", config["global_batch_size"], MAX_BATCH)
    cluster, step_model = _system(config["system"],
                                  positive_integer("num_devices", config["num_devices"], MAX_DEVICES))
    shardings = _shardings(config)
    shard_width = config["data_parallel_shard_width"]
    baseline, baseline_split = fixed_megatron(config["model"], cluster.num_devices)
    question = Question(
        model=spec,
        sequence_length=sequence_length,
        global_batch_size=global_batch_size,
        cluster=cluster,
        training=TrainingOptions(choice("optimizer", config["optimizer"], OPTIMIZERS),
                                 shardings[0],
                                 boolean("overlap_grad_reduce", config["overlap_grad_reduce"]),
                                 boolean("grad_reduce_in_bf16", config["grad_reduce_in_bf16"]),
                                 boolean("overlap_param_gather", config["overlap_param_gather"]),
                                 boolean("tensor_parallel_overlap", config["tensor_parallel_overlap"]),
                                 boolean("overlap_pipeline_transfers", config["overlap_pipeline_transfers"]),
                                 boolean("master_weight_remainders", config["master_weight_remainders"]),
                                 non_negative_number("framework_reserve_gb", config["framework_reserve_gb"]) * 1e9,
                                 None if shard_width is None else positive_integer("data_parallel_shard_width",
                                                                                   shard_width, MAX_DEVICES),
                                 boolean("reshard_after_forward", config["reshard_after_forward"]),
                                 choice("expert_dispatch", config["expert_dispatch"], EXPERT_DISPATCHES),
                                 boolean("overlap_expert_dispatch", config["overlap_expert_dispatch"]),
                                 _dispatch_share(config, known),
                                 choice("sharded_collectives", config["sharded_collectives"], SHARDED_COLLECTIVES)),
        kernels=KernelOptions(boolean("sequence_parallel", config["sequence_parallel"]),
                              boolean("flash_attention", config["flash_attention"]),
                              choice("precision", config["precision"], PRECISIONS)),
        step_model=step_model,
        baseline=baseline,
        baseline_split=baseline_split,
    )
    STEP_MODELS[step_model].check(question)
    _check_options_apply(config, spec, shardings)
    if known is not None:
        known.check_precision(question.kernels.precision)
    elif question.kernels.fp8:  # the template's area and energy model has 16-bit multiply-accumulates only
        raise InputError("precision: a template chip prices 16-bit multiply-accumulates only; allowed: bf16, fp16 "
                         "(fp8 on a chip with FP8 figures: chip=h100_sxm)")
    axes = Axes(
        micro_batch_sizes=micro_batch_sizes,
        memory_capacities=tuple(hbm_bytes(size) for size in hbm_sizes),
        recompute=_recompute(config, step_model),
        tensor_parallel_widths=widths,
        virtual_stages=_virtual_stages(config, spec, step_model),
        expert_parallel_widths=_expert_widths(config, spec),
        context_parallel_widths=_context_widths(config, sequence_length),
        expert_tensor_parallel_widths=_expert_tensor_widths(config, spec),
        data_parallel_shardings=shardings if len(shardings) > 1 else None,
    )
    STEP_MODELS[step_model].check_axes(question, axes)
    check_expert_widths(question, axes)
    check_context_widths(question, axes)
    if mode in ("run_solver", "predict"):
        check_micro_batches(question, axes)
    n_jobs = config["n_jobs"]
    if not is_integer(n_jobs) or n_jobs == 0 or n_jobs < -1 or n_jobs > MAX_JOBS:
        raise InputError(f"n_jobs: must be a positive integer at most {MAX_JOBS:,} or -1 (all cores), got {n_jobs!r}")
    executor = choice("executor", config["executor"], EXECUTORS)
    ray_address = environment.ray_address(executor, config["ray_address"])
    if n_jobs == -1 and executor == "local":  # with Ray: the cluster's CPUs, counted when the run joins it
        n_jobs = os.cpu_count() or 1
    sample = config["candidate_sample"]
    return Settings(
        mode=mode,
        question=question,
        axes=axes,
        force_reextract=config["force_reextract"],
        cache_dir=environment.cache_dir(config["cache_dir"]),
        accelerator=accelerator,
        area_budget=area_budget,
        search=choice("search", config["search"], STRATEGIES),
        schedule=_schedule(config["schedule"]),
        candidate_sample=None if sample is None else positive_integer("candidate_sample", sample),
        n_jobs=n_jobs,
        known_chip=known,
        layout=_predicted_layout(config, question, axes, known) if mode == "predict" else None,
        executor=executor,
        ray_address=ray_address,
        system_design=(_system_design(config, known, accelerator, area_budget, cluster.num_devices)
                       if mode == "run_solver" else None),
    )
