"""Proof that the tensor-parallel shards we cost compute the unsharded model.

On a tiny configuration of a model family, with real random weights on the CPU, the t shards'
traced graphs run side by side, node by node; each all-reduce is replaced by the real reduction
over the t shards (sum, or max). The shards' outputs must equal the unsharded model's outputs. The
ranks are a plan's (`graph_extract.plan_pass.apply_plan` with the real weights): one given, or the
model's own. A config.json is shrunk first (`graph_extract.hf_shrink`: its family and structure, two
small blocks); a result can be kept in a cache folder, keyed by what it depends on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn

from graph_extract import factory, hf
from graph_extract.export import export
from graph_extract.hf_shrink import shrunk
from graph_extract.extraction import is_exported
from graph_extract.parallel import all_reduce
from graph_extract.plan import Plan, derived_plan, read_plan
from graph_extract.plan_pass import apply_plan
from graph_extract.transformer import TransformerModel, example_inputs
from graph_extract.zoo import ModelSpec, get_spec
from phaze_common.files import atomic_write, read_cache_file
from phaze_common.log import warn_once

#: Small enough to run in a fraction of a second, divisible by widths up to 8.
TINY = dict(
    num_layers=2,
    hidden_size=64,
    num_heads=8,
    ffn_hidden_size=160,
    vocab_size=1000,
    max_position_embeddings=32,
    default_sequence_length=16,
)

MICRO_BATCH_SIZE = 2
#: Tokens per sample of a config.json shrunk for verification (`graph_extract.hf_shrink`).
SEQUENCE = TINY["default_sequence_length"]
#: Bump when what a verification computes changes: cached results of another version are not read.
CACHE_VERSION = 1


@dataclass(frozen=True)
class VerificationResult:
    model: str
    tensor_parallel_width: int
    max_abs_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_abs_error < self.tolerance


def _outputs(value: object) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def run_shards_in_lockstep(modules: list[fx.GraphModule], inputs: list[torch.Tensor]) -> list[object]:
    """Interpret the shards' graphs node by node, performing every all-reduce across the shards."""
    interpreters = [fx.Interpreter(module) for module in modules]
    for interpreter in interpreters:
        interpreter.env, interpreter.args_iter = {}, iter(inputs)
    results: list[object] = []
    for nodes in zip(*(module.graph.nodes for module in modules)):
        if len({node.name for node in nodes}) != 1:
            raise AssertionError(f"shard graphs differ at {[node.name for node in nodes]}")
        if nodes[0].target is all_reduce and nodes[0].args[1] > 1:  # group size 1: a local no-op
            values = torch.stack([interpreter.env[node.args[0]] for interpreter, node in zip(interpreters, nodes)])
            reduce_op = nodes[0].args[2] if len(nodes[0].args) > 2 else "sum"
            reduced = values.amax(dim=0) if reduce_op == "max" else values.sum(dim=0)
            for interpreter, node in zip(interpreters, nodes):
                interpreter.env[node] = reduced.clone()
            continue
        results = [interpreter.run_node(node) for interpreter, node in zip(interpreters, nodes)]
        for interpreter, node, value in zip(interpreters, nodes, results):
            interpreter.env[node] = value
    return results  # the output node's value on every shard


def plan_ranks(model: nn.Module, inputs: Mapping[str, torch.Tensor], plan: Plan | None, width: int,
               blocks: str | None = None) -> list[fx.GraphModule]:
    """The `width` ranks' graphs of `model` (its real tensors, each rank its shares) under `plan`
    (None: the plan derived by structure from the blocks at `blocks`), from the one export."""
    graph = export(model, inputs)
    plan = derived_plan(graph, blocks) if plan is None else plan
    values = {**dict(graph.named_parameters(remove_duplicate=False)), **dict(graph.named_buffers(remove_duplicate=False))}
    return [apply_plan(graph, plan, width, rank, values) for rank in range(width)]


def lockstep_error(model: nn.Module, inputs: Mapping[str, torch.Tensor], ranks: list[fx.GraphModule]) -> float:
    """The largest difference between `model(**inputs)` and what the rank graphs `ranks` give run in
    lockstep; infinite where a rank gives other outputs in number or shape, or not a number."""
    with torch.no_grad():
        expected = _outputs(model(**inputs))
        per_rank = run_shards_in_lockstep(ranks, list(inputs.values()))
    error = 0.0
    for outputs in per_rank:
        outputs = _outputs(outputs)
        if len(outputs) != len(expected) or any(got.shape != want.shape for got, want in zip(outputs, expected)):
            return math.inf
        for got, want in zip(outputs, expected):
            difference = (got - want).abs().max().item()
            error = max(error, difference if difference == difference else math.inf)
    return error


