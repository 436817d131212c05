"""JAX's checkpoint_dots_with_no_batch_dims (MaxText's remat_policy minimal) as the recomputation mode
`product_outputs`: its name, what a traced block keeps (by hand), its memory and re-run time in the step
(by hand), the published runs that state it, and the HBM a TPU run's runtime keeps instead of a CUDA
context."""

import json
from pathlib import Path

import pytest

from phaze_common.checks import InputError
from graph_extract import KernelOptions, ModelSpec, extract, get_spec
from phaze_hardware import Cluster
from phaze.validation.cases import case
from phaze.validation.recipes import tpu_runtime_reserve
from solver.layer_costs import LayerCost
from solver.layout import Layout
from solver.training_step import (Device, Placement, Recompute, StepGraph, StepLayer, TrainingOptions, TrainingStep,
                                  held_activations, recompute_mode)

CALIBRATION = Path(__file__).resolve().parents[1] / "arch_configs" / "calibration" / "runs.json"
# MaxText's 2023 decoder in small: RMSNorm, rotary positions, separate Q, K, V, a two-matrix ReLU MLP, no biases
RELU = ModelSpec("maxtext-small", 2, 64, 4, 128, 500, 16, 16, norm="rmsnorm", activation="relu",
                 position_embedding="rotary", bias=False, fused_qkv=False, dropout=0.0)
# a Llama in small: grouped-query attention (8 heads of 8, 2 key/value heads), SwiGLU of width 96
SWIGLU = get_spec("llama2").with_overrides(num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2,
                                           ffn_hidden_size=96, vocab_size=500, max_position_embeddings=16,
                                           default_sequence_length=16)


def test_the_mode_has_one_name():
    assert recompute_mode("product_outputs") == "product_outputs"
    assert Recompute.of("product_outputs") == Recompute(product_outputs=True)
    assert Recompute.of("product_outputs").name == "product_outputs"
    with pytest.raises(InputError, match=r"product_outputs \(JAX's checkpoint_dots_with_no_batch_dims, MaxText's "
                                         r"remat_policy minimal\)"):
        recompute_mode("minimal")


