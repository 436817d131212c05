"""Hardware in one place: the chips that exist (phaze_hardware/chips/), the template chips the
architecture search builds on (phaze_hardware/templates/, with the area model), the systems that join chips
into clusters (phaze_hardware/systems/), and the cluster's network with the time of its collectives.

A new chip or system is a data file here; a new network shape is a class with the methods of
`Network` (phaze_hardware/cluster.py) named in `phaze_hardware.systems.TOPOLOGIES`.
"""

from phaze_hardware.accelerator import (
                                  DEFAULT_BUDGET,
                                  POWER_OF_TWO_FIELDS,
                                  AcceleratorConfig,
                                  CoreConfig,
                                  EnergyCosts,
                                  accelerator_names,
                                  named_accelerator,
                                  tensor_core_flops,
)
from phaze_hardware.area import MIB, area_um2
from phaze_hardware.chips import KNOWN_CHIPS, KnownChip, chip_of, known_chip
from phaze_hardware.cluster import NO_COMMUNICATION, Cluster, Collective, FullyConnected, Group, Network, Tier
from phaze_hardware.systems import SYSTEMS, System, cluster, system, system_of, system_of_file

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
    "FullyConnected",
    "Group",
    "KnownChip",
    "Network",
    "System",
    "Tier",
    "accelerator_names",
    "area_um2",
    "chip_of",
    "cluster",
    "known_chip",
    "named_accelerator",
    "system",
    "system_of",
    "system_of_file",
    "tensor_core_flops",
]
