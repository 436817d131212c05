"""A cluster: devices in nodes joined by tiers of links (a hierarchical network: NVLink inside a node,
InfiniBand between nodes; or one tier, a TPU pod's ICI), and the time of the collectives and
transfers of a group of its devices.

A group is `size` devices `stride` ranks apart (`Group`; which ranks form the groups of a parallel
layout is the layout's business: `solver.layout`). A group of n devices at stride σ puts
g_k = min(n, max(1, N_k // σ)) members in each block of tier k (N_k devices per block: a node, the
whole cluster). A collective's bytes are priced as a hierarchy of rings: level k is a ring of
f_k = g_k / g_{k-1} blocks of tier k-1 carrying 1/g_{k-1} of the data. Its latency is NCCL's ring
of all n members, node after node (NCCL's rings are flat: one ring through every rank): a step per
member, n/g_{k-1} − n/g_k of them across tier k (NCCL's tuning model, (nsteps − nInterSteps) ·
intraLat + nInterSteps · interLat, NVIDIA/nccl src/graph/tuning.cc). For two tiers (k = n/g nodes)

    all_reduce(S) = 2(g−1)/g · S / B_intra + 2(k−1)/k · (S/g) / B_inter + 2(n−k)·λ_intra + 2(k−1)·λ_inter

with B = bandwidth × efficiency per device per direction and λ the latency per ring step, at
least the `step_overhead` of the outermost tier the ring crosses (NCCL's model: a ring leaving the
node posts every step to the network, so each step takes at least that proxy's overhead);
reduce-scatter and all-gather are half of it. Simplifications: a group is assumed to spread evenly
over the blocks of each tier (exact when sizes and strides are powers of two); NCCL's tree
algorithm (logarithmic latency, all-reduce only) is not priced.

`Network` is what the training-step model asks of a cluster; `Cluster` is its hierarchical-tier
shape. Another shape (a torus) is another class with the same methods, named by a system's
`topology` (phaze_hardware/systems.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from phaze_common.checks import InputError, fraction, non_negative_number, positive_integer, positive_number, unknown_fields

#: The fields of a tier in a system's data.
TIER_FIELDS = ("name", "devices", "bandwidth", "latency", "efficiency", "step_overhead")


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
class Cluster:
    """`num_devices` accelerators in nodes of `node_size`, joined by `tiers` (innermost first).

    Each tier's `devices` divides the next one's; the last tier joins all devices.
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
            if isinstance(tier.devices, bool) or not isinstance(tier.devices, int) or tier.devices % previous:
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
        latency and step_overhead default to 0, efficiency to 1."""
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
        """g_k: members of the group inside one block of each tier."""
        return tuple(min(group.size, max(1, tier.devices // group.stride)) for tier in self.tiers)

    def tier_joining(self, group: Group) -> int:
        """Index of the innermost tier whose blocks hold a whole group (its slowest link's tier); the
        outermost for a group larger than the cluster."""
        members = self.members_per_block(group)
        return next((k for k, held in enumerate(members) if held >= group.size), len(self.tiers) - 1)

    def all_reduce(self, group: Group) -> Collective:
        """Ring all-reduce of the group: bytes by the hierarchy of rings, latency by the flat ring
        (module docstring)."""
        if group.size <= 1:
            return NO_COMMUNICATION
        held = self.members_per_block(group)
        crossed = [(tier, members, below) for tier, members, below in zip(self.tiers, held, (1, *held)) if members > below]
        floor = max((tier.step_overhead for tier, _, _ in crossed), default=0.0)
        per_byte = fixed = 0.0
        for tier, members, below in crossed:
            ring = members / below
            per_byte += 2 * (ring - 1) / ring / below / tier.effective_bandwidth
            fixed += 2 * (group.size / below - group.size / members) * max(tier.latency, floor)
        return Collective(per_byte, fixed)

    def reduce_scatter(self, group: Group) -> Collective:
        """Half of an all-reduce (also the time of an all-gather of the same bytes)."""
        whole = self.all_reduce(group)
        return Collective(whole.per_byte / 2, whole.fixed / 2)

    all_gather = reduce_scatter

    def all_to_all(self, group: Group) -> Collective:
        """All-to-all of the group, each device sending S bytes (S/size to each member): the share
        S·(g_k − g_{k−1})/size that leaves its tier-(k−1) block but stays in its tier-k block crosses
        tier k's links, one message per further block. Simplification: the tiers' shares are sent one
        after the other (no overlap between the links of two tiers)."""
        return self._exchange(group)

    def _exchange(self, group: Group, above_node: float = 1.0) -> Collective:
        """`all_to_all` with the shares crossing the tiers above the first scaled by `above_node`."""
        if group.size <= 1:
            return NO_COMMUNICATION
        per_byte = fixed = 0.0
        below = 1
        for index, (tier, members) in enumerate(zip(self.tiers, self.members_per_block(group))):
            if members > below:
                share = (members - below) / group.size / tier.effective_bandwidth
                per_byte += share if index == 0 else share * above_node
                fixed += (members / below - 1) * tier.latency
            below = members
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
        forwarded copies, (g_0 − 1)/g_0 of what came in."""
        members = self.members_per_block(group)
        if group.size <= 1 or members[0] >= group.size:
            return self.all_to_all(group)
        nodes = group.size / members[0]
        exchange = self._exchange(group, nodes * (1 - (1 - 1 / nodes) ** choices) / choices)
        forwarded = (group.size - members[0]) / group.size * (members[0] - 1) / members[0]
        return Collective(exchange.per_byte + forwarded / self.tiers[0].effective_bandwidth, exchange.fixed)

    def send(self, tier: int) -> Collective:
        """A point-to-point transfer on tier `tier`."""
        link = self.tiers[tier]
        return Collective(1.0 / link.effective_bandwidth, link.latency)

    def size_ranges(self, stride: int, largest: int) -> list[tuple[int, int, int]]:
        """(tier, fewest, most): the sizes up to `largest` of a group at `stride` whose slowest link is
        on each tier (e.g. the pipeline depths whose slowest stage boundary is there)."""
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
