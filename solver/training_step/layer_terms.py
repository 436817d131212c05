"""The per-layer terms of the training-step model: each concern a pure function of the layers, the
shard, the cluster and the options, returning arrays over the layers (per micro-batch, one device
of the shard). `layer_terms` assembles them once per step model; the stages and the placement
search only sum them (`solver.training_step.stages`).

A new concern is one function here and its row in `layer_terms` (and, if the stages sum it, its
field of `StageTerms` and its name in `SUMMED_TERMS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graph_extract.kernels import AMAX_BYTES, KernelOptions
from graph_extract.layergraph import RecomputedModule
from phaze_hardware import Collective, Network
from solver.layout import Layout
from solver.training_step.memory import Recompute, held_activations
from solver.training_step.offload import split_offloaded
from solver.training_step.options import PERSISTENCE_THRESHOLD, REUSE_DISTANCE, TrainingOptions
from solver.training_step.records import StepGraph, StepLayer

#: The fields of an `expert_parallel_times` entry after its split s.
_AT_SPLIT = {name: index for index, name in enumerate(("forward", "backward", "matrix_forward", "matrix_backward",
                                                        "launch_forward", "launch_backward"), start=1)}


@dataclass(frozen=True, kw_only=True)
class Shard:
    """What the per-layer terms depend on: the layers, how the shard splits them, the cluster, the
    options and the recomputation mode."""

    graph: StepGraph
    cluster: Network
    training: TrainingOptions
    kernels: KernelOptions
    recompute: Recompute
    shard: Layout

    @property
    def layers(self) -> tuple[StepLayer, ...]:
        return self.graph.layers

    @property
    def token_share(self) -> float:
        """The share of each sequence's tokens one device of the context-parallel group runs: 1/c.
        Every per-token cost of the width-t graph (its layers' times, activations, collectives and
        transfers) is divided by c; the causal attention too, as the 2c load-balanced chunks give each
        device 1/c of the score tiles (Megatron-Core / Transformer Engine's context parallelism)."""
        return 1.0 / self.shard.context_parallel_width

    def values(self, name: str) -> np.ndarray:
        """The layers' `name`, their times at this shard's expert split where they depend on it (a
        layer's `expert_parallel_times` entry of s = `Layout.expert_split`)."""
        split = self.shard.expert_split
        if split == 1 or name not in _AT_SPLIT:
            return np.array([getattr(layer, name) for layer in self.layers], float)
        found = [next((entry for entry in layer.expert_parallel_times if entry[0] == split), None)
                 for layer in self.layers]
        return np.array([getattr(layer, name) if entry is None else entry[_AT_SPLIT[name]]
                         for layer, entry in zip(self.layers, found)], float)

    def blocks(self) -> np.ndarray:
        return np.array([layer.is_block for layer in self.layers], bool)

    def recomputed(self) -> list[list[RecomputedModule]]:
        """Each layer's modules the mode recomputes (none for `none`, `selective` and `full`)."""
        chosen = self.recompute.modules
        return [[module for module in layer.recompute_modules if module.name in chosen] for layer in self.layers]


def tensor_parallel_collective(shard: Shard) -> Collective:
    return shard.cluster.all_reduce(shard.shard.groups()["tensor"])


def expert_tensor_collective(shard: Shard) -> Collective:
    """The routed experts' all-reduce (or reduce-scatter and all-gather) over the τ ranks splitting each expert."""
    return shard.cluster.all_reduce(shard.shard.groups()["expert_tensor"])


def expert_parallel_collective(shard: Shard) -> Collective:
    """A token dispatch or combine over the expert group (`TrainingOptions.expert_dispatch`)."""
    group = shard.shard.groups()["expert"]
    if shard.training.expert_dispatch == "deduplicated":
        return shard.cluster.dispatch(group, shard.graph.experts_per_token)
    return shard.cluster.all_to_all(group)


def amax_reductions(shard: Shard, tensor: Collective) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of FP8 current scaling's amax all-reduces of each layer, (forward, backward): with
    sequence parallelism an 8-bit product's input gathered over the tensor-parallel group has its
    amax (`AMAX_BYTES`) all-reduced over the group before its cast (`KernelOptions.fp8_recipe`), one
    for each of a block's tensor-parallel collectives (each gathers the input of the column-parallel
    products it feeds forward, and the output gradient of the row-parallel products before it
    backward); none without current scaling or sequence parallelism, or at t = 1."""
    zero = np.zeros(len(shard.layers))
    kernels = shard.kernels
    if not (kernels.current_scaling and kernels.sequence_parallel and shard.graph.width > 1):
        return zero, zero
    once = tensor.scalar(AMAX_BYTES)
    blocks = shard.blocks()
    forward = np.array([len(layer.forward_collective_bytes) * once for layer in shard.layers], float)
    backward = np.array([len(layer.backward_collective_bytes) * once for layer in shard.layers], float)
    return np.where(blocks, forward, 0.0), np.where(blocks, backward, 0.0)


def tensor_parallel(shard: Shard) -> dict[str, np.ndarray]:
    """Seconds of the tensor-parallel collectives of each layer: the forward's and backward's, the
    forward's again where recomputed (whole blocks with `full`, the recomputed modules' otherwise);
    with `tensor_parallel_overlap` each direction's hide behind its weight products (the re-run ones
    as much as the forward's). The routed experts' own run over the τ ranks splitting each expert, on
    the tokens of τ/t of a width-t rank. FP8 current scaling adds its amax all-reduces
    (`amax_reductions`), exposed, and again in a fully recomputed block's forward (a recompute
    module's re-run casts are not charged: a simplification). Returns exposed, hidden and the exposed
    backward."""
    layers, tokens, width = shard.layers, shard.token_share, shard.graph.width
    tensor, experts_tensor = tensor_parallel_collective(shard), expert_tensor_collective(shard)
    experts_tokens = tokens * shard.shard.expert_tensor_width / width

    def collectives(plain: Sequence[float], expert: Sequence[float]) -> float:
        return (sum(tensor.scalar(b * tokens) for b in plain)
                + sum(experts_tensor.scalar(b * experts_tokens) for b in expert))

    again_blocks = shard.blocks() & shard.recompute.full
    forward = np.array([collectives(layer.forward_collective_bytes, layer.expert_forward_collective_bytes)
                        for layer in layers], float)
    backward = np.array([collectives(layer.backward_collective_bytes, layer.expert_backward_collective_bytes)
                         for layer in layers], float)
    again = np.array([sum(collectives(module.forward_collective_bytes, module.expert_forward_collective_bytes)
                          for module in found) for found in shard.recomputed()], float)
    raw_forward = forward
    raw = forward + backward + np.where(again_blocks, forward, 0.0) + again
    if shard.training.tensor_parallel_overlap:
        forward = np.maximum(forward - shard.values("matrix_forward") * tokens, 0.0)
        backward = np.maximum(backward - shard.values("matrix_backward") * tokens, 0.0)
        again = again * np.divide(forward, raw_forward, out=np.ones(len(layers)), where=raw_forward > 0)
    exposed = forward + backward + np.where(again_blocks, forward, 0.0) + again
    amax_forward, amax_backward = amax_reductions(shard, tensor)
    if amax_forward.any() or amax_backward.any():  # never hidden: each precedes the cast it scales
        amax = amax_forward + amax_backward + np.where(again_blocks, amax_forward, 0.0)
        exposed, raw, backward = exposed + amax, raw + amax, backward + amax_backward
    return {"exposed": exposed, "hidden": raw - exposed, "backward": backward}


def ring_attention(shard: Shard) -> dict[str, np.ndarray]:
    """Per layer: seconds of ring attention's transfers over the c ranks of the context-parallel
    group (exposed, hidden, and the exposed backward), given a device's K and V chunk and its
    attention time (after the 1/c split).

    Forward, c − 1 times each device passes its K and V chunk to the next rank while it computes
    the attention of the chunk in hand, 1/c of its attention; backward it passes K, V and their
    gradients (twice the bytes) behind 1/c of the backward attention (Transformer Engine's ring
    exchange, Liu et al. 2023). Each transfer hides behind the step it overlaps: exposed = (c − 1)
    · max(transfer − step, 0) per direction, again for the forward of a block whose attention re-runs
    (`full`, `product_outputs`); the point-to-point sends are on the tier the context-parallel group
    spans.
    """
    c, tokens = shard.shard.context_parallel_width, shard.token_share
    if c == 1:
        zero = np.zeros(len(shard.layers))
        return {"exposed": zero, "hidden": zero, "backward": zero}
    key_value_bytes = shard.values("key_value_bytes") * tokens
    link = shard.cluster.send(shard.cluster.tier_joining(shard.shard.groups()["context"]))
    forward_send, backward_send = link.time(key_value_bytes), link.time(2 * key_value_bytes)
    forward = (c - 1) * np.maximum(forward_send - shard.values("attention_forward") * tokens / c, 0.0)
    backward = (c - 1) * np.maximum(backward_send - shard.values("attention_backward") * tokens / c, 0.0)
    again = shard.blocks() & (shard.recompute.full or shard.recompute.product_outputs)
    exposed = forward + backward + np.where(again, forward, 0.0)
    sent_forward, sent_backward = (c - 1) * forward_send, (c - 1) * backward_send
    raw = sent_forward + sent_backward + np.where(again, sent_forward, 0.0)
    return {"exposed": exposed, "hidden": raw - exposed, "backward": backward}


def expert_dispatch(shard: Shard, compute: np.ndarray) -> dict[str, np.ndarray]:
    """Seconds of a mixture's token all-to-alls per layer (a width-t rank's tokens, 1/t of them each
    device's): dispatch and combine forward and backward, again where recomputed (a block with
    `full` or `product_outputs`: its all-to-alls are not weight products; or its recomputed modules'). With
    `overlap_expert_dispatch` they run behind another micro-batch's compute of the layer (`compute`:
    its kernels' seconds) on the share of the device the dispatch's kernels leave it: compute C and
    exchanges R take max(C + share·R, R), so max(R − C, share·R) of R stays exposed (what a host-bound
    pass's idle time then hides is `fill_idle`'s). Returns exposed, hidden and the exposed backward."""
    experts, tokens, width = expert_parallel_collective(shard), shard.token_share, shard.graph.width

    def exchanges(sizes: Sequence[float]) -> float:
        return sum(experts.scalar(b * tokens / width) for b in sizes)

    all_to_all = np.array([exchanges(layer.all_to_all_bytes) for layer in shard.layers], float)
    again = np.array([sum(exchanges(module.all_to_all_bytes) for module in found) for found in shard.recomputed()],
                     float)
    rerun = shard.blocks() & (shard.recompute.full or shard.recompute.product_outputs)
    raw = 2 * all_to_all + np.where(rerun, all_to_all, 0.0) + again
    exposed = raw
    if shard.training.overlap_expert_dispatch:
        exposed = np.maximum(raw - compute, shard.training.expert_dispatch_compute_share * raw)
    backward = all_to_all * np.divide(exposed, raw, out=np.zeros(len(shard.layers)), where=raw > 0)
    return {"exposed": exposed, "hidden": raw - exposed, "backward": backward}


def recomputation(shard: Shard, forward: np.ndarray) -> np.ndarray:
    """The forward seconds each block re-runs: all of it with `full` (`forward`: its pass as `issued`
    prices it); all but its weight products with `product_outputs` (their outputs kept, the
    collectives completing them too); else its recomputed modules' forward (a mixture's experts at
    this shard's split differ by the layer's own difference: only the experts' products read what
    the split changes) and the attention core's with `core_attn`. (The host's issue time bounds only
    the `full` re-run: a simplification.)"""
    tokens, layers = shard.token_share, shard.layers
    if shard.recompute.full:
        rerun = forward
    elif shard.recompute.product_outputs:
        rerun = (shard.values("forward") - shard.values("matrix_forward")) * tokens
    else:
        at_split = shard.values("forward") - np.array([layer.forward for layer in layers], float)
        rerun = tokens * np.array([sum(dict(layer.module_forward).get(module.name, 0.0)
                                       + (shift if module.name == "moe" else 0.0) for module in found)
                                   for layer, found, shift in zip(layers, shard.recomputed(), at_split)], float)
        if "core_attn" in shard.recompute.modules:
            rerun = rerun + shard.values("attention_core_forward") * tokens
    return np.where(shard.blocks(), rerun, 0.0)


def issued(shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of each layer's forward and backward on one device: its kernels' (at this shard's
    expert split, with their launch floors), or, if longer, the host's time to issue them
    (`estimator.roofline.issue_seconds`): its kernels but the experts' (`issue_forward`) and 1/e of
    every expert's (`expert_issue_forward`), a device holding E/e of the experts issuing their GEMMs
    and casts. The host runs ahead of the device within a pass, not past a mixture's token
    dispatcher, which brings the tokens per expert to the host every forward: so each pass is priced
    alone (backward too, its layers alike: a simplification). Divided by c like every per-token cost
    (the host's time too: as the launch floor, a simplification)."""
    e, tokens = shard.shard.expert_parallel_width, shard.token_share
    return tuple(np.maximum(shard.values(direction),
                            shard.values(f"issue_{direction}") + shard.values(f"expert_issue_{direction}") / e) * tokens
                 for direction in ("forward", "backward"))


