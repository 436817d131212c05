"""The tensor-parallel shards compute the unsharded model (tiny configurations, real tensors)."""

import pytest

import graph_extract.verify as verify_module
from graph_extract import MODELS, verify_tensor_parallel


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("model", MODELS)
def test_shards_match_unsharded_model(model, width):
    result = verify_tensor_parallel(model, width)
    assert result.passed, result


def test_verification_fails_when_the_all_reduces_are_skipped(monkeypatch):
    """Without the cross-shard reductions the shards' outputs are wrong: the check can fail."""
    monkeypatch.setattr(verify_module, "all_reduce", object())
    assert not verify_tensor_parallel("megatrongpt3", 2).passed
    assert not verify_tensor_parallel("llama2", 4).passed
