"""A user's model from a Python `torch.nn.Module` factory: `package.module:function` or `path/to/file.py:function`.

Calling convention. phaze imports the module (a file path is relative to the working directory; a
module name is looked up on sys.path and in the working directory) and calls the function under
`torch.device("meta")` with those of these keywords it takes:

- `sequence_length`: tokens per sample, for buffers such as a causal mask or rotary tables. Its
  default is the model's default sequence length, so it must have one.
- `tensor_parallel_width`, `rank`: build rank `rank`'s shard at that width from
  `graph_extract.parallel` layers. A function without `tensor_parallel_width` is traced at width 1 only.

Its other parameters need defaults. It returns an `nn.Module` whose `forward` takes `input_ids`
([batch, sequence] int64) and optionally `labels` (same shape), and computes the training loss.

Layers come from the module tree: the transformer blocks are the children of the outermost
`nn.ModuleList` whose children are all of one class (the longest, if there are several). What the
forward computes before the first block is layer 0 (the embedding), after the last block the head
(L + 1). Blocks of one class are traced twice and the last is copied, as for the zoo's models.
A module without such a list (a straight line or a branching graph of operators) is traced whole
and its operators cut into at most num_layers layers (`graph_extract.operator_layers`; num_layers
is `OPERATOR_LAYERS` unless overridden); it is traced at tensor-parallel width 1 only (num_heads 1:
phaze's tensor-parallel split follows the blocks' structure).

The ModelSpec facts the rest of phaze needs (see `factory_spec`): the block count from the
ModuleList (without one: the operator layers asked for); vocabulary and hidden size from the
largest token embedding table; the rest from the module's `config` attribute (an object or a
dict, Hugging Face names).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from graph_extract import hf
from graph_extract.hf_shrink import EXPERT_COUNT_KEYS
from graph_extract.operator_layers import OPERATOR_LAYERS
from graph_extract.parallel import VocabParallelEmbedding
from graph_extract.zoo import ModelSpec

#: The keywords phaze passes to a factory that takes them.
KEYWORDS = ("sequence_length", "tensor_parallel_width", "rank")
#: Longest default sequence [tokens] taken from config.max_position_embeddings (config.json's rule).
MAX_DEFAULT_SEQUENCE_LENGTH = 8192
#: A dotted module name.
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
#: Modules loaded from files, by (path, digest of the file's bytes): a changed file is loaded again.
_LOADED: dict[tuple[Path, str], ModuleType] = {}


def _split(reference: str) -> tuple[str, str]:
    """(module name or file path, function name); ValueError if `reference` is neither form."""
    location, _, function = reference.rpartition(":")
    if not function.isidentifier():
        raise ValueError(f"function: {function!r} is not a Python name; give package.module:function or "
                         "path/to/file.py:function")
    if not location.endswith(".py") and not _MODULE_NAME.fullmatch(location):
        raise ValueError(f"{location!r} is neither a .py file nor a module name; give package.module:function or "
                         "path/to/file.py:function")
    return location, function


def source_file(reference: str) -> Path:
    """The file that defines the factory's module (a config.json: itself), found without running it."""
    if hf.is_config_file(reference):
        path = Path(reference)
        if not path.is_file():
            raise ValueError(f"no such file {reference}" if not path.exists() else f"{reference} is not a file")
        return path
    location, _ = _split(reference)
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"no such file {location}" if not path.exists() else f"{location} is not a file")
        return path
    _working_directory_importable()
    try:
        found = importlib.util.find_spec(location)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ValueError(f"no module named {location!r} on sys.path or in the working directory")
    return Path(found.origin)


def source_digest(reference: str) -> str:
    """SHA-1 of the bytes of the factory's source file (a config.json's with the transformers version
    that builds it): a changed file is another model."""
    if hf.is_config_file(reference):
        return hf.digest(source_file(reference))
    return hashlib.sha1(source_file(reference).read_bytes()).hexdigest()


