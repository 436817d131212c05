"""scripts/*.sh run the project's .venv/bin/phaze without an activated environment, else the phaze
on PATH, else say how to install it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY

REPOSITORY = Path(__file__).resolve().parents[1]
SYSTEM_PATH = "/usr/bin:/bin"  # bash, dirname; no phaze
#: what pip writes for the `phaze` console script of pyproject.toml, for this interpreter
CONSOLE_SCRIPT = f"#!{sys.executable}\nimport sys\nfrom phaze.__main__ import main\nif __name__ == '__main__':\n    sys.exit(main())\n"


def project(root: Path, venv: bool) -> Path:
    """A copy of the project's scripts under `root`, with a .venv holding phaze if `venv`."""
    (root / "scripts").mkdir(parents=True)
    for script in (REPOSITORY / "scripts").glob("*.sh"):
        shutil.copy2(script, root / "scripts")
    if venv:
        install_console_script(root / ".venv/bin")
    return root


def install_console_script(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "phaze").write_text(CONSOLE_SCRIPT)
    (directory / "phaze").chmod(0o755)


def run(script: Path, *arguments, cwd: Path, path: str) -> subprocess.CompletedProcess:
    assert shutil.which("phaze", path=SYSTEM_PATH) is None
    environment = {**os.environ, "PATH": path, "PYTHONPATH": str(REPOSITORY)}
    environment.pop("VIRTUAL_ENV", None)
    return subprocess.run([str(script), *arguments], cwd=cwd, env=environment, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["gpt3.sh", "sweep.sh"])
def test_the_project_venv_is_used_from_any_directory(tmp_path, entry):
    scripts = project(tmp_path / "project", venv=True) / "scripts"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = [] if entry == "gpt3.sh" else ["megatrongpt3"]
    tiny = [override for override in TINY if not override.startswith(("model=", "hbm_size="))]
    result = run(scripts / entry, *model, "[1,2]", *tiny, "n_jobs=1", "candidate_sample=4",
                 "schedule.backend=heuristic", f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
                 cwd=elsewhere, path=SYSTEM_PATH)
    assert result.returncode == 0, result.stderr
    best = json.loads((tmp_path / "run/best.json").read_text())
    assert best["model"] == "megatrongpt3" and best["complete"] is True
    settings = [(s["micro_batch_size"], s["hbm_size_gib"]) for s in best["per_setting"]]
    assert settings == [(mbs, hbm) for mbs in (1, 2) for hbm in (32, 64, 80)]
    assert list(elsewhere.iterdir()) == []


def test_without_a_venv_the_phaze_on_path_is_used(tmp_path):
    scripts = project(tmp_path / "project", venv=False) / "scripts"
    install_console_script(tmp_path / "bin")
    result = run(scripts / "opt.sh", "[1]", "system=dgx_a200", cwd=tmp_path,
                 path=f"{tmp_path / 'bin'}:{SYSTEM_PATH}")
    assert result.returncode == 2
    assert result.stderr == ("phaze: error: system: unknown 'dgx_a200'; allowed: deepseek_h800, dgx_a100, dgx_b200, "
                             "dgx_h100, dgx_h200, gb200_nvl72, mi300x_platform, original, tpuv4_pod, tpuv5e_pod, "
                             "tpuv5p_pod, tpuv6e_pod or a system file's path (system=path/to/system.yaml)\n")


def test_without_any_phaze_one_line_says_to_install(tmp_path):
    root = project(tmp_path / "project", venv=False)
    result = run(root / "scripts/bert.sh", cwd=tmp_path, path=SYSTEM_PATH)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert f"not in {root}/.venv nor on PATH; run `make install` in {root} first" in result.stderr


def test_a_model_is_required(tmp_path):
    root = project(tmp_path / "project", venv=True)
    result = run(root / "scripts/sweep.sh", cwd=tmp_path, path=SYSTEM_PATH)
    assert result.returncode == 2 and result.stderr.startswith("usage: ")
    assert result.stderr.count("\n") == 1
