"""Sweeps on hydra's other launchers: a 2-job sweep on a real local Ray cluster (started here on
free ports with its own temporary directory, stopped here by killing its process group: never a
bare `ray stop`, which stops every cluster on the machine) and on joblib's processes give each job
the basic launcher's best.json; a failed job is listed by the driver and by `phaze report`; a
launcher whose extra is missing is one line and exit 2."""

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phaze import report, sweep
from tests.conftest import TINY
from tests.ray_cluster import free_port, head_port_flags, stop_process_group

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL = [*TINY, "candidate_sample=4", "n_jobs=1", "schedule.backend=heuristic"]
ENVIRONMENT = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
RAY = Path(sys.executable).parent / "ray"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """The address of a 2-CPU Ray cluster of this test alone (its workers import this repository),
    and the environment to join it: token authentication with a token of its own (not the
    user's ~/.ray/auth_token, which `ray start` would otherwise use)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher._core")
    temporary = tmp_path_factory.mktemp("ray")
    token = temporary / "auth_token"
    token.write_text(secrets.token_hex(32))
    environment = {**ENVIRONMENT, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    port = free_port()
    ports = head_port_flags()
    start = subprocess.Popen(
        [str(RAY), "start", "--head", f"--port={port}", f"--temp-dir={temporary}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", *ports],
        cwd=temporary, env=environment, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    output, _ = start.communicate(timeout=120)
    try:
        assert start.returncode == 0, output
        yield f"127.0.0.1:{port}", environment
    finally:  # the cluster's processes are all in the session `ray start` opened
        stop_process_group(start.pid, pause=2)


def sweep_command(tmp_path, name, *overrides):
    return [sys.executable, "-m", "phaze", "run_solver", "-m", *SMALL, f"hydra.sweep.dir={tmp_path / name}",
            *overrides]


def best(sweep_dir, job):
    """A job's best.json without what differs between two equal runs (where and when)."""
    record = json.loads((sweep_dir / str(job) / "best.json").read_text())
    return {key: value for key, value in record.items() if key not in ("directory", "elapsed_seconds")}


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):
    """The 2-job sweep (an infeasible HBM size, then a feasible one) on hydra's basic launcher."""
    tmp_path = tmp_path_factory.mktemp("basic")
    done = subprocess.run(sweep_command(tmp_path, "sweep", "hbm_size=0.001,1", f"cache_dir={tmp_path / 'cache'}"),
                          cwd=tmp_path, capture_output=True, text=True, env=ENVIRONMENT)
    assert done.returncode == sweep.EXIT_CODE, done.stderr
    return tmp_path / "sweep", done


def check_like_basic(basic_sweep, sweep_dir, done):
    """Each job's best.json and the driver's summary are the basic launcher's."""
    basic_dir, basic_done = basic_sweep
    assert done.returncode == sweep.EXIT_CODE, done.stderr
    for job in (0, 1):
        assert best(sweep_dir, job) == best(basic_dir, job)
    assert best(sweep_dir, 1)["feasible"] and not best(sweep_dir, 0)["feasible"]
    reason = best(sweep_dir, 0)["per_setting"][0]["reason"]
    assert done.stderr.strip().splitlines()[-2:] == [
        basic_done.stderr.strip().splitlines()[-2], f"  {sweep_dir / '0'}: infeasible: {reason}"]
    rows = report.collect(sweep_dir).summary.set_index("run")
    assert list(rows["feasible"]) == [False, True] and rows.loc["1", "throughput"] == best(basic_dir, 1)["throughput"]


@pytest.mark.slow
def test_ray_launcher_joins_a_running_cluster(ray_cluster, basic_sweep, tmp_path):
    """Relative sweep and cache directories resolve against the driver's directory, not the
    workers' (the cluster was started elsewhere); the object store size is left to the cluster."""
    address, environment = ray_cluster
    driver = tmp_path / "driver"
    driver.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "phaze", "run_solver", "-m", *SMALL, "hbm_size=0.001,1", "hydra.sweep.dir=sweep",
         "cache_dir=cache", "hydra/launcher=ray", f"hydra.launcher.ray.init.address={address}"],
        cwd=driver, capture_output=True, text=True, env=environment)
    check_like_basic(basic_sweep, driver / "sweep", done)
    assert (driver / "cache").is_dir()
    assert (driver / "sweep" / "0" / sweep.FAILURE).read_text().startswith("infeasible: no placement")


@pytest.mark.slow
def test_joblib_launcher(basic_sweep, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher._core")
    done = subprocess.run(sweep_command(tmp_path, "sweep", "hbm_size=0.001,1", "cache_dir=cache",
                                        "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"),
                          cwd=tmp_path, capture_output=True, text=True, env=ENVIRONMENT)
    check_like_basic(basic_sweep, tmp_path / "sweep", done)


def test_report_lists_jobs_that_left_no_results(basic_sweep, tmp_path):
    """A job whose process died before writing best.json (as a lost Ray node or a SLURM job past
    its time leaves it: hydra's .hydra and a phaze.log) is a failed row of `phaze report`; the
    others are merged as they are."""
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(basic_sweep[0], sweep_dir)
    for name in ("best.json", "results.parquet", "results.csv"):
        (sweep_dir / "1" / name).unlink()
    rows = report.collect(sweep_dir).summary.set_index("run")
    assert list(rows.index) == ["0", "1"] and list(rows["status"]) == ["complete", "failed"]
    assert rows.loc["1", "reason"] == "no best.json: the job did not finish (see its phaze.log)"
    assert rows.loc["0", "reason"] == best(sweep_dir, 0)["per_setting"][0]["reason"]
    (sweep_dir / "1" / sweep.FAILURE).write_text("MemoryError\n")
    assert report.collect(sweep_dir).summary.set_index("run").loc["1", "reason"] == "MemoryError"
    done = subprocess.run([sys.executable, "-m", "phaze", "report", str(sweep_dir)], capture_output=True, text=True,
                          env=ENVIRONMENT)
    assert done.returncode == 0 and "MemoryError" in done.stdout


def test_launcher_without_its_extra(tmp_path):
    """`ray` made unimportable by a package of that name first on the path that raises ImportError,
    as when phaze[ray] is not installed: one line naming the extra, exit 2, nothing written."""
    shim = tmp_path / "shim" / "ray"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'ray\'")\n')
    done = subprocess.run(sweep_command(tmp_path, "sweep", "hbm_size=1,2", "hydra/launcher=ray"),
                          cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{shim.parent}{os.pathsep}{REPOSITORY}"})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "phaze: error: hydra/launcher: ray needs the phaze[ray] extra (No module named 'ray'); "
        "install it with: pip install 'phaze[ray]'"]
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "outputs").exists()


def test_unknown_launcher(tmp_path):
    done = subprocess.run(sweep_command(tmp_path, "sweep", "hbm_size=1,2", "hydra/launcher=rayy"),
                          cwd=tmp_path, capture_output=True, text=True, env=ENVIRONMENT)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "phaze: error: hydra/launcher: 'rayy' is not a launcher phaze runs on; "
        "one of basic, joblib, ray, submitit_local, submitit_slurm"]
