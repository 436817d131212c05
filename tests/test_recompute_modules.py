"""Megatron-Core's recompute modules (--recompute-granularity selective --recompute-modules): the modes'
names, what a traced block's modules hold and drop (by hand), their time, memory and re-run collectives
in the step (by hand), and the published runs that state them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phaze_common.checks import InputError
from graph_extract import KernelOptions, extract, get_spec
from graph_extract.layergraph import RecomputedModule
from graph_extract.regions import OP_LEVEL, attention_core, recompute_modules
from phaze_hardware import Cluster
from phaze.validation.cases import case, stated_modules
from solver.layout import Layout
from solver.question import Axes
from solver.training_step import (Device, Placement, StepGraph, StepLayer, TrainingOptions, TrainingStep,
                                  Recompute, held_activations, recompute_mode)
REPOSITORY = Path(__file__).resolve().parents[1]
CALIBRATION = REPOSITORY / "arch_configs" / "calibration" / "runs.json"
# A Llama-family mixture: first block dense (SwiGLU 96), then experts (4 of width 32, 2 per token)
MIXTURE = get_spec("mixtral-8x7b").with_overrides(
    num_layers=3, hidden_size=64, num_heads=8, num_kv_heads=2, ffn_hidden_size=96, vocab_size=500,
    max_position_embeddings=32, default_sequence_length=16, num_experts=4, experts_per_token=2,
    moe_ffn_hidden_size=32, first_dense_layers=1)


def test_each_mode_has_one_name_and_a_bad_one_is_one_line():
    assert recompute_mode("core_attn") == "selective"  # Megatron-Core's default module
    assert recompute_mode("moe_act+layernorm") == "layernorm+moe_act"  # in one (alphabetical) order
    assert recompute_mode("layernorm+core_attn") == "core_attn+layernorm"
    assert [recompute_mode(mode) for mode in ("none", "selective", "full")] == ["none", "selective", "full"]
    assert Recompute.of("selective") == Recompute(modules=frozenset({"core_attn"}))
    assert Recompute.of("full") == Recompute(full=True) and Recompute.of("none") == Recompute()
    assert Recompute.of("moe+layernorm") == Recompute(modules=frozenset({"layernorm", "moe"}))
    assert [Recompute.of(name).name for name in ("none", "full", "selective", "core_attn", "moe+layernorm")] == [
        "none", "full", "selective", "selective", "layernorm+moe"]
    assert Axes((1,), (1,), ("core_attn", "selective", "moe_act+layernorm")).recompute == (
        "selective", "layernorm+moe_act")
    assert Recompute.of("selective_op") == Recompute(modules=frozenset({OP_LEVEL}))
    assert Recompute.of("selective_op").name == "selective_op"
    with pytest.raises(InputError, match=r"^recompute: unknown 'attention'; allowed: none, selective, full, "
                                         r"selective_op \(torchtitan's operator-level selective checkpointing\), "
                                         r"product_outputs \(JAX's checkpoint_dots_with_no_batch_dims, MaxText's "
                                         r"remat_policy minimal\), or "
                                         r"Megatron-Core's recompute modules joined by '\+' \(core_attn, layernorm, "
                                         r"mla_up_proj, mlp, moe, moe_act, shared_experts; e.g. layernorm\+moe_act\)$"):
        recompute_mode("attention")
    with pytest.raises(InputError, match=r"^recompute: 'moe\+moe_act' recomputes moe, which re-runs moe_act "
                                         r"already; allowed: moe or moe_act, not both$"):
        recompute_mode("moe+moe_act")
    for bad in ("", "layernorm+", 3, None):
        with pytest.raises(InputError, match=r"^recompute: unknown"):
            recompute_mode(bad)


@pytest.mark.parametrize("t", [1, 2])
def test_a_traced_blocks_recompute_modules_by_hand(t):
    """b sequences of s tokens, width h, dense FFN f, E experts of width f_e, k a token, capacity C:
    layernorm drops the two norms' outputs (2·2bsh bytes: the dense block's QKV and FC1 inputs; in the
    mixture the router's input too, a view of the same norm); mlp the FFN's three tensors (up, gate
    and product outputs, 3·2bs·f/t; the fused SwiGLU rebuilds the SiLU output from the gate); moe_act
    the experts' product outputs (2·E·C·f_e/t)."""
    b, s = 2, 16
    h, f, experts, k, fe = 64, 96, 4, 2, 32
    extracted = extract(MIXTURE, b, s, t)
    capacity = MIXTURE.expert_capacity(b * s)
    dense, mixture = extracted.layer_graph.layers[1], extracted.layer_graph.layers[2]
    modules = {layer.name: {module.name: module for module in layer.recompute_modules} for layer in (dense, mixture)}
    assert set(modules["layers.0"]) == {"layernorm", "mlp", OP_LEVEL}
    assert set(modules["layers.1"]) == {"layernorm", "moe", "moe_act", OP_LEVEL}
    norm = modules["layers.0"]["layernorm"]
    assert norm.activation_bytes == norm.replicated_activation_bytes == 2 * 2 * b * s * h  # replicated: SP splits it
    assert modules["layers.1"]["layernorm"].activation_bytes == 2 * 2 * b * s * h
    mlp = modules["layers.0"]["mlp"]
    assert mlp.activation_bytes == 3 * 2 * b * s * f // t and mlp.replicated_activation_bytes == 0
    assert mlp.matrix_input_activation_bytes == 2 * b * s * f // t  # the product's output: FC2's input only
    assert mlp.forward_collective_bytes == ((2 * b * s * h,) if t > 1 else ())
    act = modules["layers.1"]["moe_act"]
    assert act.activation_bytes == 2 * experts * capacity * fe // t
    assert act.forward_collective_bytes == () and act.all_to_all_bytes == ()
    moe = modules["layers.1"]["moe"]
    assert moe.all_to_all_bytes == mixture.all_to_all_bytes == (2 * experts * capacity * h,) * 2
    assert moe.expert_forward_collective_bytes == mixture.expert_forward_collective_bytes
    # the operators: the norms are the blocks' two; moe_act is inside moe
    ids = recompute_modules(extracted.op_graph)
    assert {extracted.op_graph.nodes[i].module_path.split(".")[-1] for i in ids["layernorm"]} == {
        "attention_norm", "mlp_norm"}
    assert ids["moe_act"] < ids["moe"] and not ids["mlp"] & ids["moe"]
    assert {extracted.op_graph.nodes[i].op for i in ids["moe_act"]} == {"silu", "mul"}
    # torchtitan's operator-level policy: of the dense block's products in forward order (query, key,
    # value, dense, up, gate, down) it saves the 1st, 3rd, 5th and 7th and re-runs key, dense and gate,
    # with every other operator but the attention core and the collectives
    dense_products = {node.module_path.split(".")[-1]: node.id for node in extracted.op_graph.nodes
                      if node.layer == dense.id and node.kind == "gemm"}
    assert list(dense_products) == ["query", "key", "value", "dense", "up", "gate", "down"]
    assert {name for name, node in dense_products.items() if node in ids[OP_LEVEL]} == {"key", "dense", "gate"}
    assert not ids[OP_LEVEL] & attention_core(extracted.op_graph)
    assert ids["layernorm"] <= ids[OP_LEVEL]
    assert all(extracted.op_graph.nodes[i].kind not in ("allreduce", "alltoall") for i in ids[OP_LEVEL])
    # memory: what each mode keeps of the dense block (sequence parallelism divides the norms' by t)
    kernels = KernelOptions(sequence_parallel=True)
    step_layer = StepLayer(id=1, forward=0, backward=0, attention_core_forward=0, parameters=0,
                           activation_bytes=dense.fused_attention_activation_bytes,
                           replicated_activation_bytes=dense.replicated_activation_bytes, is_block=True,
                           fused_attention_activation_bytes=dense.fused_attention_activation_bytes,
                           recompute_modules=dense.recompute_modules)
    none = held_activations([step_layer], Recompute.of("none"), t, kernels)[0][0]
    held, working = held_activations([step_layer], Recompute.of("layernorm+mlp"), t, kernels)
    share = 1 - 1 / t
    assert none - held[0] == pytest.approx(4 * b * s * h * (1 - share) + 6 * b * s * f / t, rel=1e-12)
    assert working[0] == pytest.approx(6 * b * s * f / t, rel=1e-12)  # one FFN rebuilt at a time


