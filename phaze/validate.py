"""`phaze validate FILE`: phaze's predictions against published measured training runs.

FILE is a calibration set (arch_configs/calibration/runs.json). A run is predicted when it is a
model on A100 or H100 GPUs whose configuration is given: the model's shape, t, p, d, the
micro-batch and batch sizes, the recomputation, the precision (16-bit, or FP8 on a chip with FP8
figures), a time per iteration, and a parallelism phaze models (t, p, d, v, context parallelism,
weights sharded as ZeRO-3 / FSDP do; for a mixture of experts, Megatron's EP x ETP ranks as e =
EP·ETP / t replicas with the experts split t ways). Every other run is listed with why it is left out. A GPT run is a Megatron
GPT of its shape, a Llama or MoE run (Qwen3) a Llama-family model (`graph_extract.zoo.LLAMA_FAMILY`:
grouped-query attention, SwiGLU, RMSNorm, untied embeddings; a Llama's vocabulary padded to 128·t
as Megatron does); the cluster is
DGX A100 or DGX H100 nodes; the gradient sync overlaps the backward pass where the run says so
(PyTorch DDP, --overlap-grad-reduce) or its recipe does.

Where a run states no time per iteration, it is the global batch's tokens / the measured tokens per
second (marked). FP8 runs price their GEMMs at the chip's FP8 rate and all else as in 16-bit
(`phaze_hardware.chips`). What a Llama run of NeMo 24.07 or Megatron-Bridge 25.11 does not state (the
Llama 2 shapes, recomputation, sequence parallelism, distributed optimizer, gradient-sync overlap) is
taken from that release's published recipe (`RECIPES`, `LLAMA2_SHAPES`; marked); d, when not
stated, is devices / (t·p·cp).

Every field phaze reads is checked before any prediction (`read_runs`, `run_error`, `run_cases`): a
file that is not a list of runs, a run without one of its sections, a field stated with a value it
cannot take (a count that is not a positive integer, a measured time or tokens/s that is not a
positive finite number), t·p·d·cp differing from the devices or a global batch not a multiple of
micro-batch × d is one line `phaze: error: FILE: run 'id': field: ...` and status 2. A field that is
absent or null is not stated: the run is left out when phaze needs it. The traced graphs are cached
in `cache_dir=PATH`, by default the per-user cache folder $XDG_CACHE_HOME/phaze (else ~/.cache/phaze),
never in the working directory unasked. `--markdown` prints the same report as Markdown tables (the
documentation site's validation page is made from it).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import tempfile
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from phaze_common.checks import InputError
from graph_extract import KernelOptions, ModelSpec, extract, get_spec
from graph_extract.extraction import check_request
from graph_extract.regions import RECOMPUTE_MODULES
from graph_extract.zoo import LLAMA_FAMILY
from phaze_hardware import KNOWN_CHIPS, SYSTEMS, KnownChip, Network, system_of
from phaze.environment import user_cache_dir
from solver.codesign import chip_costs
from solver.layer_costs import step_graphs
from solver.layout import Layout
from solver.predict import Prediction, predict
from solver.question import Axes, Question
from solver.training_step import DISPATCH_SMS, RECOMPUTE_MODES, TrainingOptions, recompute_mode

#: How published runs name the chips phaze predicts them on (GPUs priced by their roofline, TPUs by the
#: template's estimator and schedules).
VALIDATED_CHIPS = tuple(sorted(name for system in SYSTEMS.values() for name in KNOWN_CHIPS[system.chip].names))


#: Frameworks of runs measured before fused attention kernels: FlashAttention was published in May 2022
#: (Dao et al.) and reached Megatron-LM as --use-flash-attn in 2023; these ran 2020-21 Megatron-LM,
#: whose attention writes and keeps the s x s scores.
UNFUSED_ATTENTION_FRAMEWORKS = ("Megatron-LM (2021)", "Megatron-LM v1 (2020)", "Megatron-LM PTD-P",
                                "Megatron-LM + DeepSpeed")

#: Marks in the table: the time per iteration derived from tokens/s, or from the run's model TFLOP/s
#: by its framework's FLOP formula; settings taken from the recipe.
FROM_TOKENS, FROM_FLOPS, FROM_RECIPE = "†", "§", "‡"

#: Megatron GPT models (LayerNorm, GeLU, learned positions, biases, tied embeddings, dropout 0.1,
#: vocabulary padded to 128·t): the zoo's GPT-3 with the run's shape.
GPT_FAMILY = {name: getattr(get_spec("megatrongpt3"), name) for name in (
    "norm", "activation", "position_embedding", "bias", "tied_lm_head", "dropout", "fused_qkv", "vocab_pad_multiple")}
#: Nemotron-4 (Parmar et al. 2024, "Nemotron-4 15B Technical Report"; NeMo's nemotron recipes):
#: squared ReLU, LayerNorm (layernorm1p: the same cost), rotary positions (on half of each head, which
#: changes no shape), no biases, untied embeddings, no dropout.
NEMOTRON_FAMILY = dict(norm="layernorm", activation="squared_relu", position_embedding="rotary", bias=False,
                       tied_lm_head=False, dropout=0.0, fused_qkv=False, vocab_pad_multiple=128)

#: MaxText's decoder as of its 2023-12 configs (MaxText/configs/base.yml at 76bd53b0f): RMSNorm, rotary
#: positions, a two-matrix ReLU MLP (mlp_activations ["relu"]), separate query, key and value
#: projections, no biases, no dropout (dropout_rate 0), the logits through the embedding
#: (logits_via_embedding: tied), the vocabulary as given.
MAXTEXT_FAMILY = dict(norm="rmsnorm", activation="relu", position_embedding="rotary", bias=False, tied_lm_head=True,
                      dropout=0.0, fused_qkv=False, vocab_pad_multiple=1)


@dataclass(frozen=True)
class ModelRecipe:
    """A model as a release's recipe defines it, for runs that name it only: the run's model fields it
    fills (`shape`: num_layers, hidden_size, ...), its family (`graph_extract.ModelSpec` fields), and
    where its recipe differs from its release's: recomputation, Transformer Engine's tensor-parallel
    overlap (userbuffers, at t > 1)."""

    shape: dict
    family: dict
    recompute: str | None = None
    tensor_parallel_overlap: bool = False


@dataclass(frozen=True)
class Recipe:
    """What a framework release's published recipe sets where a run does not say: recomputation,
    sequence parallelism (at t > 1), the training options (sharding, overlaps; the tensor-parallel
    overlap at t > 1 with sequence parallelism), precision and micro-batch size, the models it names
    (`models`), the model fields of every run (`family`), and whether its runs' model TFLOP/s follow
    Megatron's FLOP formula (`model_flops`: the time per iteration is derived from them)."""

    recompute: str
    sequence_parallel: bool
    training: TrainingOptions
    source: str
    precision: str | None = None
    micro_batch_size: int | None = None
    models: dict[str, ModelRecipe] = field(default_factory=dict)
    family: dict = field(default_factory=dict)
    model_flops: bool = False
    expert_tensor_parallel: int | None = None  # a mixture's --expert-tensor-parallel-size (None: t)
    flop_count: str = "megatron"  # whose FLOP formula its model TFLOP/s follow: "megatron" or "maxtext"
    # the share of the whole s x s attention that formula counts: 1, half (Megatron's 2025, MaxText's
    # after 2023-11-30: causal), 0 (MaxText's before June 2023)
    flops_attention: float = 1.0
    multislice: bool = False  # its data_parallel counts slices over the data-centre network, FSDP each slice


