"""A user's model from a Python nn.Module factory (`model=custom model.config=MODULE:FUNCTION`): an
independently written Hugging Face-style Llama (tests/data/hf_llama.py) gives the zoo's llama3-8b
layer graph and parameter count, its source file keys the graph cache, and bad factories get one line."""

import csv
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from phaze_common.checks import InputError
from graph_extract.serialize import FORMAT_VERSION
from graph_extract import ModelSpec, extract, get_spec, valid_tensor_parallel_widths
from graph_extract.extraction import cache_path
from phaze.cli import check_command_line
from phaze.settings import settings_from_config

REPOSITORY = Path(__file__).resolve().parents[1]
DATA = REPOSITORY / "tests" / "data"
LLAMA = DATA / "hf_llama.py"
BAD = DATA / "bad_factories.py"


def factory_spec(reference: str, *overrides: str) -> ModelSpec:
    """The spec phaze's settings make of `model=custom model.config=reference`."""
    with initialize_config_module("phaze.conf", version_base="1.3"):
        cfg = compose("config", overrides=["mode=extract_graph", "model=custom", f"model.config={reference}",
                                           *overrides])
    return settings_from_config(cfg).spec


def llama_parameters(layers: int, h: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    """Embedding V·h; per block q and o h·h each, k and v h·kv·d each, SwiGLU 3·h·f, two RMSNorms 2h;
    final RMSNorm h; untied LM head V·h."""
    d = h // heads
    return vocab * h + layers * (2 * h * h + 2 * h * kv_heads * d + 3 * h * ffn + 2 * h) + h + vocab * h


def block_flops(b: int, s: int, h: int, heads: int, kv_heads: int, ffn: int) -> int:
    """Forward FLOPs of a Llama block: the q, k, v, o and SwiGLU products, and QKᵀ and ·V."""
    d = h // heads
    weights = 2 * h * h + 2 * h * kv_heads * d + 3 * h * ffn
    return 2 * b * s * weights + 2 * 2 * b * heads * s * s * d


# 1. The same layer graph as the zoo's llama3-8b ------------------------------------------------

def test_the_factory_facts_are_llama3_8b():
    spec = factory_spec(f"{LLAMA}:llama3_8b")
    zoo = get_spec("llama3-8b")
    assert spec.name == "Meta-Llama-3-8B"  # the last part of config.name_or_path
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                  "max_position_embeddings", "default_sequence_length"):
        assert getattr(spec, field) == getattr(zoo, field), field
    assert spec.factory == f"{LLAMA}:llama3_8b"


def assert_same_layers(mine, theirs, replicated: bool) -> None:
    """Every layer and edge of `mine` equals `theirs`; the replicated parts too if `replicated`."""
    assert len(mine.layer_graph.layers) == len(theirs.layer_graph.layers)
    replicated_parts = {"replicated_activation_bytes", "replicated_matrix_input_activation_bytes"}

    def compared(layer):  # its recompute modules (found by structure: the same), their replicated parts if asked
        return layer if replicated else dataclasses.replace(layer, recompute_modules=tuple(
            dataclasses.replace(module, **dict.fromkeys(replicated_parts, 0)) for module in layer.recompute_modules))

    for own, zoo in zip(map(compared, mine.layer_graph.layers), map(compared, theirs.layer_graph.layers)):
        differing = {field.name for field in dataclasses.fields(own) if getattr(own, field.name) != getattr(zoo, field.name)}
        assert differing <= (replicated_parts if not replicated else set()), (own.id, differing)
    assert mine.layer_graph.edges == theirs.layer_graph.edges
    assert mine.repeat_groups == theirs.repeat_groups
    assert mine.parameter_count == theirs.parameter_count


def test_a_plain_pytorch_llama3_8b_has_the_zoo_layer_graph():
    """32 blocks, two traced and copied: equal FLOPs, parameter, activation and input bytes, edges and
    the published 8,030,261,248 parameters. The module is plain PyTorch, exported once; the plan
    derived by structure marks the split parameters as the zoo's Megatron layers do, so the
    replicated parts (what sequence parallelism splits) are the zoo's too."""
    spec = factory_spec(f"{LLAMA}:llama3_8b")
    mine = extract(spec, 2, sequence_length=32)
    theirs = extract(get_spec("llama3-8b"), 2, sequence_length=32)
    assert_same_layers(mine, theirs, replicated=True)
    assert mine.parameter_count == llama_parameters(32, 4096, 32, 8, 14336, 128256) == 8_030_261_248
    blocks = [layer for layer in mine.layer_graph.layers if layer.kind == "block"]
    assert [layer.name for layer in blocks] == [f"layers.{k}" for k in range(32)]
    assert {layer.forward_flops for layer in blocks} == {block_flops(2, 32, 4096, 32, 8, 14336)}
    assert valid_tensor_parallel_widths(spec, 8) == (1, 2, 4, 8)


