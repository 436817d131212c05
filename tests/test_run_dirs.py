"""Run and sweep directories: runs started at the same time never share one."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPOSITORY = Path(__file__).resolve().parents[1]
HYDRA_DIRS = yaml.safe_load((REPOSITORY / "phaze/conf/config.yaml").read_text())["hydra"]
TIMESTAMP = r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-[0-9a-f]{8}"
SMALL = "+model.overrides.num_layers=1"


def start(*arguments, cwd: Path) -> subprocess.Popen:
    """`phaze extract_graph ARGUMENTS` started in `cwd` (not waited for), sharing one graph cache."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.Popen(
        [sys.executable, "-m", "phaze", "extract_graph", *arguments, f"cache_dir={cwd / 'cache'}"],
        cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(*processes: subprocess.Popen) -> None:
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr


def model_of(job_directory: Path) -> str:
    return yaml.safe_load((job_directory / ".hydra/config.yaml").read_text())["model"]["name"]


def at_fixed_time(pattern: str) -> str:
    """The configured directory pattern with the clock stopped: what two runs started in the same
    second resolve it to, apart from the run token."""
    return pattern.replace("${now:%Y-%m-%d}", "2030-01-01").replace("${now:%H-%M-%S}", "00-00-00")


def test_concurrent_runs_write_distinct_directories(tmp_path):
    finish(start("model=bertbase", SMALL, cwd=tmp_path), start("model=gpt2", SMALL, cwd=tmp_path))
    runs = sorted(tmp_path.glob("outputs/runs/*/*"))
    assert len(runs) == 2
    assert all(re.fullmatch(TIMESTAMP, str(run.relative_to(tmp_path / "outputs/runs"))) for run in runs)
    assert sorted(model_of(run) for run in runs) == ["bertbase", "gpt2"]
    assert all((run / "extract_summary.csv").exists() and (run / "phaze.log").exists() for run in runs)


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path):
    """The run directory pattern of config.yaml with a frozen clock, given explicitly (so an explicit
    hydra.run.dir is honoured, and the run token alone keeps the runs apart)."""
    run_dir = at_fixed_time(HYDRA_DIRS["run"]["dir"])
    assert run_dir != HYDRA_DIRS["run"]["dir"]
    finish(start("model=bertbase", SMALL, f"hydra.run.dir={run_dir}", cwd=tmp_path),
           start("model=gpt2", SMALL, f"hydra.run.dir={run_dir}", cwd=tmp_path))
    runs = sorted((tmp_path / "outputs/runs/2030-01-01").iterdir())
    assert [re.fullmatch(r"00-00-00-[0-9a-f]{8}", run.name) is not None for run in runs] == [True, True]
    assert sorted(model_of(run) for run in runs) == ["bertbase", "gpt2"]
    assert list(tmp_path.glob("outputs/runs/*")) == [tmp_path / "outputs/runs/2030-01-01"]


def test_an_explicit_run_directory_is_used_as_given(tmp_path):
    finish(start("model=bertbase", SMALL, f"hydra.run.dir={tmp_path / 'mine'}", cwd=tmp_path))
    assert model_of(tmp_path / "mine") == "bertbase"
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_sweeps_started_in_the_same_second_get_their_own_directories(tmp_path):
    sweep_dir = at_fixed_time(HYDRA_DIRS["sweep"]["dir"])
    finish(start("-m", "model=bertbase,gpt2", SMALL, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path),
           start("-m", "model=opt,bertlarge", SMALL, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path))
    sweeps = sorted((tmp_path / "outputs/multirun/2030-01-01").iterdir())
    assert len(sweeps) == 2 and all(re.fullmatch(r"00-00-00-[0-9a-f]{8}", sweep.name) for sweep in sweeps)
    models = [[model_of(sweep / job) for job in ("0", "1")] for sweep in sweeps]
    assert sorted(models) == [["bertbase", "gpt2"], ["opt", "bertlarge"]]
    assert all((sweep / "multirun.yaml").exists() for sweep in sweeps)


@pytest.mark.slow
def test_concurrent_sweeps_with_the_default_directories(tmp_path):
    finish(start("-m", "model=bertbase,gpt2", SMALL, cwd=tmp_path),
           start("-m", "model=opt,bertlarge", SMALL, cwd=tmp_path))
    sweeps = sorted(tmp_path.glob("outputs/multirun/*/*"))
    assert len(sweeps) == 2
    assert all(re.fullmatch(TIMESTAMP, str(sweep.relative_to(tmp_path / "outputs/multirun"))) for sweep in sweeps)
    jobs = {tuple(model_of(sweep / job) for job in ("0", "1")) for sweep in sweeps}
    assert jobs == {("bertbase", "gpt2"), ("opt", "bertlarge")}


# --- a run directory phaze cannot write in: one line before any work --------------------------------

WRITABLE = "allowed: a folder phaze can create or write in"
DEFAULT_RUN = r"outputs/runs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-[0-9a-f]{8}"
DEFAULT_SWEEP = r"outputs/multirun/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-[0-9a-f]{8}"


