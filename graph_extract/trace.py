"""torch.fx tracing with shape propagation, and the translation of a traced or exported graph into
an OpGraph.

Tracing keeps torch.nn modules (Linear, LayerNorm, RMSNorm, Dropout, ...) and the tensor-parallel
collectives as single nodes, records each node's module path, and propagates shapes with meta (or
real) tensors. An exported graph (`graph_extract.export`) carries the same annotations on ATen
operators (`_ATEN` names them in the same vocabulary). `to_op_graph` then turns every computing
node into an OpNode; parameters, buffers and model inputs become attributes of the operators that
read them.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx._symbolic_trace import _assert_is_none
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from graph_extract.opgraph import TRAINING_DTYPE_BYTES, GemmDims, OpGraph, OpNode
from graph_extract.parallel import LEAF_FUNCTIONS, all_reduce, all_to_all, copy_to_tensor_parallel_region, route


class PhazeTracer(fx.Tracer):
    """An fx tracer that keeps the collectives and the routing plan as leaf calls and records each
    node's module path."""

    def __init__(self) -> None:
        super().__init__(autowrap_functions=LEAF_FUNCTIONS)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):  # type: ignore[override]
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        node.meta["module_path"] = target if kind == "call_module" else self.scope.module_path
        return node


def trace(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> fx.GraphModule:
    """Trace `model` called with keyword `inputs` (its other arguments None), annotate shapes."""
    unused = [name for name in inspect.signature(model.forward).parameters if name not in inputs]
    graph = PhazeTracer().trace(model, concrete_args={name: None for name in unused})
    for node in reversed(graph.nodes):  # drop the placeholders and guards of the None arguments
        if node.target is _assert_is_none or (node.op == "placeholder" and not node.users):
            graph.erase_node(node)
    module = fx.GraphModule(model, graph)
    placeholders = [node.target for node in graph.nodes if node.op == "placeholder"]
    ShapeProp(module).propagate(*(inputs[name] for name in placeholders))
    return module


# What each traced operator is: (kind, op). Keys are modules classes, functions or method names.
_MODULES: dict[type, tuple[str, str]] = {
    nn.Linear: ("gemm", "linear"),
    nn.LayerNorm: ("norm", "layernorm"),
    nn.RMSNorm: ("norm", "rmsnorm"),
    nn.Dropout: ("elementwise", "dropout"),
    nn.Embedding: ("embedding", "embedding"),
}

_ELEMENTWISE_FUNCTIONS: dict[Callable, str] = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.neg: "neg",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
    operator.eq: "eq",
    operator.or_: "logical_or",
    operator.and_: "logical_and",
    torch.add: "add",
    torch.sub: "sub",
    torch.mul: "mul",
    torch.div: "div",
    torch.neg: "neg",
    torch.exp: "exp",
    torch.log: "log",
    torch.pow: "pow",
    torch.rsqrt: "rsqrt",
    torch.sqrt: "sqrt",
    torch.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    torch.cos: "cos",
    torch.sin: "sin",
    torch.where: "where",
    F.gelu: "gelu",
    F.relu: "relu",
    F.silu: "silu",
}

_FUNCTIONS: dict[Callable, tuple[str, str]] = {
    **{function: ("elementwise", name) for function, name in _ELEMENTWISE_FUNCTIONS.items()},
    F.linear: ("gemm", "linear"),
    torch.matmul: ("bmm", "matmul"),
    operator.matmul: ("bmm", "matmul"),
    torch.bmm: ("bmm", "matmul"),
    F.softmax: ("softmax", "softmax"),
    F.layer_norm: ("norm", "layernorm"),
    F.rms_norm: ("norm", "rmsnorm"),
    F.embedding: ("embedding", "embedding"),
    torch.gather: ("index", "gather"),
    torch.index_select: ("index", "index_select"),
    route: ("index", "route"),
    F.pad: ("shape", "pad"),
    torch.cat: ("shape", "cat"),
    torch.flatten: ("shape", "flatten"),
    torch.transpose: ("shape", "transpose"),
    operator.getitem: ("shape", "getitem"),
    all_reduce: ("allreduce", "allreduce"),
    copy_to_tensor_parallel_region: ("allreduce", "allreduce"),
    all_to_all: ("alltoall", "alltoall"),
}

