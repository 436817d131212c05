"""JSON (de)serialisation of extracted graphs, atomic file writes, and the handling of damaged cache
files shared by every cache of phaze (graphs, estimates, SQLite stores)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from graph_extract.layergraph import Layer, LayerEdge, LayerGraph
from graph_extract.opgraph import GemmDims, OpGraph, OpNode

#: Bump when the content or meaning of the files changes; old cache files are then ignored.
FORMAT_VERSION = 3


log = logging.getLogger(__name__)
Result = TypeVar("Result")

#: Keys of the warnings this process has given (see `warn_once`).
_warned: set[Hashable] = set()
#: Texts of the warnings this process has given or relayed from its workers (see `new_warning`).
_warning_texts: set[str] = set()


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


def new_warning(text: str) -> bool:
    """True the first time a warning with this text is given in this process, which logs its
    workers' warnings too: a cache file that the driver and its workers cannot write is one warning."""
    if text in _warning_texts:
        return False
    _warning_texts.add(text)
    return True


def warn_once(key: Hashable, message: str, *arguments: object) -> None:
    """Log a warning the first time this process gives one under `key` (one per damaged file,
    not one per lookup) and with its text (see `new_warning`)."""
    if key not in _warned:
        _warned.add(key)
        if new_warning(message % arguments if arguments else message):
            log.warning(message, *arguments)


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


def _shapes(value: list) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(shape) for shape in value)


def op_node_to_dict(node: OpNode) -> dict[str, Any]:
    record = dataclasses.asdict(node)
    record["gemm"] = None if node.gemm is None else [node.gemm.batch, node.gemm.m, node.gemm.k, node.gemm.n]
    record["attrs"] = [list(item) for item in node.attrs]
    return record


def op_node_from_dict(record: dict[str, Any]) -> OpNode:
    return OpNode(
        **{
            **record,
            "input_shapes": _shapes(record["input_shapes"]),
            "output_shapes": _shapes(record["output_shapes"]),
            "weight_shapes": _shapes(record["weight_shapes"]),
            "weight_names": tuple(record["weight_names"]),
            "inputs": tuple(record["inputs"]),
            "gemm": None if record["gemm"] is None else GemmDims(*record["gemm"]),
            "attrs": tuple((name, value) for name, value in record["attrs"]),
        }
    )


def op_graph_to_dict(graph: OpGraph) -> dict[str, Any]:
    return {
        "tensor_parallel_width": graph.tensor_parallel_width,
        "nodes": [op_node_to_dict(node) for node in graph.nodes],
        "edges": [list(edge) for edge in graph.edges],
        "sharded_parameters": sorted(graph.sharded_parameters),
    }


def op_graph_from_dict(record: dict[str, Any]) -> OpGraph:
    return OpGraph(
        nodes=tuple(op_node_from_dict(node) for node in record["nodes"]),
        edges=tuple(tuple(edge) for edge in record["edges"]),
        tensor_parallel_width=record["tensor_parallel_width"],
        sharded_parameters=frozenset(record["sharded_parameters"]),
    )


def layer_graph_to_dict(graph: LayerGraph) -> dict[str, Any]:
    return dataclasses.asdict(graph)


def layer_graph_from_dict(record: dict[str, Any]) -> LayerGraph:
    return LayerGraph(
        layers=tuple(
            Layer(**{**layer, "forward_collective_bytes": tuple(layer["forward_collective_bytes"]),
                     "backward_collective_bytes": tuple(layer["backward_collective_bytes"]),
                     "all_to_all_bytes": tuple(layer.get("all_to_all_bytes", ()))})
            for layer in record["layers"]
        ),
        edges=tuple(LayerEdge(**edge) for edge in record["edges"]),
        tensor_parallel_width=record["tensor_parallel_width"],
    )


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))
