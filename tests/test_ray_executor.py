"""executor=ray: one run's candidates on Ray actors, checked against the local run.

A private Ray (started by phaze for the run) and a Ray cluster this module starts with `ray start
--head` on a free port with its own temporary folder, in its own process group, which the module
ends itself (never `ray stop`, which stops every cluster on the machine). The cluster's Python
processes run with an audit hook that records any access to the run's cache folder: a Ray worker
must neither need nor write it. One of its actors is killed with SIGKILL mid-run.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from phaze import results
from tests.conftest import TINY
from tests.ray_cluster import free_port, head_port_flags, stop_process_group

REPOSITORY = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")
#: A run long enough to kill an actor in the middle of it: every candidate evaluated.
JOB = [*TINY, "search=exhaustive", "candidate_sample=40", "n_jobs=2", "hbm_size=[1,2]"]
#: The audit hook of the cluster's Python processes: an access to PHAZE_TEST_FORBIDDEN is written
#: to PHAZE_TEST_TOUCHED and refused.
AUDIT = textwrap.dedent("""
    import os, sys
    FORBIDDEN = os.environ.get("PHAZE_TEST_FORBIDDEN")
    def audit(event, args):
        if event in ("open", "sqlite3.connect", "os.mkdir", "os.listdir", "os.scandir") and args:
            path = args[0]
            if isinstance(path, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(path)).startswith(FORBIDDEN):
                with open(os.environ["PHAZE_TEST_TOUCHED"], "a") as touched:
                    touched.write(f"{os.getpid()} {event} {os.fsdecode(path)}\\n")
                raise PermissionError(f"a Ray worker touched the cache folder: {path}")
    if FORBIDDEN:
        sys.addaudithook(audit)