def verify_plan(model: nn.Module, inputs: Mapping[str, torch.Tensor], plan: Plan | None, width: int,
                blocks: str) -> float:
    """The largest difference between `model(**inputs)` (real tensors) and its `width` ranks' graphs
    under `plan` (None: the plan derived by structure, `graph_extract.plan.derived_plan`) run in
    lockstep from the one export (`plan_ranks`, `lockstep_error`)."""
    return lockstep_error(model, inputs, plan_ranks(model, inputs, plan, width, blocks))


def _exported(spec: ModelSpec, seed: int) -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    """An exported model with random weights on the CPU, its inputs and its blocks' path: a config.json
    shrunk (`graph_extract.hf.build_shrunk`, `SEQUENCE` tokens), a factory's model as it builds it
    (a small one: every weight is allocated)."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        if hf.is_config_file(spec.factory):
            model = hf.build_shrunk(factory.source_file(spec.factory), SEQUENCE)
            vocabulary = model.config.vocab_size
        else:
            function = factory.factory_function(spec.factory)
            keywords = _factory_keywords(function, spec)
            model = function(**keywords)
            vocabulary = keywords.get("vocab_size", spec.vocab_size)
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    inputs = {name: torch.randint(0, vocabulary, tuple(value.shape), generator=generator)
              for name, value in factory.model_inputs(model, MICRO_BATCH_SIZE, _sequence(spec)).items()}
    return model, inputs, factory.find_blocks(model)


def _keyword_defaults(function) -> dict[str, object]:
    return {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()
            if parameter.default is not inspect.Parameter.empty}


def _sized(function) -> bool:
    """Whether a factory function takes its sizes as keywords named as config.json names them (with
    defaults): `hidden_size`, `num_attention_heads`, `num_hidden_layers`, `vocab_size`."""
    return {"hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"} <= set(_keyword_defaults(function))


def _factory_keywords(function, spec: ModelSpec) -> dict[str, object]:
    """A factory's keywords for verification: its sizes shrunk by the config.json rule
    (`graph_extract.hf_shrink.shrunk` of its defaults, `SEQUENCE` tokens) when it takes them as
    keywords (`_sized`), else its sequence only (the model built at its own sizes)."""
    defaults = _keyword_defaults(function)
    if not _sized(function):
        return {"sequence_length": spec.default_sequence_length} if "sequence_length" in defaults else {}
    small = shrunk({**defaults, "max_position_embeddings": spec.max_position_embeddings}, SEQUENCE)
    keywords = {name: small[name] for name in defaults if name in small}
    return {**keywords, "sequence_length": SEQUENCE} if "sequence_length" in defaults else keywords


def _sequence(spec: ModelSpec) -> int:
    """The tokens per sample a verification runs: `SEQUENCE` for a config.json or a factory taking its
    sizes as keywords (shrunk for it), else the model's default."""
    if spec.factory is not None and (hf.is_config_file(spec.factory)
                                     or _sized(factory.factory_function(spec.factory))):
        return SEQUENCE
    return spec.default_sequence_length


