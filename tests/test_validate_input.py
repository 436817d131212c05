"""`phaze validate FILE [cache_dir=PATH]` refuses bad input: one line `phaze: error: ...` naming FILE,
the run and the field, status 2, before any prediction and without writing anything; it caches its
graphs in the per-user cache folder (or cache_dir), never in the working directory."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phaze.validate import main

REPOSITORY = Path(__file__).resolve().parents[1]
CALIBRATION = REPOSITORY / "arch_configs" / "calibration" / "runs.json"
RUNS = {run["run_id"]: run for run in json.loads(CALIBRATION.read_text())}
GPT = "sc21_t1_1.7B"  # 32 A100, t p d = 1 1 32, micro-batch 16, batch 512, 3.53 s per iteration
LLAMA = "nemo2407_LLAMA2-7B_8gpu"  # its time comes from tokens/s per device
V100 = "megatron2020_mp_1B_DGX-2"  # left out: a V100, a chip phaze does not know


DELETE = object()


def run(run_id=GPT, **changes):
    """A calibration run with `section__field=value` changes (value DELETE removes the field)."""
    result = copy.deepcopy(RUNS[run_id])
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if value is DELETE:
            del result[section][field]
        else:
            result[section][field] = value
    return result


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty working directory; the per-user cache folder under tmp_path (XDG_CACHE_HOME)."""
    directory = tmp_path / "cwd"
    directory.mkdir()
    monkeypatch.chdir(directory)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return directory


def validate_file(tmp_path, content, *overrides):
    """`phaze validate` (in this process) of a file holding `content` (JSON data, or text as is):
    (status, stdout, stderr)."""
    path = tmp_path / "runs.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return main([str(path), *overrides])


def assert_refused(status, capsys, cwd, line):
    """Status 2, exactly `phaze: error: <line>` on stderr, nothing on stdout, nothing written: not in
    the working directory, not in the cache folder."""
    captured = capsys.readouterr()
    assert (status, captured.err, captured.out) == (2, f"phaze: error: {line}\n", "")
    assert list(cwd.iterdir()) == []
    assert not (cwd.parent / "xdg" / "phaze").exists()


# A file that is not a list of runs ---------------------------------------------------------------

@pytest.mark.parametrize("content, line", [
    ({"run_id": "x"}, "FILE: {path}: must be a JSON list of runs, got an object"),
    (42, "FILE: {path}: must be a JSON list of runs, got a number"),
    ("\"runs\"", "FILE: {path}: must be a JSON list of runs, got a string"),
    ("null", "FILE: {path}: must be a JSON list of runs, got null"),
    ("these are my runs", "FILE: {path}: not JSON (Expecting value at line 1, column 1)"),
    ("[{\"run_id\": \"x\",]", "FILE: {path}: not JSON (Expecting property name enclosed in double quotes at line 1, "
                              "column 17)"),
    ("[]", "FILE: {path}: the list of runs is empty"),
    ("[" * 100_000 + "]" * 100_000, "FILE: {path}: JSON nested too deep to read (arrays or objects more than about "
                                    f"{sys.getrecursionlimit()} levels deep)"),
])
def test_a_file_that_is_not_a_list_of_runs(content, line, cwd, tmp_path, capsys):
    status = validate_file(tmp_path, content)
    assert_refused(status, capsys, cwd, line.format(path=tmp_path / "runs.json"))


def test_a_file_that_is_not_utf8_text(cwd, tmp_path, capsys):
    (tmp_path / "runs.json").write_bytes(b"[\xff]")
    status = main([str(tmp_path / "runs.json")])
    assert_refused(status, capsys, cwd,
                   f"FILE: {tmp_path / 'runs.json'}: not UTF-8 text (invalid start byte at byte 1)")


def test_a_missing_file_and_a_folder(cwd, tmp_path, capsys):
    assert_refused(main(["nowhere.json"]), capsys, cwd, "FILE: no such file: nowhere.json")
    assert_refused(main([str(tmp_path)]), capsys, cwd, f"FILE: {tmp_path} is a folder, not a file")


# A run without its sections, a run that is not a mapping ---------------------------------------

SECTIONS = "run_id, model, hardware, parallelism, batch, training, measured"


@pytest.mark.parametrize("section", ["model", "hardware", "parallelism", "batch", "training", "measured"])
def test_a_run_missing_a_section(section, cwd, tmp_path, capsys):
    broken = run()
    del broken[section]
    status = validate_file(tmp_path, [run(V100), broken])
    assert_refused(status, capsys, cwd, f"FILE: run '{GPT}': {section}: missing; a run has {SECTIONS}")