def fill_idle(idle: np.ndarray, *collectives: dict[str, np.ndarray]) -> None:
    """Take off the exposed seconds of each layer's `collectives` (in the order given: dicts of
    exposed, hidden and the exposed backward, changed in place) what fits in its `idle` seconds: a
    pass bound by the host's issue time (`issued`) leaves the device idle for the difference, and the
    collectives the host issues among its kernels run asynchronously in that time (the forward's and
    the backward's idle time pooled: a simplification)."""
    left = idle.copy()
    for terms in collectives:
        exposed = terms["exposed"]
        taken = np.minimum(exposed, left)
        kept = np.divide(exposed - taken, exposed, out=np.ones(len(exposed)), where=exposed > 0)
        terms["exposed"], terms["hidden"] = exposed - taken, terms["hidden"] + taken
        terms["backward"] = terms["backward"] * kept
        left = left - taken


def launch(shard: Shard, idle: np.ndarray) -> np.ndarray:
    """Of each layer's compute (forward + backward, as `issued` prices them), the seconds the host
    adds (`estimator.roofline`: idle time while the host issues short kernels): its kernels' launch
    floors at this shard's expert split, and `idle`, what the host's issue time of a pass adds beyond
    its kernels; divided by c like every per-token cost (simplifications: the floor of a
    context-parallel rank's kernels is taken as the whole sequence's over c)."""
    return (shard.values("launch_forward") + shard.values("launch_backward")) * shard.token_share + idle


