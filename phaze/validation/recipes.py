"""The published recipes the calibration set's runs follow where a run does not state a setting
(NeMo's and Megatron-Bridge's Llama recipes, MaxText's configurations), each with its source, and
the frameworks and chips the validation knows."""

from __future__ import annotations

from dataclasses import dataclass, field


from graph_extract import get_spec
from graph_extract.zoo import LLAMA_FAMILY
from phaze_hardware import KNOWN_CHIPS, SYSTEMS
from solver.training_step import TrainingOptions


#: How published runs name the chips phaze predicts them on (GPUs priced by their roofline, TPUs by the
#: template's estimator and schedules).
VALIDATED_CHIPS = tuple(sorted(name for system in SYSTEMS.values() for name in KNOWN_CHIPS[system.chip].names))


#: HBM bytes the XLA compiler lets one program use on a TPU chip (its compile-time check, "Used X of Y
#: hbm", and `jax.Device.memory_stats()["bytes_limit"]`): the TPU runtime keeps the rest of the chip's
#: HBM. There is no CUDA context and no NCCL buffer on a TPU (`TrainingOptions.framework_reserve`'s
#: GPU figure); a TPU run's reserve is the chip's capacity less this (`tpu_runtime_reserve`). TPU v6e:
#: 33,550,237,696 bytes, 31.25 GiB of 32 (vllm-project/vllm PR #16211, the usage record of one v6e
#: chip); TPU v4: 30.75 GiB of 32, "reserved 1.25G" (erfanzar/EasyDeL issue #166, XLA's out-of-memory
#: report on a v4-32); TPU v5p: 95.74 GiB (openxla/xla docs/errors/error_1000.md @ 49aac430, XLA's
#: "exceeding available bytes: 95.74G"), more than phaze's 95 GiB capacity of the chip: no reserve.
XLA_PROGRAM_HBM = {"tpuv6e": 33_550_237_696, "tpuv4": 30.75 * 2**30, "tpuv5p": 95.74 * 2**30}


def tpu_runtime_reserve(chip: str) -> float | None:
    """The bytes of `chip`'s HBM a TPU program cannot use (`XLA_PROGRAM_HBM`), at least 0; None for a
    chip without a figure (its runs keep `TrainingOptions.framework_reserve`'s default)."""
    if chip not in XLA_PROGRAM_HBM:
        return None
    return max(KNOWN_CHIPS[chip].hbm_capacity - XLA_PROGRAM_HBM[chip], 0.0)


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

#: Megatron-Bridge's performance recipes' training options (distributed optimizer, gradient-sync and
#: weight-gather overlap, gradients reduced in bf16, Transformer Engine's tensor-parallel overlap).
_MEGATRON_BRIDGE_TRAINING = TrainingOptions(**_ADAM_SHARDED, overlap_param_gather=True, grad_reduce_in_bf16=True,
                                            tensor_parallel_overlap=True)

#: MaxText's training options: FSDP over the fsdp axis with XLA's collectives behind the products, each
#: layer's weights gathered in its own iteration of the scan over the layers (no run of the set turns
#: on --xla_tpu_enable_ag_backward_pipelining), and
#: the weights kept in base.yml's weight_dtype float32 with optax's adamw, whose two moments take the
#: parameters' dtype (MaxText/optimizers.py), and no master copy.
_MAXTEXT_TRAINING = TrainingOptions("adam", "full", overlap_grad_reduce=True, tensor_parallel_overlap=True,
                                    weight_dtype="float32", sharded_collectives="scanned_layers")


