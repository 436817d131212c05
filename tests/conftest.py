"""Shared test helpers: a tiny GPT-3-shaped configuration of phaze."""

import pytest
from hydra import compose, initialize_config_module

from phaze.settings import settings_from_config

#: GPT-3's structure at toy size: 2 blocks, widths 1 and 2, 16 devices, 64 samples per batch.
TINY = [
    "model=megatrongpt3",
    "+model.overrides.num_layers=2",
    "+model.overrides.hidden_size=256",
    "+model.overrides.num_heads=8",
    "+model.overrides.ffn_hidden_size=1024",
    "+model.overrides.vocab_size=1000",
    "+model.overrides.max_position_embeddings=128",
    "model.fixed_megatron.pipeline_parallel_width=2",
    "model.fixed_megatron.tensor_parallel_width=2",
    "model.fixed_megatron.data_parallel_width=4",
    "sequence_length=128",
    "max_tensor_parallel_width=2",
    "global_batch_size=64",
    "num_devices=16",
    "hbm_size=1",
]


@pytest.fixture
def tiny_settings():
    """settings(cache_dir, *overrides): the tiny configuration's run_solver Settings."""

    def make(cache_dir, *overrides):
        with initialize_config_module("phaze.conf", version_base="1.3"):
            cfg = compose("config", overrides=["mode=run_solver", f"cache_dir={cache_dir}", *TINY, *overrides])
        return settings_from_config(cfg)

    return make
