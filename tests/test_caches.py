"""Caches that heal: every cache file (the SQLite stores, the Parquet estimates, the graph JSON) is
checked when used; a damaged one is set aside as <name>.corrupt[-n] with one warning and rebuilt, a
read-only cache is done without, and a cache_dir that cannot be a folder is a one-line error.

All damage is real, on disk. As root, file permissions are made to apply by dropping the
capabilities that bypass them (in this thread, or with setpriv for a subprocess)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import graph_extract.extraction as extraction
from phaze_common.checks import InputError
from phaze_common.files import atomic_write, file_identity, set_aside
from estimator import EstimateTable, candidate_space
from graph_extract import get_spec
from phaze_hardware import named_accelerator
from solver.kvstore import KeyValueStore
from solver.schedule import Op, ScheduleCache, ScheduleProblem, solve

REPOSITORY = Path(__file__).resolve().parents[1]
GARBAGE = bytes(range(256)) * 32  # 8 KiB that no reader takes for its format
BYPASS_PERMISSIONS = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


# --- helpers -------------------------------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextmanager
def permissions_enforced():
    """File permissions apply inside the block, even to root (whose effective capabilities that
    bypass them are dropped for the block, then raised again)."""
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header, capabilities = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), capabilities) != 0:
        pytest.skip("cannot read this process's capabilities")
    saved = (_CapData * 2)()
    ctypes.memmove(saved, capabilities, ctypes.sizeof(capabilities))
    for capability in BYPASS_PERMISSIONS:
        capabilities[0].effective &= ~(1 << capability)
    if libc.capset(ctypes.byref(header), capabilities) != 0:
        pytest.skip("cannot drop the capabilities that bypass file permissions")
    try:
        yield
    finally:
        assert libc.capset(ctypes.byref(header), saved) == 0


def unprivileged() -> list[str]:
    """The command prefix under which a subprocess is subject to file permissions."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions cannot be made to apply")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


@contextmanager
def read_only(*folders: Path):
    """The folders and their files not writable (and permissions enforced) inside the block."""
    for folder in folders:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        with permissions_enforced():
            yield
    finally:
        for folder in folders:
            for path in [folder, *folder.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)


def warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def one_warning_about(caplog, path: Path, *words: str) -> str:
    """The only warning given, which names `path` and holds every one of `words`."""
    (message,) = warnings(caplog)
    assert str(path) in message and all(word in message for word in words), message
    return message


def aside(path: Path, number: int = 0) -> Path:
    return path.with_name(f"{path.name}.corrupt" + (f"-{number}" if number else ""))


def cache_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file())


# --- setting a damaged file aside, file modes ----------------------------------------------------


def test_set_aside_numbers_never_overwrite_and_warn_once(tmp_path, caplog):
    path = tmp_path / "a.json"
    for text in ("first", "second", "third"):
        path.write_text(text)
        assert set_aside(path, "test damage") is not None
    assert [aside(path, n).read_text() for n in (0, 1, 2)] == ["first", "second", "third"]
    assert not path.exists()
    one_warning_about(caplog, path, "test damage", "set aside as a.json.corrupt")


def test_set_aside_leaves_a_file_another_process_already_replaced(tmp_path, caplog):
    path = tmp_path / "a.json"
    path.write_text("damaged")
    damaged = file_identity(path)
    atomic_write(path, "fresh")  # another process set it aside and wrote a fresh one
    assert set_aside(path, "test damage", damaged) is None
    assert path.read_text() == "fresh" and not aside(path).exists() and not warnings(caplog)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=oct)
def test_new_cache_files_honour_the_umask(tmp_path, umask):
    expected = 0o666 & ~umask
    previous = os.umask(umask)
    try:
        atomic_write(tmp_path / "graph.json", "{}")
        table = EstimateTable(CHIP, CORES, tmp_path / "estimates")
        table.gemm(SHAPE)
        KeyValueStore(tmp_path / "store.sqlite", "things").put("k", 1)
    finally:
        os.umask(previous)
    for path in (tmp_path / "graph.json", table.cache.path(*SHAPE), tmp_path / "store.sqlite"):
        assert path.stat().st_mode & 0o777 == expected, path