def tiny_spec(spec: ModelSpec, overrides: Mapping[str, object]) -> ModelSpec:
    """A zoo model's family at `TINY` sizes (`verify_tensor_parallel`), then `overrides`."""
    tiny = dict(TINY)
    if spec.num_kv_heads is not None:
        tiny["num_kv_heads"] = max(TINY["num_heads"] * spec.num_kv_heads // spec.num_heads, 1)
    if spec.num_experts is not None:  # at most 8 experts, a dense first block if it has dense ones
        tiny.update(num_experts=min(spec.num_experts, 8), experts_per_token=min(spec.experts_per_token, 2),
                    first_dense_layers=min(spec.first_dense_layers, 1))
        if spec.moe_ffn_hidden_size is not None:
            tiny["moe_ffn_hidden_size"] = TINY["ffn_hidden_size"] // 4
    if spec.latent_attention:
        tiny.update(q_lora_rank=None if spec.q_lora_rank is None else 24, kv_lora_rank=16, qk_nope_head_dim=8,
                    qk_rope_head_dim=4, v_head_dim=8)
    return spec.with_overrides(**{**tiny, **overrides})


def zoo_model(spec: ModelSpec, width: int, seed: int = 0, device: str = "cpu"
              ) -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    """The zoo's model of `spec` (its vocabulary padded for `width`) on `device` with random weights
    from `seed`, its inputs and its blocks' path."""
    sequence_length = spec.default_sequence_length
    torch.manual_seed(seed)
    with torch.device(device):
        model = TransformerModel(spec, sequence_length, spec.padded_vocab_size(width), MICRO_BATCH_SIZE).eval()
    inputs = example_inputs(model, micro_batch_size=MICRO_BATCH_SIZE, sequence_length=sequence_length, device=device,
                            seed=seed)
    return model, inputs, "layers"


def verify_tensor_parallel(
    model: str | ModelSpec, width: int, tolerance: float = 1e-4, seed: int = 0, *,
    plan: Plan | str | Path | None = None, cache_dir: str | Path | None = None, **overrides: object
) -> VerificationResult:
    """Run a tiny configuration of `model`'s family sharded `width` ways under `plan` against the
    unsharded model (`verify_plan`).

    A zoo model is built at `TINY` sizes (a grouped-query model keeps its query heads per key/value
    head, at least one key/value head). An exported model (a factory without tensor_parallel_width,
    a config.json `transformers` builds) runs with random weights: a config.json shrunk
    (`graph_extract.hf_shrink`), a factory's model as built. `plan` (a Plan or a plan file) names
    module paths of that tiny model, which has the full model's structure with fewer, smaller blocks;
    None: the model's own (its `plan` file, else the plan derived by structure).

    With `cache_dir`, the result is kept in `cache_dir/verified/` under its key (`verification_key`)
    and read back instead of running the model again.
    """
    spec = get_spec(model)
    if isinstance(plan, (str, Path)):
        plan = read_plan(plan)
    if is_exported(spec):
        spec = spec.with_overrides(**overrides)
        plan = read_plan(spec.plan) if plan is None and spec.plan is not None else plan
    else:
        spec = tiny_spec(spec, overrides)
    key = verification_key(spec, plan, width, seed) if cache_dir is not None else None
    path = cache_file(Path(cache_dir), key) if key is not None else None
    if path is not None and (error := _cached_error(path, key)) is not None:
        return VerificationResult(spec.name, width, error, tolerance)
    model, inputs, blocks = _exported(spec, seed) if is_exported(spec) else zoo_model(spec, width, seed)
    error = verify_plan(model, inputs, plan, width, blocks)
    if path is not None:
        _store(path, key, spec.name, width, error)
    return VerificationResult(spec.name, width, error, tolerance)


# the cache of verifications ---------------------------------------------------------------------

def verification_key(spec: ModelSpec, plan: Plan | None, width: int, seed: int) -> dict:
    """What a verification's result depends on: the model (an exported one: its source file's digest,
    its function and sequence; a zoo one: its tiny spec), the plan's styles (None: `derived`), the
    width, the seed, the micro-batch, torch's version and `CACHE_VERSION`."""
    if is_exported(spec):
        reference = spec.factory
        model = {"source": factory.source_digest(reference), "sequence_length": _sequence(spec),
                 "function": None if hf.is_config_file(reference) else reference.rpartition(":")[2]}
    else:
        model = dataclasses.asdict(spec)
    return {"version": CACHE_VERSION, "model": model,
            "plan": "derived" if plan is None else [list(pair) for pair in plan.styles],
            "tensor_parallel_width": width, "seed": seed, "micro_batch_size": MICRO_BATCH_SIZE,
            "torch": torch.__version__}


def cache_file(cache_dir: Path, key: dict) -> Path:
    """`cache_dir/verified/<SHA-1 of the key>.json` (the model's name is not part of the key: a
    config.json copied elsewhere is the same model)."""
    return cache_dir / "verified" / f"{hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()}.json"


def _cached_error(path: Path, key: dict) -> float | None:
    """The error a cache file holds for `key`; None: no file, another key's, or damaged (set aside)."""
    def read(file: Path) -> float | None:
        record = json.loads(file.read_text())
        error = record["max_abs_error"]
        if not isinstance(error, (int, float)) or isinstance(error, bool):
            raise ValueError(f"max_abs_error {error!r} is not a number")
        return float(error) if record.get("key") == json.loads(json.dumps(key)) else None

    return read_cache_file(path, read, (KeyError, TypeError), "verification cache: cannot read %s (%s)")


def _store(path: Path, key: dict, name: str, width: int, error: float) -> None:
    record = {"key": key, "model": name, "tensor_parallel_width": width, "max_abs_error": error}
    try:
        atomic_write(path, json.dumps(record, indent=1))
    except OSError as problem:
        warn_once(("unwritable", path.parent), "verification cache: cannot write to %s (%s); results are not "
                  "stored", path.parent, problem.strerror or problem)
