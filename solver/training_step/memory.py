"""Memory per device: model state per parameter, activations per recomputation mode, and how many
micro-batches' activations a pipeline stage holds.

Model state (Megatron-Core's distributed-optimizer table; ZeRO, Rajbhandari et al. 2020), bytes per
parameter held by the device:

    adam  16-bit weights (2) + fp32 main gradients (4; 2 when reduced in 16-bit) + fp32 master
          weights and two moments (12; 10 with the master weights as 16-bit remainders)
    sgd   16-bit weights (2) + 16-bit gradients (2), no optimizer state (the original's "2 copies")

That is `weight_dtype` `mixed`. Frameworks that keep no master copy hold every kind of state in the
weights' own dtype (`WEIGHT_DTYPES`): `float32` (MaxText's default weight_dtype; PyTorch FSDP2 with a
MixedPrecisionPolicy of bf16 parameters) keeps fp32 weights (4), fp32 gradients (4) and, with Adam,
two fp32 moments (8): optax's adamw keeps mu and nu in the parameters' dtype; `bfloat16` (MaxText's
weight_dtype=bfloat16) the same in 2 bytes each (2 + 2 + 4). Either way the products read a 16-bit
copy cast at use: what the weight all-gathers move and what `full` sharding holds whole is 2 bytes a
parameter (`ModelState.gathered`; a simplification for `float32`: FSDP2 casts before its gather, and
XLA is taken to do the same).

Sharded data parallelism (`SHARDINGS`; ZeRO, Rajbhandari et al. 2020, stages 1-3) keeps 1/n of some
kinds per device, n the shard group (the data-parallel replicas, with context parallelism the c·d
ranks, or `data_parallel_shard_width` of them): `optimizer` the optimizer state (ZeRO-1, Megatron's
distributed optimizer), `gradients` also the gradients (ZeRO-2), `full` also the weights (ZeRO-3,
PyTorch FSDP's FULL_SHARD, MaxText's fsdp axis), whose gathered copies the step holds while it runs
(`TrainingStep.gathered_weight_bytes`).
In 8-bit training (Transformer Engine) each weight of a block's weight products also has 8-bit copies
that its GEMMs read (`narrow_weight_bytes`): row-wise for the forward GEMM and column-wise for the data
gradient, cached across the micro-batches of a step (Megatron-Core passes TE's is_first_microbatch):
FP8 on Hopper transposes the row-wise copy, MXFP8 quantises each direction itself (its 32-element
blocks run along rows for one and columns for the other) and each copy carries its scale bytes
(NVIDIA/TransformerEngine docs/features/low_precision_training/performance_considerations/
performance_considerations.rst and mxfp8/mxfp8.rst @ 3ceb248e, "Handling transposes"). With
`fp8_parameters` (TE's fp8_model_init, Megatron's --fp8-param-gather) those weights have no 16-bit
copy: the 8-bit copies are the weights, the fp32 master weights stay in the optimizer state.
Delayed scaling's amax history (TE's DelayedScaling, amax_history_len 1,024 fp32 numbers for each of
a product's five scaled tensors: 20 KiB a product, about 1 MiB for GPT-3 175B's 48 products on a
device of 8 stages) is not charged: a named simplification.

Activations kept per transformer block and micro-batch (Korthikanti et al. 2022, Table 2), from the
traced graph's split of each layer's saved tensors (`graph_extract.layergraph.Layer`):

    none        everything saved; with sequence parallelism the replicated part is divided by t
    selective   without the attention core (re-run in the backward pass); with a fused attention
                kernel the core keeps no s × s tensor, so selective keeps what none keeps
    full        only the layer's input (÷ t with sequence parallelism); during its backward the
                layer's full activations are rebuilt: one layer's worth of working memory per stage,
                less the activations of the stage's later layers, whose backward ran and freed them
                (the head's logits are gone before the last block is recomputed)
    modules     Megatron-Core's --recompute-granularity selective --recompute-modules, written
                joined by '+' ("layernorm+moe_act"; `selective` is its default, core_attn): without
                the saved tensors each recomputed module made (`graph_extract.RecomputedModule`;
                the inputs it reads from outside are kept), the largest of them rebuilt at a time
                as working memory
    selective_op  torchtitan's operator-level selective checkpointing: the block's operators but
                the attention kernels, the collectives and every other weight product re-run
                (`graph_extract.regions.OP_LEVEL`, priced as a recompute module)
    product_outputs  JAX's checkpoint_dots_with_no_batch_dims (MaxText's remat_policy minimal,
                maxtext MaxText/layers/models.py @ 76bd53b0f): the block's input and the outputs of
                the weight products its other saved tensors are rebuilt from
                (`graph_extract.layergraph.product_outputs`), the replicated parts ÷ t with
                sequence parallelism; everything else, the attention kernel too, re-runs in the
                backward: the block's activations rebuilt as working memory, as `full` (a
                simplification: a kept product output the backward also reads, V, is counted in
                both)

A mixture's routed tokens at the model's width h are traced as if each expert were split over the
t ranks (τ = t) with every rank holding all s·b tokens' k choices (`graph_extract.Layer`'s
`dispatched_activation_bytes` and `combined_activation_bytes`). In Megatron-Core's MoE layer with
sequence parallelism (NVIDIA/Megatron-LM @ d98e8a64, megatron/core/transformer/moe/token_dispatcher.py:
`MoEAlltoAllTokenDispatcher` routes each rank's own s·b/t tokens, its expert-parallel all-to-all sends
them to their experts' ranks and `dispatch_postprocess` all-gathers them over the τ ranks of the
expert tensor-parallel group; `combine_preprocess` reduce-scatters the experts' outputs over those τ
ranks before the all-to-all returns them to their tokens; `MoEFlexTokenDispatcher` (DeepEP) sends
each token to the τ ranks of each of its experts) a rank's experts get s·b·k·τ/t routed tokens:
their input at width h, which their first products keep, is τ/t of the traced, and f_e/τ of each
expert's FFN leaves the FFN-width tensors at the traced s·b·k·f_e/t for every τ; the combine runs on
the rank's own s·b·k/t rows: 1/t of the traced, as a replicated tensor's. Without sequence
parallelism (which Megatron-Core asks for with tensor and expert parallelism, model_parallel_config.py)
every rank routes all s·b tokens: the traced sizes. Simplification: from core_v0.13 Megatron-Core
weighs the experts' outputs by the router's probabilities in their activation, at the FFN width
(ADLR/megatron-lm!2668, experts.py `activation_func_with_probs`), and its combine keeps nothing at
width h; the s·b·k·h/t kept here is what its earlier `unpermute` kept to weigh them.

With a fused attention kernel a block keeps Q, K, V and the softmax statistics instead of the
core's s × s tensors; in 8 bits the inputs only weight products keep are kept in one byte an element
(`KernelOptions.narrow_bytes`: MXFP8's with its scale byte per 32; TE keeps the column-wise copy the
weight gradient reads).
Only transformer blocks are recomputed; the embedding and the head always keep their activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from phaze_common.checks import InputError, choice
from graph_extract.kernels import KernelOptions
from graph_extract.regions import NESTED, OP_LEVEL, RECOMPUTE_MODULES

OPTIMIZERS = ("adam", "sgd")
#: The recomputation modes with a name of their own; any set of `RECOMPUTE_MODULES` joined by '+' is
#: one too (`recompute_mode`).
RECOMPUTE_MODES = ("none", "selective", "full")
#: torchtitan's operator-level selective checkpointing (`graph_extract.regions.OP_LEVEL`): a mode of its
#: own, not searched unless asked.
OP_LEVEL_MODE = "selective_op"
#: JAX's checkpoint_dots_with_no_batch_dims (module docstring): a mode of its own, not searched unless asked.
PRODUCT_OUTPUTS_MODE = "product_outputs"
MEMORY_KINDS = ("weights", "gradients", "optimizer_state", "activations", "framework_reserve")
#: What the data-parallel replicas split among them (ZeRO stages 0-3), and the kinds each splits.
SHARDINGS = ("none", "optimizer", "gradients", "full")
#: The dtypes the weights are kept in between steps (module docstring): `mixed` = 16-bit weights with
#: fp32 master weights in the optimizer state (Megatron-LM, NeMo, DeepSpeed).
WEIGHT_DTYPES = ("mixed", "float32", "bfloat16")
SHARDED_KINDS = {"none": (), "optimizer": ("optimizer_state",), "gradients": ("optimizer_state", "gradients"),
                 "full": ("optimizer_state", "gradients", "weights")}


#: The 8-bit copies Transformer Engine keeps of a weight its 8-bit products read: row-wise (forward)
#: and column-wise (the data gradient), cached across the micro-batches of a step
#: (NVIDIA/TransformerEngine docs, performance_considerations.rst, "Handling transposes").
FP8_WEIGHT_COPIES = 2
#: Bytes of a 16-bit weight, which `fp8_parameters` does not keep for the weights of 8-bit products.
WEIGHT_16BIT_BYTES = 2.0


def narrow_weight_bytes(kernels: KernelOptions, fp8_parameters: bool = False) -> float:
    """Bytes per parameter of a weight that 8-bit products read, beyond the model state's 16-bit
    weight (module docstring): its two 8-bit copies (`FP8_WEIGHT_COPIES` × `kernels.narrow_bytes`),
    less the 16-bit weight with `fp8_parameters`; 0 in 16-bit training."""
    if not kernels.fp8:
        return 0.0
    return FP8_WEIGHT_COPIES * kernels.narrow_bytes - (WEIGHT_16BIT_BYTES if fp8_parameters else 0.0)


@dataclass(frozen=True)
class ModelState:
    """Bytes per parameter of each kind of model state (weights, gradients, optimizer state), which
    kinds the data-parallel shard group splits (`sharding`, one of `SHARDINGS`), and the bytes of the
    16-bit copy the products read (`gathered`: what weight all-gathers move), and whether the optimizer
    state holds a master copy of the weights (`master_copy`; else the optimizer updates the weights)."""

    weights: float
    gradients: float
    optimizer_state: float
    sharding: str = "none"
    gathered: float = WEIGHT_16BIT_BYTES
    master_copy: bool = True  # the optimizer state holds the weights' master copy (else it updates the weights)

    @classmethod
    def of(cls, optimizer: str, sharding: str = "none", gradients_in_16bit: bool = False, remainders: bool = False,
           weight_dtype: str = "mixed") -> ModelState:
        """The state of `optimizer` with its weights kept in `weight_dtype` (module docstring; the
        16-bit gradients and remainders apply to `mixed` only)."""
        choice("optimizer", optimizer, OPTIMIZERS)
        choice("data_parallel_sharding", sharding, SHARDINGS)
        choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
        moments = 2.0 if optimizer == "adam" else 0.0
        if weight_dtype != "mixed":
            size = 4.0 if weight_dtype == "float32" else 2.0
            return cls(size, size, moments * size, sharding, master_copy=False)
        weights, gradients, state = {"adam": (2.0, 2.0 if gradients_in_16bit else 4.0, 10.0 if remainders else 12.0),
                                     "sgd": (2.0, 2.0, 0.0)}[optimizer]
        return cls(weights, gradients, state, sharding)

    @property
    def sharded(self) -> bool:
        return self.sharding != "none"

    def splits(self, kind: str) -> bool:
        """Whether the shard group splits `kind` ("weights", "gradients" or "optimizer_state")."""
        return kind in SHARDED_KINDS[self.sharding]

    def share(self, kind: str, shard_size):
        """Bytes per parameter of `kind` on one of `shard_size` ranks sharing it."""
        full = getattr(self, kind)
        if self.splits(kind):
            return full / shard_size
        return full if np.isscalar(shard_size) else full * np.ones_like(shard_size, dtype=float)


#: How the recomputation modes are written, for messages.
RECOMPUTE_ALLOWED = (f"{', '.join(RECOMPUTE_MODES)}, {OP_LEVEL_MODE} (torchtitan's operator-level selective "
                     f"checkpointing), {PRODUCT_OUTPUTS_MODE} (JAX's checkpoint_dots_with_no_batch_dims, MaxText's "
                     "remat_policy minimal), or Megatron-Core's recompute modules joined by '+' "
                     f"({', '.join(RECOMPUTE_MODULES)}; e.g. layernorm+moe_act)")


def recompute_mode(value: object, field: str = "recompute") -> str:
    """The one name of a recomputation mode (module docstring): `none`, `full`, `selective`,
    `selective_op`, `product_outputs`, or a set of Megatron-Core's recompute modules joined by '+' in
    `RECOMPUTE_MODULES`' order (`core_attn` alone is `selective`, Megatron-Core's default module);
    InputError naming `field` otherwise."""
    if isinstance(value, str) and value in (*RECOMPUTE_MODES, OP_LEVEL_MODE, PRODUCT_OUTPUTS_MODE):
        return value
    names = value.split("+") if isinstance(value, str) else []
    if not names or any(name not in RECOMPUTE_MODULES for name in names):
        raise InputError(f"{field}: unknown {value!r}; allowed: {RECOMPUTE_ALLOWED}")
    for outer, inner in NESTED.items():
        held = [name for name in inner if name in names]
        if outer in names and held:
            raise InputError(f"{field}: {value!r} recomputes {outer}, which re-runs {' and '.join(held)} already; "
                             f"allowed: {outer} or {'+'.join(held)}, not both")
    ordered = [name for name in RECOMPUTE_MODULES if name in names]
    return "selective" if ordered == ["core_attn"] else "+".join(ordered)


@dataclass(frozen=True)
class Recompute:
    """A recomputation mode as a value: whole blocks re-run (`full`), or all but their weight products
    (`product_outputs`), or the recompute modules `modules` re-run (Megatron-Core's; `core_attn` alone
    is `selective`), or nothing (`none`)."""

    full: bool = False
    modules: frozenset[str] = frozenset()
    product_outputs: bool = False

    @staticmethod
    @lru_cache(maxsize=256)
    def of(name: str) -> Recompute:
        """The mode named `name` (`recompute_mode`'s one name, or any name it accepts)."""
        name = recompute_mode(name)
        if name in ("none", "full"):
            return Recompute(full=name == "full")
        if name == PRODUCT_OUTPUTS_MODE:
            return Recompute(product_outputs=True)
        if name == OP_LEVEL_MODE:
            return Recompute(modules=frozenset({OP_LEVEL}))
        return Recompute(modules=frozenset({"core_attn"}) if name == "selective" else frozenset(name.split("+")))

    @property
    def name(self) -> str:
        """Its one name (`recompute_mode`)."""
        if self.full:
            return "full"
        if self.product_outputs:
            return PRODUCT_OUTPUTS_MODE
        if self.modules == {OP_LEVEL}:
            return OP_LEVEL_MODE
        return recompute_mode("+".join(sorted(self.modules))) if self.modules else "none"


@dataclass(frozen=True, kw_only=True)
class DeviceShare:
    """What one device of a width-t group keeps of the traced saved tensors (module docstring):
    `replicated` is the fraction of the replicated ones that leaves it (sequence parallelism),
    `dispatched` the fraction of the experts' routed tokens it keeps (τ/t with sequence parallelism),
    `narrow` the bytes an 8-bit element takes (`KernelOptions.narrow_bytes`; 0: 16-bit training)."""

    replicated: float
    dispatched: float
    narrow: float

    @classmethod
    def of(cls, kernels: KernelOptions, width: int, expert_width: int) -> DeviceShare:
        """The shares at tensor-parallel width t = `width` and expert tensor-parallel width τ =
        `expert_width`: 1 − 1/t and τ/t with sequence parallelism, 0 and 1 without."""
        return cls(replicated=kernels.replicated_share(width),
                   dispatched=expert_width / width if kernels.sequence_parallel else 1.0,
                   narrow=kernels.narrow_bytes if kernels.fp8 else 0.0)


def device_bytes(total: float, replicated: float, saved, share: DeviceShare) -> float:
    """What one device keeps of `total` bytes of saved tensors (a layer's, or a recompute module's),
    `replicated` of them identical over the tensor-parallel group (`saved` gives the part only
    weight products keep and the routed tokens): the replicated part and the combine's routed tokens
    `share.replicated` less (sequence parallelism), the experts' routed tokens (all replicated, kept
    only by weight products) `share.dispatched` of them, and in 8-bit training the inputs only weight
    products keep in `share.narrow` bytes an element instead of two."""
    # the experts' routed tokens kept beyond what the replicated part's 1 − share.replicated keeps of them
    gathered = (share.dispatched - 1.0 + share.replicated) * saved.dispatched_activation_bytes
    kept = total - share.replicated * (replicated + saved.combined_activation_bytes) + gathered
    if share.narrow:
        kept -= (1.0 - share.narrow / 2.0) * (saved.matrix_input_activation_bytes + gathered
                                              - share.replicated * saved.replicated_matrix_input_activation_bytes)
    return kept


def module_bytes(module, fused: bool, share: DeviceShare) -> float:
    """What recomputing a recompute module frees on one device (`device_bytes` of what it made),
    with or without a fused attention kernel."""
    if fused and module.fused_attention_activation_bytes is not None:
        return device_bytes(module.fused_attention_activation_bytes, module.fused_replicated_activation_bytes, module,
                            share)
    return device_bytes(module.activation_bytes, module.replicated_activation_bytes, module, share)


def held_activations(layers, recompute: Recompute, width: int, kernels: KernelOptions, expert_width: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: (bytes kept per micro-batch in flight, working bytes while it is recomputed), at
    tensor-parallel width `width` and expert tensor-parallel width `expert_width` (None: the same). A
    layer without a fused-attention figure keeps with a fused kernel what it keeps without."""
    share = DeviceShare.of(kernels, width, width if expert_width is None else expert_width)
    fused = [kernels.flash_attention and layer.fused_attention_activation_bytes is not None for layer in layers]
    saved = np.array([device_bytes(layer.fused_attention_activation_bytes if here else layer.activation_bytes,
                                   layer.fused_replicated_activation_bytes
                                   if here and layer.fused_replicated_activation_bytes is not None
                                   else layer.replicated_activation_bytes, layer, share)
                      for layer, here in zip(layers, fused)], float)
    recomputed = np.array([layer.is_block for layer in layers], bool)
    if recompute.full or recompute.product_outputs:
        kept = np.array([layer.input_bytes - share.replicated * layer.replicated_input_bytes
                         + (layer.product_output_bytes - share.replicated * layer.replicated_product_output_bytes
                            if recompute.product_outputs else 0.0) for layer in layers], float)
        return np.where(recomputed, kept, saved), np.where(recomputed, saved, 0.0)
    modules = recompute.modules
    if not modules:
        return saved, np.zeros(len(layers))
    held = saved
    if "core_attn" in modules:
        held = saved - np.array([0.0 if here else layer.attention_core_activation_bytes
                                 for layer, here in zip(layers, fused)], float)
    dropped = [[module_bytes(module, here, share) for module in layer.recompute_modules
                if module.name in modules] for layer, here in zip(layers, fused)]
    held = held - np.array([sum(each) for each in dropped], float)
    working = np.array([max(each, default=0.0) for each in dropped], float)
    return np.where(recomputed, held, saved), np.where(recomputed, working, 0.0)


def in_flight(stages: int, virtual_stages: int, micro_batches: int) -> np.ndarray:
    """Micro-batches' worth of its layers' activations each device holds at its peak (first to last).

    1F1B (Narayanan et al. 2021): device i holds min(p − i, m). Interleaved (v > 1): device i runs
    2(p − i − 1) + (v − 1)·p warm-up chunk steps, so it holds that plus one chunk of activations,
    each chunk 1/v of its layers (device 0: p + (p − 1)/v, Korthikanti et al. 2022, Sec. 4.2), at most m·v chunks.
    """
    index = np.arange(stages)
    if virtual_stages == 1:
        return np.minimum(stages - index, micro_batches).astype(float)
    chunks = 2 * (stages - index - 1) + (virtual_stages - 1) * stages + 1
    return np.minimum(chunks, micro_batches * virtual_stages) / virtual_stages
