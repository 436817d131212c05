"""`extract`: model name -> traced shard graphs of one tensor-parallel width, with an on-disk cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from graph_extract.layergraph import LayerGraph, build_layer_graph
from graph_extract.opgraph import OpGraph, weight_sizes
from graph_extract.regions import attention_core
from graph_extract.repeats import repeat_groups as find_repeat_groups
from graph_extract.serialize import (
    FORMAT_VERSION,
    atomic_write,
    dumps,
    layer_graph_from_dict,
    layer_graph_to_dict,
    op_graph_from_dict,
    op_graph_to_dict,
)
from graph_extract.trace import TRAINING_DTYPE_BYTES, to_op_graph, trace
from graph_extract.transformer import TransformerModel, example_inputs
from graph_extract.zoo import ModelSpec, get_spec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractedModel:
    """The graphs of rank 0 of `spec` at one tensor-parallel width, for one micro-batch shape."""

    spec: ModelSpec
    micro_batch_size: int
    sequence_length: int
    tensor_parallel_width: int
    op_graph: OpGraph
    layer_graph: LayerGraph
    repeat_groups: tuple[tuple[int, ...], ...]
    parameter_count: int  # the whole model: all shards, each parameter once

    @cached_property
    def attention_core(self) -> frozenset[int]:
        """Ids of the operators of the attention cores (see `graph_extract.regions`)."""
        return attention_core(self.op_graph)

    @property
    def parameters_per_device(self) -> int:
        """Parameters rank 0 holds when it holds every layer (a tied weight once)."""
        return sum(weight_sizes(self.op_graph.nodes).values())


def valid_tensor_parallel_widths(model: str | ModelSpec, maximum: int) -> tuple[int, ...]:
    """Powers of two up to `maximum` that divide the head count (and so the hidden and FFN sizes)."""
    spec = get_spec(model)
    widths, width = [], 1
    while width <= maximum:
        if spec.num_heads % width == 0 and spec.ffn_hidden_size % width == 0:
            widths.append(width)
        width *= 2
    return tuple(widths)


def check_request(spec: ModelSpec, micro_batch_size: object, sequence_length: object, width: object) -> None:
    """Raise ValueError naming the field when the request cannot be extracted."""
    for field, value in (("micro_batch_size", micro_batch_size), ("sequence_length", sequence_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{field}: must be a positive integer, got {value!r}")
    if sequence_length > spec.max_position_embeddings:
        raise ValueError(
            f"sequence_length: {spec.name} supports at most {spec.max_position_embeddings}, got {sequence_length}"
        )
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0 or width & (width - 1):
        raise ValueError(f"tensor_parallel_width: must be a power of two, got {width!r}")
    valid = valid_tensor_parallel_widths(spec, width)
    if width not in valid:
        raise ValueError(
            f"tensor_parallel_width: {width} does not divide the {spec.num_heads} heads of {spec.name}; "
            f"valid: {', '.join(map(str, valid))}"
        )


def parameter_count(model: torch.nn.Module, width: int) -> int:
    """Parameters of all shards together: a split parameter counts width times, a replicated one once."""
    return sum(
        p.numel() * (width if getattr(p, "partition_dim", None) is not None else 1) for p in model.parameters()
    )


def cache_path(cache_dir: Path, spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int) -> Path:
    """One file per (model, micro-batch, sequence length, width, format); the spec hash covers overrides."""
    spec_hash = hashlib.sha1(repr(dataclasses.astuple(spec)).encode()).hexdigest()[:8]
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
    )


def _trace(spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int) -> ExtractedModel:
    with torch.device("meta"):
        model = TransformerModel(spec, sequence_length, width)
    module = trace(model, example_inputs(model, micro_batch_size, sequence_length))
    op_graph = to_op_graph(module, spec.num_layers, width)
    return ExtractedModel(
        spec=spec,
        micro_batch_size=micro_batch_size,
        sequence_length=sequence_length,
        tensor_parallel_width=width,
        op_graph=op_graph,
        layer_graph=build_layer_graph(op_graph, TRAINING_DTYPE_BYTES),
        repeat_groups=find_repeat_groups(op_graph),
        parameter_count=parameter_count(model, width),
    )


def extract(
    model: str | ModelSpec,
    micro_batch_size: int,
    sequence_length: int | None = None,
    tensor_parallel_width: int = 1,
    *,
    cache_dir: str | Path | None = None,
    force: bool = False,
) -> ExtractedModel:
    """Trace rank 0 of `model` at `tensor_parallel_width` on the meta device.

    With `cache_dir`, a cached extraction is reused unless `force`; an unreadable cache file is
    rebuilt. `sequence_length` defaults to the model's.
    """
    spec = get_spec(model)
    sequence_length = spec.default_sequence_length if sequence_length is None else sequence_length
    check_request(spec, micro_batch_size, sequence_length, tensor_parallel_width)
    path = cache_path(Path(cache_dir), spec, micro_batch_size, sequence_length, tensor_parallel_width) if cache_dir else None
    if path is not None and path.exists() and not force:
        try:
            return _from_record(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as error:
            log.warning("rebuilding unreadable graph cache %s (%s)", path, error)
    extracted = _trace(spec, micro_batch_size, sequence_length, tensor_parallel_width)
    if path is not None:
        atomic_write(path, dumps(_to_record(extracted)))
    return extracted
