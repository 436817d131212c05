"""A `-m` sweep goes on past a job that fails or is infeasible, records why in that job's
directory, lists them at the end, exits 1, and `phaze report` shows every job."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phaze import cli, report, results, sweep
from phaze.modes import run_solver
from tests.conftest import TINY

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL = [*TINY, "candidate_sample=4", "n_jobs=1", "schedule.backend=heuristic"]


@pytest.mark.slow
def test_infeasible_job_does_not_stop_the_sweep(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "phaze", "run_solver", "-m", *SMALL, "hbm_size=0.001,1",
         f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert done.returncode == sweep.EXIT_CODE
    first, second = (json.loads((sweep_dir / str(job) / "best.json").read_text()) for job in (0, 1))
    assert first["complete"] and not first["feasible"] and "0.001 GiB" in first["per_setting"][0]["reason"]
    assert second["complete"] and second["feasible"]  # the job after the infeasible one ran
    lines = done.stderr.strip().splitlines()
    assert lines[-2].startswith("phaze: error: 1 of 2 sweep jobs ended without a result")
    assert lines[-1] == f"  {sweep_dir / '0'}: infeasible: {first['per_setting'][0]['reason']}"
    rows = report.collect(sweep_dir).summary.set_index("run")
    assert rows.loc["0", "status"] == rows.loc["1", "status"] == "complete"
    assert (rows.loc["0", "feasible"], rows.loc["0", "reason"]) == (False, first["per_setting"][0]["reason"])
    assert rows.loc["1", "feasible"] and rows.loc["1", "throughput"] == second["throughput"]


def test_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = run_solver.execute

    def fail_for_the_first_micro_batch_size(settings, directory):
        if settings.axes.micro_batch_sizes == (1,):
            raise RuntimeError("disk quota exceeded\nsecond line")
        return real(settings, directory)

    monkeypatch.setattr(run_solver, "execute", fail_for_the_first_micro_batch_size)
    monkeypatch.setattr(sweep, "SWEEP", sweep.Sweep())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["phaze", "run_solver", "-m", *SMALL, "micro_batch_size=1,2",
                                      f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == sweep.EXIT_CODE
    failed = results.read_best(tmp_path / "sweep" / "0")
    assert failed["error"] == "RuntimeError: disk quota exceeded" and failed["complete"] is False
    assert "RuntimeError: disk quota exceeded" in (tmp_path / "sweep" / "0" / "traceback.txt").read_text()
    assert results.read_best(tmp_path / "sweep" / "1")["complete"] is True
    assert sweep.SWEEP.jobs == 2 and [f.directory.name for f in sweep.SWEEP.failures] == ["0"]
