"""Stages, vectorised: sums of per-layer values over the layers of many candidate stages at once,
each stage's in position order (so a stage gets the same floating-point sum however many stages
are costed together), and chunks summed per pipeline device."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from solver.training_step.records import SUMMED_TERMS, StageTerms, StepGraph


def runs(members: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(first, end) positions of each stage when every stage is a non-empty run of consecutive
    positions (a chain's stages), else None."""
    count, stages = members.shape
    if not stages or not count:
        return None
    sizes = members.sum(axis=0)
    first = members.argmax(axis=0)
    end = count - members[::-1].argmax(axis=0)
    return (first, end) if (sizes > 0).all() and (sizes == end - first).all() else None


def stage_shape(members: np.ndarray) -> tuple:
    """How `ordered_reduce` goes over the stages of `members[v, k]`: ("partition", the stage of each
    position) when each position is in one stage (a placement's chunks); ("runs", first, end) when
    there are more stages than positions and each is a run of consecutive positions (a chain's
    candidate stages); else ("any",)."""
    count, stages = members.shape
    if count and (members.sum(axis=1) == 1).all():
        return ("partition", members.argmax(axis=1))
    found = runs(members) if stages > count else None
    return ("any",) if found is None else ("runs", *found)


def ordered_reduce(members: np.ndarray, values: np.ndarray, combine: np.ufunc, shape: tuple | None = None
                   ) -> np.ndarray:
    """`combine` (np.add, np.maximum) of values[i, v] over the positions v of each stage k (members[v,
    k]), from 0, one position at a time in position order, for each row i: a stage gets the same
    floating-point result however many stages are reduced at once. Each way of `stage_shape` makes
    the same steps in the same order: a partition's by `combine.at` (applied in index order); runs
    by the results of every run, each extended one position at a time (n² runs instead of n × stages
    entries); any others position by position."""
    shape = stage_shape(members) if shape is None else shape
    count, stages = members.shape
    rows = values.shape[0]
    if shape[0] == "partition":
        total = np.zeros((rows, stages))
        combine.at(total, (np.arange(rows)[:, None], shape[1][None, :]), values)
        return total
    if shape[0] == "runs":
        table = np.zeros((rows, count, count + 1))  # [row, first, end]
        for end in range(1, count + 1):
            table[:, :end, end] = combine(table[:, :end, end - 1], values[:, end - 1 : end])
        return table[:, shape[1], shape[2]]
    total = np.zeros((rows, stages))
    for v in range(count):
        total = combine(total, np.where(members[v], values[:, v : v + 1], 0.0))
    return total


def ordered_sum(members: np.ndarray, values: np.ndarray, shape: tuple | None = None) -> np.ndarray:
    """Σ values[i, v] over each stage's positions, in position order (`ordered_reduce`)."""
    return ordered_reduce(members, values, np.add, shape)


def stage_sum(members: np.ndarray, values) -> np.ndarray:
    """`ordered_sum` of one row of per-layer values."""
    return ordered_sum(members, np.asarray(values, float)[None, :])[0]


def stage_max(members: np.ndarray, values, shape: tuple | None = None) -> np.ndarray:
    """The largest value (at least 0) over each stage's layers."""
    return ordered_reduce(members, np.asarray(values, float)[None, :], np.maximum, shape)[0]


def per_device(values: np.ndarray, stages: int) -> np.ndarray:
    """Chunk values (last axis, first to last) summed per pipeline device, chunk j on device j mod
    `stages`, in chunk order (with one chunk per device, the values themselves)."""
    result = values[..., :stages]
    for start in range(stages, values.shape[-1], stages):
        result = result + values[..., start : start + stages]
    return result


#: Stage sets whose `crossing_terms` are kept (read-only ones: a chain's candidate stages).
CROSSING_MEMO = 32
_crossing_memo: OrderedDict[tuple, tuple] = OrderedDict()


