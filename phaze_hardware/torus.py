"""A TPU pod's network: each slice a 2-D or 3-D torus of point-to-point ICI links, the slices joined
by the data-centre network (the tiers after the torus, as in `phaze_hardware.cluster.Cluster`).

Shape. A slice of N chips is laid out as the near-cube of Google's slice shapes (`slice_shape`:
64 → 4×4×4, 128 → 4×4×8, 256 on two axes → 16×16, 6,144 → 16×16×24), shortest axis first. An axis
has wraparound links when its length is a multiple of the system's `wraparound` (TPU v4 and v5p: 4,
"a 3D torus on slices where each dimension is a multiple of 4", Google Cloud "TPU v4"; v5e: 16, "with
wraparounds along any axis of size 16", Austin et al., "How to Scale Your Model" (2025), Part 2);
otherwise it is a line (a mesh axis). Ranks fill the axes in order (rank r at x = r mod X,
y = (r div X) mod Y, ...), slice after slice, so the rank order tp-cp-ep-dp-pp puts the tensor group
on the first axis (`solver.layout`).

A group (`Group`: size n, stride σ) then spans m_a members on axis a, σ / (chips before axis a) links
apart (`_axes`): the same block arithmetic as the tiers of a cluster, with the axes as its inner
tiers (`tiers` lists one per axis, then the data-centre tiers). Collectives:

- On one axis, a ring of m members: closed by the wraparound when it covers the whole axis, with
  half the data each way round (2 links per direction per chip); on a line (a part of an axis, or
  an axis without wraparound) the ring's return path shares the links, so 1 link per direction
  (the torus "doubles both the bisection bandwidth and the bandwidth of ... all-reduce versus the
  mesh", Jouppi et al., ISCA 2023, §2.6). Members s links apart share each link with the s groups
  interleaved between them: the bandwidth ÷ s.
- On several axes at once (`_reduce_scatter_on_axes`): the data split into one part per axis, each
  part reduced along the axes in a rotated order, so every phase uses all axes' links at once
  (how a multi-axis reduction reaches the sum of the axes' bandwidths, the scaling book, Part 3).
- Across slices: the hierarchical ring of `Cluster` on the 1/n_ICI of the data each chip holds after
  the slice's reduce-scatter.
- All-to-all: bisection-bound per axis, m²/(4(m−1)) × the ring's time per byte for a ring of m
  (each chip's bytes cross on average m/4 links of a closed ring, m/2 of a line). Simplification:
  the axes' shares one after the other, as `Cluster.all_to_all`; MoE dispatch is the plain
  all-to-all (no per-node deduplication on a torus).
- A point-to-point transfer (pipeline stages) over one link in one direction.

Latency is per ring step (a step crossing s links costs one step: ICI routes through chips without
software). Simplifications: ranks map onto the axes in order (XLA may choose another device order);
axes of a non-power-of-two length divide by the stride only approximately; twisted tori (v4's
all-to-all option) are not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phaze_common.checks import InputError, integer, positive_integer, unknown_fields
from phaze_hardware.cluster import NO_COMMUNICATION, TIER_FIELDS, Cluster, Collective, Group, Tier

#: The fields of a torus system's first tier (its ICI): a tier's, with `bandwidth` per link per
#: direction, the number of torus `dimensions` and the `wraparound` rule.
TORUS_FIELDS = (*(field for field in TIER_FIELDS if field != "ranks"), "dimensions", "wraparound")
#: Names of the axes.
AXIS_NAMES = "xyz"


def prime_factors(number: int) -> list[int]:
    factors, divisor = [], 2
    while number > 1:
        while number % divisor == 0:
            factors.append(divisor)
            number //= divisor
        divisor += 1
    return factors


def slice_shape(chips: int, dimensions: int) -> tuple[int, ...]:
    """Chips along each axis of a slice, shortest first: each prime factor of `chips`, largest
    first, multiplies the shortest axis (a near-cube, as Google's slice shapes)."""
    shape = [1] * dimensions
    for factor in sorted(prime_factors(chips), reverse=True):
        shape[shape.index(min(shape))] *= factor
    return tuple(sorted(shape))


@dataclass(frozen=True)
class Axis:
    """The part of a group on one torus axis: `members` chips `spacing` links apart, on a ring of
    `bandwidth` bytes/s per chip per direction (after efficiency and sharing), `latency` per step."""

    members: int
    spacing: float
    bandwidth: float
    latency: float

    def ring_share(self) -> float:
        """(m − 1)/m: the share of its data a chip sends in a reduce-scatter on this axis."""
        return (self.members - 1) / self.members


@dataclass(frozen=True)
class Torus(Cluster):
    """`num_devices` chips in slices of `shape` (a torus of ICI links; `wraps[a]`: axis a has
    wraparound), `link` the ICI's tier (bandwidth per link per direction); `tiers` one per axis
    (a whole axis' ring bandwidth, for reports and the pipeline's tier) then the data-centre tiers."""

    shape: tuple[int, ...] = ()
    wraps: tuple[bool, ...] = ()
    link: Tier | None = None

    @classmethod
    def build(cls, name: str, num_devices: int, node_size: int, tiers: list[Mapping], slices: int = 1) -> Torus:
        """From a system's data: the first tier is the torus of a slice (`devices: slice`, or the whole
        cluster; `bandwidth` per link per direction, `dimensions` 1–3 (default 3), `wraparound`: an
        axis of a multiple of this length wraps (default 4)), the others as `Cluster.build`'s."""
        if not tiers:
            raise InputError("system.tiers: must list at least one tier of links")
        torus = dict(tiers[0])
        unknown_fields("system.tiers[0]", torus, TORUS_FIELDS)
        dimensions = integer("system.tiers[0].dimensions", torus.pop("dimensions", 3), 1, 3)
        wraparound = positive_integer("system.tiers[0].wraparound", torus.pop("wraparound", 4))
        if torus.get("devices") not in (None, "slice"):
            raise InputError(f"system.tiers[0].devices: a torus joins a slice; allowed: slice (or leave it out), "
                             f"got {torus['devices']!r}")
        torus["devices"] = "slice"
        flat = Cluster.build(name, num_devices, node_size, [torus, *tiers[1:]], slices)
        link, chips = flat.tiers[0], flat.tiers[0].devices
        shape = slice_shape(chips, dimensions)
        wraps = tuple(length > 2 and length % wraparound == 0 for length in shape)
        axes, before = [], 1
        for index, (length, wrap) in enumerate(zip(shape, wraps)):
            before *= length
            axes.append(Tier(name=f"{link.name}_{AXIS_NAMES[index]}", devices=before,
                             bandwidth=link.bandwidth * (2 if wrap else 1), latency=link.latency,
                             efficiency=link.efficiency))
        return cls(name=name, num_devices=num_devices, node_size=node_size, tiers=(*axes, *flat.tiers[1:]),
                   shape=shape, wraps=wraps, link=link)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "topology": "torus", "slice_shape": list(self.shape),
                "wraparound": list(self.wraps), "link": self.link.to_dict()}

    def _axes(self, group: Group) -> list[Axis]:
        """The group's members on each torus axis it spans."""
        members, found, below = self.members_per_block(group), [], 1
        for index, (length, wrap) in enumerate(zip(self.shape, self.wraps)):
            count = members[index] // below
            if count > 1:
                spacing = max(1.0, group.stride / (self.tiers[index - 1].devices if index else 1))
                closed = wrap and count * spacing == length
                bandwidth = (2 if closed else 1) * self.link.effective_bandwidth / spacing
                found.append(Axis(count, spacing, bandwidth, self.link.latency))
            below = members[index]
        return found

    def _outer(self, group: Group, double: float) -> tuple[float, float]:
        """(per byte, fixed) of the rings over the tiers beyond the torus (the slices), on the
        1/n_ICI of the data left to each chip: `Cluster.all_reduce`'s terms × `double` / 2."""
        members = self.members_per_block(group)
        dimensions = len(self.shape)
        per_byte = fixed = 0.0
        below = members[dimensions - 1]
        for tier, held in zip(self.tiers[dimensions:], members[dimensions:]):
            ring = held / below
            if ring > 1:
                per_byte += double * (ring - 1) / ring / below / tier.effective_bandwidth
                fixed += double * (ring - 1) * tier.latency
            below = held
        return per_byte, fixed

    @staticmethod
    def _reduce_scatter_on_axes(axes: list[Axis]) -> tuple[float, float]:
        """(per byte, fixed) of a reduce-scatter over the axes: part p of k (1/k of the data) goes
        through the axes in the order rotated by p, so phase j puts one part on each axis; a phase
        lasts as long as its slowest part, the phases one after the other."""
        count = len(axes)
        per_byte = fixed = 0.0
        for phase in range(count):
            slowest = latest = 0.0
            for part in range(count):
                order = [axes[(part + step) % count] for step in range(phase + 1)]
                held = 1.0
                for done in order[:-1]:
                    held /= done.members
                axis = order[-1]
                slowest = max(slowest, held / count * axis.ring_share() / axis.bandwidth)
                latest = max(latest, (axis.members - 1) * axis.latency)
            per_byte += slowest
            fixed += latest
        return per_byte, fixed

    def reduce_scatter(self, group: Group) -> Collective:
        """Reduce-scatter of S bytes per chip: on the torus axes at once (module docstring), then
        over the slices."""
        if group.size <= 1:
            return NO_COMMUNICATION
        per_byte, fixed = self._reduce_scatter_on_axes(self._axes(group))
        outer_per_byte, outer_fixed = self._outer(group, 1.0)
        return Collective(per_byte + outer_per_byte, fixed + outer_fixed)

    all_gather = reduce_scatter

    def all_reduce(self, group: Group) -> Collective:
        """A reduce-scatter then an all-gather of the same bytes."""
        half = self.reduce_scatter(group)
        return Collective(2 * half.per_byte, 2 * half.fixed)

    def all_to_all(self, group: Group) -> Collective:
        """Each chip sends S bytes, S/n to each member: the share for members across each axis at
        the axis' bisection rate, then the slices' share as `Cluster.all_to_all` (module docstring)."""
        if group.size <= 1:
            return NO_COMMUNICATION
        per_byte = fixed = 0.0
        before = 1
        for axis in self._axes(group):
            share = before * (axis.members - 1) / group.size
            per_byte += share * axis.members ** 2 / (4 * (axis.members - 1)) / axis.bandwidth
            fixed += (axis.members - 1) * axis.latency
            before *= axis.members
        members, dimensions = self.members_per_block(group), len(self.shape)
        below = members[dimensions - 1]
        for tier, held in zip(self.tiers[dimensions:], members[dimensions:]):
            if held > below:
                per_byte += (held - below) / group.size / tier.effective_bandwidth
                fixed += (held / below - 1) * tier.latency
            below = held
        return Collective(per_byte, fixed)

    def dispatch(self, group: Group, choices: int) -> Collective:
        """Top-k dispatch: the plain all-to-all (a torus has no node of shared links to deduplicate on)."""
        return self.all_to_all(group)

    def send(self, tier: int) -> Collective:
        """A point-to-point transfer: over one ICI link in one direction on a torus axis, else on the tier."""
        if tier < len(self.shape):
            return Collective(1.0 / self.link.effective_bandwidth, self.link.latency)
        return super().send(tier)
