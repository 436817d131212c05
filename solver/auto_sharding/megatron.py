"""Megatron-LM's tensor-parallel plan of a transformer layer (Shoeybi et al. 2019, Sec. 3) in this
package's vocabulary, for a graph of `models.bert_layer`: the QKV and MLP-up products split on
their output dim (columns: heads a, feed-forward f), the attention core (scores, softmax, context)
on heads, the attention-output and MLP-down products on their input dim (rows: a and f, contracted,
so their outputs are Partial and all-reduced before the residual adds); the adds and layer norms
are replicated. On a second mesh axis, if named, every operator splits the batch (data parallel).
"""

from __future__ import annotations

from phaze_common.checks import InputError

from .graph import ShardingGraph
from .mesh import DeviceMesh
from .strategies import Strategy

#: The tensor-parallel dim of each operator of a BERT layer (None: replicated).
TENSOR_DIMS = {
    "qkv": "a", "q": "a", "k": "a", "v": "a", "scores": "a", "softmax": "a", "context": "a", "attn_out": "a",
    "add1": None, "ln1": None, "up": "f", "gelu": "f", "down": "f", "add2": None, "ln2": None,
}


def megatron_plan(graph: ShardingGraph, mesh: DeviceMesh, tensor_axis: str, data_axis: str | None = None
                  ) -> dict[str, Strategy]:
    """Operator name -> Megatron's strategy, tensor parallel over `tensor_axis`, data parallel (the
    batch dim b) over `data_axis`."""
    names = {op.name for op in graph.ops}
    if names != set(TENSOR_DIMS):
        raise InputError(f"graph: must be a bert_layer graph (operators {sorted(TENSOR_DIMS)}), got {sorted(names)}")
    for field, axis in (("tensor_axis", tensor_axis), ("data_axis", data_axis)):
        if axis is not None and axis not in mesh.names:
            raise InputError(f"{field}: must be one of {', '.join(mesh.names)}, got {axis!r}")
    if data_axis == tensor_axis:
        raise InputError(f"data_axis: must differ from tensor_axis ({tensor_axis})")
    return {op.name: Strategy(splits=tuple(TENSOR_DIMS[op.name] if axis == tensor_axis else "b" if axis == data_axis
                                           else None for axis in mesh.names))
            for op in graph.ops}