@pytest.mark.parametrize("content, line", [
    ([42], f"FILE: runs[0]: must be an object with {SECTIONS}, got 42"),
    ([RUNS[V100], [RUNS[GPT]]], f"FILE: runs[1]: must be an object with {SECTIONS}, got a list"),
    ([{k: v for k, v in RUNS[GPT].items() if k != "run_id"}], f"FILE: runs[0]: run_id: missing; a run has {SECTIONS}"),
    ([{**RUNS[GPT], "run_id": 7}], "FILE: runs[0]: run_id: must be a non-empty string, got 7"),
    ([{**RUNS[GPT], "model": None}], f"FILE: run '{GPT}': model: must be an object, got null"),
    ([{**RUNS[GPT], "measured": [3.53]}], f"FILE: run '{GPT}': measured: must be an object, got a list"),
    ([RUNS[GPT], RUNS[V100], RUNS[GPT]],
     f"FILE: run '{GPT}': run_id: given twice, by runs[0] and runs[2]; run ids must be unique"),
    ([run(hardware__num_devices=DELETE)],
     f"FILE: run '{GPT}': hardware.num_devices: missing; must be a positive integer"),
    ([run(hardware__device_type=None)], f"FILE: run '{GPT}': hardware.device_type: must be a string, got null"),
])
def test_a_run_that_is_not_a_mapping_of_its_sections(content, line, cwd, tmp_path, capsys):
    assert_refused(validate_file(tmp_path, content), capsys, cwd, line)


# Shape fields: positive integers -----------------------------------------------------------------

@pytest.mark.parametrize("field, value, shown", [
    ("model__num_layers", -2, "-2"),  # an IndexError before
    ("model__num_layers", 2.5, "2.5"),
    ("model__num_layers", 24.0, "24.0"),
    ("model__num_layers", "24", '"24"'),
    ("model__hidden_size", 0, "0"),
    ("model__num_attention_heads", -24, "-24"),
    ("model__vocab_size", True, "true"),
    ("model__seq_length_tokens", 0, "0"),
    ("parallelism__tensor_parallel", 0, "0"),
    ("parallelism__pipeline_parallel", -1, "-1"),
    ("parallelism__data_parallel", 1.5, "1.5"),
    ("parallelism__context_parallel", 0, "0"),
    ("batch__micro_batch_size_seqs", 0, "0"),
    ("batch__global_batch_size_seqs", -512, "-512"),
    ("hardware__num_devices", 0, "0"),
])
def test_a_shape_field_that_is_not_a_positive_integer(field, value, shown, cwd, tmp_path, capsys):
    status = validate_file(tmp_path, [run(**{field: value})])
    name = field.replace("__", ".")
    assert_refused(status, capsys, cwd, f"FILE: run '{GPT}': {name}: must be a positive integer, got {shown}")


def test_other_fields_take_their_kind(cwd, tmp_path, capsys):
    status = validate_file(tmp_path, [run(training__activation_recompute="sometimes")])
    assert_refused(status, capsys, cwd, f"FILE: run '{GPT}': training.activation_recompute: must be one of "
                                        '"none", "selective", "full", got "sometimes"')
    status = validate_file(tmp_path, [run(parallelism__sequence_parallel="yes")])
    assert_refused(status, capsys, cwd, f"FILE: run '{GPT}': parallelism.sequence_parallel: must be true or false, "
                                        'got "yes"')


# Measured time and tokens/s: positive finite numbers -------------------------------------------

@pytest.mark.parametrize("value, shown", [(0, "0"), (-3.53, "-3.53"), (float("inf"), "Infinity"),
                                          (float("-inf"), "-Infinity"), (float("nan"), "NaN")])
def test_a_measured_time_that_is_not_a_positive_finite_number(value, shown, cwd, tmp_path, capsys):
    # 0 was a ZeroDivisionError (as a time from tokens/s), -3.53 s -198 %, inf -100 %, NaN nan %
    status = validate_file(tmp_path, [run(measured__seconds_per_iteration_derived=value)])
    assert_refused(status, capsys, cwd, f"FILE: run '{GPT}': measured.seconds_per_iteration_derived: must be a "
                                        f"positive finite number of seconds, got {shown}")


@pytest.mark.parametrize("field", ["tokens_per_sec_per_device", "tokens_per_sec_total"])
@pytest.mark.parametrize("value, shown", [(0, "0"), (-16847, "-16847"), (float("inf"), "Infinity"),
                                          (float("nan"), "NaN")])