def _working_directory_importable() -> None:
    """Module names are found in the working directory too (the `phaze` script does not add it)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def exit_call(stop: SystemExit) -> str:
    """The `sys.exit(...)` call that raised `stop`, as the user wrote it."""
    return "sys.exit()" if stop.code is None else f"sys.exit({stop.code!r})"


def _module(reference: str) -> ModuleType:
    """The factory's module, imported (a file: loaded again when its bytes changed)."""
    location, _ = _split(reference)
    path = source_file(reference)
    try:
        if not location.endswith(".py"):
            return importlib.import_module(location)
        key = (path.resolve(), source_digest(reference))
        if key not in _LOADED:
            name = "phaze_factory_" + key[1][:12] + "_" + re.sub(r"\W", "_", path.stem)
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling look their classes up there
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            _LOADED[key] = module
        return _LOADED[key]
    except Exception as error:  # the user's code: any error is theirs
        raise ValueError(f"importing {location} raised {_first_line(error)}") from None
    except SystemExit as stop:  # not phaze's exit: the command would end without a word
        raise ValueError(f"importing {location} called {exit_call(stop)}") from None


def factory_function(reference: str) -> Callable[..., object]:
    """The factory function; ValueError naming what is missing."""
    location, name = _split(reference)
    module = _module(reference)
    function = getattr(module, name, None)
    if function is None:
        names = [key for key, value in vars(module).items() if callable(value) and not key.startswith("_")]
        match = difflib.get_close_matches(name, names, n=1)
        raise ValueError(f"{location} has no function {name!r}" + (f"; did you mean {match[0]}?" if match else ""))
    if not callable(function):
        raise ValueError(f"{location}:{name} is a {type(function).__name__}, not a function")
    return function


