"""Extraction: FLOPs, activation bytes, tensor-parallel shards, layer graphs, repeats, cache."""

import json

import pytest

import graph_extract.extraction as extract_module
from graph_extract import OpGraph, OpNode, extract, get_spec, valid_tensor_parallel_widths
from graph_extract.repeats import repeat_groups

GPT3_SHAPE = get_spec("megatrongpt3").with_overrides(num_layers=2)


def gpt_block_flops(b: int, s: int, h: int) -> int:
    return 24 * b * s * h * h + 4 * b * s * s * h


def gpt_block_activation_bytes(b: int, s: int, h: int, a: int, t: int) -> float:
    """Korthikanti et al. (2022), fp16 activations, 1-byte dropout masks, tensor parallel t."""
    return s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t


@pytest.mark.parametrize("b", [1, 2])
@pytest.mark.parametrize("model", ["gpt2", "megatrongpt2-xl"])
def test_gpt_block_forward_flops(model, b):
    spec = get_spec(model).with_overrides(num_layers=2)
    graphs = extract(spec, b)
    s, h = spec.default_sequence_length, spec.hidden_size
    for block in (1, 2):
        assert graphs.layer_graph.layer(block).forward_flops == gpt_block_flops(b, s, h)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_gpt3_block_flops_and_activation_bytes_per_shard(t):
    b, s, h, a = 2, 2048, 12288, 96
    graphs = extract(GPT3_SHAPE, b, tensor_parallel_width=t)
    block = graphs.layer_graph.layer(1)
    assert block.forward_flops * t == gpt_block_flops(b, s, h)
    assert block.activation_bytes == gpt_block_activation_bytes(b, s, h, a, t)


def test_gpt2_block_activation_bytes():
    spec = get_spec("gpt2").with_overrides(num_layers=1)
    block = extract(spec, 1).layer_graph.layer(1)
    assert block.activation_bytes == 1024 * 1600 * 34 + 5 * 25 * 1024 * 1024


# Megatron pads the GPT-2 vocabulary (50257) to a multiple of 128·t: `_vocab_size_with_padding` in
# megatron/tokenizer/tokenizer.py with --make-vocab-size-divisible-by 128 (Megatron-LM; the original's
# copy is in msr-fiddle/phaze at fed7cde, third_party_for_phaze/phaze-megatron-lm).
PADDED_VOCAB = {1: 50304, 2: 50432, 4: 50688, 8: 51200}


@pytest.mark.parametrize("t", [2, 4, 8])
def test_shard_parameters_times_width_equal_total_up_to_replicated_terms(t):
    """Per block 12h²/t + 7h/t + 6h (4h LayerNorm + 2h row biases replicated), as Megatron."""
    h, L, positions = GPT3_SHAPE.hidden_size, GPT3_SHAPE.num_layers, GPT3_SHAPE.max_position_embeddings
    replicated = positions * h + L * 6 * h + 2 * h  # position table, per-block terms, final norm
    one = extract(GPT3_SHAPE, 1).parameters_per_device
    shard = extract(GPT3_SHAPE, 1, tensor_parallel_width=t).parameters_per_device
    padding = (PADDED_VOCAB[t] - PADDED_VOCAB[1]) * h
    assert shard * t == one + (t - 1) * replicated + padding
    assert shard == PADDED_VOCAB[t] // t * h + positions * h + L * (12 * h * h // t + 7 * h // t + 6 * h) + 2 * h


def test_layer_graph_is_a_chain_of_hidden_states():
    b, s, h = 1, 2048, 12288
    graphs = extract(GPT3_SHAPE, b, tensor_parallel_width=4)
    layers = graphs.layer_graph.layers
    assert [layer.name for layer in layers] == ["embedding", "layers.0", "layers.1", "head"]
    assert [(e.source, e.dest, e.bytes) for e in graphs.layer_graph.edges] == [
        (0, 1, 2 * b * s * h),
        (1, 2, 2 * b * s * h),
        (2, 3, 2 * b * s * h),
    ]
    assert all(layer.tensor_parallel for layer in layers)
    assert not any(layer.tensor_parallel for layer in extract(GPT3_SHAPE, b).layer_graph.layers)


