"""The tensor-parallel plan of an exported model's block searched by the sharding ILP
(`solver.auto_sharding.from_export`), returned as a plan the plan pass applies, and checked by
running its ranks in lockstep on real weights."""

import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graph_extract.export import export
from graph_extract.factory import factory_function
from graph_extract.parallel import all_reduce
from graph_extract.plan import COLWISE, ROWWISE, derived_plan
from graph_extract.plan_pass import apply_plan
from graph_extract.transformer import TransformerModel, example_inputs
from graph_extract.verify import MICRO_BATCH_SIZE, TINY
from graph_extract.zoo import get_spec
from phaze_common.checks import InputError
from solver.auto_sharding.costs import CostModel
from solver.auto_sharding.from_export import (
    SearchSettings, agrees, block_graph, plan_strategies, rank_graphs, search_model, search_plan, verified)

#: A slow chip (1 GFLOP/s at half): at these tiny sizes an H100's rate makes a block's compute
#: (~10 ns) far cheaper than one all-reduce's latency, and the block is then best left replicated.
SLOW = SearchSettings(chip_flops=1e9)
ALPHA, BANDWIDTH = 3.4e-6, 450e9
SEQUENCE = TINY["default_sequence_length"]
#: The residual stream between blocks, b·s·h bf16 elements [bytes].
STREAM_BYTES = MICRO_BATCH_SIZE * SEQUENCE * TINY["hidden_size"] * 2
MEGATRON = {"q": COLWISE, "k": COLWISE, "v": COLWISE, "o": ROWWISE, "gate": COLWISE, "up": COLWISE,
            "down": ROWWISE}


def ring_all_reduce(width: int, full_bytes: float) -> float:
    """2(t−1)·α + 2(t−1)/t · B/bandwidth."""
    return 2 * (width - 1) * ALPHA + 2 * (width - 1) / width * full_bytes / BANDWIDTH


# the zoo's llama3-8b, tiny --------------------------------------------------------------------

