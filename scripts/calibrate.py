"""Fit the achievable fractions of a known GPU and its cluster to published measured runs.

    python scripts/calibrate.py arch_configs/calibration/runs.json [--chip a100_80gb]

Four numbers, no factor per run: the chip's matrix efficiency (fraction of peak FLOP/s on its
GEMMs) and memory efficiency (fraction of HBM bandwidth), and the efficiency of each link tier of
its cluster preset (NVLink, InfiniBand). They minimise the mean absolute relative error of the time
per iteration over the 16-bit runs `phaze validate` predicts on that chip (FP8 runs price their GEMMs
with the chip's FP8 efficiency, which these fractions do not set), by coordinate search on a grid
refined three times. It prints the fitted values (to copy into hardware/chips/<chip>.yaml and
hardware/systems/<system>.yaml) and the errors before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from hardware import cluster as system_cluster  # noqa: E402
from hardware import known_chip  # noqa: E402
from phaze.validate import case, prediction  # noqa: E402

NAMES = ("matrix_efficiency", "memory_efficiency", "intra_node_efficiency", "inter_node_efficiency")


def errors(cases, values: np.ndarray, cache_dir: Path) -> np.ndarray:
    """Relative errors of the predicted time per iteration with these four fractions."""
    found = []
    for item in cases:
        chip = known_chip(item.chip).with_efficiencies(values[0], values[1])
        cluster = system_cluster(item.system, item.devices)
        tiers = tuple(dataclasses.replace(tier, efficiency=float(value))
                      for tier, value in zip(cluster.tiers, values[2:]))
        predicted = prediction(item, cache_dir, chip, dataclasses.replace(cluster, tiers=tiers))
        found.append(predicted.step.time_per_batch / item.measured - 1)
    return np.array(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("--chip", default="a100_80gb")
    parser.add_argument("--cache-dir", default="outputs/cache")
    parser.add_argument("--links", action="store_true", help="fit the link tiers' efficiencies too")
    args = parser.parse_args()
    cases = [item for run in json.loads(Path(args.runs).read_text())
             if not isinstance(item := case(run), str) and item.chip == args.chip and item.precision == "16-bit"]
    if not cases:
        sys.exit(f"calibrate: error: --chip: no 16-bit run on {args.chip} that phaze validate predicts in {args.runs}")
    cache_dir = Path(args.cache_dir)
    chip = known_chip(args.chip)
    tiers = system_cluster(cases[0].system, cases[0].devices).tiers
    values = np.array([chip.matrix_efficiency, chip.memory_efficiency, *(tier.efficiency for tier in tiers)])
    start = errors(cases, values, cache_dir)
    objective = float(np.abs(start).mean())
    step = 0.1
    for _ in range(4):  # coordinate search, the grid refined each round
        improved = True
        while improved:
            improved = False
            for index in range(len(values) if args.links else 2):
                for candidate in values[index] + step * np.arange(-5, 6):
                    if not 0.2 <= candidate <= 1.0 or candidate == values[index]:
                        continue
                    trial = values.copy()
                    trial[index] = candidate
                    score = float(np.abs(errors(cases, trial, cache_dir)).mean())
                    if score < objective - 1e-9:
                        values, objective, improved = trial, score, True
        step /= 4
    final = errors(cases, values, cache_dir)
    print(f"{len(cases)} runs on {args.chip}: mean |error| {np.abs(start).mean():.1%} -> {np.abs(final).mean():.1%}, "
          f"max {np.abs(start).max():.1%} -> {np.abs(final).max():.1%}")
    for name, value in zip(NAMES, values):
        print(f"  {name}: {value:.3f}")
    for item, before, after in zip(cases, start, final):
        print(f"  {item.run_id:20} {before:+.1%} -> {after:+.1%}")


if __name__ == "__main__":
    main()
