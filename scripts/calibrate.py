"""Fit the achievable fractions of a known GPU and its cluster to published measured runs.

    python scripts/calibrate.py arch_configs/calibration/runs.json [--chip a100_80gb ...] [--precision fp8]
    python scripts/calibrate.py arch_configs/calibration/runs.json --experts

A few numbers, no factor per run. In 16-bit: the chip's matrix efficiency (fraction of peak FLOP/s
on its GEMMs) and memory efficiency (fraction of HBM bandwidth), and with --links the efficiency of
each link tier of its cluster preset (NVLink, InfiniBand). In FP8 (MXFP8): the FP8 (MXFP8) matrix
efficiency alone (the rest as fitted in 16-bit). They minimise the mean absolute relative error of the time per
iteration over the dense runs of that precision `phaze validate` predicts on that chip, or on several
chips of one die at once (B200 and GB200: one value for both; mixtures of experts are left to their
own model), by coordinate search on a grid refined three times. It
prints the fitted values (to copy into phaze_hardware/chips/<chip>.yaml and phaze_hardware/systems/<system>.yaml)
and the errors before and after.

With --experts it fits one number instead, the host's seconds to issue one local expert's GEMM of a
grouped expert product (`expert_gemm_host_seconds`, `estimator.roofline.issue_seconds`), one value
for every GPU (a figure of the host and framework, as `kernel_host_seconds`): it minimises the mean
absolute relative error over every mixture-of-experts run on a GPU `phaze validate` predicts, by a
grid of 10 µs steps from 10 to 200 µs refined three times (each time 4 times finer around the best).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from phaze_common.files import user_cache_dir  # noqa: E402
from phaze_hardware import cluster as system_cluster  # noqa: E402
from phaze_hardware import known_chip  # noqa: E402
from phaze.validation.cases import case, prediction  # noqa: E402

#: The chip's fractions fitted per precision; then the link tiers' (--links).
CHIP_NAMES = {"16-bit": ("matrix_efficiency", "memory_efficiency"), "fp8": ("fp8_matrix_efficiency",),
              "mxfp8": ("mxfp8_matrix_efficiency",)}
LINK_NAMES = ("intra_node_efficiency", "inter_node_efficiency")
#: The least a fraction may be fitted to where less is not physical: streaming kernels (copies,
#: norms, element-wise) reach 80-90 % of HBM bandwidth on A100 and H100 (STREAM-like measurements,
#: e.g. the CUDA samples' bandwidthTest); a fit below 0.6 would be hiding another cost.
LOWEST = {"memory_efficiency": 0.6}


def errors(cases, names: tuple[str, ...], values: np.ndarray, cache_dir: Path) -> np.ndarray:
    """Relative errors of the predicted time per iteration with these fractions (`names`: the chip's
    first, then the link tiers')."""
    found, fitted = [], len([name for name in names if name not in LINK_NAMES])
    for item in cases:
        chip = dataclasses.replace(known_chip(item.chip), **dict(zip(names[:fitted], map(float, values))))
        cluster = system_cluster(item.system, item.devices)
        tiers = tuple(dataclasses.replace(tier, efficiency=float(value))
                      for tier, value in zip(cluster.tiers, values[fitted:])) + cluster.tiers[len(values) - fitted:]
        predicted = prediction(item, cache_dir, chip, dataclasses.replace(cluster, tiers=tiers))
        found.append(predicted.step.time_per_batch / item.measured - 1)
    return np.array(found)


#: The host's seconds per local expert GEMM `--experts` searches first: 10 to 200 µs in steps of 10.
EXPERT_GRID = np.arange(1, 21) * 10e-6


def expert_errors(cases, seconds: float, cache_dir: Path) -> np.ndarray:
    """Relative errors of the predicted time per iteration with `seconds` per local expert GEMM on
    every chip."""
    return np.array([prediction(item, cache_dir, dataclasses.replace(known_chip(item.chip),
                                                                     expert_gemm_host_seconds=seconds))
                     .step.time_per_batch / item.measured - 1 for item in cases])


def fit_expert_seconds(cases, cache_dir: Path) -> float:
    """The seconds per local expert GEMM of least mean absolute error (module docstring)."""
    grid, step, best = EXPERT_GRID, EXPERT_GRID[1] - EXPERT_GRID[0], None
    for _ in range(4):
        scores = {float(seconds): float(np.abs(expert_errors(cases, seconds, cache_dir)).mean())
                  for seconds in grid if seconds > 0}
        best = min(scores, key=scores.get)
        step /= 4
        grid = best + step * np.arange(-3, 4)
    return best


def calibrate_experts(runs: str, cache_dir: Path) -> None:
    """Fit and print `expert_gemm_host_seconds` (--experts) with the errors before and after."""
    cases = [item for run in json.loads(Path(runs).read_text())
             if not isinstance(item := case(run), str) and item.moe and known_chip(item.chip).kernel_host_seconds > 0]
    if not cases:
        sys.exit(f"calibrate: error: --experts: no mixture-of-experts run on a GPU that phaze validate predicts in {runs}")
    start = np.array([prediction(item, cache_dir).step.time_per_batch / item.measured - 1 for item in cases])
    seconds = fit_expert_seconds(cases, cache_dir)
    final = expert_errors(cases, seconds, cache_dir)
    print(f"{len(cases)} mixture-of-experts runs on GPUs: mean |error| {np.abs(start).mean():.1%} -> "
          f"{np.abs(final).mean():.1%}, max {np.abs(start).max():.1%} -> {np.abs(final).max():.1%}")
    print(f"  expert_gemm_host_seconds: {seconds:.3g}")
    for item, before, after in zip(cases, start, final):
        print(f"  {item.run_id:50} {before:+.1%} -> {after:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("--chip", nargs="+", default=["a100_80gb"], help="a chip, or several of one die fitted together")
    parser.add_argument("--cache-dir", default=None,
                        help="the graphs' cache (default: the per-user cache folder, phaze's)")
    parser.add_argument("--precision", default="16-bit", choices=tuple(CHIP_NAMES))
    parser.add_argument("--links", action="store_true", help="fit the link tiers' efficiencies too")
    parser.add_argument("--experts", action="store_true",
                        help="fit expert_gemm_host_seconds to the mixture-of-experts runs on GPUs instead")
    args = parser.parse_args()
    if args.experts:
        calibrate_experts(args.runs, user_cache_dir() if args.cache_dir is None else Path(args.cache_dir))
        return
    cases = [item for run in json.loads(Path(args.runs).read_text())
             if not isinstance(item := case(run), str) and item.chip in args.chip
             and item.precision == args.precision and not item.moe]
    if not cases:
        sys.exit(f"calibrate: error: --chip: no dense {args.precision} run on {' or '.join(args.chip)} that phaze validate "
                 f"predicts in {args.runs}")
    cache_dir = user_cache_dir() if args.cache_dir is None else Path(args.cache_dir)
    chip = known_chip(args.chip[0])
    tiers = system_cluster(cases[0].system, cases[0].devices).tiers
    names = CHIP_NAMES[args.precision] + (LINK_NAMES[:len(tiers)] if args.links else ())
    values = np.array([getattr(chip, name) for name in CHIP_NAMES[args.precision]]
                      + ([tier.efficiency for tier in tiers] if args.links else []))
    start = errors(cases, names, values, cache_dir)
    objective = float(np.abs(start).mean())
    step = 0.1
    for _ in range(4):  # coordinate search, the grid refined each round
        improved = True
        while improved:
            improved = False
            for index in range(len(values)):
                for candidate in values[index] + step * np.arange(-5, 6):
                    if not LOWEST.get(names[index], 0.2) <= candidate <= 1.0 or candidate == values[index]:
                        continue
                    trial = values.copy()
                    trial[index] = candidate
                    score = float(np.abs(errors(cases, names, trial, cache_dir)).mean())
                    if score < objective - 1e-9:
                        values, objective, improved = trial, score, True
        step /= 4
    final = errors(cases, names, values, cache_dir)
    print(f"{len(cases)} runs on {' and '.join(args.chip)}: mean |error| {np.abs(start).mean():.1%} -> {np.abs(final).mean():.1%}, "
          f"max {np.abs(start).max():.1%} -> {np.abs(final).max():.1%}")
    for name, value in zip(names, values):
        print(f"  {name}: {value:.3f}")
    for item, before, after in zip(cases, start, final):
        print(f"  {item.run_id:34} {before:+.1%} -> {after:+.1%}")


if __name__ == "__main__":
    main()
