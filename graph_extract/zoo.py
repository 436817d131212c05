"""The model zoo: hyper-parameters of every model phaze can extract.

Shapes follow the models the original program builds (msr-fiddle/phaze at fed7cde,
`GraphExtractor/models/*.py`): the HF checkpoints' configs for bertbase/bertlarge/gpt2/opt/llama2,
and the Megatron shapes hard-coded there for the `megatron*` models; the grouped-query Llama-2-70B,
Llama-3 and Mistral models from their published config.json. Everything is written here; nothing is
downloaded.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from phaze_common.checks import InputError, boolean, choice, is_integer, is_number, positive_integer, text

#: The values a ModelSpec text field takes.
CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post"),
    "activation": ("gelu", "gelu_tanh", "relu", "squared_relu", "swiglu"),
    "position_embedding": ("learned", "rotary", "alibi", "none"),
    "head": ("lm", "pooler", "bert_pretraining"),
}
#: Integer fields that may be zero.
MAY_BE_ZERO = ("position_offset", "token_types", "shared_experts", "first_dense_layers")
#: Largest integer field (layers, widths, heads, vocabulary, positions).
MAX_MODEL_SIZE = 16_777_216


def _check_field(field: dataclasses.Field, value: object) -> None:
    """One field's type and range (InputError naming it)."""
    name = field.name
    if name in CHOICES:
        choice(name, value, CHOICES[name])
    elif field.type == "bool":
        boolean(name, value)
    elif name == "capacity_factor":
        if not is_number(value) or value <= 0:
            raise InputError(f"{name}: must be a number > 0 (an expert's token slots over its even share), "
                             f"got {value!r}")
    elif field.type == "float":
        if not is_number(value) or not 0 <= value < 1:
            raise InputError(f"{name}: must be a number in [0, 1), got {value!r}")
    elif field.type in ("str", "str | None"):
        if value is not None or field.type == "str":
            text(name, value)
    elif name in MAY_BE_ZERO:
        if not is_integer(value) or not 0 <= value <= MAX_MODEL_SIZE:
            raise InputError(f"{name}: must be an integer from 0 to {MAX_MODEL_SIZE:,}, got {value!r}")
    elif not (field.type == "int | None" and value is None):
        positive_integer(name, value, MAX_MODEL_SIZE)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one transformer model, enough to build it in plain PyTorch."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    default_sequence_length: int
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    norm_position: str = "pre"  # "pre": x + f(norm(x)); "post": norm(x + f(x))
    activation: str = "gelu"  # "gelu" | "gelu_tanh" | "relu" | "squared_relu" (Nemotron-4) | "swiglu"
    # "learned" (a table), "rotary" (RoPE), "alibi" (BLOOM: no parameters, a per-head linear bias on
    # the attention scores; Press et al. 2022) or "none" (no position signal)
    position_embedding: str = "learned"
    position_offset: int = 0  # OPT's learned positions start at index 2
    bias: bool = True
    fused_qkv: bool = False  # one [h -> 3h] projection (GPT-2, Megatron) or three [h -> h]
    causal: bool = True
    token_types: int = 0  # BERT's segment embeddings (0 = none)
    embedding_projection: int | None = None  # OPT-350m: 512-wide embeddings projected to h
    embedding_norm: bool = False  # BERT: LayerNorm right after the embedding sum
    head: str = "lm"  # "lm": LM logits + loss; "pooler": BERT pooler; "bert_pretraining"
    tied_lm_head: bool = True
    final_norm: bool = True  # a norm after the last block (pre-LN models)
    dropout: float = 0.1
    vocab_pad_multiple: int = 1  # Megatron pads the vocabulary to a multiple of 128·t
    # Grouped-query attention: key/value heads, each shared by num_heads / num_kv_heads query heads
    # (None: one per query head, multi-head attention). Last, so that a multi-head spec's graph cache
    # key is what it was before the field existed (see graph_extract.extraction.cache_path).
    num_kv_heads: int | None = None
    # Mixture of experts: every block's MLP is `num_experts` experts of ffn_hidden_size, each token
    # routed to `experts_per_token` of them; an expert takes at most capacity_factor · its even share
    # of the routed tokens (None: a dense MLP). Then the width of each attention head when it is not
    # hidden_size / num_heads (Megatron's kv_channels; Qwen3: 128 with 64 heads of a 4096-wide model).
    num_experts: int | None = None
    experts_per_token: int = 2
    capacity_factor: float = 1.0
    kv_channels: int | None = None
    # A user's torch.nn.Module factory ("module:function" or "file.py:function", graph_extract.factory)
    # that builds the model instead of graph_extract.transformer; None for the zoo's own definition.
    factory: str | None = None
    # Today's mixtures of experts (DeepSeek-V3, Qwen3-MoE; Megatron-Core's moe_ffn_hidden_size,
    # moe_shared_expert_intermediate_size and moe_layer_freq): each routed expert's width when it is
    # not ffn_hidden_size (fine-grained experts; ffn_hidden_size is then the dense blocks'), shared
    # experts of that width every token runs (one MLP of shared_experts times it, split over t like
    # the dense one, not over e), the first blocks with a dense MLP, and RMSNorm over each head's
    # query and key (Qwen3, OLMo 2).
    moe_ffn_hidden_size: int | None = None
    shared_experts: int = 0
    first_dense_layers: int = 0
    qk_norm: bool = False
    # Multi-head latent attention (DeepSeek-V2/V3, arXiv:2405.04434 §2.1) when kv_lora_rank is set:
    # keys and values up-projected from a kv_lora_rank latent, queries from a q_lora_rank latent (None:
    # projected from the hidden state directly); each head's query and key are qk_nope_head_dim
    # plain and qk_rope_head_dim rotated dimensions (the key's rotated part one per token, shared by
    # the heads), its value v_head_dim.
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # The tensor-parallel plan of an exported model (a factory without tensor_parallel_width, a
    # config.json transformers builds): a YAML file of module patterns and their styles
    # (graph_extract.plan); None: the plan phaze derives by structure (Megatron's split).
    plan: str | None = None

    def __post_init__(self) -> None:
        """Every field checked (a spec built in code is held to the rules a config file is): one
        InputError naming the field."""
        for item in dataclasses.fields(self):
            _check_field(item, getattr(self, item.name))
        if self.kv_channels is None and self.hidden_size % self.num_heads:
            raise InputError(f"num_heads: {self.num_heads} heads do not divide hidden_size={self.hidden_size}; "
                             f"allowed: a divisor of {self.hidden_size}")
        if self.position_embedding == "rotary" and self.head_dim % 2:
            raise InputError(f"num_heads: rotary positions need an even head size, got hidden_size / num_heads = "
                             f"{self.hidden_size} / {self.num_heads} = {self.head_dim}")
        self._check_experts()
        self._check_latent_attention()
        if self.kv_channels is not None and self.kv_channels % 2:
            raise InputError(f"kv_channels: must be a positive even integer (the width of a head) or null, "
                             f"got {self.kv_channels!r}")
        if self.num_kv_heads is None:
            return
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"num_kv_heads: {self.num_kv_heads} does not divide num_heads={self.num_heads}; "
                             f"allowed: a divisor of {self.num_heads}, or null (one per query head)")
        if self.fused_qkv and self.num_kv_heads != self.num_heads:
            raise InputError(f"num_kv_heads: {self.num_kv_heads} key/value heads for {self.num_heads} query heads "
                             "need separate Q, K, V projections; set fused_qkv false")

    def _check_experts(self) -> None:
        if self.num_experts is None:
            for name, default in (("moe_ffn_hidden_size", None), ("shared_experts", 0), ("first_dense_layers", 0)):
                if getattr(self, name) != default:
                    raise InputError(f"{name}: needs num_experts (a mixture of experts); allowed without: {default}")
            return
        if self.first_dense_layers >= self.num_layers:
            raise InputError(f"first_dense_layers: {self.first_dense_layers} of {self.num_layers} blocks leaves no "
                             f"mixture of experts; allowed: 0 to {self.num_layers - 1}")
        if self.num_experts < 2:
            raise InputError(f"num_experts: must be an integer >= 2 (or null for a dense MLP), got {self.num_experts!r}")
        k = self.experts_per_token
        if not 1 <= k <= self.num_experts:
            raise InputError(f"experts_per_token: {k!r} with num_experts={self.num_experts}; "
                             f"allowed: an integer in [1, {self.num_experts}]")
        if not self.capacity_factor <= self.num_experts / k:
            raise InputError(f"capacity_factor: must be in (0, {self.num_experts / k:g}] (num_experts / "
                             f"experts_per_token), got {self.capacity_factor!r}")

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_heads

    _LATENT_FIELDS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")

    def _check_latent_attention(self) -> None:
        if self.kv_lora_rank is None:
            for name in ("q_lora_rank", *self._LATENT_FIELDS):
                if getattr(self, name) is not None:
                    raise InputError(f"{name}: needs kv_lora_rank (multi-head latent attention); allowed without: null")
            return
        for name in self._LATENT_FIELDS:
            if getattr(self, name) is None:
                raise InputError(f"{name}: missing; multi-head latent attention (kv_lora_rank set) needs "
                                 f"{', '.join(self._LATENT_FIELDS)}")
        if self.qk_rope_head_dim % 2:
            raise InputError(f"qk_rope_head_dim: rotary positions need an even width, got {self.qk_rope_head_dim}")
        if self.fused_qkv or self.num_kv_heads is not None or self.position_embedding != "rotary":
            raise InputError("kv_lora_rank: multi-head latent attention has its own projections and rotary "
                             "positions; allowed with fused_qkv false, num_kv_heads null, position_embedding rotary")

    @property
    def latent_attention(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Width of each routed (and shared) expert."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def is_moe_block(self, index: int) -> bool:
        """Whether block `index` (from 0) has experts rather than a dense MLP."""
        return self.num_experts is not None and index >= self.first_dense_layers

    @property
    def attention_width(self) -> int:
        """Width of all query heads together (hidden_size unless kv_channels says otherwise)."""
        return self.num_heads * self.head_dim

    def expert_capacity(self, tokens: int) -> int:
        """Token slots of one expert for `tokens` routed tokens: ceil(capacity_factor · tokens · k / E)."""
        return math.ceil(self.capacity_factor * tokens * self.experts_per_token / self.num_experts)

    @property
    def kv_heads(self) -> int:
        """Key/value heads (the query heads when the model has multi-head attention)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def padded_vocab_size(self, tensor_parallel_width: int) -> int:
        """Smallest multiple of vocab_pad_multiple·t that holds the vocabulary (Megatron's rule)."""
        multiple = self.vocab_pad_multiple * tensor_parallel_width
        return -(-self.vocab_size // multiple) * multiple

    def with_overrides(self, **overrides: object) -> ModelSpec:
        """A copy with some fields replaced (e.g. fewer layers for a quick run)."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise InputError(f"model: unknown field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **overrides)


_BERT = dict(
    vocab_size=30522,
    max_position_embeddings=512,
    default_sequence_length=512,
    norm_position="post",
    causal=False,
    token_types=2,
    embedding_norm=True,
    head="pooler",
    final_norm=False,
)

_MEGATRON_GPT = dict(
    vocab_size=50257,
    max_position_embeddings=1024,
    default_sequence_length=1024,
    fused_qkv=True,
    vocab_pad_multiple=128,
)

# Llama-family decoders: RMSNorm, SwiGLU, rotary positions, no biases, untied input/output
# embeddings, no dropout. Shapes from the models' published config.json. The rotary base (10000 for
# Llama-2 and Mistral, 500000 for Llama-3) changes neither shapes nor FLOPs: the tables use 10000.
LLAMA_FAMILY = dict(
    norm="rmsnorm",
    activation="swiglu",
    position_embedding="rotary",
    bias=False,
    tied_lm_head=False,
    dropout=0.0,
)
_LLAMA2 = dict(**LLAMA_FAMILY, vocab_size=32000, max_position_embeddings=4096, default_sequence_length=4096)
# Llama-3 and 3.1: 128K vocabulary; trained (and benchmarked, e.g. NeMo / Megatron) at 8192 tokens.
_LLAMA3 = dict(**LLAMA_FAMILY, vocab_size=128256, max_position_embeddings=8192, default_sequence_length=8192)

_SPECS = (
    ModelSpec("bertbase", 12, 768, 12, 3072, **_BERT),
    ModelSpec("bertlarge", 24, 1024, 16, 4096, **_BERT),
    ModelSpec(
        "gpt2",  # GPT-2 XL
        48,
        1600,
        25,
        6400,
        vocab_size=50257,
        max_position_embeddings=1024,
        default_sequence_length=1024,
        activation="gelu_tanh",
        fused_qkv=True,
    ),
    ModelSpec(
        "opt",  # OPT-350m
        24,
        1024,
        16,
        4096,
        vocab_size=50272,
        max_position_embeddings=2048,
        default_sequence_length=2048,
        norm_position="post",
        activation="relu",
        position_offset=2,
        embedding_projection=512,
        final_norm=False,
    ),
    ModelSpec("llama2", 32, 4096, 32, 11008, **_LLAMA2),  # Llama-2 7B
    ModelSpec("llama2-70b", 80, 8192, 64, 28672, **_LLAMA2, num_kv_heads=8),
    ModelSpec("llama3-8b", 32, 4096, 32, 14336, **_LLAMA3, num_kv_heads=8),
    ModelSpec("llama3-70b", 80, 8192, 64, 28672, **_LLAMA3, num_kv_heads=8),
    # Llama-3.1-405B: 131072 positions (its context), benchmarked at 8192 like the smaller ones.
    ModelSpec("llama3-405b", 126, 16384, 128, 53248, **{**_LLAMA3, "max_position_embeddings": 131072},
              num_kv_heads=8),
    # Mistral-7B v0.1: sliding-window attention over 4096 tokens; at the default 4096 tokens that is
    # full causal attention, which the graph models exactly (longer sequences keep the full mask).
    ModelSpec("mistral-7b", 32, 4096, 32, 14336, **{**_LLAMA2, "max_position_embeddings": 32768},
              num_kv_heads=8),
    # Mixtral-8x7B v0.1: Mistral-7B's attention, eight SwiGLU experts per block, two per token; no
    # sliding window; benchmarked (Megatron-LM's MoE recipes) at 4096 tokens.
    ModelSpec("mixtral-8x7b", 32, 4096, 32, 14336, **{**_LLAMA2, "max_position_embeddings": 32768},
              num_kv_heads=8, num_experts=8, experts_per_token=2),
    # Mixtral-8x22B v0.1 (mistralai/Mixtral-8x22B-v0.1 config.json; Megatron-MoE-ModelZoo's
    # Mixtral-8x22B.yaml): 56 x 6144, 48 query / 8 key-value heads, 8 SwiGLU experts of 16,384, 2 per
    # token; vocabulary 32,768, untied; 65,536 positions, benchmarked at 4,096 tokens.
    ModelSpec("mixtral-8x22b", 56, 6144, 48, 16384, **{**_LLAMA2, "vocab_size": 32768,
                                                      "max_position_embeddings": 65536},
              num_kv_heads=8, num_experts=8, experts_per_token=2),
    # Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json): 94 blocks, all of 128 SwiGLU experts of
    # width 1,536, 8 per token (routing weights renormalised), no shared expert; 64 query heads of
    # 128 (kv_channels: 8,192 wide in a 4,096-wide model) and 4 key/value heads with QK-norm;
    # vocabulary 151,936, untied; 40,960 positions; benchmarked (Megatron-MoE-ModelZoo) at 4,096.
    ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 12288, **{**LLAMA_FAMILY, "vocab_size": 151936,
              "max_position_embeddings": 40960, "default_sequence_length": 4096}, num_kv_heads=4, num_experts=128,
              experts_per_token=8, kv_channels=128, moe_ffn_hidden_size=1536, qk_norm=True),
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json; arXiv:2412.19437): 61 blocks, the first 3
    # dense (SwiGLU 18,432), then 256 routed experts of width 2,048 (8 per token) and one shared;
    # multi-head latent attention, 128 heads (query latent 1,536, key/value latent 512, 128 plain +
    # 64 rotated query/key dimensions, values 128); vocabulary 129,280, untied. The multi-token
    # prediction module is not modelled. Trained at 4,096 tokens (the report's pre-training).
    ModelSpec("deepseek-v3", 61, 7168, 128, 18432, **{**LLAMA_FAMILY, "vocab_size": 129280,
              "max_position_embeddings": 163840, "default_sequence_length": 4096}, num_experts=256,
              experts_per_token=8, moe_ffn_hidden_size=2048, shared_experts=1, first_dense_layers=3,
              q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    ModelSpec(
        "megatronbert",
        24,
        1024,
        16,
        4096,
        **{
            **_BERT,
            "norm_position": "pre",
            "final_norm": True,
            "embedding_norm": False,
            "head": "bert_pretraining",
        },
        fused_qkv=True,
        vocab_pad_multiple=128,
    ),
    # The original's "megatrongpt2-xl" is 1024 wide with 40 blocks (its comment says 1.5B).
    ModelSpec("megatrongpt2-xl", 40, 1024, 16, 4096, **_MEGATRON_GPT),
    ModelSpec("megatrongpt2-54", 54, 1920, 20, 7680, **_MEGATRON_GPT),
    ModelSpec("megatrongpt2-72", 72, 3072, 24, 12288, **_MEGATRON_GPT),
    ModelSpec(
        "megatrongpt3",  # GPT-3 175B
        96,
        12288,
        96,
        49152,
        **{**_MEGATRON_GPT, "max_position_embeddings": 2048, "default_sequence_length": 2048},
    ),
)

ZOO: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}

#: The model names phaze knows.
MODELS: tuple[str, ...] = tuple(ZOO)


def get_spec(model: str | ModelSpec) -> ModelSpec:
    """The spec of a model name (or the spec itself); a clear error for an unknown name."""
    if isinstance(model, ModelSpec):
        return model
    if model not in ZOO:
        raise InputError(f"model: unknown {model!r}; allowed: {', '.join(MODELS)}")
    return ZOO[model]


def is_factory_reference(config: str) -> bool:
    """Whether a `model.config` value names a factory (`x:function`) rather than a model file."""
    location, colon, function = config.rpartition(":")
    return bool(colon) and bool(location) and not any(character in function for character in "./\\")
