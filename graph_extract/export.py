"""`torch.export` of a whole model into an annotated ATen graph, the form the plan pass and
`to_op_graph` read.

The model is exported once, unsharded, on the meta device, with `torch.export.export(...,
strict=False)` (the Python code runs as written; only tensor operations are recorded). Each node of
the exported graph gets, as a torch.fx trace's nodes do: `module_path`, the innermost module that ran
it (from export's `nn_module_stack`; "" for the top-level forward), and `tensor_meta`, its outputs'
shapes and dtypes (from export's fake values). The export's own guard call is dropped.

Parameters and buffers are `get_attr` nodes named by their paths in the model
(`model.layers.0.self_attn.q_proj.weight`), so the graph's module (`ExportedProgram.module()`) holds
them under the model's own names.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import _extract_tensor_metadata


def _module_path(node: fx.Node) -> str:
    """The innermost module of export's `nn_module_stack` (its path in the model), "" at the top."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _ in stack.values() if path]
    return paths[-1] if paths else ""


def _metadata(value: object) -> object:
    """TensorMetadata for a tensor, a tuple of them for a tuple, None for anything else."""
    if isinstance(value, torch.Tensor):
        return _extract_tensor_metadata(value)
    if isinstance(value, (list, tuple)):
        found = tuple(_metadata(item) for item in value)
        return found if any(item is not None for item in found) else None
    return None


def annotate(module: fx.GraphModule) -> fx.GraphModule:
    """Give every node `module_path` and `tensor_meta` (see the module's docstring), in place."""
    for node in module.graph.nodes:
        node.meta["module_path"] = _module_path(node)
        if node.op == "get_attr":
            node.meta["tensor_meta"] = _metadata(getattr_path(module, node.target))
        else:
            node.meta["tensor_meta"] = _metadata(node.meta.get("val"))
    return module


def getattr_path(module: nn.Module, target: str) -> object:
    """The attribute at a dotted path (a parameter, a buffer or a constant)."""
    value: object = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def export(model: nn.Module, inputs: Mapping[str, object]) -> fx.GraphModule:
    """The annotated ATen graph of `model(**inputs)` (tensors on the meta device, other values constant)."""
    program = torch.export.export(model, (), dict(inputs), strict=False)
    module = program.module()
    for node in reversed(module.graph.nodes):
        if node.op == "call_module" and not node.users:  # export's input guards
            module.graph.erase_node(node)
    module.graph.eliminate_dead_code()
    module.recompile()
    return annotate(module)
