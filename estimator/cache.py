"""On-disk cache of GEMM costs: one Parquet file per GEMM shape, over a fixed list of tensor-core
configurations. Files are written to a temporary name and renamed, so concurrent multirun jobs
never see a half-written file; a file that cannot be read or does not match its key is set aside
and rebuilt, never used; a cache that cannot be written is done without.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from phaze_common.files import read_cache_file, temporary_file, user_cache_dir
from phaze_common.log import warn_once
from estimator.tc_model import GemmCost, MemorySystem
from phaze_hardware import CoreConfig

#: Bump when the tensor-core model changes: old cache files then stop matching.
TC_MODEL_VERSION = 3
#: What a file holds: the costs that do not depend on the HBM's bandwidth (cycles follow at load).
COLUMNS = GemmCost.STORED
METADATA_KEY = b"phaze_estimates"


def default_cache_dir() -> Path:
    """Where estimates persist between runs: `estimates/` under $PHAZE_CACHE_DIR, else under the
    per-user cache folder (the `cache_dir` default of the phaze configuration)."""
    return Path(os.environ.get("PHAZE_CACHE_DIR") or user_cache_dir()) / "estimates"


def cache_key(memory: MemorySystem, cores: Sequence[CoreConfig]) -> str:
    """A digest of everything the stored GEMM costs depend on besides the shape: not the HBM's
    bandwidth, so chips differing only in it share their estimates."""
    record = [TC_MODEL_VERSION, memory.core_buffer_words_per_cycle, memory.glb_words_per_cycle,
              [(c.num, c.width * c.depth, c.glb_bytes) for c in cores]]
    return hashlib.sha1(json.dumps(record).encode()).hexdigest()[:16]


class GemmCache:
    """GEMM costs stored under `directory`/tc_gemm/`key`/NxCxK.parquet."""

    def __init__(self, directory: Path | str, key: str, rows: int) -> None:
        self.directory = Path(directory) / "tc_gemm" / key
        self.key = key
        self.rows = rows

    def path(self, n: int, c: int, k: int) -> Path:
        return self.directory / f"{n}x{c}x{k}.parquet"

    def _metadata(self, n: int, c: int, k: int) -> bytes:
        return json.dumps({"key": self.key, "shape": [n, c, k], "rows": self.rows}).encode()

    def load(self, n: int, c: int, k: int, dram_words_per_cycle: float) -> GemmCost | None:
        """The stored cost at this HBM bandwidth, or None if absent; a damaged or mismatched file is
        set aside (once reported), an unreadable one reported: either is then a miss."""

        def read(path: Path) -> GemmCost:
            table = pq.read_table(path)
            if (table.schema.metadata or {}).get(METADATA_KEY) != self._metadata(n, c, k):
                raise ValueError("its key, shape or row count does not match")
            columns = {name: table.column(name).to_numpy().astype(np.float64) for name in COLUMNS}
            if any(len(column) != self.rows or not np.all(np.isfinite(column)) for column in columns.values()):
                raise ValueError("a column has the wrong length or a non-finite value")
            if not np.all(columns["chip_cycles"] > 0) or not np.all(columns["dram_bound_words"] > 0):
                raise ValueError("a latency is not positive")
            return GemmCost.at(n * c * k, dram_words_per_cycle, **columns)

        return read_cache_file(self.path(n, c, k), read, (KeyError, pa.ArrowException),
                               "estimate cache: cannot read %s (%s); computing it")

    def store(self, n: int, c: int, k: int, cost: GemmCost) -> None:
        """Write atomically: a temporary file in the same folder, then a rename over the target; a
        cache that cannot be written is reported once."""
        table = pa.table({name: getattr(cost, name) for name in COLUMNS})
        table = table.replace_schema_metadata({METADATA_KEY: self._metadata(n, c, k)})
        path = self.path(n, c, k)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            temporary = temporary_file(self.directory, path.name)
        except OSError as error:
            warn_once(("unwritable", self.directory.parent), "estimate cache: cannot write to %s (%s); new estimates "
                      "are not stored", self.directory.parent, error.strerror or error)
            return
        try:
            pq.write_table(table, temporary)
            os.replace(temporary, path)
        except (OSError, pa.ArrowException) as error:
            warn_once(("unwritable", self.directory.parent), "estimate cache: cannot write %s (%s); new estimates are "
                      "not stored", path, error.strerror or error)
        finally:
            temporary.unlink(missing_ok=True)
