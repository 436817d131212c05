"""Hardware in one place: the chips that exist (hardware/chips/), the template chips the
architecture search builds on (hardware/templates/, with the area model), the systems that join chips
into clusters (hardware/systems/), and the cluster's network with the time of its collectives.

A new chip or system is a data file here; a new network shape is a class with the methods of
`Network` (hardware/cluster.py) named in `hardware.systems.TOPOLOGIES`.
"""

from hardware.accelerator import (
                                  DEFAULT_BUDGET,
                                  POWER_OF_TWO_FIELDS,
                                  AcceleratorConfig,
                                  CoreConfig,
                                  EnergyCosts,
                                  accelerator_names,
                                  named_accelerator,
)
from hardware.area import MIB, area_um2
from hardware.chips import KNOWN_CHIPS, KnownChip, known_chip
from hardware.cluster import NO_COMMUNICATION, Cluster, Collective, Group, Network, Tier
from hardware.systems import SYSTEMS, System, cluster, system, system_of

__all__ = [
    "DEFAULT_BUDGET",
    "KNOWN_CHIPS",
    "MIB",
    "NO_COMMUNICATION",
    "POWER_OF_TWO_FIELDS",
    "SYSTEMS",
    "AcceleratorConfig",
    "Cluster",
    "Collective",
    "CoreConfig",
    "EnergyCosts",
    "Group",
    "KnownChip",
    "Network",
    "System",
    "Tier",
    "accelerator_names",
    "area_um2",
    "cluster",
    "known_chip",
    "named_accelerator",
    "system",
    "system_of",
]
