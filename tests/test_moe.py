"""Mixture of experts: Mixtral's parameters, the MoE block against a loop over tokens, its layer
graph by hand, tensor-parallel shards, the all-to-all, the step model with expert parallelism by
hand, the placement search with e against brute force, and bad input."""

import dataclasses
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graph_extract.plan_pass as plan_module
from graph_extract.export import getattr_path
from phaze_common.checks import InputError
from graph_extract import KernelOptions, ModelSpec, extract, get_spec, verify_tensor_parallel
from graph_extract.transformer import MixtureOfExperts
from phaze_hardware import Cluster, Group
from phaze.cli import check_command_line
from phaze.validation.cases import case, prediction
from solver.layout import Layout, MegatronSplit, data_parallel_widths
from solver.placement.best import best_placement, state_space
from solver.placement.capped import place_capped
from solver.placement.layouts import megatron_chunks
from solver.training_step import Device, Placement, StepGraph, StepLayer, TrainingOptions, TrainingStep
from solver.training_step.over_chips import time_lower_bound
from tests.test_placement_training import partitions, random_steps
from tests.test_validate_llama import RUNS

#: A small Mixtral-like block: 4 experts of FFN 96, 2 per token.
TOY = get_spec("mixtral-8x7b").with_overrides(
    num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2, ffn_hidden_size=96, vocab_size=500,
    max_position_embeddings=32, default_sequence_length=16, num_experts=4, experts_per_token=2,
)


def mixtral_parameters(layers, h, heads, kv_heads, ffn, vocab, experts, used):
    """(all, active): embedding and untied LM head V·h each; per block q, o h·h, k, v h·kv·d, router
    h·E, E SwiGLU experts 3·h·f each (k of them active), two RMSNorms; final RMSNorm."""
    d = h // heads
    dense = 2 * h * h + 2 * h * kv_heads * d + h * experts + 2 * h
    return (2 * vocab * h + layers * (dense + experts * 3 * h * ffn) + h,
            2 * vocab * h + layers * (dense + used * 3 * h * ffn) + h)


def test_mixtral_parameters_all_and_active():
    total, active = mixtral_parameters(32, 4096, 32, 8, 14336, 32000, 8, 2)
    assert (total, active) == (46_702_792_704, 12_879_925_248)  # 46.7B and 12.9B, as published
    for width in (1, 8):
        extracted = extract("mixtral-8x7b", 1, 64, width)
        assert (extracted.parameter_count, extracted.active_parameter_count) == (total, active)
    dense = extract("llama3-8b", 1, 64, 2)
    assert dense.active_parameter_count == dense.parameter_count
    total, active = mixtral_parameters(56, 6144, 48, 8, 16384, 32768, 8, 2)
    assert (total, active) == (140_630_071_296, 39_161_468_928)  # 141B and 39B, as Mistral AI publishes
    extracted = extract("mixtral-8x22b", 1, 64, 2)
    assert (extracted.parameter_count, extracted.active_parameter_count) == (total, active)


def reference_moe(block: MixtureOfExperts, x: torch.Tensor, capacity: int) -> torch.Tensor:
    """Token by token, in order: the k most probable experts, weights renormalised over them; an
    expert that already took `capacity` tokens drops the rest."""
    spec, tokens = block.spec, x.flatten(0, 1)
    taken = [0] * spec.num_experts
    out = torch.zeros_like(tokens)
    for index, token in enumerate(tokens):
        probabilities = torch.softmax(token @ block.router.weight.T, dim=-1)
        values, experts = probabilities.topk(spec.experts_per_token)
        for weight, expert in zip(values / values.sum(), experts.tolist()):
            if taken[expert] < capacity:
                taken[expert] += 1
                hidden = F.silu(token @ block.gate[expert]) * (token @ block.up[expert])
                out[index] += weight * (hidden @ block.down[expert])
    return out.view_as(x)


