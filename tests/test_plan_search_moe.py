"""The plan search from an exported model (`solver.auto_sharding.from_export`) on mixtures of experts
and latent attention: the zoo's Mixtral, Qwen3-MoE and DeepSeek-V3 blocks (routed and shared experts,
dense first blocks, multi-head latent attention) and a mixture of grouped products (aten._grouped_mm),
compared with derived_plan by the ILP's own cost model and checked by running the ranks in lockstep."""

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graph_extract.export import export
from graph_extract.plan import COLWISE, ROWWISE, derived_plan
from graph_extract.plan_pass import apply_plan
from graph_extract.transformer import TransformerModel, example_inputs, per_token_cross_entropy
from graph_extract.verify import MICRO_BATCH_SIZE, TINY, verify_plan
from graph_extract.zoo import get_spec
from phaze_common.checks import InputError
from solver.auto_sharding.costs import CostModel
from solver.auto_sharding.from_export import (
    SearchSettings, cost_settings, plan_strategies, search_blocks, search_model, search_plan, tensor_parallel_mesh,
    tiny_zoo_model)

#: A slow chip (1 GFLOP/s at half): at these tiny sizes an H100's rate leaves the blocks replicated.
SLOW = SearchSettings(chip_flops=1e9)
SEQUENCE = TINY["default_sequence_length"]
#: The residual stream b·s·h in bf16, and the routing weights b·s·k (k = 2 experts per token) [bytes].
STREAM = MICRO_BATCH_SIZE * SEQUENCE * TINY["hidden_size"] * 2
WEIGHTS = MICRO_BATCH_SIZE * SEQUENCE * 2 * 2
#: The tiny Qwen3-MoE with 2 key/value heads (verify's rule gives it 1, which the ILP cannot split).
ZOO = {"mixtral-8x7b": {}, "deepseek-v3": {}, "qwen3-235b-a22b": {"num_kv_heads": 2}}


def tiny(name: str, width: int, device: str = "meta") -> tuple[nn.Module, dict]:
    return tiny_zoo_model(name, width, device, **ZOO[name])


@functools.cache
def exported(name: str):
    """The tiny zoo model exported once (its vocabulary padded for t = 4, so for t = 2 too)."""
    return export(*tiny(name, 4))


def styles(plan, searched) -> dict[str, str | None]:
    """The style `plan` gives each weight product of every block of the searched kinds."""
    found = {}
    for kind in searched:
        prefix = f"{kind.block.blocks}.{kind.block.index}."
        for path in kind.block.products.values():
            for index in kind.indices:
                name = f"{kind.block.blocks}.{index}.{path.removeprefix(prefix)}"
                found[name] = plan.style(name)
    return found


def derived_costs(graph, searched, width, search=SLOW, mesh=None):
    """derived_plan's cost of each searched kind by the ILP's cost model (on `mesh` if given)."""
    derived = derived_plan(graph, "layers")
    found = []
    for kind in searched:
        model_mesh, settings = search_model(kind.block, width, search)
        costs = CostModel(kind.block.graph, mesh or model_mesh, settings)
        found.append(costs.evaluate(plan_strategies(kind.block, derived, costs)))
    return found


@pytest.mark.parametrize("name, width", [(name, width) for name in ZOO for width in (2, 4)])
def test_the_search_splits_the_zoo_mixtures_as_derived_plan(name, width):
    """Every weight product of every block has derived_plan's style (Megatron's: the attention's q, k,
    v or latent up projections and the experts' and shared experts' gate and up colwise, their
    output and down projections rowwise, the latent down projections and the router replicated), and
    each kind of block's ILP objective is derived_plan's cost by the same cost model (never more)."""
    graph = exported(name)
    plan, _ = search_plan(graph, "layers", width, SLOW)
    searched = search_blocks(graph, "layers", width, SLOW)
    derived = derived_plan(graph, "layers")
    assert styles(plan, searched) == styles(derived, searched)
    assert {style for style in styles(plan, searched).values()} == {COLWISE, ROWWISE, None}
    assert [len(kind.indices) for kind in searched] == ([1, 1] if name == "deepseek-v3" else [2])
    for kind, cost in zip(searched, derived_costs(graph, searched, width)):
        assert kind.result.status == "optimal"
        assert kind.result.objective == pytest.approx(cost.total, rel=1e-12)


def ring(width: int, full_bytes: float) -> float:
    """A ring all-reduce at α = 1 s a step and β = 1 s a byte: 2(t−1) + 2(t−1)/t · B."""
    return 2 * (width - 1) + 2 * (width - 1) / width * full_bytes


