"""The accelerator candidate space: the original's generation loops under an area budget
(msr-fiddle/phaze at fed7cde, `Estimator/architecture.py` `generate_all_cores_to_explore`).

With the TPUv4-like budget it holds 29,360 candidates in the original's order, which use 4,186
distinct tensor-core configurations and 697 distinct vector-core configurations.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache

import numpy as np
from omegaconf import OmegaConf

from phaze_common.checks import InputError
from phaze_hardware import (DEFAULT_BUDGET, MIB, AcceleratorConfig, CoreConfig, area_um2, named_accelerator,
                            tensor_core_flops)
from phaze_hardware.data import arch_config

#: The candidate space's dimensions and the budget's rules (data).
CANDIDATE_SPACE = arch_config("candidate_space.yaml")



def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _first_appearance(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `keys` deduplicated in order of first appearance, and each row's index among them."""
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return keys[first[order]], rank[inverse.ravel()]


class CandidateSpace(Sequence[AcceleratorConfig]):
    """The candidates in order, as columns (numpy) and as `AcceleratorConfig` items (with `.area`).

    `tc_cores` / `vc_cores` are the distinct core configurations in order of first appearance and
    `tc_index` / `vc_index` map each candidate to its position there.
    """

    def __init__(self, template: AcceleratorConfig, area_budget: float, columns: dict[str, np.ndarray]) -> None:
        self.template = template
        self.area_budget = area_budget
        self.num_tc, self.num_vc, self.width, self.depth, self.glb_bytes, self.area = (
            _read_only(columns[name]) for name in ("num_tc", "num_vc", "width", "depth", "glb_bytes", "area"))
        tc_keys, self.tc_index = _first_appearance(np.stack([self.num_tc, self.width, self.depth, self.glb_bytes], 1))
        vc_keys, self.vc_index = _first_appearance(np.stack([self.num_vc, self.width, self.glb_bytes], 1))
        self.tc_cores = tuple(CoreConfig(*map(int, row)) for row in tc_keys)
        self.vc_cores = tuple(CoreConfig(int(num), int(width), 1, int(glb)) for num, width, glb in vc_keys)

    def __len__(self) -> int:
        return len(self.area)

    @property
    def matrix_flops(self) -> np.ndarray:
        """FLOP/s of each candidate's tensor cores at their best (`phaze_hardware.tensor_core_flops`)."""
        template = self.template
        return tensor_core_flops(self.num_tc, self.width, self.depth, template.clock_hz, template.tensor_core_efficiency)

    def __getitem__(self, index: int) -> AcceleratorConfig:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        width = int(self.width[index])  # the vector cores' width is the tensor cores' (the original's space)
        return self.template.with_dimensions(num_tc=int(self.num_tc[index]), num_vc=int(self.num_vc[index]),
                                             tc_width=width, tc_depth=int(self.depth[index]), vc_width=width,
                                             glb_bytes=int(self.glb_bytes[index]))

    def __iter__(self) -> Iterator[AcceleratorConfig]:
        return (self[i] for i in range(len(self)))


def _loops() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CANDIDATE_SPACE))


@cache
def candidate_space(template: AcceleratorConfig | None = None, area_budget: float | None = None) -> CandidateSpace:
    """All candidates of the template within the area budget, in the original's loop order.

    `template` gives the technology (clock, bandwidths, ...) of every candidate and, unless
    `area_budget` [µm²] is given, the budget: its own area (default: the TPUv4-like chip).
    """
    template = template or named_accelerator(DEFAULT_BUDGET)
    budget = template.area if area_budget is None else float(area_budget)
    loops = _loops()
    grid = np.meshgrid(*(np.array(loops[name], dtype=np.int64) for name in ("num_tc", "num_vc", "width", "depth", "glb_mib")),
                       indexing="ij")
    num_tc, num_vc, width, depth, glb_mib = (axis.ravel() for axis in grid)
    glb_bytes = glb_mib * MIB
    area = area_um2(num_tc, num_vc, width, depth, width, glb_bytes)
    floor = np.where((num_tc == 1) | (num_vc == 1), 0.0, loops["min_area_fraction"]) * budget
    keep = (area <= budget) & (area >= floor)
    if not keep.any():
        raise InputError(f"area_budget: {budget:,.2f} µm² admits no accelerator configuration; "
                         f"the smallest candidate needs {area.min():,.2f} µm²")
    columns = dict(num_tc=num_tc, num_vc=num_vc, width=width, depth=depth, glb_bytes=glb_bytes, area=area)
    return CandidateSpace(template, budget, {name: column[keep] for name, column in columns.items()})
