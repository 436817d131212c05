"""A user's own model (`model=custom model.config=PATH`): a ModelSpec YAML and a Hugging Face
config.json give the zoo's spec and layer graph, separate graph cache entries, and one-line errors."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module

from phaze_common.checks import InputError
from graph_extract import ModelSpec, extract, get_spec
from graph_extract.extraction import cache_path
from phaze.cli import check_command_line
from phaze.settings import settings_from_config

REPOSITORY = Path(__file__).resolve().parents[1]

#: Meta-Llama-3-8B's published config.json (huggingface.co/meta-llama/Meta-Llama-3-8B), written out.
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}
#: Mistral-7B-v0.1's published config.json.
MISTRAL_7B_CONFIG = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000,
}
#: Mixtral-8x7B-v0.1's published config.json.
MIXTRAL_8X7B_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000,
}
#: Llama-2-7b-hf's published config.json: as many key/value heads as query heads.
LLAMA2_7B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False,
    "torch_dtype": "float16", "vocab_size": 32000,
}
#: Qwen3-235B-A22B's published config.json (huggingface.co/Qwen/Qwen3-235B-A22B).
QWEN3_235B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 94, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 1536,
    "norm_topk_prob": True, "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 94, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
#: DeepSeek-V3's published config.json (huggingface.co/deepseek-ai/DeepSeek-V3; its FP8 quantisation
#: block and rope scaling left out: they change no shape).
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128,
    "vocab_size": 129280,
}
#: A small grouped-query decoder as a ModelSpec YAML file (only the required fields and a few more).
SMALL = {
    "name": "small", "num_layers": 2, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 2,
    "ffn_hidden_size": 512, "vocab_size": 1000, "max_position_embeddings": 256, "default_sequence_length": 64,
    "norm": "rmsnorm", "activation": "swiglu", "position_embedding": "rotary", "bias": False,
    "tied_lm_head": False, "dropout": 0.0,
}


def write(path: Path, content: dict | str) -> Path:
    """`content` at `path` (YAML or JSON by the suffix, a text as it is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content) if path.suffix == ".json" else yaml.safe_dump(content, sort_keys=False)
    path.write_text(content)
    return path


def custom_spec(path: Path, *overrides: str) -> ModelSpec:
    """The spec phaze's settings make of `model=custom model.config=path`."""
    with initialize_config_module("phaze.conf", version_base="1.3"):
        cfg = compose("config", overrides=["mode=extract_graph", "model=custom", f"model.config={path}", *overrides])
    return settings_from_config(cfg).spec


def assert_same_model(spec: ModelSpec, zoo: str, blocks: int = 2) -> None:
    """Every field but the name is the zoo model's, and a cut of both to `blocks` blocks has one layer graph."""
    expected = get_spec(zoo)
    for field in dataclasses.fields(ModelSpec):
        if field.name != "name":
            assert getattr(spec, field.name) == getattr(expected, field.name), field.name
    mine = extract(spec.with_overrides(num_layers=blocks), 1, sequence_length=32, tensor_parallel_width=2)
    theirs = extract(expected.with_overrides(num_layers=blocks), 1, sequence_length=32, tensor_parallel_width=2)
    assert mine.layer_graph == theirs.layer_graph
    assert mine.parameter_count == theirs.parameter_count