@pytest.mark.parametrize("width", [2, 4])
def test_a_mixtures_all_reduces_are_of_its_tokens_not_their_expert_slots(width):
    """Communication of the searched (= derived_plan's) plans, α = β = 1 (a 1-byte/s link of 1 s a
    step), residual stream B = 2·16·64·2 = 4096 bytes. The experts' input gradient is all-reduced on
    the tokens (the dispatch is part of the expert products) and their rowwise sum after the combine
    (the combine is part of the down product), both B, not on the experts' slots; the routing
    weights' gradient, a sum over the split features, is all-reduced too (2·16·2·2 = 128 bytes).

    Mixtral: forward after the attention's output and the experts' combine, backward at the q, k, v
    input and the experts' tokens: 4·AR(B) + AR(128) = 4·4098 + 130 = 16522 s at t = 2 (4·6150 + 198
    = 24798 s at t = 4). DeepSeek-V3's dense block (latent attention): forward after the attention
    and the MLP, backward at the MLP's input and on the latents (q: 2·16·24·2 = 1536 bytes, kv:
    1024) and the one rotated key expanded to the heads (2·16·4·2 = 256): 3·AR(B) + AR(1536) +
    AR(1024) + AR(256) = 15116 s at t = 2; its mixture block also all-reduces the shared experts'
    sum and their input (the module's norm output, read by the router too): 5·AR(B) + AR(1536) +
    AR(1024) + AR(256) + AR(128) = 23442 s at t = 2."""
    mesh = tensor_parallel_mesh(width, link_bandwidth=1.0, link_latency=1.0)
    expected = {"mixtral-8x7b": [4 * ring(width, STREAM) + ring(width, WEIGHTS)],
                "deepseek-v3": [3 * ring(width, STREAM) + ring(width, 1536) + ring(width, 1024) + ring(width, 256),
                                5 * ring(width, STREAM) + ring(width, 1536) + ring(width, 1024) + ring(width, 256)
                                + ring(width, WEIGHTS)]}
    assert expected["mixtral-8x7b"][0] == (16522 if width == 2 else 24798)
    if width == 2:
        assert expected["deepseek-v3"] == [15116, 23442]
    for name, communication in expected.items():
        graph = exported(name)
        searched = search_blocks(graph, "layers", width, SLOW)
        for kind, cost, seconds in zip(searched, derived_costs(graph, searched, width, mesh=mesh), communication):
            assert cost.weight_sync == 0.0
            assert cost.resharding == pytest.approx(seconds, rel=1e-12), name
            costs = CostModel(kind.block.graph, mesh, cost_settings(SLOW.chip_flops))
            assert costs.evaluate(kind.result.strategies).resharding == pytest.approx(seconds, rel=1e-12)


def test_the_full_deepseek_plan_computes_the_tiny_model():
    """DeepSeek-V3 at full size (its 3 dense blocks and 2 of its mixture blocks, 4096 tokens, default
    prices) gets derived_plan's split, written as one wildcard entry per module; two ranks under it,
    run in lockstep on real weights, give the losses of the tiny DeepSeek-V3 (one dense block with
    latent attention, one block of routed and shared experts)."""
    spec = get_spec("deepseek-v3").with_overrides(num_layers=5)
    with torch.device("meta"):
        model = TransformerModel(spec, spec.default_sequence_length, spec.padded_vocab_size(2), 1)
    graph = export(model, example_inputs(model, 1, spec.default_sequence_length))
    plan, _ = search_plan(graph, "layers", 2)
    searched = search_blocks(graph, "layers", 2)
    assert [kind.indices for kind in searched] == [(0, 1, 2), (3, 4)]
    assert styles(plan, searched) == styles(derived_plan(graph, "layers"), searched)
    assert all(pattern.startswith("layers.*.") for pattern, _ in plan.styles if pattern.startswith("layers."))
    assert verify_plan(*tiny_zoo_model("deepseek-v3", 2), plan, 2, "layers") < 1e-4


# a mixture of grouped products -----------------------------------------------------------------

