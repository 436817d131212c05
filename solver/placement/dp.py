"""The DP tables over pipeline suffixes, shared by both step models: the original program's table and
back-trace (msr-fiddle/phaze at fed7cde, `Solver/device_placement/device_placement.cpp` `Graph::runDP`,
lines 560-609 and 675-726).

table[state, s, column, x] is the least largest stage load over the ways to split `state` (a
successor-closed set of layers: the last part of the pipeline) into exactly s stages, each fitting
in memory at its place from the end, under scenario x. A scenario is what changes which stages fit
and what they cost: a data-parallel degree (memory, the link between stages), a cap on the stages'
parameters, or nothing (the original's model has one scenario). Columns stand for device budgets
(see DeviceModel); with every stage on t devices there is one.

The table is filled one stage count at a time, vectorised over the candidate stages of every state
and the scenarios. Only min and max touch it, so it holds the original's very values; the back-trace takes
the shortest next stage whose value matches (within 1e-9), as the original does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .candidates import DeviceModel, StateSpace

#: The original's "infeasible" value; table entries above INFTY/2 mean "no split".
INFTY = 1e30
#: Absolute tolerance of the original's back-trace match.
MATCH_TOLERANCE = 1e-9


@dataclass(frozen=True)
class StageTable:
    """What the DP needs of every candidate stage (pair), per scenario x.

    load_last[pair, x]: its load as the last stage; load_inner[pair, x]: anywhere else;
    feasible[pair, x]: the deepest place from the end where it fits (0: nowhere).
    """

    devices: np.ndarray
    load_last: np.ndarray
    load_inner: np.ndarray
    feasible: np.ndarray


def fill_tables(space: StateSpace, stages: StageTable, depth_cap: int, model: DeviceModel,
                include_full: bool = False) -> np.ndarray:
    """table[state, s, column, x] for every state but the full set (and it too if `include_full`).

    Filled one stage count s at a time (table[·, s] reads only table[·, s − 1]), vectorised over
    every candidate stage that can be the s-th from the end: its rest splits into s − 1 stages and
    it fits at that place under some scenario. The states' minima are segment minima over their
    stages; min and max only, so the values are the recurrence's whatever the order."""
    states, scenarios = len(space.sizes), stages.feasible.shape[1]
    table = np.full((states, depth_cap + 1, model.columns, scenarios), INFTY)
    table[0, 0, 0] = 0.0
    owner = np.repeat(np.arange(states), np.diff(space.pair_start))  # the state of each pair
    last_state = states if include_full else states - 1
    deepest = stages.feasible.max(axis=1)
    rest_size = space.sizes[space.rest]
    candidates = np.flatnonzero((owner < last_state) & (deepest >= 1))
    one_more = np.r_[0, np.arange(model.columns - 1)]  # a one-device stage: column y reads y - 1
    for depth in range(1, depth_cap + 1):
        candidates = candidates[(rest_size[candidates] >= depth - 1) & (deepest[candidates] >= depth)]
        pairs = candidates[space.rest[candidates] == 0] if depth == 1 else candidates  # 1: the whole state
        if not len(pairs):
            break
        source = table[space.rest[pairs], depth - 1]  # [pairs, column, x], a copy
        if model.mixed:
            single = stages.devices[pairs] == 1
            source[single] = source[single][:, one_more]
        load = stages.load_last[pairs] if depth == 1 else stages.load_inner[pairs]
        candidate = np.maximum(source, load[:, None, :], out=source)
        np.copyto(candidate, INFTY, where=(stages.feasible[pairs] < depth)[:, None, :])
        owners = owner[pairs]
        starts = np.concatenate(([0], np.flatnonzero(owners[1:] != owners[:-1]) + 1))
        target = owners[starts]
        table[target, depth] = np.minimum(table[target, depth], np.minimum.reduceat(candidate, starts, axis=0))
    return table


def lookup(table: np.ndarray, state: int, budget: int, depth: int, model: DeviceModel) -> float:
    """The original's dp[state][budget][depth] of one scenario's table[state, s, column]."""
    column = int(model.column(budget, depth))
    if depth >= table.shape[1] or column < 0:
        return INFTY
    return float(table[state, depth, column])


def backtrace(space: StateSpace, table: np.ndarray, stages: StageTable, x: int, model: DeviceModel,
              state: int, depth: int, budget: int) -> list[int]:
    """The candidate stages (pairs), first to last, of the split of `state` into `depth` stages
    that reaches table[state, depth] within `budget` devices under scenario x: at each step the
    shortest next stage whose value matches, as the original's reconstruction (device_placement.cpp
    lines 675-726). `table` is one scenario's [state, s, column]."""
    found = []
    while state != 0:
        target = lookup(table, state, budget, depth, model)
        for pair in space.pairs(state):
            devices, rest = int(stages.devices[pair]), int(space.rest[pair])
            if budget < devices or depth > stages.feasible[pair, x]:
                continue
            load = float(stages.load_inner[pair, x] if depth > 1 else stages.load_last[pair, x])
            if abs(target - max(lookup(table, rest, budget - devices, depth - 1, model), load)) < MATCH_TOLERANCE:
                found.append(pair)
                state, depth, budget = rest, depth - 1, budget - devices
                break
        else:
            raise RuntimeError("placement DP back-trace found no matching stage (internal error)")
    return found
