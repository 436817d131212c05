"""Interrupting phaze: Ctrl-C (SIGINT) and SIGTERM sent to real processes stop them within seconds
whatever the schedule backend, the files say what was done (incomplete), the exit status is 130
with one line, a cut-short schedule is never cached, and a rerun finishes from the caches."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import TINY

REPOSITORY = Path(__file__).resolve().parents[1]
ENVIRONMENT = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
INTERRUPTED = "phaze: interrupted; rerun the same command to resume from the caches"
#: Longest wait [s] from the signal to the process's exit (a CP-SAT solve in progress included).
STOP_WITHIN = 5.0

#: One layer that no backend closes within minutes: mixed operators on 3 tensor and 2 vector cores
#: (60 for CP-SAT, 25 for the MILP, whose model grows with the square). The child solves it
#: through a ScheduleCache on disk and reports what the store holds.
SOLVE_ONE_LAYER = textwrap.dedent("""
    import random, sqlite3, sys
    from phaze import interrupt
    from solver.schedule import Op, ScheduleCache, ScheduleProblem
    interrupt.install()
    path, backend, milp_solver = sys.argv[1:]
    count = 60 if backend == "cpsat" else 25
    rng = random.Random(1)
    ops = []
    for _ in range(count):
        latency = rng.uniform(1, 10)
        ops.append(Op(rng.choice(["TC", "VC", "TCandVC"]), latency, latency / rng.uniform(1.5, 4)))
    edges = [(i, j) for j in range(count) for i in range(max(0, j - 6), j) if rng.random() < 0.15]
    if milp_solver == "gurobi":  # within gurobipy's pip licence (2,000 rows): 12 TC operators to pack
        ops, edges = [Op("TC", op.latency, op.latency) for op in ops[:12]], []
    cache = ScheduleCache(path)
    print("solving", flush=True)
    try:
        cache.solve(ScheduleProblem(ops, edges, num_tc=3, num_vc=2), backend, 120.0, milp_solver=milp_solver)
    except KeyboardInterrupt:
        interrupt.ignore()
        rows = sqlite3.connect(path).execute("SELECT count(*) FROM schedules").fetchone()[0]
        print(f"interrupted, {rows} cached", flush=True)
        sys.exit(130)
    print("finished", flush=True)
""")


def start(arguments: list[str], cwd: Path, **options) -> subprocess.Popen:
    """A child with SIGINT at its default, whatever the test runner's shell did to it."""
    return subprocess.Popen(arguments, cwd=cwd, env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **options)


def send(process: subprocess.Popen, number: int, times: int = 1, group: bool = False) -> float:
    """Send the signal (`times` times, 20 ms apart; to the process's group, as a terminal's Ctrl-C
    or a batch system's stop does, when `group`); the seconds until the process has exited."""
    sent = time.monotonic()
    for _ in range(times):
        if process.poll() is None:
            os.killpg(process.pid, number) if group else process.send_signal(number)
        time.sleep(0.02)
    process.wait(timeout=60)
    return time.monotonic() - sent


@pytest.mark.parametrize("backend, milp_solver, number, times", [
    ("cpsat", "cbc", signal.SIGINT, 1), ("cpsat", "cbc", signal.SIGTERM, 1), ("cpsat", "cbc", signal.SIGINT, 5),
    ("milp", "highs", signal.SIGTERM, 1), ("milp", "cbc", signal.SIGINT, 1),
    ("milp", "gurobi", signal.SIGINT, 1), ("milp", "gurobi", signal.SIGTERM, 1),
], ids=["cpsat-sigint", "cpsat-sigterm", "cpsat-sigint-repeated", "highs-sigterm", "cbc-sigint", "gurobi-sigint",
        "gurobi-sigterm"])