@pytest.mark.parametrize("capacity_factor", [1.0, 0.5, 2.0])
def test_the_moe_block_is_top_k_routing_with_capacity(capacity_factor):
    torch.manual_seed(0)
    spec = TOY.with_overrides(capacity_factor=capacity_factor)
    block = MixtureOfExperts(spec, tokens=2 * 16)
    x = torch.randn(2, 16, spec.hidden_size)
    capacity = math.ceil(capacity_factor * 32 * 2 / 4)
    assert block.capacity == capacity
    with torch.no_grad():
        assert torch.allclose(block(x), reference_moe(block, x, capacity), atol=1e-5)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_moe_block_flops_parameters_and_all_to_all_per_rank(t):
    b, s, h, heads, kv, f, experts, k = 2, 32, 64, 8, 2, 96, 4, 2
    extracted = extract(TOY, b, s, t)
    block = extracted.layer_graph.layer(1)
    tokens, d = b * s, h // heads
    capacity = math.ceil(tokens * k / experts)
    kv_per_rank = max(kv // t, 1)  # t > kv: one key/value head per rank, replicated
    attention = 2 * tokens * (2 * h * h / t + 2 * h * kv_per_rank * d) + 2 * 2 * tokens * s * h / t  # + QK, ·V
    router, expert = 2 * tokens * h * experts, 3 * 2 * experts * capacity * h * f / t
    assert block.forward_flops == attention + router + expert
    assert block.expert_parameter_bytes == 3 * experts * h * (f // t) * 2
    dense = 2 * h * h // t + 2 * h * kv_per_rank * d + h * experts + 2 * h  # attention, router, norms
    assert block.parameter_bytes == block.expert_parameter_bytes + dense * 2
    assert block.all_to_all_bytes == (experts * capacity * h * 2,) * 2  # dispatch and combine, fp16


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_moe_shards_compute_the_unsharded_model(t):
    assert verify_tensor_parallel("mixtral-8x7b", t).passed
    assert verify_tensor_parallel("mixtral-8x7b", t, capacity_factor=0.5).passed  # with dropped tokens


def test_moe_verification_fails_when_a_rank_holds_another_experts_slice(monkeypatch):
    original = plan_module.Rank.local_parameter

    def swapped_experts(rank, target, dim):
        original(rank, target, dim)
        if rank.values is not None and target.endswith("mlp.up"):
            with torch.no_grad():
                weight = getattr_path(rank.root, target)
                weight.copy_(weight.roll(1, dims=0))  # expert e gets expert e-1's slice

    monkeypatch.setattr(plan_module.Rank, "local_parameter", swapped_experts)
    assert not verify_tensor_parallel("mixtral-8x7b", 2).passed


def test_all_to_all_by_hand():
    """8 devices at stride 1 on nodes of 4: 3/8 of the bytes to the node's other members over the
    first tier, 4/8 to the other node over the second; 3 and 1 extra messages."""
    cluster = Cluster.build("two", 16, 4, [dict(bandwidth=100.0, latency=1.0, efficiency=0.5),
                                           dict(bandwidth=10.0, latency=2.0, efficiency=1.0)])
    collective = cluster.all_to_all(Group(8, 1))
    assert collective.per_byte == pytest.approx(3 / 8 / 50 + 4 / 8 / 10)
    assert collective.fixed == pytest.approx(3 * 1.0 + 1 * 2.0)
    assert Layout(2, expert_parallel_width=4).groups()["expert"] == Group(4, 2)  # e replicas at stride t: 2 per node
    assert cluster.all_to_all(Group(1, 1)).per_byte == 0.0


def moe_graph(width: int = 1) -> StepGraph:
    """Embedding (dense), two MoE blocks (half their parameters experts', two all-to-alls), head."""
    def layer(i, block):
        return StepLayer(id=i, forward=1.0, backward=2.0, attention_core_forward=0.25, parameters=4e6,
                         activation_bytes=1e6, is_block=block, expert_parameters=2e6 if block else 0.0,
                         all_to_all_bytes=(8e6, 8e6) if block else ())
    return StepGraph(width, tuple(layer(i, 0 < i < 3) for i in range(4)), ((0, 1, 1e6), (1, 2, 1e6), (2, 3, 1e6)))


def test_a_step_with_expert_parallelism_by_hand():
    """One stage (p 1), d 4, e 2, on one tier of 1e9 B/s: every term by hand."""
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])
    step = TrainingStep(moe_graph(), cluster, TrainingOptions("adam", "optimizer"), KernelOptions(True),
                        Device(1e12, 1e12), 8, "none", Layout(1, expert_parallel_width=2))
    result = step.price(Placement(Layout(1, 1, 4, expert_parallel_width=2), ((0, 1, 2, 3),)))
    # all-to-all of 2 at stride 1: half of 8e6 bytes leaves, 4e-3 s; 2 forward + 2 backward per block
    assert result.breakdown["expert_parallel"] == pytest.approx(2 * 2 * 2 * 4e-3 * 2)  # 2 micro-batches
    # parameters per device: 4 x 4e6 - 2 x 2e6 / 2 = 14e6, of which 2e6 are experts' (synced over d/e = 2)
    assert result.parameters == (14e6,)
    dense, experts = 12e6, 2e6
    # reduce-scatter of the fp32 gradients and all-gather of the fp16 weights: over the 4 replicas at
    # stride 1, (4 - 1)/4 of the bytes; the experts' over their 2 replicas at stride t·e = 2, 1/2
    assert result.breakdown["data_parallel_sync"] == pytest.approx(
        dense * 4 * 0.75 / 1e9 + dense * 2 * 0.75 / 1e9 + experts * 4 * 0.5 / 1e9 + experts * 2 * 0.5 / 1e9)
    # optimizer state: dense sharded over 4, experts over 2
    assert result.memory[0]["optimizer_state"] == pytest.approx(dense * 12 / 4 + experts * 12 / 2)
    assert result.breakdown["optimizer"] == pytest.approx(2 * (dense * 3 + experts * 6) / 1e12)
    # d must be a multiple of e
    assert step.price(Placement(Layout(1, 1, 1, expert_parallel_width=2), ((0, 1, 2, 3),))).infeasible_reason == (
        "expert_parallel_width: 2 does not divide data_parallel_width=1 (the experts are split over data-parallel "
        "replicas)")


def with_experts(step: TrainingStep, rng: random.Random, experts_width: int,
                 expert_tensor_width: int | None = None) -> TrainingStep:
    """The step with its blocks made MoE blocks: part of their parameters experts', two all-to-alls,
    an all-reduce of the experts' each way (at the expert tensor-parallel width τ)."""
    layers = tuple(dataclasses.replace(layer, expert_parameters=layer.parameters * rng.choice([0.5, 0.75]),
                                       all_to_all_bytes=(float(rng.randint(1, 4)) * 1e6,) * 2,
                                       expert_forward_collective_bytes=(float(rng.randint(1, 4)) * 1e6,),
                                       expert_backward_collective_bytes=(float(rng.randint(1, 4)) * 1e6,))
                   if layer.is_block else layer for layer in step.graph.layers)
    graph = dataclasses.replace(step.graph, layers=layers)
    return TrainingStep(graph, step.cluster, step.training, step.kernels, step.device, step.micro_batches,
                        step.recompute, step.shard.replace(expert_parallel_width=experts_width,
                                                           expert_tensor_parallel_width=expert_tensor_width))