def llama_parameters(layers: int, h: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    """Embedding V·h; per block q and o h·h each, k and v h·kv·d each, SwiGLU 3·h·f, two RMSNorms 2h;
    final RMSNorm h; untied LM head V·h."""
    d = h // heads
    return vocab * h + layers * (2 * h * h + 2 * h * kv_heads * d + 3 * h * ffn + 2 * h) + h + vocab * h


# 1. The zoo's models from a file ---------------------------------------------------------------

def test_a_yaml_of_llama3_8b_fields_is_llama3_8b(tmp_path):
    fields = {**dataclasses.asdict(get_spec("llama3-8b")), "name": "my-llama"}
    spec = custom_spec(write(tmp_path / "llama.yaml", fields))
    assert spec.name == "my-llama"
    assert_same_model(spec, "llama3-8b")


def test_a_yaml_with_only_the_required_fields_takes_modelspec_defaults(tmp_path):
    required = {key: SMALL[key] for key in ("name", "num_layers", "hidden_size", "num_heads", "ffn_hidden_size",
                                            "vocab_size", "max_position_embeddings", "default_sequence_length")}
    spec = custom_spec(write(tmp_path / "m.yml", required))
    assert spec == ModelSpec(**required)
    assert (spec.norm, spec.activation, spec.bias, spec.num_kv_heads) == ("layernorm", "gelu", True, None)


def test_the_llama3_8b_config_json_is_llama3_8b(tmp_path):
    spec = custom_spec(write(tmp_path / "Meta-Llama-3-8B" / "config.json", LLAMA3_8B_CONFIG))
    assert spec.name == "Meta-Llama-3-8B"  # the folder's name
    assert_same_model(spec, "llama3-8b")
    named = {**LLAMA3_8B_CONFIG, "_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct"}
    assert custom_spec(write(tmp_path / "x" / "config.json", named)).name == "Meta-Llama-3-8B-Instruct"


def test_the_whole_llama3_8b_config_json_has_the_published_parameters(tmp_path):
    spec = custom_spec(write(tmp_path / "llama" / "config.json", LLAMA3_8B_CONFIG))
    count = llama_parameters(32, 4096, 32, 8, 14336, 128256)
    assert count == 8_030_261_248  # the published count
    assert extract(spec, 1, sequence_length=16).parameter_count == count


def test_the_mistral_7b_config_json_is_mistral_7b(tmp_path):
    """Its 4,096-token sliding window is not its sequence: the default is the 8,192 cap (the least of
    the positions and 8192), which the window is shorter than, so it is refused (phaze prices full
    attention); at 4,096 tokens it is the zoo's mistral-7b."""
    path = write(tmp_path / "Mistral-7B-v0.1" / "config.json", MISTRAL_7B_CONFIG)
    assert error("model=custom", f"model.config={path}") == (
        f"model.config: {path}: sliding_window: 4,096 tokens, shorter than the 8,192-token sequence, is a windowed "
        "attention phaze does not price (it prices full attention over the sequence); allowed: sequence_length at "
        "most 4096")
    spec = custom_spec(path, "sequence_length=4096")
    assert spec.name == "Mistral-7B-v0.1" and spec.default_sequence_length == 8192
    assert_same_model(spec.with_overrides(default_sequence_length=4096), "mistral-7b")
    without_window = {**MISTRAL_7B_CONFIG, "sliding_window": None}  # Mistral-7B v0.2
    assert custom_spec(write(tmp_path / "v2" / "config.json", without_window)).default_sequence_length == 8192


def test_the_llama2_7b_config_json_is_llama2_with_multi_head_attention(tmp_path):
    """num_key_value_heads equal to the heads is multi-head attention (num_kv_heads null): the zoo's
    llama2, with its graph cache key."""
    spec = custom_spec(write(tmp_path / "llama2" / "config.json", LLAMA2_7B_CONFIG))
    assert spec.num_kv_heads is None
    assert_same_model(spec, "llama2")
    assert cache_path(tmp_path, spec, 1, 4096, 1) == cache_path(tmp_path, get_spec("llama2"), 1, 4096, 1)


def test_overrides_apply_on_top_of_the_file(tmp_path):
    spec = custom_spec(write(tmp_path / "m.yaml", SMALL), "+model.overrides.num_layers=4",
                       "+model.overrides.num_kv_heads=4")
    assert (spec.num_layers, spec.num_kv_heads, spec.hidden_size) == (4, 4, 256)


# 2. The graph cache ----------------------------------------------------------------------------

def test_two_files_of_one_name_and_different_shapes_have_their_own_cache_entries(tmp_path):
    cache = tmp_path / "cache"
    first = custom_spec(write(tmp_path / "a" / "m.yaml", SMALL))
    second = custom_spec(write(tmp_path / "b" / "m.yaml", {**SMALL, "ffn_hidden_size": 768}))
    assert first.name == second.name == "small"
    assert cache_path(cache, first, 1, 64, 1) != cache_path(cache, second, 1, 64, 1)
    counts = [extract(spec, 1, tensor_parallel_width=1, cache_dir=cache).parameter_count for spec in (first, second)]
    assert len(list((cache / "graphs").glob("small_*.json"))) == 2
    assert counts == [llama_parameters(2, 256, 8, 2, ffn, 1000) for ffn in (512, 768)]
    # read back from the cache, each file still gives its own model
    assert [extract(spec, 1, cache_dir=cache).parameter_count for spec in (first, second)] == counts


# 3. Bad input: one line naming the field and the file, exit 2, nothing written -----------------

def error(*arguments: str, mode: str = "extract_graph") -> str:
    """The one-line message check_command_line raises for the arguments."""
    with pytest.raises(InputError) as raised:
        check_command_line(mode, list(arguments))
    assert "\n" not in str(raised.value)
    return str(raised.value)


def file_error(path: Path) -> str:
    """The error of `model=custom model.config=path`, after the `model.config: <path>: ` it starts with."""
    message = error("model=custom", f"model.config={path}")
    assert message.startswith(f"model.config: {path}: "), message
    return message.removeprefix(f"model.config: {path}: ")


def test_a_missing_required_field(tmp_path):
    fields = {key: value for key, value in SMALL.items() if key != "hidden_size"}
    assert file_error(write(tmp_path / "m.yaml", fields)) == "missing field hidden_size"
    hf = {key: value for key, value in LLAMA3_8B_CONFIG.items() if key != "intermediate_size"}
    assert file_error(write(tmp_path / "l" / "config.json", hf)) == "missing field intermediate_size"


def test_an_unknown_field_suggests_the_closest(tmp_path):
    fields = {**{key: value for key, value in SMALL.items() if key != "hidden_size"}, "hidden_sise": 256}
    assert file_error(write(tmp_path / "m.yaml", fields)) == "unknown field hidden_sise; did you mean hidden_size?"
    assert file_error(write(tmp_path / "n.yaml", {**SMALL, "zzz": 1})).startswith("unknown field zzz; valid: name, ")


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("num_layers", -1, "num_layers: must be a positive integer at most 16,777,216, got -1"),
        ("hidden_size", "big", "hidden_size: must be a positive integer at most 16,777,216, got 'big'"),
        ("norm", "batchnorm", "norm: unknown 'batchnorm'; allowed: layernorm, rmsnorm"),
        ("bias", "no", "bias: must be true or false, got 'no'"),
        ("dropout", 1.5, "dropout: must be a number in [0, 1), got 1.5"),
        ("name", "a/b", "name: 'a/b' names files; allowed: letters, digits, '.', '_', '-'"),
        ("num_kv_heads", 3, "num_kv_heads: 3 does not divide num_heads=8; allowed: a divisor of 8, or null"),
        ("num_heads", 6, "num_heads: 6 heads do not divide hidden_size=256; allowed: a divisor of 256"),
    ],
)
def test_a_bad_value_in_a_yaml(tmp_path, field, value, problem):
    fields = {**SMALL, field: value, **({"num_kv_heads": None} if field == "num_heads" else {})}
    assert file_error(write(tmp_path / "m.yaml", fields)).startswith(problem)


