"""`extract`: model name -> rank 0's graphs at one tensor-parallel width, with an on-disk cache.

A model is exported once per micro-batch, sequence (and padded vocabulary) and split by its plan
at each width (`graph_extract.export`, `graph_extract.plan`); a factory that builds its own shards
is traced by torch.fx at each width (`graph_extract.trace`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from phaze_common.checks import InputError, positive_integer
from phaze_common.files import atomic_write, read_cache_file
from phaze_common.log import warn_once
from graph_extract.layergraph import LayerEdge, LayerGraph, build_layer_graph
from graph_extract.opgraph import TRAINING_DTYPE_BYTES, OpGraph, weight_sizes
from graph_extract.regions import attention_core, recompute_modules
from graph_extract.repeats import repeat_groups as find_repeat_groups
from graph_extract.serialize import (
    FORMAT_VERSION,
    dumps,
    layer_graph_from_dict,
    layer_graph_to_dict,
    op_graph_from_dict,
    op_graph_to_dict,
)
from graph_extract.zoo import ModelSpec, get_spec

if TYPE_CHECKING:
    import torch

#: Transformer blocks traced (after a mixture's first dense blocks). The blocks of a zoo model are one
#: module class with one shape, so every further block is the last traced one again: its layer is
#: copied, not traced.
TRACED_BLOCKS = 2


@dataclass(frozen=True)
class ExtractedModel:
    """The graphs of rank 0 of `spec` at one tensor-parallel width, for one micro-batch shape.

    `layer_graph` holds every layer (embedding 0, blocks 1..L, head L+1). `op_graph` holds the
    traced ones: the embedding, the first `TRACED_BLOCKS` blocks and the head (layer id L+1); every
    repeat group has its representative (first member) there.
    """

    spec: ModelSpec
    micro_batch_size: int
    sequence_length: int
    tensor_parallel_width: int
    op_graph: OpGraph
    layer_graph: LayerGraph
    repeat_groups: tuple[tuple[int, ...], ...]
    parameter_count: int  # the whole model: all shards, each parameter once
    parameters_per_device: int  # what rank 0 holds when it holds every layer (a tied weight once)
    active_parameter_count: int  # used per token: parameter_count without the experts a token skips

    @cached_property
    def attention_core(self) -> frozenset[int]:
        """Ids of the operators of the attention cores (see `graph_extract.regions`)."""
        return attention_core(self.op_graph)

    @cached_property
    def recompute_modules(self) -> dict[str, frozenset[int]]:
        """Ids of the operators of each recompute module but the attention core (`graph_extract.regions`)."""
        return recompute_modules(self.op_graph)


def _kv_heads_allow(spec: ModelSpec, width: int) -> bool:
    """The key/value heads split over `width` ranks (it divides them) or are replicated (they divide it)."""
    return spec.kv_heads % width == 0 or width % spec.kv_heads == 0


def valid_tensor_parallel_widths(model: str | ModelSpec, maximum: int) -> tuple[int, ...]:
    """Powers of two up to `maximum` that divide the head count (and so the hidden and FFN sizes) and
    that the key/value heads allow."""
    spec = get_spec(model)
    widths, width = [], 1
    while width <= maximum:
        if spec.num_heads % width == 0 and spec.ffn_hidden_size % width == 0 and _kv_heads_allow(spec, width):
            widths.append(width)
        width *= 2
    return tuple(widths)


def check_request(spec: ModelSpec, micro_batch_size: object, sequence_length: object, width: object) -> None:
    """Raise InputError naming the field when the request cannot be extracted."""
    for field, value in (("micro_batch_size", micro_batch_size), ("sequence_length", sequence_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{field}: must be a positive integer, got {value!r}")
    if sequence_length > spec.max_position_embeddings:
        raise InputError(
            f"sequence_length: {spec.name} supports at most {spec.max_position_embeddings}, got {sequence_length}"
        )
    positive_integer("tensor_parallel_width", width)
    if width & (width - 1):
        raise InputError(f"tensor_parallel_width: must be a power of two, got {width!r}")
    valid = valid_tensor_parallel_widths(spec, width)
    if spec.num_heads % width == 0 and not _kv_heads_allow(spec, width):
        raise InputError(
            f"tensor_parallel_width: {width} and the {spec.kv_heads} key/value heads of {spec.name} do not divide "
            f"one another; allowed: {', '.join(map(str, valid))}"
        )
    if width not in valid:
        raise InputError(
            f"tensor_parallel_width: {width} does not divide the {spec.num_heads} heads of {spec.name}; "
            f"valid: {', '.join(map(str, valid))}"
        )


def is_exported(spec: ModelSpec) -> bool:
    """Whether `spec`'s graphs come from `torch.export` and a plan: a factory that builds the whole
    model (no tensor_parallel_width), or a config.json transformers builds."""
    if spec.factory is None:
        return False
    from graph_extract import factory  # torch: loaded for a factory's model only

    return not factory.takes_width(spec.factory)


def parameter_count(model: torch.nn.Module, width: int) -> int:
    """Parameters of all shards together: a split parameter counts once per distinct slice (width /
    its replicas), a replicated one once."""
    return sum(
        p.numel() * (width // getattr(p, "replicas", 1) if getattr(p, "partition_dim", None) is not None else 1)
        for p in model.parameters()
    )


#: Index of num_kv_heads, the first field added to ModelSpec after graphs were first cached.
_FIRST_LATE_FIELD = [field.name for field in dataclasses.fields(ModelSpec)].index("num_kv_heads")


def cache_path(cache_dir: Path, spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int) -> Path:
    """One file per (model, micro-batch, sequence length, width, format); the spec hash covers overrides.

    Fields added after the first release (num_kv_heads onwards) hash only when some field from there
    on differs from its default: the key of a spec without them, and so the graphs cached before
    they existed, stay valid. A factory's key covers its source file's bytes: a changed file is
    traced again.
    """
    fields = dataclasses.astuple(spec)
    defaults = [field.default for field in dataclasses.fields(spec)]
    length = len(fields)
    while length > _FIRST_LATE_FIELD and fields[length - 1] == defaults[length - 1]:
        length -= 1
    fields = fields[:length]
    if spec.factory is not None:
        from graph_extract import factory  # torch: loaded for a factory's model only

        fields += (factory.source_digest(spec.factory),)
    if spec.plan is not None:
        from graph_extract.plan import plan_digest  # torch.distributed.tensor: loaded when first needed

        fields += (plan_digest(spec.plan, width),)
    spec_hash = hashlib.sha1(repr(fields).encode()).hexdigest()[:8]
    name = f"{spec.name}_mbs{micro_batch_size}_seq{sequence_length}_tp{width}_v{FORMAT_VERSION}_{spec_hash}.json"
    return Path(cache_dir) / "graphs" / name


def _to_record(extracted: ExtractedModel) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "spec": dataclasses.asdict(extracted.spec),
        "micro_batch_size": extracted.micro_batch_size,
        "sequence_length": extracted.sequence_length,
        "tensor_parallel_width": extracted.tensor_parallel_width,
        "parameter_count": extracted.parameter_count,
        "parameters_per_device": extracted.parameters_per_device,
        "active_parameter_count": extracted.active_parameter_count,
        "repeat_groups": [list(group) for group in extracted.repeat_groups],
        "layer_graph": layer_graph_to_dict(extracted.layer_graph),
        "op_graph": op_graph_to_dict(extracted.op_graph),
    }


def _from_record(record: dict) -> ExtractedModel:
    if record.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format_version: {record.get('format_version')!r}, expected {FORMAT_VERSION}")
    return ExtractedModel(
        spec=ModelSpec(**record["spec"]),
        micro_batch_size=record["micro_batch_size"],
        sequence_length=record["sequence_length"],
        tensor_parallel_width=record["tensor_parallel_width"],
        op_graph=op_graph_from_dict(record["op_graph"]),
        layer_graph=layer_graph_from_dict(record["layer_graph"]),
        repeat_groups=tuple(tuple(group) for group in record["repeat_groups"]),
        parameter_count=record["parameter_count"],
        parameters_per_device=record["parameters_per_device"],
        active_parameter_count=record.get("active_parameter_count", record["parameter_count"]),
    )


def _trace(spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int) -> ExtractedModel:
    from graph_extract import factory
    from graph_extract.trace import trace

    traced = spec.with_overrides(num_layers=traced_blocks(spec))
    if spec.factory is None or is_exported(spec):
        return _exported(spec, traced, micro_batch_size, sequence_length, width)
    model, blocks = factory.build(spec.factory, sequence_length, width, traced.num_layers)
    try:
        module = trace(model, factory.model_inputs(model, micro_batch_size, sequence_length))
    except SystemExit as stop:  # a factory's forward: the command would end without a word
        raise ValueError(f"tracing the model with torch.fx: its forward called {factory.exit_call(stop)}") from None
    return _extracted(spec, traced, micro_batch_size, sequence_length, width, model, module, blocks, width)


def exported_model(spec: ModelSpec, micro_batch_size: int, sequence_length: int,
                   width: int) -> tuple[torch.nn.Module, str, torch.fx.GraphModule]:
    """The unsharded model of `spec`'s traced blocks (`traced_blocks`), its blocks' path and its one
    export (`graph_extract.export`), once per process and shape: the zoo's model (its vocabulary
    padded for `width`, Megatron's rule), a factory's or a config.json's."""
    from graph_extract import factory

    traced = spec.with_overrides(num_layers=traced_blocks(spec))
    if spec.factory is None:
        return _export_zoo(traced, micro_batch_size, sequence_length, spec.padded_vocab_size(width))
    return _export(spec.factory, factory.source_digest(spec.factory), micro_batch_size, sequence_length,
                   traced.num_layers)