def _llama2(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, overlap: bool = False) -> ModelRecipe:
    return ModelRecipe(dict(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
                            ffn_hidden_size=ffn, vocab_size=32000), LLAMA_FAMILY, tensor_parallel_overlap=overlap)


def _shape(layers: int, hidden: int, heads: int, vocabulary: int, kv_heads: int | None = None) -> dict:
    return dict(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
                ffn_hidden_size=4 * hidden, vocab_size=vocabulary)


_ADAM_SHARDED = dict(optimizer="adam", data_parallel_sharding="optimizer", overlap_grad_reduce=True)

def _maxtext(flop_count: str, attention: float) -> Recipe:
    """MaxText's recipe for one README table (the three differ only in the FLOP count of their day)."""
    return Recipe(
        "full", True, TrainingOptions("adam", "full", overlap_grad_reduce=True, tensor_parallel_overlap=True),
        "AI-Hypercomputer/maxtext MaxText/configs/base.yml and configs/{v4,v5e,v5p}/*.sh @ 76bd53b0f: the "
        "decoder of MAXTEXT_FAMILY; weights, gradients and optimizer state sharded over each slice's "
        "ici_fsdp_parallelism ranks (FSDP), replicated over dcn_data_parallelism slices (hybrid sharding); "
        "the tensor axis shards the activations' embedding between blocks (as sequence parallelism does); "
        "remat_policy full = full recomputation, minimal = the matmul outputs kept (selective); the scripts' "
        "LIBTPU_INIT_ARGS (--xla_tpu_enable_async_collective_fusion, ..._fuse_all_gather, "
        "--xla_tpu_overlap_compute_collective_tc) overlap the collectives, the tensor axis's too, with the "
        f"matrix products; the time from TFLOP/s by MaxText's calculate_training_tflops {flop_count}",
        family=MAXTEXT_FAMILY, model_flops=True, flop_count="maxtext", flops_attention=attention, multislice=True)