def test_measured_tokens_per_second_that_are_not_a_positive_finite_number(field, value, shown, cwd, tmp_path,
                                                                          capsys):
    status = validate_file(tmp_path, [run(LLAMA, **{f"measured__{field}": value})])
    assert_refused(status, capsys, cwd, f"FILE: run '{LLAMA}': measured.{field}: must be a positive finite number "
                                        f"of tokens/s, got {shown}")


# The layout: t·p·d·cp = devices, micro-batch × d divides the batch -------------------------------

@pytest.mark.parametrize("changes, line", [
    ({"parallelism__data_parallel": 16}, "parallelism: t·p·d = 1·1·16 = 16 must equal hardware.num_devices, 32"),
    ({"hardware__num_devices": 64}, "parallelism: t·p·d = 1·1·32 = 32 must equal hardware.num_devices, 64"),
    ({"parallelism__context_parallel": 2},
     "parallelism: t·p·d·cp = 1·1·32·2 = 64 must equal hardware.num_devices, 32"),
    ({"parallelism__data_parallel": None, "parallelism__tensor_parallel": 3},
     "parallelism: t·p = 3·1 = 3 must divide hardware.num_devices, 32 (d = devices / t·p)"),
    ({"batch__micro_batch_size_seqs": 64},
     "batch.global_batch_size_seqs: 512 must be a multiple of micro_batch_size_seqs × d = 64·32 = 2048"),
])
def test_a_layout_that_does_not_make_the_devices_or_the_batch(changes, line, cwd, tmp_path, capsys):
    assert_refused(validate_file(tmp_path, [run(**changes)]), capsys, cwd, f"FILE: run '{GPT}': {line}")


def test_the_model_s_own_refusals_name_the_run(cwd, tmp_path, capsys):
    """What only the model knows (its key/value heads dividing its heads) is one line naming the run."""
    status = validate_file(tmp_path, [run("nemo2407_LLAMA2-70B_64gpu", model__num_kv_heads=7)])
    assert_refused(status, capsys, cwd, "FILE: run 'nemo2407_LLAMA2-70B_64gpu': num_kv_heads: 7 does not divide "
                                        "num_heads=64; allowed: a divisor of 64, or null (one per query head)")


# Not stated is not wrong: an absent or null field leaves the run out as before -------------------

