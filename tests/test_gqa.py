"""Grouped-query attention and the Llama-2-70B / Llama-3 / Mistral zoo models: parameter counts,
a block's FLOPs and activation bytes, tensor-parallel shards, widths, cache keys and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import graph_extract.extraction as extract_module
import graph_extract.plan_pass as plan_module
import torch
from graph_extract.export import getattr_path
from phaze_common.checks import InputError
from graph_extract.serialize import FORMAT_VERSION
from graph_extract import ModelSpec, extract, get_spec, valid_tensor_parallel_widths, verify_tensor_parallel
from graph_extract.extraction import cache_path
from phaze.cli import check_command_line

REPOSITORY = Path(__file__).resolve().parents[1]
NEW_MODELS = ("llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mistral-7b")

#: A small grouped-query block: 8 query heads of 32, 2 key/value heads (groups of 4).
TOY = get_spec("llama3-8b").with_overrides(
    num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=2, ffn_hidden_size=512, vocab_size=1000,
    max_position_embeddings=64, default_sequence_length=64,
)


def llama_parameters(layers: int, h: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    """Embedding V·h; per block q and o h·h each, k and v h·kv·d each, SwiGLU 3·h·f, two RMSNorms 2h;
    final RMSNorm h; untied LM head V·h."""
    d = h // heads
    block = 2 * h * h + 2 * h * kv_heads * d + 3 * h * ffn + 2 * h
    return vocab * h + layers * block + h + vocab * h


@pytest.mark.parametrize(
    "model, shape, published",
    [
        ("llama2-70b", (80, 8192, 64, 8, 28672, 32000), 68_976_648_192),
        ("llama3-8b", (32, 4096, 32, 8, 14336, 128256), 8_030_261_248),
        ("llama3-70b", (80, 8192, 64, 8, 28672, 128256), 70_553_706_496),
        ("llama3-405b", (126, 16384, 128, 8, 53248, 128256), 405_853_388_800),
        ("mistral-7b", (32, 4096, 32, 8, 14336, 32000), 7_241_732_096),
    ],
)
def test_parameter_count_of_every_new_model(model, shape, published):
    """The extracted count (all shards, at t 1 and 8) equals the closed form on the published shape."""
    assert llama_parameters(*shape) == published
    for width in (1, 8):
        assert extract(model, 1, sequence_length=16, tensor_parallel_width=width).parameter_count == published


def test_new_models_are_untied_rotary_swiglu_rmsnorm_without_bias():
    for model in NEW_MODELS:
        spec = get_spec(model)
        assert (spec.norm, spec.activation, spec.position_embedding) == ("rmsnorm", "swiglu", "rotary")
        assert not spec.tied_lm_head and not spec.bias and not spec.fused_qkv and spec.num_kv_heads == 8
    assert [get_spec(m).default_sequence_length for m in NEW_MODELS] == [4096, 8192, 8192, 8192, 4096]


def gqa_block_flops(b: int, s: int, h: int, heads: int, kv_heads: int, ffn: int, t: int) -> int:
    """Forward matrix FLOPs of one rank: q and o 2·b·s·h·h/t each; k and v 2·b·s·h·(local kv heads·d)
    each, where a rank holds kv/t heads or one replicated head; SwiGLU 3·2·b·s·h·f/t; QKᵀ and ·V
    2·b·s²·h/t each (every local query head, the key/value heads repeated to them)."""
    d, local_kv = h // heads, max(kv_heads // t, 1)
    return 2 * 2 * b * s * h * h // t + 2 * 2 * b * s * h * local_kv * d + 3 * 2 * b * s * h * ffn // t \
        + 2 * 2 * b * s * s * h // t


def gqa_block_activation_bytes(b: int, s: int, h: int, heads: int, ffn: int, t: int) -> int:
    """Bytes saved for the backward pass, 2 per element, no dropout: the block input and the two norm
    inputs and outputs (4·b·s·h, replicated); the local q, repeated k, repeated v and the context
    (4·b·s·h/t: the repeat is saved at the query heads' size, as Megatron's repeat_interleave does);
    the softmax output (heads/t·b·s²); gate and up outputs and their product (3·b·s·f/t; the fused
    SwiGLU rebuilds silu(gate) from the gate in the backward)."""
    return 2 * (4 * b * s * h + 4 * b * s * h // t + heads * b * s * s // t + 3 * b * s * ffn // t)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_gqa_block_flops_activation_bytes_and_weights_per_rank(t):
    """t 1, 2: the 2 key/value heads split; t 4, 8: one head per rank, replicated t/2 times."""
    b, s, h, heads, kv, ffn = 2, 64, 256, 8, 2, 512
    graphs = extract(TOY, b, tensor_parallel_width=t)
    block = graphs.layer_graph.layer(1)
    assert block.forward_flops == gqa_block_flops(b, s, h, heads, kv, ffn, t)
    assert block.activation_bytes == gqa_block_activation_bytes(b, s, h, heads, ffn, t)
    local_kv = max(kv // t, 1)
    key = next(node for node in graphs.op_graph.layer_nodes(1) if node.module_path.endswith("attention.key"))
    assert key.weight_shapes == ((local_kv * h // heads, h),)
    weights = 2 * h * h // t + 2 * h * local_kv * (h // heads) + 3 * h * ffn // t + 2 * h
    assert block.parameter_bytes == 2 * weights


def test_multi_head_attention_is_grouped_query_with_one_head_per_group():
    """num_kv_heads = num_heads gives the multi-head graph of num_kv_heads None."""
    spec = get_spec("llama2").with_overrides(num_layers=2)
    grouped = spec.with_overrides(num_kv_heads=spec.num_heads)
    for t in (1, 4):
        one, other = extract(spec, 1, 256, t), extract(grouped, 1, 256, t)
        assert one.layer_graph == other.layer_graph and one.op_graph == other.op_graph


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_gqa_shards_compute_the_unsharded_model(t):
    """8 query heads and 2 key/value heads: split (t 1, 2) and replicated (t 4, 8)."""
    result = verify_tensor_parallel(TOY, t, num_kv_heads=2)
    assert result.passed, result


def test_gqa_verification_fails_when_a_rank_holds_another_groups_head(monkeypatch):
    """Loading key/value head rank % 2 instead of rank // (t / 2) at t 4 gives rank 1 the second
    group's head for first-group queries: the check fails, so it covers the replicated heads."""
    real = plan_module.Rank.local_parameter

    def wrong_group(rank, target, dim):
        real(rank, target, dim)
        if rank.values is not None and rank.parameter_replicas.get(target, 1) > 1:
            with torch.no_grad():
                getattr_path(rank.root, target).copy_(rank.values[target].chunk(2, dim=0)[rank.rank % 2])

    assert verify_tensor_parallel(TOY, 4, num_kv_heads=2).passed
    monkeypatch.setattr(plan_module.Rank, "local_parameter", wrong_group)
    assert not verify_tensor_parallel(TOY, 4, num_kv_heads=2).passed