@pytest.mark.parametrize("t", [1, 2])
def test_a_latent_attentions_up_projections_by_hand(t):
    """mla_up_proj (DeepSeek-V3 §3.2.3, Megatron-Core's module for multi-head latent attention): the
    query and key/value up projections and what runs after them up to the core (the rotary
    embedding's application, the joins, the scaling), not the down projections nor the latents'
    norms; it drops the core's inputs: Q and K, b·(a/t)·s·(d_nope + d_rope) each, and V,
    b·(a/t)·s·d_v, two bytes an element, with or without a fused kernel (which reads them as made)."""
    spec = get_spec("deepseek-v3").with_overrides(
        num_layers=2, hidden_size=256, num_heads=4, ffn_hidden_size=512, vocab_size=1000, num_experts=8,
        moe_ffn_hidden_size=128, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
        v_head_dim=32, first_dense_layers=1, max_position_embeddings=64)
    b, s, heads = 2, 64, 4 // t
    extracted = extract(spec, b, s, t)
    graph = extracted.op_graph
    ids = extracted.recompute_modules["mla_up_proj"]
    paths = {graph.nodes[i].module_path.rsplit(".", 1)[-1] for i in ids if graph.nodes[i].kind == "gemm"}
    assert paths == {"query_up", "key_value_up"}
    assert not any(graph.nodes[i].kind == "norm" for i in ids) and not ids & extracted.attention_core
    (module,) = [m for m in extracted.layer_graph.layers[1].recompute_modules if m.name == "mla_up_proj"]
    assert module.activation_bytes == 2 * b * heads * s * (2 * (32 + 16) + 32)
    assert module.fused_attention_activation_bytes is None  # the fused kernel reads the same Q, K and V
    assert "mla_up_proj" not in extract(MIXTURE, 1, 16, 1).recompute_modules  # no latents, no module