def blocking_gathers(layers: Sequence[StepLayer]) -> tuple[np.ndarray, np.ndarray]:
    """DeepSpeed's early ZeRO-3 (`TrainingOptions.sharded_collectives` = `blocking_tensors`): per layer,
    ([the weight tensors it gathers a pass, those a backward after a recomputed forward gathers again],
    their parameters). A tensor of at least `PERSISTENCE_THRESHOLD` elements is gathered; after the
    recomputed forward it is freed and gathered again unless the tensors used before its backward — the
    layer's later tensors, in the forward and again in the backward — hold fewer than `REUSE_DISTANCE`
    elements (a layer's tensors in the order its forward reads them)."""
    counts, regathered = np.zeros((2, len(layers))), np.zeros(len(layers))
    for index, layer in enumerate(layers):
        sizes = layer.parameter_tensors
        for position, size in enumerate(sizes):
            if size < PERSISTENCE_THRESHOLD:
                continue
            counts[0, index] += 1
            if 2 * sum(sizes[position + 1:]) >= REUSE_DISTANCE:
                counts[1, index] += 1
                regathered[index] += size
    return counts, regathered


def parameters(shard: Shard) -> dict[str, np.ndarray]:
    """Parameters per device of each layer: all, the experts' (1/s of them at expert split s) and
    those weight products read (FP8: an 8-bit copy)."""
    experts = shard.values("expert_parameters")
    local = experts / shard.shard.expert_split
    return {"parameters": shard.values("parameters") - experts + local, "expert_parameters": local,
            "matrix_parameters": shard.values("matrix_parameters") - experts + local}