#: The recipes of the releases the calibration set's runs were measured with (by framework or source).
RECIPES = {
    "NeMo 24.07": Recipe(
        "none", True, TrainingOptions(**_ADAM_SHARDED, overlap_param_gather=True, grad_reduce_in_bf16=True,
                                      master_weight_remainders=True),
        "NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/{gpt3,nemotron,llama}/*.yaml and "
        "examples/training/*/h100/*_fp8.sh: activations_checkpoint_granularity null (Nemotron-340B: selective), "
        "sequence_parallel true at t > 1, optim distributed_fused_adam with overlap_grad_sync and "
        "overlap_param_sync, grad_sync_dtype bf16 (NeMo's MegatronDistributedFusedAdam keeping bf16 weights with 16-bit remainders as master weights), ub_tp_comm_overlap true for GPT3-20B, Nemotron-8B/22B, "
        "Llama2-70B and Llama3-70B; model shapes of the yamls (GPT-3: GPT-2 BPE vocabulary 50,257; Nemotron: 256,000)",
        models={
            "LLAMA2-7B": _llama2(32, 4096, 32, 32, 11008), "LLAMA2-13B": _llama2(40, 5120, 40, 40, 13824),
            "LLAMA2-70B": _llama2(80, 8192, 64, 8, 28672, overlap=True),
            # Llama 3's shape comes with its runs (Llama 3 paper, Table 3); its 70B yaml adds the overlap
            "LLAMA3-70B": ModelRecipe({}, {}, tensor_parallel_overlap=True),
            "GPT3-5B": ModelRecipe(_shape(24, 4096, 32, 50257), GPT_FAMILY),
            "GPT3-20B": ModelRecipe(_shape(44, 6144, 48, 50257), GPT_FAMILY, tensor_parallel_overlap=True),
            "GPT3-175B": ModelRecipe(_shape(96, 12288, 96, 50257), GPT_FAMILY),
            "Nemotron-8B": ModelRecipe(_shape(32, 4096, 32, 256000), NEMOTRON_FAMILY, tensor_parallel_overlap=True),
            "Nemotron-22B": ModelRecipe(_shape(40, 6144, 48, 256000), NEMOTRON_FAMILY, tensor_parallel_overlap=True),
            "Nemotron-340B": ModelRecipe(_shape(96, 18432, 96, 256000, kv_heads=8), NEMOTRON_FAMILY,
                                         recompute="selective"),
        }),
    "Megatron-Bridge / NeMo 25.11": Recipe(
        "none", True, TrainingOptions(**_ADAM_SHARDED, overlap_param_gather=True, grad_reduce_in_bf16=True,
                                      tensor_parallel_overlap=True),
        "Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py (llama3_70b_pretrain_config): "
        "recompute_granularity None, sequence_parallel True, use_distributed_optimizer, overlap_grad_reduce, "
        "overlap_param_gather, tp_comm_overlap (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192), "
        "grad_reduce_in_fp32 False; scripts/performance configs LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS: t4 p8 v5"),
    "Megatron-Core r0.8.0": Recipe(
        "none", True, TrainingOptions(**_ADAM_SHARDED, overlap_param_gather=True, tensor_parallel_overlap=True),
        "Megatron-LM README (2024 weak scaling, Megatron-Core r0.8.0): --overlap-grad-reduce "
        "--overlap-param-gather --tp-comm-overlap, vocabulary 131,072, sequence 4,096; not stated, taken as "
        "megatron/training/arguments.py's defaults and asserts: the distributed optimizer and sequence "
        "parallelism (asserted by the overlaps), no recomputation, 4h GeLU MLP, LayerNorm, learned "
        "positions, multi-head attention; BF16 (MFU = TFLOP/s / 989, the BF16 peak), micro-batch 1, "
        "embeddings untied (the size labels count 2Vh), no interleaving; the time from model TFLOP/s by "
        "megatron/training/training.py's num_floating_point_operations",
        precision="BF16", micro_batch_size=1, family={"tied_lm_head": False}, model_flops=True),
    "Megatron-MoE-ModelZoo": Recipe(
        "none", True, TrainingOptions(**_ADAM_SHARDED),
        "yanring/Megatron-MoE-ModelZoo model_configs/benchmarking/Qwen3-235B-A22B.yaml @ 1ed4179f72e4: "
        "--use-distributed-optimizer, --overlap-grad-reduce, --sequence-parallel, "
        "--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split, tokenizer "
        "Qwen/Qwen3-235B-A22B with --make-vocab-size-divisible-by 1187 (vocabulary 151,936 = 1187 x 128), "
        "--expert-tensor-parallel-size 1; no recomputation flag (the benchmark rows add theirs); micro-batch 1 (runtime_configs/benchmarking/"
        "runtime.conf @ c1ad0b5c89f4); the time from TFLOP/s by Megatron-LM's num_floating_point_operations "
        "as of 2025 (causal attention counted half: the rows stating both agree within 0.5 %)",
        micro_batch_size=1, model_flops=True, flops_attention=0.5, expert_tensor_parallel=1),
    "Megatron-LM + DeepSpeed ZeRO-3": Recipe(
        "full", False, TrainingOptions("adam", "full", grad_reduce_in_bf16=True,
                                       sharded_collectives="blocking_tensors"),
        "Narayanan et al. SC'21 Sec. 5.2 and Table 2 (the ZeRO-3 rows: DeepSpeed's ZeRO-3 on Megatron's "
        "GPT-3 175B and 530B without model parallelism): every layer's activations recomputed, as the "
        "paper's FLOP count (Eq. 3, four passes) assumes for these rows too; fp16 gradients reduced in "
        "16 bits (DeepSpeed's ZeRO); DeepSpeed's ZeRO-3 as of the paper (spring 2021, before release "
        "0.5): each weight tensor of 10^5 elements or more gathered by a collective of its own before "
        "the forward, the recomputed forward and (when freed since, by its reuse distance) the backward, "
        "and each gradient reduce-scattered alone "
        "(deepspeed/runtime/zero/partition_parameters.py and stage3.py at adac058ac, April 2021), "
        "none of them overlapping the compute: every gather synchronised the device (DeepSpeed PR "
        "#1188, June 2021, 'the async version is not async at all'); each with that release's host "
        "work (a fetch a tensor, a Python view and a PyTorch 1.8 copy a member of the group) and "
        "copies in HBM", precision="fp16"),
    "MaxText TPU v5p": _maxtext("of that commit (half the s x s attention)", 0.5),
    "MaxText TPU v5e": _maxtext("as of its table's first publication, 2023-11-08 (the whole s x s attention, "
                                "before 4e41a72d1 halved it)", 1.0),
    "MaxText TPU v4": _maxtext("as of its table's first publication, spring 2023 (6 FLOPs per parameter per "
                               "token, no attention term)", 0.0),
}
#: Vocabulary of MoE runs that do not state it, by model name prefix (the recipe's tokenizer).
MOE_VOCABULARY = {"Qwen3-235B": 151936}
#: What a run's `training.other_settings` may state, by Megatron's flag (or PyTorch DDP's name).
STATED_OVERLAPS = {"overlap_grad_reduce": ("--overlap-grad-reduce", "DDP impl=torch"),
                   "overlap_param_gather": ("--overlap-param-gather",),
                   "tensor_parallel_overlap": ("--tp-comm-overlap",)}


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

    @property
    def kernels(self) -> KernelOptions:
        """How the run's operators ran: its sequence parallelism, attention kernel and precision."""
        return KernelOptions(self.sequence_parallel, self.flash_attention, "fp8" if self.precision == "fp8" else "bf16")


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


