"""The vectorised bounds of the bounded search: equal to the scalar definitions, never below the truth."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hydra import compose, initialize_config_module

from estimator import layer_workload
from estimator.workload import prepare_layer
from solver import bounds
from solver.bounds import distinct_columns, optimistic_throughputs
from phaze.settings import settings_from_config
from phaze_hardware import named_accelerator
from solver.search import Baseline, Search, evaluate_accelerator, worker_pool
from solver.search.outcomes import accelerator_costs, evaluate_candidates, refined_throughputs
from solver.search.resources import Resources, width_bounds
from solver.layer_costs import core_problem, schedule_problem
from solver.schedule import LayerShape, Op, ScheduleProblem, lower_bound
from solver.schedule.cache import SCHEDULE_DIGITS
from solver.schedule.lower_bound import mode_bound, path_and_work_bound


@pytest.fixture(params=[True, False], ids=["fused-attention", "unfused-attention"])
def res(request, tmp_path, tiny_settings):
    return Resources.build(tiny_settings(tmp_path, f"flash_attention={request.param}").search_context(1))


def test_candidate_prices_match_one_accelerator_at_a_time(res):
    graphs = res.graphs[2]
    prepared = prepare_layer(graphs.op_graph, 1, "backward", res.table, res.question.kernels)
    latency, parallel = prepared.candidate_prices(res.space)
    for index in (0, 17, 4321, len(res.space) - 1):
        one, every, _, _ = prepared.prices(res.space[index])
        assert latency[:, index].tolist() == one.tolist()
        assert parallel[:, index].tolist() == every.tolist()


def test_vectorised_lower_bound_equals_the_schedulers(res):
    graphs = res.graphs[1]
    for layer in (0, 1, 3):
        for direction in ("forward", "backward"):
            prepared = prepare_layer(graphs.op_graph, layer, direction, res.table, res.question.kernels)
            latency, parallel = prepared.candidate_prices(res.space)
            shape = LayerShape.of([op.core_type for op in prepared.ops], prepared.edges)
            vector = mode_bound(shape, latency, parallel, res.space.num_tc.astype(float), res.space.num_vc.astype(float))
            for index in (3, 999, 20000):
                accelerator = res.space[index]
                problem = schedule_problem(prepared.on(accelerator), accelerator)
                assert vector[index] == pytest.approx(lower_bound(problem), rel=1e-12)


def test_group_bounds_are_the_schedulers_bounds_of_each_problem(res):
    """The refinement's layer costs (every group, forward, backward and attention core) are the scalar
    `lower_bound` of the problems `solver.evaluate` schedules (rounded as the scheduler rounds them),
    candidate by candidate."""
    bounds = res.group_bounds()
    for width, graphs in res.graphs.items():
        for index in (0, 999, len(res.space) - 1):
            accelerator, costs = res.space[index], bounds[width].costs(index)
            for group in graphs.repeat_groups:
                forward, backward = (layer_workload(graphs.op_graph, group[0], direction, accelerator, res.table,
                                                    res.question.kernels)
                                     for direction in ("forward", "backward"))
                core = core_problem(forward, res.question.kernels.recomputed_core(graphs.attention_core), accelerator)
                # the problems as the scheduler solves them: rounded to SCHEDULE_DIGITS
                expected = (lower_bound(schedule_problem(forward, accelerator).rounded(SCHEDULE_DIGITS)),
                            lower_bound(schedule_problem(backward, accelerator).rounded(SCHEDULE_DIGITS)),
                            lower_bound(core.rounded(SCHEDULE_DIGITS)) if core is not None else 0.0)
                for layer in group:
                    cost = costs[layer]
                    assert (cost.forward, cost.backward, cost.attention_core_forward) == pytest.approx(expected, rel=1e-12)
    # selective recomputation re-runs the unfused attention core; a fused kernel keeps nothing to re-run
    assert any(cost.attention_core_forward > 0 for cost in costs.values()) != res.question.kernels.flash_attention


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_lower_bounds_on_random_dags(data):
    count = data.draw(st.integers(1, 7))
    cores = data.draw(st.lists(st.sampled_from(["TC", "VC", "TCandVC", "collective"]), min_size=count, max_size=count))
    ops = []
    for core in cores:
        latency = data.draw(st.floats(1e-6, 1e-2))
        parallel = latency if core == "collective" else data.draw(st.floats(1e-7, 1e-2))
        ops.append(Op(core, latency, parallel))
    edges = [(i, j) for i in range(count) for j in range(i + 1, count) if data.draw(st.booleans())]
    num_tc, num_vc = data.draw(st.sampled_from([1, 2, 8])), data.draw(st.sampled_from([1, 2, 4]))
    # the operators of many candidates at once: this one's column among others gives its scalar bound exactly
    latency = np.array([[op.latency, 2 * op.latency, op.latency] for op in ops])
    parallel = np.array([[op.parallel_latency, op.parallel_latency, op.parallel_latency / 3] for op in ops])
    vector = mode_bound(LayerShape.of(cores, edges), latency, parallel, np.array([num_tc, 1.0, 2.0]),
                        np.array([num_vc, 3.0, 1.0]))
    assert vector[0] == lower_bound(ScheduleProblem(ops, edges, num_tc, num_vc))
    plain = path_and_work_bound(LayerShape.of(cores, edges), latency, parallel, np.array([num_tc, 1.0, 2.0]),
                                np.array([num_vc, 3.0, 1.0]))
    assert np.all(vector >= plain * (1 - 1e-12))  # never looser (up to the sums' rounding)


@pytest.mark.parametrize("system", ["tpuv4_pod", "dgx_a100", "original"])
def test_bounds_never_below_the_exact_throughput(tmp_path, tiny_settings, system):
    res = Resources.build(tiny_settings(tmp_path, f"system={system}").search_context(1))
    hbm = 2**30
    optimistic = optimistic_throughputs(res.question, res.axes, res.graphs, res.space, res.group_bounds())
    indices = np.linspace(0, len(res.space) - 1, 25).round().astype(int).tolist()
    refined = refined_throughputs(res, indices, hbm)
    exact = [outcome.best(hbm).throughput for outcome in evaluate_candidates(res, indices)]
    assert any(value > 0 for value in exact) and all(bound.exact for bound in refined)
    for level0, level1, truth in zip(optimistic[indices], refined, exact):
        assert level0 >= level1.value >= truth
    # Cut at the best exact throughput: still bounds, the best candidate's exact, the rest below it.
    best = max(exact)
    cut = refined_throughputs(res, indices, hbm, best)
    for level1, bound, truth in zip(refined, cut, exact):
        assert bound.value >= truth
        if bound.exact:
            assert bound.value == level1.value
        else:
            assert bound.value < best and level1.value <= best * (1 + 1e-9)
    assert cut[exact.index(best)].exact


#: A mixture at toy size on TPU v4's pod: 4 experts of a two-block Mixtral, split over e = 1, 2, 4.
TINY_MIXTURE = [
    "model=mixtral-8x7b", "+model.overrides.num_layers=2", "+model.overrides.hidden_size=256",
    "+model.overrides.num_heads=8", "+model.overrides.num_kv_heads=2", "+model.overrides.ffn_hidden_size=512",
    "+model.overrides.num_experts=4", "+model.overrides.vocab_size=1000",
    "+model.overrides.max_position_embeddings=128", "sequence_length=128", "max_tensor_parallel_width=2",
    "global_batch_size=64", "num_devices=16", "hbm_size=1", "expert_parallel_width=[1,2,4]",
    "system=tpuv4_pod"]


def test_a_mixtures_bounds_hold_at_every_expert_split(tmp_path):
    """On a template chip each expert split is priced apart (E/s experts of s times the tokens: fewer
    expert weights to read), so a layer can be faster at e > 1 than at e = 1: the group bounds take
    the least over the splits searched, and stay above every exact throughput."""
    with initialize_config_module("phaze.conf", version_base="1.3"):
        cfg = compose("config", overrides=["mode=run_solver", f"cache_dir={tmp_path}", *TINY_MIXTURE])
    res = Resources.build(settings_from_config(cfg).search_context(1))
    assert res.axes.expert_splits(2) == (0.5, 2.0, 4.0) and res.axes.expert_splits(1) == (2.0, 4.0)
    hbm = 2**30
    optimistic = optimistic_throughputs(res.question, res.axes, res.graphs, res.space, res.group_bounds())
    indices = np.linspace(0, len(res.space) - 1, 6).round().astype(int).tolist()
    exact = [outcome.best(hbm).throughput for outcome in evaluate_candidates(res, indices)]
    assert any(value > 0 for value in exact)
    refined = refined_throughputs(res, indices, hbm)
    for level0, level1, truth in zip(optimistic[indices], refined, exact):
        assert level0 >= level1.value >= truth
    # the split schedules: fewer expert weights to read; each above its group's bound
    bounds, faster = res.group_bounds(), 0
    for index in indices:
        costs = accelerator_costs(res, res.space[index])
        for width, splits in ((1, [2.0, 4.0]), (2, [0.5, 2.0, 4.0])):
            row = next(i for i, group in enumerate(bounds[width].groups) if 1 in group)  # the first block's group
            layer = costs[width][1]
            assert [entry[0] for entry in layer.expert_parallel_times] == splits
            floor = bounds[width].forward[row, index] + bounds[width].backward[row, index]
            assert all(entry[1] + entry[2] >= floor * (1 - 1e-9) for entry in layer.expert_parallel_times)
            faster += sum(entry[1] < layer.forward for entry in layer.expert_parallel_times if entry[0] > 1)
    assert faster >= len(indices)  # on most chips a wider split reads fewer weights and runs faster


def test_bounds_are_kept_in_the_cache_folder(res):
    """The group bounds and the level-0 throughputs are computed once per context and read back; a
    damaged file is set aside and the bounds computed again, the same."""
    computed, bounds = res.optimistic(), res.group_bounds()
    folder = res.context.cache_dir / "group_bounds"
    assert sorted(path.name for path in folder.glob("*.npz")) == sorted(
        [f"{res.context.bounds_key}.npz", f"{res.context.optimistic_key}.npz"])
    read = Resources.build(res.context)
    assert np.array_equal(read.optimistic(), computed)
    for width, found in read.group_bounds().items():
        assert found.groups == bounds[width].groups
        assert np.array_equal(found.forward, bounds[width].forward)
        assert np.array_equal(found.attention_core, bounds[width].attention_core)
    for path in folder.glob("*.npz"):
        path.write_bytes(path.read_bytes()[:100])
    healed = Resources.build(res.context)
    assert np.array_equal(healed.optimistic(), computed)
    assert len(list(folder.glob("*.corrupt"))) == 2


def test_prepare_computes_the_group_bounds_and_the_baselines_on_the_workers(tmp_path, tiny_settings):
    """`Search.prepare` hands every width's group bounds and the baselines to two worker processes:
    the bounds are the ones computed here, stored in the cache folder, and each baseline's
    evaluations are in the caches, so the driver reads them without computing."""
    context = tiny_settings(tmp_path).search_context(1)
    resources = Resources.build(context)
    chip = named_accelerator("tpuv4_like")
    other = dataclasses.replace(context, axes=context.axes.at(memory_capacity=2**31))
    baselines = [Baseline(context, resources.space[17], 17), Baseline(other, chip)]
    pool = worker_pool("local", 2)
    try:
        Search(resources, pool).prepare(baselines)
    finally:
        pool.close()
    expected = width_bounds(Resources.build(context), list(resources.graphs))
    assert list(resources.group_bounds()) == list(resources.graphs)
    for (width, found), wanted in zip(resources.group_bounds().items(), expected):
        assert np.array_equal(found.columns(), wanted.columns()), width
    assert len(list((tmp_path / "group_bounds").glob("*.npz"))) == 1
    assert evaluate_accelerator(resources, resources.space[17], 17, compute=False) is not None
    assert evaluate_accelerator(Resources.build(other), chip, compute=False) is not None


@pytest.mark.parametrize("colliding", [False, True], ids=["hashed", "every-hash-equal"])
def test_distinct_columns_groups_equal_columns_bit_for_bit(monkeypatch, colliding):
    """Each distinct column once (as numpy's lexicographic unique finds them), every column rebuilt
    from its representative; with every hash equal, the check sends it to the lexicographic way."""
    if colliding:
        monkeypatch.setattr(bounds, "_hash_multipliers", lambda count: np.zeros(count, np.uint64))
    rng = np.random.default_rng(3)
    for _ in range(50):
        palette = rng.choice([0.0, -0.0, 1.5, 3e-9, np.inf], size=(int(rng.integers(1, 6)), int(rng.integers(1, 12))))
        values = palette[:, rng.integers(0, palette.shape[1], int(rng.integers(1, 200)))]
        first, inverse = distinct_columns(values)
        bits = values.view(np.uint64)
        assert np.array_equal(bits[:, first][:, inverse], bits)
        assert len(first) == len(np.unique(bits, axis=1).T)