def brute_force(step: TrainingStep) -> float:
    """Every convex split of the chain and every degree that divides the micro-batches (the model's
    own feasibility decides which degrees e allows)."""
    best = math.inf
    options = [d for d in range(1, step.micro_batches + 1) if step.micro_batches % d == 0]
    for stages in partitions(step):
        members = np.zeros((step.graph.n, len(stages)), dtype=bool)
        for index, stage in enumerate(stages):
            members[list(stage), index] = True
        scored = step.score(step.stage_terms(members), [step.layout(len(stages), d) for d in options])
        if scored["fits"].any():
            best = min(best, float(scored["time"][scored["fits"]].min()))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_placement_search_with_expert_parallelism_equals_brute_force(seed):
    rng = random.Random(seed)
    for mode, steps in random_steps(500 + seed, rng.randint(3, 7)).items():
        by_experts = {(e, tau): {t: with_experts(step, random.Random(seed * 13 + t), e, tau)
                                 for t, step in steps.items()}
                      for e in (1, 2, 4) for tau in (None, 1)}  # τ = t, and each expert whole on a device
        for e, at_e in by_experts.items():
            for t, step in at_e.items():
                found = place_capped(step, state_space(step))
                expected = brute_force(step)
                assert (found[1].time_per_batch if found else math.inf) == pytest.approx(expected, rel=1e-12), (e, t)
        result = best_placement([at_e[t] for at_e in by_experts.values() for t in sorted(at_e)],
                                virtual_stages=(1,))
        expected = min(brute_force(step) for at_e in by_experts.values() for step in at_e.values())
        assert result.time_per_batch == pytest.approx(expected, rel=1e-12), mode
        if result.feasible:
            layout = result.layout
            assert (layout.tensor_parallel_width * layout.data_parallel_width) % (
                layout.expert_parallel_width * layout.expert_tensor_width) == 0


def test_search_lower_bound_holds_for_every_expert_width():
    rng = random.Random(7)
    steps = random_steps(77, 6)["none"]
    for e in (1, 2, 4):
        for step in steps.values():
            moe = with_experts(step, rng, e)
            compute = np.array([layer.forward + layer.backward for layer in moe.graph.layers])
            found = place_capped(moe, state_space(moe))
            if found:
                bound = time_lower_bound(moe, compute, data_parallel_widths(moe.fit_rules(), moe.shard))
                assert bound <= found[1].time_per_batch * (1 + 1e-12)


def check_error(mode: str, *arguments: str) -> str:
    with pytest.raises(InputError) as raised:
        check_command_line(mode, list(arguments))
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_bad_moe_input_is_one_line_naming_the_field():
    with pytest.raises(ValueError, match=r"^experts_per_token: 3 with num_experts=2; allowed: an integer in \[1, 2\]"):
        ModelSpec("m", 1, 64, 8, 64, 10, 8, 8, num_experts=2, experts_per_token=3)
    assert check_error("run_solver", "model=mixtral-8x7b", "+model.overrides.experts_per_token=9") == (
        "model.overrides.experts_per_token: 9 with num_experts=8; allowed: an integer in [1, 8]")
    assert check_error("run_solver", "model=mixtral-8x7b", "expert_parallel_width=3") == (
        "expert_parallel_width: 3 does not divide the 8 experts of mixtral-8x7b; allowed: 1, 2, 4, 8")
    assert check_error("run_solver", "model=llama3-8b", "expert_parallel_width=2") == (
        "expert_parallel_width: 2 does not divide llama3-8b (no experts); allowed: 1")
    assert check_error(
        "predict", "model=mixtral-8x7b", "chip=h100_sxm", "system=dgx_h100", "num_devices=16",
        "tensor_parallel_width=2", "pipeline_parallel_width=2", "data_parallel_width=4", "expert_parallel_width=8",
        "recompute=selective").startswith("expert_parallel_width: 8 does not divide data_parallel_width=4")
    assert check_error("run_solver", "model=mixtral-8x7b", "+model.overrides.capacity_factor=0").startswith(
        "model.overrides.capacity_factor: must be a number > 0")
    assert check_error("run_solver", "model=mixtral-8x7b", "expert_tensor_parallel_width=0") == (
        "expert_tensor_parallel_width: must be an integer >= 1, got 0")
    assert check_error("run_solver", "model=llama3-8b", "expert_tensor_parallel_width=2") == (
        "expert_tensor_parallel_width: llama3-8b has no experts; allowed: null")
    layout = ("predict", "model=mixtral-8x7b", "chip=h100_sxm", "system=dgx_h100", "num_devices=16",
              "tensor_parallel_width=4", "pipeline_parallel_width=2", "data_parallel_width=2", "expert_parallel_width=8",
              "recompute=none")
    assert check_error(*layout, "expert_tensor_parallel_width=3") == (
        "expert_tensor_parallel_width: 3 does not divide tensor_parallel_width=4; allowed: 1, 2, 4")
    assert check_error(*layout, "expert_tensor_parallel_width=2") == (
        "expert_parallel_width: 8 x expert_tensor_parallel_width 2 = 16 does not divide tensor x data parallel = "
        "4 x 2 (the experts are laid over those ranks)")
    assert check_error(*layout, "expert_tensor_parallel_width=[1,2]") == (
        "expert_tensor_parallel_width: predict prices one placement; give one value, got [1, 2]")


def test_megatron_layout_counting_the_embedding_and_the_loss_as_blocks():
    """Megatron's --account-for-embedding/loss-in-pipeline-split (Qwen3-235B's 94 blocks on 8 x 4
    chunks): 4 blocks + 2 on 3 stages are [embedding, b1] [b2, b3] [b4, head]; on 6 chunks the
    first holds the embedding alone."""
    graph = StepGraph(1, tuple(StepLayer(id=i, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=1.0,
                                          activation_bytes=1.0, is_block=0 < i < 5) for i in range(6)),
                      tuple((i, i + 1, 1.0) for i in range(5)))
    assert megatron_chunks(graph, 3) is None
    assert megatron_chunks(graph, 3, split=MegatronSplit(True)) == ((0, 1), (2, 3), (4, 5))
    assert megatron_chunks(graph, 3, 2, MegatronSplit(True)) == ((0,), (1,), (2,), (3,), (4,), (5,))
    assert megatron_chunks(graph, 2, split=MegatronSplit(False)) == ((0, 1, 2), (3, 4, 5))