def test_a_bad_value_in_a_config_json_names_its_key(tmp_path):
    def problem(**changes):
        return file_error(write(tmp_path / "m" / "config.json", {**LLAMA3_8B_CONFIG, **changes}))

    assert problem(num_key_value_heads=5).startswith("num_key_value_heads: 5 does not divide num_heads=32")
    assert problem(num_hidden_layers=0).startswith("num_hidden_layers: must be a positive integer")
    assert problem(num_attention_heads=24).startswith("num_attention_heads: 24 heads do not divide hidden_size=")
    assert problem(tie_word_embeddings="yes") == "tie_word_embeddings: must be true or false, got 'yes'"
    assert problem(hidden_act="gelu").startswith("hidden_act: 'gelu' is not a Llama-family MLP; allowed: silu")
    assert problem(model_type="not_a_model") == (
        "model_type: unknown 'not_a_model'; allowed: llama, mistral, mixtral, qwen3_moe, deepseek_v3 (phaze's reader), "
        "a causal language model type the installed transformers builds, or a ModelSpec YAML file")
    assert problem(attention_bias=True) == ("attention_bias: true adds biases, which phaze's llama reader does not "
                                            "model; allowed: false")


def test_the_mixtral_config_json_is_mixtral_8x7b(tmp_path):
    """The experts from num_local_experts / num_experts_per_tok; no sliding window, so the sequence is
    the 8192 cap (the zoo's mixtral-8x7b keeps Megatron's 4096: the one field that differs)."""
    spec = custom_spec(write(tmp_path / "Mixtral-8x7B-v0.1" / "config.json", MIXTRAL_8X7B_CONFIG))
    assert spec.default_sequence_length == 8192
    assert_same_model(spec.with_overrides(default_sequence_length=4096), "mixtral-8x7b")
    missing = {key: value for key, value in MIXTRAL_8X7B_CONFIG.items() if key != "num_experts_per_tok"}
    assert file_error(write(tmp_path / "m" / "config.json", missing)) == "missing field num_experts_per_tok"
    too_many = {**MIXTRAL_8X7B_CONFIG, "num_experts_per_tok": 9}
    assert file_error(write(tmp_path / "n" / "config.json", too_many)).startswith(
        "num_experts_per_tok: 9 with num_experts=8; allowed: an integer in [1, 8]")


