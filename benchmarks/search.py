"""Wall time of the default job (`make run`: `phaze run_solver`, BERT-Large, the bounded search over
29,360 chips), each run on a cold cache: the whole command, and the search's own phase (the
"candidates" line of phaze.log), with the answer it finds (the same every run).
Run from the repository root: python -m benchmarks.search [--runs N] [phaze overrides...]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The log line that ends the search's phase: "candidates (...): done, N architectures in 38s, ...".
SEARCH_DONE = re.compile(r"candidates \(.*\): done, [\d,]+ architectures in ([\dhms.]+)")


def seconds(text: str) -> float:
    """Seconds of a duration as the progress lines write it (`38s`, `10m06s`, `3h05m`)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(number) * units[unit] for number, unit in re.findall(r"([\d.]+)([hms])", text))


def run(directory: Path, overrides: list[str]) -> tuple[float, float, tuple]:
    """(command seconds, search seconds, answer) of one cold run."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "phaze", "run_solver", f"cache_dir={directory / 'cache'}",
                    f"hydra.run.dir={directory / 'run'}", *overrides], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    found = SEARCH_DONE.findall((directory / "run" / "phaze.log").read_text())
    best = json.loads((directory / "run" / "best.json").read_text())
    layout = best["placement"]
    answer = (round(best["throughput"], 1), best["accelerator"]["area"], layout["tensor_parallel_width"],
              layout["pipeline_parallel_width"], layout["data_parallel_width"], layout["virtual_stages"])
    return wall, sum(map(seconds, found)), answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="cold runs (default 3); the medians are printed")
    parser.add_argument("overrides", nargs="*", help="more phaze overrides, e.g. n_jobs=1")
    arguments = parser.parse_args()
    walls, searches, answers = [], [], set()
    for index in range(arguments.runs):
        with tempfile.TemporaryDirectory(prefix="phaze-search-") as scratch:
            wall, search, answer = run(Path(scratch), arguments.overrides)
        walls.append(wall)
        searches.append(search)
        answers.add(answer)
        print(f"run {index + 1}: {wall:.1f} s the command, {search:.0f} s the search", flush=True)
    if len(answers) != 1:
        raise SystemExit(f"the runs found different answers: {sorted(answers)}")
    throughput, area, t, p, d, v = answers.pop()
    print(f"median: {statistics.median(walls):.1f} s the command, {statistics.median(searches):.0f} s the search; "
          f"{throughput:,.1f} samples/s on a chip of {area / 1e6:.1f} mm², t={t} p={p} d={d} v={v}")


if __name__ == "__main__":
    main()
