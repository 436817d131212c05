"""Observable long runs: progress lines of every phase (a fake clock for the class; a real run_solver
with its output in pipes), phaze.log holding what the console shows and the unwrapped summary, and
a warning given in a worker process shown once."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from phaze_common.progress import INTERVAL, INTERVAL_VARIABLE, Progress, duration, progress_interval
from graph_extract import extract
from phaze_hardware import KNOWN_CHIPS, named_accelerator
from phaze.console import show

REPOSITORY = Path(__file__).resolve().parents[1]
#: A run_solver of a few seconds that evaluates its 4 candidates in 2 worker processes.
SMALL = ["model=bertbase", "num_devices=8", "global_batch_size=16", "candidate_sample=4", "search=exhaustive",
         "schedule.backend=heuristic", "hbm_size=32", "n_jobs=2"]
#: A log line: date, time, level, message.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) (.+)$")


class Clock:
    """A fake time.monotonic: the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def messages(caplog, name: str = "test.progress") -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == name]


@pytest.fixture
def logger(caplog) -> logging.Logger:
    caplog.set_level(logging.INFO, logger="test.progress")
    return logging.getLogger("test.progress")


# --- the Progress class --------------------------------------------------------------------------


def test_lines_at_start_every_interval_and_end(logger, caplog):
    clock = Clock()
    with Progress("candidates", 2000, "architectures", logger, interval=30.0, clock=clock, heartbeat=False,
                  display=False) as progress:
        clock.now += 20.0
        progress.advance(60)  # 20 s after the start line: none
        clock.now += 18.7
        progress.advance(60)  # 38.7 s: 120 done
        clock.now += 21.3
        progress.advance()  # 21.3 s after the last line: none
        clock.now += 10.0
        progress.advance(879)  # 31.3 s: 1,000 done in 70 s
        clock.now += 70.0
    assert messages(caplog) == [
        "candidates: started (2,000 architectures)",
        # 120/2000 = 6%; 120/38.7 s = 3.10/s; (2000 - 120) / 3.10 = 1880 * 38.7 / 120 = 606.3 s
        "candidates: 120/2,000 architectures (6.0%), 3.1 architectures/s, ETA 10m06s",
        # 1000/70 s = 14.29/s; 1000 more take 70 s
        "candidates: 1,000/2,000 architectures (50.0%), 14.3 architectures/s, ETA 1m10s",
        # 1000 in 140 s = 7.143/s
        "candidates: done, 1,000/2,000 architectures in 2m20s, 7.14 architectures/s",
    ]


def test_unknown_total_gives_the_rate_and_no_eta(logger, caplog):
    clock = Clock()
    with Progress("bounded search", None, "architectures", logger, interval=10.0, clock=clock, heartbeat=False,
                  display=False) as progress:
        clock.now += 10.0
        progress.advance(5)
        clock.now += 3990.0
    assert messages(caplog) == [
        "bounded search: started (total unknown)",
        "bounded search: 5 architectures, 0.5 architectures/s (total unknown)",
        "bounded search: done, 5 architectures in 1h06m, 0.00125 architectures/s",  # 4000 s
    ]


def test_a_phase_inside_another_logs_only_once_it_has_run_an_interval(logger, caplog):
    clock = Clock()
    options = dict(logger=logger, interval=30.0, clock=clock, heartbeat=False, display=False)
    with Progress("candidates", 2, "architectures", **options) as outer:
        with Progress("layer schedules of A", 3, "unique layers", **options) as steps:
            clock.now += 29.0
            steps.advance(3)  # a short step: no line at all
        outer.advance()
        with Progress("layer schedules of B", 3, "unique layers", **options) as steps:
            clock.now += 40.0
            steps.advance()
            clock.now += 20.0
            steps.advance(2)
        outer.advance()
    assert messages(caplog) == [
        "candidates: started (2 architectures)",
        # 1 in 40 s: 0.025/s, 2 more in 80 s
        "layer schedules of B: 1/3 unique layers (33.3%), 0.025 unique layers/s, ETA 1m20s",
        "layer schedules of B: done, 3/3 unique layers in 1m00s, 0.05 unique layers/s",
        # 89 s after the outer's start line: 2/89 = 0.0225/s
        "candidates: 2/2 architectures (100.0%), 0.0225 architectures/s, ETA 0s",
        "candidates: done, 2/2 architectures in 1m29s, 0.0225 architectures/s",
    ]