@pytest.mark.parametrize("spec, widths", [(RELU, (64, 64, 64, 64, 128)), (SWIGLU, (64, 16, 16, 64, 96, 96))])
@pytest.mark.parametrize("t", [1, 2])
def test_a_traced_block_keeps_its_input_and_the_products_its_tensors_are_rebuilt_from(spec, widths, t):
    """b 2 sequences of s 16 tokens, 2 bytes an element. The ReLU block keeps Q, K, V (64 wide each), the
    attention's output projection completed by its all-reduce (64: the second norm's input is rebuilt
    from it and the block's input) and the MLP's up product (128: ReLU's output is rebuilt from it); the
    SwiGLU block Q (64), K and V (16 each: 2 key/value heads of 8), the output projection (64), gate
    and up (96 each). Neither keeps its down product (it feeds only the block's output). Per rank of
    width t the column products are 1/t; the all-reduced projection is whole and replicated; the
    block's input (64) too."""
    b, s, h = 2, 16, 64
    block = extract(spec, b, s, t).layer_graph.layers[1]
    column, projection = widths[:3] + widths[4:], widths[3]  # (Q, K, V, projection, MLP products)
    assert block.product_output_bytes == 2 * b * s * (sum(column) // t + projection)
    assert block.replicated_product_output_bytes == 2 * b * s * projection
    assert block.input_bytes == block.replicated_input_bytes == 2 * b * s * h
    kernels = KernelOptions(sequence_parallel=t > 1)
    held, working = held_activations([block], Recompute.of("product_outputs"), t, kernels)
    # sequence parallelism splits the replicated input and projection over the t ranks
    assert held[0] == pytest.approx(2 * b * s * (sum(column) + projection + h) / t)
    full_held, full_working = held_activations([block], Recompute.of("full"), t, kernels)
    assert full_held[0] == pytest.approx(2 * b * s * h / t) and working[0] == full_working[0] > 0


def step_graph() -> StepGraph:
    """An embedding, two blocks and a head: each block 3 s forward of which 2 s weight products, 5e6
    bytes saved, 1e6 of input and 2e6 of product outputs; the others 1e6 saved."""
    def layer(index: int, block: bool) -> StepLayer:
        return StepLayer(id=index, forward=3.0 if block else 1.0, backward=6.0 if block else 2.0,
                         attention_core_forward=0.5 if block else 0.0, parameters=1e6,
                         activation_bytes=5e6 if block else 1e6, input_bytes=1e6 if block else 0.0, is_block=block,
                         matrix_forward=2.0 if block else 0.0, product_output_bytes=2e6 if block else 0.0)
    return StepGraph(1, tuple(layer(index, 0 < index < 3) for index in range(4)), ((0, 1, 1e6), (1, 2, 1e6), (2, 3, 1e6)))


@pytest.mark.parametrize("mode, rerun, activations", [
    ("full", 3.0, (1 + 1 + 1 + 1) * 1e6 + (5 - 1) * 1e6),
    ("product_outputs", 3.0 - 2.0, (1 + 3 + 3 + 1) * 1e6 + (5 - 1) * 1e6),
])
def test_the_mode_in_the_step_by_hand(mode, rerun, activations):
    """One stage, d 4 (2 micro-batches of the 8 sequences), one micro-batch in flight: each block keeps
    its input (and with product_outputs its 2e6 of product outputs), the embedding and the head their
    1e6; the last block's 5e6 rebuilt in the room the head's 1e6 leaves once its backward ran. Each
    block re-runs its forward (full) or its forward but the weight products (product_outputs) every
    micro-batch."""
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])
    step = TrainingStep(step_graph(), cluster, TrainingOptions("adam", "optimizer"), KernelOptions(True),
                        Device(1e12, 1e12), 8, mode, Layout(1))
    result = step.price(Placement(Layout(1, 1, 4), ((0, 1, 2, 3),), mode))
    assert result.breakdown["recompute"] == pytest.approx(2 * 2 * rerun, rel=1e-12)
    assert result.memory[0]["activations"] == pytest.approx(activations, rel=1e-12)


def test_a_layers_recomputed_forward():
    """product_outputs re-runs all of a block's forward but its weight products."""
    cost = LayerCost(forward=2.0, backward=4.0, attention_core_forward=0.25, energy=0, tc_busy=0, vc_busy=0,
                     tc_peak=0, vc_peak=0, gap=0, matrix_forward=1.5)
    assert cost.recomputed("product_outputs") == 2.0 - 1.5


def test_the_published_runs_state_it_and_a_tpu_keeps_its_runtimes_hbm():
    """MaxText's remat_policy=minimal rows are product_outputs. A TPU v6e program may use 33,550,237,696
    of its 2^35 bytes: 809,500,672 kept by the runtime; XLA lets a v5p program use 95.74 GiB, more than
    phaze's 95 GiB chip: nothing; a GPU keeps the CUDA context's default 1e9."""
    runs = {run["run_id"]: run for run in json.loads(CALIBRATION.read_text())}
    assert case(runs["maxtext_v5p_64B_1x128"]).recompute == "product_outputs"
    assert case(runs["maxtext_v5p_512B_1x1024"]).recompute == "full"
    assert tpu_runtime_reserve("tpuv6e") == 2**35 - 33_550_237_696 == 809_500_672
    assert tpu_runtime_reserve("tpuv5p") == 0.0 and tpu_runtime_reserve("h100_sxm") is None
    assert case(runs["tpurecipes_gpt3_175b_v6e_256"]).training.framework_reserve == 809_500_672
    assert case(runs["maxtext_v5p_64B_1x128"]).training.framework_reserve == 0.0
    assert case(runs["sc21_t1_1.7B"]).training.framework_reserve == 1e9
