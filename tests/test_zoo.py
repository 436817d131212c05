"""Parameter counts of the zoo against the published / HF totals and closed formulas."""

import pytest

from graph_extract import MODELS, ModelSpec, extract, get_spec


def bert_block(h: int, f: int) -> int:
    """Attention q,k,v,o with biases, two LayerNorms, two MLP linears with biases."""
    return 4 * (h * h + h) + 2 * 2 * h + (h * f + f) + (f * h + h)


@pytest.mark.parametrize(
    "model, published",
    [
        ("bertlarge", 335_141_888),  # HF bert-large-uncased BertModel, with pooler
        ("gpt2", 1_557_611_200),  # HF gpt2-xl; the LM head is tied to the token embedding
        ("llama2", 6_738_415_616),  # Llama-2-7b-hf; untied LM head
    ],
)
def test_parameter_count_matches_published_total(model, published):
    assert extract(model, 1, tensor_parallel_width=1).parameter_count == published


def test_opt_parameter_count_within_a_tenth_of_a_percent_and_exactly_its_shapes():
    """OPT-350m: the issue quotes 331,196,928; the sum of the model's tensor shapes is 512 less.

    Shapes: tokens 50272x512 (tied LM head), positions 2050x1024, project_in/out 512x1024 without
    bias, 24 post-LN blocks, no final norm.
    """
    count = extract("opt", 1).parameter_count
    assert abs(count - 331_196_928) <= 0.001 * 331_196_928
    assert count == 50272 * 512 + 2050 * 1024 + 2 * 512 * 1024 + 24 * bert_block(1024, 4096)


def test_bert_formula():
    h, f, v = 1024, 4096, 30522
    embeddings = v * h + 512 * h + 2 * h + 2 * h
    assert embeddings + 24 * bert_block(h, f) + h * h + h == 335_141_888


def test_every_model_extracts_and_has_one_block_group():
    for model in MODELS:
        dense = get_spec(model).first_dense_layers  # DeepSeek-V3's dense blocks: a group of their own
        spec = get_spec(model).with_overrides(num_layers=dense + 3)
        graphs = extract(spec, 1, sequence_length=64)
        assert len(graphs.layer_graph.layers) == dense + 3 + 2
        assert (dense + 1, dense + 2, dense + 3) in graphs.repeat_groups
        assert not dense or tuple(range(1, dense + 1)) in graphs.repeat_groups


def test_unknown_model_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"model: unknown 'gpt5'; allowed: bertbase, bertlarge, gpt2"):
        get_spec("gpt5")


@pytest.mark.parametrize("fields, message", [
    (dict(num_heads=7), "num_heads: 7 heads do not divide hidden_size=64; allowed: a divisor of 64"),
    (dict(num_heads=32, position_embedding="rotary"), ""),  # 64 / 32 = 2: an even head size is fine
    (dict(hidden_size=96, num_heads=32, position_embedding="rotary"),
     "num_heads: rotary positions need an even head size, got hidden_size / num_heads = 96 / 32 = 3"),
    (dict(num_layers=0), "num_layers: must be a positive integer at most 16,777,216, got 0"),
    (dict(norm="batchnorm"), "norm: unknown 'batchnorm'; allowed: layernorm, rmsnorm"),
    (dict(dropout=1.0), "dropout: must be a number in [0, 1), got 1.0"),
    (dict(bias="yes"), "bias: must be true or false, got 'yes'"),
])
def test_a_spec_built_in_code_is_checked_like_a_config(fields, message):
    """ModelSpec checks itself: a spec made in a notebook is held to the rules a model file is."""
    base = dict(name="m", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256, vocab_size=100,
                max_position_embeddings=32, default_sequence_length=32)
    if not message:
        ModelSpec(**{**base, **fields})
        return
    with pytest.raises(ValueError) as raised:
        ModelSpec(**{**base, **fields})
    assert str(raised.value) == message