def phaze(*arguments, cwd: Path) -> subprocess.CompletedProcess:
    """`phaze ARGUMENTS` in `cwd`, waited for."""
    return subprocess.run([sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPOSITORY)})


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` and its bytes (None for a folder)."""
    return {str(path.relative_to(folder)): None if path.is_dir() else path.read_bytes()
            for path in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("arguments, message", [
    (["hydra.run.dir=a_file/run"], f"hydra.run.dir: a_file/run: a_file is a file; {WRITABLE}"),
    (["hydra.run.dir=a_file"], f"hydra.run.dir: a_file is a file; {WRITABLE}"),
    (["-m", "model=bertbase,gpt2", "hydra.sweep.dir=a_file/sweep"],
     f"hydra.sweep.dir: a_file/sweep: a_file is a file; {WRITABLE}"),
    (["hydra.run.dir=/proc/sys/phaze-run"], f"hydra.run.dir: /proc/sys/phaze-run: /proc/sys is not writable; {WRITABLE}"),
], ids=["under-a-file", "a-file", "sweep-under-a-file", "proc"])
def test_a_run_directory_phaze_cannot_create_is_one_line_exit_2(tmp_path, arguments, message):
    (tmp_path / "a_file").write_text("mine\n")
    result = phaze("extract_graph", *arguments, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"phaze: error: {message}\n")
    assert tree(tmp_path) == {"a_file": b"mine\n"}


@pytest.mark.parametrize("multirun", [False, True], ids=["run", "sweep"])
def test_outputs_a_file_is_one_line_naming_the_run_directory(tmp_path, multirun):
    """The default directories are under outputs/ (so is cache_dir: the run directory is named first)."""
    (tmp_path / "outputs").write_text("")
    result = phaze("extract_graph", *(["-m", "model=bertbase,gpt2"] if multirun else []), cwd=tmp_path)
    key, directory = ("hydra.sweep.dir", DEFAULT_SWEEP) if multirun else ("hydra.run.dir", DEFAULT_RUN)
    assert result.returncode == 2 and result.stdout == ""
    assert re.fullmatch(rf"phaze: error: {key}: {directory}: outputs is a file; {WRITABLE}\n", result.stderr), \
        result.stderr
    assert tree(tmp_path) == {"outputs": b""}


def test_a_read_only_outputs_or_run_directory_is_one_line_exit_2(tmp_path, read_only):
    (tmp_path / "outputs").mkdir()
    read_only(tmp_path / "outputs")
    result = phaze("extract_graph", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert re.fullmatch(rf"phaze: error: hydra.run.dir: {DEFAULT_RUN}: outputs is not writable; {WRITABLE}\n",
                        result.stderr), result.stderr
    result = phaze("extract_graph", "-m", "model=bertbase,gpt2", "hydra.sweep.dir=outputs", cwd=tmp_path)
    assert result.stderr == f"phaze: error: hydra.sweep.dir: outputs is not writable; {WRITABLE}\n"
    assert result.returncode == 2 and tree(tmp_path) == {"outputs": None}


# --- one run per directory ---------------------------------------------------------------------------

REFUSED = ("allowed: a new or empty folder, or an unfinished run's folder with the same command (the rerun "
           "resumes there)")


@pytest.mark.slow
def test_a_finished_run_directory_is_not_run_in_again(tmp_path):
    """Given the same hydra.run.dir, a second run (another model, or the same command again) would
    mix its files with the first's: refused, the first run's files untouched."""
    (tmp_path / "mine").mkdir()  # an empty folder is taken
    first = phaze("extract_graph", "model=bertbase", SMALL, "hydra.run.dir=mine", "cache_dir=cache", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    written = tree(tmp_path / "mine")
    assert model_of(tmp_path / "mine") == "bertbase" and "extract_summary.csv" in written
    for model in ("gpt2", "bertbase"):
        again = phaze("extract_graph", f"model={model}", SMALL, "hydra.run.dir=mine", "cache_dir=cache", cwd=tmp_path)
        assert (again.returncode, again.stdout) == (2, "")
        assert again.stderr == f"phaze: error: hydra.run.dir: mine already holds a finished run's files; {REFUSED}\n"
    assert tree(tmp_path / "mine") == written


@pytest.mark.slow
def test_a_folder_holding_a_run_without_phazes_marker_is_refused(tmp_path):
    """A run of an older phaze (or another hydra program): its .hydra and results say so."""
    (tmp_path / "old" / ".hydra").mkdir(parents=True)
    (tmp_path / "old" / "best.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    result = phaze("extract_graph", "model=bertbase", SMALL, "hydra.run.dir=old", "cache_dir=cache", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"phaze: error: hydra.run.dir: old already holds a run's files (.hydra, best.json); {REFUSED}\n"
    assert tree(tmp_path / "old") == {".hydra": None, "best.json": b"{}"}
    result = phaze("extract_graph", "model=bertbase", SMALL, "hydra.run.dir=notes", "cache_dir=cache", cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # other files are not a run's
    assert (tmp_path / "notes" / "notes.txt").read_text() == "mine" and model_of(tmp_path / "notes") == "bertbase"


@pytest.mark.slow
def test_a_directory_in_use_by_a_run_in_progress_is_refused(tmp_path):
    """The first run holds its directory's marker locked while it lives (here stopped with SIGSTOP
    once it has taken the directory)."""
    first = start("model=bertbase", SMALL, "hydra.run.dir=mine", cwd=tmp_path)
    marker = tmp_path / "mine" / ".phaze-run"
    deadline = time.monotonic() + 120
    while not (marker.exists() and marker.read_text()):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    first.send_signal(signal.SIGSTOP)
    try:
        second = phaze("extract_graph", "model=gpt2", SMALL, "hydra.run.dir=mine", f"cache_dir={tmp_path / 'cache'}",
                       cwd=tmp_path)
    finally:
        first.send_signal(signal.SIGCONT)
    assert (second.returncode, second.stdout) == (2, "")
    assert second.stderr == f"phaze: error: hydra.run.dir: mine is in use by a run in progress; {REFUSED}\n"
    finish(first)
    assert model_of(tmp_path / "mine") == "bertbase"


def test_two_runs_started_at_once_in_one_directory(tmp_path):
    """One takes the directory and finishes; the other is refused (the first is running, or done)."""
    processes = {model: start(f"model={model}", SMALL, "hydra.run.dir=mine", cwd=tmp_path) for model in ("bertbase", "gpt2")}
    outcomes = {model: (process.communicate(timeout=300), process.returncode) for model, process in processes.items()}
    winners = [model for model, (_, code) in outcomes.items() if code == 0]
    assert len(winners) == 1, outcomes
    (loser,) = set(outcomes) - set(winners)
    (_, stderr), code = outcomes[loser]
    assert code == 2 and stderr in (
        f"phaze: error: hydra.run.dir: mine is in use by a run in progress; {REFUSED}\n",
        f"phaze: error: hydra.run.dir: mine already holds a finished run's files; {REFUSED}\n")
    assert model_of(tmp_path / "mine") == winners[0]
    log = (tmp_path / "mine" / "phaze.log").read_text()
    assert f"graph extraction of {winners[0]}" in log and loser not in log


def stop_once_tracing(arguments: list[str], cwd: Path, number: int) -> subprocess.CompletedProcess:
    """`phaze ARGUMENTS` (GPT-3: four widths to trace), sent the signal once the first width's graph is cached."""
    process = subprocess.Popen([sys.executable, "-m", "phaze", *arguments], cwd=cwd, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list((cwd / "cache").glob("graphs/*.json")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    process.send_signal(number)
    output, errors = process.communicate(timeout=60)
    return subprocess.CompletedProcess(arguments, process.returncode, output, errors)


@pytest.mark.slow
def test_an_interrupted_run_resumes_in_its_directory_with_the_same_command(tmp_path):
    """`phaze: interrupted ...; rerun the same command`: the rerun takes the directory again; another
    command may not; once finished, no run may."""
    command = ["extract_graph", "model=megatrongpt3", "hydra.run.dir=run", "cache_dir=cache"]
    stopped = stop_once_tracing(command, tmp_path, signal.SIGINT)
    assert stopped.returncode == 130, stopped.stderr
    assert not (tmp_path / "run" / "extract_summary.csv").exists()
    other = phaze("extract_graph", "model=gpt2", "hydra.run.dir=run", "cache_dir=cache", cwd=tmp_path)
    assert other.returncode == 2
    assert other.stderr == (f"phaze: error: hydra.run.dir: run already holds the files of another command's run "
                            f"(.hydra, phaze.log); {REFUSED}\n")
    rerun = phaze(*command, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert len((tmp_path / "run" / "extract_summary.csv").read_text().splitlines()) == 5  # the header, 4 widths
    again = phaze(*command, cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr == f"phaze: error: hydra.run.dir: run already holds a finished run's files; {REFUSED}\n"


@pytest.mark.slow
def test_a_killed_sweep_reruns_its_jobs_in_its_directory_until_it_finishes(tmp_path):
    """A sweep that ended without every result (its process killed in job 0: the lock goes with it)
    is rerun in its directory by the same command, its jobs in theirs; another sweep may not use
    it; a finished sweep's directory is kept."""
    sweep = ["extract_graph", "-m", "model=megatrongpt3,gpt2", "hydra.sweep.dir=sweep", "cache_dir=cache"]
    killed = stop_once_tracing(sweep, tmp_path, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "sweep" / "1").exists()
    other = phaze("extract_graph", "-m", "model=opt,gpt2", SMALL, "hydra.sweep.dir=sweep", "cache_dir=cache",
                  cwd=tmp_path)
    assert other.returncode == 2
    assert other.stderr == (f"phaze: error: hydra.sweep.dir: sweep already holds the files of another command's run "
                            f"(multirun.yaml, 0); {REFUSED}\n")
    rerun = phaze(*sweep, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert [model_of(tmp_path / "sweep" / job) for job in ("0", "1")] == ["megatrongpt3", "gpt2"]
    again = phaze(*sweep, cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr == f"phaze: error: hydra.sweep.dir: sweep already holds a finished run's files; {REFUSED}\n"