def _exported(spec: ModelSpec, traced: ModelSpec, micro_batch_size: int, sequence_length: int,
              width: int) -> ExtractedModel:
    """Apply the model's plan at `width` (its plan file's, else `derived_plan`) to its one export."""
    from graph_extract.plan import derived_plan, read_plan  # torch.distributed.tensor: loaded here
    from graph_extract.plan_pass import apply_plan

    model, blocks, graph = exported_model(spec, micro_batch_size, sequence_length, width)
    plan = read_plan(spec.plan, width) if spec.plan is not None else derived_plan(graph, blocks)
    module = apply_plan(graph, plan, width)
    return _extracted(spec, traced, micro_batch_size, sequence_length, width, model, module, blocks, 1)


@lru_cache(maxsize=4)
def _export_zoo(traced: ModelSpec, micro_batch_size: int, sequence_length: int,
                padded_vocab: int) -> tuple[torch.nn.Module, str, torch.fx.GraphModule]:
    """The zoo's model of `traced`'s blocks, unsharded, and its export, once per process and shape."""
    import torch

    from graph_extract.export import export
    from graph_extract.transformer import TransformerModel, example_inputs

    with torch.device("meta"):
        model = TransformerModel(traced, sequence_length, padded_vocab, micro_batch_size)
    return model, "layers", export(model, example_inputs(model, micro_batch_size, sequence_length))


