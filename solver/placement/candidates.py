"""The DP's states and candidate stages: intervals for chains, downsets for any DAG.

A state is a successor-closed set of layers (the last part of the pipeline). A candidate stage of
state D is D minus a smaller state D', placed in front of D'. For a chain the states are the n+1
suffixes and the stages are intervals, listed directly; for other DAGs all downsets are
enumerated. On a chain both give the same states and stages in the same order. The state space is
the same at every width; only the stage costs change.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: Most candidate stages the general (branching) path accepts; beyond it the DP takes minutes.
MAX_CANDIDATE_STAGES = 200_000


@dataclass(frozen=True)
class StateSpace:
    """States (state 0 = empty set, last = all layers, ordered by size) and their candidate stages.

    The stages of state D are the pairs pair_start[D]:pair_start[D+1], tried in that order
    (shortest stage first); pair p leaves state rest[p] and holds the layer positions v with
    members[v, p].
    """

    sizes: np.ndarray
    pair_start: np.ndarray
    rest: np.ndarray
    members: np.ndarray

    def pairs(self, state: int) -> range:
        """Indices of the candidate stages of `state`, in trial order."""
        return range(int(self.pair_start[state]), int(self.pair_start[state + 1]))

    def stage_positions(self, pair: int) -> list[int]:
        """Topological positions of the layers of candidate stage `pair`, ascending."""
        return np.flatnonzero(self.members[:, pair]).tolist()


@dataclass(frozen=True)
class DeviceModel:
    """How table columns stand for device budgets.

    Uniform (every candidate stage uses `per_stage` devices): one column; s stages need
    s·per_stage devices. Mixed (stages use 1 or t = `per_stage` devices): column y holds splits
    with at least y one-device stages; s stages of which y use one device need s·t − (t−1)·y.
    """

    per_stage: int
    columns: int

    @property
    def mixed(self) -> bool:
        return self.columns > 1

    def column(self, budget, depth) -> np.ndarray:
        """Column of dp[·][budget][depth], or -1 if `depth` stages never fit `budget` devices (elementwise)."""
        budget, depth = np.asarray(budget), np.asarray(depth)
        if not self.mixed:
            return np.where(budget >= depth * self.per_stage, 0, -1)
        need = np.maximum(-((budget - depth * self.per_stage) // (self.per_stage - 1)), 0)
        return np.where((budget >= depth) & (need < self.columns), need, -1)


def device_model(width: int, space: StateSpace, devices: np.ndarray, depth_cap: int) -> DeviceModel:
    """Uniform if all candidate stages use the same devices; else count the possible one-device stages."""
    if (devices == devices[0]).all():
        return DeviceModel(int(devices[0]), 1)
    one_device_layers = int(space.members[:, devices == 1].any(axis=1).sum())
    return DeviceModel(width, min(one_device_layers, depth_cap) + 1)


@lru_cache(maxsize=16)
def chain_space(layers: int) -> StateSpace:
    """States of a chain: state L is the suffix of length L; its stages have lengths 1..L. Built once
    per length and read-only (shared: what depends only on the stages is kept with them)."""
    pair_start = np.array([size * (size - 1) // 2 for size in range(layers + 2)])
    suffix = np.repeat(np.arange(1, layers + 1), np.arange(1, layers + 1))
    length = np.arange(pair_start[-1]) - pair_start[suffix] + 1
    first = layers - suffix
    position = np.arange(layers)[:, None]
    arrays = {"sizes": np.arange(layers + 1), "pair_start": pair_start, "rest": suffix - length,
              "members": (position >= first) & (position < first + length)}
    for array in arrays.values():
        array.flags.writeable = False
    return StateSpace(**arrays)


def downset_space(graph) -> StateSpace:
    """States of any DAG (a graph of positions with `n`, `in_edges`, `out_edges`): all downsets sorted
    by (size, bitmask); stages shortest first, then by bitmask."""
    successors = [sum(1 << w for w, _ in graph.out_edges[v]) for v in range(graph.n)]
    predecessors = [sum(1 << u for u, _ in graph.in_edges[v]) for v in range(graph.n)]
    states = sorted(_downsets(successors), key=lambda mask: (mask.bit_count(), mask))
    index = {mask: k for k, mask in enumerate(states)}
    pair_start, rest, stages = [0], [], []
    for state in states:
        for sub in sorted(_sub_downsets(state, predecessors), key=lambda mask: (-mask.bit_count(), mask)):
            rest.append(index[sub])
            stages.append(state & ~sub)
            if len(stages) > MAX_CANDIDATE_STAGES:
                raise ValueError(
                    f"layer graph too branched for the placement DP: more than {MAX_CANDIDATE_STAGES} candidate stages"
                )
        pair_start.append(len(rest))
    return StateSpace(
        sizes=np.array([mask.bit_count() for mask in states]),
        pair_start=np.array(pair_start),
        rest=np.array(rest, dtype=np.int64),
        members=_bit_matrix(stages, graph.n),
    )


def _bit_matrix(masks: list[int], bits: int) -> np.ndarray:
    """matrix[v, k] = bit v of masks[k]."""
    width = (bits + 7) // 8
    raw = np.frombuffer(b"".join(mask.to_bytes(width, "little") for mask in masks), dtype=np.uint8)
    return np.unpackbits(raw.reshape(len(masks), width), axis=1, bitorder="little")[:, :bits].T.astype(bool)


def _downsets(successors: list[int]) -> set[int]:
    """All successor-closed position sets, grown from the empty set one layer at a time."""
    found, stack = {0}, [0]
    while stack:
        state = stack.pop()
        for v, succ in enumerate(successors):
            bigger = state | 1 << v
            if bigger != state and succ & ~state == 0 and bigger not in found:
                if len(found) > MAX_CANDIDATE_STAGES:
                    raise ValueError(
                        f"layer graph too branched for the placement DP: more than {MAX_CANDIDATE_STAGES} downsets"
                    )
                found.add(bigger)
                stack.append(bigger)
    return found


def _sub_downsets(state: int, predecessors: list[int]) -> set[int]:
    """All successor-closed proper subsets of `state` (remove layers with no predecessor left)."""
    found, stack = {state}, [state]
    while stack:
        current = stack.pop()
        remaining = current
        while remaining:
            low = remaining & -remaining
            remaining ^= low
            v = low.bit_length() - 1
            smaller = current ^ low
            if predecessors[v] & current == 0 and smaller not in found:
                found.add(smaller)
                stack.append(smaller)
    found.discard(state)
    return found
