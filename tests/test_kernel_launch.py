"""The launch floor of a GPU's kernels (`estimator.roofline`: eager PyTorch's host time per kernel, or a
CUDA graph's per-kernel cost) against hand counts, and where `cuda_graphs` means nothing."""

import dataclasses

import pytest

from estimator.roofline import launched, layer_times
from graph_extract import KernelOptions, extract, get_spec
from phaze_common.checks import InputError
from phaze_hardware import known_chip
from phaze.api import predict

H, L, A, S, V = 256, 2, 8, 128, 1024  # the tiny GPT of tests/test_predict.py
TINY = get_spec("megatrongpt3").with_overrides(num_layers=L, hidden_size=H, num_heads=A, ffn_hidden_size=4 * H,
                                                vocab_size=V, max_position_embeddings=S)
A100 = known_chip("a100_80gb")
# A GPT block (t = 1, FlashAttention) by hand, its kernels forward: layernorm, QKV product, the query's
# scaling, the attention kernel, the output product, dropout + residual add, residual add, layernorm,
# first MLP product + GeLU, second MLP product, dropout + residual add, residual add: 12. Backward the
# four products give two kernels each (data and weight gradient), the other eight one: 16. Its four
# tensor-parallel collectives are the cluster's, no kernel here.
FORWARD_KERNELS, BACKWARD_KERNELS = 12, 16


def test_a_layer_of_short_kernels_takes_its_kernels_times_the_floor():
    graphs = extract(TINY, 2, S, 1)
    # a floor of 1 s: every kernel of the tiny block (microseconds) is shorter
    slow_host = dataclasses.replace(A100, kernel_host_seconds=1.0, graph_kernel_seconds=0.25)
    eager = layer_times(graphs.op_graph, 1, slow_host, KernelOptions())
    assert eager.forward == pytest.approx(FORWARD_KERNELS * 1.0, rel=1e-5)
    assert eager.backward == pytest.approx(BACKWARD_KERNELS * 1.0, rel=1e-5)
    graphed = layer_times(graphs.op_graph, 1, slow_host, KernelOptions(cuda_graphs=True))
    assert graphed.forward == pytest.approx(FORWARD_KERNELS * 0.25, rel=1e-5)
    assert graphed.backward == pytest.approx(BACKWARD_KERNELS * 0.25, rel=1e-5)
    # the floor's share is the layer's time less its kernels' device time (no floor)
    device = layer_times(graphs.op_graph, 1, dataclasses.replace(A100, kernel_host_seconds=0.0), KernelOptions())
    assert eager.launch_forward == pytest.approx(eager.forward - device.forward, rel=1e-12)
    assert eager.launch_backward == pytest.approx(eager.backward - device.backward, rel=1e-12)
    assert (device.launch_forward, device.launch_backward) == (0.0, 0.0)


def test_a_kernel_longer_than_the_floor_is_unchanged():
    assert launched(3e-3, 1, 7e-6) == 3e-3  # a 3 ms GEMM: its roofline time
    assert launched(3e-6, 1, 7e-6) == 7e-6  # a 3 µs norm: the host's 7 µs
    assert launched(10e-6, 2, 7e-6) == 14e-6  # a backward product's two kernels of 10 µs in all


def test_the_breakdown_shows_the_launch_share_and_sums_to_the_time():
    layout = dict(model=TINY, chip="a100_80gb", system="dgx_a100", num_devices=8, global_batch_size=8,
                  sequence_length=S, micro_batch_size=2, tensor_parallel_width=2, pipeline_parallel_width=1,
                  data_parallel_width=4)
    result = predict(**layout)
    breakdown = result.breakdown_s
    assert breakdown["kernel_launch"] > 0
    assert sum(breakdown.values()) == pytest.approx(result.time_per_batch_s, rel=1e-12)
    graphed = predict(**layout, cuda_graphs=True)
    assert graphed.breakdown_s["kernel_launch"] < breakdown["kernel_launch"]
    assert graphed.time_per_batch_s < result.time_per_batch_s


def test_a_tpu_has_no_launch_floor():
    tpu = known_chip("tpuv4")
    assert (tpu.kernel_host_seconds, tpu.graph_kernel_seconds) == (0.0, 0.0)
    assert KernelOptions().record() == {"sequence_parallel": True, "flash_attention": True, "precision": "bf16"}


@pytest.mark.parametrize("keywords, message", [
    ({"chip": "tpuv4", "system": "tpuv4_pod"}, "cuda_graphs: tpuv4 is a template chip"),
    ({"system": "original", "chip": "a100_80gb", "sequence_parallel": False, "flash_attention": False,
      "framework_reserve_gb": 0}, "cuda_graphs: system=original has no cost for it; allowed: false"),
])
def test_cuda_graphs_is_refused_where_it_means_nothing(keywords, message):
    with pytest.raises(InputError, match=message):
        predict(model=TINY, num_devices=8, global_batch_size=8, sequence_length=S, micro_batch_size=2,
                tensor_parallel_width=1, pipeline_parallel_width=1, data_parallel_width=8, cuda_graphs=True, **keywords)
