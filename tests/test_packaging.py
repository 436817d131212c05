"""phaze as a user installs it: the wheel carries every package and data file, installs no generic
top-level names, and runs from an empty folder in a fresh virtual environment; the placement DP's
command starts without torch."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages

REPOSITORY = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
#: The top-level names the wheel installs: the layers, nothing generic.
TOP_LEVEL = {"phaze_common", "phaze_hardware", "graph_extract", "estimator", "solver", "phaze"}
#: A prediction both ways: Llama 3 8B on one DGX H100.
#: A layout that fits (t 1, d 8 needs 100 GiB of an H100's 80: a prediction that does not fit exits 2).
PREDICT = {"model": "llama3-8b", "system": "dgx_h100", "num_devices": 8, "tensor_parallel_width": 8,
           "pipeline_parallel_width": 1, "data_parallel_width": 1, "global_batch_size": 64, "recompute": "selective"}


def test_the_listed_packages_are_the_folders():
    """pyproject.toml lists the packages (arch_configs/ is mapped to a package): none left out."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    found = find_packages(str(REPOSITORY), include=[f"{name}*" for name in TOP_LEVEL])
    assert sorted(setuptools["packages"]) == sorted([*found, "phaze_hardware.arch_configs"])
    assert setuptools["package-dir"] == {"phaze_hardware.arch_configs": "arch_configs"}
    assert set(PYPROJECT["tool"]["phaze"]["layers"]) == TOP_LEVEL


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built from a copy of the repository (setuptools writes build/ beside the sources)."""
    source, folder = tmp_path_factory.mktemp("source") / "phaze", tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPOSITORY, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "site", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(folder), str(source)], check=True, capture_output=True)
    (built,) = folder.glob("phaze-*.whl")
    return built


def test_the_wheel_holds_the_packages_and_their_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.startswith("phaze-")} == TOP_LEVEL
    data = {name for name in names if not name.endswith(".py")}
    for path in (*(REPOSITORY / "arch_configs").rglob("*.json"), *(REPOSITORY / "arch_configs").rglob("*.yaml")):
        assert f"phaze_hardware/arch_configs/{path.relative_to(REPOSITORY / 'arch_configs')}" in data
    for path in (REPOSITORY / "phaze_hardware").rglob("*.yaml"):
        assert f"phaze_hardware/{path.relative_to(REPOSITORY / 'phaze_hardware')}" in data
    for path in (REPOSITORY / "phaze" / "conf").rglob("*.yaml"):
        assert f"phaze/{path.relative_to(REPOSITORY / 'phaze')}" in data


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh virtual environment holding the wheel; its dependencies are this environment's (a
    .pth file adds its site-packages after the new one's), so nothing is downloaded."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = [path for path in sys.path if path.endswith("site-packages")]
    (Path(site) / "dependencies.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    return venv


def _environment(tmp_path):
    """No PYTHONPATH (the repository is not on the path), caches under tmp_path."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return {**environment, "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.slow
def test_the_installed_command_predicts_from_an_empty_folder(installed, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    arguments = [f"{key}={value}" for key, value in PREDICT.items()]
    done = subprocess.run([str(installed / "bin" / "phaze"), "predict", *arguments], cwd=empty, capture_output=True,
                          text=True, env=_environment(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = empty.glob("outputs/runs/*/*/prediction.json")
    record = json.loads(written.read_text())
    from phaze import predict  # the same prediction from the repository's code

    expected = predict(**PREDICT)
    assert record["time_per_batch_s"] == pytest.approx(expected.time_per_batch_s, rel=1e-12)


@pytest.mark.slow
def test_the_installed_api_predicts_from_an_empty_folder(installed, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    script = (f"import json, phaze, phaze_hardware, solver\n"
              f"p = phaze.predict(**{PREDICT!r})\n"
              f"print(json.dumps([p.time_per_batch_s, phaze.__file__, phaze_hardware.__file__, solver.__file__]))\n")
    done = subprocess.run([str(installed / "bin" / "python"), "-c", script], cwd=empty, capture_output=True,
                          text=True, env=_environment(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    time, *files = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(file.startswith(str(installed)) for file in files), files  # the wheel's code, not the repository's
    from phaze import predict

    assert time == pytest.approx(predict(**PREDICT).time_per_batch_s, rel=1e-12)
    assert not any(empty.iterdir())  # the API writes nothing in the working directory


def test_the_placement_command_imports_no_torch(tmp_path):
    """`python -m solver.placement IN.json OUT.json` (the original's DP) loads no torch."""
    source = REPOSITORY / "tests" / "data" / "placement" / "ex2_chain12_t124_norecompute.in.json"
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "solver.placement", str(source),
                           str(tmp_path / "out.json")], cwd=REPOSITORY, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "solver.placement.original_dp" in loaded
    assert not {name for name in loaded if name == "torch" or name.startswith("torch.")}
    expected = json.loads(source.with_name(source.name.replace(".in.", ".out.")).read_text())
    assert json.loads((tmp_path / "out.json").read_text())["finalTimePerBatch"] == expected["finalTimePerBatch"]
