"""A small persistent key -> JSON store in SQLite, safe for the concurrent jobs of a multirun."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any


class KeyValueStore:
    """Rows (key TEXT, value JSON) of one table of an SQLite file; each write is one transaction."""

    def __init__(self, path: str | Path, table: str) -> None:
        if not table.isidentifier():
            raise ValueError(f"table: must be an identifier, got {table!r}")
        self.path, self.table = Path(path), table
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60.0)

    def get(self, key: str) -> Any | None:
        with closing(self._connect()) as db:
            row = db.execute(f"SELECT value FROM {self.table} WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        with closing(self._connect()) as db, db:
            db.execute(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", (key, json.dumps(value)))
