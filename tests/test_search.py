"""Search strategies against brute force on synthetic candidates."""

import numpy as np
import pytest

from solver.strategies import area_buckets, bounded, exhaustive, phaze_sweep, resolved


def counting(values):
    calls = []

    def evaluate(indices):
        calls.extend(indices)
        return [float(values[i]) for i in indices]

    return evaluate, calls


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("batch_size", [1, 3])
def test_bounded_finds_the_exhaustive_best_with_fewer_evaluations(seed, batch_size):
    rng = np.random.default_rng(seed)
    count = 80
    throughput = np.where(rng.random(count) < 0.2, 0.0, rng.integers(1, 30, count).astype(float))  # ties
    loose = throughput * (1 + rng.random(count)) + rng.random(count)  # valid upper bounds
    tight = throughput + (loose - throughput) * rng.random(count)
    areas = rng.integers(1, 5, count).astype(float)  # ties in area too
    evaluate, calls = counting(throughput)
    result = bounded(loose, [lambda ids: [float(tight[i]) for i in ids]], evaluate, batch_size, areas)
    best = exhaustive(count, counting(throughput)[0], areas=areas)
    brute = max((t, -areas[i], -i) for i, t in enumerate(throughput) if t > 0)
    assert (best.best_throughput, -areas[best.best], -best.best) == brute
    assert (result.best, result.best_throughput) == (best.best, best.best_throughput)
    assert len(set(calls)) == len(calls) < count


@pytest.mark.parametrize("batch_size", [1, 2])
def test_bounded_breaks_ties_of_exact_bounds_by_area(batch_size):
    """Bounds that are exact and equal: the smallest chip wins, as with exhaustive, whatever the
    candidates' order; once it is found, no candidate of equal bound and larger area is evaluated."""
    throughput, areas = [10.0, 10.0, 10.0, 4.0], [2.0, 3.0, 1.0, 0.5]
    evaluate, calls = counting(throughput)
    result = bounded(np.array(throughput), [], evaluate, batch_size, areas)
    assert (result.best, result.best_throughput) == (2, 10.0) == (exhaustive(4, counting(throughput)[0], areas=areas).best, 10.0)
    assert calls == [2]  # a batch evaluates one of a run of equal final bounds


def test_throughputs_closer_than_the_resolution_tie():
    """Two throughputs a part in 10^12 or 10^8 apart (a bound's float noise, a schedule just above its
    bound) tie: the smaller chip wins, and a candidate whose bound exceeds the best by that is never
    evaluated; a part in 10^5 does not tie."""
    assert resolved(131.56507412580638) == resolved(131.56507412580638 * (1 + 1e-12)) == 131.5651
    assert resolved(131.56507626975406) == 131.5651
    throughput, areas = [131.56507412580638, 131.56507412580638, 50.0], [1.0, 2.0, 0.5]
    evaluate, calls = counting(throughput)
    bounds = np.array([131.56507412580638 * (1 + 1e-12), 131.56507412580638 * (1 + 1e-12), 60.0])
    result = bounded(bounds, [], evaluate, 1, areas)
    assert (result.best, calls) == (0, [0])
    # the larger chip is faster by a part in 10^5: it is evaluated and wins
    throughput[1] *= 1 + 1e-5
    evaluate, calls = counting(throughput)
    result = bounded(np.array(throughput) * (1 + 1e-12), [], evaluate, 1, areas)
    assert (result.best, calls) == (1, [1])
    assert exhaustive(3, counting([1.0 + 1e-12, 1.0, 0.0])[0], areas=[2.0, 1.0, 0.5]).best == 1


def test_a_batch_evaluates_one_of_equal_final_bounds():
    """Three chips with equal exact bounds in one batch of three: the smallest is evaluated; it meets its
    bound, so the others cannot win and are never evaluated. If it falls short, the next is."""
    evaluate, calls = counting([5.0, 5.0, 5.0, 1.0])
    result = bounded(np.array([5.0, 5.0, 5.0, 1.0]), [], evaluate, 3, [3.0, 2.0, 1.0, 0.5])
    assert (result.best, calls) == (2, [2])
    evaluate, calls = counting([5.0, 5.0, 4.0, 1.0])
    result = bounded(np.array([5.0, 5.0, 5.0, 1.0]), [], evaluate, 3, [3.0, 2.0, 1.0, 0.5])
    assert (result.best, calls) == (1, [2, 1])


def test_bounded_with_nothing_feasible():
    evaluate, _ = counting([0.0, 0.0])
    result = bounded(np.array([5.0, 1.0]), [], evaluate)
    assert result.best is None and result.evaluated == (0, 1)


def test_area_buckets_largest_first_stable_inside():
    areas = [15_000.0, 35_000.0, 19_999.0, 30_000.0, 5.0]
    assert area_buckets(areas, 10_000.0) == [[1, 3], [0, 2], [4]]


def test_phaze_sweep_stops_after_five_non_increasing_buckets():
    # one candidate per bucket; bucket bests 1,2,9,8,7,6,5 then 100 (never reached)
    areas = [float(10_000 * (20 - k)) for k in range(8)]
    throughput = [1, 2, 9, 8, 7, 6, 5, 100]
    evaluate, calls = counting(throughput)
    result = phaze_sweep(areas, evaluate)
    assert calls == [0, 1, 2, 3, 4, 5, 6]  # after [9,8,7,6,5] the sweep has converged
    assert result.best == 2 and result.best_throughput == 9


def test_phaze_sweep_keeps_going_while_throughput_rises():
    areas = [float(10_000 * (20 - k)) for k in range(8)]
    throughput = [5, 4, 3, 2, 2.5, 1, 0.5, 0.1]
    evaluate, calls = counting(throughput)
    phaze_sweep(areas, evaluate)
    # every window of five bucket bests before buckets 5, 6, 7 contains the rise 2 -> 2.5
    assert calls == [0, 1, 2, 3, 4, 5, 6, 7]