def test_a_solve_stops_at_once_and_is_not_cached(tmp_path, backend, milp_solver, number, times):
    before = _processes("cbc")
    process = start([sys.executable, "-c", SOLVE_ONE_LAYER, str(tmp_path / "schedules.sqlite"), backend, milp_solver],
                    tmp_path, start_new_session=True)
    assert process.stdout.readline() == "solving\n"
    time.sleep(2.0)  # the heuristic is done; the exact backend is solving
    assert process.poll() is None
    assert send(process, number, times, group=True) < STOP_WITHIN
    output, errors = process.communicate()
    if milp_solver == "gurobi" and number == signal.SIGINT:  # Gurobi's own SIGINT handler prints it
        output = output.replace("\nInterrupt request received\n", "", 1)
    assert (process.returncode, output) == (130, "interrupted, 0 cached\n"), errors
    time.sleep(0.2)
    assert _processes("cbc") <= before  # CBC's process did not outlive the solve


def _processes(name: str) -> set[int]:
    """The processes running `name` on this machine (Linux /proc)."""
    found = set()
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == name:
                found.add(int(comm.parent.name))
        except OSError:
            continue
    return found


def _rows(path: Path, table: str) -> int:
    """Rows of a cache table another process is writing (0 while it cannot be read)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.1) as db:
            return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    except sqlite3.Error:
        return 0


def run_solver(tmp_path: Path, run: str, *overrides: str) -> list[str]:
    """A small run_solver command whose search lasts seconds on 2 cores (40 candidates, all evaluated),
    with its cache in tmp_path/cache."""
    return [sys.executable, "-m", "phaze", "run_solver", *TINY, "search=exhaustive", "candidate_sample=40",
            "model.overrides.num_layers=4", f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / run}",
            *overrides]


def interrupt_search(tmp_path: Path, arguments: list[str], number: int, times: int = 1,
                     jobs: int = 1) -> subprocess.CompletedProcess:
    """Start the run, signal it once its search has evaluated a batch of candidates (8 per worker
    process), and check that it stopped in time."""
    process = start(arguments, tmp_path)
    deadline = time.monotonic() + 120
    while _rows(tmp_path / "cache" / "evaluations.sqlite", "placements") < 8 * jobs + 4:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert send(process, number, times) < STOP_WITHIN
    output, errors = process.communicate()
    return subprocess.CompletedProcess(arguments, process.returncode, output, errors)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """best.json of the same run, never interrupted, on its own cache."""
    root = tmp_path_factory.mktemp("reference")
    done = subprocess.run(run_solver(root, "run", "n_jobs=1"), cwd=root, env=ENVIRONMENT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads((root / "run" / "best.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("number, times, jobs", [(signal.SIGINT, 1, 1), (signal.SIGTERM, 1, 2), (signal.SIGINT, 5, 1)],
                         ids=["sigint", "sigterm-2-workers", "sigint-repeated"])
def test_interrupted_run_writes_what_was_done_and_a_rerun_finishes(tmp_path, reference, number, times, jobs):
    arguments = run_solver(tmp_path, "stopped", f"n_jobs={jobs}")
    stopped = interrupt_search(tmp_path, arguments, number, times, jobs)
    assert stopped.returncode == 130, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("phaze: interrupted: what was done is in ") and "rerun the same command" in last
    assert "Traceback" not in stopped.stderr
    best = json.loads((tmp_path / "stopped" / "best.json").read_text())
    assert best["complete"] is False and best["per_setting"][0]["complete"] is False
    table = pd.read_csv(tmp_path / "stopped" / "results.csv")
    assert len(table) and not table["run_complete"].any()
    assert best["architectures_evaluated"] == table["candidate_index"].nunique() < 40
    assert "interrupted" in stopped.stdout  # the summary says so

    rerun = subprocess.run(run_solver(tmp_path, "rerun", f"n_jobs={jobs}"), cwd=tmp_path, env=ENVIRONMENT,
                           capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    again = json.loads((tmp_path / "rerun" / "best.json").read_text())
    assert again["complete"] is True and again["architectures_evaluated"] == 40
    for field in ("throughput", "accelerator", "placement"):
        assert again[field] == reference[field]


@pytest.mark.slow
def test_heuristic_backend_interrupted_exits_130(tmp_path):
    stopped = interrupt_search(tmp_path, run_solver(tmp_path, "stopped", "n_jobs=1", "schedule.backend=heuristic",
                                                    "candidate_sample=400"), signal.SIGINT)
    assert stopped.returncode == 130 and stopped.stderr.strip().splitlines()[-1].startswith("phaze: interrupted")
    assert json.loads((tmp_path / "stopped" / "best.json").read_text())["complete"] is False


def signal_while_tracing(tmp_path: Path, mode: str, number: int) -> subprocess.CompletedProcess:
    """Run `mode` on GPT-3 (four widths to trace); signal it once the first width's graph is cached."""
    process = start([sys.executable, "-m", "phaze", mode, "model=megatrongpt3", f"cache_dir={tmp_path / 'cache'}",
                     f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "cache").glob("graphs/*.json")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    assert send(process, number) < STOP_WITHIN
    output, errors = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, output, errors)


