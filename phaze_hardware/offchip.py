"""A chip's memory system and scale-up links as designed quantities: an HBM generation and a number
of stacks give the chip's HBM bandwidth and capacity; a link generation, a number of links and a
scale-up domain (devices joined by them, e.g. an NVSwitch node) give the first tier of its cluster.
Each also costs die area (PHYs and controllers), energy per bit moved and, for HBM, dollars per byte.

The figures are data (phaze_hardware/offchip.yaml), each with its source; figures no one has published
(HBM3/3E PHY area and energy, NVLink and ICI energy per bit) are named estimates there.
Simplifications: a stack's bandwidth is a product's as shipped (NVIDIA's datasheets; JEDEC's maxima
run faster), the PHY's area does not shrink with the process node while the controller's is taken
at 7 nm (LLMCompass's rule: "memory controllers scale with process node, but PHYs do not").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from types import MappingProxyType

from omegaconf import OmegaConf

from phaze_common.checks import InputError, choice, integer, positive_integer, unknown_fields
from phaze_hardware.chips import sourced_figure
from phaze_hardware.cluster import Tier
from phaze_hardware.data import hardware_file

OFFCHIP = hardware_file("offchip.yaml")
#: Stacks a chip may carry (the issue's 1-8: B200 carries 8).
MOST_STACKS = 8


@dataclass(frozen=True)
class HbmGeneration:
    """One HBM generation, per stack: bytes/s, bytes, µm² of PHY and of controller, J per bit, $ per byte."""

    name: str
    bandwidth_per_stack: float
    capacity_per_stack: float
    phy_area_per_stack: float
    controller_area_per_stack: float
    energy_per_bit: float
    cost_per_byte: float


@dataclass(frozen=True)
class LinkGeneration:
    """One scale-up link generation, per link: bytes/s per direction, µm² of PHY and controller, J per bit."""

    name: str
    bandwidth_per_link: float
    phy_area_per_link: float
    controller_area_per_link: float
    energy_per_bit: float


def _read(kind: type, section: str) -> Mapping[str, object]:
    data = OmegaConf.to_container(OmegaConf.load(OFFCHIP))[section]
    names = [item.name for item in fields(kind) if item.name != "name"]
    found = {}
    for generation, figures in data.items():
        where = f"offchip.yaml: {section}.{generation}"
        unknown_fields(where, figures, names)
        missing = [name for name in names if name not in figures]
        if missing:
            raise InputError(f"{where}: missing {missing[0]}")
        found[generation] = kind(generation, **{name: sourced_figure(where, name, figures[name])[0] for name in names})
    return MappingProxyType(found)


@cache
def hbm_generations() -> Mapping[str, HbmGeneration]:
    return _read(HbmGeneration, "hbm")


@cache
def link_generations() -> Mapping[str, LinkGeneration]:
    return _read(LinkGeneration, "links")


@dataclass(frozen=True)
class Memory:
    """`stacks` stacks of HBM `generation` on one chip."""

    generation: HbmGeneration
    stacks: int

    @classmethod
    def of(cls, generation: str, stacks: int) -> Memory:
        """From a generation's name and a stack count, checked (one line naming the field)."""
        known = hbm_generations()
        return cls(known[choice("hbm_generation", generation, tuple(known))],
                   integer("hbm_stacks", stacks, 1, MOST_STACKS))

    @property
    def bandwidth(self) -> float:
        """bytes/s between the chip and its HBM."""
        return self.stacks * self.generation.bandwidth_per_stack

    @property
    def capacity(self) -> float:
        """bytes of HBM."""
        return self.stacks * self.generation.capacity_per_stack

    @property
    def area(self) -> float:
        """µm² of the chip's die the HBM interfaces take (PHYs and controllers)."""
        return self.stacks * (self.generation.phy_area_per_stack + self.generation.controller_area_per_stack)

    @property
    def cost(self) -> float:
        """US dollars of the stacks."""
        return self.capacity * self.generation.cost_per_byte

    def energy(self, num_bytes: float) -> float:
        """J to move `num_bytes` between the chip and its HBM."""
        return 8 * num_bytes * self.generation.energy_per_bit

    def record(self) -> dict:
        return {"hbm_generation": self.generation.name, "hbm_stacks": self.stacks, "hbm_bandwidth": self.bandwidth,
                "hbm_capacity": self.capacity}


@dataclass(frozen=True)
class ScaleUp:
    """`links` links of `generation` per chip joining `domain` chips (a switched node: NVSwitch)."""

    generation: LinkGeneration
    links: int
    domain: int

    @classmethod
    def of(cls, generation: str, links: int, domain: int) -> ScaleUp:
        known = link_generations()
        return cls(known[choice("link_generation", generation, tuple(known))],
                   positive_integer("links", links, 64), positive_integer("scale_up_domain", domain, 1_048_576))

    @property
    def bandwidth(self) -> float:
        """bytes/s per chip per direction into its scale-up domain."""
        return self.links * self.generation.bandwidth_per_link

    @property
    def area(self) -> float:
        """µm² of the chip's die the links take (PHYs and controllers)."""
        return self.links * (self.generation.phy_area_per_link + self.generation.controller_area_per_link)

    def energy(self, num_bytes: float) -> float:
        """J to send `num_bytes` over the links."""
        return 8 * num_bytes * self.generation.energy_per_bit

    def tier(self, like: Tier) -> Tier:
        """The scale-up tier of the cluster: the domain's chips at this bandwidth, with the latency and
        efficiency of the system's tier it replaces (`like`)."""
        return Tier(name=self.generation.name, devices=self.domain, bandwidth=self.bandwidth, latency=like.latency,
                    efficiency=like.efficiency)

    def record(self) -> dict:
        return {"link_generation": self.generation.name, "links": self.links, "scale_up_domain": self.domain,
                "link_bandwidth": self.bandwidth}
