"""A small persistent key -> JSON store in SQLite, safe for the concurrent jobs of a multirun, that
never fails a run: a damaged file is set aside and started afresh, an unusable one is done without."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

from phaze_common.files import file_identity, new_file_mode, set_aside
from phaze_common.log import warn_once

T = TypeVar("T")

#: Result codes of a file that is not a sound SQLite database. Any other failure ("database is
#: locked", "attempt to write a readonly database") is no damage: the file is kept.
DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
#: Files SQLite keeps next to a database; they follow it when it is set aside.
COMPANIONS = ("-journal", "-wal", "-shm")
#: Keys per SELECT of `get_many` (SQLite allows 32,766 parameters a statement since 3.32, 999 before).
SELECT_BATCH = 500


class _Damaged(Exception):
    """The file is no SQLite database: PRAGMA quick_check found a problem, or it is a folder."""


def _unchanged(value: Any) -> Any:
    return value


class KeyValueStore:
    """Rows (key TEXT, value JSON) of one table of an SQLite file; each write is one transaction.

    Each process and thread keeps one connection to the file while it is the same file (same
    device and inode). Writes are not synced to disk (`PRAGMA synchronous=OFF`): a process that dies
    leaves the file sound (the rollback journal is written), and the file an operating-system crash
    may damage is a cache, set aside and rebuilt as below.

    The file is checked on open (PRAGMA quick_check). A damaged file, found then or by any later
    statement, is set aside (`phaze_common.files.set_aside`) and a fresh one started; a file or
    table deleted meanwhile is created again. When the file cannot be read or written (a read-only
    cache, a lock held for over `lock_timeout` seconds), a lookup is a miss and a store is skipped,
    with one warning.
    """

    def __init__(self, path: str | Path, table: str, lock_timeout: float = 60.0) -> None:
        if not table.isidentifier():
            raise ValueError(f"table: must be an identifier, got {table!r}")
        self.path, self.table, self.lock_timeout = Path(path), table, lock_timeout
        self._create_table = f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        self._usable = True  # False once a damaged file could not be set aside
        self._connections: dict[tuple[int, int], tuple[sqlite3.Connection, tuple[int, int] | None]] = {}
        self._run(self._check, writing=True)

    def _connection(self, identity: tuple[int, int] | None) -> sqlite3.Connection:
        """This process's and thread's connection to the file `identity` names (a new one for another
        file: the path was set aside, deleted or replaced meanwhile)."""
        owner = (os.getpid(), threading.get_ident())
        held = self._connections.get(owner)
        if held is not None and identity is not None and held[1] == identity:
            return held[0]
        self._drop(owner)
        db = self._connect()
        db.execute("PRAGMA synchronous=OFF")
        self._connections[owner] = (db, file_identity(self.path))
        return db

    def _drop(self, owner: tuple[int, int] | None = None) -> None:
        """Close this process's and thread's connection, if any."""
        held = self._connections.pop(owner or (os.getpid(), threading.get_ident()), None)
        if held is not None:
            with suppress(sqlite3.Error):
                held[0].close()

    def _connect(self) -> sqlite3.Connection:
        """A connection to the file; a missing one (new, or deleted meanwhile) is first created empty
        with the mode of a new file (SQLite would make it 0o644 whatever the umask)."""
        if not os.path.lexists(self.path):
            with suppress(OSError):  # connect then names the problem
                self.path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, new_file_mode()))
        elif not self.path.is_file():
            raise _Damaged("not a regular file")
        return sqlite3.connect(self.path, timeout=self.lock_timeout)

    @staticmethod
    def _check(db: sqlite3.Connection) -> None:
        rows = db.execute("PRAGMA quick_check").fetchall()
        if rows != [("ok",)]:
            raise _Damaged("quick_check: " + "; ".join(str(row[0]) for row in rows[:3]))

    def _run(self, operation: Callable[[sqlite3.Connection], T], writing: bool) -> T | None:
        """`operation` in one transaction on a connection where the table exists, or None when the
        file cannot be used; a damaged file is set aside and the operation tried on a fresh one."""
        for _ in range(3):
            if not self._usable:
                return None
            identity = file_identity(self.path)
            try:
                db = self._connection(identity)
                with db:
                    db.execute(self._create_table)
                    return operation(db)
            except _Damaged as error:
                self._drop()
                problem = str(error)
            except sqlite3.DatabaseError as error:
                self._drop()
                if isinstance(error, sqlite3.ProgrammingError):
                    raise  # a misuse of the module, not a problem of the file
                if getattr(error, "sqlite_errorcode", None) not in DAMAGE_CODES:
                    action = "write to" if writing else "read"
                    consequence = "new results are not stored" if writing else "computing instead"
                    warn_once(("unusable", self.path), "cache: cannot %s %s (%s); %s", action, self.path, error,
                              consequence)
                    return None
                problem = str(error)
            self._set_aside(problem, identity)
        return None

    def _set_aside(self, problem: str, identity: tuple[int, int] | None) -> None:
        target = set_aside(self.path, problem, identity)
        if target is not None:
            for suffix in COMPANIONS:
                with suppress(OSError):
                    self.path.with_name(self.path.name + suffix).rename(target.with_name(target.name + suffix))
        elif identity is not None and file_identity(self.path) == identity:
            self._usable = False  # still the damaged file: it could not be renamed

    def get(self, key: str, decode: Callable[[Any], T] = _unchanged) -> T | None:
        """The value stored under `key` through `decode`, or None: absent, unreadable, or not what
        `decode` accepts (it raises ValueError, TypeError, KeyError or AttributeError), which is
        reported once and is a miss: the caller's `put` overwrites it."""
        row = self._run(lambda db: db.execute(f"SELECT value FROM {self.table} WHERE key = ?", (key,)).fetchone(),
                        writing=False)
        return None if row is None else self._decoded(row[0], decode)

    def get_many(self, keys: Sequence[str], decode: Callable[[Any], T] = _unchanged) -> dict[str, T]:
        """`get` of many keys in one transaction: the values found, by key."""
        keys = list(dict.fromkeys(keys))

        def select(db: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = []
            for start in range(0, len(keys), SELECT_BATCH):
                chunk = keys[start:start + SELECT_BATCH]
                marks = ", ".join("?" * len(chunk))
                rows += db.execute(f"SELECT key, value FROM {self.table} WHERE key IN ({marks})", chunk).fetchall()
            return rows

        found = {}
        for key, text in (self._run(select, writing=False) if keys else None) or ():
            value = self._decoded(text, decode)
            if value is not None:
                found[key] = value
        return found

    def _decoded(self, text: str, decode: Callable[[Any], T]) -> T | None:
        try:
            return decode(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            warn_once(("value", self.path), "cache: %s holds an unreadable %s value (%s: %s); recomputing it",
                      self.path, self.table, type(error).__name__, error)
            return None

    def put(self, key: str, value: Any) -> None:
        text = json.dumps(value)
        self._run(lambda db: db.execute(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", (key, text)),
                  writing=True)