def megatron_model_flops(spec: ModelSpec, batch: int, sequence: int, width: int, attention: float = 1.0) -> float:
    """FLOPs per iteration as Megatron-LM counts them (megatron/training/training.py,
    num_floating_point_operations): 12·B·s·L·h²·((1 + g/a + s/h)·(a·k/h) + MLP/(L·h) + V/(2·L·h)),
    the MLP term Σ over blocks of the dense width f, or a mixture's k routed experts' width plus its
    shared experts', × 3/2 when gated (SwiGLU), and the padded vocabulary V. Release core_r0.8.0
    counts the full s × s attention; 2025's half of it, s/(2h) (`attention`: the share counted). Multi-head latent
    attention is not counted here (no calibration run has it)."""
    h, heads, layers = spec.hidden_size, spec.num_heads, spec.num_layers
    groups, channels = spec.num_kv_heads or heads, spec.kv_channels or h // heads
    gated = 1.5 if spec.activation == "swiglu" else 1.0
    moe_blocks = sum(spec.is_moe_block(index) for index in range(layers))
    routed = spec.expert_ffn_hidden_size * (spec.experts_per_token + spec.shared_experts) if spec.num_experts else 0
    mlp = ((layers - moe_blocks) * spec.ffn_hidden_size + moe_blocks * routed) * gated
    return 12 * batch * sequence * layers * h * h * (
        (1 + groups / heads + attention * sequence / h) * heads * channels / h + mlp / (layers * h)
        + spec.padded_vocab_size(width) / (2 * layers * h))


