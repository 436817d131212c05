"""The training-step model: memory against Korthikanti et al.'s table, a hand-worked step, the
interleaved schedule, and the search's lower bound against the model on random placements."""

import dataclasses
import itertools
import random

import numpy as np
import pytest

from phaze_common.checks import InputError
from graph_extract import KernelOptions, extract, get_spec
from phaze_hardware import Cluster
from solver.layout import Layout, allowed_virtual_stages, data_parallel_widths
from solver.placement.layouts import megatron_chunks
from solver.training_step.over_chips import least_pipeline_time, time_lower_bound
from solver.training_step import (
    Device,
    ModelState,
    Recompute,
    Placement,
    StepGraph,
    StepLayer,
    TrainingOptions,
    TrainingStep,
    held_activations,
    in_flight,
)

S, B, H, A = 128, 2, 256, 8  # sequence, micro-batch, hidden, heads of the traced GPT
GPT = get_spec("megatrongpt3").with_overrides(num_layers=2, hidden_size=H, num_heads=A, ffn_hidden_size=4 * H,
                                              vocab_size=1000, max_position_embeddings=S)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_activations_of_a_traced_gpt_block_follow_the_table(width):
    (block,) = [layer for layer in extract(GPT, B, S, width).layer_graph.layers if layer.name == "layers.0"]
    sbh, t = S * B * H, width
    expected = {  # Korthikanti et al. 2022, Table 2 (bytes per layer and micro-batch, 16-bit)
        ("none", False): sbh * (10 + 24 / t + 5 * A * S / (H * t)),
        ("none", True): sbh / t * (34 + 5 * A * S / H),
        ("selective", False): sbh * (10 + 24 / t),
        ("selective", True): sbh / t * 34,
        ("full", False): 2 * sbh,
        ("full", True): 2 * sbh / t,
    }
    for (mode, sequence_parallel), value in expected.items():
        held, working = held_activations([block], Recompute.of(mode), width,
                                         KernelOptions(sequence_parallel, flash_attention=False))
        assert held[0] == pytest.approx(value, rel=1e-12), (mode, sequence_parallel)
        if mode == "full":  # while recomputed, the block's whole activations are back
            assert working[0] == pytest.approx(expected["none", sequence_parallel], rel=1e-12)
    # A fused attention kernel keeps no s x s tensor: the selective rows whatever the mode (but full),
    # plus one fp32 log-sum-exp per softmax row (B sequences x A/t heads x S queries).
    statistics = 4 * B * (A // t) * S
    for sequence_parallel in (False, True):
        fused = KernelOptions(sequence_parallel, flash_attention=True)
        kept = expected["selective", sequence_parallel] + statistics
        for mode in ("none", "selective"):
            assert held_activations([block], Recompute.of(mode), width, fused)[0][0] == pytest.approx(kept, rel=1e-12)
        held, working = held_activations([block], Recompute.of("full"), width, fused)
        assert (held[0], working[0]) == pytest.approx((expected["full", sequence_parallel], kept), rel=1e-12)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_fp8_keeps_the_inputs_of_weight_products_in_one_byte(width):
    """Transformer Engine keeps an FP8 GEMM's input in FP8: of Korthikanti's 34·sbh (SP), the QKV and
    FC1 inputs (2·sbh each, the norms' outputs, replicated over t), the projection's input (2·sbh/t)
    and FC2's (8·sbh/t) are halved: 7·sbh/t (SP) or 2·sbh + 5·sbh/t (no SP) fewer bytes."""
    (block,) = [layer for layer in extract(GPT, B, S, width).layer_graph.layers if layer.name == "layers.0"]
    sbh, t = S * B * H, width
    statistics = 4 * B * (A // t) * S
    for sequence_parallel, saved in ((True, 7 * sbh / t), (False, 2 * sbh + 5 * sbh / t)):
        bf16 = held_activations([block], Recompute.of("none"), width, KernelOptions(sequence_parallel))[0][0]
        fp8 = held_activations([block], Recompute.of("none"), width,
                               KernelOptions(sequence_parallel, precision="fp8"))[0][0]
        assert bf16 == pytest.approx((34 / t if sequence_parallel else 10 + 24 / t) * sbh + statistics, rel=1e-12)
        assert bf16 - fp8 == pytest.approx(saved, rel=1e-12)


def test_model_state_per_parameter():
    """Bytes per parameter on one of 8 ranks sharing them: ZeRO stages 0-3 (Rajbhandari et al. 2020,
    Fig. 1: 2 + 2 + K with K = 12 for mixed-precision Adam; Megatron keeps fp32 main gradients, 4)."""
    for options, (weights, gradients, state) in (
            (TrainingOptions("adam", "none"), (2, 4, 18 - 6)),  # 2 + 4 + 12 (Megatron's 18 bytes)
            (TrainingOptions("adam", "optimizer"), (2, 4, 12 / 8)),  # 6 + 12/d
            (TrainingOptions("adam", "optimizer", grad_reduce_in_bf16=True), (2, 2, 12 / 8)),
            (TrainingOptions("adam", "gradients"), (2, 4 / 8, 12 / 8)),  # ZeRO-2: 2 + 16/d
            (TrainingOptions("adam", "full"), (2 / 8, 4 / 8, 12 / 8)),  # ZeRO-3: 18/d
            (TrainingOptions("sgd", "optimizer"), (2, 2, 0))):
        model = options.model_state
        assert tuple(model.share(kind, 8) for kind in ("weights", "gradients", "optimizer_state")) == (
            weights, gradients, state)
    with pytest.raises(ValueError, match="optimizer: unknown 'lamb'"):
        ModelState.of("lamb", "optimizer")
    with pytest.raises(ValueError, match="weight_dtype: unknown 'fp16'"):
        ModelState.of("adam", "full", weight_dtype="fp16")
    with pytest.raises(ValueError, match="data_parallel_sharding: unknown 'zero3'"):
        ModelState.of("adam", "zero3")


@pytest.mark.parametrize("weight_dtype, size", [("float32", 4), ("bfloat16", 2)])
def test_state_in_the_weights_dtype(weight_dtype, size):
    """No master copy (MaxText's weight_dtype; optax's adamw keeps mu and nu in the parameters' dtype):
    weights, gradients and Adam's two moments each `size` bytes, 16 bytes a parameter in fp32 and 8 in
    bf16, a 16-bit copy gathered whatever the dtype; SGD keeps no moments."""
    adam = TrainingOptions("adam", "full", weight_dtype=weight_dtype).model_state
    assert tuple(adam.share(kind, 8) for kind in ("weights", "gradients", "optimizer_state")) == (
        size / 8, size / 8, 2 * size / 8)
    assert adam.weights + adam.gradients + adam.optimizer_state == 4 * size
    assert adam.gathered == 2
    sgd = TrainingOptions("sgd", "none", weight_dtype=weight_dtype).model_state
    assert (sgd.weights, sgd.gradients, sgd.optimizer_state) == (size, size, 0)
    for name in ("grad_reduce_in_bf16", "master_weight_remainders"):
        with pytest.raises(ValueError, match=f"{name}: applies to weight_dtype=mixed .* allowed here: false"):
            TrainingOptions("adam", "full", weight_dtype=weight_dtype, **{name: True})
    assert TrainingOptions("adam", "full", weight_dtype=weight_dtype).record()["weight_dtype"] == weight_dtype
    assert "weight_dtype" not in TrainingOptions("adam", "full").record()


def test_float32_state_gathers_and_reduces_as_mixed():
    """MaxText's fp32 weights in a step: 2 bytes a parameter less state than Megatron's mixed 18 (16),
    the same gathers (the 16-bit copy: 2 bytes a parameter), gradient reductions (fp32, 4 bytes) and
    optimizer step (Adam reads and writes 12 bytes a parameter: the fp32 weight and moments, or the
    master weight and moments); bf16 state steps in half that."""
    layers = (StepLayer(id=0, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=1e6, activation_bytes=0.0),
              StepLayer(id=1, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=8e6, activation_bytes=0.0,
                        is_block=True),
              StepLayer(id=2, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=1e6, activation_bytes=0.0))
    graph = StepGraph(1, layers, ((0, 1, 1.0), (1, 2, 1.0)))
    cluster = Cluster.build("flat", 8, 8, [dict(bandwidth=1e9)])
    results = {}
    for weight_dtype in ("mixed", "float32", "bfloat16"):
        step = TrainingStep(graph, cluster, TrainingOptions("adam", "full", weight_dtype=weight_dtype),
                            KernelOptions(), Device(1e12, 1e12), 8, "none", Layout(1))
        results[weight_dtype] = step.price(Placement(Layout(1, 1, 8), ((0, 1, 2),), "none"))
    mixed, fp32 = results["mixed"], results["float32"]
    state = ("weights", "gradients", "optimizer_state")
    assert sum(mixed.memory[0][kind] - fp32.memory[0][kind] for kind in state) == pytest.approx(2 * 10e6 / 8, rel=1e-12)
    assert fp32.memory[0]["weights"] - mixed.memory[0]["weights"] == pytest.approx(2 * 10e6 / 8, rel=1e-12)
    assert fp32.breakdown == pytest.approx(mixed.breakdown, rel=1e-12)
    assert mixed.breakdown["optimizer"] == pytest.approx(2 * 12 * 10e6 / 8 / 1e12, rel=1e-12)
    assert results["bfloat16"].breakdown["optimizer"] == pytest.approx(2 * 6 * 10e6 / 8 / 1e12, rel=1e-12)


def test_fp8_weights_have_two_8_bit_copies_and_a_tied_weight_is_held_once():
    """FP8 on Hopper: each weight of an FP8 product also held row-wise and transposed in 8 bits (2 bytes
    a parameter); a weight read by two layers of one stage (a tied embedding) held once."""
    layers = (StepLayer(id=0, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=3e6, activation_bytes=0.0),
              StepLayer(id=1, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=5e6, activation_bytes=0.0,
                        is_block=True, matrix_parameters=4e6),
              StepLayer(id=2, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=3.5e6, activation_bytes=0.0))
    graph = StepGraph(1, layers, ((0, 1, 1.0), (1, 2, 1.0)), tied=((0, 2, 3e6),))
    cluster = Cluster.build("flat", 8, 8, [dict(bandwidth=1e9)])
    for precision, copies in (("bf16", 0.0), ("fp8", 2 * 4e6)):
        step = TrainingStep(graph, cluster, TrainingOptions("adam", "none"), KernelOptions(precision=precision),
                            Device(1e12, 1e12), 8, "none", Layout(1))
        whole = step.price(Placement(Layout(1, 1, 1), ((0, 1, 2),)))
        held = 3e6 + 5e6 + 3.5e6 - 3e6  # the tied 3e6 once
        assert whole.parameters == (held,)
        assert whole.memory[0]["weights"] == 2 * held + copies
        assert whole.memory[0]["total"] == 18 * held + copies + 1e9  # and the framework's 1 GB
        split = step.price(Placement(Layout(1, 2, 1), ((0, 1), (2,))))  # each stage holds its copy
        assert split.parameters == (8e6, 3.5e6)
        assert split.memory[0]["weights"] == 2 * 8e6 + copies


def test_micro_batches_in_flight():
    assert in_flight(4, 1, 16).tolist() == [4, 3, 2, 1]
    assert in_flight(4, 1, 2).tolist() == [2, 2, 2, 1]  # never more than the micro-batches
    interleaved = in_flight(4, 2, 64)
    assert interleaved[0] == 4 + 3 / 2  # p + (p − 1)/v (Korthikanti et al. 2022, Sec. 4.2)
    assert interleaved.tolist() == [5.5, 4.5, 3.5, 2.5]


def small_step(recompute: str = "none") -> TrainingStep:
    """4 equal blocks in a chain on one 1 GB/s tier, t = 1, 8 micro-batches per batch."""
    layers = tuple(StepLayer(id=i, forward=1.0, backward=2.0, attention_core_forward=0.25, parameters=1e6,
                             activation_bytes=1e6, attention_core_activation_bytes=3e5, input_bytes=2e5,
                             is_block=True) for i in range(4))
    graph = StepGraph(1, layers, tuple((i, i + 1, 1e6) for i in range(3)))
    cluster = Cluster.build("flat", 8, 8, [dict(bandwidth=1e9)])
    return TrainingStep(graph, cluster, TrainingOptions(), KernelOptions(), Device(1e12, 1e12), 8, recompute, Layout(1))


def test_a_step_by_hand():
    result = small_step().price(Placement(Layout(1, 2, 2), ((0, 1), (2, 3))))
    # m = 4 micro-batches per replica; each stage: 2 × (1 + 2) s of compute and one 1 MB transfer
    # each way (1 ms); bubble (p − 1)·ℓ. Sync (sharded): reduce-scatter of 2e6 × 4 bytes and
    # all-gather of 2e6 × 2 bytes among 2 replicas, S/(2B) each; optimizer: 2 × 2e6 × 12/2 / 1e12.
    assert result.breakdown == pytest.approx({"compute": 24.0, "kernel_launch": 0.0, "recompute": 0.0, "tensor_parallel": 0.0, "context_parallel": 0.0, "expert_parallel": 0.0, "sharded_data_parallel": 0.0,
                                              "activation_offload": 0.0, "bubble": 6.001, "pipeline_transfer": 0.004,
                                              "data_parallel_sync": 4e-3 + 2e-3, "optimizer": 2.4e-5}, rel=1e-12)
    assert result.time_per_batch == pytest.approx(30.011024, rel=1e-12)
    assert sum(result.breakdown.values()) == pytest.approx(result.time_per_batch, rel=1e-12)
    first, last = result.memory
    assert first == pytest.approx({"weights": 4e6, "gradients": 8e6, "optimizer_state": 1.2e7,
                                   "activations": 2 * 2e6, "framework_reserve": 1e9, "total": 2.8e7 + 1e9})
    assert last["activations"] == 2e6 and result.parameters == (2e6, 2e6) and result.feasible


def test_recomputation_by_hand():
    full = small_step("full").price(Placement(Layout(1, 2, 2), ((0, 1), (2, 3)), "full"))
    assert full.breakdown["recompute"] == 4 * 2.0  # the two forwards again, every micro-batch
    assert full.memory[0]["activations"] == 2 * 4e5 + 1e6  # two inputs per micro-batch + one layer rebuilt
    selective = small_step("selective").price(Placement(Layout(1, 2, 2), ((0, 1), (2, 3)), "selective"))
    assert selective.breakdown["recompute"] == 4 * 0.5
    assert selective.memory[0]["activations"] == 2 * 2 * (1e6 - 3e5)


def test_interleaved_schedule_by_hand():
    step = small_step()
    blocking = dataclasses.replace(step, training=TrainingOptions(overlap_pipeline_transfers=False))
    chunks = megatron_chunks(step.graph, 2, 2)
    result = blocking.price(Placement(Layout(1, 2, 2, 2), chunks))
    # device 0 runs chunks 0 and 2, device 1 chunks 1 and 3: 6 s of compute and 3 MB of transfers
    # each; pipeline (m + (p − 1)/v)·ℓ = 4.5 × 6.003; device 0 holds 2.5 micro-batches' worth
    assert result.breakdown["bubble"] == pytest.approx(6.003 / 2, rel=1e-12)
    assert result.time_per_batch == pytest.approx(4.5 * 6.003 + 6e-3 + 2.4e-5, rel=1e-12)
    assert [memory["activations"] for memory in result.memory] == [2.5 * 2e6, 1.5 * 2e6]
    # Megatron's default: the 3 ms of transfers hide behind the 6 s of the device's compute
    overlapped = step.price(Placement(Layout(1, 2, 2, 2), chunks))
    assert overlapped.time_per_batch == pytest.approx(4.5 * 6.0 + 6e-3 + 2.4e-5, rel=1e-12)
    assert overlapped.breakdown["pipeline_transfer"] == 0.0
    assert overlapped.hidden["pipeline_transfer"] == pytest.approx(4 * 3e-3, rel=1e-12)


def overlap_step(**training) -> TrainingStep:
    """2 blocks on t = 2 whose tensor-parallel collectives (1 MB forward, 2 MB backward, at 1 GB/s:
    all-reduce over 2 = 1 ms and 2 ms) may hide behind weight products of 0.4 ms forward and 5 ms
    backward; 1e6 parameters each, sharded Adam over d = 2 on a 1 GB/s link."""
    layers = tuple(StepLayer(id=i, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=1e6,
                             activation_bytes=0.0, is_block=True, forward_collective_bytes=(1e6,),
                             backward_collective_bytes=(2e6,), matrix_forward=4e-4, matrix_backward=5e-3)
                   for i in range(2))
    graph = StepGraph(2, layers, ((0, 1, 1e6),))
    cluster = Cluster.build("flat", 8, 8, [dict(bandwidth=1e9)])
    options = TrainingOptions("adam", "optimizer", **training)
    return TrainingStep(graph, cluster, options, KernelOptions(), Device(1e12, 1e12), 4, "none", Layout(2))


def test_each_overlap_hides_no_more_than_the_compute_behind_it():
    placement = Placement(Layout(2, 1, 2), ((0, 1),))
    plain = overlap_step().price(placement)
    # all-reduce over t = 2 moves S·2(2−1)/2 = S at 1 GB/s: 1 ms forward and 2 ms backward per block
    assert plain.breakdown["tensor_parallel"] == pytest.approx(2 * 2 * (1e-3 + 2e-3), rel=1e-12)
    tensor = overlap_step(tensor_parallel_overlap=True).price(placement)
    # forward: 1 ms of collectives behind 0.4 ms of products, 0.6 ms exposed; backward: all 2 ms hidden
    assert tensor.breakdown["tensor_parallel"] == pytest.approx(2 * 2 * 0.6e-3, rel=1e-12)
    assert tensor.hidden["tensor_parallel"] == pytest.approx(2 * 2 * (0.4e-3 + 2e-3), rel=1e-12)
    # the sync of 2e6 parameters over d = 2: reduce-scatter of fp32 gradients S/2 = 4 ms and all-gather of
    # 16-bit weights 2 ms; the reduction hides behind the last backward pass (2 × (2 s + 2 ms)), the
    # all-gather behind the next forward pass (2 × 1 s); neither can hide more than itself
    assert plain.breakdown["data_parallel_sync"] == pytest.approx(4e-3 + 2e-3, rel=1e-12)
    grads = overlap_step(overlap_grad_reduce=True).price(placement)
    assert grads.breakdown["data_parallel_sync"] == pytest.approx(2e-3, rel=1e-12)
    both = overlap_step(overlap_grad_reduce=True, overlap_param_gather=True).price(placement)
    assert both.breakdown["data_parallel_sync"] == 0.0 and both.hidden["data_parallel_sync"] == pytest.approx(6e-3)
    # at 10 kB/s the reduce-scatter takes 2e6·4/2/1e4 = 400 s and hides behind the backward pass of
    # 2 × (2 s + 2e6/1e4 s of collectives) = 404 s; the all-gather, 200 s, is not overlapped
    slow = dataclasses.replace(overlap_step(overlap_grad_reduce=True),
                               cluster=Cluster.build("flat", 8, 8, [dict(bandwidth=1e4)]))
    assert slow.price(placement).breakdown["data_parallel_sync"] == pytest.approx(200.0, rel=1e-9)
    # a sync longer than the compute it hides behind stays exposed by the excess
    bigger = dataclasses.replace(slow, graph=StepGraph(2, tuple(dataclasses.replace(layer, parameters=1e8)
                                                                for layer in slow.graph.layers), slow.graph.edges))
    # 2e8 parameters: reduce-scatter 4e4 s, 404 s of it hidden; all-gather 2e4 s, not overlapped
    assert bigger.price(placement).breakdown["data_parallel_sync"] == pytest.approx(4e4 - 404.0 + 2e4, rel=1e-9)


def test_overlap_options_that_need_another_say_so():
    with pytest.raises(InputError, match="^overlap_param_gather: needs data_parallel_sharding=optimizer"):
        TrainingOptions("adam", "none", overlap_grad_reduce=True, overlap_param_gather=True)
    with pytest.raises(InputError, match="^overlap_param_gather: needs"):
        TrainingOptions("adam", "optimizer", overlap_param_gather=True)
    with pytest.raises(InputError, match="^framework_reserve: "):
        TrainingOptions(framework_reserve=-1.0)


def test_infeasible_placements_say_why():
    step = small_step()
    assert step.price(Placement(Layout(1, 2, 3), ((0, 1), (2, 3)))).infeasible_reason == (
        "data_parallel_width: 3 does not divide the 8 micro-batches per batch (global_batch_size / micro_batch_size)")
    assert step.price(Placement(Layout(1, 2, 8), ((0, 1), (2, 3)))).infeasible_reason == (
        "devices: 2 stages x 1 x 8 replicas need 16, the cluster has 8")
    tight = TrainingStep(step.graph, step.cluster, step.training, step.kernels, Device(2.7e7, 1e12), 8, "none",
                         step.shard)
    assert tight.price(Placement(Layout(1, 2, 2), ((0, 1), (2, 3)))).infeasible_reason.startswith(
        "memory: stage 0 needs")


def random_step(rng: random.Random, recompute: str, layers: int) -> TrainingStep:
    """A chain of embedding, blocks and head with random costs on a random two-tier cluster."""
    width = rng.choice([1, 2, 4])
    kinds = [False] + [True] * (layers - 2) + [False]
    graph = StepGraph(width, tuple(
        StepLayer(id=i, forward=rng.uniform(0.1, 2), backward=rng.uniform(0.2, 4), attention_core_forward=rng.uniform(0, 0.3),
                  parameters=rng.uniform(1e5, 1e7), activation_bytes=rng.uniform(1e5, 1e7),
                  replicated_activation_bytes=rng.uniform(0, 1e5), attention_core_activation_bytes=rng.uniform(0, 1e5),
                  input_bytes=rng.uniform(0, 1e6), replicated_input_bytes=0.0, is_block=block,
                  forward_collective_bytes=(rng.uniform(0, 1e7),) * (width > 1),
                  backward_collective_bytes=(rng.uniform(0, 1e7),) * (width > 1))
        for i, block in enumerate(kinds)), tuple((i, i + 1, rng.uniform(0, 1e7)) for i in range(layers - 1)))
    devices = rng.choice([8, 16, 32, 64])
    cluster = Cluster.build("random", devices, rng.choice([2, 4, 8]), [
        dict(bandwidth=rng.uniform(1e10, 1e11), latency=1e-5, efficiency=0.8),
        dict(bandwidth=rng.uniform(1e9, 1e10), latency=2e-5, efficiency=0.9)])
    optimizer, sharded, sequence_parallel = rng.choice(["adam", "sgd"]), rng.random() < 0.5, rng.random() < 0.5
    training = TrainingOptions(optimizer, "optimizer" if sharded else "none", rng.random() < 0.3)
    kernels = KernelOptions(sequence_parallel)
    return TrainingStep(graph, cluster, training, kernels, Device(rng.uniform(1e8, 1e9), 1e12),
                        rng.choice([4, 8, 12, 16]), recompute, Layout(width))


def placements(step: TrainingStep):
    """Every 1F1B partition with every degree, and every interleaved Megatron layout."""
    n, blocks = step.graph.n, step.graph.n - 2
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), n]
        stages = tuple(tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]))
        for degree in data_parallel_widths(step.fit_rules(), step.shard):
            yield Placement(step.layout(len(stages), degree), stages, step.recompute)
    for v in allowed_virtual_stages(blocks)[1:]:
        for stages in range(2, blocks // v + 1):
            chunks = megatron_chunks(step.graph, stages, v)
            for degree in data_parallel_widths(step.fit_rules(), step.shard) if chunks else ():
                yield Placement(step.layout(stages, degree, v), chunks, step.recompute)


@pytest.mark.parametrize("seed", range(30))
def test_search_bound_never_exceeds_the_model(seed):
    rng = random.Random(seed)
    layers = rng.randint(3, 8)
    for recompute in ("none", "selective", "full"):
        step = random_step(random.Random(seed), recompute, layers)
        none = TrainingStep(step.graph, step.cluster, step.training, step.kernels, step.device, step.micro_batches,
                            "none", step.shard)
        compute = np.array([layer.forward + layer.backward for layer in step.graph.layers])
        bound = float(time_lower_bound(none, compute, data_parallel_widths(step.fit_rules(), step.shard)))
        for placement in placements(step):  # over the 30 seeds, about 4,000 of them fit
            result = step.price(placement)
            if result.feasible:
                assert bound <= result.time_per_batch * (1 + 1e-12), (placement, bound, result.time_per_batch)


def test_least_pipeline_time_equals_the_minimum_over_every_stage_count():
    """The four stage counts priced per chip give the minimum over every p (to a rounding, never below)."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        count, blocks, micro_batches = (int(x) for x in rng.integers(1, 130, 3))
        stages = np.arange(1, count + 1)
        interleave = np.maximum(1, blocks // stages) if rng.random() < 0.7 else np.ones(count)
        factor = micro_batches + (stages - 1) / interleave
        per_layer = rng.random((int(rng.integers(1, 100)), 40)) * rng.choice([1e-6, 1e-3, 1.0])
        per_layer[:, :3] = 0.0  # chips with no work
        per_layer[0, 3:5] = np.inf  # and chips that cannot run a layer
        heaviest, total = per_layer.max(axis=0), per_layer.sum(axis=0)
        every = (factor[:, None] * np.maximum(heaviest, total / stages[:, None])).min(axis=0)
        found = least_pipeline_time(factor, heaviest, total)
        assert np.array_equal(np.isinf(found), np.isinf(every))
        finite = np.isfinite(every)
        assert np.all(found[finite] >= every[finite])
        assert np.allclose(found[finite], every[finite], rtol=1e-15, atol=0.0)
