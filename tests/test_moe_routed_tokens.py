"""A mixture's routed tokens at the model's width: what the traced block holds of them (the experts'
input, the combine's kept outputs) and what one rank keeps of them at each expert tensor-parallel width
τ (Megatron-Core's MoE layer with sequence parallelism), by hand, and through the step model."""

import pytest

from graph_extract import KernelOptions, extract
from phaze_hardware import Cluster
from solver.layer_costs import step_graphs
from solver.layout import Layout
from solver.training_step import Device, Placement, Recompute, TrainingOptions, TrainingStep, held_activations
from tests.test_recompute_modules import MIXTURE

# b sequences of s tokens, width h, E experts of FFN width f_e, k a token (`MIXTURE`)
B, S, H, E, K, FE = 2, 16, 64, 4, 2, 32
TOKENS = B * S
CAPACITY = MIXTURE.expert_capacity(TOKENS)


@pytest.fixture(scope="module")
def traced():
    """The mixture traced at t = 2 (its blocks: layers.0 dense, layers.1 a mixture)."""
    return extract(MIXTURE, B, S, 2)


def test_the_traced_routed_tokens_by_hand(traced):
    """Traced at t = 2 every rank holds all s·b tokens: the experts' input, E·C rows of h (C =
    ceil(s·b·k/E) = 16 slots an expert), 2·E·C·h bytes, replicated and kept only by the experts' up
    and gate products; the combine keeps the experts' returned outputs, s·b·k rows of h, 2·s·b·k·h
    bytes, for the probabilities' gradient (partial sums: not replicated). Recomputing `moe` drops
    both; `moe_act`, `layernorm` and the dense block none."""
    assert CAPACITY == TOKENS * K // E == 16
    dense, mixture = traced.layer_graph.layers[1], traced.layer_graph.layers[2]
    assert mixture.dispatched_activation_bytes == 2 * E * CAPACITY * H == 8192
    assert mixture.combined_activation_bytes == 2 * TOKENS * K * H == 8192
    assert dense.dispatched_activation_bytes == dense.combined_activation_bytes == 0
    modules = {module.name: module for module in mixture.recompute_modules}
    assert (modules["moe"].dispatched_activation_bytes, modules["moe"].combined_activation_bytes) == (8192, 8192)
    for name in ("moe_act", "layernorm"):
        assert (modules[name].dispatched_activation_bytes, modules[name].combined_activation_bytes) == (0, 0)


@pytest.mark.parametrize("precision, tau, kept", [
    ("bf16", 1, 15136), ("bf16", 2, 19232), ("fp8", 1, 12064), ("fp8", 2, 14112)])
def test_what_one_rank_keeps_of_a_mixture_by_hand(traced, precision, tau, kept):
    """The mixture's `moe` module on one rank of t = 2 with sequence parallelism (what recomputing it
    frees: its working memory), Megatron-Core's MoE layer: each rank routes its own s·b/t tokens, the
    expert tensor-parallel group all-gathers τ ranks' of them, the combine runs on the rank's own.
    Two bytes an element:
    * the router's tensors, replicated and split by t: probabilities 2·s·b·E = 256, the top-k values
      2·s·b·k = 128 and their sum 2·s·b = 64 (the renormalisation keeps both), the weights for the
      combine 2·s·b·k = 128, the dispatch's slot sources 8·E·C = 512 and the combine's slots 8·s·b·k
      = 512 (int64): 1,600 / 2 = 800;
    * the experts' input, τ/t of 2·E·C·h = 8,192: 4,096·τ;
    * the gate, up and product outputs at the FFN width: 3 · 2·E·C·f_e/t = 6,144 at every τ;
    * the combine's kept outputs, the rank's own s·b·k/t rows: 8,192 / 2 = 4,096.
    bf16: 800 + 4,096·τ + 6,144 + 4,096 = 15,136 (τ = 1), 19,232 (τ = 2). FP8 keeps the inputs only
    weight products keep in one byte: the experts' input 2,048·τ and the product output E·C·f_e/t =
    1,024: 800 + 2,048·τ + 4,096 + 1,024 + 4,096 = 12,064 (τ = 1), 14,112 (τ = 2)."""
    (graph,) = step_graphs({2: traced}, None).values()
    kernels = KernelOptions(sequence_parallel=True, precision=precision)
    mixture = graph.layers[2]
    held, working = held_activations([mixture], Recompute.of("moe"), 2, kernels, tau)
    assert working[0] == pytest.approx(kept, rel=1e-12)
    none = held_activations([mixture], Recompute.of("none"), 2, kernels, tau)[0][0]
    assert none - held[0] == pytest.approx(kept, rel=1e-12)


def test_without_sequence_parallelism_every_rank_keeps_the_traced_tokens(traced):
    """Without sequence parallelism each rank routes all s·b tokens: the module keeps what was traced,
    1,600 + 8,192 + 6,144 + 8,192 = 24,128 bytes at either τ."""
    (graph,) = step_graphs({2: traced}, None).values()
    kernels = KernelOptions(sequence_parallel=False)
    for tau in (1, 2):
        working = held_activations([graph.layers[2]], Recompute.of("moe"), 2, kernels, tau)[1][0]
        assert working == pytest.approx(1600 + 8192 + 6144 + 8192, rel=1e-12)


def test_the_step_keeps_the_experts_input_of_its_expert_width(traced):
    """t 2, e 2, d 4, one stage of 8 devices, one micro-batch in flight, no recomputation: a device
    at τ = 2 keeps, per mixture block, the experts' input of the other rank of its pair more than at
    τ = 1: 2·E·C·h / t = 4,096 bytes; MIXTURE has two mixture blocks (layers.1, layers.2)."""
    (graph,) = step_graphs({2: traced}, None).values()
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])
    activations = {}
    for tau in (1, None):
        shard = Layout(2, expert_parallel_width=2, expert_tensor_parallel_width=tau)
        step = TrainingStep(graph, cluster, TrainingOptions("adam", "optimizer"), KernelOptions(True),
                            Device(1e12, 1e12), 8, "none", shard)
        result = step.price(Placement(shard.replace(data_parallel_width=4), (tuple(range(graph.n)),)))
        activations[tau] = result.memory[0]["activations"]
    assert activations[None] - activations[1] == pytest.approx(2 * 2 * E * CAPACITY * H / 2, rel=1e-12)