def maxtext_model_flops(spec: ModelSpec, batch: int, sequence: int, attention: float = 0.5) -> float:
    """FLOPs per iteration as MaxText counts its TFLOP/s (MaxText/train.py calculate_training_tflops at
    76bd53b0f): 6 per parameter per token, every parameter counted (the tied embedding, one norm per
    parallel block, the query, key and value norms), plus `attention` × 12·L·a·d_head·s² per sequence.
    Its READMEs' tables were measured under the formula of their day: the whole s × s (v5e, Nov 2023:
    `attention` 1), half of it (v5p, Dec 2023, after 4e41a72d1: 0.5), none (v4, spring 2023: 0)."""
    h, heads, layers = spec.hidden_size, spec.num_heads, spec.num_layers
    channels = spec.kv_channels or h // heads
    kv_heads = spec.num_kv_heads or heads
    block = h * channels * (2 * heads + 2 * kv_heads) + 2 * h * spec.ffn_hidden_size + h + 3 * channels
    parameters = layers * block + spec.vocab_size * h + h  # the embedding (tied), the final norm
    return 6 * parameters * batch * sequence + attention * 12 * layers * heads * channels * sequence**2 * batch


def measured_seconds(run: dict, flops: float | None = None) -> tuple[float | None, str]:
    """(seconds per iteration, how derived): the stated or derived time; else the global batch's tokens
    (sequences × sequence length) / the measured tokens per second; else, given the FLOPs of an
    iteration as the run's framework counts them (`flops`), those / (the measured model TFLOP/s × the
    devices)."""
    measured = run["measured"]
    seconds = measured["seconds_per_iteration"] or measured["seconds_per_iteration_derived"]
    if seconds is not None:
        return float(seconds), ""
    tokens_per_s = measured["tokens_per_sec_total"] or (
        measured["tokens_per_sec_per_device"] and measured["tokens_per_sec_per_device"] * run["hardware"]["num_devices"])
    if tokens_per_s:
        return run["batch"]["global_batch_size_seqs"] * run["model"]["seq_length_tokens"] / tokens_per_s, FROM_TOKENS
    if flops is not None and measured["tflop_per_s_per_device"]:
        return flops / (measured["tflop_per_s_per_device"] * 1e12 * run["hardware"]["num_devices"]), FROM_FLOPS
    return None, ""


