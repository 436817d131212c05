"""Wall time of the GPT-3 paper sweep (`scripts/gpt3.sh "[1,2,4,8]"`: 4 micro-batch sizes x HBM 32,
64 and 80 GiB, 12 settings) on a cold cache, then again on the warm cache it left, with the same
answers both times. Before the bounded search shared its bounds and cached its evaluations it took
12 min 55 s cold and 12.5 min warm; targets under 5 min cold and seconds warm.
Run from the repository root: python -m benchmarks.sweep [--micro-batch-sizes "[1,2]"] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpt3.sh"


def run(micro_batch_sizes: str, cache: Path, directory: Path, overrides: list[str]) -> tuple[float, dict]:
    """Seconds of one sweep and its best.json."""
    began = time.perf_counter()
    subprocess.run([str(SCRIPT), micro_batch_sizes, f"cache_dir={cache}", f"hydra.run.dir={directory}", *overrides],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began, json.loads((directory / "best.json").read_text())


def answers(best: dict) -> list[tuple]:
    return [(s["micro_batch_size"], s["hbm_size_gib"], s.get("throughput"), s.get("accelerator", {}).get("area"))
            for s in best["per_setting"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch-sizes", default="[1,2,4,8]")
    parser.add_argument("--cache", type=Path, help="cache folder (default: a fresh temporary one, so the first run is cold)")
    parser.add_argument("overrides", nargs="*", help="more phaze overrides, e.g. n_jobs=2")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phaze-sweep-") as scratch:
        cache = arguments.cache or Path(scratch) / "cache"
        cold, first = run(arguments.micro_batch_sizes, cache, Path(scratch) / "cold", arguments.overrides)
        print(f"cold: {cold:7.1f} s  ({len(first['per_setting'])} settings, "
              f"{first['architectures_evaluated']} architectures evaluated)", flush=True)
        warm, second = run(arguments.micro_batch_sizes, cache, Path(scratch) / "warm", arguments.overrides)
        print(f"warm: {warm:7.1f} s  ({cold / warm:.0f}x faster)")
        if answers(first) != answers(second):
            raise SystemExit("the warm sweep's answers differ from the cold sweep's")
        print("same answers: " + "; ".join(f"mbs {m}, {h:g} GiB: {t:.1f} samples/s" for m, h, t, _ in answers(first)))


if __name__ == "__main__":
    main()
