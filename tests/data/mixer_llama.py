"""A Llama written as plain PyTorch with nothing phaze recognises by name or structure: its blocks are
`model.stack.<i>.mixer`, one module holding the attention and the MLP (`model=custom
model.config=tests/data/mixer_llama.py:llama3_8b`). Pre-norm grouped-query attention with rotary
positions and a causal mask, a SwiGLU MLP, RMSNorm, no biases, untied embeddings, a per-token loss.
Its sizes are keywords named as Hugging Face's config.json names them (Llama-3-8B's by default).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from graph_extract.transformer import per_token_cross_entropy


def rotary_tables(head_dim: int, sequence_length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, [sequence, head_dim]."""
    frequencies = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(sequence_length, dtype=torch.float32)[:, None] * frequencies[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Mixer(nn.Module):
    """A block's attention and MLP in one module."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, sequence_length: int, theta: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attention_norm, self.mlp_norm = nn.RMSNorm(hidden, eps=1e-5), nn.RMSNorm(hidden, eps=1e-5)
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)
        cos, sin = rotary_tables(self.head_dim, sequence_length, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        future = torch.ones(sequence_length, sequence_length, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def heads_of(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def repeated(self, x: torch.Tensor) -> torch.Tensor:
        """Each key/value head repeated for its query heads."""
        group = self.heads // self.kv_heads
        return x if group == 1 else x.unsqueeze(2).expand(-1, -1, group, -1, -1).flatten(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        q = rotate(self.heads_of(self.q(h), self.heads), self.cos, self.sin)
        k = self.repeated(rotate(self.heads_of(self.k(h), self.kv_heads), self.cos, self.sin))
        v = self.repeated(self.heads_of(self.v(h), self.kv_heads))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        weights = F.softmax(scores.masked_fill(self.future, float("-inf")), dim=-1)
        x = x + self.o(torch.matmul(weights, v).transpose(1, 2).flatten(-2))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Layer(nn.Module):
    def __init__(self, *sizes) -> None:
        super().__init__()
        self.mixer = Mixer(*sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixer(x)


class Decoder(nn.Module):
    def __init__(self, vocab: int, layers: int, *sizes) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, sizes[0])
        self.stack = nn.ModuleList(Layer(*sizes) for _ in range(layers))
        self.norm = nn.RMSNorm(sizes[0], eps=1e-5)


class MixerLlama(nn.Module):
    """`model.embed_tokens`, `model.stack.<i>.mixer`, `model.norm`, `lm_head`; forward(input_ids, labels)
    gives each token's cross-entropy."""

    def __init__(self, vocab: int, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                 sequence_length: int, theta: float) -> None:
        super().__init__()
        self.model = Decoder(vocab, layers, hidden, heads, kv_heads, ffn, sequence_length, theta)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.stack:
            x = layer(x)
        return per_token_cross_entropy(self.lm_head(self.model.norm(x)), labels)


def llama3_8b(sequence_length: int = 8192, vocab_size: int = 128256, num_hidden_layers: int = 32,
              hidden_size: int = 4096, num_attention_heads: int = 32, num_key_value_heads: int = 8,
              intermediate_size: int = 14336, rope_theta: float = 500000.0) -> MixerLlama:
    """Meta-Llama-3-8B's published config.json shape (by default), its sizes in `config` as Hugging
    Face's models hold them (what phaze reads a factory's sizes from)."""
    model = MixerLlama(vocab_size, num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
                       intermediate_size, sequence_length, rope_theta)
    model.config = dict(name_or_path="mixer-llama3-8b", vocab_size=vocab_size, num_hidden_layers=num_hidden_layers,
                        hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                        num_key_value_heads=num_key_value_heads, intermediate_size=intermediate_size,
                        max_position_embeddings=sequence_length)
    return model
