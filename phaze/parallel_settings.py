"""The parallelism and schedule settings of a run read from its configuration: the tensor-,
expert-, expert-tensor- and context-parallel widths, the shardings, the virtual stages, the
recomputation modes, the scheduler's options and the layout `phaze predict` prices; each reader
returns typed values or raises one InputError naming the key and what is allowed."""

from __future__ import annotations

from collections.abc import Mapping


from phaze_common.checks import (
    InputError,
    choice,
    fraction,
    integer,
    is_integer,
    positive_integer,
    positive_number,
    values,
)
from graph_extract import ModelSpec, valid_tensor_parallel_widths
from phaze_hardware import (
    KNOWN_CHIPS,
    KnownChip,
)
from phaze import environment
from solver.search import ScheduleSettings
from solver.layout import Layout
from solver.layout_step import check_layout
from solver.question import Axes, Question, context_widths
from solver.schedule import BACKENDS, MILP_SOLVERS
from solver.step_models import STEP_MODELS
from solver.training_step import (DISPATCH_SMS, SHARDINGS, recompute_mode)

#: Bytes per GiB.
GIB = 2**30
#: Largest cluster [devices]: a million accelerators, beyond any training cluster built.
MAX_DEVICES = 1_048_576
#: Largest time limit of one layer schedule [s]: a day.
MAX_TIME_LIMIT_S = 86_400.0


def read_widths(config: Mapping, spec: ModelSpec) -> tuple[int, ...]:
    maximum = positive_integer("max_tensor_parallel_width", config["max_tensor_parallel_width"], MAX_DEVICES)
    width = config["tensor_parallel_width"]
    if width is None:
        return valid_tensor_parallel_widths(spec, maximum)
    if is_integer(width) and width > maximum and config["mode"] != "predict":  # predict prices the t given
        raise InputError(f"tensor_parallel_width: {width} exceeds max_tensor_parallel_width={maximum}")
    return (width,)


def read_expert_widths(config: Mapping, spec: ModelSpec) -> tuple[int, ...]:
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


def read_expert_tensor_widths(config: Mapping, spec: ModelSpec) -> tuple[int | None, ...]:
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


def read_dispatch_share(config: Mapping, known: KnownChip | None) -> float:
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


def check_options_apply(config: Mapping, spec: ModelSpec, shardings: tuple[str, ...]) -> None:
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


def read_context_widths(config: Mapping, sequence_length: int) -> tuple[int, ...]:
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


def read_shardings(config: Mapping) -> tuple[str, ...]:
    """The data-parallel shardings: one, or a list searched in one run."""
    return tuple(dict.fromkeys(choice("data_parallel_sharding", mode, SHARDINGS)
                               for mode in values("data_parallel_sharding", config["data_parallel_sharding"])))


def read_virtual_stages(config: Mapping, spec: ModelSpec, step_model: str) -> tuple[int, ...] | None:
    model = STEP_MODELS[step_model]
    if config["virtual_stages"] is None:
        return model.default_virtual_stages()
    choices = model.virtual_stages(spec.num_layers)
    given = tuple(dict.fromkeys(values("virtual_stages", config["virtual_stages"])))
    for value in given:
        if config["mode"] == "predict" and is_integer(value) and value > 0:
            continue  # the layout's rules check it against the given pipeline (solver.layout_step.fit_rules)
        if value not in choices:
            raise InputError(f"virtual_stages: {value!r} divides no pipeline of two or more stages of the "
                             f"{spec.num_layers} blocks of {spec.name}; allowed: {', '.join(map(str, choices))}")
    return given


#: The recomputation mode `phaze predict` prices when `recompute` is null: none, as Megatron-LM and
#: NeMo run unless told to recompute.
PREDICT_RECOMPUTE = "none"


def read_recompute(config: Mapping, step_model: str) -> tuple[str, ...]:
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


def read_schedule(schedule: Mapping) -> ScheduleSettings:
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


def predicted_layout(config: Mapping, question: Question, axes: Axes, known: KnownChip | None) -> Layout:
    """`phaze predict`'s layout: one value of every axis, a chip that exists, the training-step model,
    and the layout's rules (solver.layout_step.check_layout)."""
    step_model = question.step_model
    if not STEP_MODELS[step_model].prices_layouts:
        raise InputError(f"system: predict prices with the training-step model; system={step_model} has none")
    if known is None:
        raise InputError(f"chip: predict prices a chip that exists; allowed: {', '.join(KNOWN_CHIPS)} or a chip "
                         "file's path")
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