def layer_terms(shard: Shard) -> dict[str, np.ndarray]:
    """Every per-layer term of the step model, by name (`SUMMED_TERMS`'s values, `working`)."""
    tokens = shard.token_share
    forward, backward = issued(shard)
    device = (shard.values("forward") + shard.values("backward")) * tokens
    idle = forward + backward - device  # what the host's issue time adds beyond the kernels
    tensor, ring, dispatch = tensor_parallel(shard), ring_attention(shard), expert_dispatch(shard, device)
    fill_idle(idle, dispatch, tensor, ring)
    held, working = held_activations(shard.layers, shard.recompute, shard.graph.width, shard.kernels,
                                     shard.shard.expert_tensor_width)
    held, offloaded = split_offloaded(held, shard.blocks(), shard.training.offloads_activations)
    gathers, regathered = (blocking_gathers(shard.layers) if shard.training.sharded_collectives == "blocking_tensors"
                           else (np.zeros((2, len(shard.layers))), np.zeros(len(shard.layers))))
    return {
        "compute": forward + backward,
        "launch": launch(shard, idle),
        "recompute": recomputation(shard, forward),
        "tensor_parallel": tensor["exposed"],
        "tensor_parallel_hidden": tensor["hidden"],
        "context_parallel": ring["exposed"],
        "context_parallel_hidden": ring["hidden"],
        "expert_parallel": dispatch["exposed"],
        "expert_parallel_hidden": dispatch["hidden"],
        "forward": forward,
        "backward": backward + tensor["backward"] + ring["backward"] + dispatch["backward"],
        **parameters(shard),
        "held": held * tokens,
        "offloaded": offloaded * tokens,
        "working": working * tokens,
        "gathers": gathers[0],
        "regathers": gathers[1],
        "regathered": regathered,
    }