def module_graph() -> StepGraph:
    """Embedding, two MoE blocks (forward 1 s, at expert split 2 0.8 s), head; each block's layernorm
    (0.05 s, 2e5 bytes), moe (0.5 s, 6e5 bytes, its two 8 MB all-to-alls) and moe_act (0.1 s, 1e5 bytes)."""
    modules = (RecomputedModule("layernorm", 2e5, 2e5), RecomputedModule("moe", 6e5, all_to_all_bytes=(8e6, 8e6)),
               RecomputedModule("moe_act", 1e5))

    def layer(i, block):
        return StepLayer(id=i, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=4e6,
                         activation_bytes=1e6, is_block=block, expert_parameters=2e6 if block else 0.0,
                         all_to_all_bytes=(8e6, 8e6) if block else (),
                         expert_parallel_times=((2.0, 0.8, 1.6, 0.0, 0.0, 0.0, 0.0),) if block else (),
                         recompute_modules=modules if block else (),
                         module_forward=(("layernorm", 0.05), ("moe", 0.5), ("moe_act", 0.1)) if block else ())
    return StepGraph(1, tuple(layer(i, 0 < i < 3) for i in range(4)), ((0, 1, 1e6), (1, 2, 1e6), (2, 3, 1e6)))


@pytest.mark.parametrize("mode, rerun, exchanges, dropped, working", [
    ("none", 0.0, 4, 0.0, 0.0),
    ("moe_act", 0.1, 4, 1e5, 1e5),
    ("layernorm+moe", 0.05 + 0.5 - 0.2, 6, 2e5 + 6e5, 6e5),  # moe at split 2: 0.5 + (0.8 - 1.0)
])
def test_recompute_modules_in_the_step_by_hand(mode, rerun, exchanges, dropped, working):
    """One stage, d 4, e 2 (2 micro-batches), on one 1 GB/s tier: each all-to-all 4 ms (half of 8 MB
    leaves); a recomputed moe re-runs the forward's two; every block's modules' forward again each
    micro-batch; the activations without what the modules made, one module rebuilt at a time, in the
    room the head's 1e6 bytes leave once its backward ran (`stages.recompute_peak`): the largest module
    (6e5) adds nothing."""
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])
    step = TrainingStep(module_graph(), cluster, TrainingOptions("adam", "optimizer"), KernelOptions(True),
                        Device(1e12, 1e12), 8, mode, Layout(1, expert_parallel_width=2))
    result = step.price(Placement(Layout(1, 1, 4, expert_parallel_width=2), ((0, 1, 2, 3),), mode))
    assert result.breakdown["recompute"] == pytest.approx(2 * 2 * rerun, rel=1e-12)
    assert result.breakdown["expert_parallel"] == pytest.approx(2 * 2 * exchanges * 4e-3, rel=1e-12)
    assert result.breakdown["compute"] == pytest.approx(2 * (2 * 3.0 + 2 * 2.4), rel=1e-12)
    assert result.memory[0]["activations"] == pytest.approx(4e6 - 2 * dropped + max(working - 1e6, 0.0), rel=1e-12)


