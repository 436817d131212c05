"""Checks of the run's environment, apart from the checks of values: they touch the world (the file
system, the installed packages, a Ray cluster's socket). Each raises InputError with one line."""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

from phaze_common.checks import InputError
from phaze_common.files import user_cache_dir

#: Seconds to wait for a Ray cluster's GCS port to take a connection.
RAY_CONNECT_TIMEOUT_S = 5.0
#: The package each MILP solver needs besides PuLP (CBC's binary: cbcbox, PuLP's `cbc` extra).
MILP_PACKAGES = {"cbc": "cbcbox", "highs": "highspy", "gurobi": "gurobipy"}


def cache_dir(value: object) -> Path:
    """`cache_dir` (null: the per-user cache folder, `user_cache_dir`) if it is a directory or can be
    made one (checked, not created: a wrong input writes nothing); else a InputError naming the file in
    the way or the folder that is not writable."""
    path = user_cache_dir() if value is None else Path(str(value))
    existing = next(parent for parent in (path, *path.parents) if os.path.lexists(parent))
    if not os.path.isdir(existing):
        kind = "a file" if os.path.isfile(existing) else "not a folder"
        where = "" if existing == path else f" ({existing} is {kind})"
        raise InputError(f"cache_dir: {path} is not a directory{where}; give a folder for the caches")
    if existing != path and not os.access(existing, os.W_OK | os.X_OK,
                                          effective_ids=os.access in os.supports_effective_ids):
        raise InputError(f"cache_dir: {path} cannot be created ({existing} is not writable); give a writable folder")
    return path


def ray_address(executor: str, value: object) -> str | None:
    """`ray_address` checked: only with executor=ray, which needs ray importable; None (a private
    Ray), or auto / host:port of a cluster that answers (its GCS port takes a connection)."""
    if executor != "ray":
        if value is not None:
            raise InputError(f"ray_address: only with executor=ray, got {value!r} with executor={executor}")
        return None
    try:
        import ray._private.services as services
    except ImportError as error:
        raise InputError(f"executor: ray cannot be imported ({error}); install it with pip install "
                          "'phaze[ray]', or give executor=local") from None
    if value is None:
        return None
    start = "start one with `ray start --head` or give executor=local"
    text = str(value)
    if text == "auto":
        try:
            found = services.canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError) as error:
            raise InputError(f"ray_address: auto finds no running Ray cluster ({error}); {start}") from None
    else:
        found = text
    host, _, port = str(found).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"ray_address: must be auto or host:port (a Ray cluster's GCS address), got {value!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise InputError(f"ray_address: cannot reach {found} ({error.strerror or error}); {start}") from None
    return text


def milp_solver_installed(solver: str) -> None:
    """InputError when the MILP solver's package is not installed, naming those that are."""
    if importlib.util.find_spec(MILP_PACKAGES[solver]) is None:
        available = [name for name, package in MILP_PACKAGES.items() if importlib.util.find_spec(package) is not None]
        raise InputError(f"schedule.milp_solver: {solver} needs the {MILP_PACKAGES[solver]} package "
                         f"(pip install {MILP_PACKAGES[solver]}); available here: {', '.join(available) or 'none'}")