@lru_cache(maxsize=4)
def _export(reference: str, digest: str, micro_batch_size: int, sequence_length: int,
            blocks: int) -> tuple[torch.nn.Module, str, torch.fx.GraphModule]:
    """The factory's model cut to `blocks` blocks, its blocks' path and its export, once per process
    for each file version (`digest`) and input shape."""
    from graph_extract import factory
    from graph_extract.export import export

    model, path = factory.build(reference, sequence_length, 1, blocks)
    inputs = factory.model_inputs(model, micro_batch_size, sequence_length)
    try:
        return model, path, export(model, inputs)
    except SystemExit as stop:
        raise ValueError(f"exporting the model with torch.export: its forward called {factory.exit_call(stop)}"
                         ) from None


def _extracted(spec: ModelSpec, traced: ModelSpec, micro_batch_size: int, sequence_length: int, width: int,
               model: torch.nn.Module, module: torch.fx.GraphModule, blocks: str, built_width: int) -> ExtractedModel:
    """The graphs of rank 0's module `module` at `width`, the blocks beyond the traced ones copied;
    `model` is the module built at `built_width` (1: unsharded) whose parameters are counted. A
    module without blocks (`blocks` is `factory.NO_BLOCKS`) has its operators cut into at most
    spec.num_layers layers (`graph_extract.operator_layers`)."""
    from graph_extract.factory import NO_BLOCKS
    from graph_extract.operator_layers import operator_layers  # OR-Tools: loaded when tracing
    from graph_extract.trace import to_op_graph

    op_graph = to_op_graph(module, traced.num_layers, width, blocks)
    if blocks == NO_BLOCKS:  # every operator in layer 0: the operator groups are the layers
        op_graph, layer_graph = operator_layers(op_graph, spec.num_layers)
        count = parameter_count(model, built_width)
        return ExtractedModel(spec, micro_batch_size, sequence_length, width, op_graph, layer_graph,
                              find_repeat_groups(op_graph), count, sum(weight_sizes(op_graph.nodes).values()),
                              count - _skipped_expert_parameters(spec, layer_graph))
    layer_graph = _named_layers(build_layer_graph(op_graph, TRAINING_DTYPE_BYTES), traced.num_layers)
    groups = find_repeat_groups(op_graph)
    count, per_device = parameter_count(model, built_width), sum(weight_sizes(op_graph.nodes).values())
    extra = spec.num_layers - traced.num_layers
    if extra:
        last_block = sum(weight_sizes(node for node in op_graph.nodes if node.layer == traced.num_layers).values())
        op_graph, layer_graph, groups = _more_blocks(op_graph, layer_graph, groups, traced.num_layers, spec.num_layers)
        count += extra * parameter_count(model.get_submodule(blocks)[-1], built_width)
        per_device += extra * last_block
    return ExtractedModel(spec, micro_batch_size, sequence_length, width, op_graph, layer_graph, groups, count,
                          per_device, count - _skipped_expert_parameters(spec, layer_graph))