def test_recompute_modules_are_searched_and_predicted(tmp_path):
    """`phaze predict` takes a module set and writes its one name; a bad one is one line, status 2."""
    arguments = ["model=mixtral-8x7b", "+model.overrides.num_layers=2", "+model.overrides.hidden_size=256",
                 "+model.overrides.num_heads=8", "+model.overrides.ffn_hidden_size=512",
                 "+model.overrides.vocab_size=1024", "sequence_length=128", "chip=h100_sxm", "system=dgx_h100",
                 "global_batch_size=16", "micro_batch_size=2", "num_devices=8", "tensor_parallel_width=2",
                 "pipeline_parallel_width=1", "data_parallel_width=4", "expert_parallel_width=4"]
    run = subprocess.run([sys.executable, "-m", "phaze", "predict", *arguments, "recompute=moe_act+layernorm",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "run" / "prediction.json").read_text())
    assert record["inputs"]["recompute"] == "layernorm+moe_act" and record["breakdown_s"]["recompute"] > 0
    bad = subprocess.run([sys.executable, "-m", "phaze", "predict", *arguments, "recompute=moe+moe_act"],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "phaze: error: recompute: 'moe+moe_act' recomputes moe, which re-runs moe_act already; allowed: moe or "
        "moe_act, not both"]


def test_the_published_runs_state_their_modules():
    assert stated_modules("recompute modules: norm, act") == ("layernorm", "moe_act")  # the ModelZoo's table
    assert stated_modules("--recompute-granularity selective --recompute-modules layernorm moe") == ("layernorm", "moe")
    assert stated_modules("full (recompute column = 'full')") == ()
    runs = {run["run_id"]: run for run in json.loads(CALIBRATION.read_text())}
    assert case(runs["moezoo_qwen3_235b_h100_row1"]).recompute == "layernorm+moe_act"
    long_context = case(runs["moezoo_qwen3_235b_longctx_seq131072_dropless"])
    assert long_context.recompute == "layernorm+moe"
    # EP 8 x ETP 1 over t 4 x cp 8 x d 1 = 32 ranks: Megatron-Core folds the context ranks into the experts'
    assert (long_context.context_parallel_width, long_context.degree, long_context.expert_parallel_width) == (8, 1, 8)


def test_a_layers_recomputed_forward_by_mode():
    """What each mode re-runs of a layer's costs (the utilisation's busy time counts it)."""
    from solver.layer_costs import LayerCost
    cost = LayerCost(forward=2.0, backward=4.0, attention_core_forward=0.25, energy=0, tc_busy=0, vc_busy=0, tc_peak=0,
                     vc_peak=0, gap=0, module_forward=(("layernorm", 0.1), ("moe", 1.5),
                                                                        ("moe_act", 0.2)))
    assert [cost.recomputed(mode) for mode in ("none", "selective", "full", "layernorm+moe", "core_attn+moe_act")] == [
        0.0, 0.25, 2.0, 0.1 + 1.5, 0.25 + 0.2]
