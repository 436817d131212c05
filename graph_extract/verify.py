"""Proof that the tensor-parallel shards we cost compute the unsharded model.

On a tiny configuration of a model family, with real random weights on the CPU, the t shards'
traced graphs run side by side, node by node; each all-reduce is replaced by the real reduction
over the t shards (sum, or max). The shards' outputs must equal the unsharded model's outputs. An
exported model's ranks are its plan's (`graph_extract.plan.apply_plan` with the real weights).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import fx, nn

from graph_extract import factory, hf
from graph_extract.export import export
from graph_extract.extraction import is_exported
from graph_extract.parallel import all_reduce
from graph_extract.plan import Plan, derived_plan, read_plan
from graph_extract.plan_pass import apply_plan
from graph_extract.transformer import TransformerModel, example_inputs
from graph_extract.zoo import ModelSpec, get_spec

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


def _verify_exported(spec: ModelSpec, width: int, tolerance: float, seed: int) -> VerificationResult:
    """An exported model (a factory, a config.json) built with random weights on the CPU as its
    factory builds it (a small one: every weight is allocated), against its plan's ranks."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = hf.build_real(spec.factory) if hf.is_config_file(spec.factory) else \
            factory.factory_function(spec.factory)(**({"sequence_length": spec.default_sequence_length}
                                                       if factory.default_sequence_length(spec.factory) else {}))
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    inputs = {name: torch.randint(0, spec.vocab_size, tuple(value.shape), generator=generator)
              for name, value in factory.model_inputs(model, MICRO_BATCH_SIZE, spec.default_sequence_length).items()}
    plan = read_plan(spec.plan) if spec.plan is not None else None
    error = verify_plan(model, inputs, plan, width, factory.find_blocks(model))
    return VerificationResult(spec.name, width, error, tolerance)


def verify_tensor_parallel(
    model: str | ModelSpec, width: int, tolerance: float = 1e-4, seed: int = 0, **overrides: int
) -> VerificationResult:
    """Run a tiny configuration of `model`'s family sharded `width` ways against the unsharded model.

    A grouped-query model keeps its query heads per key/value head (at least one key/value head).
    An exported model (a factory without tensor_parallel_width, a config.json `transformers`
    builds) runs as built, with random weights, under its plan (`verify_plan`).
    """
    spec = get_spec(model)
    if is_exported(spec):
        return _verify_exported(spec.with_overrides(**overrides), width, tolerance, seed)
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
    spec = spec.with_overrides(**{**tiny, **overrides})
    sequence_length = spec.default_sequence_length
    torch.manual_seed(seed)
    full = TransformerModel(spec, sequence_length, spec.padded_vocab_size(width), MICRO_BATCH_SIZE).eval()
    inputs = example_inputs(full, micro_batch_size=MICRO_BATCH_SIZE, sequence_length=sequence_length, device="cpu", seed=seed)
    error = verify_plan(full, inputs, None, width, "layers")
    return VerificationResult(spec.name, width, error, tolerance)
