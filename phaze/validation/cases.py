"""A published run as a case phaze predicts: its model, layout, training options and cluster (from
the run, or its recipe where the run does not state them), or why it is left out; and the
predictions of the cases."""

from __future__ import annotations

import itertools
import re
import dataclasses
from dataclasses import dataclass
from pathlib import Path


from phaze_common.checks import InputError
from graph_extract import KernelOptions, ModelSpec, extract
from graph_extract.extraction import check_request
from graph_extract.regions import RECOMPUTE_MODULES
from graph_extract.zoo import LLAMA_FAMILY
from phaze_hardware import KNOWN_CHIPS, SYSTEMS, KnownChip, Network, system_of
from solver.search import chip_costs
from solver.layer_costs import step_graphs
from solver.layout import Layout
from solver.layout_step import Prediction, predict
from solver.question import Axes, Question
from solver.training_step import DISPATCH_SMS, TrainingOptions, recompute_mode
from solver.training_step.memory import OP_LEVEL_MODE, PRODUCT_OUTPUTS_MODE

from phaze.settings import host_link
from phaze.validation.flops import framework_flops, measured_seconds
from phaze.validation.settings import (StatedSettings, stated_dispatcher, stated_precision, unknown_variant, unmodelled_attention,
                                      whole_step_graphs)
from phaze.validation.recipes import (GPT_FAMILY, MOE_VOCABULARY, ModelRecipe, RECIPES, Recipe, STATED_OVERLAPS,
                                     UNFUSED_ATTENTION_FRAMEWORKS, VALIDATED_CHIPS, tpu_runtime_reserve)


@dataclass(frozen=True)
class Case:
    """A calibration run phaze predicts: its inputs and its measured seconds per iteration (derived from
    tokens/s or model TFLOP/s when `time_from` says so); `assumed` names what came from the framework's
    recipe."""

    run_id: str
    chip: str
    system: str
    spec: ModelSpec
    precision: str
    sequence_length: int
    devices: int
    width: int
    stages: int
    degree: int
    virtual_stages: int
    micro_batch_size: int
    global_batch_size: int
    recompute: str
    sequence_parallel: bool
    training: TrainingOptions
    measured: float
    time_from: str = ""  # "" (stated), FROM_TOKENS or FROM_FLOPS
    assumed: tuple[str, ...] = ()
    recipe: str = ""  # the RECIPES entry `assumed` comes from
    expert_parallel_width: int = 1
    flash_attention: bool = True
    moe: bool = False
    context_parallel_width: int = 1
    expert_tensor_parallel_width: int | None = None  # None: t
    slices: int = 1  # a TPU run's slices, joined by the data-centre network
    fp8_recipe: str = "delayed"  # an FP8 run's scaling (`KernelOptions.fp8_recipe`)
    cuda_graphs: bool = False  # the whole step's kernels replayed from CUDA graphs

    @property
    def kernels(self) -> KernelOptions:
        """How the run's operators ran: its sequence parallelism, attention kernel, precision (`precision`
        names 16-bit ones "16-bit", priced as bf16), FP8 scaling and CUDA graphs."""
        return KernelOptions(sequence_parallel=self.sequence_parallel, flash_attention=self.flash_attention,
                             precision="bf16" if self.precision == "16-bit" else self.precision,
                             fp8_recipe=self.fp8_recipe, cuda_graphs=self.cuda_graphs)


def fully_sharded(sharding: str) -> bool:
    """Whether a run's `training.optimizer_sharding` says its weights are sharded too (ZeRO-3, FSDP)."""
    return "ZeRO-3" in sharding or sharding.startswith("FSDP") or "FSDP on" in sharding


def is_llama(model: dict) -> bool:
    """Whether the run's model is a Llama (the calibration set names them LLAMA...)."""
    return "LLAMA" in (model["name"] or "").upper()


def is_moe(model: dict) -> bool:
    return bool(model["moe_num_experts"]) or "MoE" in (model["architecture"] or "")


#: How a run may name Megatron-Core's recompute modules: the flag's names, and Megatron-MoE-ModelZoo's
#: tables' short ones (their "recompute" column: "norm, act" for --recompute-modules layernorm moe_act,
#: "shared_expert" for shared_experts).
MODULE_NAMES = {"norm": "layernorm", "act": "moe_act", "shared_expert": "shared_experts"}


#: MaxText's remat_policy `minimal` as a run's `recompute_detail` states it: JAX's
#: checkpoint_dots_with_no_batch_dims (maxtext MaxText/layers/models.py @ 76bd53b0f), phaze's
#: `product_outputs`.
MAXTEXT_MINIMAL = re.compile(r"remat_policy\W+minimal\b")