def _skipped_expert_parameters(spec: ModelSpec, layer_graph: LayerGraph) -> int:
    """Expert parameters of the whole model that a token does not use: (E − k)/E of them (each
    rank holds 1/t of every expert)."""
    if not spec.num_experts:
        return 0
    experts = sum(layer.expert_parameter_bytes for layer in layer_graph.layers) // TRAINING_DTYPE_BYTES
    return experts * layer_graph.tensor_parallel_width * (spec.num_experts - spec.experts_per_token) // spec.num_experts


def _named_layers(layer_graph: LayerGraph, blocks: int) -> LayerGraph:
    """The layers named by their place, whatever the model calls its modules: embedding (0),
    layers.<i> (block i + 1), head (blocks + 1); ValueError unless all of them were traced."""
    ids = tuple(layer.id for layer in layer_graph.layers)
    if ids != tuple(range(blocks + 2)):
        missing = sorted(set(range(blocks + 2)) - set(ids))
        what = {0: "before the first block (the embedding)", blocks + 1: "after the last block (the head)"}
        raise ValueError(f"layers: nothing traced {what.get(missing[0], f'in block {missing[0] - 1}')}; the forward "
                         "must embed the tokens, run every block once in order, then compute the head")
    names = ["embedding", *(f"layers.{k}" for k in range(blocks)), "head"]
    return dataclasses.replace(layer_graph, layers=tuple(
        dataclasses.replace(layer, name=name, kind="embedding" if name == "embedding" else "head" if name == "head"
                            else "block") for layer, name in zip(layer_graph.layers, names)))


def traced_blocks(spec: ModelSpec) -> int:
    """Blocks traced: the dense ones before the experts, then `TRACED_BLOCKS` (fewer in a shorter model)."""
    return min(spec.num_layers, (spec.first_dense_layers if spec.num_experts else 0) + TRACED_BLOCKS)


def _more_blocks(op_graph: OpGraph, layer_graph: LayerGraph, groups: tuple[tuple[int, ...], ...],
                 traced: int, blocks: int) -> tuple[OpGraph, LayerGraph, tuple[tuple[int, ...], ...]]:
    """The graphs of a model with `blocks` blocks from those of `traced`: the head's id moves to
    blocks + 1 and the last traced block, its edges and its repeat group are copied for the others."""
    last, old_head, head = traced, traced + 1, blocks + 1
    op_graph = dataclasses.replace(op_graph, nodes=tuple(
        dataclasses.replace(node, layer=head) if node.layer == old_head else node for node in op_graph.nodes))
    layers = [layer for layer in layer_graph.layers if layer.id <= last]
    copy = layer_graph.layer(last)
    layers += [dataclasses.replace(copy, id=k, name=f"layers.{k - 1}") for k in range(last + 1, head)]
    layers.append(dataclasses.replace(layer_graph.layer(old_head), id=head))
    edges = []
    for edge in layer_graph.edges:
        if edge.dest == old_head:  # into the head: from the embedding, or from the last blocks
            pairs = [(edge.source if edge.source == 0 else head - (old_head - edge.source), head)]
        elif edge.dest == last and edge.source == 0:  # from the embedding into every later block
            pairs = [(0, k) for k in range(last, head)]
        elif edge.dest == last and edge.source == last - 1:  # from each block into the next
            pairs = [(k - 1, k) for k in range(last, head)]
        elif edge.dest < last:
            pairs = [(edge.source, edge.dest)]
        else:
            raise ValueError(f"layer graph: edge {edge.source}->{edge.dest} has no copy rule for more blocks")
        edges += [LayerEdge(source, dest, edge.bytes) for source, dest in pairs]
    groups = tuple(
        tuple(head if member == old_head else member for member in group) + (tuple(range(last + 1, head)) if last in group else ())
        for group in groups
    )
    tied = tuple(dataclasses.replace(weight, first=head if weight.first == old_head else weight.first,
                                     second=head if weight.second == old_head else weight.second)
                 for weight in layer_graph.tied)
    if any(0 < weight.first <= last or 0 < weight.second <= last for weight in tied):
        raise ValueError("layer graph: a block shares a weight with another layer; copying blocks would not share it")
    return op_graph, LayerGraph(tuple(layers), tuple(edges), layer_graph.tensor_parallel_width, tied), groups


