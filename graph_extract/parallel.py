"""The tensor-parallel collectives of a rank's graph, the routing plan of a mixture, and
Megatron-style layers for a factory that builds its own shards.

The collectives are plain functions: the plan pass (`graph_extract.plan`) inserts them as calls in
each rank's graph, and torch.fx keeps them as single leaf calls in a factory's shard
(`COLLECTIVES`). Run on one rank they return their input, which has the right shape;
`graph_extract.verify` runs the ranks side by side and replaces each by the real reduction.

The layers (`ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`,
`vocab_parallel_cross_entropy`) hold one rank's slice of the weights. Every sharded parameter
carries `partition_dim`, the dimension its full tensor is split along, and `replicas`, how many
consecutive ranks hold the same slice (1, except the key/value heads of grouped-query attention
when the width exceeds them: width / replicas slices); the plan pass marks its ranks' parameters
the same way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def all_reduce(x: torch.Tensor, group_size: int, reduce_op: str = "sum", group: str = "tensor") -> torch.Tensor:
    """All-reduce across the tensor-parallel group in the forward pass (identity in backward);
    `group` "expert_tensor": the experts' own tensor-parallel group (`opgraph.EXPERT_TENSOR`)."""
    return x


def copy_to_tensor_parallel_region(x: torch.Tensor, group_size: int, group: str = "tensor") -> torch.Tensor:
    """Identity in the forward pass; all-reduce of the gradient in the backward pass (over `group`)."""
    return x


def all_to_all(x: torch.Tensor, group: str = "expert") -> torch.Tensor:
    """All-to-all across the expert-parallel group (token dispatch or combine; the same in backward).

    The group is a placement choice (expert_parallel_width e), not part of the model: on one shard,
    and when e = 1, the tokens stay where they are, so the call returns its input.
    """
    return x


def route(experts: torch.Tensor, num_experts: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The dispatch plan of top-k routing with `capacity` token slots per expert.

    `experts` [tokens, k] are the chosen experts. Returns (source [num_experts · capacity]: the token
    in each slot, `tokens` for an empty one; slot [tokens · k]: each choice's slot, num_experts ·
    capacity for a dropped one). An expert fills its slots in token order. Traced as one operator
    (integer bookkeeping, no floating-point work): a leaf of torch.fx, the custom operator
    `phaze::route` of torch.export.
    """
    return torch.ops.phaze.route(experts, num_experts, capacity)


@torch.library.custom_op("phaze::route", mutates_args=())
def _route(experts: torch.Tensor, num_experts: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, k = experts.shape
    chosen = experts.flatten()
    one_hot = F.one_hot(chosen, num_experts)
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
    empty = num_experts * capacity
    slot = torch.where(position < capacity, chosen * capacity + position, empty)
    token = torch.arange(tokens * k, device=experts.device) // k
    source = torch.full((empty + 1,), tokens, device=experts.device).scatter(0, slot, token)
    return source[:empty], slot.clone()


@_route.register_fake
def _(experts: torch.Tensor, num_experts: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, k = experts.shape
    return experts.new_empty(num_experts * capacity), experts.new_empty(tokens * k)


#: Calls the tracer keeps as single operators: the collectives and the routing plan.
COLLECTIVES = (all_reduce, copy_to_tensor_parallel_region, all_to_all)
LEAF_FUNCTIONS = (*COLLECTIVES, route)


def sharded_parameter(*shape: int, partition_dim: int | None, replicas: int = 1) -> nn.Parameter:
    """An uninitialised parameter, marked with the dimension it is split along (None: replicated)
    and the number of ranks that hold each slice."""
    parameter = nn.Parameter(torch.empty(*shape))
    parameter.partition_dim = partition_dim  # type: ignore[attr-defined]
    parameter.replicas = replicas  # type: ignore[attr-defined]
    return parameter


def _init_linear(weight: nn.Parameter, bias: nn.Parameter | None, fan_in: int) -> None:
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.uniform_(bias, -bound, bound)


class ColumnParallelLinear(nn.Module):
    """y = x Wᵀ + b with W split by output rows; the input gradient is all-reduced in backward.

    With `replicas` > 1, W is split in width / replicas slices, each held by `replicas` consecutive
    ranks (grouped-query attention's key/value heads when the width exceeds them).
    """

    def __init__(self, in_features: int, out_features: int, width: int, bias: bool = True, replicas: int = 1) -> None:
        super().__init__()
        rows = out_features * replicas // width
        self.weight = sharded_parameter(rows, in_features, partition_dim=0, replicas=replicas)
        self.bias = sharded_parameter(rows, partition_dim=0, replicas=replicas) if bias else None
        _init_linear(self.weight, self.bias, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r W_rᵀ) + b with W split by input columns; the bias is replicated."""

    def __init__(self, in_features: int, out_features: int, width: int, bias: bool = True) -> None:
        super().__init__()
        self.width = width
        self.weight = sharded_parameter(out_features, in_features // width, partition_dim=1)
        self.bias = sharded_parameter(out_features, partition_dim=None) if bias else None
        _init_linear(self.weight, self.bias, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(F.linear(x, self.weight), self.width)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the (padded) vocabulary split in contiguous ranges over the ranks."""

    def __init__(self, padded_vocab: int, dim: int, width: int, rank: int = 0) -> None:
        super().__init__()
        self.width = width
        rows = padded_vocab // width
        self.vocab_start, self.vocab_end = rank * rows, (rank + 1) * rows
        self.weight = sharded_parameter(rows, dim, partition_dim=0)
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.width == 1:
            return all_reduce(F.embedding(ids, self.weight), self.width)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local_ids = (ids - self.vocab_start).masked_fill(outside, 0)
        rows = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return all_reduce(rows, self.width)


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, width: int, vocab_start: int, vocab_end: int
) -> torch.Tensor:
    """Per-token cross-entropy of logits split over the vocabulary (Megatron's algorithm).

    Each rank holds the columns [vocab_start, vocab_end); the maximum, the sum of exponentials and
    the target logit are combined by all-reduces.
    """
    global_max = all_reduce(logits.amax(dim=-1), width, "max")
    shifted = logits - global_max.unsqueeze(-1)
    sum_exp = all_reduce(shifted.exp().sum(dim=-1), width)
    if width == 1:
        target = shifted.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    else:
        outside = (labels < vocab_start) | (labels >= vocab_end)
        local_labels = (labels - vocab_start).masked_fill(outside, 0)
        target = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    return sum_exp.log() - all_reduce(target, width)