_METHODS: dict[str, tuple[str, str]] = {
    **{name: ("elementwise", name) for name in ("add", "sub", "mul", "div", "neg", "exp", "log", "pow",
                                                 "rsqrt", "sqrt", "tanh", "sigmoid", "cos", "sin",
                                                 "masked_fill", "lt", "le", "gt", "ge", "eq")},
    "softmax": ("softmax", "softmax"),
    "sum": ("reduction", "sum"),
    "mean": ("reduction", "mean"),
    "amax": ("reduction", "amax"),
    "topk": ("reduction", "topk"),
    "gather": ("index", "gather"),
    "matmul": ("bmm", "matmul"),
    **{name: ("shape", name) for name in ("view", "reshape", "transpose", "permute", "contiguous",
                                           "unsqueeze", "squeeze", "expand", "flatten", "unflatten",
                                           "float", "to", "type_as", "t", "expand_as", "view_as")},
}


#: ATen operators of an exported graph (`graph_extract.export`), by overload packet name, in the
#: vocabulary of the tables above. Integer bookkeeping (index arithmetic, sorting and counting the
#: routed tokens, building masks and positions) is free "index" or "shape" work, as the routing plan.
_ATEN: dict[str, tuple[str, str]] = {
    "linear": ("gemm", "linear"),
    "_grouped_mm": ("gemm", "grouped_linear"),
    "matmul": ("bmm", "matmul"),
    "bmm": ("bmm", "matmul"),
    "softmax": ("softmax", "softmax"),
    "_softmax": ("softmax", "softmax"),
    "rms_norm": ("norm", "rmsnorm"),
    "layer_norm": ("norm", "layernorm"),
    "embedding": ("embedding", "embedding"),
    "dropout": ("elementwise", "dropout"),
    **{name: ("elementwise", name) for name in (
        "add", "sub", "mul", "div", "neg", "exp", "log", "pow", "rsqrt", "sqrt", "tanh", "sigmoid", "cos", "sin",
        "where", "gelu", "relu", "silu", "masked_fill", "lt", "le", "gt", "ge", "eq", "ne", "clamp")},
    "add_": ("elementwise", "add"),
    "rsub": ("elementwise", "sub"),
    "__and__": ("elementwise", "logical_and"),
    "__or__": ("elementwise", "logical_or"),
    "bitwise_and": ("elementwise", "logical_and"),
    "bitwise_or": ("elementwise", "logical_or"),
    "logical_and": ("elementwise", "logical_and"),
    "logical_or": ("elementwise", "logical_or"),
    "logical_not": ("elementwise", "logical_not"),
    "bitwise_not": ("elementwise", "logical_not"),
    **{name: ("reduction", name) for name in ("sum", "mean", "amax", "topk")},
    "max": ("reduction", "amax"),
    "gather": ("index", "gather"),
    "index_select": ("index", "index_select"),
    **{name: ("index", "route") for name in ("route",
        "index", "index_put", "index_put_", "scatter", "scatter_add", "index_add", "sort", "argsort", "histc",
        "bincount", "cumsum", "diff", "floor_divide", "remainder", "one_hot", "argmax", "nonzero")},
    **{name: ("shape", name) for name in (
        "view", "reshape", "_unsafe_view", "transpose", "permute", "contiguous", "clone", "unsqueeze", "squeeze",
        "expand", "flatten", "unflatten", "slice", "select", "cat", "stack", "split", "split_with_sizes", "chunk",
        "t", "to", "_to_copy", "type_as", "alias", "detach", "lift_fresh_copy", "arange", "full", "zeros", "ones",
        "empty", "empty_like", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_empty",
        "new_full", "scalar_tensor", "pad", "constant_pad_nd", "repeat", "view_as", "expand_as", "triu", "tril",
        "_assert_tensor_metadata", "wrap_with_set_grad_enabled", "wrap_with_autocast")},
}


#: The integer bookkeeping above that is arithmetic on floating-point tensors: refused there.
_INTEGER_ONLY = ("cumsum", "diff", "floor_divide", "remainder", "histc", "bincount")


