"""The parallel layout: its rules (one place), the layouts a search enumerates against a brute force over
every width, and its rank groups."""

import itertools
import random

import pytest

from phaze_common.checks import InputError
from phaze_hardware import Group
from solver.layout import FitRules, Layout, allowed_virtual_stages, data_parallel_widths, layouts


def test_a_layout_is_positive_integer_widths():
    assert Layout(8, 16, 8).devices == 1024 and Layout(2, 3, 4, context_parallel_width=2).devices == 48
    assert Layout(8, 16, 8, 2, 4).shard == Layout(8, expert_parallel_width=4)
    assert Layout(8, 16, 8, 2, 4).text() == "t=8 p=16 d=8 v=2 e=4"
    for field, value in (("tensor_parallel_width", 0), ("data_parallel_width", 1.5), ("virtual_stages", True)):
        with pytest.raises(InputError, match=f"^{field}: must be a positive integer, got {value!r}$"):
            Layout(**{field: value})


RULES = FitRules(num_devices=64, micro_batches=32, layers=10, blocks=8, experts=8)


@pytest.mark.parametrize("layout, problem", [
    (Layout(2, 4, 8), None),
    (Layout(2, 4, 16), "devices: 4 stages x 2 x 16 replicas need 128, the cluster has 64"),
    (Layout(1, 2, 3), "data_parallel_width: 3 does not divide the 32 micro-batches per batch "
                      "(global_batch_size / micro_batch_size)"),
    (Layout(1, 2, 4, expert_parallel_width=3), "expert_parallel_width: 3 does not divide the 8 experts"),
    (Layout(1, 2, 2, expert_parallel_width=4), "expert_parallel_width: 4 does not divide data_parallel_width=2 "
                                               "(the experts are split over data-parallel replicas)"),
    (Layout(1, 1, 4, 2), "virtual_stages: interleaving needs pipeline_parallel_width >= 2"),
    (Layout(1, 4, 16, 2), "virtual_stages: the interleaved schedule needs the 2 micro-batches per replica to be a "
                          "multiple of pipeline_parallel_width=4"),
    (Layout(1, 2, 2, 3), "virtual_stages: 2 stages x 3 virtual stages do not divide the 8 blocks; allowed with "
                         "pipeline_parallel_width=2: 1, 2, 4"),
    (Layout(1, 11, 2), "pipeline_parallel_width: 11 stages for 10 layers; allowed: at most 10"),
    (Layout(1, 3, 2), None),  # the DP splits the layers any way
])
def test_the_rules_name_the_width_they_break(layout, problem):
    assert RULES.problem(layout) == problem


def test_a_given_layout_uses_every_device_and_megatron_split():
    rules = FitRules(20, 40, 96, 94, whole_cluster=True, split="even_or_ends")  # Qwen3's 94 blocks
    assert rules.problem(Layout(2, 5, 2)) == ("pipeline_parallel_width: 5 stages divide neither the 94 blocks nor "
                                              "94 + 2 (embedding and loss counted); allowed: 1, 2, 3, 4, 6, 8, 12, 16, "
                                              "24, 32, 47, 48, 94, 96")
    assert rules.problem(Layout(2, 2, 5, 5)) == ("virtual_stages: 2 stages x 5 virtual stages divide neither the 94 "
                                                 "blocks nor 94 + 2 (embedding and loss counted); allowed with "
                                                 "pipeline_parallel_width=2: 1, 2, 3, 4, 6, 8, 12, 16, 24, 47, 48")
    assert rules.problem(Layout(2, 2, 4)) == ("data_parallel_width: tensor x pipeline x data parallel = 2 x 2 x 4 = "
                                              "16, must equal num_devices=20")
    assert rules.problem(Layout(2, 2, 5)) is None  # 94 blocks in two chunks of 47
    assert rules.problem(Layout(1, 4, 5, 2)) is None  # 94 + 2 = 96 in 8 chunks: Megatron's accounted layout
    with pytest.raises(InputError, match="^pipeline_parallel_width: 5 stages divide neither"):
        rules.check(Layout(2, 5, 2))


