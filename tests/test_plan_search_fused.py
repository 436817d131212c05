"""The plan search (`solver.auto_sharding.from_export`) through fused projections and their pieces:
a fused q, k, v picked by `select` or cut by `split`, a fused gate and up cut by `chunk`, rotary
halves cut by `chunk`, a norm over all of q's features (its mean of squares a partial sum); and the zoo's GPT-3 and the Phi-3 and GPT-OSS config.json files, whose
blocks hold them, searched, their plans verified by running the ranks in lockstep."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graph_extract.export import export
from graph_extract.extraction import exported_model
from graph_extract.factory import factory_spec
from graph_extract.plan import COLWISE, ROWWISE, Plan
from graph_extract.plan_pass import apply_plan
from graph_extract.transformer import per_token_cross_entropy
from graph_extract.verify import MICRO_BATCH_SIZE, verify_tensor_parallel
from graph_extract.zoo import get_spec
from phaze_common.checks import InputError
from solver.auto_sharding.from_export import SearchSettings, search_against_megatron, search_blocks, verified

#: A chip of 1 FLOP/s (at half) and a link of 1 byte/s and 1 s a ring step (α = β = 1): every product
#: is best split, and the communication of a plan is counted in bytes and steps.
UNIT = SearchSettings(chip_flops=1.0, link_bandwidth=1.0, link_latency=1.0)
SEQUENCE, HIDDEN, HEADS = 16, 64, 8
HEAD_DIM = HIDDEN // HEADS
#: The residual stream b·s·h in bf16 [bytes].
STREAM = MICRO_BATCH_SIZE * SEQUENCE * HIDDEN * 2


def ring(width: int, full_bytes: float) -> float:
    """A ring all-reduce at α = 1 s a step and β = 1 s a byte: 2(t−1) + 2(t−1)/t · B."""
    return 2 * (width - 1) + 2 * (width - 1) / width * full_bytes


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v over [b, heads, s, d], the heads merged back: [b, s, heads·d]."""
    weights = F.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), dim=-1)
    return torch.matmul(weights, v).transpose(1, 2).flatten(-2)


