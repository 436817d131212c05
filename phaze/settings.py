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
    is_integer,
    non_negative_number,
    positive_integer,
    positive_number,
    unknown_fields,
    values,
)
from estimator import candidate_space
from graph_extract import KernelOptions, ModelSpec
from graph_extract.kernels import FP8_RECIPES, PRECISIONS
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
from phaze_hardware.chips import chip_of, is_path
from phaze_hardware.systems import TOPOLOGIES, system_of_file
from phaze import environment
from phaze.parallel_settings import (GIB, MAX_DEVICES, check_options_apply, predicted_layout, read_context_widths,
                                     read_dispatch_share, read_expert_tensor_widths, read_expert_widths, read_recompute,
                                     read_schedule, read_shardings, read_virtual_stages, read_widths, shown)
from phaze.config_keys import SYSTEM_FILE
from phaze.model_config import fixed_megatron, model_spec
from phaze.plan_settings import plan_record, planned_spec, search_prices
from solver.search import EXECUTORS, STRATEGIES, ScheduleSettings, SearchContext
from solver.layout import Layout
from solver.question import Axes, Question, check_context_widths, check_expert_widths, check_micro_batches
from solver.step_models import STEP_MODELS
from solver.system_search import ARCHITECTURE_SPACES, OBJECTIVES, SYSTEM_STRATEGIES, SystemDesign, system_design
from solver.training_step import (EXPERT_DISPATCHES, SHARDED_COLLECTIVES, TrainingOptions)
from solver.training_step.memory import OPTIMIZERS, WEIGHT_DTYPES
from solver.training_step.options import ACTIVATION_OFFLOADS

MODES = ("extract_graph", "prepopulate_estimates", "run_solver", "predict")
#: HBM per device [GiB] of the template chips (a TPU v4's), when `hbm_size` is null.
TEMPLATE_HBM_GIB = 32
#: Largest HBM per device [GiB] taken: 1 PiB, far beyond any chip (the largest have hundreds of GiB).
MAX_HBM_GIB = 1_048_576
#: Largest batch [samples] (global or micro-batch).
MAX_BATCH = 16_777_216
#: Largest worker-process count of `n_jobs`.
MAX_JOBS = 1024
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
    tensor_parallel_plan: str = "megatron"  # megatron, searched or a plan file (the spec's plan: its file)

    @property
    def spec(self) -> ModelSpec:
        return self.question.model

    @property
    def devices(self) -> int:
        return self.question.cluster.num_devices

    def plan_record(self, micro_batch_size: int, width: int) -> dict:
        """`tensor_parallel_plan` and the plan at `width` with whether it is verified (`plan_settings.plan_record`)."""
        return {"tensor_parallel_plan": self.tensor_parallel_plan,
                **plan_record(self.spec, micro_batch_size, self.question.sequence_length, width, self.cache_dir)}

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


def system_mapping(system: Mapping) -> Mapping:
    """The `system` node as a system's fields: a system file's (`system.file`, read and checked as the
    packaged systems are), else the node itself."""
    if set(system) != {SYSTEM_FILE}:
        return system
    path = system[SYSTEM_FILE]
    if not isinstance(path, str) or not path.strip():
        raise InputError(f"system.file: give the path of a system file (system=path/to/system.yaml), got {path!r}")
    return system_of_file(path if is_path(path) else f"./{path}").record()


def _chip(config: Mapping) -> tuple[AcceleratorConfig, float | None, KnownChip | None]:
    """The template (technology and area budget), the area budget, and the known chip if one is
    named (null: the system's chip for predict, the default template otherwise)."""
    name = config["chip"]
    if name is None:
        name = (config["mode"] == "predict" and config["system"].get("chip")) or DEFAULT_BUDGET
    overrides = {key: value for key, value in config["accelerator"].items() if value is not None}
    known = chip_of(name) if is_path(name) else KNOWN_CHIPS.get(name)
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
    """The error for a `chip` that is neither a chip that exists, nor a chip file's path, nor a template,
    saying where chips are defined."""
    allowed = ", ".join(dict.fromkeys((*accelerator_names(), *KNOWN_CHIPS)))
    where = ("chips that exist are phaze_hardware/chips/<name>.yaml, one YAML file each with the source of "
             "every figure, or a file of the same fields given by its path (chip=path/to/chip.yaml); templates "
             "phaze_hardware/templates/<name>.yaml")
    return InputError(f"chip: unknown {name!r}; allowed: {allowed} ({where})")




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
COMMON_KEYS = ("mode", "model", "system", "micro_batch_size", "sequence_length", "cache_dir", "force_reextract",
               "tensor_parallel_plan")
