"""Operator work forward and backward: GEMM derivation, vector-core cycles, all-reduce time."""

from __future__ import annotations

import pytest

from estimator import Gemm, op_work
from estimator.table import vector_cycles
from graph_extract.opgraph import GemmDims, OpNode


def node(kind: str, op: str, out: tuple[int, ...], inputs: tuple[tuple[int, ...], ...] = (), weights=(), gemm=None,
         **attrs) -> OpNode:
    return OpNode(0, kind, op, 1, op, "block", inputs or (out,), (out,), weights, gemm=gemm,
                  attrs=tuple(sorted(attrs.items())))


LINEAR = node("gemm", "linear", (2048, 1, 4096), ((2048, 1, 1024),), ((4096, 1024), (4096,)), GemmDims(1, 2048, 1024, 4096))
SCORES = node("bmm", "matmul", (2, 16, 512, 512), ((2, 16, 512, 64), (2, 16, 64, 512)), gemm=GemmDims(32, 512, 64, 512))


@pytest.mark.parametrize("op", [LINEAR, SCORES])
def test_backward_gemm_work_is_twice_forward(op):
    forward, backward = op_work(op, "forward"), op_work(op, "backward")
    assert forward.macs == op.gemm.macs
    assert backward.macs == 2 * forward.macs


def test_backward_gemms_are_data_and_weight_gradients():
    # Y[m x n] = X[m x k]·W[k x n]: dX = dY·Wᵀ is [m x n]·[n x k], dW = Xᵀ·dY is [k x m]·[m x n]
    assert op_work(LINEAR, "forward").gemms == (Gemm(1, 2048, 1024, 4096),)
    assert op_work(LINEAR, "backward").gemms == (Gemm(1, 2048, 4096, 1024), Gemm(1, 1024, 2048, 4096))
    assert op_work(SCORES, "backward").gemms == (Gemm(32, 512, 512, 64), Gemm(32, 64, 512, 512))


def test_layernorm_example_of_the_original():
    # LayerNorm of [2048, 1, 12288] on 2 VCs of width 128: ⌈elements/lanes⌉ = 98,304 cycles (the original's
    # LayerNorm cost: msr-fiddle/phaze at fed7cde, `wham/perf_wrappers/vector_core_estimator.py` line 499)
    work = op_work(node("norm", "layernorm", (2048, 1, 12288)), "forward")
    assert vector_cycles(work.vector, 256) == 98_304


def test_softmax_example_of_the_original():
    # Softmax of [12, 2048, 2048] on 256 lanes: rows·⌈n/lanes⌉ + 10 + 10·⌈elements/lanes⌉ =
    # 24,576·8 + 10 + 10·196,608 cycles (the original's Softmax cost, vector_core_estimator.py line 2639)
    work = op_work(node("softmax", "softmax", (12, 2048, 2048), dim=-1), "forward")
    assert vector_cycles(work.vector, 256) == 2_162_698
    assert vector_cycles(op_work(node("softmax", "softmax", (12, 2048, 2048), dim=-1), "backward").vector, 256) == 2 * 196_608


def test_binary_backward_costs_one_gradient_per_operand_at_the_output_size():
    # residual add of two [8, 1024] tensors: forward 1 cycle/element, backward one gradient each (the original
    # counts the larger operand twice when the first is the smaller; phaze costs each at the output size)
    add = node("elementwise", "add", (8, 1024), ((8, 1024), (8, 1024)))
    assert vector_cycles(op_work(add, "forward").vector, 128) == 64
    assert vector_cycles(op_work(add, "backward").vector, 128) == 128
    scaled = node("elementwise", "div", (8, 1024), ((8, 1024),))  # division by a Python scalar
    assert vector_cycles(op_work(scaled, "backward").vector, 128) == 10 * 64
    ratio = node("elementwise", "div", (8, 1024), ((8, 1024), (8, 1))) # broadcast denominator
    assert vector_cycles(op_work(ratio, "backward").vector, 128) == (10 + 11) * 64


def test_unary_tables():
    cycles = {op: vector_cycles(op_work(node("elementwise", op, (256,)), "forward").vector, 256)
              for op in ("gelu", "tanh", "silu", "dropout", "rsqrt", "exp")}
    assert cycles == {"gelu": 1, "tanh": 27, "silu": 14, "dropout": 2, "rsqrt": 15, "exp": 15}
    assert vector_cycles(op_work(node("elementwise", "sigmoid", (512,)), "backward").vector, 256) == 2 * 22


def test_comparisons_have_no_gradient():
    mask = node("elementwise", "lt", (512, 512), ((512, 512), (512, 512)))
    assert vector_cycles(op_work(mask, "forward").vector, 256) == 1024
    assert op_work(mask, "backward").vector == ()


def test_mean_costs_each_row_once():
    # mean over the last dim of [2048, 4096] on 256 lanes: 2048 rows x (16 adds + 10 for the divide)
    mean = node("reduction", "mean", (2048, 1), ((2048, 4096),), dim=-1)
    assert vector_cycles(op_work(mean, "forward").vector, 256) == 2048 * (16 + 10)
    total = node("reduction", "sum", (2048,), ((2048, 4096),), dim=-1)
    assert vector_cycles(op_work(total, "forward").vector, 256) == 2048 * 16
    assert vector_cycles(op_work(total, "backward").vector, 256) == 2048 * 4096 // 256


def test_free_operators_cost_nothing():
    for kind, op in [("shape", "view"), ("shape", "anything_shaped"), ("embedding", "embedding"), ("index", "gather")]:
        work = op_work(node(kind, op, (64, 64)), "forward")
        assert work.gemms == () and work.vector == ()


@pytest.mark.parametrize("kind, op", [("elementwise", "erfinv"), ("reduction", "argmax"), ("norm", "groupnorm"),
                                      ("softmax", "log_softmax"), ("embedding", "embedding_bag")])
def test_unknown_op_is_an_error(kind, op):
    with pytest.raises(ValueError, match=f"op: unknown '{op}' of kind '{kind}'"):
        op_work(node(kind, op, (4, 4)), "forward")


def test_collectives_do_no_core_work():
    # the tensor-parallel all-reduces are priced on the cluster (solver.training_step.cluster)
    for direction in ("forward", "backward"):
        reduce = node("allreduce", "allreduce", (2048, 1, 12288), direction=direction, group_size=8, reduce_op="sum")
        for when in ("forward", "backward"):
            work = op_work(reduce, when)
            assert work.gemms == () and work.vector == ()


@pytest.mark.parametrize("attrs, message", [(dict(direction="sideways", group_size=2), "allreduce.direction"),
                                            (dict(direction="forward", group_size=0), "allreduce.group_size")])
def test_bad_allreduce_attributes_are_errors(attrs, message):
    with pytest.raises(ValueError, match=message):
        op_work(node("allreduce", "allreduce", (4,), **attrs), "forward")


def test_bad_direction_is_an_error():
    with pytest.raises(ValueError, match="direction: must be 'forward' or 'backward'"):
        op_work(LINEAR, "sideways")
