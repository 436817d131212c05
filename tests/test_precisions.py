"""Today's training precisions: MXFP8 (one scale byte a block of 32), FP8's delayed and current
scaling, FP8 weights (fp8_parameters); their memory against Megatron-LM's theoretical-memory formulas
and their costs by hand."""

import dataclasses

import pytest

from estimator.roofline import cast_bytes, group_bytes, op_seconds
from graph_extract import KernelOptions, extract, get_spec
from phaze_common.checks import InputError
from phaze_hardware import Cluster, known_chip
from solver.layout import Layout
from test_validate_llama import tiny_llama_gemm
from solver.question import Question
from solver.training_step import (
    Device,
    Placement,
    Recompute,
    StepGraph,
    StepLayer,
    TrainingOptions,
    TrainingStep,
    held_activations,
)
from solver.training_step.layer_terms import Shard, tensor_parallel

H100 = known_chip("h100_sxm")
#: H100's file with MXFP8 figures, as a Blackwell chip states them (a test chip: no H100 runs MXFP8).
MX_CHIP = dataclasses.replace(H100, name="mx_test", mxfp8_peak_flops=4.5e15, mxfp8_matrix_efficiency=0.5)
S, B, H, A = 128, 2, 256, 8  # sequence, micro-batch, hidden, heads of a traced GPT
GPT = get_spec("megatrongpt3").with_overrides(num_layers=2, hidden_size=H, num_heads=A, ffn_hidden_size=4 * H,
                                              vocab_size=1000, max_position_embeddings=S)


def test_a_chip_without_mxfp8_figures_refuses_mxfp8_in_one_line():
    with pytest.raises(InputError, match=r"^precision: h100_sxm has no MXFP8 tensor cores \(no mxfp8_peak_flops and "
                                         r"mxfp8_matrix_efficiency figures\); allowed: bf16, fp16, fp8$"):
        H100.check_precision("mxfp8")
    MX_CHIP.check_precision("mxfp8")
    assert MX_CHIP.precisions == ("bf16", "fp16", "fp8", "mxfp8")
    assert MX_CHIP.narrow_matrix_flops("mxfp8") == 4.5e15 * 0.5
    assert MX_CHIP.narrow_matrix_flops("fp8") == H100.fp8_peak_flops * H100.fp8_matrix_efficiency


def test_the_fp8_options_are_refused_where_they_mean_nothing():
    with pytest.raises(InputError, match="^fp8_recipe: current applies to precision=fp8 only .*allowed here: delayed"):
        KernelOptions(precision="bf16", fp8_recipe="current")
    with pytest.raises(InputError, match="^fp8_recipe: current applies to precision=fp8 only .*mxfp8 scales each block"):
        KernelOptions(precision="mxfp8", fp8_recipe="current")
    with pytest.raises(InputError, match="^fp8_recipe: unknown 'tensorwise'; allowed: delayed, current$"):
        KernelOptions(precision="fp8", fp8_recipe="tensorwise")
    cluster = Cluster.build("flat", 8, 8, [{"bandwidth": 1e9}])
    for precision in ("bf16", "mxfp8"):
        with pytest.raises(InputError, match="^fp8_parameters: needs precision=fp8 .*allowed here: false$"):
            Question(GPT, S, 16, cluster, TrainingOptions(fp8_parameters=True), KernelOptions(precision=precision))
    Question(GPT, S, 16, cluster, TrainingOptions(fp8_parameters=True), KernelOptions(precision="fp8"))
    # an MXFP8 element: its byte and 1/32 of its block's E8M0 scale byte (OCP MX v1.0)
    assert KernelOptions(precision="mxfp8").narrow_bytes == 1 + 1 / 32 == 1.03125
    assert KernelOptions(precision="fp8").narrow_bytes == 1.0