def _aten_name(target: object) -> str | None:
    """The overload packet name of an ATen operator (or a higher-order operator's name), else None."""
    if isinstance(target, torch._ops.OpOverload):
        return target._overloadpacket.__name__
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    return None


def _classify(module: fx.GraphModule, node: fx.Node) -> tuple[str, str]:
    if (name := _aten_name(node.target)) is not None:
        if name in ("matmul", "bmm") and any(_is_parameter(module, argument) for argument in node.args):
            return ("gemm", "grouped_linear")
        value = node.meta.get("val")
        arithmetic = name in _INTEGER_ONLY and isinstance(value, torch.Tensor) and value.dtype.is_floating_point
        if name not in _ATEN or arithmetic:
            where = node.meta.get("module_path") or "the top-level forward"
            raise ValueError(f"operator: unsupported ATen operator {name}{' on floating-point tensors' * arithmetic} at "
                             f"{where}; supported: the table _ATEN of graph_extract/trace.py")
        return _ATEN[name]
    if node.op == "call_module":
        submodule = module.get_submodule(node.target)
        table, key = _MODULES, type(submodule)
    elif node.op == "call_function":
        table, key = _FUNCTIONS, node.target
    else:
        table, key = _METHODS, node.target
    if key is torch.bmm and any(_is_parameter(module, argument) for argument in node.args):
        return ("gemm", "grouped_linear")  # tokens of each expert times that expert's weights
    if key not in table:
        name = key.__name__ if isinstance(key, type) else key if isinstance(key, str) else _function_name(key)
        where = node.meta.get("module_path") or "the top-level forward"
        raise ValueError(f"operator: unsupported {node.op} {name} at {where}; supported: the modules, functions and "
                         "methods of graph_extract/trace.py's tables")
    return table[key]


def _is_parameter(module: fx.GraphModule, argument: object) -> bool:
    return isinstance(argument, fx.Node) and argument.op == "get_attr" and argument.target in dict(module.named_parameters(remove_duplicate=False))


def _function_name(function: Callable) -> str:
    """torch.cumsum, operator.getitem, F.gelu: a function's module and name (no address)."""
    module = getattr(function, "__module__", None) or type(getattr(function, "__self__", None)).__module__
    return f"{module}.{getattr(function, '__name__', repr(function))}"


def _tensor_metas(value: object) -> list[TensorMetadata]:
    if isinstance(value, TensorMetadata):
        return [value]
    if isinstance(value, (list, tuple)):
        return [meta for item in value for meta in _tensor_metas(item)]
    return []


def _element_bytes(dtype: torch.dtype) -> int:
    return TRAINING_DTYPE_BYTES if dtype.is_floating_point else dtype.itemsize


def _layer_of(module_path: str, blocks: str, num_layers: int, after_blocks: bool) -> int:
    """Layer id of an operator: inside block i of the `blocks` ModuleList i + 1; outside the blocks
    the embedding (0) until a block has run, the head (num_layers + 1) after."""
    if module_path.startswith(f"{blocks}."):
        return int(module_path[len(blocks) + 1:].split(".")[0]) + 1
    return num_layers + 1 if after_blocks else 0


def _gemm_dims(kind: str, inputs: list[tuple[int, ...]], weights: tuple[tuple[int, ...], ...],
               output: tuple[int, ...]) -> GemmDims:
    if kind == "gemm" and len(weights[0]) == 3:  # per expert: activation [E, m, k] times weight [E, k, n]
        experts, k, n = weights[0]
        if len(output) == 2:  # a grouped product of [rows, k] in E groups: the mean rows per expert
            return GemmDims(batch=experts, m=math.ceil(output[0] / experts), k=k, n=n)
        return GemmDims(batch=experts, m=output[-2], k=k, n=n)
    if kind == "gemm":  # activation [..., k] times weight [n, k]
        n, k = weights[0]
        return GemmDims(batch=1, m=math.prod(output[:-1]), k=k, n=n)
    k = inputs[0][-1]
    return GemmDims(batch=math.prod(output[:-2]), m=output[-2], k=k, n=output[-1])


