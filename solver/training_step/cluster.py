"""The cluster: devices in nodes joined by tiers of links, Megatron's group layout, and the time of
the collectives and transfers that run on it.

Layout (Megatron-LM): rank = tensor_rank + t·(data_rank + d·pipeline_rank), so a tensor-parallel
group is t consecutive devices, a data-parallel group d devices at stride t, and the stages of a
pipeline are t·d devices apart. A group of n devices at stride σ puts g_k = min(n, max(1, N_k // σ))
members in each block of tier k (N_k devices per block: a node, the whole cluster). Collectives are
hierarchical (NCCL's tree of rings): level k is a ring of f_k = g_k / g_{k-1} blocks of tier k-1
carrying 1/g_{k-1} of the data, so for two tiers

    all_reduce(S) = 2(g−1)/g · S / B_intra + 2(k−1)/k · (S/g) / B_inter + 2(g−1)·λ_intra + 2(k−1)·λ_inter

with B = bandwidth × efficiency per device per direction and λ the latency per ring step;
reduce-scatter and all-gather are half of it. Simplification: a group is assumed to spread evenly
over the blocks of each tier (exact when sizes and strides are powers of two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tier:
    """One level of links: a group of this tier joins `devices` devices (a block)."""

    name: str
    devices: int
    bandwidth: float  # bytes/s per device per direction
    latency: float  # s per message (one ring step)
    efficiency: float  # achievable fraction of the bandwidth

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency

    def to_dict(self) -> dict:
        return {"name": self.name, "devices": self.devices, "bandwidth": self.bandwidth, "latency": self.latency,
                "efficiency": self.efficiency}


@dataclass(frozen=True)
class Collective:
    """The time of one collective (or transfer) of a fixed group: per_byte · S + fixed, 0 for S = 0."""

    per_byte: float  # s per byte
    fixed: float  # s

    def time(self, num_bytes):
        """Seconds for `num_bytes` (a number or an array)."""
        return np.where(np.asarray(num_bytes) > 0, self.per_byte * num_bytes + self.fixed, 0.0)

    def scalar(self, num_bytes: float) -> float:
        return float(self.time(num_bytes))


NO_COMMUNICATION = Collective(0.0, 0.0)


def _check(field: str, value: object, positive: bool = True, at_most_one: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field}: must be a finite number, got {value!r}")
    if (positive and value <= 0) or value < 0 or (at_most_one and value > 1):
        bound = "in (0, 1]" if at_most_one else "> 0" if positive else ">= 0"
        raise ValueError(f"{field}: must be {bound}, got {value!r}")
    return float(value)


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
        for field in ("num_devices", "node_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"system.{field}: must be a positive integer, got {value!r}")
        if self.num_devices % self.node_size:
            raise ValueError(f"num_devices: {self.num_devices} is not a multiple of system.node_size="
                             f"{self.node_size}; allowed: a multiple of {self.node_size} (or a node_size dividing it)")
        if not self.tiers:
            raise ValueError("system.tiers: must list at least one tier of links")
        previous = 1
        for index, tier in enumerate(self.tiers):
            where = f"system.tiers[{index}]"
            _check(f"{where}.bandwidth", tier.bandwidth)
            _check(f"{where}.latency", tier.latency, positive=False)
            _check(f"{where}.efficiency", tier.efficiency, at_most_one=True)
            if isinstance(tier.devices, bool) or not isinstance(tier.devices, int) or tier.devices % previous:
                raise ValueError(f"{where}.devices: must be a multiple of the previous tier's {previous}, "
                                 f"got {tier.devices!r}")
            previous = tier.devices
        if self.tiers[-1].devices != self.num_devices:
            raise ValueError(f"system.tiers: the last tier must join all {self.num_devices} devices, "
                             f"got {self.tiers[-1].devices}")

    @classmethod
    def build(cls, name: str, num_devices: int, node_size: int, tiers: list[dict]) -> Cluster:
        """From a config: tiers without `devices` join a node (all but the last) or the cluster (the last)."""
        built = []
        for index, tier in enumerate(tiers):
            fields = dict(tier)
            unknown = sorted(set(fields) - {"name", "devices", "bandwidth", "latency", "efficiency"})
            if unknown:
                raise ValueError(f"system.tiers[{index}]: unknown field {unknown[0]!r}; "
                                 "allowed: name, devices, bandwidth, latency, efficiency")
            if fields.get("devices") is None:
                fields["devices"] = num_devices if index == len(tiers) - 1 else node_size
            fields.setdefault("latency", 0.0)
            fields.setdefault("efficiency", 1.0)
            if "bandwidth" not in fields:
                raise ValueError(f"system.tiers[{index}].bandwidth: missing (bytes/s per device per direction)")
            built.append(Tier(name=str(fields.get("name", f"tier{index}")), devices=fields["devices"],
                              bandwidth=fields["bandwidth"], latency=fields["latency"],
                              efficiency=fields["efficiency"]))
        return cls(name=name, num_devices=num_devices, node_size=node_size, tiers=tuple(built))

    def to_dict(self) -> dict:
        return {"name": self.name, "num_devices": self.num_devices, "node_size": self.node_size,
                "tiers": [tier.to_dict() for tier in self.tiers]}

    def members_per_block(self, size: int, stride: int) -> tuple[int, ...]:
        """g_k: members of a group of `size` devices at `stride` inside one block of each tier."""
        return tuple(min(size, max(1, tier.devices // stride)) for tier in self.tiers)

    def tier_joining(self, size: int, stride: int) -> int:
        """Index of the innermost tier whose blocks hold a whole group (its slowest link's tier); the
        outermost for a group larger than the cluster."""
        members = self.members_per_block(size, stride)
        return next((k for k, held in enumerate(members) if held >= size), len(self.tiers) - 1)

    def all_reduce(self, size: int, stride: int) -> Collective:
        """Hierarchical ring all-reduce of a group of `size` devices at `stride` (module docstring)."""
        if size <= 1:
            return NO_COMMUNICATION
        per_byte = fixed = 0.0
        below = 1
        for tier, members in zip(self.tiers, self.members_per_block(size, stride)):
            ring = members / below
            if ring > 1:
                per_byte += 2 * (ring - 1) / ring / below / tier.effective_bandwidth
                fixed += 2 * (ring - 1) * tier.latency
            below = members
        return Collective(per_byte, fixed)

    def reduce_scatter(self, size: int, stride: int) -> Collective:
        """Half of an all-reduce (also the time of an all-gather of the same bytes)."""
        whole = self.all_reduce(size, stride)
        return Collective(whole.per_byte / 2, whole.fixed / 2)

    all_gather = reduce_scatter

    def all_to_all(self, size: int, stride: int) -> Collective:
        """All-to-all of a group of `size` devices at `stride`, each device sending S bytes (S/size to
        each member): the share S·(g_k − g_{k−1})/size that leaves its tier-(k−1) block but stays in
        its tier-k block crosses tier k's links, one message per further block. Simplification: the
        tiers' shares are sent one after the other (no overlap between the links of two tiers)."""
        if size <= 1:
            return NO_COMMUNICATION
        per_byte = fixed = 0.0
        below = 1
        for tier, members in zip(self.tiers, self.members_per_block(size, stride)):
            if members > below:
                per_byte += (members - below) / size / tier.effective_bandwidth
                fixed += (members / below - 1) * tier.latency
            below = members
        return Collective(per_byte, fixed)

    def send(self, tier: int) -> Collective:
        """A point-to-point transfer on tier `tier`."""
        link = self.tiers[tier]
        return Collective(1.0 / link.effective_bandwidth, link.latency)

    # The groups of a placement with tensor width t and data-parallel degree d (Megatron's layout).

    def tensor_parallel(self, width: int) -> Collective:
        """All-reduce of the tensor-parallel group (t consecutive devices)."""
        return self.all_reduce(width, 1)

    def expert_parallel(self, width: int, experts_width: int) -> Collective:
        """Token all-to-all of an expert-parallel group: e data-parallel replicas at stride t
        (Megatron's layout: consecutive data-parallel ranks)."""
        return self.all_to_all(experts_width, width)

    def data_parallel_tier(self, width: int, degree: int) -> int:
        return self.tier_joining(degree, width)

    def pipeline_tier(self, width: int, degree: int, stages: int) -> int:
        """Tier of the slowest link between consecutive stages (stages are t·d devices apart)."""
        return self.tier_joining(stages, width * degree)

    def pipeline_tier_depths(self, width: int, degree: int, max_stages: int) -> list[tuple[int, int, int]]:
        """(tier, fewest stages, most stages): the depths whose slowest stage boundary is on each tier."""
        ranges, low = [], 1
        for index, tier in enumerate(self.tiers):
            last = index == len(self.tiers) - 1
            high = max_stages if last else min(max_stages, max(1, tier.devices // (width * degree)))
            if high >= low:
                ranges.append((index, low, high))
                low = high + 1
        return ranges