def test_an_interrupted_phase_says_so(logger, caplog):
    clock = Clock()
    with pytest.raises(KeyboardInterrupt):
        with Progress("placement", 4, "settings", logger, interval=30.0, clock=clock, heartbeat=False,
                      display=False) as progress:
            clock.now += 5.0
            progress.advance()
            raise KeyboardInterrupt
    assert messages(caplog)[-1] == "placement: stopped (KeyboardInterrupt), 1/4 settings in 5s, 0.2 settings/s"


def test_fast_rates_are_whole_numbers(logger, caplog):
    clock = Clock()
    with Progress("GEMM estimates", 50000, "shapes", logger, interval=30.0, clock=clock, heartbeat=False,
                  display=False) as progress:
        clock.now += 30.0
        progress.advance(2500)  # 83.3/s: 47,500 more take 570 s
        clock.now += 10.0
        progress.advance(47500)
    assert messages(caplog)[1:] == [
        "GEMM estimates: 2,500/50,000 shapes (5.0%), 83.3 shapes/s, ETA 9m30s",
        "GEMM estimates: done, 50,000/50,000 shapes in 40s, 1,250 shapes/s",
    ]


def test_a_terminal_shows_bars_and_logs_only_starts_and_ends(logger, caplog):
    with Progress("candidates", 3, "architectures", logger, interval=0.0, display=True) as outer:
        for _ in range(3):
            with Progress("layer schedules", 2, "unique layers", logger, interval=0.0, display=True) as steps:
                steps.advance(2)
            outer.advance()
    lines = messages(caplog)
    assert lines[0] == "candidates: started (3 architectures)" and len(lines) == 2
    assert lines[1].startswith("candidates: done, 3/3 architectures in ")


def test_heartbeat_logs_while_nothing_advances(logger, caplog):
    with Progress("slow", 10, "items", logger, interval=0.05, display=False):
        time.sleep(0.3)
    lines = messages(caplog)
    assert lines[0] == "slow: started (10 items)" and lines[-1].startswith("slow: done, 0/10 items in ")
    assert len(lines) >= 3 and set(lines[1:-1]) == {"slow: 0/10 items (0.0%)"}


def test_interval_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(INTERVAL_VARIABLE, "2.5")
    assert progress_interval() == 2.5 == Progress("x", 1, "items").interval
    monkeypatch.setenv(INTERVAL_VARIABLE, "0")
    assert progress_interval() == 0.0
    monkeypatch.delenv(INTERVAL_VARIABLE)
    assert progress_interval() == INTERVAL == 30.0
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv(INTERVAL_VARIABLE, bad)
        assert progress_interval() == INTERVAL
        assert progress_interval() == INTERVAL  # warned once per value
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"{INTERVAL_VARIABLE}: {bad!r} is not a number of seconds >= 0; using 30"
                      for bad in ("soon", "-1", "nan", "inf")]


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (42, "42s"), (59.6, "1m00s"), (606.3, "10m06s"),
                                           (3599, "59m59s"), (3600, "1h00m"), (11100, "3h05m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_show_prints_and_logs_each_line_unwrapped(capsys, caplog):
    caplog.set_level(logging.INFO, logger="phaze.summary")
    long = "x" * 300
    show(f"first\n{long}")
    assert capsys.readouterr().out == f"first\n{long}\n"
    assert messages(caplog, "phaze.summary") == ["first", long]


# --- a real run, its output in pipes -------------------------------------------------------------


def run_solver(cache: Path, run: Path, *overrides: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY), INTERVAL_VARIABLE: "0"}
    return subprocess.run([sys.executable, "-m", "phaze", "run_solver", *SMALL, f"cache_dir={cache}",
                           f"hydra.run.dir={run}", *overrides], cwd=run.parent, capture_output=True, text=True,
                          env=environment)


def log_messages(text: str) -> list[str]:
    """The messages of log lines; every line must be one."""
    found = []
    for line in text.splitlines():
        match = LINE.match(line)
        assert match, f"not a log line: {line!r}"
        found.append(match.group(2))
    return found


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """(cache, run directory, the process) of a run on an empty cache."""
    folder = tmp_path_factory.mktemp("observe")
    result = run_solver(folder / "cache", folder / "run")
    assert result.returncode == 0, result.stderr
    return folder / "cache", folder / "run", result