def test_a_file_that_is_not_a_model_file(tmp_path):
    assert file_error(tmp_path / "absent.yaml") == "no such file"
    assert file_error(write(tmp_path / "m.txt", "name: x")).startswith("unknown file type '.txt'; allowed: ")
    assert file_error(write(tmp_path / "m.yaml", "name: [x")).startswith("not valid YAML (")
    assert file_error(write(tmp_path / "c.json", "{\"a\": ")).startswith("not valid JSON (")
    assert file_error(write(tmp_path / "l.yaml", "- 1\n- 2\n")) == "must be a YAML mapping of model fields, got list"
    (tmp_path / "folder.yaml").mkdir()
    assert error("model=custom", f"model.config={tmp_path / 'folder.yaml'}").startswith(
        f"model.config: {tmp_path / 'folder.yaml'} is a folder without a config.json; allowed: a ModelSpec YAML")


def test_model_config_goes_with_model_custom_only():
    assert error("model=custom").startswith("model.config: missing; model=custom reads the model from a file")
    for given in ("model.config=m.yaml", "+model.config=m.yaml"):
        assert error("model=gpt2", given).startswith("model.config: only with model=custom; ")
    assert error("model=nope").endswith(", megatrongpt3, custom (model.config=PATH)")


def phaze(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run([sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True,
                          env=environment)


def test_the_command_exits_2_with_one_line_and_writes_nothing(tmp_path):
    write(tmp_path / "m.yaml", {**{key: value for key, value in SMALL.items() if key != "hidden_size"},
                                "hidden_sise": 256})
    result = phaze("extract_graph", "model=custom", "model.config=m.yaml", "cache_dir=cache", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("phaze: error: model.config: m.yaml: unknown field hidden_sise; did you mean "
                             "hidden_size?\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.yaml"]


ALLOWED_FILES = ("allowed: a ModelSpec YAML (.yaml, .yml), a Hugging Face config.json (.json) or a Python factory "
                 "(path/to/file.py:function or package.module:function)")


@pytest.mark.parametrize("make, config, message", [
    (lambda root: write(root / "models/Llama-3.2-1B/config.json", LLAMA3_8B_CONFIG), "models/Llama-3.2-1B",
     "model.config: models/Llama-3.2-1B is a folder; give its config.json: models/Llama-3.2-1B/config.json"),
    (lambda root: (root / "models/empty").mkdir(parents=True), "models/empty",
     f"model.config: models/empty is a folder without a config.json; {ALLOWED_FILES}"),
    (lambda root: write(root / "m.yaml", "name: small\nnum_layers: 2\nhidden_size: 256\nnum_layers: 4\n"), "m.yaml",
     "model.config: m.yaml: num_layers: given twice (lines 2 and 4); a key may appear once"),
    (lambda root: write(root / "config.json", json.dumps(LLAMA3_8B_CONFIG)[:-1] + ', "hidden_size": 2048}'),
     "config.json", "model.config: config.json: hidden_size: given twice; a key may appear once"),
    (lambda root: write(root / "config.json", '{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}"),
     "config.json", "model.config: config.json: not valid JSON (nested too deeply to read)"),
    (lambda root: write(root / "config.json", "[" * 100_000 + "]" * 100_000), "config.json",
     "model.config: config.json: not valid JSON (nested too deeply to read)"),
    (lambda root: write(root / "m.yaml", "name: " + "[" * 100_000 + "]" * 100_000 + "\n"), "m.yaml",
     "model.config: m.yaml: not valid YAML (nested too deeply to read)"),
], ids=["folder-with-config-json", "folder-without", "yaml-duplicate-key", "json-duplicate-key", "json-deep",
        "json-deep-top-level", "yaml-deep"])
def test_a_model_file_phaze_cannot_take_is_one_line_exit_2(tmp_path, make, config, message):
    make(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = phaze("extract_graph", "model=custom", f"model.config={config}", "cache_dir=cache", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"phaze: error: {message}\n")
    assert sorted(tmp_path.rglob("*")) == before


def test_a_yaml_merge_key_is_not_a_duplicate(tmp_path):
    """`<<: *anchor` brings keys the mapping may set again (YAML's merge): read as PyYAML reads it, so
    the error is the unknown field, not a duplicate."""
    merged = "base: &b\n  hidden_size: 128\nmodel:\n  <<: *b\n  hidden_size: 256\n"
    assert file_error(write(tmp_path / "m.yaml", merged)) == "unknown field base; did you mean bias?"


@pytest.mark.slow
def test_run_solver_on_a_custom_model_has_no_fixed_baseline(tmp_path):
    write(tmp_path / "m.yaml", SMALL)
    result = phaze("run_solver", "model=custom", "model.config=m.yaml", "max_tensor_parallel_width=2",
                   "global_batch_size=64", "num_devices=16", "hbm_size=1", "candidate_sample=3", "n_jobs=1",
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run,) = (tmp_path / "outputs" / "runs").glob("*/*")
    best = json.loads((run / "best.json").read_text())
    assert best["model"] == "small" and best["throughput"] > 0
    assert best["baselines"]["fixed_megatron"]["infeasible_reason"] == "the model defines no fixed_megatron"


@pytest.mark.parametrize("config, zoo, blocks", [(QWEN3_235B_CONFIG, "qwen3-235b-a22b", 2),
                                                 (DEEPSEEK_V3_CONFIG, "deepseek-v3", 5)])
def test_the_qwen3_moe_and_deepseek_v3_config_json_are_the_zoo_models(tmp_path, config, zoo, blocks):
    """Each family's published config.json gives the zoo's spec (the zoo keeps the 4,096 tokens they
    were trained or benchmarked at; the file's default is the 8,192 cap), DeepSeek's dense blocks,
    shared expert and latent attention included."""
    spec = custom_spec(write(tmp_path / zoo / "config.json", config))
    assert spec.default_sequence_length == 8192
    assert_same_model(spec.with_overrides(default_sequence_length=4096), zoo, blocks)
    sparse = {**config, "decoder_sparse_step": 2} if zoo.startswith("qwen") else {**config, "moe_layer_freq": 2}
    assert file_error(write(tmp_path / "sparse" / "config.json", sparse)).endswith(
        "; allowed: 1 (experts in every block after the dense ones)")


# 4. The sequence is not a sliding window; keys that change the shape are read or refused ------------

#: A Phi-3-mini-like config.json read as a Llama (its sliding window 2,047 tokens, 4,096 positions).
PHI3_LIKE = {**LLAMA3_8B_CONFIG, "max_position_embeddings": 4096, "sliding_window": 2047}
#: A GPT-OSS-like config.json read as a Llama: every other layer a 128-token sliding window.
GPT_OSS_LIKE = {**LLAMA3_8B_CONFIG, "sliding_window": 128, "num_hidden_layers": 4,
                "layer_types": ["sliding_attention", "full_attention"] * 2}


@pytest.mark.parametrize("config, positions, window", [(PHI3_LIKE, 4096, 2047), (GPT_OSS_LIKE, 8192, 128)],
                         ids=["phi3-like", "gpt-oss-like"])
def test_the_default_sequence_is_not_the_sliding_window(tmp_path, config, positions, window):
    """The default sequence is min(max_position_embeddings, 8192), never the window; a window shorter
    than the sequence is refused naming sliding_window and the file; a sequence within it is full
    attention, as priced."""
    path = write(tmp_path / "m" / "config.json", config)
    assert error("model=custom", f"model.config={path}") == (
        f"model.config: {path}: sliding_window: {window:,} tokens, shorter than the {positions:,}-token sequence, is "
        f"a windowed attention phaze does not price (it prices full attention over the sequence); allowed: "
        f"sequence_length at most {window}")
    assert custom_spec(path, f"sequence_length={window}").default_sequence_length == positions
    assert custom_spec(path, f"+model.overrides.default_sequence_length={window}").default_sequence_length == window


@pytest.mark.parametrize("changes", [{"sliding_window": None}, {"use_sliding_window": False, "sliding_window": 4096},
                                     {"layer_types": ["full_attention"] * 32, "sliding_window": 128}],
                         ids=["no-window", "window-switched-off", "every-layer-full"])
def test_a_window_that_no_layer_uses_is_no_window(tmp_path, changes):
    spec = custom_spec(write(tmp_path / "m" / "config.json", {**LLAMA3_8B_CONFIG, **changes}))
    assert spec.default_sequence_length == 8192


@pytest.mark.parametrize("changes, message", [
    ({"qkv_bias": True}, "qkv_bias: true adds biases, which phaze's llama reader does not model; allowed: false"),
    ({"mlp_bias": True}, "mlp_bias: true adds biases, which phaze's llama reader does not model; allowed: false"),
    ({"use_qk_norm": True}, "use_qk_norm: true adds a norm of each head's query and key, which phaze's llama reader "
                            "does not model; allowed: false"),
    ({"attention_dropout": 0.1}, "attention_dropout: 0.1 adds dropout, which phaze's llama reader does not model; "
                                 "allowed: 0 or 0.0"),
    ({"num_local_experts": 8}, "num_local_experts: 8 sets experts phaze's llama reader does not read; allowed: null "
                               "or 0 (model_type mixtral reads num_local_experts)"),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1},
     "n_shared_experts: 1 sets experts phaze's mixtral reader does not read; allowed: null or 0 (model_type "
     "deepseek_v3 reads n_shared_experts)"),
    ({"moe_intermediate_size": 1024}, "moe_intermediate_size: 1024 sets experts phaze's llama reader does not read; "
                                      "allowed: null or 0 (model_type qwen3_moe or deepseek_v3 reads "
                                      "moe_intermediate_size)"),
    ({"kv_lora_rank": 512}, "kv_lora_rank: 512 is multi-head latent attention, which phaze's llama reader does not "
                            "model; allowed: null (model_type deepseek_v3 reads it)"),
    ({"kv_channels": 64}, "kv_channels: 64 is a head width phaze's llama reader does not read (it reads head_dim); "
                          "allowed: null or 128"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types: \"linear_attention\" is an attention "
                                                              "phaze does not price; allowed: a list of "
                                                              "full_attention, sliding_attention"),
    ({"parallel_attn": True}, "parallel_attn: true adds attention and MLP run in parallel, which phaze's llama "
                              "reader does not model; allowed: false"),
], ids=["qkv-bias", "mlp-bias", "qk-norm", "dropout", "experts-under-llama", "shared-expert-under-mixtral",
        "moe-width-under-llama", "latent-attention-under-llama", "kv-channels", "linear-attention", "parallel-block"])
def test_a_key_that_changes_the_shape_the_reader_does_not_model_is_refused(tmp_path, changes, message):
    assert file_error(write(tmp_path / "m" / "config.json", {**LLAMA3_8B_CONFIG, **changes})) == message


def test_keys_that_add_nothing_or_change_no_shape_stay_accepted(tmp_path):
    harmless = {"attention_bias": False, "qk_norm": False, "attention_dropout": 0.0, "num_local_experts": None,
                "kv_lora_rank": None, "kv_channels": 128, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "pad_token_id": 0,
                "torch_dtype": "float32", "rope_scaling": {"type": "linear", "factor": 2.0}}
    spec = custom_spec(write(tmp_path / "m" / "config.json", {**LLAMA3_8B_CONFIG, **harmless}))
    assert_same_model(spec, "llama3-8b")
