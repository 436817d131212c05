"""The manufacturing cost of a chip: its die (wafer cost over the good dies a wafer gives), its HBM
stacks and its package. Figures in phaze_hardware/cost_model.yaml, each with its source.

    dies per wafer = π (D/2)² / A − π D / √(2A)                      (D the wafer's diameter)
    yield          = (1 + A·D0/α)^−α                                  (negative binomial, α = 3)
    die cost       = wafer cost / (dies per wafer × yield)

Simplifications: no harvesting of dies with a defect (A100 sells with 108 of 128 SMs, so its real
cost per sold die is lower), no test, design or mask cost; the package a fixed CoWoS figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from omegaconf import OmegaConf

from phaze_common.checks import choice, positive_number
from phaze_hardware.chips import sourced_figure
from phaze_hardware.data import hardware_file
from phaze_hardware.offchip import Memory

COST_MODEL = hardware_file("cost_model.yaml")


@dataclass(frozen=True)
class Node:
    """A process node: $ per wafer and defects per µm²."""

    name: str
    wafer_cost: float
    defect_density: float


@dataclass(frozen=True)
class CostModel:
    wafer_diameter: float  # µm
    yield_clustering: float
    package_cost: float  # $
    nodes: dict[str, Node]

    def node(self, name: str) -> Node:
        return self.nodes[choice("technology_node", name, tuple(self.nodes))]

    def dies_per_wafer(self, die_area):
        """Whole dies of `die_area` µm² on a wafer (the edge's partial dies taken off); a number or a
        numpy array of areas, as every function of this class."""
        diameter = self.wafer_diameter
        return np.pi * (diameter / 2) ** 2 / die_area - np.pi * diameter / np.sqrt(2 * die_area)

    def die_yield(self, die_area, node: str):
        """The share of dies without a defect."""
        alpha = self.yield_clustering
        return (1 + die_area * self.node(node).defect_density / alpha) ** -alpha

    def die_cost(self, die_area, node: str):
        """$ per good die of `die_area` µm² at `node`."""
        if np.ndim(die_area) == 0:
            positive_number("die area", die_area, "µm²")
        return self.node(node).wafer_cost / (self.dies_per_wafer(die_area) * self.die_yield(die_area, node))

    def chip_cost(self, die_area, node: str, memory: Memory):
        """$ of a packaged chip: its die, its HBM stacks, its package."""
        return self.die_cost(die_area, node) + memory.cost + self.package_cost


@cache
def cost_model() -> CostModel:
    data = OmegaConf.to_container(OmegaConf.load(COST_MODEL))
    where = "cost_model.yaml"
    nodes = {name: Node(name, *(sourced_figure(f"{where}: nodes.{name}", figure, entry.get(figure))[0]
                                for figure in ("wafer_cost", "defect_density")))
             for name, entry in data["nodes"].items()}
    return CostModel(*(sourced_figure(where, name, data.get(name))[0]
                       for name in ("wafer_diameter", "yield_clustering", "package_cost")), nodes)