def crossing_terms(edges: tuple, edge_bytes: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
    """What the stages `members[v, k]` get from the graph alone, the same for every chip: the bytes
    crossing each stage's boundary (summed in edge order), its messages, and its `stage_shape`. Kept
    for a read-only `members` (held with its value, so its id stays its own)."""
    key = (id(members), members.shape, edges, edge_bytes.tobytes()) if not members.flags.writeable else None
    found = _crossing_memo.get(key) if key is not None else None
    if found is not None:
        _crossing_memo.move_to_end(key)
        return found[1:]
    if edges:
        sources, dests = (np.array([edge[i] for edge in edges], dtype=np.int64) for i in (0, 1))
        crossing = members[dests] != members[sources]  # into one stage, out of the other
        transfer_bytes = np.cumsum(np.where(crossing, edge_bytes[:, None], 0.0), axis=0)[-1]
        messages = crossing.sum(axis=0).astype(float)
    else:
        transfer_bytes = messages = np.zeros(members.shape[1])
    found = (members, transfer_bytes, messages, stage_shape(members))
    if key is not None:
        for array in (transfer_bytes, messages, *found[3][1:]):
            array.flags.writeable = False  # shared by every caller
        _crossing_memo[key] = found
        while len(_crossing_memo) > CROSSING_MEMO:
            _crossing_memo.popitem(last=False)
    return found[1:]


def stage_terms(graph: StepGraph, values: dict[str, np.ndarray], summed: np.ndarray, edge_bytes: np.ndarray,
                members: np.ndarray) -> StageTerms:
    """The terms of the stages given by `members[v, k]` (position v in stage k): `summed` holds the
    per-layer `values` of SUMMED_TERMS a row each, `edge_bytes` the bytes each of the graph's edges
    carries to or from one device. Each stage's sums run in position order (edges: in edge order)."""
    members = np.asarray(members, bool)
    transfer_bytes, messages, shape = crossing_terms(graph.edges, edge_bytes, members)
    terms = dict(zip(SUMMED_TERMS, ordered_sum(members, summed, shape)))
    for first, second, shared in graph.tied:
        terms["parameters"] = terms["parameters"] - np.where(members[first] & members[second], shared, 0.0)
    largest = ordered_reduce(members, np.array([values["parameters"], values["offloaded"]], float), np.maximum, shape)
    return StageTerms(**terms, transfer_bytes=transfer_bytes, transfer_messages=messages,
                      working_activations=recompute_peak(members, values["held"], values["working"]),
                      largest_parameters=largest[0], largest_offloaded=largest[1])


def recompute_peak(members: np.ndarray, held: np.ndarray, working: np.ndarray) -> np.ndarray:
    """Per stage of `members[v, k]`: the bytes a recomputed layer's working memory adds to the stage's
    held activations `held` at the peak of a micro-batch's backward pass: the largest over its layers
    i of working_i less what the stage's later layers held, freed by then (their backward ran first:
    the head's logits are gone before the last block is recomputed), at least 0. The held sums run in
    position order (a cumulative sum: the same total as `ordered_sum`)."""
    before = np.cumsum(np.where(members, np.asarray(held, float)[:, None], 0.0), axis=0)  # held of positions ≤ v
    if not len(before):
        return np.zeros(members.shape[1])
    peak = np.where(members, np.asarray(working, float)[:, None] + before, -np.inf).max(axis=0)
    return np.maximum(peak - before[-1], 0.0)


def chunk_members(count: int, chunks: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """members[v, k]: position v (of `count`) in chunk k."""
    members = np.zeros((count, len(chunks)), bool)
    for index, chunk in enumerate(chunks):
        members[list(chunk), index] = True
    return members


def device_terms(chunk_terms: StageTerms, stages: int) -> StageTerms:
    """Each pipeline device's terms: its chunks' (chunk j on device j mod p) summed in chunk order;
    its working memory, largest layer and largest offloaded block the largest of its chunks'."""
    names = list(StageTerms.__dataclass_fields__)
    values = np.array([getattr(chunk_terms, name) for name in names], float)
    if values.shape[1] == stages:
        summed = values
    else:  # a running sum over the chunks of each device, in chunk order: per_device's
        summed = np.cumsum(values.reshape(len(names), -1, stages), axis=1)[:, -1]
    fields = dict(zip(names, summed))
    fields["working_activations"] = chunk_terms.working_activations.reshape(-1, stages).max(axis=0)
    fields["largest_parameters"] = chunk_terms.largest_parameters.reshape(-1, stages).max(axis=0)
    fields["largest_offloaded"] = chunk_terms.largest_offloaded.reshape(-1, stages).max(axis=0)
    return StageTerms(**fields)