def test_the_qwen3_moe_runs_of_the_calibration_set():
    """Qwen3-235B-A22B (Megatron-MoE-ModelZoo): 128 experts of FFN 1536, top 8, 4 key/value heads of 128
    (64 x 128 = 8192 wide attention on a 4096-wide model), the tokenizer's 151,936 words; Megatron's EP
    = 32 and ETP = 1 at t 2 are e = 32, τ = 1 (a device holds 1/32 of the experts); 94 blocks on p 32 x v 3 chunks count the
    embedding and the loss as a block each (the first chunk holds the embedding alone)."""
    first = case(RUNS["moezoo_qwen3_235b_h100_row1"])
    spec = first.spec
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.kv_heads, spec.head_dim) == (94, 4096, 64, 4, 128)
    assert (spec.num_experts, spec.experts_per_token, spec.ffn_hidden_size, spec.vocab_size) == (128, 8, 1536, 151936)
    assert (first.width, first.stages, first.degree, first.virtual_stages, first.expert_parallel_width,
            first.expert_tensor_parallel_width) == (2, 8, 16, 4, 32, 1)
    assert first.training.overlap_grad_reduce and first.training.data_parallel_sharding == "optimizer"
    # the dispatcher each row states: DeepEP once a node; the 1F1B all-to-all overlap on row 2 only
    assert (first.training.expert_dispatch, first.training.overlap_expert_dispatch) == ("deduplicated", False)
    second = case(RUNS["moezoo_qwen3_235b_h100_row2"]).training
    assert (second.expert_dispatch, second.overlap_expert_dispatch) == ("deduplicated", True)
    assert case(RUNS["moezoo_qwen3_235b_h100_row4"]).training.expert_dispatch == "all_to_all"
    assert first.recompute == "layernorm+moe_act"  # the table's "norm, act": Megatron-Core's recompute modules
    assert "vocabulary" in first.assumed and first.measured == 19.7
    fourth = case(RUNS["moezoo_qwen3_235b_h100_row4"])
    assert (fourth.width, fourth.stages, fourth.degree, fourth.virtual_stages, fourth.expert_parallel_width) == (
        2, 32, 4, 3, 8)
    assert case(RUNS["moezoo_qwen3_next_80b_a3b_h100"]).startswith("not stated: model.num_layers")
    predicted = prediction(fourth, None)
    assert predicted.placement.chunks[0] == (0,) and predicted.placement.chunks[-1] == (95,)
    assert len(predicted.placement.chunks) == 96 and math.isfinite(predicted.step.time_per_batch)
    assert predicted.step.breakdown["expert_parallel"] > 0


def fine_grained_parameters(spec: ModelSpec) -> tuple[int, int]:
    """(all, active) of a fine-grained mixture from its config, by hand: untied embedding and head
    V·h each; per block q and o h·(H·d), k and v h·(kv·d), QK-norms d each, two RMSNorms h; a dense
    block a SwiGLU MLP 3·h·f, an expert block a router h·E, E experts 3·h·f_e (k active) and the
    shared experts 3·h·(shared·f_e); the final RMSNorm h."""
    h, d, f, fe = spec.hidden_size, spec.head_dim, spec.ffn_hidden_size, spec.expert_ffn_hidden_size
    attention = 2 * h * spec.num_heads * d + 2 * h * spec.kv_heads * d + 2 * h + (2 * d if spec.qk_norm else 0)
    if spec.latent_attention:  # MLA: down h·r_q and h·(r_kv + d_r), norms r_q + r_kv, ups, output H·d_v·h
        heads, nope, rope, value = spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        attention = (h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * heads * (nope + rope)
                     + h * (spec.kv_lora_rank + rope) + spec.kv_lora_rank + spec.kv_lora_rank * heads * (nope + value)
                     + heads * value * h + 2 * h)
    dense = spec.first_dense_layers * (attention + 3 * h * f)
    moe = spec.num_layers - spec.first_dense_layers
    routed_all, routed_active = spec.num_experts * 3 * h * fe, spec.experts_per_token * 3 * h * fe
    expert_block = attention + h * spec.num_experts + spec.shared_experts * 3 * h * fe
    ends = 2 * spec.vocab_size * h + h
    return (ends + dense + moe * (expert_block + routed_all), ends + dense + moe * (expert_block + routed_active))


@pytest.mark.parametrize("model, width, published", [
    ("qwen3-235b-a22b", 4, (235.09, 22.19)),  # the model card: 235 B, 22 B active
    ("deepseek-v3", 8, (671.03, 37.55)),  # arXiv:2412.19437 §1: 671 B, 37 B active (its multi-token module apart)
])
def test_parameters_all_and_active_as_published(model, width, published):
    """Qwen3-235B-A22B and DeepSeek-V3 from their config.json's fields: the closed form by hand, and
    the extracted graph within 0.2 % of it (all parameters and those one token uses)."""
    spec = get_spec(model)
    total, active = fine_grained_parameters(spec)
    assert (total / 1e9, active / 1e9) == pytest.approx(published, abs=0.01)
    extracted = extract(spec, 1, 64, width)
    assert extracted.parameter_count == pytest.approx(total, rel=2e-3)
    assert extracted.active_parameter_count == pytest.approx(active, rel=2e-3)


