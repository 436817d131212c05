"""A user's own model from a file (`model=custom model.config=PATH`), no code changes needed.

Three forms: a Python `torch.nn.Module` factory `package.module:function` or `path/to/file.py:function`
(graph_extract.factory: the module is traced and its ModelSpec facts inferred), and two file
formats, told apart by the suffix:

- `.yaml` / `.yml`: the fields of graph_extract.zoo.ModelSpec by name. `name` and the fields ModelSpec
  has no default for are required; the others are optional, with ModelSpec's defaults.
- `.json`: a Hugging Face `config.json` of the Llama / Mistral / Mixtral family, Qwen3-MoE or
  DeepSeek-V3, read offline (plain json, no `transformers`). Keys that do not change the layer
  graph (rms_norm_eps, rope_theta, token ids, torch_dtype, routing scores and groups, DeepSeek's
  multi-token prediction layers, ...) are ignored; a key that would change it and that the family's
  reader does not model (biases, QK-norm, dropout, another family's experts or latent attention,
  parallel blocks, chunked or linear attention: `SHAPE_KEYS`, `EXPERT_KEYS`, `LATENT_KEYS`) is
  refused unless it has a value that adds nothing. A sliding attention window is returned beside the
  fields: phaze prices full attention, so a sequence longer than the window is refused
  (phaze.model_config).

`read_model_file` returns the raw fields and the file's name of each; phaze.settings checks their
types and ranges. Problems are ValueErrors whose message names the field (the caller adds the file).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from graph_extract import ModelSpec, extract
from graph_extract.extraction import is_exported
from graph_extract.zoo import LLAMA_FAMILY

YAML_SUFFIXES = (".yaml", ".yml")
JSON_SUFFIXES = (".json",)
#: ModelSpec fields without a default: a YAML model file must give them.
REQUIRED_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec)
                        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
#: Hugging Face model types read from config.json: the Llama-family decoders and today's mixtures.
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen3_moe", "deepseek_v3")
#: Longest default sequence of a config.json model [tokens]: the 8192 Llama-3 is trained and
#: benchmarked at, for models whose context is longer (`sequence_length=` picks another).
MAX_DEFAULT_SEQUENCE_LENGTH = 8192
#: The characters of a model name: it names cache files and results.
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")

#: config.json keys -> ModelSpec fields, all required.
_HF_SHAPE = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_heads",
    "intermediate_size": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
}
#: The config.json key each ModelSpec field of a config.json model comes from (errors name it).
HF_KEYS = {
    **{field: key for key, field in _HF_SHAPE.items()},
    "num_kv_heads": "num_key_value_heads",
    "num_experts": "num_local_experts",
    "experts_per_token": "num_experts_per_tok",
    "kv_channels": "head_dim",
    "tied_lm_head": "tie_word_embeddings",
    "default_sequence_length": "max_position_embeddings",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "shared_experts": "n_shared_experts",
    "first_dense_layers": "first_k_dense_replace",
    **{name: name for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
}
#: Each family's key of the routed experts' count (`num_experts`).
HF_EXPERT_KEYS = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts", "deepseek_v3": "n_routed_experts"}


#: config.json keys that add to a block what the Llama-family readers do not model: what each adds and
#: the values that add nothing (any other is refused).
SHAPE_KEYS = {
    **{key: ("biases", (False,)) for key in ("attention_bias", "mlp_bias", "qkv_bias", "use_qkv_bias", "add_qkv_bias",
                                             "bias", "use_bias", "add_bias_linear")},
    **{key: ("a norm of each head's query and key", (False,)) for key in ("qk_norm", "use_qk_norm", "qk_layernorm")},
    **{key: ("dropout", (0, 0.0)) for key in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop",
                                              "attn_pdrop")},
    **{key: ("attention and MLP run in parallel", (False,)) for key in ("parallel_attn", "use_parallel_residual")},
    "attention_chunk_size": ("chunked attention", (None,)),
}
#: The experts' keys of config.json, each family's reader reading its own: the values that add no
#: expert where a family does not read the key (any other is refused).
EXPERT_KEYS = {
    "num_local_experts": (None, 0), "num_experts": (None, 0), "n_routed_experts": (None, 0),
    "n_shared_experts": (None, 0), "num_experts_per_tok": (None, 0), "moe_intermediate_size": (None, 0),
    "shared_expert_intermediate_size": (None, 0), "first_k_dense_replace": (None, 0), "moe_layer_freq": (None, 1),
    "decoder_sparse_step": (None, 1), "mlp_only_layers": (None, []),
}
#: The experts' keys each family's reader reads.
FAMILY_EXPERT_KEYS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                  "mlp_only_layers"),
    "deepseek_v3": ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "first_k_dense_replace", "moe_layer_freq"),
}
#: Multi-head latent attention's keys (read by the deepseek_v3 reader only).
LATENT_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
#: The attention kinds of `layer_types` phaze prices (a sliding one within the sequence is full attention).
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class ModelFile:
    """A model file's ModelSpec fields (values unchecked), the file's name of each field, and the
    sliding attention window [tokens] of a config.json whose attention is windowed (None: full
    attention)."""

    fields: dict[str, object]
    keys: dict[str, str]
    attention_window: int | None = None

    def key(self, field: str) -> str:
        """The file's name of a ModelSpec field (the field itself in a YAML file)."""
        return self.keys.get(field, field)


