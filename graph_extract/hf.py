"""A model built by Hugging Face `transformers` itself from a `config.json`, for export.

`build(path, sequence_length, blocks)` reads the file with `transformers.AutoConfig.for_model` (any
`model_type` the installed transformers knows), cuts it to its first `blocks` blocks (and their
`layer_types`), and builds `AutoModelForCausalLM.from_config` on the meta device: the family's own
modules, parameters and forward, no weights. The model runs without a key/value cache and with the
"eager" attention (the attention's products, mask and softmax as operators: what phaze prices and
its kernels fuse, with the FLOPs of any other implementation). `build_shrunk(path, sequence_length)`
builds the file shrunk for verification (`graph_extract.hf_shrink`) with random float32 weights on
the CPU.

The training loss is the zoo's per-token cross-entropy of the logits
(`transformer.per_token_cross_entropy`, in the order of Megatron's vocabulary-parallel algorithm),
so that a tensor-parallel plan splits it over the vocabulary as Megatron does; the model's own loss
(shifted labels, mean) differs from it by one shift and one mean, nothing a training step prices.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from graph_extract.hf_shrink import check_shrunk, shrunk
from graph_extract.transformer import per_token_cross_entropy
from phaze_common.checks import InputError

#: The attention implementation phaze exports: explicit products, mask and softmax.
ATTENTION = "eager"


class CausalLMLoss(nn.Module):
    """A `transformers` causal language model and its per-token loss: forward(input_ids, labels)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=input_ids, use_cache=False).logits
        return per_token_cross_entropy(logits, labels)


def is_config_file(reference: str) -> bool:
    """Whether a model reference is a config.json path (a model `transformers` builds)."""
    return reference.endswith(".json")


def read_config(path: str | Path) -> dict:
    """The JSON object of a config.json; ValueError naming what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except (ValueError, RecursionError) as error:
        raise ValueError(f"not JSON: {str(error).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    return data


def model_types() -> tuple[str, ...]:
    """The model types the installed `transformers` builds as causal language models."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))


def knows(model_type: object) -> bool:
    """Whether the installed `transformers` builds `model_type` as a causal language model."""
    try:
        return isinstance(model_type, str) and model_type in model_types()
    except ImportError:
        return False


def digest(path: str | Path) -> str:
    """SHA-1 of the file's bytes and of the transformers version that builds it."""
    import transformers

    return hashlib.sha1(Path(path).read_bytes() + transformers.__version__.encode()).hexdigest()


def _model_type(data: dict) -> str:
    """The file's `model_type`; ValueError unless transformers builds it as a causal language model."""
    model_type = data.get("model_type")
    if not knows(model_type):
        raise ValueError(f"model_type: {model_type!r} is not a causal language model transformers builds; allowed: "
                         f"{', '.join(model_types())}")
    return model_type


def _config(path: str, blocks: int | None, data: dict | None = None) -> object:
    """The transformers config of the file at `path` (or of its JSON object `data`), cut to its first
    `blocks` blocks (None: all)."""
    from transformers import AutoConfig

    data = dict(read_config(path) if data is None else data)
    model_type = _model_type(data)
    data.pop("model_type")
    data.pop("quantization_config", None)  # a storage format of weights: training runs in bf16 / fp16
    try:
        config = AutoConfig.for_model(model_type, **data)
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"transformers cannot read it: {str(error).splitlines()[0][:200]}") from None
    if not getattr(config, "_name_or_path", None):
        config._name_or_path = Path(path).stem if Path(path).stem != "config" else Path(path).resolve().parent.name
    if blocks is not None and blocks < config.num_hidden_layers:
        config.num_hidden_layers = blocks
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:blocks]
    return config


@lru_cache(maxsize=8)
def _built(path: str, file_digest: str, blocks: int | None) -> nn.Module:
    from transformers import AutoModelForCausalLM

    config = _config(path, blocks)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION)
    except Exception as error:  # the family's own code and checks
        raise ValueError(f"transformers cannot build it: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
                         ) from None
    return CausalLMLoss(model.train())


def build(path: str | Path, blocks: int | None = None) -> nn.Module:
    """The model of the config.json at `path` on the meta device, cut to its first `blocks` blocks
    (None: all), with its loss (`CausalLMLoss`); ValueError naming what is wrong."""
    return _built(str(path), digest(path), blocks)


def build_real(path: str | Path) -> nn.Module:
    """The whole model of a (small) config.json with random weights on the CPU, with its loss."""
    from transformers import AutoModelForCausalLM

    return CausalLMLoss(AutoModelForCausalLM.from_config(_config(str(path), None), attn_implementation=ATTENTION,
                                                         dtype=torch.float32))


def build_shrunk(path: str | Path, sequence_length: int) -> nn.Module:
    """The model of the config.json at `path` shrunk for verification (`graph_extract.hf_shrink.shrunk`
    for `sequence_length` tokens), with random float32 weights on the CPU and its loss: what
    `graph_extract.verify` runs against its plan's ranks."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    data = read_config(path)
    aliases = CONFIG_MAPPING[_model_type(data)].attribute_map
    config = _config(str(path), None, shrunk(data, sequence_length, aliases))
    try:
        with torch.device("meta"):
            check_shrunk(AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION), data)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION, dtype=torch.float32)
    except InputError:
        raise
    except Exception as error:  # the family's own code and checks
        raise ValueError(f"transformers cannot build it shrunk: {type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200]}") from None
    return CausalLMLoss(model)
