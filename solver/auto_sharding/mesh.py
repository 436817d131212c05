"""A logical device mesh: named axes, each with a size and the time of a collective among the
devices along it.

The collectives' ring costs (`AlphaBeta`) are the one place the package prices communication. With
n devices along the axis, α the latency of one message step [s], β the inverse bandwidth of one
link [s/byte] and B the tensor's full size along the axis [bytes] (its size on one device times n
when it is sharded along the axis; on a multi-axis mesh the tensor's size already divided by the
shards along the other axes):

- all-reduce (ring: a reduce-scatter then an all-gather): 2(n−1)·α + 2(n−1)/n · B·β;
- all-gather and reduce-scatter: (n−1)·α + (n−1)/n · B·β;
- all-to-all (pairwise exchange: each device sends (n−1)/n of its B/n share): (n−1)·α + (n−1)/n² · B·β;

each plus γ, the fixed cost of one collective call (NCCL's tuning model charges a base latency per
call beside its per-step latency: src/graph/tuning.cc, baseLat), so one all-reduce costs γ less than
the reduce-scatter and all-gather it equals in steps and bytes.

Source: Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005 (ring all-gather, reduce-scatter and all-reduce; pairwise all-to-all);
NCCL's performance notes (the "bus bandwidth" factors 2(n−1)/n and (n−1)/n) give the same
bandwidth terms. A collective over an axis of size 1 costs nothing.

Another cost model of an axis only has to implement `AxisCollectives`: cluster_axis.py prices an
axis by phaze's cluster model, on the links of the levels of the hierarchy the axis spans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from phaze_common.checks import InputError, non_negative_number, positive_integer


@runtime_checkable
class AxisCollectives(Protocol):
    """Seconds of each collective among the devices of one mesh axis; `full_bytes` is the tensor's
    size unsharded along that axis."""

    def all_reduce(self, full_bytes: float) -> float: ...

    def all_gather(self, full_bytes: float) -> float: ...

    def reduce_scatter(self, full_bytes: float) -> float: ...

    def all_to_all(self, full_bytes: float) -> float: ...


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    """Ring collectives among `devices` devices: α seconds per message step, β seconds per byte
    (the formulas are in the module docstring)."""

    devices: int
    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        positive_integer("devices", self.devices)
        non_negative_number("alpha", self.alpha)
        non_negative_number("beta", self.beta)
        non_negative_number("gamma", self.gamma)

    def _ring(self, steps: float, share: float, full_bytes: float) -> float:
        """γ + steps·α + share·B·β; nothing among one device."""
        if self.devices == 1:
            return 0.0
        return self.gamma + steps * self.alpha + share * full_bytes * self.beta

    def all_reduce(self, full_bytes: float) -> float:
        n = self.devices
        return self._ring(2 * (n - 1), 2 * (n - 1) / n, full_bytes)

    def all_gather(self, full_bytes: float) -> float:
        n = self.devices
        return self._ring(n - 1, (n - 1) / n, full_bytes)

    def reduce_scatter(self, full_bytes: float) -> float:
        return self.all_gather(full_bytes)

    def all_to_all(self, full_bytes: float) -> float:
        n = self.devices
        return self._ring(n - 1, (n - 1) / n**2, full_bytes)


@dataclass(frozen=True, kw_only=True)
class MeshAxis:
    """One axis of the mesh: its name, its number of devices and its collectives' cost model."""

    name: str
    size: int
    collectives: AxisCollectives

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InputError(f"mesh axis name: must be an identifier, got {self.name!r}")
        positive_integer(f"mesh axis {self.name} size", self.size)
        if not isinstance(self.collectives, AxisCollectives):
            raise InputError(f"mesh axis {self.name} collectives: must implement AxisCollectives, "
                             f"got {type(self.collectives).__name__}")


@dataclass(frozen=True, kw_only=True)
class DeviceMesh:
    """Devices arranged as the product of `axes` (one or two axes, e.g. intra-node × inter-node)."""

    axes: tuple[MeshAxis, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.axes) <= 2:
            raise InputError(f"mesh axes: must hold 1 or 2 axes, got {len(self.axes)}")
        names = [axis.name for axis in self.axes]
        if len(set(names)) != len(names):
            raise InputError(f"mesh axes: names must differ, got {names}")

    @classmethod
    def alpha_beta(cls, sizes: dict[str, int], alpha: float | dict[str, float],
                   beta: float | dict[str, float], gamma: float = 0.0) -> DeviceMesh:
        """A mesh of ring collectives: `sizes` axis name -> devices; α, β one number or one per axis,
        γ (a call's fixed cost) one for all."""
        def per_axis(value: float | dict[str, float], name: str) -> float:
            return value[name] if isinstance(value, dict) else value

        return cls(axes=tuple(
            MeshAxis(name=name, size=size,
                     collectives=AlphaBeta(devices=size, alpha=per_axis(alpha, name), beta=per_axis(beta, name),
                                           gamma=gamma))
            for name, size in sizes.items()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(axis.size for axis in self.axes)
