"""Factories that phaze must refuse with one line naming model.config (tests/test_model_factory.py)."""

import sys

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(x)


class Model(nn.Module):
    """Token embedding, blocks in a ModuleList (or in plain attributes), a sum as the head."""

    def __init__(self, blocks_in_a_list: bool = True, cumulative_sum: bool = False, head: bool = True) -> None:
        super().__init__()
        self.config = {"num_attention_heads": 2, "max_position_embeddings": 32}
        self.embed = nn.Embedding(100, 16)
        if blocks_in_a_list:
            self.blocks = nn.ModuleList(Block() for _ in range(3))
        else:
            self.first, self.second = Block(), Block()
        self.cumulative_sum, self.head = cumulative_sum, head

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks if hasattr(self, "blocks") else (self.first, self.second):
            x = block(x)
        if not self.head:
            return x
        return torch.cumsum(x, dim=1) if self.cumulative_sum else x.sum(dim=-1)


def fine(sequence_length: int = 32) -> Model:
    return Model()


def raises(sequence_length: int = 32) -> Model:
    raise RuntimeError("out of ideas\nsecond line")


def returns_a_number() -> int:
    return 3


def with_an_unsupported_operator() -> Model:
    return Model(cumulative_sum=True)


def without_a_head() -> Model:
    return Model(head=False)


def exits(sequence_length: int = 32) -> Model:
    sys.exit(3)


def exits_without_a_code() -> Model:
    sys.exit()


class ExitingModel(Model):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        sys.exit("stop here")


def exits_in_its_forward() -> Model:
    return ExitingModel()
