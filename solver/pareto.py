"""The Pareto front of candidate chips: those no other candidate beats in every objective at once
(throughput higher or equal, power and cost lower or equal, and one of them strictly better).

`front` takes each objective as a column and whether it is maximised; it sorts by the first and
keeps a point when no point before it (at least as good in the first) is at least as good in the
rest (a dominating point sorts earlier; one dominated by a dropped point is dominated by a kept
one): O(n log n + n · |front|) rather than all pairs, exact for ties (equal points are all kept).
The system space's search (`architecture_space=system`) writes its front with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def front(columns: Sequence[Sequence[float]], maximise: Sequence[bool]) -> np.ndarray:
    """Indices (ascending) of the non-dominated rows of the objectives `columns` (one sequence per
    objective, equally long); `maximise[j]`: objective j is better when larger."""
    if len(columns) != len(maximise) or len(columns) == 0:
        raise ValueError("front: one maximise flag per objective, at least one objective")
    values = np.column_stack([np.asarray(column, float) * (-1.0 if larger else 1.0)
                              for column, larger in zip(columns, maximise)])  # all minimised now
    if not len(values):
        return np.array([], dtype=int)
    if not np.all(np.isfinite(values)):
        raise ValueError("front: objectives must be finite numbers")
    order = np.lexsort(values.T[::-1])  # by the first objective, ties by the next ones
    kept: list[int] = []
    for index in order:
        point = values[index]
        dominated = any(np.all(values[other] <= point) and np.any(values[other] < point) for other in kept)
        if not dominated:
            kept.append(int(index))
    return np.array(sorted(kept), dtype=int)
