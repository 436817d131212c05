"""Sharded data parallelism (ZeRO stages 1-3, FSDP, hybrid sharding) and context parallelism (ring
attention) in the training-step model: bytes and exposed times by hand on toy clusters, the tier of
every group of a layout on a DGX H100 cluster, and the search over c and the sharding modes against
brute force."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from graph_extract import KernelOptions, extract, get_spec
from phaze_hardware import SYSTEMS, Cluster
from solver.layout import Layout, allowed_virtual_stages, data_parallel_widths
from solver.placement.best import best_placement, step_floor
from solver.placement.layouts import megatron_chunks
from solver.training_step import SHARDINGS, Device, Placement, StepGraph, StepLayer, TrainingOptions, TrainingStep
from solver.training_step.memory import in_flight
from solver.training_step.data_parallel import list_collective_overhead
from solver.training_step.layer_terms import blocking_gathers
from solver.training_step.options import GATHER_COPY_PASSES, GATHER_HOST_TIME, LIST_MEMBER_HOST_TIME
from tests.test_placement_training import brute_force, partitions, random_steps

INTRA, INTER = 100e9, 10e9  # bytes/s per device per direction, no latency


def two_nodes() -> Cluster:
    """2 nodes of 2 devices: an all-gather of S bytes over the 4 moves S/2 inside a node at 100 GB/s
    (half of the ring's 2(g−1)/g = 1) and S/2·1/2 across at 10 GB/s: 3e-11 s a byte."""
    return Cluster.build("toy", 4, 2, [dict(name="nvlink", bandwidth=INTRA), dict(name="ib", bandwidth=INTER)])


def fsdp_step(**options) -> TrainingStep:
    """2 blocks of 1e9 parameters (forward 0.05 s, backward 0.1 s each), t = 1, 8 micro-batches."""
    layers = tuple(StepLayer(id=i, forward=0.05, backward=0.1, attention_core_forward=0.0, parameters=1e9,
                             activation_bytes=1e6, is_block=True) for i in range(2))
    graph = StepGraph(1, layers, ((0, 1, 1e6),))
    return TrainingStep(graph, two_nodes(), TrainingOptions(**options), KernelOptions(), Device(1e12, 1e12), 8,
                        "none", Layout(1))


def price(step: TrainingStep):
    return step.price(Placement(Layout(1, 1, 4), ((0, 1),), step.recompute))


def test_all_gather_per_byte_of_the_toy():
    cluster = two_nodes()
    assert cluster.all_gather(Layout(1, 1, 4).groups()["weights"]).per_byte == pytest.approx(
        0.5 / INTRA + 0.25 / INTER, rel=1e-12)


def test_fsdp_gathers_and_reduce_scatters_by_hand():
    """FULL_SHARD on 4 replicas, m = 2 micro-batches each. Per micro-batch the device gathers its
    stage's 2e9 weights (4e9 bytes: 0.12 s) before the forward and again before the backward, and
    reduce-scatters 8e9 bytes of fp32 gradients (0.24 s); the forward hides 0.1 s of its 0.12, the
    backward 0.2 of 0.36: 0.18 s exposed, 0.3 s hidden a micro-batch. Nothing is left for the end
    of the step but the optimizer: 2 × 2e9 × 12/4 bytes at 1e12 B/s."""
    result = price(fsdp_step(data_parallel_sharding="full"))
    assert result.breakdown["compute"] == pytest.approx(2 * 0.3, rel=1e-12)
    assert result.breakdown["sharded_data_parallel"] == pytest.approx(2 * (0.02 + 0.16), rel=1e-12)
    assert result.hidden["sharded_data_parallel"] == pytest.approx(2 * (0.1 + 0.2), rel=1e-12)
    assert result.breakdown["data_parallel_sync"] == 0.0
    assert result.breakdown["optimizer"] == pytest.approx(2 * 2e9 * 3 / 1e12, rel=1e-12)
    assert result.time_per_batch == pytest.approx(0.6 + 0.36 + 0.012, rel=1e-12)
    (memory,) = result.memory  # weight shards 2e9·2/4 plus the running and the prefetched layer whole
    assert memory["weights"] == pytest.approx(1e9 + 2 * 1e9 * 2, rel=1e-12)
    assert (memory["gradients"], memory["optimizer_state"]) == pytest.approx((2e9, 6e9), rel=1e-12)


def test_scanned_layers_hold_one_gathered_layer_and_price_as_fsdp():
    """XLA's scan over the layers without the all-gather prefetch: the weight shards (2e9·2/4) and
    one layer's 1e9 weights whole in 16 bits; the times those of FSDP's test above."""
    fsdp = price(fsdp_step(data_parallel_sharding="full"))
    scanned = price(fsdp_step(data_parallel_sharding="full", sharded_collectives="scanned_layers"))
    assert scanned.memory[0]["weights"] == pytest.approx(1e9 + 1e9 * 2, rel=1e-12)
    assert scanned.time_per_batch == pytest.approx(0.6 + 0.36 + 0.012, rel=1e-12)
    assert scanned.breakdown == fsdp.breakdown


def test_fsdp_without_resharding_gathers_once_a_step():
    """reshard_after_forward=false: one gather a step (0.12 s, behind the first forward's 0.1 s: 0.02
    exposed) and the reduce-scatters (0.24 s behind 0.2 s of backward: 0.04 a micro-batch); the stage's
    weights stay whole all step."""
    result = price(fsdp_step(data_parallel_sharding="full", reshard_after_forward=False))
    assert result.breakdown["sharded_data_parallel"] == pytest.approx(2 * 0.04, rel=1e-12)
    assert result.breakdown["data_parallel_sync"] == pytest.approx(0.02, rel=1e-12)
    assert result.memory[0]["weights"] == pytest.approx(1e9 + 2e9 * 2, rel=1e-12)


def test_hybrid_sharding_by_hand():
    """Shard width 2: each node one shard group (NVLink: 0.5/100e9 s a byte for a gather), the two
    nodes replicas of it. Per micro-batch: gather 4e9 B (0.02 s) twice and reduce-scatter 8e9 B (0.04
    s), all hidden; once a step the 4e9-byte gradient shard is all-reduced across the nodes (a ring of
    2 over 10 GB/s: 0.4 s)."""
    result = price(fsdp_step(data_parallel_sharding="full", data_parallel_shard_width=2))
    assert result.breakdown["sharded_data_parallel"] == 0.0
    assert result.hidden["sharded_data_parallel"] == pytest.approx(2 * (0.02 + 0.06), rel=1e-12)
    assert result.breakdown["data_parallel_sync"] == pytest.approx(0.4, rel=1e-12)
    assert result.memory[0]["weights"] == pytest.approx(2e9 + 4e9, rel=1e-12)
    assert result.memory[0]["optimizer_state"] == pytest.approx(2e9 * 12 / 2, rel=1e-12)
    assert TrainingOptions(data_parallel_shard_width=3).shard_problem(4) == (
        "data_parallel_shard_width: 3 does not divide the 4 ranks holding the same weights (context x data parallel)")
    assert not price(fsdp_step(data_parallel_sharding="full", data_parallel_shard_width=3)).feasible


def test_zero2_reduce_scatters_every_micro_batch():
    """Gradients sharded: each micro-batch's 8e9 bytes reduce-scattered (0.24 s), exposed unless
    overlapped with the backward (0.2 s); the updated weights all-gathered once a step (0.12 s)."""
    plain = price(fsdp_step(data_parallel_sharding="gradients"))
    assert plain.breakdown["sharded_data_parallel"] == pytest.approx(2 * 0.24, rel=1e-12)
    assert plain.breakdown["data_parallel_sync"] == pytest.approx(0.12, rel=1e-12)
    assert plain.memory[0]["gradients"] == pytest.approx(2e9 * 4 / 4, rel=1e-12)
    assert plain.memory[0]["weights"] == pytest.approx(2e9 * 2, rel=1e-12)
    overlapped = price(fsdp_step(data_parallel_sharding="gradients", overlap_grad_reduce=True))
    assert overlapped.breakdown["sharded_data_parallel"] == pytest.approx(2 * 0.04, rel=1e-12)


def ring_step(width: int, bandwidth: float = 10e9) -> TrainingStep:
    """One block on one node of 8 (`bandwidth` per link), t = 1, c = `width`: forward 1 s (0.4 of it
    attention), backward 2 s (1.0 attention), K and V of the whole sequence 8e9 bytes."""
    layer = StepLayer(id=0, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=1e6,
                      activation_bytes=8e9, is_block=True, attention_forward=0.4, attention_backward=1.0,
                      key_value_bytes=8e9)
    cluster = Cluster.build("node", 8, 8, [dict(name="nvlink", bandwidth=bandwidth)])
    return TrainingStep(StepGraph(1, (layer,), ()), cluster, TrainingOptions(), KernelOptions(), Device(1e12, 1e12),
                        8, "none", Layout(1, context_parallel_width=width))


@pytest.mark.parametrize("width, exposed, hidden", [
    # c = 2: the chunk's K, V 4e9 B (0.4 s a step at 10 GB/s) behind 0.4/2/2 = 0.1 s of attention, once;
    # backward K, V and their gradients 8e9 B (0.8 s) behind 1.0/4 = 0.25 s
    (2, (0.4 - 0.1) + (0.8 - 0.25), 0.1 + 0.25),
    # c = 4: 2e9 B (0.2 s) behind 0.4/16 = 0.025 s, 3 times; 4e9 B (0.4 s) behind 1/16 s
    (4, 3 * (0.2 - 0.025) + 3 * (0.4 - 0.0625), 3 * (0.025 + 0.0625)),
])
def test_ring_attention_bytes_and_overlap_by_hand(width, exposed, hidden):
    step = ring_step(width)
    result = step.price(Placement(Layout(1, 1, 1, context_parallel_width=width), ((0,),)))
    assert result.breakdown["compute"] == pytest.approx(8 * 3.0 / width, rel=1e-12)  # 1/c of the tokens
    assert result.breakdown["context_parallel"] == pytest.approx(8 * exposed, rel=1e-12)
    assert result.hidden["context_parallel"] == pytest.approx(8 * hidden, rel=1e-12)
    assert result.memory[0]["activations"] == pytest.approx(8e9 / width, rel=1e-12)  # 1F1B, one stage: m = 1 held
    fast = ring_step(width, bandwidth=1e12).price(Placement(Layout(1, 1, 1, context_parallel_width=width), ((0,),)))
    assert fast.breakdown["context_parallel"] == 0.0  # every transfer shorter than its attention step


def test_the_tier_of_every_group_on_dgx_h100():
    """64 H100 in 8 DGX nodes; t=2 c=2 d=4 p=4 in Megatron-Core's order tp-cp-ep-dp-pp: tensor ranks
    1 apart and context ranks 2 apart stay in a node (NVLink), no expert group (e = 1); data ranks 4 apart span 16 ranks, the
    c·d = 8 weight-holding ranks 2 apart too, pipeline stages 16 apart: InfiniBand."""
    cluster = SYSTEMS["dgx_h100"].cluster(64)
    layout = Layout(2, 4, 4, context_parallel_width=2)
    assert layout.devices == 64
    intra, inter = (tier.name for tier in cluster.tiers)
    assert cluster.spans(layout.groups()) == {"tensor": intra, "context": intra, "expert": "none", "data": inter,
                                              "weights": inter, "expert_weights": inter, "pipeline": inter,
                                              "expert_tensor": intra}  # the experts split as t
    wide = Layout(8, 1, 2, context_parallel_width=4)  # t = 8 fills a node: every other group crosses nodes
    assert cluster.spans(wide.groups())["context"] == inter and cluster.spans(wide.groups())["tensor"] == intra


def with_attention(step: TrainingStep, width: int, sharding: str) -> TrainingStep:
    """The step with attention times and K, V bytes on its blocks, at context width `width`."""
    layers = tuple(dataclasses.replace(layer, attention_forward=layer.forward / 3, attention_backward=layer.backward / 3,
                                       key_value_bytes=2e6 * layer.is_block) for layer in step.graph.layers)
    graph = dataclasses.replace(step.graph, layers=layers)
    return dataclasses.replace(step, graph=graph, training=step.training.with_sharding(sharding),
                               shard=step.shard.replace(context_parallel_width=width))


@pytest.mark.parametrize("seed", range(12))
def test_search_over_context_widths_and_shardings_equals_brute_force(seed):
    rng = random.Random(500 + seed)
    for mode, steps in random_steps(500 + seed, rng.randint(3, 7)).items():
        devices = next(iter(steps.values())).cluster.num_devices
        candidates = [with_attention(step, c, sharding) for sharding in SHARDINGS for c in (1, 2)
                      for step in steps.values() if step.width * c <= devices]
        result = best_placement(candidates)
        expected = min(brute_force(step, interleaving=True) for step in candidates)
        assert result.time_per_batch == pytest.approx(expected, rel=1e-12), mode
        if result.feasible:
            assert result.data_parallel_sharding in SHARDINGS and not math.isinf(result.time_per_batch)


@pytest.mark.parametrize("seed", range(8))
def test_the_search_floors_never_exceed_a_placement(seed):
    """The bounds the search prunes with (`TrainingStep.time_floor`, `memory_floor`, `step_floor`) are
    at most the time and memory of every placement brute force scores, at every width d, with each
    sharding and context width."""
    rng = random.Random(700 + seed)
    for mode, steps in random_steps(700 + seed, rng.randint(3, 7)).items():
        devices = next(iter(steps.values())).cluster.num_devices
        for step in (with_attention(step, c, sharding) for sharding in SHARDINGS for c in (1, 2)
                     for step in steps.values() if step.width * c <= devices):
            options = data_parallel_widths(step.fit_rules(), step.shard)
            floor = step_floor(step)
            blocks = sum(layer.is_block for layer in step.graph.layers)
            layouts = [(stages, 1) for stages in partitions(step)]
            layouts += [(chunks, v) for v in allowed_virtual_stages(blocks)[1:] for p in range(2, blocks // v + 1)
                        if (chunks := megatron_chunks(step.graph, p, v))]
            for chunks, v in layouts if options else ():
                members = np.zeros((step.graph.n, len(chunks)), dtype=bool)
                for index, chunk in enumerate(chunks):
                    members[list(chunk), index] = True
                stages, chunk_terms = len(chunks) // v, step.stage_terms(members)
                scored = step.score(chunk_terms, [step.layout(stages, d, v) for d in options])
                times = step.time_floor(np.array(options), stages, v)
                assert (times <= scored["time"]).all() and (floor <= scored["time"][scored["fits"]]).all(), (mode, v)
                fewest = step.micro_batches // max(options)
                memory = step.memory_floor(step.device_terms(chunk_terms, stages), in_flight(stages, v, fewest))
                assert (memory <= scored["memory"]).all(), (mode, step.training.data_parallel_sharding)


# DeepSpeed's early ZeRO-3 (`sharded_collectives="blocking_tensors"`) and NCCL's ring latency.

def test_a_layers_weight_tensors_are_traced_in_the_order_its_forward_reads_them():
    """A GPT block of width h = 64, FFN f = 256: its norms' weights and biases, QKV (3h·h/t, 3h/t), the
    projection (h·h/t, h), FC1 (f·h/t, f/t), FC2 (h·f/t, h): what DeepSpeed gathers one by one."""
    spec = get_spec("gpt2").with_overrides(num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                                           vocab_size=512)
    h, f = 64, 256
    for t in (1, 2):
        block = extract(spec, 2, 16, t).layer_graph.layers[1]
        assert block.parameter_tensors == (h, h, 3 * h * h // t, 3 * h // t, h * h // t, h, h, h, f * h // t, f // t,
                                           h * f // t, h)
        assert sum(block.parameter_tensors) * 2 == block.parameter_bytes


def gpt_block(h: int) -> StepLayer:
    tensors = (h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h)
    return StepLayer(id=0, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=float(sum(tensors)),
                     activation_bytes=0.0, is_block=True,
                     parameter_tensors=tensors)


def test_deepspeeds_gathers_and_regathers_by_hand():
    """GPT-3's block (h = 12,288): four tensors of 10^5 elements or more (QKV, projection, FC1, FC2;
    the norms and biases, at most 4h = 49,152, stay whole). After the recomputed forward a tensor is
    kept for its backward only if the later tensors, read forward and then backward, hold fewer than
    10^9 elements: FC2 (nothing after it) is kept; FC1 has 2·(4h² + 5h) ≈ 1.2e9 after it, the
    projection 2·8h², QKV 2·9h²: gathered again, 8h² elements. At h = 4,096 every distance is below
    10^9 (QKV's 2·(9h² + 10h) ≈ 3.0e8): nothing is gathered again."""
    h = 12288
    counts, regathered = blocking_gathers([gpt_block(h), gpt_block(4096)])
    assert counts.tolist() == [[4, 4], [3, 0]]
    assert regathered.tolist() == [8 * h * h, 0]


def blocking_step(sharding: str, recompute: str) -> TrainingStep:
    """`fsdp_step`'s two blocks, each of two gathered tensors (5e8 and 4.9995e8 elements) and a kept
    one (5e4), on the toy with latencies: NVLink 1e-5 s a step, InfiniBand 1e-4."""
    layers = tuple(StepLayer(id=i, forward=0.05, backward=0.1, attention_core_forward=0.0, parameters=1e9,
                             activation_bytes=1e6, is_block=True, parameter_tensors=(5e8, 4.9995e8, 5e4))
                   for i in range(2))
    cluster = Cluster.build("toy", 4, 2, [dict(name="nvlink", bandwidth=INTRA, latency=1e-5),
                                          dict(name="ib", bandwidth=INTER, latency=1e-4)])
    return TrainingStep(StepGraph(1, layers, ((0, 1, 1e6),)), cluster,
                        TrainingOptions(data_parallel_sharding="full", sharded_collectives=sharding),
                        KernelOptions(), Device(1e12, 1e12), 8, recompute, Layout(1))


def test_blocking_tensors_by_hand():
    """The ring of 4 over 2 nodes: 2 steps on NVLink and 1 across, 1.2e-4 s a collective besides its
    bytes (3e-11 s a byte: 0.12 s for the stage's 4e9 bytes of weights, 0.24 s for its 8e9 of fp32
    gradients). Per micro-batch, none overlapping the compute: the forward gathers the 4 tensors, the
    recomputed forward gathers them again, the backward gathers the first tensor of each block again
    (2·(4.9995e8 + 5e4) = 1e9 elements after it; the second's 1e5 is kept): 0.06 s of bytes and 2
    latencies, and reduce-scatters the 4 tensors' gradients. Besides, DeepSpeed's host work: each
    gather's fetch and each collective's list of 4 members; and its copies at the device's 1e12 B/s:
    3 passes over each gathered byte, 4 over each reduced one. FSDP (`prefetched_layers`) prices one
    collective a pass behind the compute: 0.02012 s of the forward's and 0.06024 of the backward's
    exposed."""
    latency = 2 * 1e-5 + 1e-4
    gather_host, list_host = GATHER_HOST_TIME + 4 * LIST_MEMBER_HOST_TIME, 4 * LIST_MEMBER_HOST_TIME
    forward = 0.12 + 4 * latency + 4 * gather_host + 3 * 4e9 / 1e12
    reduce_scatters = 0.24 + 4 * latency + 4 * list_host + 4 * 8e9 / 1e12
    backward = reduce_scatters + forward + 0.06 + 2 * latency + 2 * gather_host + 3 * 2e9 / 1e12
    result = price(blocking_step("blocking_tensors", "full"))
    assert result.breakdown["sharded_data_parallel"] == pytest.approx(2 * (forward + backward), rel=1e-12)
    assert result.hidden["sharded_data_parallel"] == 0.0
    assert result.breakdown["recompute"] == pytest.approx(2 * 0.1, rel=1e-12)
    # without recomputation: a gather before each pass, nothing a third time
    plain = price(blocking_step("blocking_tensors", "none"))
    assert plain.breakdown["sharded_data_parallel"] == pytest.approx(2 * (2 * forward + reduce_scatters), rel=1e-12)
    fsdp = price(blocking_step("prefetched_layers", "full"))
    assert fsdp.breakdown["sharded_data_parallel"] == pytest.approx(
        2 * ((0.12 + latency - 0.1) + (0.36 + 2 * latency - 0.3)), rel=1e-12)
    # memory: the weight shards (2e9 parameters · 2 bytes / 4) and whole layers of 1e9 parameters in
    # 16 bits: the running one only with blocking gathers, the running and the prefetched with FSDP
    assert plain.memory[0]["weights"] == pytest.approx(1e9 + 1e9 * 2, rel=1e-12)
    assert fsdp.memory[0]["weights"] == pytest.approx(1e9 + 2 * 1e9 * 2, rel=1e-12)


def test_deepspeeds_fetch_time_reproduces_its_measurement():
    """deepspeedai/DeepSpeed #1174: DeepSpeed 0.3.16's ZeRO-3 forward of a 5.1B BERT (PR #1188's: 64
    layers of h = 2,560 with a 4h FFN, vocabulary 32,003, 512 positions) on 8 A100 of 40 GB (1.555 TB/s
    of HBM) took 480 ms, ZeRO-2's 60 ms. Its 388 gathers (6 weights a layer, the word and position
    embeddings, the pooler's and the head's h x h; the biases and norms stay whole), each priced as
    the ring's transfer of 2 bytes an element plus `list_collective_overhead`, make the 420 ms between them."""
    h = 2560
    tensors = [h * h] * 4 * 64 + [4 * h * h] * 2 * 64 + [32003 * h, 512 * h, h * h, h * h]
    ring = SYSTEMS["dgx_a100"].cluster(8).all_gather(Layout(1, 1, 8).groups()["data"])
    forward = sum(ring.scalar(2 * size) + list_collective_overhead(8, 1, 2 * size, GATHER_COPY_PASSES, 1.555e12,
                                                                   GATHER_HOST_TIME) for size in tensors)
    assert len(tensors) == 388
    assert forward == pytest.approx(0.480 - 0.060, rel=0.01)


def test_dgx_a100_rings_by_nccls_model():
    """GPT-3's ZeRO-3 rows on 1,536 A100: a ring of all of them crosses 192 nodes, 1,344 steps inside
    a node at the InfiniBand proxy's 6 µs (more than NVLink's 3.4) and 191 at the network's 14 µs."""
    ring = SYSTEMS["dgx_a100"].cluster(1536).all_gather(Layout(1, 1, 1536).groups()["data"])
    assert ring.fixed == pytest.approx(1344 * 6e-6 + 191 * 14e-6, rel=1e-12)
    inside = SYSTEMS["dgx_a100"].cluster(1536).all_gather(Layout(8).groups()["tensor"])
    assert inside.fixed == pytest.approx(7 * 3.4e-6, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_search_with_blocking_tensors_equals_brute_force(seed):
    rng = random.Random(900 + seed)
    for mode, steps in random_steps(900 + seed, rng.randint(3, 6)).items():
        candidates = []
        for step in steps.values():
            layers = tuple(dataclasses.replace(layer, parameter_tensors=(layer.parameters * 0.6, layer.parameters * 0.4))
                           for layer in step.graph.layers)
            candidates.append(dataclasses.replace(
                step, graph=dataclasses.replace(step.graph, layers=layers),
                training=dataclasses.replace(step.training.with_sharding("full"), sharded_collectives="blocking_tensors")))
        result = best_placement(candidates)
        assert result.time_per_batch == pytest.approx(min(brute_force(step, interleaving=True) for step in candidates),
                                                      rel=1e-12), mode