def test_a_three_block_cut_and_a_num_layers_override_are_the_zoo_cut():
    three = factory_spec(f"{LLAMA}:llama3_8b_3_layers")
    assert three.num_layers == 3
    zoo = get_spec("llama3-8b").with_overrides(num_layers=3)
    assert_same_layers(extract(three, 1, sequence_length=16), extract(zoo, 1, sequence_length=16), replicated=False)
    five = factory_spec(f"{LLAMA}:llama3_8b_3_layers", "+model.overrides.num_layers=5")
    assert extract(five, 1, sequence_length=16).parameter_count == llama_parameters(5, 4096, 32, 8, 14336, 128256)


@pytest.mark.parametrize("width", [1, 2, 16])
def test_a_llama_of_graph_extract_parallel_layers_is_the_zoo_shard(width):
    """A factory taking tensor_parallel_width and rank shards the model: rank 0 of width 1, 2 and 16
    (more ranks than the 8 key/value heads) has the zoo's layer graph, replicated parts included."""
    spec = factory_spec(f"{LLAMA}:llama3_8b_sharded")
    assert valid_tensor_parallel_widths(spec, 64) == valid_tensor_parallel_widths(get_spec("llama3-8b"), 64)
    mine = extract(spec, 1, sequence_length=16, tensor_parallel_width=width)
    theirs = extract(get_spec("llama3-8b"), 1, sequence_length=16, tensor_parallel_width=width)
    assert_same_layers(mine, theirs, replicated=True)
    assert mine.parameters_per_device == theirs.parameters_per_device


# 2. The graph cache ----------------------------------------------------------------------------

def test_the_source_file_keys_the_cache_and_the_zoo_keys_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(LLAMA, tmp_path / "llama.py")
    spec = factory_spec("llama.py:tiny")
    before = cache_path(tmp_path, spec, 1, 64, 1)
    first = extract(spec, 1, cache_dir=tmp_path)
    assert before.is_file()
    with (tmp_path / "llama.py").open("a") as file:
        file.write("\n# changed\n")
    after = cache_path(tmp_path, spec, 1, 64, 1)
    assert after != before and not after.exists()
    assert extract(spec, 1, cache_dir=tmp_path).layer_graph == first.layer_graph and after.is_file()
    # the keys main's code gave the zoo's models before the factory field existed
    assert cache_path(tmp_path, get_spec("llama2"), 1, 1024, 1).name == f"llama2_mbs1_seq1024_tp1_v{FORMAT_VERSION}_3358effa.json"
    assert cache_path(tmp_path, get_spec("llama3-8b"), 1, 1024, 1).name == f"llama3-8b_mbs1_seq1024_tp1_v{FORMAT_VERSION}_b5ce9e81.json"


# 3. Bad input: one line naming model.config and what is wrong ----------------------------------

def error(*arguments: str) -> str:
    """The one-line message check_command_line raises for the arguments."""
    with pytest.raises(InputError) as raised:
        check_command_line("extract_graph", list(arguments))
    assert "\n" not in str(raised.value)
    return str(raised.value)


def factory_error(reference: str) -> str:
    """The error of `model=custom model.config=reference`, after the `model.config: reference: ` it starts with."""
    message = error("model=custom", f"model.config={reference}")
    assert message.startswith(f"model.config: {reference}: "), message
    return message.removeprefix(f"model.config: {reference}: ")


@pytest.mark.parametrize(
    "function, problem",
    [
        ("raises", "raises raised RuntimeError: out of ideas"),
        ("returns_a_number", "returns_a_number returned int 3, not a torch.nn.Module"),
        ("with_an_unsupported_operator", "operator: unsupported ATen operator cumsum on floating-point tensors at "
                                         "the top-level forward; supported: "),
        ("without_a_head", "layers: nothing traced after the last block (the head); the forward must embed"),
        ("fin", f"{BAD} has no function 'fin'; did you mean fine?"),
    ],
)
def test_a_bad_factory(function, problem):
    assert factory_error(f"{BAD}:{function}").startswith(problem)