def folder_error(path: Path) -> str:
    """Why a folder given as `model.config` is not a model file, and what to give instead."""
    if (path / "config.json").is_file():
        return f"model.config: {path} is a folder; give its config.json: {path / 'config.json'}"
    return (f"model.config: {path} is a folder without a config.json; allowed: a ModelSpec YAML "
            f"({', '.join(YAML_SUFFIXES)}), a Hugging Face config.json (.json) or a Python factory "
            "(path/to/file.py:function or package.module:function)")


def read_model_file(path: Path) -> ModelFile:
    """The ModelSpec fields a model file gives; ValueError naming the field."""
    suffix = path.suffix.lower()
    if suffix not in YAML_SUFFIXES + JSON_SUFFIXES:
        raise ValueError(f"unknown file type {path.suffix or '(none)'!r}; allowed: a ModelSpec YAML "
                         f"({', '.join(YAML_SUFFIXES)}), a Hugging Face config.json (.json) or a Python factory "
                         "(path/to/file.py:function or package.module:function)")
    if not path.is_file():
        raise ValueError("no such file" if not path.exists() else "not a file")
    text = path.read_text(encoding="utf-8", errors="replace")
    if suffix in JSON_SUFFIXES:
        load_json = functools.partial(json.loads, object_pairs_hook=_unique_json_keys)
        config = _mapping(text, load_json, json.JSONDecodeError, "JSON")
        experts = HF_EXPERT_KEYS.get(config.get("model_type"), HF_KEYS["num_experts"])
        fields = spec_fields_from_hf(config, path)
        return ModelFile(fields, {**HF_KEYS, "num_experts": experts}, attention_window(config))
    load_yaml = functools.partial(yaml.load, Loader=_UniqueKeyLoader)
    return ModelFile(spec_fields_from_yaml(_mapping(text, load_yaml, yaml.YAMLError, "YAML")), {})


def _unique_json_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's mapping; ValueError for a key given twice (json keeps the last)."""
    mapping: dict = {}
    for key, value in pairs:
        if key in mapping:
            raise ValueError(f"{key}: given twice; a key may appear once")
        mapping[key] = value
    return mapping


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a ValueError for a key given twice in one mapping (PyYAML keeps the
    last); merge keys (`<<: *anchor`) are taken as PyYAML takes them."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                given = lines.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            line = key_node.start_mark.line + 1
            if given is not None:
                raise ValueError(f"{key}: given twice (lines {given} and {line}); a key may appear once")
            lines[key] = line
        return super().construct_mapping(node, deep)


def _mapping(text: str, load, error: type[Exception], kind: str) -> dict:
    """The file's top-level mapping; a one-line ValueError if it is not one."""
    try:
        data = load(text)
    except error as problem:
        first = str(problem).strip().splitlines()[0] if str(problem).strip() else type(problem).__name__
        raise ValueError(f"not valid {kind} ({first})") from None
    except RecursionError:
        raise ValueError(f"not valid {kind} (nested too deeply to read)") from None
    if not isinstance(data, dict):
        raise ValueError(f"must be a {kind} mapping of model fields, got {type(data).__name__}")
    return data


def spec_fields_from_yaml(data: dict) -> dict[str, object]:
    """ModelSpec fields of a YAML model file: every required field given, no unknown one."""
    fields = [f.name for f in dataclasses.fields(ModelSpec)]
    for key in data:
        if key not in fields:
            match = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {match[0]}?" if match else f"; valid: {', '.join(fields)}"
            raise ValueError(f"unknown field {key}{hint}")
    for name in REQUIRED_FIELDS:
        if name not in data:
            raise ValueError(f"missing field {name}")
    return dict(data)


