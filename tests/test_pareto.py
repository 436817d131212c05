"""The Pareto front against a brute force over all pairs."""

from __future__ import annotations

import numpy as np
import pytest

from solver.pareto import front


def brute_force(values: np.ndarray, maximise) -> list[int]:
    signed = values * np.where(maximise, -1.0, 1.0)
    return [i for i in range(len(signed))
            if not any(np.all(signed[j] <= signed[i]) and np.any(signed[j] < signed[i]) for j in range(len(signed)))]


@pytest.mark.parametrize("seed", range(6))
def test_the_front_is_exactly_the_non_dominated_points(seed):
    generator = np.random.default_rng(seed)
    # throughput (max), power and cost (min); integers so that ties and duplicates occur
    values = generator.integers(0, 6, size=(60, 3)).astype(float)
    maximise = [True, False, False]
    found = front(values.T, maximise)
    assert found.tolist() == brute_force(values, np.array(maximise))
    for i in found:  # no kept point dominated by any point
        signed = values * np.where(maximise, -1.0, 1.0)
        assert not any(np.all(signed[j] <= signed[i]) and np.any(signed[j] < signed[i]) for j in range(len(values)))


def test_a_hand_example():
    throughput = [10, 8, 10, 6, 12]
    power = [100, 50, 90, 40, 200]
    cost = [5, 5, 5, 5, 9]
    # point 0 is beaten by point 2 (same throughput and cost, less power); the rest trade off
    assert front([throughput, power, cost], [True, False, False]).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="one maximise flag per objective"):
        front([throughput], [True, False])
    with pytest.raises(ValueError, match="finite"):
        front([[1.0, float("nan")]], [True])
