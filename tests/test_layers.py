"""The packages' layering, enforced: import-linter's contracts (pyproject.toml) are the layers
`[tool.phaze] layers` declares and hold on the code, and no code chooses a step model by its name."""

import ast
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from phaze.api import settings
from phaze_common.checks import InputError
from solver.step_models import STEP_MODELS

REPOSITORY = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
LAYERS = PYPROJECT["tool"]["phaze"]["layers"]


def test_the_contracts_are_the_declared_layers():
    linter = PYPROJECT["tool"]["importlinter"]
    assert linter["root_packages"] == LAYERS
    contracts = {contract["type"]: contract for contract in linter["contracts"]}
    assert contracts["layers"]["layers"] == LAYERS[::-1]  # import-linter lists the highest first
    assert contracts["acyclic_siblings"]["ancestors"] == LAYERS


def test_import_linter_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=REPOSITORY, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def _modules():
    for package in LAYERS:
        yield from sorted((REPOSITORY / package).rglob("*.py"))


def test_no_code_compares_a_step_model_by_name():
    """A step model is asked (`solver.step_models.StepModel`), never told apart by a string."""
    names = set(STEP_MODELS)
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            strings = {operand.value for operand in operands if isinstance(operand, ast.Constant)}
            if strings & names and any("step_model" in ast.unparse(operand) for operand in operands):
                found.append(f"{path.relative_to(REPOSITORY)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def _original(**keys):
    return settings("run_solver", "bertbase", system="original", **keys)


@pytest.mark.parametrize("keys, line", [
    ({"context_parallel_width": 2}, "context_parallel_width: system=original has no cost for it; allowed: 1"),
    ({"data_parallel_sharding": ["none", "optimizer"]},
     "data_parallel_sharding: system=original has no cost for it; allowed: none"),
])
def test_the_original_step_model_refuses_what_it_has_no_cost_for(keys, line):
    with pytest.raises(InputError) as refused:
        _original(**keys)
    assert str(refused.value) == line


#: The largest module and the largest class, in lines, any package holds (small modules that say what
#: they hold).
MODULE_LINES, CLASS_LINES = 500, 300


def test_modules_and_classes_are_small():
    found = []
    for path in _modules():
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            found.append(f"{path.relative_to(REPOSITORY)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
                found.append(f"{path.relative_to(REPOSITORY)}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert not found, found


def test_only_the_command_line_imports_a_command_mode():
    """The library (`phaze.api`, `phaze.search_run`, ...) never imports `phaze.modes`: a mode is the
    command line's presentation of what the library computes."""
    found = []
    for path in _modules():
        if path.relative_to(REPOSITORY).parts[:2] in (("phaze", "modes"), ("phaze", "cli.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(REPOSITORY)}:{node.lineno}" for name in names if name.startswith("phaze.modes")]
    assert not found, found


def test_the_command_and_the_workers_start_without_torch():
    """torch is imported only to trace or export a model (a graph not in the cache): the command line,
    the search's worker processes and a run from cached graphs start without it (about 1.5 s)."""
    code = ("import sys, phaze.cli, solver.search.resources, solver.workers\n"
            "from graph_extract import extract\n"
            "extract('bertbase', 1, 64, 2, cache_dir=sys.argv[1])\n"  # traced: torch comes in
            "assert 'torch' in sys.modules\n")
    probe = ("import sys, phaze.cli, solver.search.resources, solver.workers\n"
             "from graph_extract import extract\n"
             "extract('bertbase', 1, 64, 2, cache_dir=sys.argv[1])\n"  # read from the cache folder
             "print(sorted(name for name in sys.modules if name == 'torch' or name.startswith('torch.')))\n")
    with tempfile.TemporaryDirectory() as cache:
        subprocess.run([sys.executable, "-c", code, cache], check=True, cwd=REPOSITORY)
        found = subprocess.run([sys.executable, "-c", probe, cache], check=True, cwd=REPOSITORY,
                               capture_output=True, text=True).stdout.strip()
    assert found == "[]"
