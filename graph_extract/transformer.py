"""One transformer implementation, configured by a ModelSpec, that builds every model of the zoo.

The module tree decides the layers: `embedding`, `layers.<i>` (one per block) and `head`. Every
model is plain, unsharded PyTorch, with activations laid out [batch, sequence, hidden]; phaze
exports it once and splits it over the tensor-parallel ranks by the plan derived by structure
(`graph_extract.plan`: Megatron's split of attention, MLP, experts, embedding and loss).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graph_extract.parallel import route
from graph_extract.zoo import ModelSpec

_ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
}


def _norm(spec: ModelSpec) -> nn.Module:
    eps = 1e-12 if spec.token_types else 1e-5  # BERT uses 1e-12
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=eps)
    return nn.LayerNorm(spec.hidden_size, eps=eps)


def _dropout(spec: ModelSpec) -> nn.Dropout | None:
    return nn.Dropout(spec.dropout) if spec.dropout > 0 else None


def _alibi_bias(spec: ModelSpec, sequence_length: int, heads: int) -> torch.Tensor:
    """ALiBi's bias of the first `heads` heads, [heads, sequence, sequence]: slope_h · (j − i), the slopes
    the geometric sequence 2^(−8h/n) of Press et al. 2022 for n heads (n a power of two; otherwise the
    next power's, as BLOOM does)."""
    n = 2 ** math.ceil(math.log2(spec.num_heads))
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / n) for h in range(heads)])
    positions = torch.arange(sequence_length, dtype=torch.float32)
    return slopes[:, None, None] * (positions[None, :] - positions[:, None])[None]


def _rotary_tables(sequence_length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, [sequence, head_dim], base 10000 (Llama)."""
    inverse_frequency = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(sequence_length, dtype=torch.float32), inverse_frequency)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def per_token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log(Σ exp(z − max)) − (z[label] − max) per token, in the order of Megatron's vocabulary-parallel
    algorithm (maximum, shifted exponentials and their sum, the target's logit), which a plan's split
    of the logits over the vocabulary turns into it."""
    shifted = logits - logits.amax(dim=-1).unsqueeze(-1)
    total = shifted.exp().sum(dim=-1)
    target = shifted.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return total.log() - target


def _parameter(*shape: int, std: float = 0.02) -> nn.Parameter:
    """A parameter drawn from N(0, std²) (nothing drawn on the meta device)."""
    return nn.Parameter(nn.init.normal_(torch.empty(*shape), std=std))


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """Rotary positions on the last dimension (2·half wide): x·cos + (−x₂, x₁)·sin."""
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Embedding(nn.Module):
    """Token, position and segment embeddings."""

    def __init__(self, spec: ModelSpec, sequence_length: int, padded_vocab: int) -> None:
        super().__init__()
        dim = spec.embedding_projection or spec.hidden_size
        self.word = nn.Embedding(padded_vocab, dim)
        self.project_in = nn.Linear(dim, spec.hidden_size, bias=False) if spec.embedding_projection else None
        self.position = None
        if spec.position_embedding == "learned":
            table = spec.max_position_embeddings + spec.position_offset
            self.position = _parameter(table, spec.hidden_size)
            offset = spec.position_offset
            self.register_buffer("position_ids", torch.arange(offset, offset + sequence_length), persistent=False)
        self.token_type = None
        if spec.token_types:
            self.token_type = _parameter(spec.token_types, spec.hidden_size)
        self.norm = _norm(spec) if spec.embedding_norm else None
        self.dropout = _dropout(spec)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        if self.position is not None:
            x = x + F.embedding(self.position_ids, self.position)
        if self.token_type is not None:
            x = x + F.embedding(token_type_ids, self.token_type)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x) if self.dropout is not None else x