def test_interrupt_while_tracing_writes_an_empty_incomplete_run(tmp_path):
    """Before the search: nothing evaluated, still a best.json that says so."""
    stopped = signal_while_tracing(tmp_path, "run_solver", signal.SIGTERM)
    assert stopped.returncode == 130 and stopped.stderr.strip().splitlines()[-1].startswith("phaze: interrupted")
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert (best["complete"], best["per_setting"], best["architectures_evaluated"]) == (False, [], 0)


@pytest.mark.parametrize("mode", ["extract_graph", "prepopulate_estimates"])
def test_other_modes_interrupted_exit_130_with_one_line(tmp_path, mode):
    stopped = signal_while_tracing(tmp_path, mode, signal.SIGINT)
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == INTERRUPTED
    assert "graph extraction of megatrongpt3: stopped (KeyboardInterrupt)" in stopped.stderr  # the log says so


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_interrupt_while_phaze_starts_exits_130_with_one_line(tmp_path, number):
    """Whenever the signal lands while phaze loads its modules (torch, ortools and highspy abort,
    fail or swallow a signal that lands while they load) or checks the configuration."""
    # From 0.25 s: on two cores shared with the suite's other worker the interpreter itself may not
    # have reached phaze's first line by 0.1 s (a signal there is Python's default action, not phaze's).
    for delay in (0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.2, 1.4, 1.7):
        process = start([sys.executable, "-m", "phaze", "run_solver", f"cache_dir={tmp_path / 'cache'}",
                         f"hydra.run.dir={tmp_path / str(delay)}"], tmp_path)
        time.sleep(delay)
        assert send(process, number) < STOP_WITHIN, delay
        output, errors = process.communicate()
        assert process.returncode == 130, (delay, errors)
        assert errors.strip().splitlines()[-1].startswith("phaze: interrupted"), (delay, errors)
        assert not any(sign in errors for sign in ("Traceback", "terminate called", "Fatal Python error")), errors