class GroupedExperts(nn.Module):
    """Top-2 of 4 SwiGLU experts on tokens sorted by expert, each expert's rows one group of
    aten._grouped_mm ([experts, in, out] weights), combined by the inverse order and the renormalised
    routing weights."""

    def __init__(self, hidden: int, ffn: int, experts: int = 4, top: int = 2) -> None:
        super().__init__()
        self.experts, self.top = experts, top
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate, self.up = (nn.Parameter(torch.randn(experts, hidden, ffn) / hidden ** 0.5) for _ in range(2))
        self.down = nn.Parameter(torch.randn(experts, ffn, hidden) / ffn ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(0, 1)
        chosen, experts = F.softmax(self.router(tokens), dim=-1).topk(self.top, dim=-1)
        weights = chosen / chosen.sum(dim=-1, keepdim=True)
        order = experts.flatten().argsort(stable=True)
        offsets = F.one_hot(experts.flatten(), self.experts).sum(0).cumsum(0).to(torch.int32)
        rows = tokens.index_select(0, order // self.top)
        hidden = F.silu(torch._grouped_mm(rows, self.gate, offsets)) * torch._grouped_mm(rows, self.up, offsets)
        out = torch._grouped_mm(hidden, self.down, offsets).index_select(0, order.argsort())
        return (out.unflatten(0, (-1, self.top)) * weights.unsqueeze(-1)).sum(dim=1).view_as(x)


class GroupedBlock(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden)
        self.mlp = GroupedExperts(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class GroupedModel(nn.Module):
    """Embedding, 2 blocks of grouped experts, a norm, an output projection and per-token losses."""

    def __init__(self, vocab: int = 256, hidden: int = 64, ffn: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(GroupedBlock(hidden, ffn) for _ in range(2))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        return per_token_cross_entropy(self.head(self.norm(x)), labels)


def grouped() -> tuple[GroupedModel, dict]:
    """On the meta device in bf16 (the only type of aten._grouped_mm's meta kernel: the model exports,
    but does not run on the CPU in float32 to check its ranks in lockstep)."""
    with torch.device("meta"):
        model = GroupedModel().to(torch.bfloat16).eval()
    inputs = {name: torch.zeros((MICRO_BATCH_SIZE, SEQUENCE), dtype=torch.long, device="meta")
              for name in ("input_ids", "labels")}
    return model, inputs


def test_grouped_expert_products_are_split_as_derived_plan():
    """The grouped gate and up products colwise, down rowwise, the router replicated: derived_plan's,
    at its cost; the plan pass gives each of 2 ranks half of each expert's out (gate, up: [4, 64, 16])
    and in (down: [4, 16, 64]) dimension."""
    graph = export(*grouped())
    plan, result = search_plan(graph, "layers", 2, SLOW)
    assert {pattern: style for pattern, style in plan.styles if pattern.startswith("layers.")} == {
        "layers.*.mlp.gate": COLWISE, "layers.*.mlp.up": COLWISE, "layers.*.mlp.down": ROWWISE}
    searched = search_blocks(graph, "layers", 2, SLOW)
    assert styles(plan, searched) == styles(derived_plan(graph, "layers"), searched)
    assert result.objective == pytest.approx(derived_costs(graph, searched, 2)[0].total, rel=1e-12)
    rank = dict(apply_plan(graph, plan, 2).named_parameters())
    assert [tuple(rank[f"layers.1.mlp.{name}"].shape) for name in ("gate", "up", "down", "router.weight")] == [
        (4, 64, 16), (4, 64, 16), (4, 16, 64), (4, 64)]


class ScatteredExperts(GroupedExperts):
    """The experts' rows (unweighted) added back to their tokens by index_add instead of a row pick."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(0, 1)
        _, experts = F.softmax(self.router(tokens), dim=-1).topk(self.top, dim=-1)
        order = experts.flatten().argsort(stable=True)
        offsets = F.one_hot(experts.flatten(), self.experts).sum(0).cumsum(0).to(torch.int32)
        rows = tokens.index_select(0, order // self.top)
        hidden = F.silu(torch._grouped_mm(rows, self.gate, offsets)) * torch._grouped_mm(rows, self.up, offsets)
        out = torch._grouped_mm(hidden, self.down, offsets)
        return torch.zeros(tokens.shape, dtype=x.dtype, device=x.device).index_add(0, order // self.top, out).view_as(x)


def test_a_combine_by_index_add_is_refused_in_one_line():
    model, inputs = grouped()
    for layer in model.layers:
        with torch.device("meta"):
            layer.mlp = ScatteredExperts(64, 32).to(torch.bfloat16)
    with pytest.raises(InputError) as raised:
        search_plan(export(model, inputs), "layers", 2, SLOW)
    assert str(raised.value) == "plan search: aten.index_add.default at layers.0.mlp: this operator is not handled"
