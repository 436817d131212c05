"""Validated configuration: every wrong input is one line naming the field, the value and what is
allowed, with exit code 2, before any work and before any output directory exists."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from phaze_common.checks import InputError
from phaze_hardware import SYSTEMS
from phaze.cli import check_command_line, split_command_line

REPOSITORY = Path(__file__).resolve().parents[1]
CONF = REPOSITORY / "phaze" / "conf"
GIB_PER_PIB = 2**20


def phaze(*arguments, cwd):
    """Run `phaze` in `cwd` on this repository's code."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run(
        [sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True, env=environment
    )


def assert_rejected(result, tmp_path, field):
    """Exit code 2, exactly one stderr line `phaze: error: <field>: ...`, nothing written."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"phaze: error: {field}: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "outputs").exists()
    return result.stderr.removeprefix("phaze: error: ").rstrip("\n")


def error(*arguments, mode="run_solver"):
    """The one-line message check_command_line raises for the arguments."""
    with pytest.raises(InputError) as raised:
        check_command_line(mode, list(arguments))
    message = str(raised.value)
    assert "\n" not in message
    return message


def valid_keys(message):
    """The keys listed after `allowed: ` in an unknown-key message."""
    return message.partition(" allowed: ")[2].split(", ")


# 1. Numbers: finite and in range --------------------------------------------------------------

@pytest.mark.parametrize(
    "argument, field, given, allowed",
    [
        ("hbm_size=inf", "hbm_size", "inf", f"(0, {GIB_PER_PIB:,}] GiB"),
        ("hbm_size=nan", "hbm_size", "nan", f"(0, {GIB_PER_PIB:,}] GiB"),
        ("hbm_size=1e300", "hbm_size", "1e+300", f"(0, {GIB_PER_PIB:,}] GiB"),
        ("hbm_size=[32,inf]", "hbm_size", "inf", f"(0, {GIB_PER_PIB:,}] GiB"),
        ("hbm_size=-1", "hbm_size", "-1", "(0, "),
        ("hbm_size=0", "hbm_size", "0", "(0, "),
        ("hbm_size=true", "hbm_size", "True", "(0, "),
        (f"hbm_size={GIB_PER_PIB + 0.5}", "hbm_size", f"{GIB_PER_PIB + 0.5}", f"(0, {GIB_PER_PIB:,}]"),
        ("area_budget=inf", "area_budget", "inf", "finite positive number of µm²"),
        ("area_budget=nan", "area_budget", "nan", "finite positive number of µm²"),
        ("area_budget=-5", "area_budget", "-5", "finite positive number of µm²"),
        ("accelerator.clock_hz=inf", "accelerator.clock_hz", "inf", "(0, 1e+11] Hz"),
        ("accelerator.clock_hz=nan", "accelerator.clock_hz", "nan", "(0, 1e+11] Hz"),
        ("accelerator.clock_hz=-1e9", "accelerator.clock_hz", "-1000000000.0", "(0, 1e+11] Hz"),
        ("accelerator.clock_hz=1e12", "accelerator.clock_hz", "1000000000000.0", "(0, 1e+11] Hz"),
        ("accelerator.hbm_bandwidth=inf", "accelerator.hbm_bandwidth", "inf", "(0, 1e+15] B/s"),
        ("accelerator.hbm_bandwidth=nan", "accelerator.hbm_bandwidth", "nan", "(0, 1e+15] B/s"),
        ("accelerator.hbm_bandwidth=-2", "accelerator.hbm_bandwidth", "-2", "(0, 1e+15] B/s"),
        ("accelerator.num_tc=inf", "accelerator.num_tc", "inf", "positive power of two"),
        ("accelerator.glb_bytes=-1", "accelerator.glb_bytes", "-1", "positive power of two"),
        ("system.tiers.0.bandwidth=inf", "system.tiers[0].bandwidth", "inf", "finite number"),
        ("system.tiers.0.latency=nan", "system.tiers[0].latency", "nan", "finite number"),
        ("system.tiers.0.latency=-1e-6", "system.tiers[0].latency", "-1e-06", ">= 0"),
        ("system.tiers.0.efficiency=1.5", "system.tiers[0].efficiency", "1.5", "in (0, 1]"),
        ("system.tiers.0.efficiency=0", "system.tiers[0].efficiency", "0", "in (0, 1]"),
        ("schedule.time_limit=inf", "schedule.time_limit", "inf", "(0, 86,400] seconds"),
        ("schedule.time_limit=nan", "schedule.time_limit", "nan", "(0, 86,400] seconds"),
        ("schedule.time_limit=0", "schedule.time_limit", "0", "(0, 86,400] seconds"),
        ("schedule.time_limit=1e6", "schedule.time_limit", "1000000.0", "(0, 86,400] seconds"),
        ("schedule.relative_gap=nan", "schedule.relative_gap", "nan", "[0, 1)"),
        ("global_batch_size=0", "global_batch_size", "0", "positive integer at most 16,777,216"),
        ("global_batch_size=1e300", "global_batch_size", "1e+300", "positive integer at most 16,777,216"),
        ("global_batch_size=inf", "global_batch_size", "inf", "positive integer at most 16,777,216"),
        (f"global_batch_size={2**24 * 2}", "global_batch_size", f"{2**25}", "positive integer at most 16,777,216"),
        ("num_devices=-4", "num_devices", "-4", f"positive integer at most {2**20:,}"),
        ("num_devices=nan", "num_devices", "nan", f"positive integer at most {2**20:,}"),
        (f"num_devices={2**21}", "num_devices", f"{2**21}", f"positive integer at most {2**20:,}"),
        ("micro_batch_size=inf", "micro_batch_size", "inf", "positive integer"),
        ("micro_batch_size=[1,nan]", "micro_batch_size", "nan", "positive integer"),
        ("sequence_length=inf", "sequence_length", "inf", "positive integer"),
        ("sequence_length=0", "sequence_length", "0", "positive integer"),
        ("n_jobs=100000", "n_jobs", "100000", "positive integer at most 1,024 or -1"),
        ("n_jobs=true", "n_jobs", "True", "positive integer at most 1,024 or -1"),
        ("max_tensor_parallel_width=inf", "max_tensor_parallel_width", "inf", "positive integer"),
    ],
)
def test_numbers_are_finite_and_in_range(argument, field, given, allowed):
    message = error(argument)
    assert message.startswith(f"{field}: ") and message.endswith(f"got {given}") and allowed in message


@pytest.mark.parametrize("argument", [f"hbm_size={GIB_PER_PIB}", "hbm_size=[0.5,80]", "schedule.time_limit=86400",
                                      f"num_devices={2**20}", "accelerator.clock_hz=2e9", "n_jobs=1024"])
def test_numbers_at_the_limits_are_taken(argument):
    check_command_line("run_solver", [argument])


def test_a_number_out_of_range_on_the_command_line(tmp_path):
    message = assert_rejected(phaze("run_solver", "hbm_size=[32,inf]", cwd=tmp_path), tmp_path, "hbm_size")
    assert message == f"hbm_size: must be a finite number in (0, {GIB_PER_PIB:,}] GiB, got inf"


# 2. Composition errors: unknown keys, bad syntax, flags -------------------------------------------

def test_an_unknown_key_without_plus_names_the_keys_of_its_mapping():
    accelerator = [key for key in OmegaConf.load(CONF / "config.yaml").accelerator]
    message = error("accelerator.link_bandwidth=inf")
    assert message.startswith("accelerator.link_bandwidth: unknown key; did you mean accelerator.hbm_bandwidth? allowed: ")
    assert valid_keys(message) == accelerator


@pytest.mark.parametrize(
    "argument, start",
    [
        ("hbm_size=[1,", "hbm_size: cannot read 'hbm_size=[1,' ("),
        ("a=b=c", "a: cannot read 'a=b=c' ("),
        ("~nosuch", "nosuch: unknown key; allowed: "),
        ("schedule.backnd=milp", "schedule.backnd: unknown key; did you mean schedule.backend? allowed: backend, "),
        ("model.overrides.num_layers=2", "model.overrides.num_layers: "),
        ("hbm_size.x=1", "hbm_size.x: "),
        ("accelerator=3", "accelerator: must be a mapping of num_tc, num_vc"),
        ("model=bertlarge,gpt2", "model: 'model=bertlarge,gpt2' sweeps several values; add -m"),
        ("--frobnicate", "--frobnicate: unknown option"),
        ("--cfg=everything", "--cfg: invalid choice: 'everything'"),
    ],
)
def test_composition_errors_are_one_line_naming_the_key(argument, start):
    assert error(argument).startswith(start)


def test_an_interpolation_to_nothing_names_its_key():
    assert error("max_tensor_parallel_width=${nosuch}") == (
        "max_tensor_parallel_width: Interpolation key 'nosuch' not found")


def test_a_key_only_hydra_could_add_says_how():
    assert "+model.overrides.num_layers=2" in error("model.overrides.num_layers=2")


def test_two_hydra_commands_at_once():
    assert error("-m", "model=bertlarge", "--cfg", "job") == (
        "--cfg: cannot go with --multirun; give one of --run, --multirun (-m), --cfg, --info, --shell-completion")


@pytest.mark.slow
def test_unknown_key_and_bad_syntax_on_the_command_line(tmp_path):
    message = assert_rejected(phaze("run_solver", "accelerator.link_bandwidth=inf", cwd=tmp_path), tmp_path,
                              "accelerator.link_bandwidth")
    assert "did you mean accelerator.hbm_bandwidth?" in message
    assert_rejected(phaze("extract_graph", "hbm_size=[1,", cwd=tmp_path), tmp_path, "hbm_size")
    assert_rejected(phaze("extract_graph", "model=bertbase", "-m", "micro_batch_size=1,2", "--cfg", "job",
                          cwd=tmp_path), tmp_path, "--cfg")


# 3. Additions that nothing reads ---------------------------------------------------------------

def top_level_keys():
    """The keys config.yaml sets, and its two groups."""
    config = OmegaConf.load(CONF / "config.yaml")
    return {key for key in config if key not in ("defaults", "hydra", "mode")} | {"model", "system"}


def test_a_misspelt_addition_suggests_the_key():
    message = error("+micro_batchsize=2")
    assert message.startswith("micro_batchsize: unknown key; did you mean micro_batch_size? allowed: ")
    assert set(valid_keys(message)) == top_level_keys()


def test_a_new_key_lists_the_top_level_keys():
    message = error("+new_key=1")
    assert message.startswith("new_key: unknown key; allowed: ") and set(valid_keys(message)) == top_level_keys()


@pytest.mark.parametrize("system", ["dgx_a100", "original"])
def test_the_schema_is_the_chosen_group_option(system):
    if system == "original":  # phaze's preset: a _global_ package
        keys = list(OmegaConf.load(CONF / "system" / f"{system}.yaml").system)
    else:  # a system of the hardware package
        keys = list(SYSTEMS[system].record())
    message = error(f"system={system}", "+system.links=2")
    assert message.startswith("system.links: unknown key; ") and valid_keys(message) == keys


def test_additions_in_a_sweep_and_nested():
    assert error("-m", "model=bertlarge,gpt2", "+foo=1").startswith("foo: unknown key; allowed: ")
    assert error("+accelerator.clock=1e9").startswith("accelerator.clock: unknown key; did you mean "
                                                      "accelerator.clock_hz? allowed: num_tc, ")
    assert error("+model.overrides.num_layer=2").startswith(
        "model.overrides.num_layer: unknown key; did you mean model.overrides.num_layers? allowed: name, num_layers, ")


@pytest.mark.parametrize("arguments", [
    ["+model.overrides.num_layers=2"],
    ["hydra.job.name=other", "+hydra.job.env_set.X=1"],
    ["~model.fixed_megatron"],
    ["model.fixed_megatron=null"],
])
def test_legitimate_additions_are_taken(arguments):
    check_command_line("run_solver", arguments)


def test_removing_a_key_phaze_reads():
    assert error("~model.max_tensor_parallel_width").startswith("model.max_tensor_parallel_width: missing; ")


def test_an_unknown_addition_on_the_command_line(tmp_path):
    message = assert_rejected(phaze("run_solver", "+micro_batchsize=2", cwd=tmp_path), tmp_path, "micro_batchsize")
    assert "did you mean micro_batch_size?" in message


# 4. Model overrides ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "argument, message",
    [
        ("num_layers=0", "num_layers: must be a positive integer at most 16,777,216, got 0"),
        ("num_layers=-3", "num_layers: must be a positive integer at most 16,777,216, got -3"),
        ("num_layers=1.5", "num_layers: must be a positive integer at most 16,777,216, got 1.5"),
        ("num_layers=abc", "num_layers: must be a positive integer at most 16,777,216, got 'abc'"),
        ("hidden_size=0", "hidden_size: must be a positive integer at most 16,777,216, got 0"),
        ("num_heads=-1", "num_heads: must be a positive integer at most 16,777,216, got -1"),
        ("ffn_hidden_size=0", "ffn_hidden_size: must be a positive integer at most 16,777,216, got 0"),
        ("vocab_size=-2", "vocab_size: must be a positive integer at most 16,777,216, got -2"),
        ("max_position_embeddings=0", "max_position_embeddings: must be a positive integer at most 16,777,216, got 0"),
        ("embedding_projection=0", "embedding_projection: must be a positive integer at most 16,777,216, got 0"),
        ("token_types=-1", "token_types: must be an integer from 0 to 16,777,216, got -1"),
        ("dropout=1.5", "dropout: must be a number in [0, 1), got 1.5"),
        ("dropout=nan", "dropout: must be a number in [0, 1), got nan"),
        ("bias=maybe", "bias: must be true or false, got 'maybe'"),
        ("norm=batchnorm", "norm: unknown 'batchnorm'; allowed: layernorm, rmsnorm"),
        ("num_heads=7", "num_heads: 7 heads do not divide hidden_size=1024; allowed: a divisor of 1024"),
    ],
)
def test_model_overrides_are_checked(argument, message):
    assert error(f"+model.overrides.{argument}") == f"model.overrides.{message}"


def test_a_model_override_within_range_is_taken():
    check_command_line("run_solver", ["+model.overrides.num_layers=2", "+model.overrides.embedding_projection=null"])


@pytest.mark.parametrize("layers", ["0", "-3"])
def test_a_model_without_blocks_on_the_command_line(layers, tmp_path):
    message = assert_rejected(phaze("run_solver", f"+model.overrides.num_layers={layers}", cwd=tmp_path), tmp_path,
                              "model.overrides.num_layers")
    assert message.endswith(f"got {layers}")


# 5. MILP solvers that are not installed ----------------------------------------------------------

@pytest.fixture
def installed(monkeypatch):
    """installed(*packages): find_spec finds exactly these of the solver packages."""
    real = importlib.util.find_spec
    solvers = {"cbcbox", "highspy", "gurobipy"}

    def install(*packages):
        def find_spec(name, *rest):
            if name in solvers:
                return real("json") if name in packages else None  # any spec stands for "installed"
            return real(name, *rest)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return install


def test_gurobi_without_gurobipy(installed):
    installed("cbcbox", "highspy")
    assert error("schedule.backend=milp", "schedule.milp_solver=gurobi") == (
        "schedule.milp_solver: gurobi needs the gurobipy package (pip install gurobipy); available here: cbc, highs")


def test_highs_without_highspy(installed):
    installed("cbcbox", "gurobipy")
    assert error("schedule.backend=milp", "schedule.milp_solver=highs") == (
        "schedule.milp_solver: highs needs the highspy package (pip install highspy); available here: cbc, gurobi")


def test_cbc_without_cbcbox(installed):
    installed("highspy", "gurobipy")
    assert error("schedule.backend=milp") == (
        "schedule.milp_solver: cbc needs the cbcbox package (pip install cbcbox); available here: highs, gurobi")


def test_an_installed_solver_or_another_backend_is_taken(installed):
    installed("cbcbox", "gurobipy")
    check_command_line("run_solver", ["schedule.backend=milp", "schedule.milp_solver=gurobi"])
    installed("cbcbox")
    check_command_line("run_solver", ["schedule.backend=cpsat", "schedule.milp_solver=gurobi"])


#: `python -m phaze` where gurobipy cannot be imported or found, installed or not (a None entry in
#: sys.modules makes importlib.util.find_spec return None and an import raise ImportError).
WITHOUT_GUROBIPY = "import runpy, sys; sys.modules['gurobipy'] = None; runpy.run_module('phaze', run_name='__main__')"


def test_gurobi_without_gurobipy_on_the_command_line(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    result = subprocess.run([sys.executable, "-c", WITHOUT_GUROBIPY, "run_solver", "schedule.backend=milp",
                             "schedule.milp_solver=gurobi"], cwd=tmp_path, capture_output=True, text=True,
                            env=environment)
    assert "(pip install gurobipy)" in assert_rejected(result, tmp_path, "schedule.milp_solver")


# 6. Flags and the mode -------------------------------------------------------------------------

def test_overrides_and_flags_are_told_apart():
    parsed, flags = split_command_line(["model=bertbase", "--cfg", "job", "micro_batch_size=2", "-m"])
    assert parsed.overrides == ["model=bertbase", "micro_batch_size=2"] and flags == ["--cfg", "job", "-m"]


@pytest.mark.parametrize("arguments", [
    ["model=bertbase", "--help"],
    ["--help", "model=bertbase"],
    ["model=bertbase", "--cfg", "job"],
    ["--cfg", "job", "model=bertbase"],
])
def test_help_and_cfg_after_or_before_the_overrides(arguments, tmp_path):
    result = phaze("run_solver", *arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "mode: run_solver\n" in result.stdout and "  name: bertbase\n" in result.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("before", [True, False])
def test_multirun_flag_before_or_after_the_overrides(before, tmp_path):
    overrides = ["model=bertbase", "+model.overrides.num_layers=1", "micro_batch_size=1,2"]
    result = phaze("extract_graph", *(["-m", *overrides] if before else [*overrides, "-m"]), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_path.glob("outputs/multirun/*/*/*/extract_summary.csv"))) == 2


def test_the_mode_is_the_subcommand(tmp_path):
    message = assert_rejected(phaze("run_solver", "model=bertbase", "mode=predict", cwd=tmp_path), tmp_path, "mode")
    assert "'mode=predict'" in message and "extract_graph,prepopulate_estimates,run_solver,predict" in message
    assert error("+mode=predict").startswith("mode: set by the subcommand")