def test_a_module_or_file_that_is_not_there_or_does_not_import(tmp_path):
    assert factory_error(f"{tmp_path}/absent.py:build") == f"no such file {tmp_path}/absent.py"
    assert factory_error("no_such_package.models:build") == ("no module named 'no_such_package.models' on sys.path or "
                                                             "in the working directory")
    (tmp_path / "broken.py").write_text("def build(:\n")
    assert factory_error(f"{tmp_path}/broken.py:build").startswith(f"importing {tmp_path}/broken.py raised "
                                                                   "SyntaxError: ")


def test_a_factory_model_keeps_its_shape_and_width():
    assert error("model=custom", f"model.config={LLAMA}:tiny", "+model.overrides.hidden_size=512") == (
        "model.overrides.hidden_size: a factory's model has its module's shape; allowed: name, num_layers, "
        "default_sequence_length")
    assert error("model=custom", f"model.config={LLAMA}:tiny", "model.max_tensor_parallel_width=16",
                 "tensor_parallel_width=16") == (
        "tensor_parallel_width: 16 does not divide the 8 heads of tiny-llama; valid: 1, 2, 4, 8")
    assert error("model=gpt2", "+model.overrides.factory=x.py:f") == (
        "model.overrides.factory: set by model=custom model.config=MODULE:FUNCTION only")


def phaze(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run([sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True,
                          env=environment)


@pytest.mark.slow
def test_extract_graph_runs_a_factory_end_to_end(tmp_path):
    """The file form and the module-name form (found in the working directory) from the command line."""
    shutil.copytree(DATA, tmp_path / "tests" / "data", ignore=shutil.ignore_patterns("__pycache__", "estimator",
                                                                                     "placement"))
    result = phaze("extract_graph", "model=custom", "model.config=tests/data/hf_llama.py:tiny", "cache_dir=cache",
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "cache" / "graphs").glob("tiny-llama_mbs1_seq64_tp1_*.json"))) == 1
    (summary,) = (tmp_path / "outputs" / "runs").glob("*/*/extract_summary.csv")
    rows = list(csv.DictReader(summary.read_text().splitlines()))
    assert [row["tensor_parallel_width"] for row in rows] == ["1", "2", "4", "8"]  # the widths its 8 heads allow
    assert {(row["layers"], row["parameters"]) for row in rows} == {("6", str(llama_parameters(4, 256, 8, 2, 512, 1000)))}
    again = phaze("extract_graph", "model=custom", "model.config=tests.data.hf_llama:tiny", "cache_dir=cache",
                  cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(list((tmp_path / "cache" / "graphs").glob("tiny-llama_*.json"))) == 8  # another reference, 4 widths


def written(folder: Path) -> list[str]:
    """The folder's files but the bytecode Python itself caches on importing a module."""
    return sorted(path.name for path in folder.iterdir() if path.name != "__pycache__")


def test_a_bad_factory_exits_2_with_one_line(tmp_path):
    shutil.copy(BAD, tmp_path / "bad.py")
    result = phaze("extract_graph", "model=custom", "model.config=bad.py:raises", "cache_dir=cache", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "phaze: error: model.config: bad.py:raises: raises raised RuntimeError: out of ideas\n"
    assert written(tmp_path) == ["bad.py"]


@pytest.mark.parametrize("reference, message", [
    ("bad.py:exits", "exits called sys.exit(3)"),
    ("bad.py:exits_without_a_code", "exits_without_a_code called sys.exit()"),
    ("bad.py:exits_in_its_forward", "exporting the model with torch.export: its forward called sys.exit('stop here')"),
    ("exits_on_import.py:build", "importing exits_on_import.py called sys.exit(0)"),
], ids=["in-the-factory", "without-a-code", "in-the-forward", "on-import"])
def test_a_factory_that_calls_sys_exit_exits_2_with_one_line(tmp_path, reference, message):
    """sys.exit in the user's code is the user's code failing, not the end of phaze (which would exit
    with the factory's status, 0 or 3, and say nothing)."""
    shutil.copy(BAD, tmp_path / "bad.py")
    (tmp_path / "exits_on_import.py").write_text("import sys\n\nsys.exit(0)\n")
    result = phaze("extract_graph", "model=custom", f"model.config={reference}", "cache_dir=cache", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"phaze: error: model.config: {reference}: {message}\n"
    assert written(tmp_path) == ["bad.py", "exits_on_import.py"]