# --- SQLite stores -------------------------------------------------------------------------------


def filled_store(path: Path) -> KeyValueStore:
    store = KeyValueStore(path, "things")
    for i in range(200):  # several pages
        store.put(f"k{i}", {"i": i, "padding": "x" * 100})
    return store


def test_get_many_is_get_of_each_key(tmp_path, caplog):
    store = filled_store(tmp_path / "store.sqlite")
    store.put("bad", {"i": "not a number"})
    keys = [f"k{i}" for i in range(0, 1200, 3)] + ["k3", "bad", "absent"]  # more than one SELECT's worth

    def decode(value):
        return int(value["i"])

    many = store.get_many(keys, decode)
    assert many == {key: store.get(key, decode) for key in keys if store.get(key, decode) is not None}
    assert sorted(many.values()) == list(range(0, 200, 3))
    assert store.get_many([]) == {}


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])  # the header only


def overwrite(path: Path) -> None:
    path.write_bytes(GARBAGE)


def make_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("something")


DAMAGES = {"truncated": truncate, "garbage": overwrite, "a folder": make_folder}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_sqlite_file_is_set_aside_on_open(tmp_path, caplog, damage):
    path = tmp_path / "store.sqlite"
    filled_store(path)
    DAMAGES[damage](path)
    damaged = sorted(p.read_bytes() for p in [path, *path.rglob("*")] if p.is_file())
    store = KeyValueStore(path, "things")
    one_warning_about(caplog, path, "damaged", "store.sqlite.corrupt")
    assert sorted(p.read_bytes() for p in [aside(path), *aside(path).rglob("*")] if p.is_file()) == damaged
    assert store.get("k1") is None
    store.put("k1", [1])
    assert store.get("k1") == [1] and KeyValueStore(path, "things").get("k1") == [1]
    assert len(warnings(caplog)) == 1


def _write_keys(path: str, writer: int) -> int:
    store = KeyValueStore(path, "things")
    for i in range(40):
        store.put(f"{writer}-{i}", [writer, i])
    return sum(store.get(f"{writer}-{i}") == [writer, i] for i in range(40))


def test_processes_sharing_a_damaged_file_all_go_on(tmp_path):
    path = tmp_path / "store.sqlite"
    path.write_bytes(GARBAGE)
    with ProcessPoolExecutor(4) as pool:
        found = list(pool.map(_write_keys, [str(path)] * 4, range(4)))
    assert max(found) == 40  # the last writer's keys at least are all there
    # Set aside by whichever process saw it first; racing processes may set aside a fresh file too
    # (rows are lost, never garbage read): the single-process tests check what is kept.
    assert list(tmp_path.glob("store.sqlite.corrupt*"))
    store = KeyValueStore(path, "things")
    keys = [(writer, i) for writer in range(4) for i in range(40)]
    values = {key: store.get(f"{key[0]}-{key[1]}") for key in keys}
    assert all(value in (None, list(key)) for key, value in values.items())  # a miss at worst, never garbage


def test_zero_length_sqlite_file_is_an_empty_store(tmp_path, caplog):
    # SQLite creates a database as an empty file, so another process may be about to fill it: it is
    # an empty store, not damage
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"")
    store = KeyValueStore(path, "things")
    assert store.get("k1") is None
    store.put("k1", {"a": 1})
    assert KeyValueStore(path, "things").get("k1") == {"a": 1}
    assert not warnings(caplog) and not aside(path).exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_sqlite_file_damaged_mid_run_warns_once_and_starts_afresh(tmp_path, caplog, damage):
    path = tmp_path / "store.sqlite"
    store = filled_store(path)
    DAMAGES[damage](path)
    damaged = path.read_bytes()
    for i in range(5):
        assert store.get(f"k{i}") is None  # a miss, not garbage
    store.put("k1", "again")
    assert store.get("k1") == "again" and store.get("k2") is None
    one_warning_about(caplog, path, "damaged")  # one for all the lookups
    assert aside(path).read_bytes() == damaged