def spec_fields_from_hf(config: dict, path: Path) -> dict[str, object]:
    """ModelSpec fields of a Hugging Face Llama / Mistral / Mixtral / Qwen3-MoE / DeepSeek-V3 config.json.

    num_kv_heads is num_key_value_heads, or null (multi-head attention, as the zoo's llama2) when it
    equals the query heads; kv_channels is head_dim when it is not hidden_size / heads; Mixtral's
    num_local_experts and num_experts_per_tok are the experts (capacity factor 1: an even share
    each), Qwen3-MoE's and DeepSeek-V3's as their own functions say; the default sequence is the shorter
    of max_position_embeddings and 8192 tokens (a sliding window is not a sequence length:
    `attention_window`). A key that changes the shape and that the family's reader does not model is
    refused (`check_shape_keys`).
    """
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"model_type: unknown {model_type!r}; allowed: {', '.join(HF_MODEL_TYPES)} (phaze's "
                         "reader), a causal language model type the installed transformers builds, or a ModelSpec "
                         "YAML file")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act: {act!r} is not a Llama-family MLP; allowed: silu (SwiGLU)")
    check_shape_keys(config, model_type)
    fields: dict[str, object] = {"name": _hf_name(config, path), **LLAMA_FAMILY}  # the zoo's Llama layers
    for key, field in _HF_SHAPE.items():
        fields[field] = _required(config, key)
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads")
    fields["num_kv_heads"] = None if kv_heads == heads else kv_heads
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != config["hidden_size"]:
        fields["kv_channels"] = head_dim
    if model_type in HF_EXPERT_KEYS:
        for key, field in ((HF_EXPERT_KEYS[model_type], "num_experts"), ("num_experts_per_tok", "experts_per_token")):
            fields[field] = _required(config, key)
    if model_type == "qwen3_moe":
        fields.update(_qwen3_moe_fields(config))
    elif model_type == "deepseek_v3":
        fields.update(_deepseek_v3_fields(config))
    fields["tied_lm_head"] = config.get("tie_word_embeddings", False)
    fields["default_sequence_length"] = _default_sequence_length(config)
    return fields


def _shown(value: object) -> str:
    """A config.json value as JSON writes it (true, null, [])."""
    return json.dumps(value)


def check_shape_keys(config: dict, model_type: str) -> None:
    """ValueError naming the first key of `config` that would change the layer graph and that the
    `model_type` reader does not model (`SHAPE_KEYS`, another family's `EXPERT_KEYS`, `LATENT_KEYS`
    outside DeepSeek-V3, a head width `kv_channels` other than the one read), unless its value adds
    nothing."""
    def allowed(values: tuple) -> str:
        return " or ".join(map(_shown, values))

    for key, (adds, neutral) in SHAPE_KEYS.items():
        if key in config and config[key] not in neutral:
            raise ValueError(f"{key}: {_shown(config[key])} adds {adds}, which phaze's {model_type} reader does not "
                             f"model; allowed: {allowed(neutral)}")
    read = FAMILY_EXPERT_KEYS.get(model_type, ())
    for key, neutral in EXPERT_KEYS.items():
        if key in config and key not in read and config[key] not in neutral:
            readers = [family for family, keys in FAMILY_EXPERT_KEYS.items() if key in keys]
            raise ValueError(f"{key}: {_shown(config[key])} sets experts phaze's {model_type} reader does not read; "
                             f"allowed: {allowed(neutral)} (model_type {' or '.join(readers)} reads {key})")
    if model_type != "deepseek_v3":
        for key in LATENT_KEYS:
            if config.get(key) is not None:
                raise ValueError(f"{key}: {_shown(config[key])} is multi-head latent attention, which phaze's "
                                 f"{model_type} reader does not model; allowed: null (model_type deepseek_v3 reads it)")
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    width = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                       else None)
    if config.get("kv_channels") not in (None, width):
        raise ValueError(f"kv_channels: {_shown(config['kv_channels'])} is a head width phaze's {model_type} reader "
                         f"does not read (it reads head_dim); allowed: null or {_shown(width)}")


def attention_window(config: dict) -> int | None:
    """The sliding attention window [tokens] of a config.json whose attention is windowed, or None:
    `sliding_window` unless `use_sliding_window` is false (Qwen's switch) or every one of `layer_types`
    is full attention; ValueError for a window that is not a positive integer, or a layer type phaze
    does not price."""
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or any(kind not in LAYER_TYPES for kind in layer_types):
            unknown = next((kind for kind in layer_types if kind not in LAYER_TYPES), layer_types) if isinstance(
                layer_types, list) else layer_types
            raise ValueError(f"layer_types: {_shown(unknown)} is an attention phaze does not price; allowed: a list of "
                             f"{', '.join(LAYER_TYPES)}")
        if "sliding_attention" not in layer_types:
            return None
    window = config.get("sliding_window")
    if window is None or config.get("use_sliding_window") is False:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise ValueError(f"sliding_window: {_shown(window)}; allowed: a positive integer (tokens) or null")
    return window


def _required(config: dict, key: str) -> object:
    """config[key]; a missing key is the file's problem, named."""
    if key not in config:
        raise ValueError(f"missing field {key}")
    return config[key]


