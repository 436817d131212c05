"""Where the data files phaze ships are: the hardware's own (chips/, templates/, systems/, the area,
power, cost and off-chip models) and `arch_configs/` (the candidate space, the system space, the
calibration set), which a wheel installs as the package `phaze_hardware.arch_configs`. Both are found
through `importlib.resources`, so an installed phaze reads them wherever it is installed.

Simplification: phaze runs from packages unpacked on a file system (what pip installs), not from a
zip archive: the folders are `pathlib.Path`s.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def _folder(package: str) -> Path:
    found = resources.files(package)
    if not isinstance(found, Path):
        raise RuntimeError(f"{package} is not unpacked on a file system ({found!r}); install phaze with pip")
    return found


def hardware_file(*parts: str) -> Path:
    """A file or folder of the hardware package (`hardware_file("chips")`)."""
    return _folder("phaze_hardware").joinpath(*parts)


def arch_config(*parts: str) -> Path:
    """A file or folder of arch_configs/ (`arch_config("calibration", "runs.json")`)."""
    return _folder("phaze_hardware.arch_configs").joinpath(*parts)


def yaml_files(folder: Path) -> list[Path]:
    """The YAML files of a folder, by name."""
    return sorted(path for path in folder.iterdir() if path.suffix == ".yaml")