def framework_flops(recipe: Recipe, spec: ModelSpec, batch: int, sequence: int, width: int) -> float:
    """FLOPs of an iteration of `batch` sequences as the recipe's framework counts its model TFLOP/s."""
    if recipe.flop_count == "maxtext":
        return maxtext_model_flops(spec, batch, sequence, recipe.flops_attention)
    return megatron_model_flops(spec, batch, sequence, width, recipe.flops_attention)


def stated_training(run: dict, sequence_parallel: bool, recipe: Recipe | None, model_recipe: ModelRecipe | None
                    ) -> tuple[TrainingOptions, list[str]]:
    """The run's training options: what it states (its optimizer sharding, Megatron's overlap flags in
    its other settings), what is implied (--overlap-param-gather needs the distributed optimizer), and,
    where it says nothing of an option, its recipe's (named in the list returned)."""
    other, sharding = run["training"]["other_settings"] or "", run["training"]["optimizer_sharding"] or ""
    options = {name: any(flag in other for flag in flags) for name, flags in STATED_OVERLAPS.items()}
    # a mixture's dispatcher as the run states it: DeepEP (Megatron's flex dispatcher) sends a token
    # once a node; Megatron's 1F1B all-to-all overlap hides it behind another micro-batch's compute
    options["expert_dispatch"] = "deduplicated" if "deepep" in other.lower() else "all_to_all"
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
                            ("sharded_collectives", "a collective per weight tensor, blocking")):
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


def case(run: dict) -> Case | str:
    """The run as phaze predicts it, or why it is left out."""
    model, hardware, training = run["model"], run["hardware"], run["training"]
    found = system_of(hardware["device_type"])
    if found is None:
        return f"hardware {hardware['device_type']}: not an {' or '.join(VALIDATED_CHIPS)}"
    chip, system = found.chip, found.name
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
    settings = {"recompute": training["activation_recompute"], "precision": training["precision"],
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
    precision_name = "fp8" if "FP8" in (precision or "").upper() else "16-bit"
    if precision_name == "fp8" and not KNOWN_CHIPS[chip].has_fp8:
        return f"FP8 precision: {chip} has no FP8 tensor cores"
    context = parallel["context_parallel"] or 1
    degree, slices = parallel["data_parallel"], 1
    multislice = recipe is not None and recipe.multislice
    if multislice and parallel["fsdp_parallel"] is not None:
        slices, degree = degree or 1, None  # MaxText: data_parallel counts slices; d is every FSDP rank
    if degree is None and t and p and hardware["num_devices"] % (t * p * context) == 0:
        degree = hardware["num_devices"] // (t * p * context)
    if slices > 1:  # sharded within a slice, replicated across slices (hybrid sharding)
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
    )


def prediction(item: Case, cache_dir: Path, chip: KnownChip | None = None, cluster: Network | None = None
               ) -> Prediction:
    """The run predicted by phaze: its model on its cluster in its precision (by default the system's
    chip and cluster; others to calibrate them)."""
    spec = item.spec
    cluster = cluster or SYSTEMS[item.system].cluster(item.devices, item.slices)
    question = Question(spec, item.sequence_length, item.global_batch_size, cluster, item.training, item.kernels)
    chip = chip or KNOWN_CHIPS[item.chip]
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


#: `phaze validate`'s overrides (key=value after FILE): what each sets.
OVERRIDES = {"cache_dir": "the folder extracted graphs are cached in"}
SYNOPSIS = "phaze validate FILE [cache_dir=PATH]"
USAGE = (f"usage: {SYNOPSIS}   (FILE: a calibration set of measured runs, e.g. arch_configs/calibration/runs.json; "
         "cache_dir: where extracted graphs are kept, by default $XDG_CACHE_HOME/phaze or ~/.cache/phaze; "
         "--markdown: the report as Markdown tables, as the documentation's validation page shows it)")


def parse_arguments(arguments: list[str]) -> tuple[str, dict[str, str]]:
    """(FILE, overrides) of `phaze validate FILE [key=value ...]` (InputError naming the argument)."""
    files, overrides = [], {}
    for argument in arguments:
        key, equals, value = argument.partition("=")
        if not equals or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            if argument.startswith("-") and argument != "-":
                raise InputError(f"{argument}: unknown option; {SYNOPSIS}")
            files.append(argument)
            continue
        if key not in OVERRIDES:
            allowed = ", ".join(f"{name} ({what})" for name, what in OVERRIDES.items())
            raise InputError(f"{key}: unknown override; allowed keys: {allowed}")
        if key in overrides:
            raise InputError(f"{key}: given twice ({overrides[key]!r} and {value!r})")
        if not value:
            raise InputError(f"{key}: must be a folder path, got an empty value")
        overrides[key] = value
    if not files:
        raise InputError(f"FILE: missing; {SYNOPSIS}")
    if len(files) > 1:
        raise InputError(f"FILE: one file, got {len(files)} ({', '.join(files)}); {SYNOPSIS}")
    return files[0], overrides