def test_widths_the_key_value_heads_allow():
    """12 query heads, 6 key/value heads: t 4 divides the queries, but neither 4 nor 6 divides the other."""
    spec = get_spec("llama2").with_overrides(num_layers=1, hidden_size=768, num_heads=12, num_kv_heads=6,
                                             ffn_hidden_size=2048)
    assert valid_tensor_parallel_widths(spec, 8) == (1, 2)
    with pytest.raises(ValueError, match=r"^tensor_parallel_width: 4 and the 6 key/value heads of llama2 do not "
                                         r"divide one another; allowed: 1, 2$"):
        extract(spec, 1, 64, 4)
    assert valid_tensor_parallel_widths("llama3-405b", 16) == (1, 2, 4, 8, 16)  # 8 heads; t 16 replicates them
    message = check_error("model=llama2", "+model.overrides.hidden_size=768", "+model.overrides.num_heads=12",
                          "+model.overrides.num_kv_heads=6", "+model.overrides.ffn_hidden_size=2048",
                          "max_tensor_parallel_width=8", "tensor_parallel_width=4")
    assert message.startswith("tensor_parallel_width: 4 and the 6 key/value heads of llama2 do not divide")


def check_error(*arguments: str) -> str:
    with pytest.raises(InputError) as raised:
        check_command_line("run_solver", list(arguments))
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_bad_num_kv_heads_is_one_line_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^num_kv_heads: 3 does not divide num_heads=32; allowed: a divisor of 32"):
        ModelSpec("m", 1, 4096, 32, 1, 1, 1, 1, num_kv_heads=3)
    assert check_error("model=llama3-8b", "+model.overrides.num_kv_heads=0") == (
        "model.overrides.num_kv_heads: must be a positive integer at most 16,777,216, got 0")
    assert check_error("model=megatrongpt3", "+model.overrides.num_kv_heads=8").startswith(
        "model.overrides.num_kv_heads: 8 key/value heads for 96 query heads need separate Q, K, V projections")
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    result = subprocess.run([sys.executable, "-m", "phaze", "run_solver", "model=llama3-8b",
                             "+model.overrides.num_kv_heads=3"], cwd=tmp_path, capture_output=True, text=True,
                            env=environment)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("phaze: error: model.overrides.num_kv_heads: 3 does not divide num_heads=32; allowed: "
                             "a divisor of 32, or null (one per query head)\n")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("model", NEW_MODELS)
def test_model_configs_validate_with_a_baseline_for_1024_devices(model):
    config = OmegaConf.load(REPOSITORY / "phaze" / "conf" / "model" / f"{model}.yaml")
    assert config.name == model and config.max_tensor_parallel_width == 8
    fixed = config.fixed_megatron
    assert fixed.pipeline_parallel_width * fixed.tensor_parallel_width * fixed.data_parallel_width == 1024
    assert fixed.tensor_parallel_width in valid_tensor_parallel_widths(model, 8)
    check_command_line("run_solver", [f"model={model}"])


def test_multi_head_cache_keys_are_unchanged_and_old_files_still_load(tmp_path, monkeypatch):
    """The key of a multi-head spec is the one computed before num_kv_heads existed (af4b311d), and a
    cached record without the field is reused, not traced again."""
    spec = get_spec("llama2").with_overrides(num_layers=2)
    path = cache_path(tmp_path, spec, 1, 64, 1)
    assert path.name == f"llama2_mbs1_seq64_tp1_v{FORMAT_VERSION}_af4b311d.json"
    assert cache_path(tmp_path, spec.with_overrides(num_kv_heads=8), 1, 64, 1) != path
    first = extract(spec, 1, 64, cache_dir=tmp_path)
    record = json.loads(path.read_text())
    del record["spec"]["num_kv_heads"]  # as written before grouped-query attention
    path.write_text(json.dumps(record))

    def no_tracing(*arguments):
        raise AssertionError("traced again")

    monkeypatch.setattr(extract_module, "_trace", no_tracing)
    again = extract(spec, 1, 64, cache_dir=tmp_path)
    assert again.layer_graph == first.layer_graph and path.exists()
