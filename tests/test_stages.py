"""The stage sums (`solver.training_step.stages`): a partition's, a chain's candidate stages' and any
other stages' sums are the very bits of adding each stage's values one position at a time, in
position order, from 0 (what makes the DP's stage and the re-priced placement agree)."""

import numpy as np
import pytest

from solver.training_step.stages import ordered_sum, recompute_peak, runs, stage_max


def one_at_a_time(members: np.ndarray, values: np.ndarray) -> np.ndarray:
    total = np.zeros((values.shape[0], members.shape[1]))
    for position in range(members.shape[0]):
        for stage in range(members.shape[1]):
            if members[position, stage]:
                total[:, stage] = total[:, stage] + values[:, position]
    return total


def largest(members: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.array([max([0.0, *values[members[:, stage]]]) for stage in range(members.shape[1])])


def cases(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    partition = np.zeros((count, 5), bool)
    partition[np.arange(count), rng.integers(0, 5, count)] = True  # interleaved chunks, maybe an empty one
    pairs = [(first, end) for first in range(count) for end in range(first + 1, count + 1)]
    chain = np.zeros((count, len(pairs)), bool)
    for stage, (first, end) in enumerate(pairs):
        chain[first:end, stage] = True
    return {"partition": partition, "chain": chain, "any": rng.random((count, 9)) < 0.4}


@pytest.mark.parametrize("kind", ["partition", "chain", "any"])
def test_each_way_adds_in_position_order(kind):
    rng = np.random.default_rng(7)
    values = rng.random((4, 23)) * 10.0 ** rng.uniform(-8, 8, (4, 23))  # magnitudes where order shows
    members = cases(23, rng)[kind]
    assert np.array_equal(ordered_sum(members, values), one_at_a_time(members, values))
    assert np.array_equal(stage_max(members, values[0]), largest(members, values[0]))


def test_the_order_is_visible_in_these_values():
    """The check above could not pass by luck: another order gives other bits for these values."""
    rng = np.random.default_rng(7)
    values = rng.random((4, 23)) * 10.0 ** rng.uniform(-8, 8, (4, 23))
    chain = cases(23, rng)["chain"]
    reversed_order = one_at_a_time(chain[::-1], values[:, ::-1])
    assert not np.array_equal(reversed_order, one_at_a_time(chain, values))


def test_runs_are_found_only_for_runs_of_consecutive_positions():
    members = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1]], bool)
    assert runs(members) is None  # the third stage holds positions 0 and 2
    first, end = runs(members[:, :2])
    assert (first.tolist(), end.tolist()) == ([0, 1], [2, 3])


def simulated_peak(held, working) -> float:
    """A stage's peak activations by walking one micro-batch's step: the forward keeps every layer's
    `held`; the backward, last layer first, rebuilds layer i's `working` beside the layers not yet done,
    then frees what layer i held. Returns the peak less the forward's total."""
    total = sum(held)
    peak, kept = total, total
    for index in reversed(range(len(held))):
        peak = max(peak, kept + working[index])
        kept -= held[index]
    return peak - total


def test_recompute_peak_matches_a_walk_through_the_backward():
    """`recompute_peak` against the simulated step, on random stages of random layers (several ways of
    splitting them: partitions, runs, any sets), and a case by hand: a head holding 10 after a block
    rebuilding 12 (2 beyond the head's freed room) and one rebuilding 5 before it (covered)."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        count, stages = int(rng.integers(1, 7)), int(rng.integers(1, 5))
        members = rng.random((count, stages)) < 0.6
        held, working = rng.random(count) * 10, np.where(rng.random(count) < 0.5, rng.random(count) * 20, 0.0)
        found = recompute_peak(members, held, working)
        for stage in range(stages):
            inside = np.flatnonzero(members[:, stage])
            expected = simulated_peak(list(held[inside]), list(working[inside])) if len(inside) else 0.0
            assert found[stage] == pytest.approx(expected, abs=1e-9)
    hand = recompute_peak(np.ones((4, 1), bool), np.array([0.0, 1.0, 1.0, 10.0]), np.array([0.0, 5.0, 12.0, 0.0]))
    assert hand[0] == pytest.approx(2.0, rel=1e-12)
