"""`phaze validate` on the calibration set's Llama runs: FP8 on H100, the time from tokens/s, the
Llama-family model of the run's shape and the settings taken from the framework's recipe."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from solver.training_step import TrainingOptions

from estimator.fusion import fuse_layers
from estimator.roofline import attention_seconds, group_bytes, layer_times, op_seconds
from graph_extract import KernelOptions, extract, get_spec
from graph_extract.attention import attention_kernels, causal_fraction
from graph_extract.zoo import LLAMA_FAMILY, ModelSpec
from phaze_hardware import known_chip
from phaze.validation.cases import case, prediction, sharded_or_context_parallel, validate

REPOSITORY = Path(__file__).resolve().parents[1]
CALIBRATION = REPOSITORY / "arch_configs" / "calibration" / "runs.json"
RUNS = {run["run_id"]: run for run in json.loads(CALIBRATION.read_text())}
H100 = known_chip("h100_sxm")
#: SC'21 Table 1 as phaze predicts it in 16 bits (seconds per iteration): adding FP8 left these unchanged;
#: pricing the collectives' latency by NCCL's flat ring moved them by 0.1 % at most.
DENSE = {"sc21_t1_1.7B": 3.4276125282100933, "sc21_t1_3.6B": 3.699038414690153, "sc21_t1_7.5B": 3.8889631060835526,
         "sc21_t1_18.4B": 10.169877098595334, "sc21_t1_39.1B": 15.840527035001132,
         "sc21_t1_76.1B": 15.91264267491543, "sc21_t1_145.6B": 25.335012201900618,
         "sc21_t1_310.1B": 36.820279932714875, "sc21_t1_529.6B": 51.42841846172265,
         "sc21_t1_1008.0B": 102.8025258590766}


def test_a_nemo_llama2_run_becomes_a_llama_model_of_its_shape():
    item = case(RUNS["nemo2407_LLAMA2-70B_64gpu"])
    # the zoo's Llama-2-70B (grouped-query, 8 key/value heads), vocabulary padded as Megatron pads it
    assert item.spec == get_spec("llama2-70b").with_overrides(name="llama2-70b", vocab_size=32000,
                                                              vocab_pad_multiple=128)
    assert (item.spec.norm, item.spec.activation, item.spec.position_embedding) == ("rmsnorm", "swiglu", "rotary")
    assert not item.spec.bias and not item.spec.tied_lm_head and item.spec.kv_heads == 8
    assert (item.chip, item.system, item.precision, item.devices) == ("h100_sxm", "dgx_h100", "fp8", 64)
    assert (item.width, item.stages, item.degree, item.virtual_stages) == (4, 4, 4, 20)
    assert (item.micro_batch_size, item.global_batch_size, item.sequence_length) == (1, 128, 4096)
    # NeMo 24.07 states 1,707 tokens/s per GPU: 128 x 4096 tokens / (1707 x 64) tokens per second
    assert item.time_from == "†" and item.measured == pytest.approx(128 * 4096 / (1707 * 64), rel=1e-12)
    # the launcher's llama2_70b.yaml: no recomputation, sequence parallel, distributed Adam overlapping the
    # gradient and weight syncs in bf16, userbuffers' tensor-parallel overlap
    assert (item.recompute, item.sequence_parallel) == ("none", True)
    assert item.training == TrainingOptions("adam", "optimizer", overlap_grad_reduce=True, grad_reduce_in_bf16=True,
                                            overlap_param_gather=True, tensor_parallel_overlap=True,
                                            master_weight_remainders=True)
    assert item.assumed == ("model shape", "recompute", "sequence parallel", "distributed optimizer",
                            "gradient-sync overlap", "weight-gather overlap", "tensor-parallel overlap",
                            "gradients in 16-bit", "master-weight remainders") and item.recipe == "NeMo 24.07"


def test_llama2_7b_is_multi_head_and_takes_no_sequence_parallelism_at_t_1():
    item = case(RUNS["nemo2407_LLAMA2-7B_8gpu"])
    assert item.spec == get_spec("llama2").with_overrides(name="llama2-7b", vocab_pad_multiple=128)
    assert item.spec.num_kv_heads is None and (item.width, item.stages, item.degree) == (1, 1, 8)
    assert not item.sequence_parallel and "sequence parallel" not in item.assumed
    assert item.measured == pytest.approx(128 * 4096 / (16847 * 8), rel=1e-12)


def test_a_megatron_bridge_llama3_run_derives_d_and_keeps_its_vocabulary():
    item = case(RUNS["mbridge2511_LLAMA3_70B_h100_64gpu"])
    assert item.spec == ModelSpec("llama3_70b", 80, 8192, 64, 28672, 128000, 8192, 8192, **LLAMA_FAMILY,
                                  vocab_pad_multiple=128, num_kv_heads=8)
    assert item.spec.padded_vocab_size(4) == 128000  # 128000 = 250 x 128 x 4: no padding at t = 4
    # data parallel is not stated: 64 devices / (t = 4 x p = 8 x cp = 1)
    assert (item.width, item.stages, item.degree, item.virtual_stages) == (4, 8, 2, 5)
    assert item.measured == pytest.approx(128 * 8192 / (1602 * 64), rel=1e-12)
    # "DDP (FSDP=0)" is stated; the distributed optimizer and the rest come from the recipe
    assert item.assumed == ("recompute", "sequence parallel", "distributed optimizer", "gradient-sync overlap",
                            "weight-gather overlap", "tensor-parallel overlap", "gradients in 16-bit")
    assert item.recipe == "Megatron-Bridge / NeMo 25.11"


def test_a_nemo_gpt3_run_takes_the_launcher_shape_and_a_nemotron_its_family():
    gpt = case(RUNS["nemo2407_GPT3-20B_64gpu"])
    assert (gpt.spec.num_layers, gpt.spec.hidden_size, gpt.spec.num_heads, gpt.spec.ffn_hidden_size) == (
        44, 6144, 48, 4 * 6144)
    assert (gpt.spec.vocab_size, gpt.spec.padded_vocab_size(2)) == (50257, 50432)  # GPT-2 BPE padded to 128 x 2
    assert (gpt.spec.norm, gpt.spec.activation, gpt.spec.tied_lm_head, gpt.spec.dropout) == ("layernorm", "gelu",
                                                                                              True, 0.1)
    assert gpt.training.tensor_parallel_overlap and gpt.sequence_parallel and gpt.precision == "fp8"
    nemotron = case(RUNS["nemo2407_Nemotron-340B_128gpu"])
    assert (nemotron.spec.activation, nemotron.spec.kv_heads, nemotron.spec.tied_lm_head, nemotron.spec.bias) == (
        "squared_relu", 8, False, False)
    # its yaml recomputes selectively and turns userbuffers off
    assert nemotron.recompute == "selective" and not nemotron.training.tensor_parallel_overlap
    # at t = 1 nothing overlaps tensor-parallel collectives
    assert not case(RUNS["nemo2407_GPT3-5B_64gpu"]).training.tensor_parallel_overlap


def test_a_megatron_core_weak_scaling_run_times_its_model_tflops_by_megatrons_formula():
    item = case(RUNS["mcore2024_weak_1.7B"])
    # 24 blocks of 2048, 16 heads, 4h GeLU, vocabulary 131,072, 192 sequences of 4,096, 408.8 TFLOP/s on 48 GPUs:
    # 12·B·s·L·h²·(1 + 1 + s/h + 4 + V/(2Lh)) FLOPs (Megatron's num_floating_point_operations)
    flops = 12 * 192 * 4096 * 24 * 2048**2 * (1 + 1 + 4096 / 2048 + 4 + 131072 / (2 * 24 * 2048))
    assert item.time_from == "§" and item.measured == pytest.approx(flops / (408.8e12 * 48), rel=1e-12)
    assert (item.precision, item.micro_batch_size, item.recompute) == ("16-bit", 1, "none")
    assert not item.spec.tied_lm_head and item.spec.activation == "gelu"
    # stated: the three overlaps; the distributed optimizer is implied by --overlap-param-gather; no tensor
    # parallelism at t = 1, so no sequence parallelism or userbuffers
    assert item.training == TrainingOptions("adam", "optimizer", overlap_grad_reduce=True, overlap_param_gather=True)
    assert item.assumed == ("recompute", "precision", "micro-batch")


@pytest.mark.parametrize("run_id, context, sharding, overlap", [
    ("nemo2407_LLAMA3-8B_8gpu", 2, "optimizer", False),  # the recipe's distributed Adam; t = 1
    # NeMo 24.07's llama3_70b.yaml: ub_tp_comm_overlap true (its FP8 example picks the FP8 userbuffers)
    ("nemo2407_LLAMA3-70B_64gpu", 2, "optimizer", True),
    ("mbridge2511_LLAMA3.1_405B_h100_1024gpu", 2, "optimizer", True),  # "DDP (FSDP=0)": distributed optimizer
    ("mbridge2511_LLAMA3_8B_h100_8gpu", 1, "full", False),  # Megatron-FSDP
])
def test_context_parallel_and_fully_sharded_llama_runs_are_predicted(run_id, context, sharding, overlap):
    item = case(RUNS[run_id])
    assert (item.context_parallel_width, item.training.data_parallel_sharding) == (context, sharding)
    assert item.training.tensor_parallel_overlap is overlap
    assert item.devices == item.width * item.stages * item.degree * context


@pytest.mark.parametrize("run_id, reported", [
    ("sc21_t2_ZeRO-3_174.6B_384gpu", True),  # DeepSpeed's ZeRO-3
    ("maxtext_v5p_32B_1x128", True),  # MaxText's fsdp axis
    ("nemo2407_LLAMA3-8B_8gpu", True),  # c = 2, the optimizer state sharded only
    ("mbridge2511_LLAMA3_70B_h100_64gpu", False),  # the distributed optimizer, c = 1
    ("sc21_t1_1.7B", False),
])
def test_validate_reports_the_sharded_and_context_parallel_runs_together(run_id, reported):
    assert sharded_or_context_parallel(case(RUNS[run_id])) is reported


def test_fp8_on_a_chip_without_fp8_is_left_out():
    run = json.loads(json.dumps(RUNS["nemo2407_LLAMA2-7B_8gpu"]))
    run["hardware"]["device_type"] = "A100 (DGX-A100)"
    assert case(run) == "FP8 precision: a100_80gb has no FP8 tensor cores"
    with pytest.raises(ValueError, match="precision: a100_80gb has no FP8 tensor cores"):
        known_chip("a100_80gb").check_precision("fp8")
    with pytest.raises(ValueError, match="precision: unknown 'fp4'; allowed: bf16, fp16, fp8"):
        KernelOptions(precision="fp4")


def tiny_llama_gemm():
    spec = ModelSpec("tinyllama", 2, 256, 8, 768, 1024, 128, 128, **LLAMA_FAMILY, num_kv_heads=2)
    graphs = extract(spec, 2, 128, 1)
    (fused,) = fuse_layers(graphs.op_graph, (1,))
    up = next(op for op in fused.ops if graphs.op_graph.nodes[op.members[0]].op == "linear"
              and graphs.op_graph.nodes[op.members[0]].gemm.n == 768)
    return graphs, up


def test_an_fp8_gemm_runs_at_the_fp8_peak_by_hand():
    graphs, up = tiny_llama_gemm()
    graph = graphs.op_graph
    gemm = graph.nodes[up.members[0]].gemm  # [2·128 x 256] @ [256 x 768], the SwiGLU gate
    assert (gemm.m, gemm.k, gemm.n) == (256, 256, 768)
    flops = 2 * 256 * 256 * 768
    split = [1.0] * len(graph.nodes)
    fp8 = KernelOptions(precision="fp8").fp8_operators(graph)
    assert fp8[up.members[0]] and sum(fp8) == 2 * 7  # q, k, v, o, gate, up, down of each of the two blocks
    # 2 x 6 = 12 output tiles of 128 x 128 on 132 SMs: one wave, 12/132 of the GPU busy; then the casts
    # to FP8 as their own kernels: forward the [256 x 256] input read in 16 bits and written in 8 bits
    # twice (as is and transposed), backward the [256 x 768] output gradient likewise
    fp8_rate, bf16_rate = H100.fp8_peak_flops * H100.fp8_matrix_efficiency, H100.peak_flops * H100.matrix_efficiency
    bandwidth = H100.hbm_bandwidth * H100.memory_efficiency
    assert op_seconds(graph, up, "forward", H100, split, fp8) == pytest.approx(
        flops / (fp8_rate * 12 / 132) + 256 * 256 * 4 / bandwidth, rel=1e-12)
    assert op_seconds(graph, up, "forward", H100, split) == pytest.approx(flops / (bf16_rate * 12 / 132), rel=1e-12)
    # backward: data gradient [256 x 768]·[768 x 256] (2 x 2 tiles), weight gradient (2 x 6 tiles)
    backward = flops / (fp8_rate * 4 / 132) + flops / (fp8_rate * 12 / 132) + 256 * 768 * 4 / bandwidth
    assert op_seconds(graph, up, "backward", H100, split, fp8) == pytest.approx(backward, rel=1e-12)
    # the FP8 product reads its input and weight in one byte an element and writes 16 bits
    assert group_bytes(graph, up, split, fp8) == 256 * 256 + 256 * 768 + 2 * 256 * 768
    assert group_bytes(graph, up, split) == 2 * (256 * 256 + 256 * 768 + 256 * 768)


def test_fp8_leaves_memory_bound_operators_as_in_16_bit():
    graphs, _ = tiny_llama_gemm()
    (fused,) = fuse_layers(graphs.op_graph, (1,))
    norm = fused.ops[0]  # the block's first RMSNorm: reads and writes [2, 128, 256] in 16 bits, and its weight
    assert graphs.op_graph.nodes[norm.members[0]].op == "rmsnorm"
    moved = 2 * (2 * 128 * 256 * 2) + 256 * 2
    split = [1.0] * len(graphs.op_graph.nodes)
    for precision in ("bf16", "fp8"):
        narrow = KernelOptions(precision=precision).fp8_operators(graphs.op_graph)
        assert op_seconds(graphs.op_graph, norm, "forward", H100, split, narrow) == pytest.approx(
            moved / (H100.hbm_bandwidth * H100.memory_efficiency), rel=1e-12)


def test_the_dense_16_bit_a100_predictions_are_as_calibrated():
    """Without the kernels' launch floor (added after the A100's fit) the predictions are those the
    efficiencies were fitted with; with it each is at least that and within 0.1 % of it (kernels of
    milliseconds barely feel a 7 us floor)."""
    predicted, _ = validate([RUNS[run_id] for run_id in DENSE], REPOSITORY / "outputs" / "cache")
    assert all(item.precision == "16-bit" and not item.time_from and not item.assumed for item, _ in predicted)
    unlaunched = dataclasses.replace(known_chip("a100_80gb"), kernel_host_seconds=0.0)
    assert {item.run_id: prediction(item, REPOSITORY / "outputs" / "cache", unlaunched).step.time_per_batch
            for item, _ in predicted} == DENSE
    for item, result in predicted:
        assert DENSE[item.run_id] <= result.step.time_per_batch <= 1.001 * DENSE[item.run_id]


def test_validate_prints_the_llama_rows_with_their_marks(tmp_path):
    (tmp_path / "runs.json").write_text(json.dumps([RUNS["sc21_t1_1.7B"], RUNS["nemo2407_LLAMA2-7B_8gpu"],
                                                    RUNS["megatron2020_mp_1B_DGX-2"]]))
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY), "COLUMNS": "200",
                   "XDG_CACHE_HOME": str(tmp_path / "xdg")}  # its graphs cached under tmp_path
    run = subprocess.run([sys.executable, "-m", "phaze", "validate", "runs.json"], cwd=tmp_path, capture_output=True,
                         text=True, env=environment)
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if "nemo2407_LLAMA2-7B_8gpu‡" in line)
    assert "h100_sxm" in row and "fp8" in row and f"{128 * 4096 / (16847 * 8):.4g}†" in row
    assert "‡ NeMo 24.07: NeMo-Framework-Launcher" in run.stdout
    assert "a100_80gb 16-bit: 1 runs" in run.stdout and "h100_sxm fp8: 1 runs" in run.stdout
    assert ("hardware V100 (DGX-2): not an A100 or B200 or GB200 or H100 or H200 or H800 or MI300X or TPU v4 or "
            "TPU v5e or TPU v5p or TPU v6e or Trillium: 1 (megatron2020_mp_1B_DGX-2)") in run.stdout


def test_fused_attention_flops_and_bytes_of_one_layer_by_hand():
    """The tiny Llama's block: 2 sequences of 128 tokens, 8 query heads of 32 and 2 key/value heads
    (grouped-query), causal; one 128 x 128 tile per (sequence, head) so the causal kernel computes
    the one diagonal tile whole."""
    graphs, _ = tiny_llama_gemm()
    graph = graphs.op_graph
    (kernel,) = [kernel for kernel in attention_kernels(graph) if kernel.layer == 1]
    assert kernel.fraction == 1.0 and causal_fraction(256, 256) == 3 / 4  # 2 x 2 tiles: 3 on or below
    # bytes (bf16): Q [2, 8, 128, 32], K and V before repeat_kv [2, 2, 128, 32], O as Q, fp32 log-sum-exp per row
    q, kv, o, lse = 2 * 8 * 128 * 32 * 2, 2 * 2 * 128 * 32 * 2, 2 * 8 * 128 * 32 * 2, 2 * 8 * 128 * 4
    assert (kernel.query_bytes, kernel.input_bytes, kernel.output_bytes) == (q, q + 2 * kv, o)
    assert kernel.forward_bytes == q + 2 * kv + o + lse and kernel.saved_bytes == q + 2 * kv + lse
    # FLOPs: QKᵀ and PV, 2 x (2·8 heads x 128 x 128 x 32) multiply-accumulates, 2 FLOPs each; backward 2.5x
    flops = 2 * 2 * (2 * 8 * 128 * 128 * 32)
    units = 2 * 8 * 1  # (sequence, head, query tile): 16 of the 132 SMs busy
    rate = H100.peak_flops * H100.attention_efficiency * units / 132
    bandwidth = H100.hbm_bandwidth * H100.memory_efficiency
    assert attention_seconds(graph, kernel, "forward", H100) == pytest.approx(
        max(flops / rate, kernel.forward_bytes / bandwidth), rel=1e-12)
    assert attention_seconds(graph, kernel, "backward", H100) == pytest.approx(
        max(2.5 * flops / rate, 2 * kernel.forward_bytes / bandwidth), rel=1e-12)
    # the layer's time holds the kernel instead of the unfused core's operators
    fused = layer_times(graph, 1, H100, KernelOptions())
    unfused = layer_times(graph, 1, H100, KernelOptions(flash_attention=False))
    assert fused.forward != unfused.forward and fused.attention_core_forward == 0.0
