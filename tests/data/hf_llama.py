"""A Llama-style decoder with Hugging Face's module names, for phaze's factory form
(`model=custom model.config=tests/data/hf_llama.py:llama3_8b`). It does not use phaze's transformer.

Pre-norm blocks of grouped-query attention (rotary positions, causal mask) and a SwiGLU MLP, RMSNorm
everywhere, no biases, untied input and output embeddings, and a per-token cross-entropy loss.
In plain PyTorch (`shard` None), or as one rank's tensor-parallel shard of graph_extract.parallel's
Megatron-style layers (`llama3_8b_sharded`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graph_extract.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_to_tensor_parallel_region,
    vocab_parallel_cross_entropy,
)


@dataclass(frozen=True)
class LlamaConfig:
    """The Hugging Face config.json keys this model reads."""

    name_or_path: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of a tensor-parallel group of `width` ranks."""

    width: int
    rank: int


def column(shard: Shard | None, inputs: int, outputs: int, replicas: int = 1) -> nn.Module:
    """A linear map without bias, its output features split over the ranks (each slice on `replicas` ranks)."""
    if shard is None:
        return nn.Linear(inputs, outputs, bias=False)
    return ColumnParallelLinear(inputs, outputs, shard.width, bias=False, replicas=replicas)


def row(shard: Shard | None, inputs: int, outputs: int) -> nn.Module:
    """A linear map without bias, its input features split over the ranks (partial sums all-reduced)."""
    return nn.Linear(inputs, outputs, bias=False) if shard is None else RowParallelLinear(inputs, outputs, shard.width,
                                                                                          bias=False)


def enter_parallel(x: torch.Tensor, shard: Shard | None) -> torch.Tensor:
    """The input of a tensor-parallel region: its gradient is all-reduced in the backward pass."""
    return x if shard is None else copy_to_tensor_parallel_region(x, shard.width)


class RotaryEmbedding(nn.Module):
    """cos and sin of the rotary angles for every position, [sequence, head_dim], computed once."""

    def __init__(self, config: LlamaConfig, sequence_length: int) -> None:
        super().__init__()
        head_dim = config.hidden_size // config.num_attention_heads
        frequencies = config.rope_theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.arange(sequence_length, dtype=torch.float32)[:, None] * frequencies[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos, self.sin


# torch.fx traces without tensor shapes: the code below takes its sizes from the config, never from x.shape.

def rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x * cos + rotate_half(x, head_dim // 2) * sin


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """[b, kv_heads, s, d] -> [b, kv_heads * times, s, d]."""
    if times == 1:
        return x
    return x[:, :, None].expand(-1, -1, times, -1, -1).flatten(1, 2)


class LlamaAttention(nn.Module):
    """The heads are split over the ranks; with more ranks than key/value heads, each key/value head
    is held by the width / kv_heads ranks of its query heads."""

    def __init__(self, config: LlamaConfig, sequence_length: int, shard: Shard | None) -> None:
        super().__init__()
        width, kv_heads = shard.width if shard else 1, config.num_key_value_heads
        replicas = max(width // kv_heads, 1)
        self.shard, self.head_dim = shard, config.hidden_size // config.num_attention_heads
        self.num_heads, self.num_kv_heads = config.num_attention_heads // width, kv_heads * replicas // width
        self.q_proj = column(shard, config.hidden_size, config.num_attention_heads * self.head_dim)
        self.k_proj = column(shard, config.hidden_size, kv_heads * self.head_dim, replicas)
        self.v_proj = column(shard, config.hidden_size, kv_heads * self.head_dim, replicas)
        self.o_proj = row(shard, config.num_attention_heads * self.head_dim, config.hidden_size)
        future = torch.ones(sequence_length, sequence_length, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hidden = enter_parallel(hidden, self.shard)
        q = self.q_proj(hidden).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_proj(hidden).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(hidden).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin, self.head_dim), apply_rotary(k, cos, sin, self.head_dim)
        k = repeat_kv(k, self.num_heads // self.num_kv_heads)
        v = repeat_kv(v, self.num_heads // self.num_kv_heads)
        scores = torch.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(2, 3))
        weights = F.softmax(scores.masked_fill(self.future, float("-inf")), dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).flatten(2)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig, shard: Shard | None) -> None:
        super().__init__()
        self.shard = shard
        self.gate_proj = column(shard, config.hidden_size, config.intermediate_size)
        self.up_proj = column(shard, config.hidden_size, config.intermediate_size)
        self.down_proj = row(shard, config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = enter_parallel(x, self.shard)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, sequence_length: int, shard: Shard | None) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, sequence_length, shard)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config, shard)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, sequence_length: int, shard: Shard | None) -> None:
        super().__init__()
        if shard is None:
            self.embed_tokens: nn.Module = nn.Embedding(config.vocab_size, config.hidden_size)
        else:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, shard.width, shard.rank)
        self.rotary_emb = RotaryEmbedding(config, sequence_length)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, sequence_length, shard)
                                    for _ in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb()
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig, sequence_length: int, shard: Shard | None = None) -> None:
        super().__init__()
        self.config, self.shard = config, shard
        self.model = LlamaModel(config, sequence_length, shard)
        self.lm_head = column(shard, config.hidden_size, config.vocab_size)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.lm_head(enter_parallel(self.model(input_ids), self.shard))
        if labels is None:
            return logits
        if self.shard is not None:  # the vocabulary is split: Megatron's cross-entropy over the ranks
            rows = self.config.vocab_size // self.shard.width
            return vocab_parallel_cross_entropy(logits, labels, self.shard.width, self.shard.rank * rows,
                                                (self.shard.rank + 1) * rows)
        # per-token cross-entropy: log(sum(exp(z - max))) - (z[label] - max)
        shifted = logits - logits.amax(dim=-1).unsqueeze(-1)
        log_total = shifted.exp().sum(dim=-1).log()
        return log_total - shifted.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


#: Meta-Llama-3-8B's published config.json shape.
LLAMA3_8B = LlamaConfig(name_or_path="meta-llama/Meta-Llama-3-8B", vocab_size=128256, hidden_size=4096,
                        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        max_position_embeddings=8192, rope_theta=500000.0)


def llama3_8b(sequence_length: int = 8192) -> LlamaForCausalLM:
    """Llama-3-8B, 32 blocks."""
    return LlamaForCausalLM(LLAMA3_8B, sequence_length)


def llama3_8b_sharded(sequence_length: int = 8192, tensor_parallel_width: int = 1, rank: int = 0) -> LlamaForCausalLM:
    """Rank `rank`'s shard of Llama-3-8B at `tensor_parallel_width`."""
    return LlamaForCausalLM(LLAMA3_8B, sequence_length, Shard(tensor_parallel_width, rank))


def llama3_8b_3_layers(sequence_length: int = 8192) -> LlamaForCausalLM:
    """Llama-3-8B cut to its first three blocks."""
    config = LlamaConfig(**{**LLAMA3_8B.__dict__, "name_or_path": "llama3-8b-3-layers", "num_hidden_layers": 3})
    return LlamaForCausalLM(config, sequence_length)


def tiny(sequence_length: int = 64) -> LlamaForCausalLM:
    """A small grouped-query Llama for quick runs: 4 blocks 256 wide, 8 heads, 2 key/value heads."""
    config = LlamaConfig(name_or_path="tiny-llama", vocab_size=1000, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config, sequence_length)
