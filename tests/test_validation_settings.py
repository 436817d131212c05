"""The settings a published run states (number format, FP8 scaling, FP8 weight gathers, CUDA graphs,
host offload) as phaze reads them, and the runs of today's hardware: left out with their reason
where phaze does not model them, predicted where it does."""

import pytest

from phaze.validation.cases import Case, case
from phaze.validation.runs import read_runs
from phaze.validation.settings import (StatedSettings, stated_cuda_graphs, stated_fp8_parameters, stated_fp8_recipe,
                                       stated_host_offload, stated_precision, stated_weight_dtype, unknown_variant, unmodelled_attention,
                                       whole_step_graphs)

RUNS = {run["run_id"]: run for run in read_runs("arch_configs/calibration/runs.json")}
GIB = 2**30


@pytest.mark.parametrize("precision, expected", [
    ("FP8-CS", "fp8"), ("FP8", "fp8"), ("MXFP8", "mxfp8"), ("FP8-CS (FP8-MX)", "mxfp8"), ("BF16", "bf16"),
    ("fp16", "fp16"), ("bfloat16 activations, float32 weights (base.yml defaults)", "bf16"),
    ("FP8 (torchao Float8 tensorwise dynamic scaling on nn.Linear; BF16 else)", "fp8")])
def test_the_number_format_a_run_states(precision, expected):
    assert stated_precision(precision) == expected


@pytest.mark.parametrize("precision, other, expected", [
    ("FP8-CS", "", "current"),  # Megatron-Bridge's name for current scaling
    ("FP8", "fp8 recipe: current scaling (torchao tensorwise dynamic scaling)", "current"),
    ("FP8", "fp8 recipe: delayed scaling (amax history 1024)", "delayed"),
    ("FP8", "", None),  # not stated
    ("MXFP8", "fp8 recipe: current scaling", None),  # MXFP8 is its own format, scaled per 32-element block
    ("BF16", "current scaling", None)])
def test_the_fp8_scaling_a_run_states(precision, other, expected):
    assert stated_fp8_recipe(precision, other) == expected


@pytest.mark.parametrize("run_id, dispatch", [
    ("mbridge2602_Qwen3_235B_a22B_b200_256gpu_mxfp8", "all_to_all"),  # alltoall; the base's DeepEP left unused
    ("mbridge2511_Qwen3_30B_a3B_b200_8gpu_mxfp8", "deduplicated"),  # flex with the DeepEP backend
    ("moezoo_qwen3_235b_h100_row4", "all_to_all"), ("moezoo_qwen3_235b_h100_row1", "deduplicated")])
def test_the_dispatcher_a_run_states(run_id, dispatch):
    assert case(RUNS[run_id]).training.expert_dispatch == dispatch


def test_cuda_graphs_fp8_weight_gathers_and_host_offload_as_stated():
    other = ("fp8 recipe: MXFP8; CUDA graphs: transformer_engine, scope attn, moe_router; dispatcher=HybridEP; "
             "FP8 parameter all-gather: yes; host offload of activations: yes (remat_policy custom)")
    assert stated_cuda_graphs(other) == "transformer_engine, scope attn, moe_router"
    assert stated_fp8_parameters(other) and stated_host_offload(other)
    assert stated_cuda_graphs("CUDA graphs: none; --overlap-grad-reduce") is None
    assert stated_cuda_graphs("") is None
    assert not stated_fp8_parameters("FP8 parameter all-gather: not stated")
    assert not stated_host_offload("synthetic data; CUDA graphs: none")


@pytest.mark.parametrize("precision, other, expected", [
    ("bfloat16 activations, float32 weights (base.yml defaults)", "", "float32"),
    ("BF16", "host offload of activations: yes; weight_dtype bfloat16; synthetic data", "bfloat16"),
    ("bfloat16 activations and bfloat16 weights (weight_dtype bfloat16)", "", "bfloat16"),
    ("BF16", "synthetic data", None),  # not stated: the recipe's
    ("FP8-CS", "", None)])
def test_the_weight_dtype_a_run_states(precision, other, expected):
    assert stated_weight_dtype(precision, other) == expected


@pytest.mark.parametrize("run_id, weight_dtype, shard_width", [
    ("tpurecipes_llama3.1_70b_v6e_32", "bfloat16", None),  # stated
    ("tpurecipes_gpt3_175b_v6e_256", "float32", None),  # MaxText's base.yml default, as the recipe
    ("maxtext_v4_22B_2x128", "float32", 64),  # stated; two slices, each its own shard group
    ("tpurecipes_llama3.1_405b_v6e_2x256", "float32", None),  # dcn_fsdp_parallelism 2: one group over both
    ("mbridge2602_LLAMA3.1_405B_gb200_256gpu", "mixed", None)])  # Megatron's master weights
def test_the_model_state_of_maxtext_runs(run_id, weight_dtype, shard_width):
    item = case(RUNS[run_id])
    assert isinstance(item, Case)
    assert item.training.weight_dtype == weight_dtype
    assert item.training.data_parallel_shard_width == shard_width