def _parameters(function: Callable[..., object]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return {}


def takes_width(reference: str) -> bool:
    """Whether the factory builds tensor-parallel shards (takes `tensor_parallel_width`)."""
    if hf.is_config_file(reference):
        return False
    return "tensor_parallel_width" in _parameters(factory_function(reference))


def default_sequence_length(reference: str) -> int | None:
    """The default of the factory's `sequence_length` parameter (None: it takes none)."""
    if hf.is_config_file(reference):
        return None
    parameter = _parameters(factory_function(reference)).get("sequence_length")
    if parameter is None:
        return None
    if parameter.default is inspect.Parameter.empty:
        raise ValueError("sequence_length: the function's parameter needs a default, the model's default sequence "
                         "length")
    return parameter.default


def call_factory(reference: str, sequence_length: int, width: int = 1, rank: int = 0) -> nn.Module:
    """The module the factory builds on the meta device at `sequence_length`, width and rank (a
    config.json: the model `transformers` builds, `graph_extract.hf`)."""
    if hf.is_config_file(reference):
        return hf.build(source_file(reference))
    function = factory_function(reference)
    parameters = _parameters(function)
    for name, parameter in parameters.items():
        if (name not in KEYWORDS and parameter.default is inspect.Parameter.empty
                and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)):
            raise ValueError(f"{reference.rpartition(':')[2]}: parameter {name!r} has no default; phaze passes only "
                             f"{', '.join(KEYWORDS)}")
    given = {"sequence_length": sequence_length, "tensor_parallel_width": width, "rank": rank}
    try:
        with torch.device("meta"):
            model = function(**{name: value for name, value in given.items() if name in parameters})
    except Exception as error:  # the user's code
        raise ValueError(f"{reference.rpartition(':')[2]} raised {_first_line(error)}") from None
    except SystemExit as stop:
        raise ValueError(f"{reference.rpartition(':')[2]} called {exit_call(stop)}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"{reference.rpartition(':')[2]} returned {type(model).__name__} {model!r:.40}, not a torch.nn.Module")
    if "input_ids" not in _parameters(model.forward):
        raise ValueError(f"{type(model).__name__}.forward takes no input_ids; phaze calls it with input_ids and "
                         "labels")
    return model


#: The blocks' path of a module without a list of blocks: no operator's module path starts with
#: "." (`graph_extract.trace._layer_of`), so every operator is in layer 0.
NO_BLOCKS = ""


def block_list(model: nn.Module) -> str | None:
    """`find_blocks`, or None when the module has no ModuleList whose children are all of one class."""
    lists = [path for path, module in model.named_modules() if isinstance(module, nn.ModuleList) and len(module)
             and len({type(child) for child in module}) == 1]
    return find_blocks(model) if lists else None


def find_blocks(model: nn.Module) -> str:
    """Path of the blocks' ModuleList: of the outermost ModuleLists whose children are all of one
    class, the longest; ValueError if there is none or two are longest."""
    lists = [path for path, module in model.named_modules() if isinstance(module, nn.ModuleList) and len(module)
             and len({type(child) for child in module}) == 1]
    outermost = [path for path in lists if not any(path.startswith(f"{other}.") for other in lists if other)]
    if not outermost:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of transformer blocks (children all of one "
                         "class)")
    longest = max(len(model.get_submodule(path)) for path in outermost)
    candidates = [path for path in outermost if len(model.get_submodule(path)) == longest]
    if len(candidates) > 1:
        raise ValueError(f"two nn.ModuleLists of {longest} blocks of one class ({candidates[0]}, {candidates[1]}); "
                         "phaze needs one list of transformer blocks")
    return candidates[0]


def _check_blocks_alike(model: nn.Module, blocks: str) -> None:
    """Every block holds parameters of the first block's shapes (the last traced block is copied)."""
    modules = list(model.get_submodule(blocks))
    first = [(name, tuple(p.shape)) for name, p in modules[0].named_parameters()]
    for index, block in enumerate(modules[1:], start=1):
        if [(name, tuple(p.shape)) for name, p in block.named_parameters()] != first:
            raise ValueError(f"{blocks}.{index}: its parameters differ from those of {blocks}.0; phaze traces two "
                             "blocks and copies the last for the others")


def build(reference: str, sequence_length: int, width: int, blocks: int) -> tuple[nn.Module, str]:
    """The factory's rank-0 model at `width` cut to its first `blocks` blocks, and the blocks' path
    (a module without a block list: whole, and `NO_BLOCKS`)."""
    if hf.is_config_file(reference):
        model = hf.build(source_file(reference), blocks)
        return model, find_blocks(model)
    model = call_factory(reference, sequence_length, width)
    path = block_list(model)
    if path is None:
        return model, NO_BLOCKS
    built = model.get_submodule(path)
    if len(built) < blocks:
        raise ValueError(f"num_layers: the factory builds {len(built)} block(s), {blocks} are traced")
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, nn.ModuleList(list(built)[:blocks]))
    return model, path


def model_inputs(model: nn.Module, micro_batch_size: int, sequence_length: int) -> dict[str, torch.Tensor]:
    """input_ids, and labels if the forward takes them: [micro-batch, sequence] int64 on the meta device."""
    names = ("input_ids", "labels") if "labels" in _parameters(model.forward) else ("input_ids",)
    return {name: torch.empty((micro_batch_size, sequence_length), dtype=torch.long, device="meta") for name in names}


def _config_value(config: object, key: str) -> object:
    if isinstance(config, dict):
        return config.get(key)
    return getattr(config, key, None)


def _name(config: object, reference: str) -> str:
    """The last part of config.name_or_path (Hugging Face's), else the function's name; characters a
    file name cannot take become '-'."""
    given = _config_value(config, "name_or_path") or _config_value(config, "_name_or_path")
    raw = str(given).rstrip("/").rpartition("/")[2] if given else reference.rpartition(":")[2]
    return "-".join(re.findall(r"[A-Za-z0-9._-]+", raw)).strip(".") or reference.rpartition(":")[2]