def stated_modules(detail: str) -> tuple[str, ...]:
    """The recompute modules a run's `recompute_detail` names: after `--recompute-modules`, or a
    "recompute modules: a, b" list (empty when it names none), in Megatron-Core's names."""
    words = detail.replace(",", " ").split()
    if "--recompute-modules" in words:
        following = words[words.index("--recompute-modules") + 1:]
        names = tuple(itertools.takewhile(lambda word: not word.startswith("--"), following))
    elif detail.startswith("recompute modules:"):
        names = tuple(detail.split(":", 1)[1].replace(",", " ").split())
    else:
        return ()
    return tuple(MODULE_NAMES.get(name, name) for name in names)


def run_recipe(run: dict) -> str | None:
    """The RECIPES entry of the run's framework release or source, if phaze knows it."""
    names = (run["training"]["framework"] or "", run["source_group"] or "")
    return next((name for name in RECIPES if any(text.startswith(name) for text in names)), None)


def model_spec(model: dict, sequence: int, family: dict) -> ModelSpec:
    """A mixture of experts or a Llama (Llama-family), a Megatron GPT, or a model of `family`, of the
    run's shape."""
    heads, kv_heads, head_dim = model["num_attention_heads"], model["num_kv_heads"], model["head_dim"]
    shape = dict(num_kv_heads=None if kv_heads in (None, heads) else kv_heads,
                 kv_channels=head_dim if head_dim and head_dim * heads != model["hidden_size"] else None)
    if is_moe(model):
        return ModelSpec(model["name"].lower(), model["num_layers"], model["hidden_size"], heads,
                         model["moe_ffn_hidden_size"], model["vocab_size"], sequence, sequence, **LLAMA_FAMILY,
                         num_experts=model["moe_num_experts"], experts_per_token=model["moe_top_k"], **shape)
    family = {**(dict(LLAMA_FAMILY, vocab_pad_multiple=128) if is_llama(model) else GPT_FAMILY), **family}
    return ModelSpec(re.sub(r"[^a-z0-9.-]+", "_", model["name"].lower()).strip("_"), model["num_layers"], model["hidden_size"], heads,
                     model["ffn_hidden_size"] or 4 * model["hidden_size"], model["vocab_size"], sequence, sequence,
                     **family, **shape)



def stated_training(run: dict, sequence_parallel: bool, recipe: Recipe | None, model_recipe: ModelRecipe | None
                    ) -> tuple[TrainingOptions, list[str]]:
    """The run's training options: what it states (its optimizer sharding, Megatron's overlap flags in
    its other settings), what is implied (--overlap-param-gather needs the distributed optimizer), and,
    where it says nothing of an option, its recipe's (named in the list returned)."""
    other, sharding = run["training"]["other_settings"] or "", run["training"]["optimizer_sharding"] or ""
    options = {name: any(flag in other for flag in flags) for name, flags in STATED_OVERLAPS.items()}
    # a mixture's dispatcher as the run states it: DeepEP (Megatron's flex dispatcher) sends a token
    # once a node; Megatron's 1F1B all-to-all overlap hides it behind another micro-batch's compute
    options["expert_dispatch"] = "deduplicated" if "deepep" in stated_dispatcher(other) else "all_to_all"
    options["overlap_expert_dispatch"] = "1f1b overlap" in other.lower()
    options["data_parallel_sharding"] = ("full" if fully_sharded(sharding) else
                                         "optimizer" if "distributed" in sharding.lower()
                                         or options["overlap_param_gather"] else "none")
    assumed = []
    if recipe is not None:
        wanted = dataclasses.asdict(recipe.training)
        wanted["tensor_parallel_overlap"] = model_recipe.tensor_parallel_overlap if model_recipe else \
            recipe.training.tensor_parallel_overlap
        for name, words in (("data_parallel_sharding", "distributed optimizer"),
                            ("overlap_grad_reduce", "gradient-sync overlap"),
                            ("overlap_param_gather", "weight-gather overlap"),
                            ("tensor_parallel_overlap", "tensor-parallel overlap"),
                            ("grad_reduce_in_bf16", "gradients in 16-bit"),
                            ("master_weight_remainders", "master-weight remainders"),
                            ("sharded_collectives", f"full sharding's collectives as {wanted['sharded_collectives']}"),
                            ("weight_dtype", "weights kept in float32")):
            said = options.get(name) is True or options.get(name) in ("optimizer", "full")  # what a run turns on
            if not said and wanted[name] != options.get(name, getattr(TrainingOptions(), name)) and (
                    name != "overlap_grad_reduce" or "grad" not in other):
                options[name] = wanted[name]
                assumed.append(words)
    if not sequence_parallel:  # Transformer Engine overlaps the collectives of sequence parallelism only
        options["tensor_parallel_overlap"] = False
    if options["data_parallel_sharding"] != "optimizer" or not options["overlap_grad_reduce"]:
        options["overlap_param_gather"] = False
    return TrainingOptions(**options), [words for words in assumed
                                        if (words != "tensor-parallel overlap" or options["tensor_parallel_overlap"])
                                        and (words != "weight-gather overlap" or options["overlap_param_gather"])]