@pytest.mark.parametrize("t", [1, 2])
def test_first_dense_blocks_and_shared_experts_by_hand(t):
    """Two dense blocks, then experts of width 48 with two shared ones: the counts by hand, the dense
    blocks traced apart from the expert blocks (whose last is copied), and only routed experts are
    expert parameters (the shared ones split over t like the dense MLP)."""
    spec = TOY.with_overrides(num_layers=5, first_dense_layers=2, moe_ffn_hidden_size=48, shared_experts=2,
                              qk_norm=True, num_experts=4, experts_per_token=2)
    total, active = fine_grained_parameters(spec)
    extracted = extract(spec, 1, 16, t)
    assert (extracted.parameter_count, extracted.active_parameter_count) == (total, active)
    layers = extracted.layer_graph.layers
    h = spec.hidden_size
    assert [layer.expert_parameter_bytes for layer in layers[1:6]] == [0, 0] + [3 * 4 * h * (48 // t) * 2] * 3
    assert layers[1].parameter_bytes != layers[3].parameter_bytes
    assert extracted.repeat_groups == ((0,), (1, 2), (3, 4, 5), (6,))  # dense blocks apart from expert blocks


def test_bad_fine_grained_expert_fields_are_one_line():
    with pytest.raises(ValueError, match=r"^shared_experts: needs num_experts \(a mixture of experts\); allowed without: 0$"):
        ModelSpec("m", 2, 64, 8, 64, 10, 8, 8, shared_experts=1)
    with pytest.raises(ValueError, match=r"^first_dense_layers: 2 of 2 blocks leaves no mixture of experts; allowed: 0 to 1$"):
        ModelSpec("m", 2, 64, 8, 64, 10, 8, 8, num_experts=4, first_dense_layers=2)


@pytest.mark.parametrize("t", [2, 4])
def test_fine_grained_shards_compute_the_unsharded_model(t):
    """A dense first block, shared experts, narrow routed experts and QK-norm, sharded t ways, give
    the unsharded model's loss."""
    assert verify_tensor_parallel("qwen3-235b-a22b", t, num_layers=3, first_dense_layers=1, shared_experts=2,
                                  num_experts=4, experts_per_token=2, moe_ffn_hidden_size=32, kv_channels=None).passed


#: A small DeepSeek-V3: one dense block, then MLA blocks with 4 experts of 32 (2 per token) and a shared one.
SMALL_DEEPSEEK = get_spec("deepseek-v3").with_overrides(
    num_layers=3, hidden_size=64, num_heads=8, ffn_hidden_size=160, vocab_size=1000, max_position_embeddings=32,
    default_sequence_length=16, num_experts=4, experts_per_token=2, moe_ffn_hidden_size=32, first_dense_layers=1,
    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_latent_attention_flops_collectives_and_key_value_bytes_by_hand(t):
    """One dense MLA block at width t, b = 1, s = 16: every product's 2·m·k·n (the down projections
    on every rank, the ups and the output split by heads), the backward all-reduces on the two
    latents and the MLP input, and K, V as a fused kernel reads them (K: each head's 8 plain and the
    4 rotated dimensions, 12 wide; V: 8)."""
    extracted = extract(SMALL_DEEPSEEK, 1, 16, t)
    block = extracted.layer_graph.layer(1)
    s, h, heads, ffn = 16, 64, 8 // t, 160 // t
    products = (s * h * 24 + s * 24 * heads * 12 + s * h * 20 + s * 16 * heads * 16  # down, up (q; kv)
                + heads * s * s * 12 + heads * s * s * 8 + s * heads * 8 * h  # scores, context, output
                + 3 * s * h * ffn)  # SwiGLU
    assert block.forward_flops == 2 * products
    assert block.backward_collective_bytes == ((s * 24 * 2, s * 16 * 2, s * h * 2) if t > 1 else ())
    assert block.key_value_bytes == heads * s * (12 + 8) * 2
    assert (extracted.parameter_count, extracted.active_parameter_count) == fine_grained_parameters(SMALL_DEEPSEEK)


@pytest.mark.parametrize("t", [2, 4])
def test_latent_attention_shards_compute_the_unsharded_model(t):
    assert verify_tensor_parallel("deepseek-v3", t, num_layers=3, first_dense_layers=1, num_experts=4,
                                  experts_per_token=2, moe_ffn_hidden_size=32, q_lora_rank=24, kv_lora_rank=16,
                                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8).passed


def test_bad_latent_attention_fields_are_one_line():
    with pytest.raises(ValueError, match=r"^q_lora_rank: needs kv_lora_rank \(multi-head latent attention\); "
                                         r"allowed without: null$"):
        ModelSpec("m", 2, 64, 8, 64, 10, 8, 8, q_lora_rank=4)
    with pytest.raises(ValueError, match=r"^v_head_dim: missing; multi-head latent attention"):
        ModelSpec("m", 2, 64, 8, 64, 10, 8, 8, position_embedding="rotary", kv_lora_rank=4, qk_nope_head_dim=8,
                  qk_rope_head_dim=4)


def test_deduplicated_dispatch_on_a_two_node_toy_by_hand():
    """4 devices on 2 nodes of 2 (100 and 10 bytes/s): a plain all-to-all sends 1/4 of S to the node's
    other device and 2/4 across. With 2 experts a token (experts even over the 2 nodes), the other
    node receives a token with probability 1 − (1/2)² = 3/4, where the plain exchange sends it
    2 × 1/2 = 1 copy: 3/4 of the crossing bytes; what arrives is forwarded to the other device of
    the node for half of the copies (2/4 × 1/2 of S over the node's links)."""
    cluster = Cluster.build("toy", 4, 2, [dict(bandwidth=100.0), dict(bandwidth=10.0)])
    plain, deduplicated = cluster.all_to_all(Group(4, 1)), cluster.dispatch(Group(4, 1), 2)
    assert plain.per_byte == pytest.approx(1 / 4 / 100 + 2 / 4 / 10)
    assert deduplicated.per_byte == pytest.approx(1 / 4 / 100 + 2 / 4 * 3 / 4 / 10 + 2 / 4 * 1 / 2 / 100)
    assert cluster.dispatch(Group(2, 1), 8).per_byte == cluster.all_to_all(Group(2, 1)).per_byte  # in one node
    # one expert a token: nothing to deduplicate across nodes (only the forwarding inside the node is added)
    assert cluster.dispatch(Group(4, 1), 1).per_byte == pytest.approx(plain.per_byte + 2 / 4 * 1 / 2 / 100)


def test_a_deduplicated_and_overlapped_dispatch_in_the_step_by_hand():
    """The toy MoE step (two blocks, 8e6-byte dispatch and combine, compute 1 + 2 s a block) with e = 4
    over the two nodes: the deduplicated exchange prices each all-to-all by `dispatch`; overlapped,
    each block's 4 exchanges hide behind its 3 s of compute and the rest is exposed."""
    cluster = Cluster.build("toy", 4, 2, [dict(bandwidth=1e7), dict(bandwidth=1e6)])
    graph = dataclasses.replace(moe_graph(), experts_per_token=2)

    def priced(**options):
        step = TrainingStep(graph, cluster, TrainingOptions("adam", "optimizer", **options), KernelOptions(True),
                            Device(1e12, 1e12), 4, "none", Layout(1, expert_parallel_width=4))
        return step.price(Placement(Layout(1, 1, 4, expert_parallel_width=4), ((0, 1, 2, 3),)))

    per_byte = 1 / 4 / 1e7 + 2 / 4 * 3 / 4 / 1e6 + 2 / 4 * 1 / 2 / 1e7
    exchange = 8e6 * per_byte  # one dispatch or combine: 3.4 s
    plain = priced()
    assert plain.breakdown["expert_parallel"] == pytest.approx(2 * 4 * 8e6 * (1 / 4 / 1e7 + 2 / 4 / 1e6))
    deduplicated = priced(expert_dispatch="deduplicated")
    assert deduplicated.breakdown["expert_parallel"] == pytest.approx(2 * 4 * exchange)  # 2 blocks, 1 micro-batch
    overlapped = priced(expert_dispatch="deduplicated", overlap_expert_dispatch=True)
    assert overlapped.breakdown["expert_parallel"] == pytest.approx(2 * (4 * exchange - 3.0))
    assert overlapped.hidden["expert_parallel"] == pytest.approx(2 * 3.0)


def test_expert_products_read_one_eth_of_the_weights_at_expert_width_e():
    """On a GPU the experts split over e devices run E/e grouped products of e times the tokens: each
    expert product's group moves its weights' bytes × (1 − 1/e) fewer; the layer costs carry the
    times at every e dividing the experts, and the step model of a shard at e takes those."""
    from estimator.fusion import fuse_layers
    from estimator.roofline import group_bytes
    from phaze_hardware import known_chip
    from solver.layer_costs import roofline_costs, step_graphs

    wide = TOY.with_overrides(hidden_size=2048, ffn_hidden_size=2048, num_heads=16, num_kv_heads=4)  # 32 MiB an op
    extracted = extract(wide, 1, 16, 1)
    graph = extracted.op_graph
    (fused,) = fuse_layers(graph, (1,))
    grouped = [op for op in fused.ops if graph.nodes[op.members[0]].op == "grouped_linear"]
    assert len(grouped) == 3  # gate, up, down
    split = [1.0] * len(graph.nodes)
    for op in grouped:
        head = graph.nodes[op.members[0]]
        weights = sum(math.prod(shape) for shape in head.weight_shapes) * head.dtype_bytes
        for e in (2, 4):
            assert group_bytes(graph, op, split, (), e) == pytest.approx(group_bytes(graph, op, split) - weights * (1 - 1 / e))
    # the device's times alone: no host time per kernel (the host's issue time is tests/test_expert_launches.py's)
    chip = dataclasses.replace(known_chip("h100_sxm"), kernel_host_seconds=0.0, expert_gemm_host_seconds=0.0)
    costs = roofline_costs(KernelOptions(), {1: extracted}, chip)
    block = costs[1][1]
    assert [entry[0] for entry in block.expert_parallel_times] == [2, 4] and not costs[1][0].expert_parallel_times
    assert block.expert_parallel_times[-1][1] < block.forward  # 8 tokens an expert: bound by the weights' bytes
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9)])
    graphs = step_graphs({1: extracted}, costs)
    for e, forward in ((1, block.forward), (4, block.expert_parallel_times[-1][1])):
        step = TrainingStep(graphs[1], cluster, TrainingOptions(), KernelOptions(True), Device(1e12, 1e12), 8, "none",
                            Layout(1, expert_parallel_width=e))
        assert step.layer_values["forward"][1] == pytest.approx(forward)


