"""A cluster: devices in nodes joined by tiers of links (a hierarchical network: NVLink inside a node,
InfiniBand between nodes; or one tier, a TPU pod's ICI), and the time of the collectives and
transfers of a group of its devices.

Blocks. Tier k joins blocks of N_k consecutive ranks (a node, an NVLink domain, the whole cluster);
ranks fill the blocks in order, so when the cluster's devices are not a multiple of N_k the last
block is partial (256 GPUs on NVL72: three domains of 72 and one of 40). Each N_k is a multiple of
the tier below's; the last tier joins all devices.

Groups. A group is `size` devices `stride` ranks apart (`Group`; which ranks form the groups of a
parallel layout is the layout's business: `solver.layout`). In Megatron's rank order the groups of
one dimension are r0 + j·σ (j < n) for the offsets r0 = a + b·σ·n (a < σ): every group of the
dimension, all running at once. `Cluster.placements` counts, for each group, the members in each
block of each tier (`TierSpan`: the blocks it spans; per block, its members, the blocks of the
tier below they sit in and the fewest members of those); a collective is priced on each distinct
placement and the slowest (largest time per byte, then largest fixed time) prices the dimension.
When every N_k is a multiple of σ·n or of σ, or divides σ, and divides the cluster (all sizes and
strides powers of two on power-of-two blocks), every group has g_k = min(n, max(1, N_k // σ))
members in each block of tier k and the placement is written in closed form; otherwise the groups
are counted rank by rank (an NVL72 domain of 72 holds 9 members of a d = 16 group at stride 8 and
the next domain 7).

Bytes: a hierarchy of rings. Level k is, inside each tier-k block, a ring of its f blocks of tier
k−1; after the rings below, a device of a sub-block of c members holds S/c, so the ring moves
2(f−1)/f · S/c per device over tier k: the block of fewest members (c_min) is the bottleneck. For
even placements f_k = g_k / g_{k-1}, c = g_{k-1}. Latency: NCCL's ring of all n members, node after
node (NCCL's rings are flat: one ring through every rank): a step per member, B_{k-1} − B_k of them
across tier k (B_k: the blocks of tier k the group spans, B_{-1} = n; NCCL's tuning model,
(nsteps − nInterSteps) · intraLat + nInterSteps · interLat, NVIDIA/nccl src/graph/tuning.cc). For
two tiers and an even group (k = n/g nodes)

    all_reduce(S) = 2(g−1)/g · S / B_intra + 2(k−1)/k · (S/g) / B_inter + 2(n−k)·λ_intra + 2(k−1)·λ_inter

with B = bandwidth × efficiency per device per direction and λ the latency per ring step, at
least the `step_overhead` of the outermost tier the ring crosses (NCCL's model: a ring leaving the
node posts every step to the network, so each step takes at least that proxy's overhead);
reduce-scatter and all-gather are half of it. Simplifications: the rings of unequal blocks are
priced by their bottleneck block (the most blocks below in one block, the fewest members in one of
those) rather than by a schedule of unequal shares; NCCL's tree algorithm (logarithmic latency,
all-reduce only) is not priced.

`Network` is what the training-step model asks of a cluster; `Cluster` is its hierarchical-tier
shape, `FullyConnected` the same with each pair of a node's devices on its own link (AMD's
Infinity Fabric). Another shape (a torus) is another class with the same methods, named by a
system's `topology` (phaze_hardware/systems.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

from phaze_common.checks import (InputError, fraction, integer, non_negative_number, positive_integer, positive_number,
                                 unknown_fields)

#: The fields of a tier in a system's data.
TIER_FIELDS = ("name", "devices", "bandwidth", "latency", "efficiency", "step_overhead", "ranks")


@dataclass(frozen=True)
class Group:
    """`size` devices `stride` ranks apart (ranks r, r + stride, ..., r + (size − 1)·stride): the
    communicator of one dimension of a parallel layout."""

    size: int
    stride: int


@dataclass(frozen=True)
class Tier:
    """One level of links: a group of this tier joins `devices` devices (a block)."""

    name: str
    devices: int
    bandwidth: float  # bytes/s per device per direction
    latency: float  # s per message (one ring step)
    efficiency: float  # achievable fraction of the bandwidth
    step_overhead: float = 0.0  # s: the least every step of a ring crossing this tier takes, on any link

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency

    def to_dict(self) -> dict:
        return {"name": self.name, "devices": self.devices, "bandwidth": self.bandwidth, "latency": self.latency,
                "efficiency": self.efficiency, "step_overhead": self.step_overhead}


@dataclass(frozen=True)
class Collective:
    """The time of one collective (or transfer) of a fixed group: per_byte · S + fixed, 0 for S = 0."""

    per_byte: float  # s per byte
    fixed: float  # s

    def time(self, num_bytes):
        """Seconds for `num_bytes` (a number or an array)."""
        return self.repeated(num_bytes, 1)

    def repeated(self, num_bytes, count):
        """Seconds for `num_bytes` sent as `count` collectives of the group (numbers or arrays): the
        bytes at the per-byte time, the fixed time once per collective (at least one); 0 for no bytes."""
        return np.where(np.asarray(num_bytes) > 0, self.per_byte * num_bytes + self.fixed * np.maximum(count, 1), 0.0)

    def scalar(self, num_bytes: float) -> float:
        """Seconds for one number of bytes (the same arithmetic as `time`, without numpy)."""
        return self.per_byte * num_bytes + self.fixed if num_bytes > 0 else 0.0


NO_COMMUNICATION = Collective(0.0, 0.0)


def _power_of_two(number: int) -> bool:
    return number > 0 and number & (number - 1) == 0


class Network(Protocol):
    """What the training-step model asks of a cluster, whatever its shape."""

    name: str
    num_devices: int
    tiers: tuple[Tier, ...]

    def tier_joining(self, group: Group) -> int: ...

    def all_reduce(self, group: Group) -> Collective: ...

    def reduce_scatter(self, group: Group) -> Collective: ...

    def all_gather(self, group: Group) -> Collective: ...

    def all_to_all(self, group: Group) -> Collective: ...

    def dispatch(self, group: Group, choices: int) -> Collective: ...

    def send(self, tier: int) -> Collective: ...

    def size_ranges(self, stride: int, largest: int) -> list[tuple[int, int, int]]: ...

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class BlockPart:
    """One block of a tier holding members of a group: its `members`, the blocks of the tier below
    they sit in (`parts`; for the innermost tier, the members themselves) and the fewest members
    of one of those (`fewest`; 1 for the innermost tier)."""

    members: float
    parts: float
    fewest: float


@dataclass(frozen=True)
class TierSpan:
    """A group on the blocks of one tier: how many blocks hold members (`blocks`), how many blocks of
    the tier below do (`blocks_below`; the group's size for the innermost tier) and the distinct
    kinds of block (`kinds`)."""

    blocks: float
    blocks_below: float
    kinds: tuple[BlockPart, ...]

    @property
    def crossed(self) -> bool:
        """Whether the group's members in one block of this tier span several blocks below it."""
        return self.blocks_below > self.blocks


def _counted_spans(sizes: tuple[int, ...], ranks: tuple[int, ...]) -> tuple[TierSpan, ...]:
    """The spans of one group (its ranks, in order) on tiers of blocks of `sizes` consecutive ranks
    (the last tier: all devices)."""
    spans, below = [], [(rank,) for rank in ranks]  # the blocks below the innermost tier: devices
    for index, size in enumerate(sizes):
        blocks: dict[int, list[tuple[int, ...]]] = {}
        for part in below:
            blocks.setdefault(0 if index == len(sizes) - 1 else part[0] // size, []).append(part)
        kinds = {BlockPart(sum(len(part) for part in parts), len(parts), min(len(part) for part in parts))
                 for parts in blocks.values()}
        spans.append(TierSpan(len(blocks), len(below), tuple(sorted(kinds, key=lambda kind: (
            kind.members, kind.parts, kind.fewest)))))
        below = [tuple(rank for part in parts for rank in part) for parts in blocks.values()]
    return tuple(spans)


@lru_cache(maxsize=4096)
def counted_placements(sizes: tuple[int, ...], num_devices: int, group: Group) -> tuple[tuple[TierSpan, ...], ...]:
    """The distinct placements (`_counted_spans`) of the groups of one dimension on tiers of blocks of
    `sizes` ranks, counted rank by rank: the groups at offsets r0 = a + b·stride·size, a < stride
    (Megatron's rank order); a group larger than the cluster at offset 0 only."""
    span = group.stride * group.size
    offsets = ([a + b * span for b in range(num_devices // span) for a in range(group.stride)]
               if span <= num_devices else [0])
    found = {_counted_spans(sizes, tuple(r0 + j * group.stride for j in range(group.size))) for r0 in offsets}
    return tuple(sorted(found, key=repr))


@dataclass(frozen=True)
class Cluster:
    """`num_devices` accelerators in nodes of `node_size`, joined by `tiers` (innermost first).

    Each tier's `devices` divides the next one's (the last block of a tier may be partial: the
    cluster need not be a multiple of it); the last tier joins all devices.
    """

    name: str
    num_devices: int
    node_size: int
    tiers: tuple[Tier, ...]

    def __post_init__(self) -> None:
        positive_integer("num_devices", self.num_devices)
        positive_integer("system.node_size", self.node_size)
        if self.num_devices % self.node_size:
            raise InputError(f"num_devices: {self.num_devices} is not a multiple of system.node_size="
                             f"{self.node_size}; allowed: a multiple of {self.node_size} (or a node_size dividing it)")
        if not self.tiers:
            raise InputError("system.tiers: must list at least one tier of links")
        previous = 1
        for index, tier in enumerate(self.tiers):
            where = f"system.tiers[{index}]"
            positive_number(f"{where}.bandwidth", tier.bandwidth)
            non_negative_number(f"{where}.latency", tier.latency)
            non_negative_number(f"{where}.step_overhead", tier.step_overhead)
            fraction(f"{where}.efficiency", tier.efficiency)
            last = index == len(self.tiers) - 1
            if isinstance(tier.devices, bool) or not isinstance(tier.devices, int) or (tier.devices % previous
                                                                                     and not last):
                raise InputError(f"{where}.devices: must be a multiple of the previous tier's {previous}, "
                                 f"got {tier.devices!r}")
            previous = tier.devices
        if self.tiers[-1].devices != self.num_devices:
            raise InputError(f"system.tiers: the last tier must join all {self.num_devices} devices, "
                             f"got {self.tiers[-1].devices}")

    @classmethod
    def build(cls, name: str, num_devices: int, node_size: int, tiers: list[Mapping], slices: int = 1) -> Cluster:
        """From a system's data: tiers without `devices` join a node (all but the last) or the cluster
        (the last), a tier of `devices: slice` one of the `slices` equal slices of the cluster (a TPU
        slice's ICI; the slices joined by the data-centre network, as MaxText's multislice runs);
        latency and step_overhead default to 0, efficiency to 1. A tier's block larger than the cluster
        is the whole cluster. A tier's `ranks` (at most its `devices`) are the devices of each block a
        job's ranks fill, the others idle (an NVL72 rack's spare compute trays): its blocks are then
        `ranks` consecutive ranks."""
        positive_integer("system.slices", slices)
        if slices > 1 and (num_devices % slices or (num_devices // slices) % node_size):
            raise InputError(f"system.slices: {slices} must split num_devices={num_devices} into slices of whole "
                             f"nodes of {node_size}; allowed: a divisor of {num_devices // node_size}")
        built = []
        for index, tier in enumerate(tiers):
            fields = dict(tier)
            unknown_fields(f"system.tiers[{index}]", fields, TIER_FIELDS)
            if fields.get("devices") is None:
                fields["devices"] = num_devices if index == len(tiers) - 1 else node_size
            elif fields["devices"] == "slice":
                fields["devices"] = num_devices // slices
            elif isinstance(fields["devices"], int) and not isinstance(fields["devices"], bool):
                if "ranks" in fields:
                    fields["devices"] = integer(f"system.tiers[{index}].ranks", fields["ranks"], 1, fields["devices"])
                fields["devices"] = min(fields["devices"], num_devices)
            if "ranks" in fields and not isinstance(tier.get("devices"), int):
                raise InputError(f"system.tiers[{index}].ranks: applies to a tier of a number of devices; allowed: "
                                 "leave it out, or give the tier's devices")
            fields.pop("ranks", None)
            fields.setdefault("latency", 0.0)
            fields.setdefault("step_overhead", 0.0)
            fields.setdefault("efficiency", 1.0)
            if "bandwidth" not in fields:
                raise InputError(f"system.tiers[{index}].bandwidth: missing (bytes/s per device per direction)")
            built.append(Tier(name=str(fields.get("name", f"tier{index}")), devices=fields["devices"],
                              bandwidth=fields["bandwidth"], latency=fields["latency"],
                              efficiency=fields["efficiency"], step_overhead=fields["step_overhead"]))
        return cls(name=name, num_devices=num_devices, node_size=node_size, tiers=tuple(built))

    def to_dict(self) -> dict:
        return {"name": self.name, "num_devices": self.num_devices, "node_size": self.node_size,
                "tiers": [tier.to_dict() for tier in self.tiers]}

    def members_per_block(self, group: Group) -> tuple[int, ...]:
        """g_k: members of the group inside one block of each tier, for an even group (`even`)."""
        return tuple(min(group.size, max(1, tier.devices // group.stride)) for tier in self.tiers)

    def even(self, group: Group) -> bool:
        """Whether every group of the dimension has g_k members in each block of tier k it touches:
        each block size divides the cluster and is a multiple of stride·size, or a multiple of the
        stride dividing stride·size, or divides the stride (module docstring)."""
        span = group.stride * group.size
        return all(self.num_devices % tier.devices == 0 and (
            group.stride % tier.devices == 0
            or (tier.devices % group.stride == 0 and (tier.devices % span == 0 or span % tier.devices == 0)))
            for tier in self.tiers)

    def placements(self, group: Group) -> tuple[tuple[TierSpan, ...], ...]:
        """The distinct placements of the dimension's groups on the tiers, one `TierSpan` per tier
        (module docstring): one, in closed form, for an even group; else counted rank by rank."""
        if not self.even(group):
            return counted_placements(tuple(tier.devices for tier in self.tiers), self.num_devices, group)
        spans, below = [], 1
        for members in self.members_per_block(group):
            spans.append(TierSpan(group.size / members, group.size / below, (BlockPart(members, members / below, below),)))
            below = members
        return (tuple(spans),)

    def _spread(self, tier: int, share: float, peers: float) -> float:
        """Seconds per byte for a device to send `share` of its bytes to `peers` members of its block of
        tier `tier`: all through its one port of the tier (a switch)."""
        return share / self.tiers[tier].effective_bandwidth

    def _steps(self, tier: int, steps: float) -> float:
        """Message steps of `steps` ring steps on tier `tier` (a ring: all of them, one after the other)."""
        return steps

    def tier_joining(self, group: Group) -> int:
        """Index of the innermost tier whose blocks hold every group of the dimension whole (its slowest
        link's tier); the outermost for a group larger than the cluster."""
        placements = self.placements(group)
        return next((k for k in range(len(self.tiers)) if all(placement[k].blocks <= 1 for placement in placements)),
                    len(self.tiers) - 1)

    @staticmethod
    def _slowest(collectives: list[Collective]) -> Collective:
        """The collective of the slowest group: the largest time per byte, then the largest fixed time."""
        return max(collectives, key=lambda collective: (collective.per_byte, collective.fixed))

    def all_reduce(self, group: Group) -> Collective:
        """Ring all-reduce of the group: bytes by the hierarchy of rings, latency by the flat ring
        (module docstring); the slowest of the dimension's groups."""
        if group.size <= 1:
            return NO_COMMUNICATION
        return self._slowest([self._all_reduce(placement) for placement in self.placements(group)])

    def _all_reduce(self, placement: tuple[TierSpan, ...]) -> Collective:
        """`all_reduce` of one placement."""
        crossed = [(index, tier, span) for index, (tier, span) in enumerate(zip(self.tiers, placement)) if span.crossed]
        floor = max((tier.step_overhead for _, tier, _ in crossed), default=0.0)
        per_byte = fixed = 0.0
        for index, tier, span in crossed:
            per_byte += max(self._spread(index, 2 * (kind.parts - 1) / kind.parts / kind.fewest, kind.members - 1)
                            if kind.parts > 1 else 0.0 for kind in span.kinds)
            fixed += 2 * self._steps(index, span.blocks_below - span.blocks) * max(tier.latency, floor)
        return Collective(per_byte, fixed)

    def reduce_scatter(self, group: Group) -> Collective:
        """Half of an all-reduce (also the time of an all-gather of the same bytes)."""
        whole = self.all_reduce(group)
        return Collective(whole.per_byte / 2, whole.fixed / 2)

    all_gather = reduce_scatter

    def all_to_all(self, group: Group) -> Collective:
        """All-to-all of the group, each device sending S bytes (S/size to each member): the share
        S·(g_k − g_{k−1})/size that leaves its tier-(k−1) block but stays in its tier-k block crosses
        tier k's links, one message per further block (in a block of unequal parts, the share of its
        part of fewest members). Simplification: the tiers' shares are sent one after the other (no
        overlap between the links of two tiers)."""
        if group.size <= 1:
            return NO_COMMUNICATION
        return self._slowest([self._exchange(group.size, placement) for placement in self.placements(group)])

    def _exchange(self, size: int, placement: tuple[TierSpan, ...], above_node: float = 1.0) -> Collective:
        """`all_to_all` of one placement, the shares crossing the tiers above the first scaled by
        `above_node`."""
        per_byte = fixed = 0.0
        for index, (tier, span) in enumerate(zip(self.tiers, placement)):
            if span.crossed:
                share = max(self._spread(index, (kind.members - kind.fewest) / size, kind.members - kind.fewest)
                            for kind in span.kinds if kind.members > kind.fewest)
                per_byte += share if index == 0 else share * above_node
                fixed += max(self._steps(index, kind.parts - 1) for kind in span.kinds) * tier.latency
        return Collective(per_byte, fixed)

    def dispatch(self, group: Group, choices: int) -> Collective:
        """Top-`choices` token dispatch (or combine) over the group sent once per destination node
        (DeepEP's normal kernels, DeepSeek-V3 §3.2.2): S is the plain all-to-all's bytes (`choices`
        copies of each token); a token crosses the tiers above the node once per node holding one of
        its experts, then is forwarded over the node's links to each expert's device. With experts
        spread evenly over the F = size / g_0 nodes of the group, a node receives a token with
        probability 1 − (1 − 1/F)^choices, so each tier above the node carries
        F·(1 − (1 − 1/F)^choices)/choices of the plain share (picks independent: a simplification, the
        experts of a token are distinct); the node's links carry the plain intra-node share and the
        forwarded copies, (g_0 − 1)/g_0 of what came in. Nodes of unequal parts: F the nodes spanned,
        g_0 the fewest members of one."""
        if group.size <= 1 or self.tier_joining(group) == 0:
            return self.all_to_all(group)
        return self._slowest([self._dispatch(group.size, placement, choices) for placement in self.placements(group)])

    def _dispatch(self, size: int, placement: tuple[TierSpan, ...], choices: int) -> Collective:
        """`dispatch` of one placement."""
        nodes, node = placement[0].blocks, min(kind.members for kind in placement[0].kinds)
        exchange = self._exchange(size, placement, nodes * (1 - (1 - 1 / nodes) ** choices) / choices)
        forwarded = (size - node) / size * (node - 1) / node
        return Collective(exchange.per_byte + (self._spread(0, forwarded, node - 1) if node > 1 else 0.0),
                          exchange.fixed)

    def send(self, tier: int) -> Collective:
        """A point-to-point transfer on tier `tier`."""
        link = self.tiers[tier]
        return Collective(1.0 / link.effective_bandwidth, link.latency)

    def size_ranges(self, stride: int, largest: int) -> list[tuple[int, int, int]]:
        """(tier, fewest, most): the sizes up to `largest` of a group at `stride` whose slowest link is
        on each tier (e.g. the pipeline depths whose slowest stage boundary is there), in runs of
        consecutive sizes. Inner blocks of a power of two times the stride (or dividing it) that divide
        the cluster: sizes up to N_k // stride on tier k (named simplification: a size that is not a power
        of two may straddle blocks); otherwise each size's `tier_joining` (a tier may get several runs)."""
        if not all(self.num_devices % tier.devices == 0 and (
                stride % tier.devices == 0 or (tier.devices % stride == 0 and _power_of_two(tier.devices // stride)))
                for tier in self.tiers[:-1]):
            ranges: list[tuple[int, int, int]] = []
            for size in range(1, largest + 1):
                tier = self.tier_joining(Group(size, stride))
                if ranges and ranges[-1][0] == tier:
                    ranges[-1] = (tier, ranges[-1][1], size)
                else:
                    ranges.append((tier, size, size))
            return ranges
        ranges, low = [], 1
        for index, tier in enumerate(self.tiers):
            last = index == len(self.tiers) - 1
            high = largest if last else min(largest, max(1, tier.devices // stride))
            if high >= low:
                ranges.append((index, low, high))
                low = high + 1
        return ranges

    def spans(self, groups: Mapping[str, Group]) -> dict[str, str]:
        """The name of the tier each group's slowest link is on (groups of one device: none)."""
        return {name: self.tiers[self.tier_joining(group)].name if group.size > 1 else "none"
                for name, group in groups.items()}


@dataclass(frozen=True)
class FullyConnected(Cluster):
    """A cluster whose nodes join each pair of their devices by its own link (AMD's Infinity Fabric on
    an 8-GPU MI300X platform: 7 links per GPU), the nodes joined by the tiers above as in `Cluster`.
    The first tier's `bandwidth` is one link's, per direction.

    Inside a node a device sends its share to each peer over that peer's link, all at once: a
    reduce-scatter of g members in the node sends S/g to each of the g − 1 others, S·(g−1)/g over
    g − 1 links, S/g / B_link (a group of 2 uses one link, not all 7); an all-gather the same, an
    all-reduce twice that; an all-to-all S/n to each peer, S/n / B_link. Each such exchange is one
    message step (latency λ_0 once, not g − 1 ring steps). Shares leaving the node are priced over
    the tiers above as `Cluster` prices them; a point-to-point transfer takes one link.
    Simplification: the exchanges inside a node and the rings above it are priced one after the
    other, as the tiers of `Cluster`; a node holding members of several groups of one dimension gives
    each its own links (the pairs of different groups are distinct links)."""

    def _spread(self, tier: int, share: float, peers: float) -> float:
        """`share` of a device's bytes over `peers` links at once inside the node; a switch's port
        above it."""
        if tier:
            return super()._spread(tier, share, peers)
        return share / peers / self.tiers[0].effective_bandwidth

    def _steps(self, tier: int, steps: float) -> float:
        """Inside the node one direct exchange (at most one step); ring steps above it."""
        return steps if tier else min(steps, 1)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "topology": "fully_connected"}