def offloaded_recompute(training: dict, stated: StatedSettings) -> str | None:
    """The run's recomputation mode: its `activation_recompute`; for a run that offloads activations to
    host memory with MaxText's remat_policy `custom` (its `recompute_detail` names the tensors offloaded,
    the rest rematerialised) or states no mode, `full`: the layer's input kept (and offloaded), the rest
    recomputed. A simplification: the projections MaxText offloads too (query_proj, key_proj,
    value_proj, out_proj) are recomputed in phaze instead of copied back."""
    custom = "custom" in (training.get("recompute_detail") or "").lower()
    if stated.host_offload and (custom or training["activation_recompute"] is None):
        return "full"
    return training["activation_recompute"]


def case(run: dict) -> Case | str:
    """The run as phaze predicts it, or why it is left out."""
    model, hardware, training = run["model"], run["hardware"], run["training"]
    found = system_of(hardware["device_type"])
    if found is None:
        return f"hardware {hardware['device_type']}: not an {' or '.join(VALIDATED_CHIPS)}"
    chip, system = found.chip, found.name
    stated = StatedSettings.of(training)
    unmodelled = (unknown_variant(hardware["device_type"], KNOWN_CHIPS[chip].hbm_capacity)
                  or unmodelled_attention(model["architecture"] or ""))
    if unmodelled is not None:
        return unmodelled
    parallel, batch = run["parallelism"], run["batch"]
    recipe_name = run_recipe(run)
    recipe = RECIPES.get(recipe_name)
    model_recipe = recipe.models.get(model["name"]) if recipe else None
    assumed = []
    if model_recipe is not None and any(model[name] is None for name in model_recipe.shape):
        model = {**model, **{name: value for name, value in model_recipe.shape.items() if model[name] is None}}
        assumed.append("model shape")
    if is_moe(model) and model["vocab_size"] is None:
        vocabulary = next((size for prefix, size in MOE_VOCABULARY.items() if (model["name"] or "").startswith(prefix)),
                          None)
        if vocabulary is not None:
            model = {**model, "vocab_size": vocabulary}
            assumed.append("vocabulary")
    t, p = parallel["tensor_parallel"], parallel["pipeline_parallel"]
    settings = {"recompute": offloaded_recompute(training, stated), "precision": training["precision"],
                "micro-batch": batch["micro_batch_size_seqs"]}
    sequence_parallel = parallel["sequence_parallel"]
    if recipe is not None:  # what the run does not state, from its framework's recipe
        defaults = {"recompute": (model_recipe and model_recipe.recompute) or recipe.recompute,
                    "precision": recipe.precision, "micro-batch": recipe.micro_batch_size}
        for name, default in defaults.items():
            if settings[name] is None and default is not None:
                settings[name] = default
                assumed.append(name)
        if sequence_parallel is None and (t or 1) > 1:  # no meaning at t = 1
            sequence_parallel = recipe.sequence_parallel
            assumed.append("sequence parallel")
    recompute, precision, micro_batch = settings["recompute"], settings["precision"], settings["micro-batch"]
    sequence_parallel = bool(sequence_parallel) and (t or 1) > 1
    options, implied = stated_training(run, sequence_parallel, recipe, model_recipe)
    if options.overlap_expert_dispatch:  # Megatron's --moe-deepep-num-sms default of the chip's SMs
        options = dataclasses.replace(options, expert_dispatch_compute_share=(
            DISPATCH_SMS / KNOWN_CHIPS[chip].streaming_multiprocessors))
    assumed += implied
    precision_name = stated_precision(precision or "")
    precision_name = "16-bit" if precision_name in ("bf16", "fp16") else precision_name
    if precision_name != "16-bit" and precision_name not in KNOWN_CHIPS[chip].precisions:
        return f"{precision_name.upper()} precision: {chip} has no {precision_name.upper()} tensor cores"
    if stated.fp8_parameters:
        options = dataclasses.replace(options, fp8_parameters=True)
    if stated.host_offload:
        options = dataclasses.replace(options, activation_offload="layers")
    if stated.weight_dtype is not None:
        options = dataclasses.replace(options, weight_dtype=stated.weight_dtype)
    if (reserve := tpu_runtime_reserve(chip)) is not None:  # a TPU: the runtime's HBM, no CUDA context
        options = dataclasses.replace(options, framework_reserve=reserve)
    context = parallel["context_parallel"] or 1
    degree, slices = parallel["data_parallel"], 1
    multislice = recipe is not None and recipe.multislice
    if multislice and parallel["fsdp_parallel"] is not None:
        slices, degree = degree or 1, None  # MaxText: data_parallel counts slices; d is every FSDP rank
    if degree is None and t and p and hardware["num_devices"] % (t * p * context) == 0:
        degree = hardware["num_devices"] // (t * p * context)
    # sharded within a slice, replicated across slices (hybrid sharding), unless MaxText's
    # dcn_fsdp_parallelism shards across the slices too
    across_slices = "dcn_fsdp_parallelism" in (training.get("optimizer_sharding") or "")
    if slices > 1 and not across_slices:
        if degree is None or degree % slices:
            return f"{slices} slices do not split the data-parallel ranks"
        options = dataclasses.replace(options, data_parallel_shard_width=degree // slices)
    if multislice and micro_batch and t:
        micro_batch *= t  # MaxText's per_device_batch_size counts a chip's; a tensor group runs t of them at once
    needed = {"model.num_layers": model["num_layers"], "model.hidden_size": model["hidden_size"],
              "model.num_attention_heads": model["num_attention_heads"], "model.seq_length_tokens": model["seq_length_tokens"],
              "model.vocab_size": model["vocab_size"], "parallelism.tensor_parallel": t,
              "parallelism.pipeline_parallel": p, "parallelism.data_parallel": degree,
              "batch.micro_batch_size_seqs": micro_batch,
              "batch.global_batch_size_seqs": batch["global_batch_size_seqs"],
              "training.activation_recompute": recompute, "training.precision": precision}
    if is_llama(model):
        needed["model.ffn_hidden_size"] = model["ffn_hidden_size"]
    if is_moe(model):
        needed.update({"model.name": model["name"], "model.moe_num_experts": model["moe_num_experts"],
                       "model.moe_top_k": model["moe_top_k"],
                       "model.moe_ffn_hidden_size": model["moe_ffn_hidden_size"],
                       "parallelism.expert_parallel": parallel["expert_parallel"]})
    missing = [name for name, value in needed.items() if value is None]
    if missing:
        return f"not stated: {', '.join(missing)}"
    if micro_batch and batch["global_batch_size_seqs"] % (micro_batch * degree):
        return f"micro-batch {micro_batch} from the recipe does not divide the batch per replica"
    sequence = model["seq_length_tokens"]
    family = {**(model_recipe.family if model_recipe else {}), **(recipe.family if recipe else {})}
    spec = model_spec(model, sequence, family)
    seconds, time_from = measured_seconds(run, framework_flops(recipe, spec, batch["global_batch_size_seqs"], sequence, t)
                                          if recipe and recipe.model_flops else None)
    if seconds is None:
        return "no time per iteration, tokens/s or model TFLOP/s measured"
    if recompute == "selective" and "selective_ac_option 'op'" in (training.get("recompute_detail") or ""):
        recompute = OP_LEVEL_MODE  # torchtitan's operator-level policy
    if recompute == "selective" and MAXTEXT_MINIMAL.search(training.get("recompute_detail") or ""):
        recompute = PRODUCT_OUTPUTS_MODE  # JAX's checkpoint_dots_with_no_batch_dims
    modules = stated_modules(training.get("recompute_detail") or "")
    if modules and recompute == "selective":  # Megatron-Core's selective granularity, its modules as stated
        try:
            recompute = recompute_mode("+".join(modules))
        except InputError:
            return f"recompute modules {', '.join(modules)}: not all modelled (allowed: {', '.join(RECOMPUTE_MODULES)})"
    experts, expert_width = 1, None
    if is_moe(model):  # Megatron's EP and ETP are phaze's e and τ (`solver.layout`)
        experts, expert_width = parallel["expert_parallel"], parallel["expert_tensor_parallel"]
        if expert_width is None and recipe is not None and recipe.expert_tensor_parallel is not None:
            expert_width = recipe.expert_tensor_parallel
            assumed.append("expert tensor parallel")
        if not Layout(t, data_parallel_width=degree, expert_parallel_width=experts, context_parallel_width=context,
                      expert_tensor_parallel_width=expert_width).experts_fit() or model["moe_num_experts"] % experts:
            return "expert layout (EP x ETP not dividing t x cp x d, EP the experts, or ETP t) is not modelled"
    return Case(
        run_id=run["run_id"], chip=chip, system=system, spec=spec, precision=precision_name,
        sequence_length=sequence, devices=hardware["num_devices"], width=t, stages=p, degree=degree,
        virtual_stages=parallel["virtual_pipeline_chunks_per_device"] or 1,
        micro_batch_size=micro_batch, global_batch_size=batch["global_batch_size_seqs"],
        recompute=recompute, sequence_parallel=sequence_parallel, training=options, measured=seconds,
        time_from=time_from, assumed=tuple(assumed), recipe=recipe_name if assumed else "",
        expert_parallel_width=experts, expert_tensor_parallel_width=expert_width,
        flash_attention=not (training["framework"] or "").startswith(UNFUSED_ATTENTION_FRAMEWORKS),
        moe=is_moe(model), context_parallel_width=context, slices=slices,
        fp8_recipe=(stated.fp8_recipe or "delayed") if precision_name == "fp8" else "delayed",
        cuda_graphs=whole_step_graphs(stated.cuda_graphs),
    )


def prediction(item: Case, cache_dir: Path, chip: KnownChip | None = None, cluster: Network | None = None
               ) -> Prediction:
    """The run predicted by phaze: its model on its cluster in its precision (by default the system's
    chip and cluster; others to calibrate them)."""
    spec = item.spec
    cluster = cluster or SYSTEMS[item.system].cluster(item.devices, item.slices)
    chip = chip or KNOWN_CHIPS[item.chip]
    question = Question(spec, item.sequence_length, item.global_batch_size, cluster, item.training, item.kernels,
                        host_link_bandwidth=host_link(item.training.activation_offload, chip))
    axes = Axes((item.micro_batch_size,), (chip.hbm_capacity,), (item.recompute,), (item.width,), (item.virtual_stages,),
                (item.expert_parallel_width,), (item.context_parallel_width,),
                expert_tensor_parallel_widths=(item.expert_tensor_parallel_width,))
    layout = Layout(item.width, item.stages, item.degree, item.virtual_stages, item.expert_parallel_width,
                    item.context_parallel_width, item.expert_tensor_parallel_width)
    graphs = extract(spec, item.micro_batch_size, item.sequence_length, item.width, cache_dir=cache_dir)
    costs = chip_costs(question, axes, {item.width: graphs}, chip, cache_dir)
    return predict(question, axes, layout, graphs, step_graphs({item.width: graphs}, costs)[item.width], chip)


def run_cases(runs: list[dict]) -> list[tuple[dict, Case | str]]:
    """Each run with its Case or why it is left out, before any prediction: a run whose shape or layout
    phaze refuses (key/value heads not dividing the heads, t not dividing them, devices not filling
    nodes) is an InputError naming it."""
    found = []
    for run in runs:
        try:
            item = case(run)
            if isinstance(item, Case):
                check_request(item.spec, item.micro_batch_size, item.sequence_length, item.width)
                SYSTEMS[item.system].cluster(item.devices, item.slices)
        except ValueError as problem:
            raise InputError(f"FILE: run {run['run_id']!r}: {' '.join(str(problem).split())}") from None
        found.append((run, item))
    return found


def predictions(cases: list[tuple[dict, Case | str]], cache_dir: Path
                ) -> tuple[list[tuple[Case, Prediction]], list[tuple[str, str]]]:
    """(predicted cases with their predictions, (run id, why left out)) of `run_cases`'s answer."""
    predicted, left_out = [], []
    for run, found in cases:
        if isinstance(found, str):
            left_out.append((run["run_id"], found))
            continue
        try:
            predicted.append((found, prediction(found, cache_dir)))
        except ValueError as problem:  # a layout only the graphs refuse (p·v not splitting the blocks)
            raise InputError(f"FILE: run {found.run_id!r}: {' '.join(str(problem).split())}") from None
    return predicted, left_out


def validate(runs: list[dict], cache_dir: Path) -> tuple[list[tuple[Case, Prediction]], list[tuple[str, str]]]:
    """(predicted cases with their predictions, (run id, why left out))."""
    return predictions(run_cases(runs), cache_dir)


def sharded_or_context_parallel(item: Case) -> bool:
    """Whether a run shards its weights or gradients over data parallelism (ZeRO-2/3, FSDP) or splits
    its sequences over context parallelism: the runs `validate` reports together beside the chips'."""
    return item.training.data_parallel_sharding in ("gradients", "full") or item.context_parallel_width > 1