def etp_graph() -> StepGraph:
    """`moe_graph` at width 2, each block's routed experts with one all-reduce forward and one backward
    of 1e6 bytes (their own group: `EXPERT_TENSOR`)."""
    graph = moe_graph(2)
    layers = tuple(dataclasses.replace(layer, expert_forward_collective_bytes=(1e6,),
                                       expert_backward_collective_bytes=(1e6,)) if layer.is_block else layer
                   for layer in graph.layers)
    return dataclasses.replace(graph, layers=layers)


@pytest.mark.parametrize("tau", [None, 1])
def test_expert_tensor_parallel_memory_and_collectives_by_hand(tau):
    """t 2, d 4, e 4, one stage of 8 devices on one tier of 1e9 B/s. A width-2 rank holds 2e6 expert
    parameters a block (all experts, split over t = 2: 4e6 whole). Megatron shards the experts over
    EP x ETP (Megatron-LM issue #4050): τ = t = 2 gives 4e6 / 8 = 0.5e6 a block, τ = 1 gives 4e6 / 4 =
    1e6 (each expert whole on a device); the experts' optimizer state is split over the t·d/(e·τ)
    ranks holding the same experts (1 and 2); their all-reduces run over τ ranks (none at τ = 1); the
    dispatch is the same 4e6 bytes a rank (half the 8e6 routed tokens) over 4 ranks either way."""
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])
    shard = Layout(2, expert_parallel_width=4, expert_tensor_parallel_width=tau)
    step = TrainingStep(etp_graph(), cluster, TrainingOptions("adam", "optimizer"), KernelOptions(False),
                        Device(1e12, 1e12), 8, "none", shard)
    result = step.price(Placement(shard.replace(data_parallel_width=4), ((0, 1, 2, 3),)))
    whole_experts = 4e6  # a block's experts, unsplit
    per_block = whole_experts / (4 * (tau or 2))
    dense = 4 * 4e6 - 2 * 2e6
    assert result.parameters == (dense + 2 * per_block,)
    assert result.memory[0]["weights"] == pytest.approx((dense + 2 * per_block) * 2)  # 16-bit
    expert_replicas = 2 * 4 // (4 * (tau or 2))
    assert result.memory[0]["optimizer_state"] == pytest.approx(dense * 12 / 4 + 2 * per_block * 12 / expert_replicas)
    # the experts' all-reduce of 1e6 bytes over 2 ranks moves 2 x 1/2 of them (τ = 2); 2 blocks x (forward
    # + backward) x 2 micro-batches
    assert result.breakdown["tensor_parallel"] == pytest.approx(0.0 if tau == 1 else 2 * 2 * 2 * 1e6 / 1e9)
    # the all-to-all: 3/4 of 4e6 bytes leave a rank; 2 a pass, forward and backward, 2 blocks, 2 micro-batches
    assert result.breakdown["expert_parallel"] == pytest.approx(2 * 2 * 2 * 2 * 4e6 * 3 / 4 / 1e9)
    groups = shard.replace(data_parallel_width=4).groups()
    assert (groups["expert"], groups["expert_tensor"]) == ((Group(4, 2), Group(2, 1)) if tau is None else
                                                           (Group(4, 1), Group(1, 1)))


