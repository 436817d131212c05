"""Chip area of the template: the linear model of the original program (msr-fiddle/phaze), vectorised.

area = num_tc·w·d·A_mac + num_tc·A_sram(max(w·d/64, 1) KiB) + num_vc·w_vc·A_lane
       + num_vc·A_sram(max(w_vc/64, 1) KiB) + A_glb(GLB)            [µm²]
The tables are data (phaze_hardware/area_model.yaml); sizes outside them are an error, not an
extrapolation.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from omegaconf import OmegaConf

from phaze_common.checks import InputError
from phaze_hardware.data import hardware_file

AREA_MODEL = hardware_file("area_model.yaml")
MIB = 1024 * 1024


@cache
def _tables() -> dict:
    return OmegaConf.to_container(OmegaConf.load(AREA_MODEL))


def _lookup(table: dict[int, float], keys: np.ndarray, field: str, unit: str) -> np.ndarray:
    known = np.array(sorted(table), dtype=np.int64)
    values = np.array([table[key] for key in known], dtype=np.float64)
    position = np.clip(np.searchsorted(known, keys), 0, len(known) - 1)
    bad = known[position] != keys
    if np.any(bad):
        raise InputError(f"{field}: no area data for {int(keys[bad].flat[0])} {unit}; "
                         f"the area model covers {known[0]}..{known[-1]} {unit} in powers of two")
    return values[position]


def core_sram_kib(units_per_core: np.ndarray | int) -> np.ndarray:
    """Per-core SRAM of the template: 16 bytes per unit, at least 1 KiB (the original's core buffer)."""
    return np.maximum(np.asarray(units_per_core, dtype=np.int64) // 64, 1)


def area_um2(num_tc, num_vc, tc_width, tc_depth, vc_width, glb_bytes) -> np.ndarray:
    """Area [µm²] of accelerators given as scalars or equally shaped integer arrays."""
    tables = _tables()
    num_tc, num_vc, tc_width, tc_depth, vc_width, glb_bytes = (
        np.asarray(value, dtype=np.int64) for value in (num_tc, num_vc, tc_width, tc_depth, vc_width, glb_bytes))
    macs = tc_width * tc_depth
    sram = tables["core_sram_um2_by_kib"]
    tc = num_tc * macs * tables["tc_mac_um2"] + num_tc * _lookup(sram, core_sram_kib(macs), "tc_width*tc_depth", "KiB of core SRAM")
    vc = num_vc * vc_width * tables["vc_lane_um2"] + num_vc * _lookup(sram, core_sram_kib(vc_width), "vc_width", "KiB of core SRAM")
    glb_table = {mib * MIB: value for mib, value in tables["glb_um2_by_mib"].items()}
    glb = _lookup(glb_table, glb_bytes, "glb_bytes", "bytes")
    return tc + vc + glb
