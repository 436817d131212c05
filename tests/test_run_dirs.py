"""Run and sweep directories: runs started at the same time never share one."""

import os
import re
import subprocess
import sys
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


def test_sweeps_started_in_the_same_second_get_their_own_directories(tmp_path):
    sweep_dir = at_fixed_time(HYDRA_DIRS["sweep"]["dir"])
    finish(start("-m", "model=bertbase,gpt2", SMALL, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path),
           start("-m", "model=opt,bertlarge", SMALL, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path))
    sweeps = sorted((tmp_path / "outputs/multirun/2030-01-01").iterdir())
    assert len(sweeps) == 2 and all(re.fullmatch(r"00-00-00-[0-9a-f]{8}", sweep.name) for sweep in sweeps)
    models = [[model_of(sweep / job) for job in ("0", "1")] for sweep in sweeps]
    assert sorted(models) == [["bertbase", "gpt2"], ["opt", "bertlarge"]]
    assert all((sweep / "multirun.yaml").exists() for sweep in sweeps)


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
