"""A run's directory (`hydra.run.dir`; `hydra.sweep.dir` for a `-m` sweep): a folder the user can
write in, checked before any work and without writing (`directory_problem`).
"""

from __future__ import annotations

import os
from pathlib import Path


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