""")
#: Makes `import ray` fail as it does where ray is not installed.
NO_RAY = textwrap.dedent("""
    import sys
    class NoRay:
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoRay())
""")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def phaze(*arguments, cwd: Path, path: list[Path] = (), temporary: Path | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*path, REPOSITORY])),
                   "PHAZE_PROGRESS_INTERVAL": "1"}
    if temporary is not None:
        environment["TMPDIR"] = str(temporary)
    return subprocess.run([sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True,
                          env=environment, timeout=300)


def run_directory(cwd: Path) -> Path:
    (run,) = (cwd / "outputs" / "runs").glob("*/*")
    return run


def answer(run: Path) -> tuple:
    """What a run found: the best (throughput, chip, placement) of every setting, and its result rows."""
    best = json.loads((run / "best.json").read_text())
    settings = [(s["throughput"], s["accelerator"], s["placement"], s["architectures_evaluated"])
                for s in best["per_setting"]]
    _, table = results.read_run(run)
    rows = sorted(map(tuple, table.astype(str).values.tolist()))  # every column, floats by their repr
    return best["throughput"], best["placement"], settings, rows


def cache_content(cache: Path) -> dict:
    """Every row of the run's SQLite caches, schedules without their solve times (wall clock)."""
    content = {}
    for file, tables in (("schedules.sqlite", ["schedules"]),
                         ("evaluations.sqlite", ["layer_costs", "placements", "placement_bounds"])):
        with sqlite3.connect(cache / file) as db:
            for table in tables:
                for key, value in db.execute(f"SELECT key, value FROM {table}"):
                    record = json.loads(value)
                    if table == "schedules":
                        record.pop("solve_time")
                    content[table, key] = record
    return content


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> tuple[Path, Path]:
    """The job run with local worker processes: (run directory, cache)."""
    cwd = tmp_path_factory.mktemp("local")
    result = phaze("run_solver", *JOB, f"cache_dir={cwd / 'cache'}", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return run_directory(cwd), cwd / "cache"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head on a free port, its own temporary folder and process group; yields (address, env)."""
    folder = tmp_path_factory.mktemp("cluster")
    (folder / "audit").mkdir()
    (folder / "audit" / "sitecustomize.py").write_text(AUDIT)
    forbidden, touched = folder / "forbidden", folder / "touched.txt"
    forbidden.mkdir()
    temporary = Path(tempfile.mkdtemp(prefix="rx", dir="/tmp"))  # short: Ray's socket paths are limited
    token = folder / "auth_token"  # a token of its own, not the user's ~/.ray/auth_token
    token.write_text(secrets.token_hex(32))
    port = free_port()
    ports = head_port_flags()
    joining = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    environment = {**os.environ, **joining, "PYTHONPATH": f"{folder / 'audit'}{os.pathsep}{REPOSITORY}",
                   "PHAZE_TEST_FORBIDDEN": str(forbidden), "PHAZE_TEST_TOUCHED": str(touched)}
    probe = subprocess.run([sys.executable, "-c", f"open({str(forbidden / 'probe')!r}, 'w')"], env=environment,
                           capture_output=True, text=True)
    assert "PermissionError: a Ray worker touched" in probe.stderr and touched.exists()  # the hook works
    touched.unlink()
    head = subprocess.Popen([str(RAY), "start", "--head", "--block", f"--port={port}", f"--temp-dir={temporary}",
                             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", *ports],
                            env=environment, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=open(folder / "ray.err", "w"))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert head.poll() is None, (folder / "ray.err").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the Ray head did not start in 60 s"
                time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "forbidden": forbidden, "touched": touched,
               "environment": joining}
    finally:
        stop_process_group(head.pid, pause=3)
        head.wait(timeout=30)
        shutil.rmtree(temporary, ignore_errors=True)


def serving_actors(marker: str) -> list[int]:
    """The pids of the actors serving a chunk now whose environment holds `marker` (this module's cluster's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _read(entry / "cmdline").startswith(b"ray::_Server.serve"):
            if marker.encode() in _read(entry / "environ").split(b"\0"):
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_private_ray_finds_the_local_answer_and_stores_the_same_caches(local_run, tmp_path):
    run, cache = local_run
    temporary = Path(tempfile.mkdtemp(prefix="rx", dir="/tmp"))  # short: Ray's socket paths are limited
    result = phaze("run_solver", *JOB, "executor=ray", f"cache_dir={tmp_path / 'cache'}", cwd=tmp_path,
                   temporary=temporary)
    leftover = sorted(temporary.glob("phaze-ray-*"))  # (torch leaves its own folder there)
    shutil.rmtree(temporary, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    ray_run = run_directory(tmp_path)
    assert answer(ray_run) == answer(run)
    assert cache_content(tmp_path / "cache") == cache_content(cache)  # the driver stored what the actors computed
    log = (ray_run / "phaze.log").read_text()
    assert "Ray: 2 workers on a private local cluster" in log
    assert "evaluate_or_refine on 2 Ray workers" in log and "ETA" in log  # progress over all the actors
    assert not leftover  # the private Ray's folder is gone
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and str(temporary).encode() in
                _read(Path("/proc", pid, "cmdline"))]  # and so are its processes


@pytest.mark.slow
def test_joined_cluster_with_an_actor_killed_finds_the_local_answer(local_run, cluster, tmp_path):
    """The cluster's workers never touch the cache folder (the audit hook refuses it); an actor
    killed with SIGKILL mid-run: its chunk is served again, nothing lost or counted twice."""
    run, cache = local_run
    cwd, cache_dir = tmp_path, cluster["forbidden"] / "cache"
    command = [sys.executable, "-m", "phaze", "run_solver", *JOB, "executor=ray", f"ray_address={cluster['address']}",
               "n_jobs=-1", f"cache_dir={cache_dir}"]
    environment = {**os.environ, **cluster["environment"], "PYTHONPATH": str(REPOSITORY),
                   "PHAZE_PROGRESS_INTERVAL": "1"}
    with subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as driver:
        killed = []
        while driver.poll() is None and not killed:
            for pid in serving_actors(f"PHAZE_TEST_TOUCHED={cluster['touched']}")[:1]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.01)
        stdout, stderr = driver.communicate(timeout=300)
    assert driver.returncode == 0, stderr
    assert killed, "no actor was seen serving a chunk"
    assert not cluster["touched"].exists(), cluster["touched"].read_text()
    ray_run = run_directory(cwd)
    assert answer(ray_run) == answer(run)
    assert cache_content(cache_dir) == cache_content(cache)
    log = (ray_run / "phaze.log").read_text()
    assert f"Ray: 2 workers on {cluster['address']}" in log  # n_jobs=-1: the cluster's 2 CPUs
    assert log.count("died (ActorDiedError); its chunks go to a new worker") == 1  # one actor killed, replaced once
    socket.create_connection(("127.0.0.1", int(cluster["address"].rpartition(":")[2])), timeout=5).close()  # still up


@pytest.mark.parametrize("overrides, path, message", [
    (["executor=foo"], [], "phaze: error: executor: unknown 'foo'; allowed: local, ray"),
    (["executor=ray"], ["no_ray"], "phaze: error: executor: ray cannot be imported (No module named 'ray'); install "
                                   "it with pip install 'phaze[ray]', or give executor=local"),
    (["executor=ray", "ray_address=127.0.0.1:1"], [], "phaze: error: ray_address: cannot reach 127.0.0.1:1 "
                                                      "(Connection refused); start one with `ray start --head` or "
                                                      "give executor=local"),
    (["ray_address=auto"], [], "phaze: error: ray_address: only with executor=ray, got 'auto' with executor=local"),
    (["executor=ray", "ray_address=somewhere"], [], "phaze: error: ray_address: must be auto or host:port (a Ray "
                                                    "cluster's GCS address), got 'somewhere'"),
], ids=["unknown-executor", "ray-not-installed", "unreachable", "address-without-ray", "address-not-host-port"])
def test_bad_executor_input_is_one_line_exit_2_nothing_written(tmp_path, overrides, path, message):
    (tmp_path / "no_ray").mkdir()
    (tmp_path / "no_ray" / "sitecustomize.py").write_text(NO_RAY)
    result = phaze("run_solver", *TINY, *overrides, "cache_dir=cache", cwd=tmp_path,
                   path=[tmp_path / name for name in path])
    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no_ray"]