def test_sqlite_file_or_folder_deleted_mid_run_is_created_again(tmp_path, caplog):
    path = tmp_path / "cache" / "store.sqlite"
    store = filled_store(path)
    path.unlink()
    assert store.get("k1") is None
    store.put("k1", 1)
    assert store.get("k1") == 1
    shutil.rmtree(tmp_path / "cache")
    store.put("k2", 2)
    assert store.get("k2") == 2 and KeyValueStore(path, "things").get("k2") == 2
    assert not warnings(caplog)


def test_missing_table_is_created_again(tmp_path, caplog):
    path = tmp_path / "store.sqlite"
    store = filled_store(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE things")
    assert store.get("k1") is None
    store.put("k1", 1)
    assert store.get("k1") == 1
    other = KeyValueStore(path, "others")  # a file without this table
    assert other.get("k1") is None
    other.put("k1", "o")
    assert other.get("k1") == "o" and store.get("k1") == 1
    assert not warnings(caplog)


def set_value(path: Path, table: str, text: str) -> None:
    """Overwrite every stored value of `table` with `text`, as a damaged write would."""
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(f"UPDATE {table} SET value = ?", (text,))


def test_unreadable_value_is_a_miss_reported_once_and_overwritten(tmp_path, caplog):
    path = tmp_path / "store.sqlite"
    store = filled_store(path)
    set_value(path, "things", '{"i": 1, "padd')  # cut short
    assert store.get("k1") is None and store.get("k2") is None
    one_warning_about(caplog, path, "unreadable", "JSONDecodeError")
    store.put("k1", {"i": 1})
    assert store.get("k1", decode=lambda value: value["i"]) == 1
    set_value(path, "things", "[]")  # valid JSON of another shape
    assert store.get("k1", decode=lambda value: value["i"]) is None
    assert len(warnings(caplog)) == 1  # once per file


def three_tc_ops() -> ScheduleProblem:
    return ScheduleProblem([Op("TC", 1.0, 0.6, energy=2.0, parallel_energy=3.0)] * 3, [], num_tc=2, num_vc=1)


def without_time(result):
    return dataclasses.replace(result, solve_time=0.0)


@pytest.mark.parametrize("stored", [
    "[]",
    '{"makespan": 1.6}',
    "null",
    '{"makespan": 1.6, "start": [0.0, 0.0, 1.0], "parallel"',  # cut short
    "wrong length",  # a complete result of a problem with another number of operators
    "wrong type",  # a start time that is not a number
])
def test_schedule_cache_treats_a_bad_stored_result_as_a_miss(tmp_path, caplog, stored):
    path = tmp_path / "schedules.sqlite"
    problem = three_tc_ops()
    expected = without_time(solve(problem))
    ScheduleCache(path).solve(problem)
    if stored in ("wrong length", "wrong type"):
        record = expected.to_dict()
        record["start"] = record["start"][:2] if stored == "wrong length" else ["0", 0.0, 1.0]
        stored = json.dumps(record)
    set_value(path, "schedules", stored)
    cache = ScheduleCache(path)
    assert without_time(cache.solve(problem)) == expected and cache.solved == 1  # solved again
    one_warning_about(caplog, path, "unreadable")
    later = ScheduleCache(path)  # the bad value was overwritten
    assert without_time(later.solve(problem)) == expected and later.solved == 0


def test_locked_sqlite_file_is_not_damage(tmp_path, caplog):
    path = tmp_path / "store.sqlite"
    filled_store(path)
    store = KeyValueStore(path, "things", lock_timeout=0.2)
    with closing(sqlite3.connect(path)) as holder:
        holder.execute("BEGIN EXCLUSIVE")
        assert store.get("k1") is None
        store.put("k1", "not stored")
        store.put("k2", "not stored")
        holder.rollback()
    one_warning_about(caplog, path, "database is locked")
    assert not aside(path).exists()
    assert store.get("k1") == {"i": 1, "padding": "x" * 100}  # the file and its rows kept


def test_read_only_sqlite_store_reads_and_skips_stores(tmp_path, caplog):
    folder = tmp_path / "cache"
    filled_store(folder / "store.sqlite")
    (folder / "damaged.sqlite").write_bytes(GARBAGE)
    with read_only(folder):
        store = KeyValueStore(folder / "store.sqlite", "things")
        assert store.get("k1") == {"i": 1, "padding": "x" * 100}  # hits still served
        store.put("new", 1)
        store.put("newer", 2)
        assert store.get("new") is None
        one_warning_about(caplog, folder / "store.sqlite", "cannot write", "not stored")
        caplog.clear()
        missing = KeyValueStore(folder / "missing.sqlite", "things")
        missing.put("k", 1)
        assert missing.get("k") is None
        one_warning_about(caplog, folder / "missing.sqlite", "cannot write")
        caplog.clear()
        damaged = KeyValueStore(folder / "damaged.sqlite", "things")
        damaged.put("k", 1)
        assert damaged.get("k") is None
        one_warning_about(caplog, folder / "damaged.sqlite", "cannot be set aside")
    assert (folder / "damaged.sqlite").read_bytes() == GARBAGE  # kept, never deleted
    assert sorted(path.name for path in folder.iterdir()) == ["damaged.sqlite", "store.sqlite"]


# --- Parquet estimates ---------------------------------------------------------------------------


CHIP = named_accelerator("tpuv4_like")
CORES = candidate_space(CHIP).tc_cores[::1000]
SHAPE, OTHER_SHAPE = (256, 512, 128), (128, 64, 256)


def fresh_costs(shape) -> np.ndarray:
    return EstimateTable(CHIP, CORES).gemm(shape).cycles  # no cache


def parquet_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    shutil.copy(path.parent / f"{'x'.join(map(str, OTHER_SHAPE))}.parquet", path / "other.parquet")


def test_chips_differing_in_hbm_bandwidth_share_their_estimates(tmp_path):
    # a memory-bound shape: [4 x 8192]·[8192 x 8192] streams 64 M weights for 268 M MACs
    shape = (4, 8192, 8192)
    EstimateTable(CHIP, CORES, tmp_path).fill([shape])
    for bandwidth in (0.3e12, 1.2e12, 4.8e12):
        chip = dataclasses.replace(CHIP, hbm_bandwidth=bandwidth)
        shared = EstimateTable(chip, CORES, tmp_path)
        assert np.array_equal(shared.gemm(shape).cycles, EstimateTable(chip, CORES).gemm(shape).cycles)
        assert shared.computed == 0  # read, not computed
        cost = shared.gemm(shape)
        words_per_cycle = bandwidth / CHIP.clock_hz / CHIP.bytes_per_element
        assert np.array_equal(cost.cycles, np.maximum(cost.chip_cycles, cost.dram_bound_words / words_per_cycle))
    slow = EstimateTable(dataclasses.replace(CHIP, hbm_bandwidth=0.3e12), CORES, tmp_path).gemm(shape).cycles
    fast = EstimateTable(dataclasses.replace(CHIP, hbm_bandwidth=4.8e12), CORES, tmp_path).gemm(shape).cycles
    assert np.all(slow >= fast) and np.any(slow > fast)


PARQUET_DAMAGES = {"truncated": truncate, "a folder": parquet_folder, "empty": lambda path: path.write_bytes(b"")}


@pytest.mark.parametrize("damage", PARQUET_DAMAGES)
def test_damaged_estimate_file_is_set_aside_and_rebuilt(tmp_path, caplog, damage):
    first = EstimateTable(CHIP, CORES, tmp_path)
    first.fill([SHAPE, OTHER_SHAPE])
    path = first.cache.path(*SHAPE)
    PARQUET_DAMAGES[damage](path)
    table = EstimateTable(CHIP, CORES, tmp_path)
    assert np.array_equal(table.gemm(SHAPE).cycles, fresh_costs(SHAPE)) and table.computed == 1
    one_warning_about(caplog, path, "damaged", f"{path.name}.corrupt")
    assert aside(path).exists() and pq.read_table(path).num_rows == len(CORES)
    again = EstimateTable(CHIP, CORES, tmp_path)
    assert np.array_equal(again.gemm(SHAPE).cycles, fresh_costs(SHAPE)) and again.computed == 0
    assert len(warnings(caplog)) == 1


def test_read_only_estimate_cache_computes_and_warns_once(tmp_path, caplog):
    folder = tmp_path / "estimates"
    folder.mkdir()
    with read_only(folder):
        table = EstimateTable(CHIP, CORES, folder)
        table.fill([SHAPE, OTHER_SHAPE])
    assert table.computed == 2 and np.array_equal(table.gemm(OTHER_SHAPE).cycles, fresh_costs(OTHER_SHAPE))
    one_warning_about(caplog, table.cache.directory.parent,  # the store (one table per technology under it)
                       "cannot write", "not stored")
    assert not cache_files(folder)


# --- graph JSON ----------------------------------------------------------------------------------


SPEC = get_spec("bertbase").with_overrides(num_layers=1)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The extraction of SPEC (micro-batch 2) and the text of its cache file."""
    folder = tmp_path_factory.mktemp("graphs")
    extracted = extraction.extract(SPEC, 2, cache_dir=folder)
    (path,) = (folder / "graphs").iterdir()
    return extracted, path.read_text()


@pytest.fixture
def traces(monkeypatch) -> list:
    """The calls of extraction._trace made from now on."""
    calls, real = [], extraction._trace
    monkeypatch.setattr(extraction, "_trace", lambda *arguments: calls.append(arguments) or real(*arguments))
    return calls


@pytest.mark.parametrize("content", ["[]", "null", "{}", "truncated", "a folder", "another model"])
def test_damaged_graph_file_is_set_aside_and_traced_again(tmp_path, caplog, traced, traces, content):
    extracted, text = traced
    path = extraction.cache_path(tmp_path, SPEC, 2, SPEC.default_sequence_length, 1)
    path.parent.mkdir(parents=True)
    if content == "a folder":
        path.mkdir()
    else:
        path.write_text({"truncated": text[: len(text) // 2],
                         "another model": text.replace('"num_heads":12', '"num_heads":6')}.get(content, content))
    assert extraction.extract(SPEC, 2, cache_dir=tmp_path) == extracted and len(traces) == 1
    one_warning_about(caplog, path, "damaged", f"{path.name}.corrupt")
    assert aside(path).is_dir() if content == "a folder" else aside(path).read_text() != text
    assert path.read_text() == text
    assert extraction.extract(SPEC, 2, cache_dir=tmp_path) == extracted and len(traces) == 1  # cached again
    assert len(warnings(caplog)) == 1


def test_read_only_graph_cache_traces_and_warns_once(tmp_path, caplog, traced, traces):
    with read_only(tmp_path):
        for _ in range(2):
            assert extraction.extract(SPEC, 2, cache_dir=tmp_path) == traced[0]
    assert len(traces) == 2
    one_warning_about(caplog, tmp_path / "graphs", "cannot write", "not stored")
    assert not list(tmp_path.iterdir())


# --- cache_dir -----------------------------------------------------------------------------------


def test_cache_dir_that_cannot_be_a_folder_is_a_config_error(tmp_path, tiny_settings):
    file = tmp_path / "file.txt"
    file.write_text("not a folder")
    with pytest.raises(InputError, match=re.escape(f"cache_dir: {file}/cache is not a directory ({file} is a file)")):
        tiny_settings(file / "cache")
    with pytest.raises(InputError, match=re.escape(f"cache_dir: {file} is not a directory")):
        tiny_settings(file)
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked), pytest.raises(InputError, match=re.escape(f"cache_dir: {locked}/cache cannot be created")):
        tiny_settings(locked / "cache")
    assert tiny_settings(tmp_path / "new" / "cache").cache_dir == tmp_path / "new" / "cache"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file.txt", "locked"]  # checked, not created


# --- end to end ----------------------------------------------------------------------------------


#: A run_solver of a few seconds.
QUICK = ["model=bertbase", "num_devices=8", "global_batch_size=16", "candidate_sample=2", "n_jobs=1",
         "schedule.backend=heuristic", "hbm_size=32"]


def run_solver(cache: Path, run: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run([*prefix, sys.executable, "-m", "phaze", "run_solver", *QUICK, f"cache_dir={cache}",
                           f"hydra.run.dir={run}"], cwd=run.parent, capture_output=True, text=True, env=environment)


def log_warnings(run: Path) -> list[str]:
    return [line for line in (run / "phaze.log").read_text().splitlines() if "WARNING" in line]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> tuple[Path, dict]:
    """A filled cache and the best.json of the run that filled it."""
    folder = tmp_path_factory.mktemp("clean")
    result = run_solver(folder / "cache", folder / "run")
    assert result.returncode == 0, result.stderr
    assert not log_warnings(folder / "run")
    return folder / "cache", json.loads((folder / "run" / "best.json").read_text())


def copied_cache(clean_run, tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    shutil.copytree(clean_run[0], cache)
    return cache


def assert_same_result_and_one_warning_each(run: Path, result, clean_run, damaged: list[Path]) -> None:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert json.loads((run / "best.json").read_text()) == clean_run[1]
    found = log_warnings(run)
    assert len(found) == len(damaged), found
    for path in damaged:
        assert sum(str(path) in line for line in found) == 1, (path, found)


@pytest.mark.slow
def test_run_solver_heals_damaged_cache_files(tmp_path, clean_run):
    cache = copied_cache(clean_run, tmp_path)
    graph, *_ = (cache / "graphs").glob("*.json")
    estimate, *_ = (cache / "estimates").rglob("*.parquet")
    bounds, *_ = (cache / "group_bounds").glob("*.npz")  # the candidates' group bounds
    truncate(cache / "schedules.sqlite")
    overwrite(cache / "evaluations.sqlite")
    graph.write_text("[]")
    make_folder(estimate)
    overwrite(bounds)
    result = run_solver(cache, tmp_path / "run")
    damaged = [cache / "schedules.sqlite", cache / "evaluations.sqlite", graph, estimate, bounds]
    assert_same_result_and_one_warning_each(tmp_path / "run", result, clean_run, damaged)
    assert all(aside(path).exists() for path in damaged)
    again = run_solver(cache, tmp_path / "again")  # rebuilt: a clean cache now
    assert again.returncode == 0 and not log_warnings(tmp_path / "again")


@pytest.mark.slow
def test_run_solver_recomputes_bad_stored_values(tmp_path, clean_run):
    cache = copied_cache(clean_run, tmp_path)
    set_value(cache / "evaluations.sqlite", "layer_costs", json.dumps({"1": {"0": {"forward": 1.0}}}))
    set_value(cache / "evaluations.sqlite", "placements", json.dumps([{"recompute": "none"}]))
    set_value(cache / "evaluations.sqlite", "placement_bounds", json.dumps({"value": "fast"}))
    (cache / "schedules.sqlite").write_bytes(b"")  # an empty store: no damage
    result = run_solver(cache, tmp_path / "run")
    assert_same_result_and_one_warning_each(tmp_path / "run", result, clean_run, [cache / "evaluations.sqlite"])
    with closing(sqlite3.connect(cache / "evaluations.sqlite")) as db:
        values = [json.loads(value) for (value,) in db.execute("SELECT value FROM layer_costs")]
    assert values and all("backward" in cost for value in values for layers in value.values()
                          for cost in layers.values())
    assert not list(cache.glob("*.corrupt*"))


@pytest.mark.slow
def test_run_solver_on_a_read_only_cache(tmp_path, clean_run):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        result = run_solver(cache, tmp_path / "run", tuple(unprivileged()))
    finally:
        cache.chmod(0o755)
    warned = [cache / "graphs", cache / "estimates" / "tc_gemm", cache / "schedules.sqlite",
              cache / "evaluations.sqlite", cache / "group_bounds"]
    assert_same_result_and_one_warning_each(tmp_path / "run", result, clean_run, warned)
    assert not list(cache.iterdir())


@pytest.mark.slow
def test_run_solver_with_cache_dir_under_a_file_is_a_one_line_error(tmp_path):
    file = tmp_path / "file.txt"
    file.write_text("not a folder")
    for cache in (file / "cache", file):
        result = run_solver(cache, tmp_path / "run")
        assert result.returncode == 2
        assert result.stderr.startswith(f"phaze: error: cache_dir: {cache} is not a directory")
        assert result.stderr.count("\n") == 1
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = run_solver(locked / "cache", tmp_path / "run", tuple(unprivileged()))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"phaze: error: cache_dir: {locked}/cache cannot be created ({locked} is not "
                                    "writable)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file.txt", "locked"]  # no work, no run folder