def test_virtual_stages_some_pipeline_can_interleave():
    assert allowed_virtual_stages(24) == (1, 2, 3, 4, 6, 8, 12)
    assert allowed_virtual_stages(7) == (1,)


@pytest.mark.parametrize("seed", range(25))
def test_the_layouts_of_a_search_are_every_layout_that_fits(seed):
    """`layouts` against every (p, d, v) the rules allow: for v = 1 the deepest pipeline of each d (the
    rules are monotone in p), for v > 1 exactly Megatron's even interleaved layouts."""
    rng = random.Random(seed)
    blocks = rng.randint(2, 12)
    rules = FitRules(num_devices=rng.choice([4, 8, 16, 32]), micro_batches=rng.choice([1, 2, 4, 6, 8, 12, 16]),
                     layers=blocks + rng.randint(0, 2), blocks=blocks, experts=None)
    shard = Layout(rng.choice([1, 2]), expert_parallel_width=rng.choice([1, 2]))
    choices = rng.choice([None, (1,), (1, 2), (2, 3), (1, 3, 4)])
    found = list(layouts(rules, shard, choices))
    plain, interleaved = {}, set()
    for p, d, v in itertools.product(range(1, rules.layers + 1), range(1, rules.num_devices + 1),
                                     range(1, blocks + 1)):
        layout = shard.replace(pipeline_parallel_width=p, data_parallel_width=d, virtual_stages=v)
        even = FitRules(rules.num_devices, rules.micro_batches, rules.layers, blocks, None, split="even")
        if v == 1 and rules.problem(layout) is None and (choices is None or 1 in choices):
            plain[d] = max(plain.get(d, 0), p)
        elif v > 1 and even.problem(layout) is None and (choices is None or v in choices):
            interleaved.add(layout)
    assert {layout.data_parallel_width: layout.pipeline_parallel_width
            for layout in found if layout.virtual_stages == 1} == plain
    assert {layout for layout in found if layout.virtual_stages > 1} == interleaved
    assert len(found) == len(set(found))
    assert data_parallel_widths(rules, shard) == sorted(
        d for d in range(1, rules.num_devices + 1)
        if rules.micro_batches % d == 0 and d % shard.expert_parallel_width == 0
        and shard.tensor_parallel_width * d <= rules.num_devices)


def test_rank_groups_are_strided_in_megatron_core_order():
    t, c, e, d, p = 2, 3, 2, 4, 5
    groups = Layout(t, p, d, expert_parallel_width=e, context_parallel_width=c).groups()
    # rank = tensor + t·(context + c·(data + d·pipeline)): each group's ranks, enumerated
    rank = {(tt, cc, dd, pp): tt + t * (cc + c * (dd + d * pp))
            for tt, cc, dd, pp in itertools.product(range(t), range(c), range(d), range(p))}

    def members(vary):
        base = {"t": 0, "c": 0, "d": 0, "p": 0}
        return [rank[tuple({**base, **{vary: i}}[k] for k in "tcdp")] for i in range({"t": t, "c": c, "d": d, "p": p}[vary])]

    for name, vary in (("tensor", "t"), ("context", "c"), ("data", "d"), ("pipeline", "p")):
        ranks = members(vary)
        assert groups[name] == Group(len(ranks), ranks[1] - ranks[0])
        assert all(b - a == groups[name].stride for a, b in zip(ranks, ranks[1:]))
    assert groups["expert"] == Group(e, t * c)  # e consecutive data-parallel ranks
    # the ranks holding the same dense weights: every context and data rank, c·d devices t apart
    weights = sorted(rank[(0, cc, dd, 0)] for cc in range(c) for dd in range(d))
    assert groups["weights"] == Group(c * d, t) and weights == list(range(0, t * c * d, t))
    # the same experts: c·d/e ranks spanning what the real set spans (its first to its last rank)
    experts = sorted(rank[(0, cc, dd, 0)] for cc in range(c) for dd in range(0, d, e))
    group = groups["expert_weights"]
    assert group.size == len(experts) and (group.size - 1) * group.stride >= experts[-1] - experts[0]