def test_activations_per_block_follow_megatron_s_formula_in_each_precision():
    """Megatron-LM megatron/training/theoretical_memory_usage.py @ 00caa53a, compute_activation_memory
    (sequence parallelism, selective recomputation): s·b·h·(18 + 4·ffn/h)/t bytes a layer, 16-bit;
    ffn = 4h: 34·sbh/t. A fused attention kernel keeps no s × s tensor, so phaze's 'none' is that row,
    plus FlashAttention's fp32 log-sum-exp per query row and head (4·b·(a/t)·s bytes), which the
    formula leaves out. Of the 34, the inputs only weight products keep — QKV's and FC1's (2 each, the
    norms' outputs), the projection's (2) and FC2's (8): 14·sbh/t — are kept in 8 bits:
        fp8    each in 1 byte of 2:              34 − 14/2 = 27·sbh/t
        mxfp8  each in 1 + 1/32 bytes of 2:      34 − 14·(1 − 33/64) = 34 − 6.78125 = 27.21875·sbh/t
    (t = 2, s = 128, b = 2, h = 256: sbh/t = 32,768 bytes; the statistics 4·2·4·128 = 4,096.)"""
    t = 2
    (block,) = [layer for layer in extract(GPT, B, S, t).layer_graph.layers if layer.name == "layers.0"]
    unit, statistics = S * B * H / t, 4 * B * (A // t) * S
    assert (unit, statistics) == (32_768, 4_096)
    for precision, per_unit in (("bf16", 18 + 4 * 4), ("fp8", 27), ("mxfp8", 27.21875)):
        held = held_activations([block], Recompute.of("none"), t, KernelOptions(True, precision=precision))[0][0]
        assert held == pytest.approx(per_unit * unit + statistics, rel=1e-12), precision


def state_step(precision: str, fp8_parameters: bool = False, sharding: str = "optimizer") -> TrainingStep:
    """One stage of a block of 8e6 parameters (6e6 read by its weight products) between an embedding
    and a head of 1e6 each, on 8 data-parallel replicas of a flat 100 GB/s link."""
    layers = (StepLayer(id=0, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=1e6,
                        activation_bytes=0.0),
              StepLayer(id=1, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=8e6,
                        activation_bytes=0.0, is_block=True, matrix_parameters=6e6),
              StepLayer(id=2, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=1e6,
                        activation_bytes=0.0))
    graph = StepGraph(1, layers, ((0, 1, 1.0), (1, 2, 1.0)))
    cluster = Cluster.build("flat", 8, 8, [{"bandwidth": 1e11}])
    options = TrainingOptions("adam", sharding, fp8_parameters=fp8_parameters)
    return TrainingStep(graph, cluster, options, KernelOptions(precision=precision), Device(1e12, 1e12), 8, "none",
                        Layout(1))


def test_model_state_per_device_follows_megatron_s_formula_in_each_precision():
    """Megatron-LM theoretical_memory_usage.py @ 00caa53a, compute_weight_and_optimizer_memory: 6 + 12/d
    bytes a parameter with the distributed optimizer (2 of 16-bit weight, 4 of fp32 gradient, 12 of
    fp32 master weight and moments split over d), here d = 8 and P = 1e7 parameters: 7.5·P = 75 MB.
    Its formula has no 8-bit copies; Transformer Engine adds, per parameter of the M = 6e6 its 8-bit
    products read, a row-wise and a column-wise copy:
        fp8                          2 × 1 byte                  + 12 MB
        mxfp8                        2 × (1 + 1/32) bytes        + 12.375 MB
        fp8, fp8_parameters          2 × 1 − 2 (no 16-bit copy)  + 0
    and the framework's 1 GB."""
    parameters, matrix = 1e7, 6e6
    for precision, fp8_parameters, copies in (("bf16", False, 0.0), ("fp8", False, 2 * matrix),
                                               ("mxfp8", False, 2 * 1.03125 * matrix), ("fp8", True, 0.0)):
        step = state_step(precision, fp8_parameters)
        memory = step.price(Placement(Layout(1, 1, 8), ((0, 1, 2),))).memory[0]
        assert memory["weights"] == pytest.approx(2 * parameters + copies, rel=1e-12)
        assert memory["weights"] + memory["gradients"] + memory["optimizer_state"] == pytest.approx(
            (6 + 12 / 8) * parameters + copies, rel=1e-12), (precision, fp8_parameters)
        assert memory["total"] == pytest.approx((6 + 12 / 8) * parameters + copies + 1e9, rel=1e-12)


def test_fp8_parameters_gather_one_byte_a_parameter_and_reduce_gradients_as_before():
    """The distributed optimizer's sync at d = 8 on one flat link of B = 100 GB/s, no latency: a
    reduce-scatter of the fp32 gradients, 4·P bytes, and an all-gather of the weights, each moving
    7/8 of its bytes through each device: 16-bit weights 2·P; FP8 weights 2·(P − M) + 1·M.
    P = 1e7, M = 6e6: gradients 7/8·4e7/1e11 = 3.5e-4 s; weights 1.75e-4 s, with FP8 weights
    7/8·(8e6 + 6e6)/1e11 = 1.225e-4 s."""
    for fp8_parameters, gather in ((False, 1.75e-4), (True, 1.225e-4)):
        dp = state_step("fp8", fp8_parameters).data_parallel
        reduction, gathered = dp.sync_times(1e7, 8, 0.0, 6e6)
        assert (reduction, gathered) == pytest.approx((3.5e-4, gather), rel=1e-12)
    assert state_step("fp8", True).data_parallel.tail_keys_are_parameters() is False
    assert state_step("fp8", False).data_parallel.tail_keys_are_parameters() is True


def test_casts_and_products_by_hand_in_each_recipe():
    """The SwiGLU gate [256 x 256]·[256 x 768] of a tiny Llama on one device. Its casts, forward: the
    256·256 input elements read in 16 bits (2 bytes) and written row-wise and column-wise:
        fp8 delayed   2 + 2·1            = 4 bytes an element
        fp8 current   2·2 (amax, cast) + 2·1 = 6
        mxfp8         2 + 2·(1 + 1/32)   = 4.0625
    Its product reads input and weight in 1 byte (MXFP8: 1 + 1/32) and writes 16 bits; MXFP8 runs at the
    chip's MXFP8 rate (2·256·256·768 FLOPs, 2 x 6 tiles of 132 SMs busy)."""
    graphs, up = tiny_llama_gemm()
    graph = graphs.op_graph
    split = [1.0] * len(graph.nodes)
    narrow = KernelOptions(precision="fp8").fp8_operators(graph)
    elements = 256 * 256
    for options, per_element in ((KernelOptions(precision="fp8"), 4), (KernelOptions(precision="fp8",
                                 fp8_recipe="current"), 6), (KernelOptions(precision="mxfp8"), 4.0625)):
        assert cast_bytes(graph, up, "forward", split, narrow, options) == pytest.approx(elements * per_element,
                                                                                        rel=1e-12)
    read = 256 * 256 + 256 * 768
    assert group_bytes(graph, up, split, narrow, 1, 1.03125) == pytest.approx(1.03125 * read + 2 * 256 * 768,
                                                                              rel=1e-12)
    mx = KernelOptions(precision="mxfp8")
    bandwidth = MX_CHIP.hbm_bandwidth * MX_CHIP.memory_efficiency
    flops = 2 * 256 * 256 * 768
    assert op_seconds(graph, up, "forward", MX_CHIP, split, narrow, 1, mx) == pytest.approx(
        flops / (4.5e15 * 0.5 * 12 / 132) + elements * 4.0625 / bandwidth, rel=1e-12)


def amax_shard(recipe: str, width: int, sequence_parallel: bool = True) -> Shard:
    """A block with two tensor-parallel collectives a direction (Megatron's attention and MLP) of
    1 MB each, at width t on one flat link of 100 GB/s and 5 µs a ring step."""
    block = StepLayer(id=0, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=1e6,
                      activation_bytes=0.0, is_block=True, forward_collective_bytes=(1e6, 1e6),
                      backward_collective_bytes=(1e6, 1e6))
    cluster = Cluster.build("flat", 8, 8, [{"bandwidth": 1e11, "latency": 5e-6}])
    return Shard(graph=StepGraph(width, (block,), ()), cluster=cluster, training=TrainingOptions(),
                 kernels=KernelOptions(sequence_parallel, precision="fp8", fp8_recipe=recipe),
                 recompute=Recompute.of("none"), shard=Layout(width))


def test_current_scaling_all_reduces_each_gathered_input_s_amax():
    """FP8 current scaling with sequence parallelism: before each gathered input's cast, its fp32 amax
    is all-reduced over the t = 2 ranks: a ring of 2, 2·(1/2)·4 bytes / 100 GB/s + 2·(2 − 1) steps of
    5 µs = 1.00000004e-5 s; two a direction (the attention's and the MLP's gathers) in a block:
    forward and backward 4 in all."""
    one = 2 * (1 / 2) * 4 / 1e11 + 2 * 1 * 5e-6
    delayed, current = tensor_parallel(amax_shard("delayed", 2)), tensor_parallel(amax_shard("current", 2))
    assert current["exposed"][0] - delayed["exposed"][0] == pytest.approx(4 * one, rel=1e-9)
    assert current["backward"][0] - delayed["backward"][0] == pytest.approx(2 * one, rel=1e-9)
    assert current["hidden"][0] == delayed["hidden"][0] == 0.0
    # nothing to reduce without sequence parallelism or at t = 1
    for shard in (amax_shard("current", 2, sequence_parallel=False), amax_shard("current", 1)):
        assert tensor_parallel(shard)["exposed"][0] == tensor_parallel(
            dataclasses.replace(shard, kernels=dataclasses.replace(shard.kernels, fp8_recipe="delayed")))["exposed"][0]


def test_nvidias_gpt3_fp8_layout_fits_on_h100_with_fp8_parameters(tmp_path):
    """NeMo's GPT-3 175B FP8 layout on 512 H100 (t 4, p 8, v 4, micro-batch 2) ran on 80 GB with its
    weights held in FP8 (NeMo's fp8_params). With a 16-bit copy of every weight beside the two 8-bit
    ones it needs more than 80 GiB; without it, the first stage's weights are 2 bytes less for each of
    its blocks' product parameters: 12 blocks x 12·h² / t = 12 x 12 x 12,288² / 4 = 5.436e9 of them,
    10.87 GB, and the stage fits."""
    import phaze

    layout = dict(model="megatrongpt3", system="dgx_h100", num_devices=512, tensor_parallel_width=4,
                  pipeline_parallel_width=8, data_parallel_width=16, virtual_stages=4, micro_batch_size=2,
                  global_batch_size=2048, precision="fp8", cache_dir=tmp_path / "cache")
    copies = phaze.predict(**layout)
    fp8_only = phaze.predict(**layout, fp8_parameters=True)
    assert not copies.fits and fp8_only.fits
    products = 12 * 12 * 12288**2 / 4
    assert copies.memory_bytes["weights"] - fp8_only.memory_bytes["weights"] == pytest.approx(2 * products, rel=1e-3)