def _qwen3_moe_fields(config: dict) -> dict[str, object]:
    """Qwen3-MoE: experts of moe_intermediate_size in every block after `mlp_only_layers` (a run of
    blocks from the first, dense: intermediate_size), QK-norm; no shared expert."""
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers", [])
    if step != 1:
        raise ValueError(f"decoder_sparse_step: {step!r}; allowed: 1 (experts in every block after the dense ones)")
    if not isinstance(dense, list) or dense != list(range(len(dense))):
        raise ValueError(f"mlp_only_layers: {dense!r}; allowed: the first blocks in order ([0, 1, ...]) or []")
    return {"moe_ffn_hidden_size": _required(config, "moe_intermediate_size"), "first_dense_layers": len(dense),
            "qk_norm": True}


def _deepseek_v3_fields(config: dict) -> dict[str, object]:
    """DeepSeek-V3: routed experts of moe_intermediate_size and n_shared_experts shared ones in every
    block after the first first_k_dense_replace (dense: intermediate_size); multi-head latent
    attention, one key/value head per query head (num_key_value_heads is not a grouping there)."""
    frequency = config.get("moe_layer_freq", 1)
    if frequency != 1:
        raise ValueError(f"moe_layer_freq: {frequency!r}; allowed: 1 (experts in every block after the dense ones)")
    fields = {"moe_ffn_hidden_size": _required(config, "moe_intermediate_size"),
              "shared_experts": config.get("n_shared_experts") or 0,
              "first_dense_layers": config.get("first_k_dense_replace", 0), "num_kv_heads": None,
              "kv_channels": None, "q_lora_rank": config.get("q_lora_rank")}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        fields[key] = _required(config, key)
    return fields


def _hf_name(config: dict, path: Path) -> str:
    """The model's name: the last part of `_name_or_path`, else the file's folder (meta-llama/Meta-Llama-3-8B
    -> Meta-Llama-3-8B), with characters a file name cannot take replaced by '-'."""
    given = config.get("_name_or_path")
    raw = str(given).rstrip("/").rpartition("/")[2] if given else path.resolve().parent.name
    name = "-".join(NAME_PATTERN.findall(raw)).strip(".")
    return name or path.stem


def _default_sequence_length(config: dict) -> object:
    """min(max_position_embeddings, 8192); the raw value if it is not an integer (the settings name the
    field then)."""
    positions = config["max_position_embeddings"]
    if not isinstance(positions, int) or isinstance(positions, bool) or positions <= 0:
        return positions
    return min(positions, MAX_DEFAULT_SEQUENCE_LENGTH)


#: Factory specs already checked in this process, by (reference, source digest, working directory).
_FACTORY_SPECS: dict[tuple[str, str, str], ModelSpec] = {}


def built_by_transformers(path: Path) -> bool:
    """Whether `path` is a config.json of a model type phaze's reader does not read and `transformers`
    builds: its model is built by `transformers` and exported (graph_extract.hf)."""
    if path.suffix.lower() not in JSON_SUFFIXES or not path.is_file():
        return False
    from graph_extract import hf  # torch and transformers: loaded for a config.json only

    try:
        model_type = hf.read_config(path).get("model_type")
    except ValueError:  # not a JSON object: phaze's reader says what is wrong with it
        return False
    return model_type not in HF_MODEL_TYPES and hf.knows(model_type)


def read_factory(reference: str) -> ModelSpec:
    """The ModelSpec of a `module:function` factory or a config.json transformers builds, checked by
    extracting its model once (micro-batch 1, width 1, its default sequence); a one-line ValueError
    for anything wrong with it."""
    from graph_extract.factory import exit_call, factory_spec, source_digest  # torch: loaded for a factory only

    key = (reference, source_digest(reference), os.getcwd())
    if key not in _FACTORY_SPECS:
        spec = factory_spec(reference)
        try:
            extract(spec, 1, spec.default_sequence_length, 1)
        except Exception as error:  # phaze's checks (ValueError), torch.fx's and the user's forward's
            text = str(error).strip().splitlines()[0] if str(error).strip() else ""
            if not isinstance(error, ValueError):
                how = "exporting the model with torch.export" if is_exported(spec) else "tracing the model with torch.fx"
                text = f"{how} failed ({type(error).__name__}{': ' if text else ''}{text})"
            raise ValueError(text) from None
        except SystemExit as stop:  # the user's code (graph_extract turns its forward's into a ValueError)
            how = "exporting the model with torch.export" if is_exported(spec) else "tracing the model with torch.fx"
            raise ValueError(f"{how}: its forward called {exit_call(stop)}") from None
        _FACTORY_SPECS[key] = spec
    return _FACTORY_SPECS[key]
