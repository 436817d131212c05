"""A run's directory (`hydra.run.dir`; `hydra.sweep.dir` for a `-m` sweep): one the user can
write in, holding one run's files only.

`directory_problem` checks, before any work and without writing, that the directory exists or can
be created. `claim` then takes it for this process: a marker file `.phaze-run` in it, locked
(`flock`) while the process lives and recording the command and whether it finished (exit status
0, `release`). A directory is refused when a run is in progress there (the lock is held), when it
holds a finished run's files, the files of another command's run, or a run's files without a
marker; an empty directory is taken, and so is an unfinished run's (interrupted, failed, killed)
for a rerun of the same command, which resumes there (a sweep reruns its jobs in their directories).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

#: The marker of a run directory (JSON: the command and whether it finished), locked by its run.
MARKER = ".phaze-run"
#: What a run writes in its directory (hydra's configuration and log, phaze's results); a directory
#: holding one of them without a marker holds a run of another phaze or program.
RUN_FILES = (".hydra", "multirun.yaml", "phaze.log", "best.json", "prediction.json", "extract_summary.csv",
             "results.csv", "results.parquet", "failure.txt", "traceback.txt")
#: The directories a run may be given (the end of a refusal).
ALLOWED = ("allowed: a new or empty folder, or an unfinished run's folder with the same command (the rerun "
           "resumes there)")

#: The markers this process holds (open and locked until the process ends).
_CLAIMED: list[int] = []


def _forget_in_child() -> None:
    """A forked worker does not keep its parent's markers open (the lock would outlive the run)."""
    while _CLAIMED:
        os.close(_CLAIMED.pop())


os.register_at_fork(after_in_child=_forget_in_child)


def folder_problem(path: Path) -> str | None:
    """Why phaze cannot write in the folder `path` (created if need be): a file in the way, a folder
    that is not writable; or None. Nothing is created."""
    existing = next(parent for parent in (path, *path.parents) if os.path.lexists(parent))
    where = "" if existing == path else f": {existing}"
    if not os.path.isdir(existing):
        kind = ("a broken symbolic link" if os.path.islink(existing) else "a file" if os.path.isfile(existing)
                else "not a folder")
        return f"{path}{where} is {kind}"
    if not os.access(existing, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return f"{path}{where} is not writable"
    return None


def directory_problem(path: Path) -> str | None:
    """Why `path` cannot be a run directory, or None; nothing is created."""
    problem = folder_problem(path)
    return f"{problem}; allowed: a folder phaze can create or write in" if problem else None


def run_files(path: Path) -> list[str]:
    """The files of a run in `path`: RUN_FILES, and job folders holding a `.hydra`."""
    try:
        names = sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [name for name in names if name in RUN_FILES]
    return found + [name for name in names if (path / name / ".hydra").is_dir()]


def _read(descriptor: int) -> dict | None:
    """The marker's record, or None if it is empty or not one (a marker being written when its run died)."""
    data = b""
    while chunk := os.pread(descriptor, 65536, len(data)):
        data += chunk
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _write(descriptor: int, record: dict) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(record).encode(), 0)


def claim(path: Path, command: list[str]) -> str | None:
    """Take `path` for this process's run of `command` (created if need be, marker locked until the
    process ends); why not, or None. A refusal writes nothing."""
    if not os.path.lexists(path / MARKER) and (found := run_files(path)):
        return f"{path} already holds a run's files ({', '.join(found[:3])}); {ALLOWED}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path / MARKER, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as error:
        return f"{path}: cannot write there ({error.strerror}); allowed: a folder phaze can create or write in"
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return f"{path} is in use by a run in progress; {ALLOWED}"
    except OSError:  # a file system without locks: the marker's record alone tells
        pass
    record, found = _read(descriptor), run_files(path)
    problem = None
    if found and record is not None and record.get("finished"):
        problem = f"{path} already holds a finished run's files; {ALLOWED}"
    elif found and (record is None or record.get("command") != command):
        problem = f"{path} already holds the files of another command's run ({', '.join(found[:3])}); {ALLOWED}"
    if problem:
        os.close(descriptor)
        return problem
    _write(descriptor, {"command": command, "finished": False})
    _CLAIMED.append(descriptor)
    return None


def release(finished: bool) -> None:
    """The end of this process's runs: their markers say whether they finished, and are unlocked."""
    while _CLAIMED:
        descriptor = _CLAIMED.pop()
        try:
            if finished:
                record = _read(descriptor) or {}
                _write(descriptor, {**record, "finished": True})
        finally:
            os.close(descriptor)