class SelfAttention(nn.Module):
    """Multi-head or grouped-query self-attention. Each key/value head is repeated to its group's
    query heads before the products (Megatron's and Llama's repeat_interleave); the plan splits the
    heads, a key/value head held by the width / num_kv_heads ranks of its group when the width
    exceeds them (Megatron's rule)."""

    def __init__(self, spec: ModelSpec, sequence_length: int) -> None:
        super().__init__()
        h, self.head_dim, attention = spec.hidden_size, spec.head_dim, spec.attention_width
        self.heads, self.kv_heads = spec.num_heads, spec.kv_heads
        kv_size = spec.kv_heads * self.head_dim
        # Fused: rows ordered (head, q|k|v, head_dim), so a contiguous slice of rows is whole heads.
        self.qkv = nn.Linear(h, 3 * attention, spec.bias) if spec.fused_qkv else None
        if not spec.fused_qkv:
            self.query = nn.Linear(h, attention, spec.bias)
            self.key = nn.Linear(h, kv_size, spec.bias)
            self.value = nn.Linear(h, kv_size, spec.bias)
        self.dense = nn.Linear(attention, h, spec.bias)
        self.query_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if spec.qk_norm else None
        self.key_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if spec.qk_norm else None
        self.dropout = _dropout(spec)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        if spec.causal:
            mask = torch.ones(sequence_length, sequence_length, dtype=torch.bool).triu(1)
            self.register_buffer("causal_mask", mask, persistent=False)
        else:
            self.causal_mask = None
        if spec.position_embedding == "rotary":
            cos, sin = _rotary_tables(sequence_length, self.head_dim)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        else:
            self.rotary_cos = None
        if spec.position_embedding == "alibi":
            self.register_buffer("alibi_bias", _alibi_bias(spec, sequence_length, self.heads), persistent=False)
        else:
            self.alibi_bias = None

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """[b, s, heads·d] -> [b, heads, s, d]."""
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[b, kv heads, s, d] -> [b, heads, s, d]: each key/value head once per query head of its group."""
        group = self.heads // self.kv_heads
        if group == 1:
            return x
        return x.unsqueeze(2).expand(-1, -1, group, -1, -1).flatten(1, 2)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        return _rotate_half(x, self.rotary_cos, self.rotary_sin, self.head_dim // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qkv is not None:
            qkv = self.qkv(x).unflatten(-1, (self.heads, 3, self.head_dim)).transpose(1, 2)
            q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        else:
            q = self._heads(self.query(x), self.heads)
            k = self._heads(self.key(x), self.kv_heads)
            v = self._heads(self.value(x), self.kv_heads)
        if self.query_norm is not None:  # each head's query and key, before the rotation (Qwen3)
            q, k = self.query_norm(q), self.key_norm(k)
        if self.rotary_cos is not None:
            q, k = self._rotate(q), self._rotate(k)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        return self.dense(_attend(q * self.scale, k, v, self.causal_mask, self.dropout, self.alibi_bias))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_mask: torch.Tensor | None,
            dropout: nn.Dropout | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The attention core of scaled queries [b, heads, s, d]: softmax(q·kᵀ (+ bias, masked))·v, its
    heads flattened back to [b, s, heads·d_v]."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    if bias is not None:
        scores = scores + bias
    if causal_mask is not None:
        scores = scores.masked_fill(causal_mask, float("-inf"))
    probabilities = F.softmax(scores, dim=-1)
    if dropout is not None:
        probabilities = dropout(probabilities)
    return torch.matmul(probabilities, v).transpose(1, 2).flatten(-2)


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3: DeepSeek-AI 2024, arXiv:2405.04434 §2.1, and the
    V3 report, arXiv:2412.19437 §2.1). The down projections to the query latent (q_lora_rank) and to
    the key/value latent plus the shared rotated key (kv_lora_rank + qk_rope_head_dim) are replicated
    on every tensor-parallel rank, as Megatron-Core's MLA duplicates them; each latent is RMS-normed
    and up-projected column-parallel by heads (queries: qk_nope + qk_rope per head; keys and values:
    qk_nope + v_head_dim per head), so the backward all-reduces run on the latents; the output is
    row-parallel. Each head's key is its plain part and the one rotated key of its token; scores
    are scaled by 1/√(qk_nope + qk_rope). Training runs the full up-projections (the absorbed form
    is an inference device)."""

    def __init__(self, spec: ModelSpec, sequence_length: int) -> None:
        super().__init__()
        h, heads = spec.hidden_size, spec.num_heads
        self.heads = heads
        self.nope, self.rope, self.value_dim = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        self.latent = spec.kv_lora_rank
        query_width = heads * (self.nope + self.rope)
        if spec.q_lora_rank is None:
            self.query_down = self.query_norm = None
            self.query_up = nn.Linear(h, query_width, bias=False)
        else:
            self.query_down = nn.Linear(h, spec.q_lora_rank, bias=False)
            self.query_norm = nn.RMSNorm(spec.q_lora_rank, eps=1e-6)
            self.query_up = nn.Linear(spec.q_lora_rank, query_width, bias=False)
        self.key_value_down = nn.Linear(h, self.latent + self.rope, bias=False)
        self.key_value_norm = nn.RMSNorm(self.latent, eps=1e-6)
        self.key_value_up = nn.Linear(self.latent, heads * (self.nope + self.value_dim), bias=False)
        self.dense = nn.Linear(heads * self.value_dim, h, bias=False)
        self.dropout = _dropout(spec)
        self.scale = 1.0 / math.sqrt(self.nope + self.rope)
        mask = torch.ones(sequence_length, sequence_length, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask if spec.causal else None, persistent=False)
        cos, sin = _rotary_tables(sequence_length, self.rope)
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.query_up(x if self.query_down is None else self.query_norm(self.query_down(x)))
        q = q.unflatten(-1, (self.heads, self.nope + self.rope)).transpose(1, 2)
        q_nope, q_rope = q[..., :self.nope], q[..., self.nope:]
        compressed = self.key_value_down(x)
        latent, k_rope = compressed[..., :self.latent], compressed[..., self.latent:]
        kv = self.key_value_up(self.key_value_norm(latent))
        kv = kv.unflatten(-1, (self.heads, self.nope + self.value_dim)).transpose(1, 2)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        k_rope = _rotate_half(k_rope.unsqueeze(1), self.rotary_cos, self.rotary_sin, self.rope // 2)
        q = torch.cat((q_nope, _rotate_half(q_rope, self.rotary_cos, self.rotary_sin, self.rope // 2)), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, self.heads, -1, -1)), dim=-1)
        return self.dense(_attend(q * self.scale, k, v, self.causal_mask, self.dropout))


def _activate(activation: str, up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    if gate is not None:
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(up, approximate="tanh")
    if activation == "squared_relu":  # Nemotron-4 (So et al. 2021, Primer)
        return torch.pow(F.relu(up), 2)
    return _ACTIVATIONS[activation](up)


class MLP(nn.Module):
    """Feed-forward network: up projection (and gate), activation, down projection."""

    def __init__(self, spec: ModelSpec, ffn_hidden_size: int | None = None) -> None:
        super().__init__()
        h, ffn = spec.hidden_size, ffn_hidden_size or spec.ffn_hidden_size
        self.activation = spec.activation
        self.up = nn.Linear(h, ffn, spec.bias)
        self.gate = nn.Linear(h, ffn, spec.bias) if spec.activation == "swiglu" else None
        self.down = nn.Linear(ffn, h, spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, gate = self.up(x), self.gate(x) if self.gate is not None else None
        return self.down(_activate(self.activation, up, gate))


class MixtureOfExperts(nn.Module):
    """Top-k routed experts (Mixtral, Qwen3-MoE): a replicated router picks `experts_per_token` of
    `num_experts` feed-forward experts per token, with the top-k probabilities renormalised as
    weights; each expert takes at most `spec.expert_capacity(tokens)` tokens (in token order; the
    others are dropped, GShard's rule). The tokens are picked into each expert's slots (the
    dispatch), multiplied by the experts' weights as grouped products, and picked back (the combine);
    the plan puts the expert-parallel all-to-alls after both and splits the experts like the dense
    MLP in their own tensor-parallel group (`graph_extract.plan`); expert parallelism and the experts'
    own tensor-parallel width are placement choices that divide them (`solver.layout`).
    """

    def __init__(self, spec: ModelSpec, tokens: int) -> None:
        super().__init__()
        h, ffn, experts = spec.hidden_size, spec.expert_ffn_hidden_size, spec.num_experts
        self.spec, self.activation = spec, spec.activation
        self.capacity = spec.expert_capacity(tokens)
        self.router = nn.Linear(h, experts, bias=False)
        self.up = _parameter(experts, h, ffn, std=1.0 / math.sqrt(h))
        self.gate = _parameter(experts, h, ffn, std=1.0 / math.sqrt(h)) if spec.activation == "swiglu" else None
        self.down = _parameter(experts, ffn, h, std=1.0 / math.sqrt(ffn))
        shared = spec.shared_experts * spec.expert_ffn_hidden_size
        self.shared = MLP(spec, shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(0, 1)
        chosen, experts = F.softmax(self.router(tokens), dim=-1).topk(self.spec.experts_per_token, dim=-1)
        weights = chosen / chosen.sum(dim=-1, keepdim=True)
        source, slot = route(experts, self.spec.num_experts, self.capacity)
        dispatched = torch.index_select(F.pad(tokens, (0, 0, 0, 1)), 0, source)
        dispatched = dispatched.unflatten(0, (self.spec.num_experts, self.capacity))
        gate = torch.bmm(dispatched, self.gate) if self.gate is not None else None
        hidden = _activate(self.activation, torch.bmm(dispatched, self.up), gate)
        returned = torch.bmm(hidden, self.down).flatten(0, 1)
        gathered = torch.index_select(F.pad(returned, (0, 0, 0, 1)), 0, slot)
        combined = (gathered.unflatten(0, (-1, self.spec.experts_per_token)) * weights.unsqueeze(-1)).sum(dim=1)
        routed = combined.view_as(x)
        return routed if self.shared is None else routed + self.shared(x)


class Block(nn.Module):
    """One transformer block, pre- or post-norm."""

    def __init__(self, spec: ModelSpec, sequence_length: int, micro_batch_size: int = 1, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = spec.norm_position == "pre"
        self.attention_norm, self.mlp_norm = _norm(spec), _norm(spec)
        attention = LatentAttention if spec.latent_attention else SelfAttention
        self.attention = attention(spec, sequence_length)
        tokens = micro_batch_size * sequence_length
        self.mlp = MixtureOfExperts(spec, tokens) if spec.is_moe_block(index) else MLP(spec)
        self.attention_dropout, self.mlp_dropout = _dropout(spec), _dropout(spec)

    @staticmethod
    def _drop(dropout: nn.Dropout | None, x: torch.Tensor) -> torch.Tensor:
        return dropout(x) if dropout is not None else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self._drop(self.attention_dropout, self.attention(self.attention_norm(x)))
            return x + self._drop(self.mlp_dropout, self.mlp(self.mlp_norm(x)))
        x = self.attention_norm(x + self._drop(self.attention_dropout, self.attention(x)))
        return self.mlp_norm(x + self._drop(self.mlp_dropout, self.mlp(x)))


class LanguageModelHead(nn.Module):
    """Final norm, logits over the (padded) vocabulary (tied or own weights) and per-token
    cross-entropy."""

    def __init__(self, spec: ModelSpec, word: nn.Embedding, padded_vocab: int) -> None:
        super().__init__()
        dim = spec.embedding_projection or spec.hidden_size
        self.norm = _norm(spec) if spec.final_norm else None
        self.project_out = nn.Linear(spec.hidden_size, dim, bias=False) if spec.embedding_projection else None
        if spec.tied_lm_head:
            self.weight = word.weight
        else:
            self.weight = _parameter(padded_vocab, dim)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return per_token_cross_entropy(F.linear(x, self.weight), labels)


class Pooler(nn.Module):
    """BERT pooler: tanh(W·h_[CLS] + b)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(spec.hidden_size, spec.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class BertPretrainingHead(nn.Module):
    """Megatron BERT's heads: masked-LM (dense, gelu, norm, tied logits + bias) and sentence order."""

    def __init__(self, spec: ModelSpec, word: nn.Embedding, padded_vocab: int) -> None:
        super().__init__()
        self.final_norm = _norm(spec) if spec.final_norm else None
        self.transform = nn.Linear(spec.hidden_size, spec.hidden_size)
        self.transform_norm = _norm(spec)
        self.weight = word.weight
        self.bias = nn.Parameter(torch.zeros(padded_vocab))
        self.pooler = Pooler(spec)
        self.sentence_order = nn.Linear(spec.hidden_size, 2)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor, sentence_order_labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.final_norm is not None:
            x = self.final_norm(x)
        hidden = self.transform_norm(F.gelu(self.transform(x)))
        lm_loss = per_token_cross_entropy(F.linear(hidden, self.weight, self.bias), labels)
        order_loss = per_token_cross_entropy(self.sentence_order(self.pooler(x)), sentence_order_labels)
        return lm_loss, order_loss


class TransformerModel(nn.Module):
    """A zoo model, whole: its vocabulary padded to `padded_vocab` rows (Megatron pads it for the
    tensor-parallel width: `ModelSpec.padded_vocab_size`); for a mixture of experts, the experts'
    capacity is that of `micro_batch_size` sequences."""

    def __init__(self, spec: ModelSpec, sequence_length: int, padded_vocab: int | None = None,
                 micro_batch_size: int = 1) -> None:
        super().__init__()
        self.spec = spec
        padded_vocab = padded_vocab or spec.padded_vocab_size(1)
        self.embedding = Embedding(spec, sequence_length, padded_vocab)
        self.layers = nn.ModuleList(Block(spec, sequence_length, micro_batch_size, index)
                                    for index in range(spec.num_layers))
        if spec.head == "pooler":
            self.head: nn.Module = Pooler(spec)
        elif spec.head == "bert_pretraining":
            self.head = BertPretrainingHead(spec, self.embedding.word, padded_vocab)
        else:
            self.head = LanguageModelHead(spec, self.embedding.word, padded_vocab)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The forward arguments this model uses, in order."""
        names = ["input_ids"]
        if self.spec.token_types:
            names.append("token_type_ids")
        if self.spec.head != "pooler":
            names.append("labels")
        if self.spec.head == "bert_pretraining":
            names.append("sentence_order_labels")
        return tuple(names)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        sentence_order_labels: torch.Tensor | None = None,
    ):
        x = self.embedding(input_ids, token_type_ids)
        for block in self.layers:
            x = block(x)
        targets = [t for t in (labels, sentence_order_labels) if t is not None]
        return self.head(x, *targets)


def example_inputs(
    model: TransformerModel, micro_batch_size: int, sequence_length: int, device: str = "meta", seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random token ids, segment ids and labels of the right shapes for `model.input_names`."""
    generator = torch.Generator().manual_seed(seed)
    shape = (micro_batch_size, sequence_length)
    high = {
        "input_ids": model.spec.vocab_size,
        "token_type_ids": max(model.spec.token_types, 1),
        "labels": model.spec.vocab_size,
        "sentence_order_labels": 2,
    }
    inputs = {}
    for name in model.input_names:
        size = (micro_batch_size,) if name == "sentence_order_labels" else shape
        if device == "meta":
            inputs[name] = torch.empty(size, dtype=torch.long, device="meta")
        else:
            inputs[name] = torch.randint(high[name], size, generator=generator).to(device)
    return inputs