def usable_cache_dir(path: Path) -> Path:
    """`path`, made if absent, once a file can be written in it (InputError naming cache_dir otherwise)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"cache_dir: {path} is not a folder; give cache_dir=PATH, a folder phaze can write to")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise InputError(f"cache_dir: cannot write to {path} ({error.strerror or error}); give cache_dir=PATH, "
                         "a folder phaze can write to") from None
    return path


def sharded_or_context_parallel(item: Case) -> bool:
    """Whether a run shards its weights or gradients over data parallelism (ZeRO-2/3, FSDP) or splits
    its sequences over context parallelism: the runs `validate` reports together beside the chips'."""
    return item.training.data_parallel_sharding in ("gradients", "full") or item.context_parallel_width > 1


@dataclass(frozen=True)
class Row:
    """One predicted run as `validate` shows it: the run, its prediction and the relative error."""

    item: Case
    predicted_s: float
    fits: bool

    @property
    def error(self) -> float:
        return self.predicted_s / self.item.measured - 1

    @property
    def group(self) -> str:
        """The chip and precision whose summary the run counts in."""
        return f"{self.item.chip} {self.item.precision}{' MoE' if self.item.moe else ''}"

    @property
    def layout(self) -> str:
        item = self.item
        return (f"{item.width} {item.stages} {item.degree} {item.virtual_stages}"
                + (f" e{item.expert_parallel_width}" if item.expert_parallel_width > 1 else "")
                + (f" et{item.expert_tensor_parallel_width}"
                   if item.expert_tensor_parallel_width not in (None, item.width) else "")
                + (f" c{item.context_parallel_width}" if item.context_parallel_width > 1 else "")
                + (" fsdp" if item.training.data_parallel_sharding == "full" else ""))

    @property
    def cells(self) -> tuple[str, ...]:
        """run, devices, t p d v, mbs, batch, recompute, measured s, predicted s, error, fits."""
        item = self.item
        return (f"{item.run_id}{FROM_RECIPE if item.assumed else ''}", str(item.devices), self.layout,
                str(item.micro_batch_size), str(item.global_batch_size), item.recompute,
                f"{item.measured:.4g}{item.time_from}", f"{self.predicted_s:.4g}", f"{self.error:+.1%}",
                "yes" if self.fits else "no")


ROW_HEADERS = ("run", "devices", "t p d v", "mbs", "batch", "recompute", "measured s", "predicted s", "error", "fits")
MARKS = (f"{FROM_TOKENS} measured time = global batch tokens / measured tokens per second; {FROM_FLOPS} "
         "measured time = FLOPs per iteration by Megatron's formula / (measured model TFLOP/s x devices); "
         f"{FROM_RECIPE} "
         "settings the run does not state taken from its framework's published recipe; fits: within 80 GiB "
         "per device by phaze's memory model")


def summaries(rows: list[Row]) -> list[tuple[str, list[float]]]:
    """(name, absolute errors) of every run, of each chip and precision (when more than one), and of
    the runs that shard their weights or split their sequences, all and on GPUs."""
    errors: dict[str, list[float]] = {}
    split: dict[str, list[float]] = {}
    for row in rows:
        errors.setdefault(row.group, []).append(abs(row.error))
        if sharded_or_context_parallel(row.item):
            split.setdefault("sharded or context-parallel", []).append(abs(row.error))
            if not row.item.chip.startswith("tpu"):
                split.setdefault("sharded or context-parallel, GPUs", []).append(abs(row.error))
    every = [error for group in errors.values() for error in group]
    named = [("all", every)] + (list(errors.items()) if len(errors) > 1 else []) + list(split.items())
    return [(name, group) for name, group in named if group]