def _maxtext(flop_count: str, attention: float) -> Recipe:
    """MaxText's recipe for one README table (the three differ only in the FLOP count of their day)."""
    return Recipe(
        "full", True, _MAXTEXT_TRAINING,
        "AI-Hypercomputer/maxtext MaxText/configs/base.yml and configs/{v4,v5e,v5p}/*.sh @ 76bd53b0f: the "
        "decoder of MAXTEXT_FAMILY; weights, gradients and optimizer state sharded over each slice's "
        "ici_fsdp_parallelism ranks (FSDP), replicated over dcn_data_parallelism slices (hybrid sharding), all "
        "in weight_dtype float32 (no master copy; optax adamw's moments in the parameters' dtype); "
        "the tensor axis shards the activations' embedding between blocks (as sequence parallelism does); "
        "remat_policy full = full recomputation, minimal = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims "
        "(MaxText/layers/models.py: the block's input and its weight products' outputs kept, product_outputs); the scripts' "
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
    "Megatron-Bridge / NeMo 25.09": Recipe(
        "none", True, _MEGATRON_BRIDGE_TRAINING,
        "Megatron-Bridge @ fa0315ae2684693a666be9d247adf9baf1e30028 (the 25.09 table): scripts/performance/"
        "configs/{llama3,llama31}/*_llm_pretrain.yaml (no recompute, grad_reduce_in_fp32 false), "
        "scripts/performance/utils/helpers.py (sequence parallel = TP > 1, tp_comm_overlap userbuffers "
        "configs), src/megatron/bridge/recipes/llama/llama3.py (use_distributed_optimizer, overlap_grad_reduce, "
        "overlap_param_gather)"),
    "Megatron-Bridge / NeMo 25.11": Recipe(
        "none", True, _MEGATRON_BRIDGE_TRAINING,
        "Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py (llama3_70b_pretrain_config): "
        "recompute_granularity None, sequence_parallel True, use_distributed_optimizer, overlap_grad_reduce, "
        "overlap_param_gather, tp_comm_overlap (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192), "
        "grad_reduce_in_fp32 False; scripts/performance configs LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS: t4 p8 v5"),
    "Megatron-Bridge / NeMo 26.02": Recipe(
        "none", True, _MEGATRON_BRIDGE_TRAINING,
        "Megatron-Bridge @ cfeddcd9445817a85ff58549d407fa700b1f8ace (the 26.02 and 26.02.01 tables): "
        "src/megatron/bridge/recipes/llama/llama3.py and recipes/qwen/qwen3_moe.py: recompute_granularity "
        "None (the perf scripts' set_llama3_common_configs / set_qwen3_common_configs set it None), "
        "use_distributed_optimizer, overlap_grad_reduce, overlap_param_gather; the perf scripts set "
        "grad_reduce_in_fp32 False and tp_comm_overlap (userbuffers configs); "
        "scripts/performance/utils/utils.py WorkloadBaseConfig: sequence parallel = TP > 1"),
    "NeMo 25.0": Recipe(
        "none", True, _MEGATRON_BRIDGE_TRAINING,
        "NVIDIA/NeMo v2.2.0 (7192a2c9, NeMo 25.02) and v2.3.0 (2b03b748, NeMo 25.04): "
        "scripts/llm/performance/pretrain_*.py and recommended_model_configs/model_configs_{b200,gb200}.csv "
        "(recompute_layers 0, activation_offload_layers 0), nemo/collections/llm/recipes/optim/adam.py "
        "(use_distributed_optimizer, overlap_grad_reduce, overlap_param_gather, grad_reduce_in_fp32 False), "
        "MegatronCommOverlapCallback (tp_comm_overlap at t > 1), sequence_parallel at t > 1; GPT-3 175B: the "
        "GPT-2 tokenizer padded to 50,688; Nemotron-4: squared ReLU, LayerNorm, rotary positions",
        models={"GPT-3 175B": ModelRecipe({}, GPT_FAMILY), "Nemotron-4 340B": ModelRecipe({}, NEMOTRON_FAMILY),
                "Nemotron-4 15B": ModelRecipe({}, NEMOTRON_FAMILY)}),
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
    "tpu-recipes MaxText": Recipe(
        "full", True, _MAXTEXT_TRAINING,
        "AI-Hypercomputer/tpu-recipes training/{trillium,v5p}/*-MaxText READMEs @ c8cfe2f689081d36701a101cd73a70965d80926b "
        "and the MaxTextModel tuning parameters they embed: weights, gradients and optimizer state sharded over "
        "each slice's ici_fsdp_parallelism ranks (FSDP), replicated over dcn slices, in weight_dtype float32 "
        "unless a run states bfloat16 (no master copy; optax adamw's moments in the parameters' dtype); XLA's async collective "
        "fusion flags overlap the collectives with the matrix products; the step's seconds from the README's "
        "quoted log line; MaxText's dropout_rate 0.0 and a vocabulary not padded (MaxText/configs/base.yml @ "
        "tpu-recipes-v0.1.2); on TPUs no CUDA context or NCCL buffers: the HBM the TPU runtime keeps instead "
        "(XLA_PROGRAM_HBM)", multislice=True, family={"dropout": 0.0, "vocab_pad_multiple": 1}),
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