def _group(node: fx.Node) -> dict[str, str]:
    """A collective's group when it is not the tensor-parallel one (the experts' own)."""
    group = node.kwargs.get("group", "tensor")
    return {} if group == "tensor" else {"group": group}


def _attrs(module: fx.GraphModule, node: fx.Node, op: str) -> tuple[tuple[str, object], ...]:
    attrs: dict[str, object] = {}
    if node.target is all_reduce:
        group_size = node.args[1] if len(node.args) > 1 else node.kwargs["group_size"]
        reduce_op = node.args[2] if len(node.args) > 2 else node.kwargs.get("reduce_op", "sum")
        attrs.update(direction="forward", group_size=group_size, reduce_op=reduce_op, **_group(node))
    elif node.target is copy_to_tensor_parallel_region:
        group_size = node.args[1] if len(node.args) > 1 else node.kwargs["group_size"]
        attrs.update(direction="backward", group_size=group_size, reduce_op="sum", **_group(node))
    elif op == "dropout":
        attrs["p"] = module.get_submodule(node.target).p if node.op == "call_module" else node.args[1]
    elif op in ("softmax", "sum", "mean", "amax"):
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        attrs["dim"] = dim[0] if isinstance(dim, (list, tuple)) and len(dim) == 1 else dim  # ATen's [d]
    return tuple(sorted(attrs.items()))


def to_op_graph(module: fx.GraphModule, num_layers: int, tensor_parallel_width: int, blocks: str = "layers") -> OpGraph:
    """The OpGraph of a traced, shape-annotated model whose transformer blocks are the children of
    the ModuleList at path `blocks`; the layers follow one another in program order."""
    parameters = dict(module.named_parameters(remove_duplicate=False))
    ids: dict[fx.Node, int] = {}
    nodes: list[OpNode] = []
    edges: list[tuple[int, int]] = []
    layer = 0
    for node in module.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        kind, op = _classify(module, node)
        previous, layer = layer, _layer_of(node.meta["module_path"], blocks, num_layers, layer > 0)
        if layer < previous:
            raise ValueError(f"module_path: operator {node.name} at {node.meta['module_path']!r} runs between the blocks "
                             f"of {blocks}; layers must follow one another (embedding, blocks, head)")
        weight_names: list[str] = []
        input_shapes: list[tuple[int, ...]] = []
        sources: list[int | None] = []
        for argument in node.all_input_nodes:
            if argument.op == "get_attr" and argument.target in parameters:
                weight_names.append(argument.target)
                continue
            if argument in ids:
                edges.append((ids[argument], len(nodes)))
            for meta in _tensor_metas(argument.meta.get("tensor_meta")):
                input_shapes.append(tuple(meta.shape))
                sources.append(ids.get(argument))
        if node.op == "call_module":
            submodule = module.get_submodule(node.target)
            weight_names.extend(f"{node.target}.{name}" for name, _ in submodule.named_parameters())
        weight_shapes = tuple(tuple(parameters[name].shape) for name in weight_names)
        outputs = _tensor_metas(node.meta.get("tensor_meta"))
        output_shapes = tuple(tuple(meta.shape) for meta in outputs)
        ids[node] = len(nodes)
        nodes.append(
            OpNode(
                id=len(nodes),
                kind=kind,
                op=op,
                layer=layer,
                name=node.name,
                module_path=node.meta["module_path"],
                input_shapes=tuple(input_shapes),
                output_shapes=output_shapes,
                weight_shapes=weight_shapes,
                weight_names=tuple(weight_names),
                inputs=tuple(sources),
                dtype_bytes=_element_bytes(outputs[0].dtype) if outputs else 0,
                gemm=_gemm_dims(kind, input_shapes, weight_shapes, output_shapes[0])
                if kind in ("gemm", "bmm")
                else None,
                attrs=_attrs(module, node, op),
            )
        )
    sharded = frozenset(name for name, parameter in parameters.items() if getattr(parameter, "partition_dim", None) is not None)
    return OpGraph(nodes=tuple(nodes), edges=tuple(dict.fromkeys(edges)), tensor_parallel_width=tensor_parallel_width,
                   sharded_parameters=sharded)