def _token_embedding(model: nn.Module) -> tuple[int, int]:
    """(rows, columns) of the largest embedding table: the vocabulary and the hidden size."""
    tables = [tuple(module.weight.shape) for module in model.modules()
              if isinstance(module, (nn.Embedding, VocabParallelEmbedding))]
    if not tables:
        raise ValueError(f"{type(model).__name__} has no token embedding (nn.Embedding or "
                         "graph_extract.parallel.VocabParallelEmbedding)")
    return max(tables)


def _positive(config: object, key: str, default: object = None) -> int:
    value = _config_value(config, key)
    value = default if value is None else value
    if value is None:
        raise ValueError(f"config.{key}: missing; the module needs a `config` attribute with {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.{key}: must be a positive integer, got {value!r}")
    return value


def factory_spec(reference: str) -> ModelSpec:
    """The ModelSpec facts of the factory's model (built at width 1 and the default sequence):

    num_layers: blocks in the ModuleList; vocab_size, hidden_size: the largest embedding table;
    num_heads: config.num_attention_heads; num_kv_heads: config.num_key_value_heads (default: the
    heads); ffn_hidden_size: config.intermediate_size (default: the largest dimension of a block's
    parameters); max_position_embeddings: config.max_position_embeddings (default: the sequence_length
    default); default_sequence_length: the sequence_length default, else min(positions, 8192);
    name: config.name_or_path's last part, else the function's name; kv_channels: config.head_dim
    when it is not hidden / heads; num_experts and experts_per_token: config.num_local_experts (or
    num_experts, n_routed_experts) and num_experts_per_tok, for expert parallelism and the active
    parameters. Other fields keep their defaults and are not read: the module decides the graph.

    A module without a block list (`block_list`): num_layers is `OPERATOR_LAYERS` (the operator
    groups asked for), num_heads 1 (no config needed for it), ffn_hidden_size config's or the
    largest dimension of its parameters.
    """
    sequence = default_sequence_length(reference)
    model = call_factory(reference, sequence if sequence is not None else MAX_DEFAULT_SEQUENCE_LENGTH)
    blocks = block_list(model)
    if blocks is not None:
        _check_blocks_alike(model, blocks)
    config = getattr(model, "config", None)
    vocab, hidden = _token_embedding(model)
    heads = _positive(config, "num_attention_heads") if blocks is not None else 1
    kv_heads = _positive(config, "num_key_value_heads", heads) if blocks is not None else heads
    block = model.get_submodule(blocks)[0] if blocks is not None else model
    ffn = _positive(config, "intermediate_size", max((size for p in block.parameters() for size in p.shape), default=None))
    positions = _positive(config, "max_position_embeddings", sequence)
    sequence = sequence if sequence is not None else min(positions, MAX_DEFAULT_SEQUENCE_LENGTH)
    if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 < sequence <= positions:
        raise ValueError(f"sequence_length: the default {sequence!r} must be a positive integer at most "
                         f"config.max_position_embeddings={positions}")
    if hidden % heads:
        raise ValueError(f"config.num_attention_heads: {heads} heads do not divide the hidden size {hidden} (the "
                         "token embedding's width)")
    if heads % kv_heads:
        raise ValueError(f"config.num_key_value_heads: {kv_heads} does not divide num_attention_heads={heads}")
    head_dim = _config_value(config, "head_dim")
    experts = next((value for key in EXPERT_COUNT_KEYS if isinstance(value := _config_value(config, key), int)
                    and not isinstance(value, bool) and value > 1), None)
    return ModelSpec(
        name=_name(config, reference),
        num_layers=len(model.get_submodule(blocks)) if blocks is not None else OPERATOR_LAYERS,
        hidden_size=hidden,
        num_heads=heads,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=positions,
        default_sequence_length=sequence,
        num_kv_heads=None if kv_heads == heads else kv_heads,
        kv_channels=head_dim if isinstance(head_dim, int) and head_dim * heads != hidden else None,
        num_experts=experts,
        experts_per_token=_positive(config, "num_experts_per_tok") if experts else 2,
        factory=reference,
    )
