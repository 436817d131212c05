"""The prices of the tensor-parallel plan search: the run chip's, and the corners of the box of an
architecture search's candidates' prices; a plan the ILP finds best at every corner is best inside
the box (its cost is linear in the prices), checked against searches at points inside; corners that
disagree keep the run chip's plan and say so."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np

from estimator import CandidateSpace
from graph_extract import get_spec
from phaze.plan_settings import search_prices
from phaze_hardware import DEFAULT_BUDGET, Cluster, known_chip, named_accelerator
from solver.auto_sharding.from_export import SearchSettings
from solver.auto_sharding.plan_files import search_width, search_width_at_prices

BERT = get_spec("bertlarge")


def toy_cluster(bandwidth: float, latency: float) -> Cluster:
    return Cluster.build("toy", 8, 4, [dict(name="scale-up", bandwidth=bandwidth, latency=latency, efficiency=0.5),
                                       dict(name="ib", bandwidth=50e9)])


def test_the_corners_of_the_candidates_prices_by_hand():
    """Two candidates of a template at 1 GHz whose tensor cores keep 0.5 of their peak: 2 cores of
    4 × 8 (2·2·4·8·1e9·0.5 = 64 GFLOP/s) and 64 of 128 × 128 (2·64·128·128·1e9·0.5 = 1,048.576
    TFLOP/s); two systems' scale-up links of 400 and 900 GB/s at efficiency 0.5 (200 and 450 GB/s)
    and latencies 2 and 5 µs. The run chip's price first (an H100's matrix rate on the first system's
    link), then the 2 × 2 × 2 corners; a template chip alone is priced by its own tensor cores."""
    template = dataclasses.replace(named_accelerator(DEFAULT_BUDGET), clock_hz=1e9, tensor_core_efficiency=0.5)
    columns = dict(num_tc=np.array([2, 64]), num_vc=np.array([1, 1]), width=np.array([4, 128]),
                   depth=np.array([8, 128]), glb_bytes=np.array([2**20, 2**20]), area=np.array([1.0, 2.0]))
    space = CandidateSpace(template, 10.0, columns)
    first, second = toy_cluster(400e9, 2e-6), toy_cluster(900e9, 5e-6)
    h100 = known_chip("h100_sxm")
    prices = search_prices(h100, None, first, space, [first, second])
    assert prices[0] == SearchSettings(chip_flops=h100.peak_flops * h100.matrix_efficiency, efficiency=1.0,
                                       link_bandwidth=200e9, link_latency=2e-6)
    corners = {(price.chip_flops, price.link_bandwidth, price.link_latency) for price in prices[1:]}
    assert corners == set(itertools.product((64e9, 1048.576e12), (200e9, 450e9), (2e-6, 5e-6)))
    assert all(price.efficiency == 1.0 for price in prices) and len(prices) == 9
    assert search_prices(None, template, first) == (SearchSettings(
        chip_flops=2 * template.num_tc * template.tc_width * template.tc_depth * 1e9 * 0.5, efficiency=1.0,
        link_bandwidth=200e9, link_latency=2e-6),)


def _price(flops: float, bandwidth: float) -> SearchSettings:
    return SearchSettings(chip_flops=flops, efficiency=1.0, link_bandwidth=bandwidth, link_latency=3e-6)


def _styles(flops: float, bandwidth: float) -> dict:
    plan, _ = search_width(BERT, 1, 512, 2, _price(flops, bandwidth), None)
    return dict(plan.styles)


def test_a_plan_best_at_every_corner_is_best_inside_the_box():
    """BERT-large at two ranks on chips of 150-300 TFLOP/s and links of 300-900 GB/s: Megatron's plan
    at the four corners (the ILP's search ties it), and so at points drawn inside the box, as the
    least cost over plans is concave in the prices."""
    corners = [_price(flops, bandwidth) for flops, bandwidth in itertools.product((150e12, 300e12), (300e9, 900e9))]
    plan, record = search_width_at_prices(BERT, 1, 512, 2, (_price(200e12, 450e9), *corners), None)
    assert record.prices_searched == 5 and record.same_plan_at_every_price and not record.searched
    draw = random.Random(7)
    for _ in range(3):
        assert _styles(draw.uniform(150e12, 300e12), draw.uniform(300e9, 900e9)) == dict(plan.styles)


def test_corners_that_choose_different_plans_keep_the_run_chips_plan(tmp_path):
    """From a chip of 8 GFLOP/s (compute dearest: Megatron's split) to one of 550 TFLOP/s on a 450
    GB/s link (BERT-large's blocks cheaper with fewer all-reduces: a searched plan), the corners
    disagree: the plan written is the run chip's (275 TFLOP/s: Megatron's), and the record says so."""
    reference = _price(275e12, 450e9)
    plan, record = search_width_at_prices(BERT, 1, 512, 2, (reference, _price(8e9, 450e9), _price(550e12, 450e9)),
                                          tmp_path)
    assert record.prices_searched == 3 and not record.same_plan_at_every_price
    assert dict(plan.styles) == _styles(275e12, 450e9) != _styles(550e12, 450e9)
