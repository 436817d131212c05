"""The stage sums (`solver.training_step.stages`): a partition's, a chain's candidate stages' and any
other stages' sums are the very bits of adding each stage's values one position at a time, in
position order, from 0 (what makes the DP's stage and the re-priced placement agree)."""

import numpy as np
import pytest

from solver.training_step.stages import ordered_sum, runs, stage_max


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