class SelectedAttention(nn.Module):
    """q, k, v from one product, its output viewed as [b, s, heads, 3, d] (Megatron's GPT layout) and
    each picked by `select` (aten.select.int)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).unflatten(-1, (HEADS, 3, HEAD_DIM)).transpose(1, 2)
        return self.o(attend(qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]))


class SplitAttention(nn.Module):
    """q (8 heads), k and v (4 heads each, each repeated for 2 query heads) from one product of
    [b, s, 64 + 32 + 32] features cut by `split` (aten.split_with_sizes), as Phi-3 slices its qkv_proj."""

    KV_HEADS = 4

    def __init__(self) -> None:
        super().__init__()
        self.sizes = [HIDDEN, self.KV_HEADS * HEAD_DIM, self.KV_HEADS * HEAD_DIM]
        self.qkv = nn.Linear(HIDDEN, sum(self.sizes), bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (part.unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2)
                   for part in self.qkv(x).split(self.sizes, dim=-1))
        group = HEADS // self.KV_HEADS
        k, v = (t.unsqueeze(2).expand(-1, -1, group, -1, -1).flatten(1, 2) for t in (k, v))
        return self.o(attend(q, k, v))


class ChunkedMLP(nn.Module):
    """Gate and up from one product of [b, s, 2f] features cut in two by `chunk` (Phi-3's gate_up_proj):
    down(silu(gate)·up), f = `ffn`."""

    def __init__(self, ffn: int = 96) -> None:
        super().__init__()
        self.gate_up = nn.Linear(HIDDEN, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class RotaryHalves(nn.Module):
    """Attention with q, k, v products and rotary positions on the two halves of each head's features
    cut by `chunk` (GPT-OSS's rotary embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))
        angles = torch.arange(SEQUENCE)[:, None] * 10000.0 ** -(torch.arange(HEAD_DIM // 2) / (HEAD_DIM // 2))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rotated(self, x: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((first * self.cos - second * self.sin, second * self.cos + first * self.sin), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (projection(x).unflatten(-1, (HEADS, HEAD_DIM)).transpose(1, 2)
                   for projection in (self.q, self.k, self.v))
        return self.o(attend(self.rotated(q), self.rotated(k), v))


class WholeQKNorm(nn.Module):
    """Attention whose q and k are RMS-normed over all their heads' features before the heads are
    viewed (OLMo-2's), the norm written out as a mean of squares (as transformers writes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))
        self.q_scale, self.k_scale = (nn.Parameter(1 + torch.randn(HIDDEN) / 10) for _ in range(2))

    @staticmethod
    def normed(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.normed(self.q(x), self.q_scale), self.normed(self.k(x), self.k_scale)
        q, k, v = (t.unflatten(-1, (HEADS, HEAD_DIM)).transpose(1, 2) for t in (q, k, self.v(x)))
        return self.o(attend(q, k, v))


class Layer(nn.Module):
    """x + mixer(norm(x)): a pre-norm block around one of the modules above (`layers.<i>.mixer`)."""

    def __init__(self, mixer: type[nn.Module], **sizes: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.mixer = mixer(**sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))


class Model(nn.Module):
    """An embedding (vocabulary 256), 2 blocks `layers.<i>` around one mixer, a norm, an output
    projection and per-token losses."""

    def __init__(self, mixer: type[nn.Module], **sizes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(256, HIDDEN)
        self.layers = nn.ModuleList(Layer(mixer, **sizes) for _ in range(2))
        self.norm = nn.RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, 256, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        return per_token_cross_entropy(self.head(self.norm(x)), labels)


def built(mixer: type[nn.Module], **sizes: int) -> tuple[Model, dict]:
    """The model of `mixer` with random weights (seed 0) on the CPU, b = 2, s = 16, and its inputs."""
    torch.manual_seed(0)
    model = Model(mixer, **sizes).eval()
    generator = torch.Generator().manual_seed(0)
    return model, {name: torch.randint(0, 256, (MICRO_BATCH_SIZE, SEQUENCE), generator=generator)
                   for name in ("input_ids", "labels")}


def block_styles(plan, graph) -> dict[str, str | None]:
    """The style `plan` gives each linear map of layers.1 (by module path)."""
    paths = [name.removesuffix(".weight") for name, _ in graph.named_parameters()
             if name.startswith("layers.1.") and name.endswith(".weight") and "norm" not in name]
    return {path: plan.style(path) for path in paths}


#: A norm's statistics [b, s, 1] all-reduced forward and backward: 2·AR(2·16·2 bytes) = 2·(2 + 64).
STATISTICS = 2 * 66


@pytest.mark.parametrize("mixer, products, statistics", [
    (SelectedAttention, {"qkv": COLWISE, "o": ROWWISE}, 0),
    (SplitAttention, {"qkv": COLWISE, "o": ROWWISE}, 0),
    (ChunkedMLP, {"gate_up": COLWISE, "down": ROWWISE}, 0),
    (RotaryHalves, {"q": COLWISE, "k": COLWISE, "v": COLWISE, "o": ROWWISE}, 0),
    (WholeQKNorm, {"q": COLWISE, "k": COLWISE, "v": COLWISE, "o": ROWWISE}, 2 * STATISTICS),
])
def test_fused_projections_are_split_as_megatron_and_verified(mixer, products, statistics):
    """At t = 2 the search splits the fused product colwise (each rank its share of q, k and v, or of
    gate and up: each of its parts split as the plan pass lays a fused weight out) and the output
    product rowwise, as derived_plan (Megatron's split) does, at Megatron's cost by the same model;
    the ranks under the plan compute the model's losses.

    By hand, α = β = 1 and the batch and sequence never split (no weight gradient all-reduced): per
    block one forward all-reduce of the rowwise product's Partial sum and one backward all-reduce of
    the colwise products' input gradient (the normed input, read by q, k and v alike), each of the
    residual stream's B = 2·16·64·2 = 4096 bytes: 2·AR(B) = 2·(2 + 4096) = 8196 s. A norm over the
    split features of q and of k (OLMo-2's) adds its statistics: the partial mean of squares
    all-reduced forward, and the gradient of its inverse square root (a sum over the split features)
    all-reduced backward, 2·AR(2·16·1·2 bytes) = 2·66 s each. Compute is that of splitting every
    product and the attention core, so objective − compute is 8196 s (8460 s with the norms)."""
    model, inputs = built(mixer)
    graph = export(model, inputs)
    found = search_against_megatron(graph, "layers", 2, UNIT)
    (kind,) = found.searched
    assert kind.result.status == "optimal"
    expected = {f"layers.1.mixer.{name}": style for name, style in products.items()}
    assert block_styles(found.plan, graph) == block_styles(found.megatron, graph) == expected
    assert found.megatron_priced and found.objective == pytest.approx(found.megatron_objective, rel=1e-12)
    assert ring(2, STREAM) == 4098
    assert kind.result.cost.weight_sync == 0.0
    assert ring(2, MICRO_BATCH_SIZE * SEQUENCE * 2) == 66
    assert kind.result.objective - kind.result.cost.compute == pytest.approx(2 * ring(2, STREAM) + statistics,
                                                                             rel=1e-9)
    assert verified(found.plan, model, inputs, 2)


def test_a_fused_gate_and_up_whose_halves_do_not_split_stays_whole():
    """Gate and up of f = 33 features each: a colwise split of gate_up's 66 features at t = 2 would
    leave each rank 16.5 features of each half, which the plan pass refuses; the search, which offers
    only what the plan pass applies, leaves the MLP whole (down's 33 input features do not split
    either): no collective, its objective the compute of the unsplit block, 3 × its forward FLOPs at
    1 FLOP/s (at half): products 2·32·64·66 + 2·32·33·64 (gate_up, down), norm 32·64, silu and
    product 2·32·33, residual add 32·64: 270 336 + 135 168 + 2 048 + 2 112 + 2 048 = 411 712 FLOPs, 2 s
    each, × 3."""
    model, inputs = built(ChunkedMLP, ffn=33)
    graph = export(model, inputs)
    with pytest.raises(InputError, match=r"^plan: aten.chunk.default at layers.0.mixer: a cut of a split dimension "
                                         r"other than into a fused projection's parts, each a multiple of 2"):
        apply_plan(graph, Plan(styles=(("layers.*.mixer.gate_up", COLWISE),)), 2)
    (kind,) = search_blocks(graph, "layers", 2, UNIT)
    tokens = MICRO_BATCH_SIZE * SEQUENCE
    flops = 2 * tokens * 64 * 66 + 2 * tokens * 33 * 64 + tokens * 64 + 2 * tokens * 33 + tokens * 64
    assert flops == 411_712
    assert not [name for name, strategy in kind.result.strategies.items() if strategy.splits != (None,)]
    assert kind.result.objective == pytest.approx(3 * 2.0 * flops, rel=1e-12)


# the models whose blocks the search refused --------------------------------------------------------

CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs"


def searched(name: str):
    """The model as tensor_parallel_plan=searched exports it (micro-batch 1, 2,048 tokens) and its
    search at t = 2 with the default prices."""
    spec = factory_spec(str(CONFIGS / name / "config.json")) if (CONFIGS / name).is_dir() else get_spec(name)
    _, blocks, graph = exported_model(spec, 1, 2048, 2)
    return spec, search_against_megatron(graph, blocks, 2)


@pytest.mark.parametrize("name, fused", [
    ("megatrongpt3", {"layers.*.attention.qkv": COLWISE}),
    ("Phi-3-mini-4k-instruct", {"model.model.layers.*.self_attn.qkv_proj": COLWISE,
                                "model.model.layers.*.mlp.gate_up_proj": COLWISE}),
    ("gpt-oss-20b", {"model.model.layers.*.mlp.experts.gate_up_proj": COLWISE}),
])
def test_models_with_fused_projections_are_searched_and_verified(name, fused):
    """GPT-3's q, k, v picked by select, Phi-3's fused qkv_proj (slices) and gate_up_proj (chunk),
    GPT-OSS's rotary halves (chunk) and its experts' interleaved gate and up (every second feature)
    are searched at t = 2: the fused products are split colwise, the ILP prices Megatron's plan (it
    pays no conversion the ILP refuses) no lower than the searched one, and the searched plan's
    ranks compute the tiny model of the family."""
    spec, found = searched(name)
    assert found.megatron_priced
    assert found.objective <= found.megatron_objective * (1 + 1e-12)
    assert {pattern: style for pattern, style in found.plan.styles if pattern in fused} == fused
    assert verify_tensor_parallel(spec, 2, plan=found.plan).passed