def extract(
    model: str | ModelSpec,
    micro_batch_size: int,
    sequence_length: int | None = None,
    tensor_parallel_width: int = 1,
    *,
    cache_dir: str | Path | None = None,
    force: bool = False,
) -> ExtractedModel:
    """Rank 0's graphs of `model` at `tensor_parallel_width`, built on the meta device.

    With `cache_dir`, a cached extraction is reused unless `force`; a damaged cache file is set aside
    and rebuilt, and a cache that cannot be written is done without. `sequence_length` defaults to
    the model's.
    """
    spec = get_spec(model)
    sequence_length = spec.default_sequence_length if sequence_length is None else sequence_length
    check_request(spec, micro_batch_size, sequence_length, tensor_parallel_width)
    path = cache_path(Path(cache_dir), spec, micro_batch_size, sequence_length, tensor_parallel_width) if cache_dir else None
    request = (spec, micro_batch_size, sequence_length, tensor_parallel_width)
    key = None if force else _held_key(path, request)
    if key in _HELD:
        _HELD.move_to_end(key)
        return _HELD[key]
    if path is not None and not force and (cached := _load(path, request)) is not None:
        return _hold(key, cached)
    extracted = _trace(spec, micro_batch_size, sequence_length, tensor_parallel_width)
    if path is not None:
        try:
            atomic_write(path, dumps(_to_record(extracted)))
        except OSError as error:
            warn_once(("unwritable", path.parent), "graph cache: cannot write to %s (%s); traced graphs are not "
                      "stored", path.parent, error.strerror or error)
    return _hold(_held_key(path, request), extracted)


#: Extractions read from or written to a cache file this process holds, at most this many (the least
#: recently used dropped first): a run reads each graph file once.
HELD_EXTRACTIONS = 64
_HELD: OrderedDict[tuple, ExtractedModel] = OrderedDict()


def _held_key(path: Path | None, request: tuple) -> tuple | None:
    """An extraction's key in this process: its request and its cache file as the file is now (a file
    rewritten, set aside or removed meanwhile is another key); None without a cache file."""
    if path is None:
        return None
    try:
        status = path.stat()
    except OSError:
        return None
    return (path, status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, request)


def _hold(key: tuple | None, extracted: ExtractedModel) -> ExtractedModel:
    """Keep `extracted` for the rest of the process under its cache file's key (none: not kept), and
    return it."""
    if key is not None:
        _HELD[key] = extracted
        _HELD.move_to_end(key)
        while len(_HELD) > HELD_EXTRACTIONS:
            _HELD.popitem(last=False)
    return extracted


def _load(path: Path, request: tuple[ModelSpec, int, int, int]) -> ExtractedModel | None:
    """The cached extraction of `request` (spec, micro-batch size, sequence length, width) at `path`,
    or None: absent, unreadable (reported once), damaged or of another request (set aside)."""

    def read(path: Path) -> ExtractedModel:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not an object")
        extracted = _from_record(record)
        found = (extracted.spec, extracted.micro_batch_size, extracted.sequence_length, extracted.tensor_parallel_width)
        if found != request:
            raise ValueError("it holds the graphs of another model, micro-batch, sequence length or width")
        return extracted

    return read_cache_file(path, read, (KeyError, TypeError, AttributeError),
                           "graph cache: cannot read %s (%s); tracing again")
