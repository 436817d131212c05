"""Files written whole and cache files that heal: atomic writes (a temporary file in the same folder,
then a rename), the mode a new file gets, the handling of a damaged cache file (set aside as
`<name>.corrupt`, never deleted, with one warning) shared by every cache of phaze, and the per-user
folder those caches live in unless told otherwise."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from phaze_common.checks import InputError
from phaze_common.log import warn_once

Result = TypeVar("Result")


def new_file_mode() -> int:
    """The mode `open` gives a new file: 0o666 less the process's umask (a shared cache stays shared)."""
    try:  # Linux: read it, since setting it to read it races with other threads
        status = Path("/proc/self/status").read_text()
        umask = next(int(line.split()[1], 8) for line in status.splitlines() if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def temporary_file(directory: Path, name: str) -> Path:
    """A new empty file in `directory` for the content of `name`, with the mode of a new file."""
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    os.close(handle)
    os.chmod(temporary, new_file_mode())
    return Path(temporary)


def atomic_write(path: Path, content: str | bytes) -> None:
    """Write `content` to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_file(path.parent, path.name)
    try:
        if isinstance(content, bytes):
            temporary.write_bytes(content)
        else:
            temporary.write_text(content)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`, None if it does not exist: tells a damaged file from the fresh
    one another process may have put in its place meanwhile."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_dev, status.st_ino


def set_aside(path: Path, problem: str, identity: tuple[int, int] | None = None) -> Path | None:
    """Rename the damaged cache file (or folder) `path` to `<name>.corrupt` (or `.corrupt-<n>`, never
    over an earlier one) so that it is rebuilt, with one warning; returns the new name.

    With `identity` (see `file_identity`), a file that is no longer the damaged one (another process
    set it aside and wrote a fresh one) is left alone and None returned. When the rename fails (a
    read-only cache), the warning says so and None is returned: the caller must not use the file.
    """
    if identity is not None and file_identity(path) != identity:
        return None
    target, number = path.with_name(f"{path.name}.corrupt"), 0
    while target.exists() or target.is_symlink():
        number += 1
        target = path.with_name(f"{path.name}.corrupt-{number}")
    try:
        path.rename(target)
    except FileNotFoundError:
        return None  # another process set it aside first
    except OSError as error:
        warn_once(("damaged", path), "cache: %s is damaged (%s) and cannot be set aside (%s); not using it",
                  path, problem, error.strerror or error)
        return None
    warn_once(("damaged", path), "cache: %s is damaged (%s); set aside as %s and rebuilt", path, problem,
              target.name)
    return target


def read_cache_file(path: Path, read: Callable[[Path], Result], damage: tuple[type[Exception], ...],
                    unreadable: str) -> Result | None:
    """`read(path)` of a cache file, or None (a miss): absent; unreadable (one warning,
    `unreadable % (path, reason)`); or damaged, set aside: not a regular file, or `read` raised
    OSError, ValueError or one of `damage`."""
    identity = file_identity(path)
    if identity is None:
        return None
    try:
        if not path.is_file():
            raise ValueError("not a regular file")
        return read(path)
    except PermissionError as error:
        warn_once(("unreadable", path), unreadable, path, error.strerror)
    except (OSError, ValueError, *damage) as error:
        set_aside(path, f"{type(error).__name__}: {error}", identity)
    return None


def user_cache_dir() -> Path:
    """The per-user cache folder: $XDG_CACHE_HOME/phaze, or ~/.cache/phaze where XDG_CACHE_HOME is not
    set to an absolute path (the XDG Base Directory specification's default)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        try:
            base = Path.home() / ".cache"
        except RuntimeError:
            raise InputError("cache_dir: no per-user cache folder (neither XDG_CACHE_HOME nor HOME is set); "
                             "give cache_dir=PATH") from None
    return Path(base) / "phaze"
