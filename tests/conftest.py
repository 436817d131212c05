"""Shared test helpers: a tiny GPT-3-shaped configuration of phaze, read-only folders."""

import os
import subprocess

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


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory, monkeypatch):
    """The test's own per-user cache folder (XDG_CACHE_HOME, beside its tmp_path): where phaze caches
    unless told otherwise (`cache_dir` null), so that no test reads or fills the user's."""
    base = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    return base / "phaze"


@pytest.fixture
def tiny_settings():
    """settings(cache_dir, *overrides): the tiny configuration's run_solver Settings."""

    def make(cache_dir, *overrides):
        with initialize_config_module("phaze.conf", version_base="1.3"):
            cfg = compose("config", overrides=["mode=run_solver", f"cache_dir={cache_dir}", *TINY, *overrides])
        return settings_from_config(cfg)

    return make


@pytest.fixture
def read_only():
    """make(path): the folder `path` made read-only for this user (mode 555; for root, whom modes do
    not stop, also the immutable attribute, chattr +i), undone after the test; the test is skipped
    where neither stops this process from writing there."""
    made = []

    def make(path):
        path.chmod(0o555)
        made.append(path)
        if os.access(path, os.W_OK):
            try:
                subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=True)
            except (OSError, subprocess.CalledProcessError):
                pytest.skip("cannot make a folder read-only for this user (root without chattr)")
            if os.access(path, os.W_OK):
                pytest.skip("cannot make a folder read-only for this user (root, chattr +i ignored)")
        return path

    yield make
    for path in made:
        try:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        except OSError:  # no chattr: the mode alone made it read-only
            pass
        path.chmod(0o755)
