"""Systems: machines that exist, one file each in phaze_hardware/systems/ — the chip of their nodes, the
devices per node and the tiers of links between them, each figure with its source in the file.

A system with a number of devices is a cluster (`cluster(name, devices)`). The file's `topology`
names the network's shape (default `tiers`: `phaze_hardware.cluster.Cluster`; `fully_connected`: each
pair of a node's devices on its own link, `phaze_hardware.cluster.FullyConnected`; `torus`:
`phaze_hardware.torus.Torus`); a new shape is a class with the methods of
`phaze_hardware.cluster.Network` added to `TOPOLOGIES`.

A user's system is a file of the same fields given by its path (`system=path/to/system.yaml`,
`system_of_file`), read and checked alike; its `chip` names a packaged chip or a chip file (a path
relative to the system file's folder).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from phaze_common.checks import InputError, choice, positive_integer, unknown_fields
from phaze_hardware.chips import KNOWN_CHIPS, is_path, read_chip, read_mapping
from phaze_hardware.cluster import Cluster, FullyConnected, Network
from phaze_hardware.data import hardware_file, yaml_files
from phaze_hardware.torus import Torus

#: The systems, one file each (the file's name is the system's).
SYSTEMS_FOLDER = hardware_file("systems")
#: Network shapes by the name a system's `topology` gives.
TOPOLOGIES = {"tiers": Cluster, "torus": Torus, "fully_connected": FullyConnected}
#: The fields of a system's file.
SYSTEM_FIELDS = ("name", "chip", "node_size", "topology", "tiers", "slices")


@dataclass(frozen=True)
class System:
    """A machine: `chip`s (a known chip's name, or the absolute path of a chip file) in nodes of `node_size`, joined by `tiers` of links
    (mappings of `phaze_hardware.cluster.TIER_FIELDS`) in the shape `topology`; a TPU pod's devices in
    `slices` slices (its ICI joins a slice, the data-centre network the slices)."""

    name: str
    chip: str
    node_size: int
    tiers: tuple[Mapping, ...]
    topology: str = "tiers"
    slices: int = 1

    def cluster(self, num_devices: int, slices: int | None = None) -> Network:
        """This system with `num_devices` devices (in `slices` slices: by default the file's)."""
        return TOPOLOGIES[self.topology].build(self.name, num_devices, self.node_size, list(self.tiers),
                                               self.slices if slices is None else slices)

    @property
    def sliced(self) -> bool:
        """Whether a tier of the system joins a slice (`devices: slice`): it has a `slices` setting."""
        return any(dict(tier).get("devices") == "slice" for tier in self.tiers)

    def record(self) -> dict:
        """The system as a mapping of its file's fields (what the command line's `system` holds)."""
        return {"name": self.name, "chip": self.chip, "node_size": self.node_size, "topology": self.topology,
                "tiers": [dict(tier) for tier in self.tiers], **({"slices": self.slices} if self.sliced else {})}


def read_system(path: Path) -> System:
    """The system of one data file, checked."""
    where, entry = path.name, read_mapping(path)
    unknown_fields(where, entry, SYSTEM_FIELDS)
    if entry.get("name") != path.stem:
        raise InputError(f"{where}: name must be the file's name {path.stem!r}, got {entry.get('name')!r}")
    chip = entry.get("chip")
    if is_path(chip):
        chip_file = (path.parent / chip).resolve()
        if not chip_file.is_file():
            raise InputError(f"{where}: chip: no such chip file {str(chip_file)!r} (a path is read from the system "
                             f"file's folder); allowed: {', '.join(KNOWN_CHIPS)} or a chip file's path")
        read_chip(chip_file)  # checked here: a system names a chip that reads
        chip = str(chip_file)
    else:
        chip = choice(f"{where}: chip", chip, tuple(KNOWN_CHIPS))
    topology = choice(f"{where}: topology", entry.get("topology", "tiers"), tuple(TOPOLOGIES))
    system = System(path.stem, chip, positive_integer(f"{where}: node_size", entry.get("node_size")),
                    tuple(entry.get("tiers") or ()), topology, positive_integer(f"{where}: slices", entry.get("slices", 1)))
    system.cluster(system.node_size)  # the tiers are checked by building the smallest cluster
    return system


#: The systems by name (read-only).
SYSTEMS = MappingProxyType({path.stem: read_system(path) for path in yaml_files(SYSTEMS_FOLDER)})


def system(name: str) -> System:
    if name not in SYSTEMS:
        raise InputError(f"system: unknown {name!r}; allowed: {', '.join(SYSTEMS)}")
    return SYSTEMS[name]


def system_of_file(name: str) -> System:
    """A packaged system by name, or a user's system file by path (read as the packaged ones)."""
    if not is_path(name):
        return system(name)
    if not Path(name).is_file():
        raise InputError(f"system: no such system file {name!r}; allowed: {', '.join(SYSTEMS)} or a system file's "
                         "path")
    return read_system(Path(name))


def cluster(name: str, num_devices: int) -> Network:
    """The system `name` with `num_devices` devices."""
    return system(name).cluster(num_devices)


def system_of(device_type: str) -> System | None:
    """The system whose chip a published run's device type names (one of the chip's `names`, e.g.
    "A100" in "A100 SXM 80GB"), the most specific one: the longest name found ("GB200 NVL72" names
    the GB200, not the B200 its name contains); None when no chip's name is found; InputError when
    several systems' chips share the longest."""
    matched = {item.name: max((len(name) for name in KNOWN_CHIPS[item.chip].names if name in device_type), default=0)
               for item in SYSTEMS.values()}
    longest = max(matched.values(), default=0)
    found = [SYSTEMS[name] for name, length in matched.items() if length and length == longest]
    if len(found) > 1:
        raise InputError(f"hardware {device_type}: names the chips of {', '.join(item.name for item in found)}")
    return found[0] if found else None
