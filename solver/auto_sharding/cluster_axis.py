"""Mesh axes priced by phaze's cluster model (`phaze_hardware.Cluster`): an axis is a `Group` of the
cluster (`size` devices `stride` ranks apart), and its collectives are the cluster's collectives of
that group, so an axis inside a node is priced on the node's links and one across nodes on the
links between them (phaze_hardware/cluster.py: hierarchy of rings, latency of the flat ring).

Byte conventions. `AxisCollectives` takes the tensor's full size along the axis; the cluster's
all-reduce, all-gather and reduce-scatter take the same (the training-step model prices the
data-parallel all-gather on the whole weights and the reduce-scatter on the whole gradients:
solver/training_step/data_parallel.py). The cluster's all-to-all takes the bytes each device sends
in all, S (a token dispatch's bytes of one device: solver/training_step/layer_terms.py,
`expert_dispatch`); a device holds 1/size of the tensor, so S = full_bytes / size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phaze_common.checks import InputError
from phaze_hardware import Group, Network

from .mesh import DeviceMesh, MeshAxis


@dataclass(frozen=True, kw_only=True)
class ClusterAxis:
    """The collectives among the devices of `group` on `cluster` (an `AxisCollectives`)."""

    cluster: Network
    group: Group

    def __post_init__(self) -> None:
        if self.group.size < 1 or self.group.stride < 1:
            raise InputError(f"group: size and stride must be positive integers, got {self.group}")
        if self.group.size * self.group.stride > self.cluster.num_devices:
            raise InputError(f"group: size·stride must be at most the cluster's {self.cluster.num_devices} "
                             f"devices, got {self.group}")

    def all_reduce(self, full_bytes: float) -> float:
        return self.cluster.all_reduce(self.group).scalar(full_bytes)

    def all_gather(self, full_bytes: float) -> float:
        return self.cluster.all_gather(self.group).scalar(full_bytes)

    def reduce_scatter(self, full_bytes: float) -> float:
        return self.cluster.reduce_scatter(self.group).scalar(full_bytes)

    def all_to_all(self, full_bytes: float) -> float:
        return self.cluster.all_to_all(self.group).scalar(full_bytes / self.group.size)


def cluster_mesh(cluster: Network, axes: Mapping[str, Group]) -> DeviceMesh:
    """A mesh of one axis per `axes` entry (axis name -> the group of its devices), priced by `cluster`;
    e.g. {"node": Group(8, 1), "across": Group(4, 8)} on nodes of 8."""
    devices = 1
    for group in axes.values():
        devices *= group.size
    if devices > cluster.num_devices:
        raise InputError(f"axes: the groups' sizes multiply to {devices}, more than the cluster's "
                         f"{cluster.num_devices} devices")
    return DeviceMesh(axes=tuple(
        MeshAxis(name=name, size=group.size, collectives=ClusterAxis(cluster=cluster, group=group))
        for name, group in axes.items()))