def tiny_llama3(width: int, device: str) -> tuple[TransformerModel, dict]:
    """llama3-8b's family at graph_extract.verify.TINY: 2 blocks, hidden 64, 8 query heads and 2
    key/value heads of 8 (8B's ratio 32:8), feed-forward 160, b = 2, s = 16."""
    spec = get_spec("llama3-8b").with_overrides(**TINY, num_kv_heads=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = TransformerModel(spec, SEQUENCE, spec.padded_vocab_size(width), MICRO_BATCH_SIZE).eval()
    return model, example_inputs(model, MICRO_BATCH_SIZE, SEQUENCE, device=device)


ZOO_NAMES = {"q": "attention.query", "k": "attention.key", "v": "attention.value", "o": "attention.dense",
             "gate": "mlp.gate", "up": "mlp.up", "down": "mlp.down"}


@pytest.mark.parametrize("width", [2, 4])
def test_the_search_finds_megatrons_split_of_the_zoo_llama(width):
    """The searched styles of the block's seven products are derived_plan's (Megatron's: q, k, v,
    gate, up colwise; o, down rowwise), and the embedding and output projection are derived_plan's.

    Its objective is the Megatron plan's cost by CostModel.evaluate. By hand: the batch and
    sequence are never split, so no weight gradient is all-reduced; o and down leave Partial sums
    all-reduced before the residual adds (2 forward all-reduces), and the colwise products' input
    gradients (Partial over the split features) are summed locally per tensor and all-reduced once
    (Megatron's one copy_to_tensor_parallel_region per tensor: q, k, v's of the first norm's output,
    gate and up's of the second's: 2 backward all-reduces), all of the residual stream's
    B = 2·16·64·2 = 4096 bytes: 4·(2(t−1)·3.4 µs + 2(t−1)/t·B / 450 GB/s), i.e.
    4 × 6.80910 µs at t = 2 and 4 × 20.41365 µs at t = 4. Compute is the same in every plan that
    splits all seven products (they and the attention core by t, norms and adds whole), so it
    cancels: objective − compute is the 4 all-reduces."""
    model, inputs = tiny_llama3(4, "meta")
    graph = export(model, inputs)
    plan, result = search_plan(graph, "layers", width, SLOW)
    derived = derived_plan(graph, "layers")
    assert result.status == "optimal"
    for short, name in ZOO_NAMES.items():
        assert plan.style(f"layers.1.{name}") == derived.style(f"layers.0.{name}") == MEGATRON[short], name
    assert {pattern: style for pattern, style in plan.styles if not pattern.startswith("layers.")} == {
        "embedding.word": ROWWISE, "head": COLWISE}
    block = block_graph(graph, "layers", width)
    mesh, settings = search_model(block, width, SLOW)
    model_costs = CostModel(block.graph, mesh, settings)
    megatron = model_costs.evaluate(plan_strategies(block, derived, model_costs))
    assert result.objective == pytest.approx(megatron.total, rel=1e-12)
    assert result.cost.weight_sync == 0.0
    assert result.objective - result.cost.compute == pytest.approx(4 * ring_all_reduce(width, STREAM_BYTES),
                                                                   rel=1e-9)


def test_at_an_h100s_rate_the_tiny_block_stays_replicated():
    """At 400 TFLOP/s × 0.5 the tiny block's compute, 3 × its forward FLOPs × 5 ps ≈ 40 ns in all,
    is below one all-reduce's latency 2·3.4 µs: the best plan splits nothing and pays no
    collective (objective = compute)."""
    model, inputs = tiny_llama3(2, "meta")
    plan, result = search_plan(export(model, inputs), "layers", 2)
    assert not [pattern for pattern, _ in plan.styles if pattern.startswith("layers.")]
    assert result.objective == result.cost.compute < 2 * ALPHA


def test_the_searched_plan_computes_the_zoo_llama_at_four_ranks():
    """Four ranks (two per key/value head, Megatron's rule) run in lockstep give the model's losses."""
    plan, _ = search_plan(export(*tiny_llama3(4, "meta")), "layers", 4, SLOW)
    assert verified(plan, *tiny_llama3(4, "cpu"), 4)


# a plain PyTorch Llama whose attention and MLP are one module -----------------------------------

#: tests/data/mixer_llama.py: a Llama whose attention and MLP are one module (`model.stack.<i>.mixer`).
MIXER_LLAMA = factory_function(f"{Path(__file__).resolve().parent / 'data' / 'mixer_llama.py'}:llama3_8b")
Mixer = inspect.getmodule(MIXER_LLAMA).Mixer


def plain(device: str) -> tuple[nn.Module, dict]:
    """tests/data/mixer_llama.py's Llama at 2 blocks, hidden 64, 8 query and 4 key/value heads, FFN
    160, a vocabulary of 256, with random weights on `device`, and its inputs."""
    torch.manual_seed(0)
    with torch.device(device):
        model = MIXER_LLAMA(SEQUENCE, vocab_size=256, num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                            num_key_value_heads=4, intermediate_size=160).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randint(0, 256, (MICRO_BATCH_SIZE, SEQUENCE), generator=generator).to(device)
              for name in ("input_ids", "labels")}
    return model, inputs


def test_the_search_splits_a_one_module_block_as_megatron_where_the_structure_does_not():
    """derived_plan sees one child module (`mixer`) holding all seven products: its one sink, down,
    rowwise and the products feeding it last, gate and up, colwise; q, k, v and o stay replicated.
    The search gives Megatron's split, cheaper by the ILP's cost model than the derived plan (which
    the plan pass accepts), and its ranks compute the model at t = 2."""
    model, inputs = plain("meta")
    graph = export(model, inputs)
    derived = derived_plan(graph, "model.stack")
    assert {pattern: style for pattern, style in derived.styles if pattern.startswith("model.stack.0.")} == {
        "model.stack.0.mixer.down": ROWWISE, "model.stack.0.mixer.gate": COLWISE,
        "model.stack.0.mixer.up": COLWISE}
    apply_plan(graph, derived, 2)  # expressible
    plan, result = search_plan(graph, "model.stack", 2, SLOW)
    assert {pattern: style for pattern, style in plan.styles if pattern.startswith("model.stack.")} == {
        f"model.stack.*.mixer.{name}": style for name, style in MEGATRON.items()}
    block = block_graph(graph, "model.stack", 2)
    mesh, settings = search_model(block, 2, SLOW)
    costs = CostModel(block.graph, mesh, settings)
    assert result.objective < costs.evaluate(plan_strategies(block, derived, costs)).total
    assert verified(plan, *plain("cpu"), 2)
    assert verified(derived, *plain("cpu"), 2)