def test_what_phaze_leaves_out_and_what_it_prices():
    # a CUDA-graph scope capturing the whole step is priced as graphed, a partial one (TE's graphs of
    # the attention and the router) as eager
    assert whole_step_graphs("full_iteration (cuda_graph_impl local, cuda_graph_scope full_iteration)")
    assert whole_step_graphs("local, scope full (Megatron-Core per-layer graphs)")
    assert not whole_step_graphs("transformer_engine, scope attn, moe_router, moe_preprocess")
    assert not whole_step_graphs(None)
    assert unmodelled_attention("MoE decoder, GQA, sliding window attention (window 128)") == \
        "sliding-window attention: not modelled"
    assert unmodelled_attention("MoE decoder, multi-head latent attention (MLA)").startswith("multi-head latent")
    assert unmodelled_attention("dense decoder, GQA, SwiGLU") is None


def test_a_chip_variant_by_its_stated_memory():
    # 80 GiB = 85,899,345,920 B is sold as "80 GB"; 95e9 B as "95GB" (TPU v5p): both the known chip
    assert unknown_variant("H100 80GB", 80 * GIB) is None
    assert unknown_variant("TPU v5p 95GB", 95e9) is None
    assert unknown_variant("H100 (DGX-H100)", 80 * GIB) is None  # no size stated
    assert unknown_variant("H100 96GB HBM2e (Grand Teton)", 80 * GIB) == \
        "hardware H100 96GB HBM2e (Grand Teton): 96 GB, another variant than the 80 GiB chip phaze knows by that name"


# What each new run needs, read from its row (the lead's table of options to wire in).
NEEDS = {
    "mbridge2511_LLAMA3_8B_b200_8gpu": ("fp8", "current", False, "full_iteration (cuda_graph_impl local, "
                                        "cuda_graph_scope full_iteration)", False),
    "mbridge2602_LLAMA3_70B_gb200_64gpu_mxfp8": ("mxfp8", None, False, None, False),
    "mbridge2602_Qwen3_30B_a3B_gb200_8gpu": ("mxfp8", None, False, "transformer_engine, scope moe_router, moe_preprocess",
                                             False),
    "mbridge2602_Qwen3_235B_a22B_h100_256gpu": ("fp8", "current", False, None, False),
    "torchtitan_llama3.1_8b_h200_32gpu": ("fp8", "current", True, None, False),
    "torchtitan_llama3.1_8b_h100_96gb_8gpu": ("fp8", "current", False, None, False),
    "tpurecipes_llama3.1_70b_v6e_32": ("bf16", None, False, None, True),
}


@pytest.mark.parametrize("run_id", NEEDS)
def test_the_settings_each_new_run_states(run_id):
    settings = StatedSettings.of(RUNS[run_id]["training"])
    assert (settings.precision, settings.fp8_recipe, settings.fp8_parameters, settings.cuda_graphs,
            settings.host_offload) == NEEDS[run_id]


@pytest.mark.parametrize("run_id, reason", [
    ("mbridge2602_DeepSeekV3_gb200_256gpu", "multi-head latent attention: a run's row does not give its ranks"),
    ("maxtext6e_mistral_7b_v6e-8", "sliding-window attention: not modelled"),
    ("torchtitan_llama3.1_70b_h100_96gb_256gpu", "hardware H100 96GB HBM2e (Grand Teton, 500 W power limit): 96 GB"),
    ("mbridge2602_GPT_OSS_120B_h100_64gpu", "sliding-window attention: not modelled")])
def test_new_runs_phaze_does_not_model_are_left_out_with_their_reason(run_id, reason):
    found = case(RUNS[run_id])
    assert isinstance(found, str) and found.startswith(reason)


@pytest.mark.parametrize("run_id, seconds, layout", [
    # 256 sequences x 8,192 tokens / (1,621 tokens/s/GPU x 64 GPUs) = 2,097,152 / 103,744
    # = 20 + 22,272 / 103,744 = 20.2147 s; d = 64 / (t 4 x p 8) = 2
    ("mbridge2602_LLAMA3_70B_h100_64gpu", 20.2147, (4, 8, 2, 5, 1)),
    # 1,536 x 8,192 / (311 x 1,024) = 12,582,912 / 318,464 = 39.5 + 3,584 / 318,464 = 39.5113 s;
    # d = 1,024 / (8 x 8 x cp 2) = 8
    ("mbridge2602_LLAMA3.1_405B_h100_1024gpu", 39.5113, (8, 8, 8, 8, 2)),
    # 8,192 x 4,096 / (1,611 x 256) = 33,554,432 / 412,416 = 81 + 148,736 / 412,416 = 81.3606 s;
    # d = 256 / (2 x 8) = 16
    ("mbridge2602_Qwen3_235B_a22B_h100_256gpu", 81.3606, (2, 8, 16, 4, 1)),
])
def test_new_h100_runs_are_predicted_at_their_measured_step(run_id, seconds, layout):
    found = case(RUNS[run_id])
    assert isinstance(found, Case) and found.precision == "fp8"
    assert found.measured == pytest.approx(seconds, abs=1e-4)
    assert (found.width, found.stages, found.degree, found.virtual_stages, found.context_parallel_width) == layout


def test_the_earlier_fp8_current_scaling_runs_are_still_predicted():
    found = case(RUNS["mbridge2511_LLAMA3_70B_h100_64gpu"])
    # 128 x 8,192 / (1,602 x 64) = 1,048,576 / 102,528 = 10.2272 s
    assert isinstance(found, Case) and found.measured == pytest.approx(10.2272, abs=1e-4)