def test_expert_tensor_parallel_width_rules_and_graph():
    """e·τ must divide t·d and τ divide t, each one line; the width-t graph's routed experts' all-reduces
    are their own (`expert_*_collective_bytes`), the attention's and the shared expert's stay the
    tensor-parallel group's; τ = t is the default layout itself."""
    step = TrainingStep(etp_graph(), Cluster.build("one", 8, 8, [dict(bandwidth=1e9)]),
                        TrainingOptions("adam", "optimizer"), KernelOptions(False), Device(1e12, 1e12), 8, "none",
                        Layout(2, expert_parallel_width=4, expert_tensor_parallel_width=1))
    assert step.price(Placement(Layout(2, 1, 2, expert_parallel_width=4, expert_tensor_parallel_width=1),
                                ((0, 1, 2, 3),))).feasible  # e·τ = 4 divides t·d = 4 (e does not divide d)
    assert step.price(Placement(Layout(2, 1, 1, expert_parallel_width=4, expert_tensor_parallel_width=1),
                                ((0, 1, 2, 3),))).infeasible_reason == (
        "expert_parallel_width: 4 x expert_tensor_parallel_width 1 = 4 does not divide tensor x data parallel "
        "= 2 x 1 (the experts are laid over those ranks)")
    assert Layout(4, expert_tensor_parallel_width=4) == Layout(4)
    assert Layout(4, expert_tensor_parallel_width=1).text() == "t=4 p=1 d=1 v=1 et=1"
    with pytest.raises(InputError, match="^expert_tensor_parallel_width: must be a positive integer, got 0$"):
        Layout(2, expert_tensor_parallel_width=0)
    from solver.layout import FitRules
    assert FitRules(16, 8, 4, 2, 8).problem(Layout(4, 1, 2, expert_parallel_width=2, expert_tensor_parallel_width=3)) \
        == "expert_tensor_parallel_width: 3 does not divide tensor_parallel_width=4; allowed: 1, 2, 4"
    shared = TOY.with_overrides(shared_experts=1)
    layer = extract(shared, 1, 16, 2).layer_graph.layers[1]
    h_bytes = 16 * shared.hidden_size * 2  # one micro-batch's tokens x h in 16 bits
    assert layer.expert_forward_collective_bytes == (h_bytes,) and layer.expert_backward_collective_bytes == (h_bytes,)
    # attention and the shared expert: one all-reduce each way each
    assert layer.forward_collective_bytes == (h_bytes, h_bytes) and layer.backward_collective_bytes == (h_bytes, h_bytes)


def test_megatron_uneven_first_and_last_stages_and_the_published_baselines():
    """DeepSeek-V3's 61 blocks on 16 stages as Megatron-MoE-ModelZoo lays them (4 first, 1 last, 56 / 14
    = 4 between); 6 blocks with 1 first and 2 last on 3 stages: [emb, b1] [b2, b3, b4] [b5, b6, head];
    a rest that does not split is None. The zoo's mixtures give their published layouts as the fixed
    baseline (v, e, τ, the split), one line for a bad key."""
    from phaze.model_config import fixed_megatron as configured
    graph = StepGraph(1, tuple(StepLayer(id=i, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=1.0,
                                          activation_bytes=1.0, is_block=0 < i < 7) for i in range(8)),
                      tuple((i, i + 1, 1.0) for i in range(7)))
    assert megatron_chunks(graph, 3, split=MegatronSplit(first_stage_blocks=1, last_stage_blocks=2)) == (
        (0, 1), (2, 3, 4), (5, 6, 7))
    assert megatron_chunks(graph, 4, split=MegatronSplit(first_stage_blocks=1, last_stage_blocks=2)) is None  # 3 / 2
    assert megatron_chunks(graph, 2, 2, split=MegatronSplit(first_stage_blocks=2)) is None  # v = 1 only
    deepseek = StepGraph(1, tuple(StepLayer(id=i, forward=1.0, backward=1.0, attention_core_forward=0.0, parameters=1.0,
                                          activation_bytes=1.0, is_block=0 < i < 62) for i in range(63)),
                         tuple((i, i + 1, 1.0) for i in range(62)))
    chunks = megatron_chunks(deepseek, 16, split=MegatronSplit(first_stage_blocks=4, last_stage_blocks=1))
    assert [len(chunk) for chunk in chunks] == [5] + [4] * 14 + [2]  # the embedding and the head at the ends
    layout, split = configured({"fixed_megatron": dict(pipeline_parallel_width=8, tensor_parallel_width=2,
                                                       data_parallel_width=64, virtual_stages=4,
                                                       expert_parallel_width=32, expert_tensor_parallel_width=1,
                                                       account_for_embedding_and_loss=True)}, 1024)
    assert layout == Layout(2, 8, 64, 4, 32, expert_tensor_parallel_width=1) and split == MegatronSplit(True)
    assert check_error("run_solver", "model=deepseek-v3", "model.fixed_megatron.first_stage_blocks=0") == (
        "model.fixed_megatron.first_stage_blocks: must be a positive integer, got 0")
    with pytest.raises(InputError, match=r"^model\.fixed_megatron\.account_for_embedding_and_loss: with "
                                         r"first_stage_blocks or last_stage_blocks; allowed: one of them$"):
        configured({"fixed_megatron": dict(pipeline_parallel_width=2, tensor_parallel_width=1, data_parallel_width=1,
                                           account_for_embedding_and_loss=True, first_stage_blocks=1)}, 2)
    assert check_error("run_solver", "model=qwen3-235b-a22b", "+model.fixed_megatron.layers_per_stage=2").startswith(
        "model.fixed_megatron.layers_per_stage: unknown key")