def test_a_plan_whose_all_reduce_is_dropped_is_caught():
    """o rowwise leaves each rank a partial sum of the attention's output; without its all-reduce the
    ranks' losses differ from the model's."""
    model, inputs = plain("meta")
    plan, _ = search_plan(export(model, inputs), "model.stack", 2, SLOW)
    real, real_inputs = plain("cpu")
    ranks = rank_graphs(real, real_inputs, plan, 2)
    assert agrees(real, real_inputs, ranks)
    dropped = 0
    for rank in ranks:
        for node in list(rank.graph.nodes):
            if node.target is all_reduce and node.meta.get("module_path") == "model.stack.0.mixer.o":
                node.replace_all_uses_with(node.args[0])
                rank.graph.erase_node(node)
                dropped += 1
        rank.recompile()
    assert dropped == 2
    assert not agrees(real, real_inputs, ranks)


class AttentionKernelMixer(Mixer):
    """The Mixer with aten.scaled_dot_product_attention over the key/value heads (enable_gqa)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        q = self.q(h).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)
        k = self.k(h).unflatten(-1, (self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v(h).unflatten(-1, (self.kv_heads, self.head_dim)).transpose(1, 2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(attended.transpose(1, 2).flatten(-2))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@pytest.mark.parametrize("width", [2, 8])
def test_an_attention_kernel_is_split_on_its_heads(width):
    """With scaled_dot_product_attention (8 query heads, 4 key/value heads: at t = 8 each key/value head
    on 2 ranks) the search gives Megatron's split and pays its 4 all-reduces of the residual stream
    (2 forward after o and down, 2 backward for the q/k/v and the gate/up inputs, as for the zoo's
    llama); the plan pass itself refuses the kernel on split heads."""
    model, inputs = plain("meta")
    for layer in model.model.stack:
        with torch.device("meta"):
            layer.mixer = AttentionKernelMixer(64, 8, 4, 160, SEQUENCE, 500000.0)
    graph = export(model, inputs)
    plan, result = search_plan(graph, "model.stack", width, SLOW)
    assert {pattern: style for pattern, style in plan.styles if pattern.startswith("model.stack.")} == {
        f"model.stack.*.mixer.{name}": style for name, style in MEGATRON.items()}
    assert result.objective - result.cost.compute == pytest.approx(4 * ring_all_reduce(width, STREAM_BYTES),
                                                                   rel=1e-9)
    with pytest.raises(InputError, match=r"^plan: aten.scaled_dot_product_attention.default at model.stack.0.mixer: "
                                         r"an operator on S\(1\), S\(1\), S\(1\) inputs"):
        apply_plan(graph, plan, width)


def test_a_transformers_model_is_searched_and_verified(tmp_path):
    """Qwen2.5's config.json cut to a tiny size, built by transformers (biases on q, k, v, its own
    RMSNorm and rotary positions, its attention kernel as exported): the search gives the derived
    (Megatron's) styles and its two ranks compute the model's losses."""
    import json
    from pathlib import Path

    from graph_extract import hf
    from graph_extract.factory import find_blocks, model_inputs

    config = json.loads((Path(__file__).parent / "data" / "hf_configs" / "Qwen2.5-7B" / "config.json").read_text())
    config.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8, vocab_size=256,
                  max_position_embeddings=64, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  num_key_value_heads=4)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    torch.manual_seed(0)
    model = hf.build_real(str(path)).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randint(0, 256, tuple(value.shape), generator=generator)
              for name, value in model_inputs(model, MICRO_BATCH_SIZE, SEQUENCE).items()}
    blocks = find_blocks(model)
    graph = export(model, inputs)
    plan, _ = search_plan(graph, blocks, 2, SLOW)
    derived = derived_plan(graph, blocks)
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")
    assert [plan.style(f"{blocks}.1.{name}") for name in names] == [
        derived.style(f"{blocks}.0.{name}") for name in names] == [COLWISE] * 3 + [ROWWISE] + [COLWISE] * 2 + [ROWWISE]
    assert verified(plan, model, inputs, 2)
