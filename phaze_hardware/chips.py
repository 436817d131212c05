"""Known accelerators (`chip=h100_sxm | b200 | tpuv6e | ...`): chips that exist, one file each in
phaze_hardware/chips/ with their public figures, where every number names its source; a user's chip
is a file of the same fields given by its path (`chip=path/to/chip.yaml`), read and checked alike.

GPUs are priced by a roofline (`estimator.roofline`); `tpuv4` is a chip of phaze's template
(`cost_model: template`), priced by the estimator and the layer schedules like a searched chip.

Rates: a 16-bit GEMM that fills the chip runs at `peak_flops` × `matrix_efficiency`; a fused
attention kernel at `peak_flops` × `attention_efficiency` (the matrix efficiency where the chip
states none); an FP8 GEMM at `fp8_peak_flops` × `fp8_matrix_efficiency` (a chip without them has no
FP8 tensor cores); an MXFP8 GEMM (one scale per block of 32 elements, Blackwell's tensor cores) at
`mxfp8_peak_flops` × `mxfp8_matrix_efficiency` (a chip without them does not run MXFP8).

Launches: a kernel issued by eager PyTorch takes at least `kernel_host_seconds` (the host's time to
dispatch the operator and launch its kernel), one replayed from a CUDA graph at least
`graph_kernel_seconds` (`estimator.roofline`); a chip without them launches for free. The host
issues each local expert's GEMM of a grouped expert product (Transformer Engine's GroupedLinear) in
`expert_gemm_host_seconds` (its `kernel_host_seconds` where it states none).

Host link: `host_link_bandwidth`, bytes/s per direction between one chip and its host's memory (a
PCIe x16 link, or NVLink-C2C to a Grace CPU), what activation offload copies over
(`solver.training_step.offload`); a chip without it does not offload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from phaze_common.checks import InputError, unknown_fields
from phaze_hardware.accelerator import AcceleratorConfig, named_accelerator
from phaze_hardware.data import hardware_file, yaml_files

#: The known chips, one file each (the file's name is the chip's).
CHIPS = hardware_file("chips")
COST_MODELS = ("roofline", "template")
#: Figures every chip states.
REQUIRED = ("peak_flops", "hbm_capacity", "hbm_bandwidth", "on_chip_bytes")
#: Figures a chip priced by its roofline also states.
ROOFLINE_REQUIRED = ("streaming_multiprocessors", "matrix_efficiency", "memory_efficiency")
#: Figures that are fractions (at most 1).
FRACTIONS = ("matrix_efficiency", "memory_efficiency", "attention_efficiency", "fp8_matrix_efficiency",
             "mxfp8_matrix_efficiency")
#: Fields of a known chip that are numbers with a source.
FIGURES = ("peak_flops", "hbm_capacity", "hbm_bandwidth", "on_chip_bytes", "streaming_multiprocessors",
           "matrix_efficiency", "memory_efficiency", "attention_efficiency", "fp8_peak_flops", "fp8_matrix_efficiency",
           "mxfp8_peak_flops", "mxfp8_matrix_efficiency", "kernel_host_seconds", "graph_kernel_seconds",
           "expert_gemm_host_seconds", "host_link_bandwidth")


@dataclass(frozen=True)
class KnownChip:
    """A chip that exists: peak dense 16-bit FLOP/s, HBM capacity [bytes] and bandwidth [bytes/s],
    on-chip memory [bytes]; for the roofline, its streaming multiprocessors and the achievable
    fractions of peak (matrix; attention: a fused attention kernel's, 0 = the matrix one) and of
    HBM bandwidth (memory), its dense FP8 peak and FP8 GEMM efficiency (0: no FP8 tensor cores), its
    dense MXFP8 peak and MXFP8 GEMM efficiency (0: no MXFP8), the least seconds of a kernel issued by
    eager PyTorch and of one replayed from a CUDA graph (0: no floor), the host's seconds to issue one
    local expert's GEMM of a grouped expert product (0: `kernel_host_seconds`), the bandwidth of its
    link to host memory [bytes/s per direction] (0: not known); for a template chip, its template."""

    name: str
    cost_model: str
    peak_flops: float
    hbm_capacity: float
    hbm_bandwidth: float
    on_chip_bytes: float
    streaming_multiprocessors: int = 0
    matrix_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    attention_efficiency: float = 0.0
    fp8_peak_flops: float = 0.0
    fp8_matrix_efficiency: float = 0.0
    mxfp8_peak_flops: float = 0.0
    mxfp8_matrix_efficiency: float = 0.0
    kernel_host_seconds: float = 0.0
    graph_kernel_seconds: float = 0.0
    expert_gemm_host_seconds: float = 0.0
    host_link_bandwidth: float = 0.0
    template: AcceleratorConfig | None = None
    template_name: str | None = None
    names: tuple[str, ...] = ()  # how published runs name it
    sources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}), compare=False)

    @property
    def has_fp8(self) -> bool:
        """Whether the chip has FP8 tensor cores (and their figures)."""
        return self.fp8_peak_flops * self.fp8_matrix_efficiency > 0

    @property
    def has_mxfp8(self) -> bool:
        """Whether the chip runs MXFP8 products (and has their figures)."""
        return self.mxfp8_peak_flops * self.mxfp8_matrix_efficiency > 0

    @property
    def precisions(self) -> tuple[str, ...]:
        """The training precisions the chip runs (of `graph_extract.kernels.PRECISIONS`)."""
        return ("bf16", "fp16") + (("fp8",) if self.has_fp8 else ()) + (("mxfp8",) if self.has_mxfp8 else ())

    def check_precision(self, precision: str) -> None:
        """InputError unless the chip can train in `precision` (`graph_extract.kernels.PRECISIONS`)."""
        if precision in ("fp8", "mxfp8") and precision not in self.precisions:
            raise InputError(f"precision: {self.name} has no {precision.upper()} tensor cores (no "
                             f"{precision}_peak_flops and {precision}_matrix_efficiency figures); allowed: "
                             f"{', '.join(self.precisions)}")

    def check_cuda_graphs(self, cuda_graphs: bool) -> None:
        """InputError if `cuda_graphs` is asked of a chip that has no CUDA graphs (a template chip: a TPU
        runs XLA programs, no operator is dispatched by the host) or no figure for them."""
        if not cuda_graphs:
            return
        if self.cost_model != "roofline":
            raise InputError(f"cuda_graphs: {self.name} is a template chip (XLA programs, no per-operator "
                             "launches); allowed: false")
        if self.graph_kernel_seconds <= 0:
            raise InputError(f"cuda_graphs: {self.name} states no graph_kernel_seconds; allowed: false")

    @property
    def expert_gemm_seconds(self) -> float:
        """The host's seconds to issue one local expert's GEMM of a grouped expert product in eager
        mode: `expert_gemm_host_seconds`, else `kernel_host_seconds`."""
        return self.expert_gemm_host_seconds or self.kernel_host_seconds

    @property
    def matrix_flops(self) -> float:
        """Achievable FLOP/s of a 16-bit GEMM that fills the chip."""
        return self.peak_flops * self.matrix_efficiency

    @property
    def fp8_matrix_flops(self) -> float:
        """Achievable FLOP/s of an FP8 GEMM that fills the chip."""
        return self.fp8_peak_flops * self.fp8_matrix_efficiency

    @property
    def mxfp8_matrix_flops(self) -> float:
        """Achievable FLOP/s of an MXFP8 GEMM that fills the chip."""
        return self.mxfp8_peak_flops * self.mxfp8_matrix_efficiency

    def narrow_matrix_flops(self, precision: str) -> float:
        """Achievable FLOP/s of an 8-bit GEMM in `precision` (`fp8` or `mxfp8`) that fills the chip."""
        return self.mxfp8_matrix_flops if precision == "mxfp8" else self.fp8_matrix_flops

    @property
    def attention_flops(self) -> float:
        """Achievable FLOP/s of a 16-bit fused attention kernel that fills the chip."""
        return self.peak_flops * (self.attention_efficiency or self.matrix_efficiency)

    def record(self) -> dict:
        """Its figures as results state them."""
        return {"name": self.name, "cost_model": self.cost_model,
                **{name: getattr(self, name) for name in FIGURES if name in self.sources}}


def sourced_figure(where: str, figure: str, entry: object) -> tuple[float, str]:
    """A {value, source} figure: its positive value and its source."""
    if not isinstance(entry, dict) or set(entry) != {"value", "source"} or not str(entry["source"]).strip():
        raise InputError(f"{where}: {figure} must be {{value, source}} with a source")
    value = entry["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InputError(f"{where}: {figure}.value must be a positive number, got {value!r}")
    return value, str(entry["source"])


def is_path(name: object) -> bool:
    """Whether a `chip` or `system` value names a file (a path or a .yaml/.yml name) rather than a
    packaged one."""
    return isinstance(name, str) and ("/" in name or "\\" in name or name.endswith((".yaml", ".yml")))


def read_mapping(path: Path) -> dict:
    """A data file's mapping; InputError naming the file when it is missing or not a YAML mapping."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        entry = OmegaConf.to_container(OmegaConf.load(path))
    except (OmegaConfBaseException, yaml.YAMLError) as problem:
        raise InputError(f"{path.name}: not a YAML mapping ({str(problem).splitlines()[0]})") from None
    if not isinstance(entry, dict):
        raise InputError(f"{path.name}: must be a mapping of fields, got {type(entry).__name__}")
    return entry


def read_chip(path: Path) -> KnownChip:
    """The known chip of one data file (its name: the file's); InputError naming the file and the
    field for a missing, unsourced, non-positive or out-of-range figure."""
    where, entry = path.name, read_mapping(path)
    cost_model = entry.pop("cost_model", None)
    if cost_model not in COST_MODELS:
        raise InputError(f"{where}: cost_model must be one of {', '.join(COST_MODELS)}, got {cost_model!r}")
    template_name = entry.pop("template", None) if cost_model == "template" else None
    if cost_model == "template" and not isinstance(template_name, str):
        raise InputError(f"{where}: template must name a template chip (phaze_hardware/templates/), got "
                         f"{template_name!r}")
    names = tuple(entry.pop("names", ()))
    unknown_fields(where, entry, FIGURES)
    figures = {figure: sourced_figure(where, figure, value) for figure, value in entry.items()}
    required = (*REQUIRED, *(ROOFLINE_REQUIRED if cost_model == "roofline" else ()))
    missing = [figure for figure in required if figure not in figures]
    if missing:
        raise InputError(f"{where}: {missing[0]} missing; a {cost_model} chip states {', '.join(required)}")
    for figure in FRACTIONS:
        if figure in figures and figures[figure][0] > 1:
            raise InputError(f"{where}: {figure}.value must be a fraction of the peak in (0, 1], got "
                             f"{figures[figure][0]!r}")
    for narrow in ("fp8", "mxfp8"):
        if (f"{narrow}_peak_flops" in figures) != (f"{narrow}_matrix_efficiency" in figures):
            raise InputError(f"{where}: {narrow}_peak_flops and {narrow}_matrix_efficiency go together "
                             f"({narrow.upper()} tensor cores); give both or neither")
    if "streaming_multiprocessors" in figures and not float(figures["streaming_multiprocessors"][0]).is_integer():
        raise InputError(f"{where}: streaming_multiprocessors.value must be a whole number")
    return KnownChip(path.stem, cost_model, template=named_accelerator(template_name) if template_name else None,
                     template_name=template_name, names=names,
                     sources=MappingProxyType({figure: source for figure, (_, source) in figures.items()}),
                     **{figure: value for figure, (value, _) in figures.items()})


#: The known chips by name (read-only).
KNOWN_CHIPS = MappingProxyType({path.stem: read_chip(path) for path in yaml_files(CHIPS)})


def known_chip(name: str) -> KnownChip:
    if name not in KNOWN_CHIPS:
        raise InputError(f"chip: unknown {name!r}; allowed: {', '.join(KNOWN_CHIPS)}")
    return KNOWN_CHIPS[name]


def chip_of(name: str) -> KnownChip:
    """A packaged chip by name, or a user's chip file by path (read as the packaged ones)."""
    if not is_path(name):
        return known_chip(name)
    if not Path(name).is_file():
        raise InputError(f"chip: no such chip file {name!r}; allowed: {', '.join(KNOWN_CHIPS)} or a chip file's path")
    return read_chip(Path(name))
