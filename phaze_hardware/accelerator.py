"""The accelerator template: a chip of tensor cores (TC) and vector cores (VC) around a global buffer.

Units are SI: Hz, bytes, bytes/s, seconds, joules. The bandwidths inside the chip are in words per
cycle, as a tiling cost model counts them (a word is `bytes_per_element` bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache

from omegaconf import OmegaConf

from phaze_common.checks import InputError, fraction, positive_integer, positive_number, power_of_two, unknown_fields
from phaze_hardware.area import area_um2
from phaze_hardware.data import hardware_file, yaml_files

#: The named template chips (fields of AcceleratorConfig), one file each.
TEMPLATES = hardware_file("templates")

#: The named accelerator whose area is the default budget.
DEFAULT_BUDGET = "tpuv4_like"

#: Fields that must be positive powers of two: the template is built from them. They are also the
#: dimensions candidates of the architecture search differ in (`AcceleratorConfig.dimensions`).
POWER_OF_TWO_FIELDS = ("num_tc", "num_vc", "tc_width", "tc_depth", "vc_width", "glb_bytes")


def tensor_core_flops(num_tc, tc_width, tc_depth, clock_hz: float, efficiency: float):
    """FLOP/s of tensor cores at their best (numbers or numpy arrays of candidates): each core's
    width × depth multiply-accumulators busy every cycle (`estimator.tc_model`'s PE array), two FLOPs
    each, times the efficiency the tiled schedule keeps."""
    return 2.0 * num_tc * tc_width * tc_depth * clock_hz * efficiency


def _check_numbers(owner: object, prefix: str) -> None:
    """Every numeric field of `owner` is a finite number > 0."""
    for item in fields(owner):
        if item.name != "energy":
            positive_number(f"{prefix}.{item.name}", getattr(owner, item.name))


@dataclass(frozen=True)
class CoreConfig:
    """`num` identical cores of `width` x `depth` units that share a `glb_bytes` global buffer.

    A vector core is a core of depth 1 (`width` lanes). This is the key of a latency estimate.
    """

    num: int
    width: int
    depth: int
    glb_bytes: int

    @property
    def units_per_core(self) -> int:
        """MACs of one tensor core, or lanes of one vector core."""
        return self.width * self.depth

    def single(self) -> CoreConfig:
        """The same core, alone on the chip: what an operator on one core sees."""
        return CoreConfig(1, self.width, self.depth, self.glb_bytes)


@dataclass(frozen=True)
class EnergyCosts:
    """Energy per operation and per word accessed at each level of the memory hierarchy [J].

    Energy is reported, never optimised; the defaults are the per-access energies of the Sunstone runs
    in `tests/data/estimator/sunstone_tc_latency.csv`, (reg, core buffer, GLB, DRAM) = (0.03, 2, 20,
    100) pJ, and Sunstone's 2.2 pJ per MAC (`third_party_for_phaze/sunstone/src/optimization_utils.py`
    line 407 in msr-fiddle/phaze at fed7cde).
    """

    mac: float = 2.2e-12
    register: float = 0.03e-12
    core_buffer: float = 2e-12
    global_buffer: float = 20e-12
    dram: float = 100e-12

    def __post_init__(self) -> None:
        _check_numbers(self, "accelerator.energy")


@dataclass(frozen=True)
class AcceleratorConfig:
    """One accelerator chip of the template and the technology it is built in.

    Differences from the original (documented choices):
    * `core_buffer_words_per_cycle` and `glb_words_per_cycle` are per *core*: the aggregate
      bandwidth of a boundary grows with the number of cores an operator uses. Each core owns its
      buffer (its read port scales trivially) and the global buffer is banked with one port per
      core. The original fixed 64 and 256 words/cycle for the whole chip, which made extra cores
      nearly useless. For one core the two models coincide.
    * The GLB <- DRAM boundary runs at `hbm_bandwidth` (the original: a fixed 128 words/cycle).
      The default 1.2 TB/s is the HBM2 bandwidth of a TPUv4 chip.
    * `clock_hz` is 1.05 GHz: latency = cycles / 1.05e9 seconds (the original divided by 1.05e6).
    * The links between chips are not part of the chip: the cluster (`phaze_hardware.Cluster`) prices
      every collective and transfer.
    * `tensor_core_efficiency` is the fraction of the tiled schedule's rate the tensor cores keep
      (1: the tiling model's cycles as they are; a real chip's, fitted on its measured runs, says
      what the model does not see: filling and draining the systolic array between tiles, the
      compiler's loop overheads). It divides every tensor-core cycle count.
    """

    num_tc: int
    num_vc: int
    tc_width: int
    tc_depth: int
    vc_width: int
    glb_bytes: int
    clock_hz: float = 1.05e9
    bytes_per_element: int = 2
    hbm_bandwidth: float = 1.2e12
    core_buffer_words_per_cycle: float = 64.0
    glb_words_per_cycle: float = 256.0
    tensor_core_efficiency: float = 1.0
    energy: EnergyCosts = field(default_factory=EnergyCosts)

    def __post_init__(self) -> None:
        for name in POWER_OF_TWO_FIELDS:
            power_of_two(f"accelerator.{name}", getattr(self, name))
        positive_integer("accelerator.bytes_per_element", self.bytes_per_element)
        if not isinstance(self.energy, EnergyCosts):
            raise InputError(f"accelerator.energy: must be EnergyCosts, got {self.energy!r}")
        _check_numbers(self, "accelerator")
        fraction("accelerator.tensor_core_efficiency", self.tensor_core_efficiency)

    @property
    def tc_core(self) -> CoreConfig:
        return CoreConfig(self.num_tc, self.tc_width, self.tc_depth, self.glb_bytes)

    @property
    def vc_core(self) -> CoreConfig:
        return CoreConfig(self.num_vc, self.vc_width, 1, self.glb_bytes)

    @property
    def area(self) -> float:
        """Chip area [µm²] from the area model of the original (phaze_hardware/area_model.yaml)."""
        return float(area_um2(self.num_tc, self.num_vc, self.tc_width, self.tc_depth, self.vc_width, self.glb_bytes))

    @property
    def matrix_flops(self) -> float:
        """FLOP/s of the tensor cores at their best (`tensor_core_flops`)."""
        return float(tensor_core_flops(self.num_tc, self.tc_width, self.tc_depth, self.clock_hz,
                                       self.tensor_core_efficiency))

    @property
    def dram_words_per_cycle(self) -> float:
        return self.hbm_bandwidth / (self.bytes_per_element * self.clock_hz)

    def with_dimensions(self, **dimensions: int) -> AcceleratorConfig:
        """A candidate of the template: these of its `dimensions()` changed."""
        unknown_fields("accelerator", dimensions, POWER_OF_TWO_FIELDS)
        return replace(self, **dimensions)

    def dimensions(self) -> dict[str, int]:
        """The dimensions the candidates of the architecture search differ in."""
        return {name: getattr(self, name) for name in POWER_OF_TWO_FIELDS}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping) -> AcceleratorConfig:
        """Build from a mapping (a hydra `accelerator` node); unknown fields are an error."""
        values = dict(values)
        unknown_fields("accelerator", values, [item.name for item in fields(cls)])
        energy = values.pop("energy", {})
        if isinstance(energy, Mapping):
            unknown_fields("accelerator.energy", energy, [item.name for item in fields(EnergyCosts)])
            energy = EnergyCosts(**energy)
        missing = [name for name in POWER_OF_TWO_FIELDS if name not in values]
        if missing:
            raise InputError(f"accelerator.{missing[0]}: missing; required: {', '.join(POWER_OF_TWO_FIELDS)}")
        return cls(energy=energy, **values)


def accelerator_names() -> tuple[str, ...]:
    """Names of the template chips of phaze_hardware/templates/."""
    return tuple(path.stem for path in yaml_files(TEMPLATES))


@cache
def _accelerator_file(name: str) -> dict:
    path = TEMPLATES / f"{name}.yaml"
    if not path.is_file():
        raise InputError(f"accelerator: unknown template {name!r}; allowed: {', '.join(accelerator_names())}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def named_accelerator(name: str, **overrides: object) -> AcceleratorConfig:
    """A named accelerator (e.g. "tpuv4_like"), with optional field overrides."""
    return AcceleratorConfig.from_dict({**_accelerator_file(name), **overrides})
