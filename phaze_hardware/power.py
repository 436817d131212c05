"""The power a chip draws, from its parts at its process node (figures in phaze_hardware/power_model.yaml,
each with its source):

- idle: leakage and clocks per µm² of die (the template's cores and buffers, and the PHYs and
  controllers of its HBM and links), and each HBM stack's refresh;
- at its peak, what a power budget bounds (as a TDP does): idle, and every unit busy at once — the
  tensor cores' MACs, the vector lanes, the core buffers feeding the tensor cores and the global
  buffer at their words a cycle, the HBM at its bandwidth, the links at theirs (each bit sent once);
- `energy_costs`: the estimator's energy per operation and per word at this node and HBM, from which
  a step's energy follows (the layers' MACs and accesses, as `solver.evaluate` sums them).

Simplifications: no clock or voltage scaling with load; a busy unit draws its energy per operation
at the clock rate; the idle power per area is TPUv4i's (a lower bound: its die is under 400 mm²).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache

from omegaconf import OmegaConf

from phaze_common.checks import choice
from phaze_hardware.accelerator import AcceleratorConfig, EnergyCosts
from phaze_hardware.chips import sourced_figure
from phaze_hardware.data import hardware_file
from phaze_hardware.offchip import Memory, ScaleUp

POWER_MODEL = hardware_file("power_model.yaml")


@dataclass(frozen=True)
class NodeEnergy:
    """Energies of one process node [J per operation or per bit] and its idle power [W/µm²]."""

    name: str
    mac: float
    vector_op: float
    small_sram_per_bit: float
    large_sram_per_bit: float
    idle_per_area: float


@dataclass(frozen=True)
class PowerModel:
    nodes: dict[str, NodeEnergy]
    hbm_idle_per_stack: float  # W

    def node(self, name: str) -> NodeEnergy:
        return self.nodes[choice("technology_node", name, tuple(self.nodes))]

    @staticmethod
    def die_area(accelerator: AcceleratorConfig, memory: Memory, links: ScaleUp) -> float:
        """µm² of the die: the template's cores and buffers, and the HBM's and links' interfaces."""
        return accelerator.area + memory.area + links.area

    def idle_power(self, accelerator: AcceleratorConfig, node: str, memory: Memory, links: ScaleUp) -> float:
        """W drawn with nothing to do."""
        return self.die_idle_power(self.die_area(accelerator, memory, links), node, memory)

    def die_idle_power(self, die_area, node: str, memory: Memory):
        """W idle of a die of `die_area` µm² (a number, or a numpy array of many) and its HBM stacks."""
        return self.node(node).idle_per_area * die_area + memory.stacks * self.hbm_idle_per_stack

    @staticmethod
    def traffic_power(memory: Memory, links: ScaleUp) -> dict[str, float]:
        """W of the HBM and the links each moving its bandwidth's worth of bits."""
        return {"hbm": memory.energy(memory.bandwidth), "links": links.energy(links.bandwidth)}

    def peak_power(self, accelerator: AcceleratorConfig, node: str, memory: Memory, links: ScaleUp) -> dict[str, float]:
        """W by part with every unit busy (module docstring); "total" their sum."""
        parts = {"idle": self.idle_power(accelerator, node, memory, links),
                 **self.busy_cores(accelerator, node, accelerator.num_tc, accelerator.tc_width, accelerator.tc_depth,
                                   accelerator.num_vc, accelerator.vc_width),
                 **self.traffic_power(memory, links)}
        return {**parts, "total": sum(parts.values())}

    def busy_cores(self, template: AcceleratorConfig, node: str, num_tc, tc_width, tc_depth, num_vc,
                   vc_width) -> dict:
        """W of the cores and the buffers feeding them, all busy, for chips of the template's
        technology with these dimensions (numbers, or numpy arrays of many candidates')."""
        energy, clock = self.node(node), template.clock_hz
        bits = 8 * template.bytes_per_element
        return {
            "tensor_cores": num_tc * tc_width * tc_depth * clock * energy.mac,
            "vector_cores": num_vc * vc_width * clock * energy.vector_op,
            "core_buffers": num_tc * template.core_buffer_words_per_cycle * clock * bits * energy.small_sram_per_bit,
            "global_buffer": num_tc * template.glb_words_per_cycle * clock * bits * energy.large_sram_per_bit,
        }

    def offchip_power(self, node: str, memory: Memory, links: ScaleUp) -> float:
        """W of the HBM and the links at their peak, their interfaces' idle power included: a chip's
        peak power is this plus its compute part's (`busy_cores` and the idle power of its area)."""
        return (self.die_idle_power(memory.area + links.area, node, memory)
                + sum(self.traffic_power(memory, links).values()))

    def energy_costs(self, accelerator: AcceleratorConfig, node: str, memory: Memory) -> EnergyCosts:
        """The estimator's energies at this node and HBM: per MAC, and per word of each buffer level
        (the register file's kept from the template)."""
        energy, bits = self.node(node), 8 * accelerator.bytes_per_element
        return replace(accelerator.energy, mac=energy.mac, core_buffer=bits * energy.small_sram_per_bit,
                       global_buffer=bits * energy.large_sram_per_bit,
                       dram=bits * memory.generation.energy_per_bit)


@cache
def power_model() -> PowerModel:
    data = OmegaConf.to_container(OmegaConf.load(POWER_MODEL))
    names = [item.name for item in fields(NodeEnergy) if item.name != "name"]
    nodes = {name: NodeEnergy(name, *(sourced_figure(f"power_model.yaml: nodes.{name}", figure, entry.get(figure))[0]
                                      for figure in names))
             for name, entry in data["nodes"].items()}
    return PowerModel(nodes, sourced_figure("power_model.yaml", "hbm_idle_per_stack", data.get("hbm_idle_per_stack"))[0])