def test_allreduces_of_a_block():
    graphs = extract(GPT3_SHAPE, 1, tensor_parallel_width=8)
    collectives = [n for n in graphs.op_graph.layer_nodes(1) if n.kind == "allreduce"]
    assert sorted(n.attr("direction") for n in collectives) == ["backward", "backward", "forward", "forward"]
    assert all(n.attr("group_size") == 8 and n.output_shape == (1, 2048, 12288) for n in collectives)


def _node(i, layer, op="add", shape=(4, 8), inputs=()):
    return OpNode(i, "elementwise", op, layer, f"n{i}", f"layers.{layer}", (shape,) * len(inputs), (shape,),
                  inputs=tuple(inputs))


def test_repeat_groups_separate_structurally_different_blocks():
    nodes = (
        _node(0, 0),
        _node(1, 1, inputs=[0]), _node(2, 1, "gelu", inputs=[1]),
        _node(3, 2, inputs=[2]), _node(4, 2, "gelu", inputs=[3]),
        _node(5, 3, inputs=[4]), _node(6, 3, "relu", inputs=[5]),  # differs in one operator
        _node(7, 4, inputs=[6]), _node(8, 4, "gelu", inputs=[6]),  # same operators, other wiring
    )
    edges = ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (6, 8))
    assert repeat_groups(OpGraph(nodes, edges, 1)) == ((0,), (1, 2), (3,), (4,))


def test_valid_widths():
    assert valid_tensor_parallel_widths("megatrongpt2-54", 8) == (1, 2, 4)  # 20 heads
    assert valid_tensor_parallel_widths("gpt2", 8) == (1,)  # 25 heads
    assert valid_tensor_parallel_widths("megatrongpt3", 8) == (1, 2, 4, 8)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(micro_batch_size=0), "micro_batch_size: must be a positive integer"),
        (dict(micro_batch_size=1, sequence_length=-5), "sequence_length: must be a positive integer"),
        (dict(micro_batch_size=1, sequence_length=4096), "sequence_length: megatrongpt2-54 supports at most 1024"),
        (dict(micro_batch_size=1, tensor_parallel_width=8), "tensor_parallel_width: 8 does not divide the 20 heads"),
        (dict(micro_batch_size=1, tensor_parallel_width=3), "tensor_parallel_width: must be a power of two"),
    ],
)
def test_bad_input_names_the_field(arguments, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        extract("megatrongpt2-54", **arguments, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written


def test_cache_reuse_force_and_corruption(tmp_path, monkeypatch):
    spec = get_spec("bertlarge").with_overrides(num_layers=1)
    first = extract(spec, 2, cache_dir=tmp_path)
    (path,) = (tmp_path / "graphs").iterdir()
    assert path.name.startswith("bertlarge_mbs2_seq512_tp1_v")
    calls = []
    real_trace = extract_module._trace
    monkeypatch.setattr(extract_module, "_trace", lambda *a: calls.append(a) or real_trace(*a))
    assert extract(spec, 2, cache_dir=tmp_path) == first and not calls  # loaded, not traced
    assert extract(spec, 2, cache_dir=tmp_path, force=True) == first and len(calls) == 1
    path.write_text(path.read_text()[:1000])  # truncated file
    assert extract(spec, 2, cache_dir=tmp_path) == first and len(calls) == 2
    assert json.loads(path.read_text())["parameter_count"] == first.parameter_count
    assert extract(spec, 1, cache_dir=tmp_path) != first  # another key, another file
    assert len(list((tmp_path / "graphs").glob("*.json"))) == 2  # the truncated file was set aside


@pytest.mark.parametrize("model, width", [("megatrongpt3", 1), ("megatrongpt3", 2), ("bertlarge", 1), ("llama2", 1),
                                          ("opt", 1)])
def test_copied_blocks_equal_traced_blocks(model, width, monkeypatch):
    # the layers beyond the traced blocks are copies: the same graphs as tracing every block
    spec = get_spec(model).with_overrides(num_layers=5)
    compact = extract_module._trace(spec, 1, 64, width)
    monkeypatch.setattr(extract_module, "TRACED_BLOCKS", 5)
    full = extract_module._trace(spec, 1, 64, width)
    assert compact.layer_graph == full.layer_graph and compact.repeat_groups == full.repeat_groups
    assert (compact.parameter_count, compact.parameters_per_device) == (full.parameter_count, full.parameters_per_device)
    assert compact.op_graph.layers == (0, 1, 2, 6) and len(full.op_graph.layers) == 7