def test_an_overlapped_dispatch_slows_the_compute_beside_it_by_its_share_of_the_device():
    """d 4, e 2 on one tier of 1e9 B/s: an exchange moves 1/2 of 8e6 bytes, 4 ms; a block's 4 take
    R = 16 ms beside C = 3 s of compute. Overlapped on a quarter of the device (Megatron's DeepEP SMs),
    the compute runs 1/4 slower while they run: C + R/4, so R/4 of them stays exposed (not R − C < 0);
    2 blocks x 2 micro-batches. A share of 1 or more is one line."""
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])

    def priced(share):
        options = TrainingOptions("adam", "optimizer", overlap_expert_dispatch=True, expert_dispatch_compute_share=share)
        step = TrainingStep(moe_graph(), cluster, options, KernelOptions(True), Device(1e12, 1e12), 8, "none",
                            Layout(1, expert_parallel_width=2))
        return step.price(Placement(Layout(1, 1, 4, expert_parallel_width=2), ((0, 1, 2, 3),)))

    exchanges = 4 * 8e6 / 2 / 1e9
    assert priced(0.0).breakdown["expert_parallel"] == 0.0
    shared = priced(0.25)
    assert shared.breakdown["expert_parallel"] == pytest.approx(2 * 2 * exchanges / 4)
    assert shared.hidden["expert_parallel"] == pytest.approx(2 * 2 * exchanges * 3 / 4)
    with pytest.raises(InputError, match=r"^expert_dispatch_compute_share: 1; allowed: a number in \[0, 1\)$"):
        TrainingOptions(expert_dispatch_compute_share=1)
    assert check_error("run_solver", "model=mixtral-8x7b", "chip=h100_sxm", "system=dgx_h100",
                       "expert_dispatch_sms=132") == "expert_dispatch_sms: must be an integer in [0, 131], got 132"


def test_megatrons_2025_flop_count_gives_the_modelzoo_rows_published_tflops():
    """Megatron-LM's num_floating_point_operations as of 2025 (causal attention half, SwiGLU 3/2, the
    k routed experts' width): Qwen3-235B, 2,048 sequences of 4,096, by hand 12·B·s·L·h²·[(1 + 4/64 +
    s/2h)·(64·128/h) + 8·1536·3/2 / h + V/(2Lh)] = 1.2418e18 FLOPs; over the published seconds on 256
    GPUs it gives each row's published TFLOP/s (245, 276, 276, 200, 167) within 0.6 %. The long-context
    rows recompute the norms and whole MoE layers (--recompute-modules layernorm moe), as they state."""
    from phaze.validation.flops import megatron_model_flops
    h, s, layers = 4096, 4096, 94
    by_hand = 12 * 2048 * s * layers * h * h * ((1 + 4 / 64 + s / (2 * h)) * 64 * 128 / h + 8 * 1536 * 1.5 / h
                                                + 151936 / (2 * layers * h))
    for row in range(1, 6):
        run = RUNS[f"moezoo_qwen3_235b_h100_row{row}"]
        item = case(run)
        flops = megatron_model_flops(item.spec, 2048, s, item.width, attention=0.5)
        assert flops == pytest.approx(by_hand, rel=1e-12)
        assert flops / (256 * item.measured) / 1e12 == pytest.approx(run["measured"]["tflop_per_s_per_device"],
                                                                     rel=6e-3)
    long_context = case(RUNS["moezoo_qwen3_235b_longctx_seq32768_forced_balance"])
    assert (long_context.recompute, long_context.context_parallel_width, long_context.sequence_length) == (
        "layernorm+moe", 2, 32768)


def test_a_device_runs_its_experts_at_their_real_token_counts():
    """Split s = e·τ/t more ways than the width-t graph, a device's grouped expert products are E/s
    experts of ⌈s·C⌉ token rows (C the graph's capacity): the same multiply-accumulates, fewer
    weights, the tiles of that shape (on a GPU; on a template chip its own schedule)."""
    from estimator.roofline import waves
    from estimator.work import expert_shaped, expert_split_graph, op_work
    extracted = extract(TOY, 1, 16, 2)  # 4 experts, 2 a token: C = 16 x 2 / 4 = 8 rows each
    capacity = TOY.expert_capacity(16)
    (up, *_) = [node for node in extracted.op_graph.nodes if node.op == "grouped_linear"]
    assert (up.gemm.batch, up.gemm.m, capacity) == (4, 8, 8)
    for split, (batch, rows) in ((2, (2, 16)), (4, (1, 32)), (0.5, (8, 4))):
        shaped = expert_shaped(up, split)
        assert (shaped.gemm.batch, shaped.gemm.m, shaped.gemm.k, shaped.gemm.n) == (batch, rows, up.gemm.k, up.gemm.n)
        assert shaped.gemm.macs == up.gemm.macs
    # a forward tile count: 4 x 1 x 1 at s = 1 (8 rows, 48 columns), 1 x 1 x 1 at s = 4 (32 rows)
    assert waves(op_work(up, "forward").gemms[0], 132) == 4 / 132
    assert waves(op_work(expert_shaped(up, 4), "forward").gemms[0], 132) == 1 / 132
    split = expert_split_graph(extracted.op_graph, 4)
    assert {node.gemm.batch for node in split.nodes if node.op == "grouped_linear"} == {1}  # two traced blocks
    assert [node for node in split.nodes if node.op != "grouped_linear"] == [
        node for node in extracted.op_graph.nodes if node.op != "grouped_linear"]