#: The keys of the widths the graphs are traced at.
GRAPH_KEYS = ("max_tensor_parallel_width", "tensor_parallel_width")
#: The keys of a training step (the question, its options and the axes priced).
STEP_KEYS = ("hbm_size", "chip", "schedule", "global_batch_size", "num_devices", "optimizer", "data_parallel_sharding",
             "data_parallel_shard_width", "reshard_after_forward", "sharded_collectives", "expert_dispatch",
             "overlap_expert_dispatch", "expert_dispatch_sms", "recompute", "sequence_parallel", "flash_attention",
             "precision", "fp8_recipe", "fp8_parameters", "cuda_graphs", "activation_offload", "weight_dtype", "grad_reduce_in_bf16",
             "virtual_stages", "overlap_grad_reduce", "overlap_param_gather",
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


def host_link(offload: str, known: KnownChip | None) -> float | None:
    """The host link bandwidth [bytes/s per direction] activation offload copies over: the known chip's
    `host_link_bandwidth`; None without offload; InputError for a chip that states none."""
    if offload == "none":
        return None
    if known is None or not known.host_link_bandwidth:
        chip = f"{known.name} states no host_link_bandwidth" if known else "a searched chip has no host link figure"
        raise InputError(f"activation_offload: {chip}; allowed: none (layers on a known chip with the figure, "
                         "chip=h100_sxm)")
    return known.host_link_bandwidth


def plan_prices(mode: str, known: KnownChip | None, accelerator: AcceleratorConfig, area_budget: float | None,
                cluster: Network, design: SystemDesign | None) -> tuple:
    """The plan search's prices (`plan_settings.search_prices`): the run chip's, and with an
    architecture search (run_solver without a known chip) the corners of its candidates' (the
    template's within the area budget, or the system space's compute budget, and its options' links)."""
    if mode != "run_solver" or known is not None:
        return search_prices(known, accelerator, cluster)
    if design is None:
        return search_prices(known, accelerator, cluster, candidate_space(accelerator, area_budget))
    return search_prices(known, accelerator, cluster, candidate_space(accelerator, design.compute_budget),
                         [option.cluster for option in design.options])


def settings_from_config(config: Mapping, spec: ModelSpec | None = None) -> Settings:
    """Check every user-facing key of a composed configuration (plain containers, interpolations
    resolved; hydra's DictConfig is converted); `spec`: the model, given as a value (the Python API),
    instead of the `model` node's."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    config = {**config, "system": system_mapping(config["system"])}
    mode = choice("mode", config["mode"], MODES)
    spec = model_spec(config["model"], config["sequence_length"]) if spec is None else spec
    micro_batch_sizes = tuple(positive_integer("micro_batch_size", size, MAX_BATCH)
                              for size in values("micro_batch_size", config["micro_batch_size"]))
    sequence_length = spec.default_sequence_length if config["sequence_length"] is None else config["sequence_length"]
    widths = read_widths(config, spec)
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
    cache_dir = environment.cache_dir(config["cache_dir"])
    design = _system_design(config, known, accelerator, area_budget, cluster.num_devices) if mode == "run_solver" \
        else None
    spec = planned_spec(config["tensor_parallel_plan"], spec, micro_batch_sizes[0], sequence_length, widths,
                        lambda: plan_prices(mode, known, accelerator, area_budget, cluster, design), cache_dir)
    shardings = read_shardings(config)
    shard_width = config["data_parallel_shard_width"]
    baseline, baseline_split = fixed_megatron(config["model"], cluster.num_devices)
    offload = choice("activation_offload", config["activation_offload"], ACTIVATION_OFFLOADS)
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
                                 read_dispatch_share(config, known),
                                 choice("sharded_collectives", config["sharded_collectives"], SHARDED_COLLECTIVES),
                                 boolean("fp8_parameters", config["fp8_parameters"]),
                                 offload,
                                 weight_dtype=choice("weight_dtype", config["weight_dtype"], WEIGHT_DTYPES)),
        kernels=KernelOptions(boolean("sequence_parallel", config["sequence_parallel"]),
                              boolean("flash_attention", config["flash_attention"]),
                              choice("precision", config["precision"], PRECISIONS),
                              choice("fp8_recipe", config["fp8_recipe"], FP8_RECIPES),
                              boolean("cuda_graphs", config["cuda_graphs"])),
        step_model=step_model,
        baseline=baseline,
        baseline_split=baseline_split,
        host_link_bandwidth=host_link(offload, known),
    )
    STEP_MODELS[step_model].check(question)
    check_options_apply(config, spec, shardings)
    if known is not None:
        known.check_precision(question.kernels.precision)
        known.check_cuda_graphs(question.kernels.cuda_graphs)
    elif question.kernels.cuda_graphs:  # a template chip runs compiled programs: no kernel is launched per operator
        raise InputError("cuda_graphs: a template chip launches no kernel per operator; allowed: false "
                         "(true on a GPU: chip=h100_sxm)")
    elif question.kernels.fp8:  # the template's area and energy model has 16-bit multiply-accumulates only
        raise InputError("precision: a template chip prices 16-bit multiply-accumulates only; allowed: bf16, fp16 "
                         "(fp8 on a chip with FP8 figures: chip=h100_sxm)")
    axes = Axes(
        micro_batch_sizes=micro_batch_sizes,
        memory_capacities=tuple(hbm_bytes(size) for size in hbm_sizes),
        recompute=read_recompute(config, step_model),
        tensor_parallel_widths=widths,
        virtual_stages=read_virtual_stages(config, spec, step_model),
        expert_parallel_widths=read_expert_widths(config, spec),
        context_parallel_widths=read_context_widths(config, sequence_length),
        expert_tensor_parallel_widths=read_expert_tensor_widths(config, spec),
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
        cache_dir=cache_dir,
        accelerator=accelerator,
        area_budget=area_budget,
        search=choice("search", config["search"], STRATEGIES),
        schedule=read_schedule(config["schedule"]),
        candidate_sample=None if sample is None else positive_integer("candidate_sample", sample),
        n_jobs=n_jobs,
        known_chip=known,
        layout=predicted_layout(config, question, axes, known) if mode == "predict" else None,
        executor=executor,
        ray_address=ray_address,
        system_design=design,
        tensor_parallel_plan=str(config["tensor_parallel_plan"]),
    )