@pytest.mark.parametrize("value", [None, DELETE])
def test_an_absent_or_null_field_leaves_the_run_out(value, cwd, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    status = validate_file(tmp_path, [run(V100), run(model__num_layers=value, measured__tokens_per_sec_total=value)])
    captured = capsys.readouterr()
    assert (status, captured.err) == (0, "")
    assert f"not stated: model.num_layers: 1 ({GPT})" in captured.out
    assert (f"hardware V100 (DGX-2): not an A100 or B200 or GB200 or H100 or H200 or H800 or MI300X or TPU v4 or "
            f"TPU v5e or TPU v5p or TPU v6e or Trillium: 1 ({V100})") in captured.out
    assert list(cwd.iterdir()) == []


# Overrides and the cache folder -------------------------------------------------------------------

@pytest.mark.parametrize("arguments, line", [
    (["foo=1"], "foo: unknown override; allowed keys: cache_dir (the folder extracted graphs are "
                  "cached in)"),
    (["outputs.dir=x"], "outputs.dir: unknown override; allowed keys: cache_dir (the folder "
                          "extracted graphs are cached in)"),
    (["cache_dir="], "cache_dir: must be a folder path, got an empty value"),
    (["cache_dir=a", "cache_dir=b"], "cache_dir: given twice ('a' and 'b')"),
    (["other.json"], "FILE: one file, got 2 ({path}, other.json); phaze validate FILE [cache_dir=PATH]"),
    (["--cache", "x"], "--cache: unknown option; phaze validate FILE [cache_dir=PATH]"),
])
def test_a_wrong_argument(arguments, line, cwd, tmp_path, capsys):
    status = validate_file(tmp_path, [run(V100)], *arguments)
    assert_refused(status, capsys, cwd, line.format(path=tmp_path / "runs.json"))


def test_no_file(cwd, capsys):
    assert_refused(main(["cache_dir=here"]), capsys, cwd, "FILE: missing; phaze validate FILE [cache_dir=PATH]")


def test_a_cache_folder_that_is_not_usable(cwd, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    status = validate_file(tmp_path, [run(V100)], f"cache_dir={tmp_path / 'a_file'}")
    assert_refused(status, capsys, cwd, f"cache_dir: {tmp_path / 'a_file'} is not a folder; give cache_dir=PATH, a "
                                        "folder phaze can write to")
    status = validate_file(tmp_path, [run(V100)], f"cache_dir={tmp_path / 'a_file' / 'cache'}")
    assert_refused(status, capsys, cwd, f"cache_dir: cannot write to {tmp_path / 'a_file' / 'cache'} (Not a "
                                        "directory); give cache_dir=PATH, a folder phaze can write to")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_cache_folder(cwd, tmp_path, capsys):
    (tmp_path / "read_only").mkdir(mode=0o555)
    status = validate_file(tmp_path, [run(V100)], f"cache_dir={tmp_path / 'read_only'}")
    assert_refused(status, capsys, cwd, f"cache_dir: cannot write to {tmp_path / 'read_only'} (Permission denied); "
                                        "give cache_dir=PATH, a folder phaze can write to")


#: A GPT of two small blocks on one DGX A100 node: predicted in a few seconds.
SMALL = run(GPT, model__num_layers=2, model__hidden_size=256, model__num_attention_heads=8, model__num_kv_heads=8,
            model__head_dim=32,
            model__ffn_hidden_size=1024, model__vocab_size=1000, model__seq_length_tokens=128,
            hardware__num_devices=8, parallelism__data_parallel=8, batch__micro_batch_size_seqs=1,
            batch__global_batch_size_seqs=8)
SMALL["run_id"] = "small"


def test_graphs_are_cached_in_the_user_cache_folder_by_default(cwd, tmp_path, capsys):
    status = validate_file(tmp_path, [SMALL])
    captured = capsys.readouterr()
    assert (status, captured.err) == (0, "")
    assert "small" in captured.out and "left out (0)" in captured.out
    assert list(cwd.iterdir()) == []
    assert list((tmp_path / "xdg" / "phaze" / "graphs").glob("gpt_1.7b_megatron_weak-scaling_series_mbs1_seq128_tp1_*.json"))


def test_graphs_are_cached_in_cache_dir(cwd, tmp_path, capsys):
    status = validate_file(tmp_path, [SMALL], f"cache_dir={tmp_path / 'graphs_here'}")
    assert (status, capsys.readouterr().err) == (0, "")
    assert list(cwd.iterdir()) == [] and not (tmp_path / "xdg" / "phaze").exists()
    assert list((tmp_path / "graphs_here" / "graphs").glob("gpt_1.7b_megatron_weak-scaling_series_mbs1_seq128_tp1_*.json"))


def test_without_xdg_cache_home_the_cache_is_under_home(cwd, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert validate_file(tmp_path, [run(V100)]) == 0
    assert (tmp_path / "home" / ".cache" / "phaze").is_dir() and list(cwd.iterdir()) == []


# Through the command --------------------------------------------------------------------------

@pytest.mark.parametrize("content, arguments, line", [
    ("[" * 100_000 + "]" * 100_000, [], "FILE: runs.json: JSON nested too deep to read (arrays or objects more than "
                                        f"about {sys.getrecursionlimit()} levels deep)"),
    (json.dumps([run(model__num_layers=-2)]), [],
     f"FILE: run '{GPT}': model.num_layers: must be a positive integer, got -2"),
    (json.dumps([RUNS[V100]]), ["colour=red"], "colour: unknown override; allowed keys: cache_dir (the folder "
                                              "extracted graphs are cached in)"),
])
def test_the_command_refuses_with_one_line(content, arguments, line, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "runs.json").write_text(content)
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    result = subprocess.run([sys.executable, "-m", "phaze", "validate", "runs.json", *arguments], cwd=cwd,
                            capture_output=True, text=True, env=environment)
    assert (result.returncode, result.stderr, result.stdout) == (2, f"phaze: error: {line}\n", "")
    assert [path.name for path in cwd.iterdir()] == ["runs.json"] and not (tmp_path / "xdg" / "phaze").exists()


def test_usage(cwd, capsys):
    assert main([]) == 2 and capsys.readouterr().err.startswith("usage: phaze validate FILE [cache_dir=PATH]   (")
    assert main(["runs.json", "--help"]) == 0
    captured = capsys.readouterr()
    assert "by default $XDG_CACHE_HOME/phaze or ~/.cache/phaze" in captured.out and captured.err == ""
    assert list(cwd.iterdir()) == []