def test_a_signal_a_library_turns_into_another_error_still_exits_130(tmp_path):
    """argparse's clean-up fails half-way when the KeyboardInterrupt lands inside it (AttributeError
    '_StoreAction' object has no attribute 'save_nargs'): still one line and 130, not a traceback."""
    script = ("import os, signal\nimport phaze.__main__ as entry, phaze.cli as cli\n"
              "def parse():\n    try:\n        os.kill(os.getpid(), signal.SIGTERM)\n"
              "    finally:\n        raise AttributeError('save_nargs')\n"
              "cli.main = parse\nentry.main()\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert run.returncode == 130 and run.stderr.strip().splitlines() == [
        "phaze: interrupted; rerun the same command to resume from the caches"]
    failing = script.replace("os.kill(os.getpid(), signal.SIGTERM)", "pass")  # no signal: the error is real
    run = subprocess.run([sys.executable, "-c", failing], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert run.returncode == 1 and "AttributeError: save_nargs" in run.stderr


#: `phaze extract_graph` on a one-block BERT in the working directory, through phaze's entry point,
#: with a slow step added where the run's files are written and the process is ending: an exit
#: function (as torch's finalizers, logging's flush or Ray's shutdown are), or an object torn down
#: with the modules. The step prints a line when it starts.
AFTER_THE_RUN = textwrap.dedent("""
    import atexit, sys, time
    import phaze.__main__ as entry

    def slow_exit_function():
        print("exit functions", flush=True)
        time.sleep(1.0)

    class SlowTeardown:
        def __del__(self):
            print("teardown", flush=True)
            time.sleep(3.0)

    if sys.argv[1] == "exit-function":
        atexit.register(slow_exit_function)
    else:
        keep = SlowTeardown()
    sys.argv = ["phaze", "extract_graph", "model=bertbase", "+model.overrides.num_layers=1", "hydra.run.dir=run",
                "cache_dir=cache"]
    entry.main()
""")


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_while_the_exit_functions_run_exits_130_with_one_line(tmp_path, number):
    """The run's files are written; the signal lands in an exit function: it finishes, then one line
    and 130 (Python would print the KeyboardInterrupt as ignored and exit 0)."""
    process = start([sys.executable, "-c", AFTER_THE_RUN, "exit-function"], tmp_path)
    while (line := process.stdout.readline()) not in ("exit functions\n", ""):
        pass
    assert line == "exit functions\n", process.communicate()
    assert (tmp_path / "run" / "extract_summary.csv").exists()
    assert send(process, number) < STOP_WITHIN
    output, errors = process.communicate()
    assert process.returncode == 130, errors
    assert errors.strip().splitlines()[-1] == INTERRUPTED and "Traceback" not in errors and "Exception" not in errors


def test_a_signal_while_the_interpreter_would_tear_down_never_kills_phaze(tmp_path):
    """After the exit functions Python resets the signal handlers and tears the modules down (torch's
    take a second), where SIGTERM would kill the process (status -15, no line): phaze ends without
    the teardown, so the signal finds it gone or exits it with 130 and the line."""
    process = start([sys.executable, "-c", AFTER_THE_RUN, "teardown"], tmp_path)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "extract_summary.csv").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    time.sleep(0.3)
    send(process, signal.SIGTERM)
    output, errors = process.communicate()
    assert "teardown" not in output
    assert process.returncode in (0, 130), errors
    assert process.returncode == 0 or errors.strip().splitlines()[-1] == INTERRUPTED


@pytest.mark.slow
def test_a_signal_just_after_the_run_is_written_exits_0_or_130_with_one_line(tmp_path):
    """A real run, signalled at once and a moment after its summary file appears: never killed by
    the signal, never a traceback."""
    for delay in (0.0, 0.05, 0.2):
        run = tmp_path / str(delay)
        process = start([sys.executable, "-m", "phaze", "extract_graph", "model=bertbase", "+model.overrides.num_layers=1",
                         f"hydra.run.dir={run}", f"cache_dir={tmp_path / 'cache'}"], tmp_path)
        deadline = time.monotonic() + 120
        while not (run / "extract_summary.csv").exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.001)
        time.sleep(delay)
        send(process, signal.SIGTERM)
        output, errors = process.communicate()
        assert process.returncode in (0, 130), (delay, errors)
        assert "Traceback" not in errors and "Exception ignored" not in errors, (delay, errors)
        if process.returncode == 130:
            assert errors.strip().splitlines()[-1] == INTERRUPTED, (delay, errors)


def test_interrupted_before_any_candidate_says_so(tiny_settings, tmp_path, monkeypatch):
    """Ctrl-C before the search evaluated an accelerator: the setting says the run was interrupted
    before any was evaluated, not that nothing fits on 0 of them."""
    import phaze.search_run
    from phaze.search_run import execute

    def interrupted(*arguments, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(phaze.search_run.Search, "run", interrupted)
    settings = tiny_settings(tmp_path / "cache", "candidate_sample=5", "n_jobs=1")
    best = execute(settings, tmp_path / "run")
    (setting,) = best["per_setting"]
    assert best["complete"] is False and setting["architectures_evaluated"] == 0
    assert setting["reason"] == "interrupted before any of the 5 candidate accelerators was evaluated"