def chip_label(chip) -> str:
    """How a chip's layer schedules are named in the progress lines."""
    return f"{chip.num_tc} TC {chip.tc_width}x{chip.tc_depth}, {chip.num_vc} VC, {chip.glb_bytes // 2**20} MiB"


def counted(lines: list[str], name: str, unit: str, total: int, step: bool = False) -> None:
    """The phase `name` logged its start (not a step's), every count 1..total, and its end."""
    assert (f"{name}: started ({total:,} {unit})" in lines) is not step
    for done in range(1, total + 1):
        assert any(line.startswith(f"{name}: {done:,}/{total:,} {unit} ({done / total:.1%})") for line in lines), \
            (name, done)
    assert any(line.startswith(f"{name}: done, {total:,}/{total:,} {unit} in ") for line in lines), name


@pytest.mark.slow
def test_run_logs_every_phase_to_stderr_and_phaze_log(clean_run):
    cache, run, result = clean_run
    console = log_messages(result.stderr)
    counted(console, "graph extraction of bertbase", "graphs", 1)
    shapes = int(re.search(r"GEMM estimates \(0 cached\): started \((\d+) shapes\)", result.stderr).group(1))
    counted(console, "GEMM estimates (0 cached)", "shapes", shapes)
    counted(console, "candidates (exhaustive search)", "architectures", 4)
    counted(console, "placement per (micro-batch, HBM)", "settings", 1)
    # each candidate's layer schedules, a step in a worker: one line per unique layer
    unique_layers = len(extract("bertbase", 1, cache_dir=cache).repeat_groups)
    chips = {match.group(1) for line in console
             if (match := re.match(r"worker \d: layer schedules of (.+): done, ", line))}
    # the 4 candidates', and the baselines' (the budget chip, the validated TPU v4): the workers
    # evaluate those beside the bounds before the search
    baselines = {chip_label(chip) for chip in (named_accelerator("tpuv4_like"), KNOWN_CHIPS["tpuv4"].template)}
    assert baselines <= chips and len(chips - baselines) == 4
    lines = [re.sub(r"^worker \d: ", "", line) for line in console]
    for chip in chips:
        counted(lines, f"layer schedules of {chip}", "unique layers", unique_layers, step=True)

    # phaze.log: the console's lines, then the summary, which only stdout shows besides
    logged = log_messages((run / "phaze.log").read_text())
    summary = result.stdout.splitlines()
    assert logged == console + summary
    assert not set(summary) & set(console)
    assert len(summary) == 3 and all(summary)  # no blank lines
    # unwrapped: the setting's line and its time breakdown are each one line, longer than 120
    assert summary[0].startswith("micro-batch 1, HBM 32 GiB: ") and summary[0].endswith(" 4 architectures evaluated")
    assert summary[1].startswith("  time per batch ") and "vs fixed_megatron: " in summary[1]
    assert all(len(line) > 120 for line in summary[:2])
    assert summary[2] == f"results: {run}"
    best = json.loads((run / "best.json").read_text())
    assert f"{best['throughput']:.1f} samples/s" in summary[0]


@pytest.mark.slow
def test_a_warning_in_a_worker_is_shown_once(clean_run, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(clean_run[0], cache)
    with closing(sqlite3.connect(cache / "evaluations.sqlite")) as db, db:
        db.execute("DELETE FROM placements")  # the candidates are evaluated again, in the workers,
        db.execute("UPDATE layer_costs SET value = ?", ('{"1": {"0": {"forward": 1.0}}}',))  # on bad costs
    result = run_solver(cache, tmp_path / "run")
    assert result.returncode == 0, result.stderr
    console = log_messages(result.stderr)
    logged = log_messages((tmp_path / "run" / "phaze.log").read_text())
    warning = f"{cache / 'evaluations.sqlite'} holds an unreadable layer_costs value"
    for lines in (console, logged):
        (line,) = [line for line in lines if warning in line]
        assert re.match(r"worker \d: cache: ", line), line
    assert len(re.findall(" WARNING ", result.stderr)) == 1
    assert json.loads((tmp_path / "run" / "best.json").read_text())["throughput"] == \
        json.loads((clean_run[1] / "best.json").read_text())["throughput"]