def recipes_used(rows: list[Row]) -> list[str]:
    """The recipes the marked runs take their unstated settings from, by name."""
    return sorted({row.item.recipe for row in rows if row.item.assumed and row.item.recipe})


def left_out_reasons(left_out: list[tuple[str, str]]) -> dict[str, list[str]]:
    """The left-out runs by reason."""
    reasons: dict[str, list[str]] = {}
    for run, why in left_out:
        reasons.setdefault(why, []).append(run)
    return reasons


def print_text(name: str, rows: list[Row], left_out: list[tuple[str, str]]) -> None:
    """The table, the marks, the recipes, the summaries and the runs left out, for a terminal."""
    table = Table(title=f"phaze validate {name}")
    for header in ("run", "chip", "precision", *ROW_HEADERS[1:]):
        table.add_column(header, justify="left" if header in ("run", "chip", "precision", "recompute") else "right",
                         no_wrap=header == "run")
    for row in rows:
        run, *rest = row.cells
        table.add_row(run, row.item.chip, row.item.precision, *rest)
    console = Console(width=max(Console().width, 160))
    console.print(table)
    console.print(MARKS)
    for recipe in recipes_used(rows):
        console.print(f"{FROM_RECIPE} {recipe}: {RECIPES[recipe].source}")
    for group, errors in summaries(rows):
        console.print(f"{group}: {len(errors)} runs, mean absolute error {sum(errors) / len(errors):.1%}, "
                      f"max {max(errors):.1%}")
    console.print(f"left out ({len(left_out)}):")
    for why, names in left_out_reasons(left_out).items():
        console.print(f"  {why}: {len(names)} ({', '.join(names) if len(names) <= 4 else names[0] + ', ...'})")


def _cell(text: str) -> str:
    """`text` as a Markdown table cell or list item: its bars and asterisks literal."""
    return text.replace("|", "\\|").replace("*", "\\*")


def markdown_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table, numbers right-aligned."""
    align = ["---" if header in ("run", "runs", "recompute") else "---:" for header in headers]
    return ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows)]


def print_markdown(rows: list[Row], left_out: list[tuple[str, str]]) -> None:
    """The same report as Markdown: the summaries as a table, the runs grouped by chip and precision,
    the marks, the recipes and the runs left out (the docs' validation page)."""
    lines = ["## Summary", ""]
    lines += markdown_table(("runs", "count", "mean absolute error", "max"), [
        (group, str(len(errors)), f"{sum(errors) / len(errors):.1%}", f"{max(errors):.1%}")
        for group, errors in summaries(rows)])
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    lines += ["", "## Runs", "", MARKS + "."]
    for group, members in groups.items():
        lines += ["", f"### {group} ({len(members)} runs)", ""]
        lines += markdown_table(ROW_HEADERS, [row.cells for row in members])
    recipes = recipes_used(rows)
    if recipes:
        lines += ["", "## Recipes", "", f"What each run marked {FROM_RECIPE} takes from its release's published recipe:",
                  ""]
        lines += [f"- **{recipe}**: {_cell(RECIPES[recipe].source)}" for recipe in recipes]
    lines += ["", f"## Left out ({len(left_out)})", ""]
    lines += [f"- {why}: {len(names)} ({', '.join(names)})" for why, names in left_out_reasons(left_out).items()]
    print("\n".join(lines))


def main(arguments: list[str]) -> int:
    if not arguments:
        print(USAGE, file=sys.stderr)
        return 2
    if "-h" in arguments or "--help" in arguments:
        print(USAGE)
        return 0
    markdown = "--markdown" in arguments
    arguments = [argument for argument in arguments if argument != "--markdown"]
    try:  # every input checked before any prediction: a wrong one is one line and status 2
        name, overrides = parse_arguments(arguments)
        cache_dir = Path(overrides["cache_dir"]).expanduser() if "cache_dir" in overrides else user_cache_dir()
        cases = run_cases(read_runs(name))
        predicted, left_out = predictions(cases, usable_cache_dir(cache_dir))
    except InputError as problem:
        print(f"phaze: error: {problem}", file=sys.stderr)
        return 2
    rows = [Row(item, result.step.time_per_batch, result.step.feasible) for item, result in predicted]
    if markdown:
        print_markdown(rows, left_out)
    else:
        print_text(name, rows, left_out)
    return 0
