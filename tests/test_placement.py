"""Placement DP: golden cases of the original program, hand-computed stage costs, JSON CLI, input errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from solver.placement import (
    FixedStrategy,
    PlacementEdge,
    PlacementGraph,
    PlacementLayer,
    PlacementSettings,
    place_original,
)
from solver.placement.__main__ import main
from solver.placement.candidates import chain_space
from solver.placement.first_stage import candidates
from solver.placement.jsonio import parse_document, solve_document
from solver.placement.layer_graph import topological_order, width_graph
from solver.training_step.original import stage_cost

DATA = Path(__file__).parent / "data" / "placement"
GOLDEN = [
    "ex1_chain4_t1",
    "ex2_chain12_t124_norecompute",
    "ex3_chain12_t124_recompute",
    "ex4_chain12_t124_mask_adam_recompute",
]


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize("case", GOLDEN)
def test_golden_output_is_identical(case):
    assert solve_document(load(f"{case}.in.json")) == load(f"{case}.out.json")


@pytest.mark.parametrize("case", GOLDEN)
def test_cli_writes_the_original_bytes(case, tmp_path):
    output = tmp_path / "out.json"
    assert main([str(DATA / f"{case}.in.json"), str(output)]) == 0
    assert output.read_text() == (DATA / f"{case}.out.json").read_text()


def test_breakdown_of_the_worked_example_sums_to_its_time():
    # ex1: d=2, m=8, 4 stages, bottleneck load 7 (fw 2 + bw 4 of layer 1, plus two 0.5 receives)
    graphs, settings = parse_document(load("ex1_chain4_t1.in.json"))
    result = place_original(graphs, settings)
    assert result.breakdown == {"compute": 8 * 6.0, "recompute": 0.0, "tensor_parallel": 0.0, "expert_parallel": 0.0, "bubble": 3 * 7.0,
                                "pipeline_transfer": 8 * 1.0, "data_parallel_sync": 2.0, "optimizer": 0.0}
    assert sum(result.breakdown.values()) == result.time_per_batch == 79.0


def test_infeasible_baseline_keeps_the_dp_result():
    # ex5 is ex2 with an out-of-memory baseline; the original exits 1 and writes nothing.
    run = load("ex5_fail_fixed_baseline_oom.run.json")
    expected = dict(load("ex2_chain12_t124_norecompute.out.json"), fixedStrategyTimePerBatch=None)
    out = solve_document(load("ex5_fail_fixed_baseline_oom.in.json"))
    reason = out.pop("fixedStrategyInfeasibleReason")
    assert out == expected
    assert run["returncode"] == 1
    assert reason.startswith(run["stdout"].removeprefix("FAIL: ").strip())


def test_diamond_is_placed_where_the_original_gives_up():
    # Same layers as ex1 (fw 1,2,2,1; bw 2,4,4,2; edges 0.5 s) but 0 -> {1, 2} -> 3. Single-layer
    # stages cost 3.5, 7, 7, 3.5 (layer 3 waits for two 0.5 s transfers in parallel); memory
    # forces 4 stages as in ex1, so d=2: 7 × (8 + 4 - 1) + 4·1·100/100/2 = 79.
    assert load("ex6_fail_branching_diamond.run.json")["stdout"].startswith("FAIL: branching")
    out = solve_document(load("ex6_fail_branching_diamond.in.json"))
    assert out["finalTimePerBatch"] == 79.0
    assert (out["dataParallelDegree"], out["tensorParallelDegree"]) == (2, 1)
    assert sorted(stage["nodes"][0] for stage in out["stages"]) == [0, 1, 2, 3]
    assert out["fixedStrategyTimePerBatch"] == 79.0


# [i, j) -> (wo, wr, P, maxS) of the 4-layer chain of ex1, worked out by hand with the original's stage
# cost (`getLoadOfStageForA`, msr-fiddle/phaze at fed7cde, Solver/device_placement/device_placement.cpp)
EX1_INTERVALS = {
    (0, 1): (3.5, 4.0, 100, 4),
    (0, 2): (9.5, 12, 300, 1),
    (0, 3): (15.5, 20, 500, 0),
    (0, 4): (18, 24, 600, 0),
    (1, 2): (7.0, 8.5, 200, 3),
    (1, 3): (13.0, 16.5, 400, 1),
    (1, 4): (15.5, 20.5, 500, 0),
    (2, 3): (7.0, 8.5, 200, 3),
    (2, 4): (9.5, 12.5, 300, 2),
    (3, 4): (3.5, 4.5, 100, 8),
}


@pytest.mark.parametrize("recompute", [False, True])
def test_stage_costs_match_the_worked_example(recompute):
    graphs, settings = parse_document(load("ex1_chain4_t1.in.json"))
    settings = replace(settings, activation_recomputation=recompute)
    graph = width_graph(graphs[1], 1, topological_order(graphs[1]))
    for (i, j), (wo, wr, parameters, max_s) in EX1_INTERVALS.items():
        cost = stage_cost(graph, list(range(i, j)), settings)
        assert cost.load_last == wo and cost.parameter_bytes == parameters
        assert cost.load_inner == (wr if recompute else wo)
        if not recompute:
            assert cost.max_in_flight == max_s
    # the chain's candidate stages (suffix of length L, stage lengths 1..L) carry the same costs
    chain = candidates(graph, settings, chain_space(4))
    for state in range(1, 5):
        for pair in chain.space.pairs(state):
            positions = chain.space.stage_positions(pair)
            assert positions == list(range(4 - state, 4 - state + len(positions)))
            wo, wr, parameters, _ = EX1_INTERVALS[positions[0], positions[-1] + 1]
            assert (chain.costs.load_last[pair], chain.costs.load_inner[pair]) == (wo, wr if recompute else wo)


def diamond(recompute: bool) -> tuple[object, PlacementSettings]:
    graphs, settings = parse_document(load("ex6_fail_branching_diamond.in.json"))
    settings = replace(settings, activation_recomputation=recompute)
    return width_graph(graphs[1], 1, topological_order(graphs[1])), settings


def test_branching_stage_runs_its_layers_one_after_another():
    graph, settings = diamond(recompute=True)
    assert graph.ids == (0, 2, 1, 3)  # the original's stack order: last pushed source first
    whole = stage_cost(graph, [0, 1, 2, 3], settings)
    # forward 1+2+2+1 and backward 2+4+4+2, serial; the recompute run adds the forward again
    assert (whole.load_last, whole.load_inner) == (18.0, 24.0)
    middle = stage_cost(graph, [1, 2], settings)
    # forward: layer 2 waits 0.5 for its input, 2.5; layer 1 (input already there) ends 4.5.
    # backward: layer 1 waits 0.5 for its gradient, 4.5; layer 2 ends 8.5. Recompute: 4 + 4 + 4.
    assert (middle.load_last, middle.load_inner) == (13.0, 16.5)
    # memory: 2·400 + 600 resident; stashed per micro-batch: the two 50-byte inputs (recompute)
    assert (middle.resident_bytes, middle.stash_bytes, middle.max_in_flight) == (1400.0, 100.0, 2)
    no_recompute = stage_cost(graph, [1, 2], diamond(recompute=False)[1])
    assert (no_recompute.stash_bytes, no_recompute.max_in_flight) == (600.0, 1)


def layer(layer_id: int, tensor_parallel: bool = False, size: float = 1.0) -> PlacementLayer:
    return PlacementLayer(layer_id, size, size, 1.0, 2.0, tensor_parallel)


def test_baseline_with_an_empty_stage_counts_it_in_the_bubble():
    # ex1 with p=3, L=4: ceil(4/3) = 2 layers per stage, so stages [0,1], [2,3] and an empty one.
    # Memory never binds: max load 9.5 (EX1_INTERVALS), d=1, m=16: 9.5 × (16 + 3 - 1) = 171.
    graphs, settings = parse_document(load("ex1_chain4_t1.in.json"))
    settings = replace(settings, memory_per_device=1e9, fixed_baseline=FixedStrategy(3, 1, 1, 4))
    assert place_original(graphs, settings).fixed_baseline_time == 171.0
    too_long = place_original(graphs, replace(settings, fixed_baseline=FixedStrategy(3, 1, 1, 5)))
    assert too_long.fixed_baseline_time is None and "exceeds" in too_long.fixed_baseline_infeasible_reason


def test_no_width_fits_gives_an_infeasible_result():
    graph = PlacementGraph((layer(0, size=100.0), layer(1, size=100.0)), (PlacementEdge(0, 1, 1.0),))
    settings = PlacementSettings(4, 50.0, 1.0, 4, fixed_baseline=FixedStrategy(1, 1, 1, 2))
    result = place_original({1: graph}, settings)
    assert not result.feasible and result.stages == () and result.time_per_batch == math.inf
    assert result.fixed_baseline_time is None
    assert result.fixed_baseline_infeasible_reason.startswith("memory usage too high")


def test_memory_per_stage_counts_the_micro_batches_in_flight():
    # ex1's optimum: 4 single-layer stages; stage q-th from the end holds 2P + A + (q-1)·A bytes
    graphs, settings = parse_document(load("ex1_chain4_t1.in.json"))
    result = place_original(graphs, settings)
    assert [stage.memory_bytes for stage in result.stages] == [200 + 300 * 4, 400 + 300 * 3, 400 + 300 * 2, 200 + 100]
    assert [stage.memory["weights"] for stage in result.stages] == [100, 200, 200, 100]
    assert [stage.memory["activations"] for stage in result.stages] == [300 * 4, 300 * 3, 300 * 2, 100]


def test_cli_reports_malformed_input_in_one_line(tmp_path):
    document = load("ex1_chain4_t1.in.json")
    document["nodes"]["1"][2]["parameterSize"] = -5
    source = tmp_path / "in.json"
    source.write_text(json.dumps(document))
    run = subprocess.run(
        [sys.executable, "-m", "solver.placement", str(source), str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert run.returncode == 2 and not (tmp_path / "out.json").exists()
    assert run.stderr.count("\n") == 1 and 'nodes["1"][2]: parameterSize' in run.stderr


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.pop("bandwidth"), "bandwidth"),
        (lambda d: d.update(activationRecomputation=1), "activationRecomputation"),
        (lambda d: d.update(optimizerAlgorithm="Adagrad"), "optimizerAlgorithm"),
        (lambda d: d.update(maxDevices=0), "maxDevices"),
        (lambda d: d.update(mbsInBatch=0.5), "mbsInBatch"),
        (lambda d: d["nodes"]["1"][0].update(isTensorParallelized=True), "tensor_parallel"),
        (lambda d: d["edges"]["1"].append({"sourceId": 3, "destId": 0, "communicationCost": 1}), "cycle"),
        (lambda d: d["edges"]["1"].append({"sourceId": 0, "destId": 9, "communicationCost": 1}), "unknown layer"),
        (lambda d: d["edges"].update({"2": []}), "width keys"),
        (lambda d: d.update(fixedPP=0), "fixedPP"),
        (lambda d: d["nodes"].update({"1": []}), "must not be empty"),
    ],
)
def test_malformed_input_names_the_field(change, field):
    document = load("ex1_chain4_t1.in.json")
    change(document)
    with pytest.raises(ValueError, match=field):
        solve_document(document)


def test_typed_settings_reject_unknown_options():
    with pytest.raises(ValueError, match="optimizer"):
        PlacementSettings(8, 1e9, 1e9, 4, optimizer="Adagrad")
    with pytest.raises(ValueError, match="forward_latency"):
        PlacementLayer(0, 1.0, 1.0, float("nan"), 1.0, False)


def test_table_size_does_not_depend_on_the_cluster_size():
    # 10,000 devices (the largest cluster accepted) on ex1's chain with memory that never binds:
    # d = B = 16 (m = 1) is best; time = max load × p + 4·15/16 · P_first / 100 (EX1_INTERVALS):
    # p=1: 18 + 22.5; p=2 [0,2)[2,4): 9.5·2 + 11.25 = 30.25; p=3: 9.5·3 + 3.75; p=4: 7·4 + 3.75.
    # d=8 (m=2) at best gives 7·5 + 3.5 = 38.5.
    graphs, settings = parse_document(load("ex1_chain4_t1.in.json"))
    settings = replace(settings, devices=10_000, memory_per_device=1e12)
    result = place_original(graphs, settings)
    assert result.time_per_batch == 30.25 and result.layout.data_parallel_width == 16
    assert [stage.layer_ids for stage in result.stages] == [(0, 1), (2, 3)]
