"""Tensor parallelism as a plan: which parameters are split over the tensor-parallel ranks, applied by
a pass to the one exported (unsharded) graph to give each rank's graph.

A *plan* maps module paths (shell patterns, as torchtitan writes them: `model.layers.*.self_attn.q_proj`)
to a parallel style in PyTorch's vocabulary (`torch.distributed.tensor.parallel`):

* `ColwiseParallel`: the module's weight (and bias) `Shard(0)`: its products' outputs are split on the
  last dimension (`Shard(-1)`); its input must be `Replicate()`.
* `RowwiseParallel`: the weight `Shard(1)` (an embedding: `Shard(0)`, the vocabulary), the bias
  `Replicate()`: its output is `Partial()`, all-reduced at once into `Replicate()` (Megatron's
  row-parallel linear and vocabulary-parallel embedding).

A grouped expert product's weight [experts, in, out] splits its `out` (colwise) or `in` (rowwise)
dimension. A parameter the plan does not name is `Replicate()`, unless an element-wise operator or a
norm uses it with an activation split along the parameter's dimension (a bias, a QK-norm's weight, a
head's sink): then it is split with it.

The pass (`apply_plan`) walks the graph once in program order and gives every tensor a placement
(`Replicate`, `Shard(dim)`, `Partial(op)`) by these rules, rewriting each operator for one rank:

* a split weight's product: `Replicate` in, `Shard(-1)` out (colwise); `Shard(-1)` in, `Partial`
  out (rowwise; with a bias, all-reduced at once and the bias added);
* a `Partial` sum stays partial through moves of its elements (views, pads, row picks), products
  with a replicated factor and sums, and is all-reduced right after the last of them, before an
  operator that needs it whole (Megatron's all-reduce after a row-parallel product, after a
  mixture's combine);
* the input of a colwise product, where it enters from `Replicate`: Megatron's
  `copy_to_tensor_parallel_region` (identity forward, all-reduce of the gradient backward), once per
  tensor and module;
* element-wise operators keep a `Shard` (their `Replicate` operands broadcast); reshapes move it to
  the dimension it becomes (sizes given in the graph are rewritten to the rank's);
* a reduction (`amax`, `sum`) over the split dimension is `Partial`, all-reduced (max, sum);
* a lookup (`embedding`, `gather`) into a table split on the looked-up dimension: the indices outside
  the rank's range are masked, their rows zeroed, and the result all-reduced (Megatron's
  vocabulary-parallel embedding and cross-entropy);
* a norm over a split dimension: its mean of squares all-reduced (a split RMSNorm);
* a mixture's experts (grouped products of [experts, in, out] weights): an all-to-all over the
  expert-parallel group after the row pick that dispatches their tokens and after their down
  product (the identity at one rank), and their module's input copied into the experts' own
  tensor-parallel group (`EXPERT_TENSOR`) instead of a copy per product.

Anything else on a split tensor (a softmax over the split dimension, a product contracting a split
dimension with a replicated one) is refused in one line naming the operator, its module and the
placement. Every collective is inserted at every width, group size 1 included: what the operators
around it fuse with does not depend on the width.

A fused projection (one weight for q, k and v, or for gate and up, cut into its parts by slices or a
chunk of its output) is split as Megatron lays it out: each rank holds its share of every part, and
the slices are rewritten to the rank's shares. With more ranks than a product's heads (the
key/value heads of grouped-query attention), each head is held by width / heads ranks, Megatron's
rule.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from phaze_common.checks import InputError
from graph_extract.export import annotate, getattr_path
from graph_extract.opgraph import EXPERT_TENSOR
from graph_extract.parallel import all_reduce, all_to_all, copy_to_tensor_parallel_region

COLWISE, ROWWISE = "colwise", "rowwise"
#: The styles a plan names, and PyTorch's classes of them.
STYLES = {COLWISE: ColwiseParallel, ROWWISE: RowwiseParallel}
aten = torch.ops.aten
REPLICATE = Replicate()


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Module path patterns and their styles, the first match deciding (torchtitan's plan)."""

    styles: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for pattern, style in self.styles:
            if style not in STYLES:
                raise InputError(f"plan: {pattern}: unknown style {style!r}; allowed: {', '.join(STYLES)}")

    @classmethod
    def of(cls, plan: Mapping[str, object]) -> Plan:
        """A plan from {pattern: style}, a style a name (`colwise`, `rowwise`, any case, with or without
        `Parallel`) or a `ColwiseParallel()` / `RowwiseParallel()` with its default layouts."""
        return cls(styles=tuple((str(pattern), _style_name(pattern, style)) for pattern, style in plan.items()))

    def style(self, module_path: str) -> str | None:
        for pattern, style in self.styles:
            if fnmatch.fnmatchcase(module_path, pattern):
                return style
        return None

    def parameter_style(self, parameter: str) -> str | None:
        """The style of a parameter: its own path's, else its module's."""
        return self.style(parameter) or self.style(parameter.rpartition(".")[0])


def read_plan(path: str | Path) -> Plan:
    """The plan of a YAML file: a mapping of module (or parameter) path patterns to `ColwiseParallel`
    or `RowwiseParallel`; InputError naming the file and what is wrong."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise InputError(f"model.plan: cannot read {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise InputError(f"model.plan: {path}: not YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"model.plan: {path}: must map module patterns to ColwiseParallel or RowwiseParallel, got "
                         f"{type(data).__name__}")
    try:
        return Plan.of(data)
    except InputError as error:
        raise InputError(f"model.plan: {path}: {str(error).removeprefix('plan: ')}") from None


def plan_digest(path: str | Path) -> str:
    """SHA-1 of a plan file's bytes: a changed plan is another graph."""
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()


def _style_name(pattern: object, style: object) -> str:
    if isinstance(style, (ColwiseParallel, RowwiseParallel)):
        default = type(style)()
        if (style.input_layouts, style.output_layouts) != (default.input_layouts, default.output_layouts):
            raise InputError(f"plan: {pattern}: {type(style).__name__} with other layouts than its defaults; allowed: "
                             "the defaults (sequence parallelism is a placement option of the step model)")
        return COLWISE if isinstance(style, ColwiseParallel) else ROWWISE
    if isinstance(style, str):
        name = style.lower().removesuffix("parallel").removesuffix("_")
        if name in STYLES:
            return name
    raise InputError(f"plan: {pattern}: unknown style {style!r}; allowed: ColwiseParallel, RowwiseParallel")


# --- the plan derived by structure -------------------------------------------------------------

def _weight_product(node: fx.Node, parameters: Mapping[str, nn.Parameter]) -> str | None:
    """What a plan names for the weight `node` multiplies: the module of a linear map, the parameter
    of a grouped expert product (one module holds several); None for another operator."""
    if node.op != "call_function" or node.target not in (aten.linear.default, aten._grouped_mm.default,
                                                         aten.matmul.default, aten.bmm.default):
        return None
    weights = [argument.target for argument in node.args[:2]
               if isinstance(argument, fx.Node) and argument.op == "get_attr" and argument.target in parameters]
    if not weights:
        return None
    return weights[0] if parameters[weights[0]].dim() == 3 else weights[0].rpartition(".")[0]


def derived_plan(module: fx.GraphModule, blocks: str) -> Plan:
    """Megatron's split found by structure, for any model whose blocks hold modules of weight products
    (attention, a feed-forward network, experts):

    in each child module of a block, a weight product fed by others and feeding none (an output
    projection, a down projection: of the attention, the MLP, the experts, the shared experts) is
    rowwise, and the products whose outputs reach its input directly are colwise; those that reach
    it only through another product (a latent attention's down projections, replicated as
    Megatron-Core's MLA duplicates them) and a router (whose values reach only the routing) stay
    replicated; the token embedding (the largest table) is rowwise (vocabulary-parallel) and the
    product after the blocks onto the vocabulary colwise (its logits split, the loss computed on
    them as Megatron's)."""
    parameters = dict(module.named_parameters(remove_duplicate=False))
    products: dict[str, list[tuple[fx.Node, str]]] = {}
    styles: dict[str, str] = {}
    tables = [node.args[0] for node in module.graph.nodes
              if node.target is aten.embedding.default and isinstance(node.args[0], fx.Node)]
    vocabulary = max(tables, key=lambda table: _shape(table)[0]) if tables else None  # the token embedding
    if vocabulary is not None:
        styles[vocabulary.target.rpartition(".")[0]] = ROWWISE
    after_blocks = False
    for node in module.graph.nodes:
        path = node.meta.get("module_path", "")
        after_blocks |= path.startswith(f"{blocks}.")
        if (owner := _weight_product(node, parameters)) is None:
            continue
        if path.startswith(f"{blocks}."):
            child = ".".join(path.split(".")[: len(blocks.split(".")) + 2])
            products.setdefault(child, []).append((node, owner))
        elif after_blocks and vocabulary is not None and _shape(node)[-1] == _shape(vocabulary)[0]:
            styles[owner] = COLWISE  # the output projection over the vocabulary
    for found in products.values():
        ancestors = {node: _ancestors(node) for node, _ in found}
        for last, owner in found:
            feeding = {node for node, _ in found if node in ancestors[last]}
            if not feeding or any(last in ancestors[other] for other, _ in found):
                continue  # a router or a down projection: not a sink fed by products
            styles[owner] = ROWWISE
            for node, feeder in found:  # the last product on each path in (not a latent's down projection)
                if node in feeding and not any(node in ancestors[other] for other in feeding - {node}):
                    styles.setdefault(feeder, COLWISE)
    return Plan(styles=tuple(styles.items()))


def _data_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs whose values flow into `node`'s: a product's activation (not its group offsets), a
    lookup's table (not its indices), and only floating-point tensors (not the routing's integers)."""
    if node.target in (aten._grouped_mm.default, aten.index.Tensor, aten.embedding.default):
        inputs = [node.args[0 if node.target is not aten.embedding.default else 0]]
    else:
        inputs = node.all_input_nodes
    return [argument for argument in inputs if isinstance(argument, fx.Node) and _floating(argument.meta.get("val"))]


def _floating(value: object) -> bool:
    """A floating-point tensor, or a tuple holding one."""
    if isinstance(value, (list, tuple)):
        return any(_floating(item) for item in value)
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _ancestors(node: fx.Node) -> set[fx.Node]:
    """The nodes whose values flow into `node`'s input (`_data_inputs`, transitively)."""
    seen: set[fx.Node] = set()
    stack = _data_inputs(node)
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(_data_inputs(current))
    return seen


# --- the pass ------------------------------------------------------------------------------------

def _normal(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _shape(node: fx.Node) -> tuple[int, ...]:
    value = node.meta.get("val")
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


class _Rank:
    """One rank's graph under construction: each original node's new node and placement."""

    def __init__(self, module: fx.GraphModule, plan: Plan, width: int, rank: int,
                 values: Mapping[str, torch.Tensor] | None, resplit: Mapping[str, int]) -> None:
        self.module, self.plan, self.width, self.rank, self.values = module, plan, width, rank, values
        self.resplit = resplit  # parameters found split with an activation, and their split dimension
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.env: dict[fx.Node, fx.Node] = {}
        self.placement: dict[fx.Node, object] = {}  # a Placement, or a tuple of them for tuple outputs
        self.copies: dict[tuple[fx.Node, str], fx.Node] = {}
        self.parameters = dict(module.named_parameters(remove_duplicate=False))
        self.parts = _fused_parts(module, plan, self.parameters)
        self.experts = _expert_points(module, plan, self.parameters)
        self.parameter_replicas = _kv_replicas(module, plan, width)
        self.replicas: dict[fx.Node, int] = {}  # > 1: a Shard whose slices each of that many ranks hold
        self.entry_copies: dict[fx.Node, fx.Node] = {}
        self.pending_masks: dict[fx.Node, fx.Node | None] = {}  # a lookup's mask of the indices not the rank's
        self.mask_shapes: dict[fx.Node, int] = {}  # the mask's dimensions
        self.partial_group: dict[fx.Node, str] = {}

    # helpers -------------------------------------------------------------------------------------
    def fail(self, node: fx.Node, what: str) -> InputError:
        where = node.meta.get("module_path") or "the top-level forward"
        return InputError(f"plan: {node.target} at {where}: {what}; the plan cannot split it at width {self.width}")

    def emit(self, target: object, args: tuple, kwargs: dict | None, path: str) -> fx.Node:
        new = self.graph.call_function(target, args, kwargs or {})
        new.meta["module_path"] = path
        return new

    def collective(self, target: object, value: fx.Node, path: str, *extra: object, group: str = "tensor") -> fx.Node:
        kwargs = {} if group == "tensor" else {"group": group}
        return self.emit(target, (value, self.width, *extra), kwargs, path)

    def local_parameter(self, target: str, dim: int | None) -> None:
        """Register the rank's share of parameter or buffer `target` (split on `dim`, or whole)."""
        full = getattr_path(self.module, target)
        value = full if self.values is None or isinstance(full, nn.Module) else self.values[target]
        replicas = self.parameter_replicas.get(target, 1)
        if dim is not None:
            slices, index = self.width // replicas, self.rank // replicas
            if not -full.dim() <= dim < full.dim():
                raise InputError(f"plan: {target}: a parameter of {full.dim()} dimensions split on dimension {dim}")
            if full.shape[dim] % slices:
                raise InputError(f"plan: {target}: its dimension {dim} of {full.shape[dim]} does not split over "
                                 f"{self.width} ranks")
            parts = self.parts.get(target, ((0, full.shape[dim]),))
            value = torch.cat([value.narrow(dim, start + index * (size // slices), size // slices)
                               for start, size in parts], dim=dim)
        holder = self.root
        *parents, name = target.split(".")
        for part in parents:
            if not hasattr(holder, part):
                holder.add_module(part, nn.Module())
            holder = getattr(holder, part)
        if isinstance(full, nn.Module):  # a higher-order operator's body (a no-grad region)
            holder.add_module(name, full)
        elif isinstance(full, nn.Parameter):
            parameter = nn.Parameter(value.detach().clone() if self.values is not None else torch.empty_like(value),
                                     requires_grad=False)
            parameter.partition_dim = dim  # type: ignore[attr-defined]
            parameter.replicas = replicas  # type: ignore[attr-defined]
            holder.register_parameter(name, parameter)
        else:
            holder.register_buffer(name, value)

    # the walk ------------------------------------------------------------------------------------
    def run(self) -> fx.GraphModule:
        parameter_dims = self._parameter_dims()
        for node in self.module.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.graph.placeholder(node.target)
                self.env[node].meta["module_path"] = ""
                self.placement[node] = REPLICATE
            elif node.op == "get_attr":
                dim = parameter_dims.get(node.target)
                self.local_parameter(node.target, dim)
                self.env[node] = self.graph.get_attr(node.target)
                self.env[node].meta["module_path"] = node.meta.get("module_path", "")
                self.placement[node] = REPLICATE if dim is None else Shard(dim)
                self.replicas[node] = self.parameter_replicas.get(node.target, 1)
            elif node.op == "output":
                self.graph.output(fx.map_arg(node.args[0], self.replicated))
            elif node.op == "call_function":
                self.call(node)
            else:
                raise self.fail(node, f"a {node.op} node")
        for new in reversed(self.graph.nodes):  # views of indices replaced by their masked copies
            if new.op == "call_function" and not new.users and new.target is aten.unsqueeze.default:
                self.graph.erase_node(new)
        return fx.GraphModule(self.root, self.graph)

    def replicated(self, node: fx.Node) -> fx.Node:
        placement = self.placement[node]
        if isinstance(placement, Shard):
            raise self.fail(node, f"its output {placement} leaves the model")
        return self.env[node]

    def _parameter_dims(self) -> dict[str, int]:
        """Each planned parameter's split dimension (colwise: the output features; rowwise: the input
        features, an embedding's rows)."""
        tables = {node.args[0].target for node in self.module.graph.nodes  # looked up by an embedding
                  if node.target is aten.embedding.default and isinstance(node.args[0], fx.Node)}
        dims: dict[str, int] = {}
        for name, parameter in self.parameters.items():
            leaf = name.rpartition(".")[2]
            style = self.plan.parameter_style(name)
            if style is None or (self.plan.style(name) is None and parameter.dim() == 3):
                continue
            if parameter.dim() == 3:  # experts' [E, in, out]
                dims[name] = 2 if style == COLWISE else 1
            elif leaf == "bias" or parameter.dim() == 1:
                if style == COLWISE:
                    dims[name] = 0
            else:
                dims[name] = 0 if style == COLWISE or name in tables else 1
        return {**dims, **self.resplit}

    def call(self, node: fx.Node) -> None:
        self.operator(node)
        if isinstance(self.placement.get(node), Shard) and node not in self.replicas:
            self.replicas[node] = max((self.replicas.get(argument, 1) for argument in node.all_input_nodes
                                       if isinstance(self.placement[argument], Shard)), default=1)
        path = node.meta.get("module_path", "")
        if node in self.experts.dispatches or node in self.experts.combines:  # tokens to and from their experts
            self.env[node] = self.emit(all_to_all, (self.env[node],), {}, path)
        if node in self.experts.entries:
            self.entry_copies[node] = self.collective(copy_to_tensor_parallel_region, self.env[node],
                                                      self.experts.entries[node], group=EXPERT_TENSOR)
        if isinstance(self.placement.get(node), Partial) and any(not _keeps_partial(user, node) for user in node.users):
            if (outside := self.pending_masks.get(node)) is not None:  # a lookup's rows of other ranks zeroed
                if len(_shape(node)) > self.mask_shapes[node]:
                    outside = self.unsqueezed(outside, path)
                self.env[node] = self.emit(aten.masked_fill.Scalar, (self.env[node], outside, 0.0), {}, path)
            self.env[node] = self.collective(all_reduce, self.env[node], path, group=self.partial_group[node])
            self.placement[node] = REPLICATE

    def operator(self, node: fx.Node) -> None:
        path = node.meta.get("module_path", "")
        target = node.target
        tensors = [argument for argument in node.all_input_nodes]
        shards = {argument: self.placement[argument] for argument in tensors
                  if not isinstance(self.placement[argument], Replicate)}
        if target in (aten.linear.default, aten._grouped_mm.default) or (
                target in (aten.matmul.default, aten.bmm.default) and _weight_product(node, self.parameters)):
            return self.product(node, path)
        if any(isinstance(placement, Partial) for placement in shards.values()):
            return self.partial(node, shards)
        if not shards and not any(isinstance(self.placement.get(a), tuple) for a in tensors):
            return self.copy(node, REPLICATE)
        if target is operator.getitem:
            return self.copy(node, self.placement[node.args[0]][node.args[1]])
        rule = _RULES.get(getattr(target, "_overloadpacket", None))
        if rule is None:
            if torch.Tag.pointwise in getattr(target, "tags", ()):
                return self.pointwise(node)
            raise self.fail(node, f"an operator on {', '.join(map(str, shards.values()))} inputs")
        rule(self, node)

    def copy(self, node: fx.Node, placement: object, args: tuple | None = None, kwargs: dict | None = None) -> None:
        path = node.meta.get("module_path", "")

        def mapped(n: fx.Node) -> fx.Node:  # an original node's new node (the experts' copy of their
            if n in self.entry_copies and self.experts.entries[n] == path:  # module's input); a new node
                return self.entry_copies[n]
            return self.env[n] if n in self.env else n

        new_args = fx.map_arg(node.args if args is None else args, mapped)
        new_kwargs = fx.map_arg(node.kwargs if kwargs is None else kwargs, mapped)
        self.env[node] = self.emit(node.target, new_args, new_kwargs, node.meta.get("module_path", ""))
        self.placement[node] = placement

    def single_shard(self, node: fx.Node) -> tuple[fx.Node, int]:
        """The one split tensor input of `node` and its split dimension (normalised)."""
        found = [(argument, self.placement[argument]) for argument in node.all_input_nodes
                 if isinstance(self.placement[argument], Shard)]
        dims = {_normal(placement.dim, len(_shape(argument))) - len(_shape(argument)) for argument, placement in found}
        partial = [argument for argument in node.all_input_nodes if isinstance(self.placement[argument], Partial)]
        if partial or len(dims) != 1:
            raise self.fail(node, f"inputs {[str(self.placement[a]) for a in node.all_input_nodes]}")
        argument, placement = found[0]
        return argument, _normal(placement.dim, len(_shape(argument)))

    # products ------------------------------------------------------------------------------------
    def product(self, node: fx.Node, path: str) -> None:
        source, weight = node.args[0], node.args[1]
        grouped = _shape(weight) and len(_shape(weight)) == 3
        group = EXPERT_TENSOR if grouped else "tensor"
        owner = weight.target.rpartition(".")[0]
        style = self.plan.parameter_style(weight.target)
        if style == COLWISE:
            if not isinstance(self.placement[source], Replicate):
                raise self.fail(node, f"a colwise product of a {self.placement[source]} input")
            key = (source, path.rpartition(".")[0] if path == owner else path)
            if grouped and node in self.experts.entered:  # the experts' module input was copied
                entered = self.env[source]
            else:
                if key not in self.copies:
                    self.copies[key] = self.collective(copy_to_tensor_parallel_region, self.env[source], key[1],
                                                       group=group)
                entered = self.copies[key]
            args = (entered, *fx.map_arg(node.args[1:], lambda n: self.env[n]))
            self.env[node] = self.emit(node.target, args, fx.map_arg(node.kwargs, lambda n: self.env[n]), path)
            self.placement[node] = Shard(len(_shape(node)) - 1)
            self.replicas[node] = self.replicas.get(weight, 1)
        elif style == ROWWISE:
            dim = self.placement[source].dim if isinstance(self.placement[source], Shard) else None
            if dim is None or _normal(dim, len(_shape(source))) != len(_shape(source)) - 1:
                raise self.fail(node, f"a rowwise product of a {self.placement[source]} input")
            bias = node.args[2] if target_is_linear(node) and len(node.args) > 2 else None
            args = fx.map_arg(node.args[:2] if bias is not None else node.args, lambda n: self.env[n])
            product = self.emit(node.target, args, fx.map_arg(node.kwargs, lambda n: self.env[n]), path)
            if bias is None:  # a Partial sum, all-reduced where it meets what needs it whole
                self.env[node], self.placement[node], self.partial_group[node] = product, Partial(), group
                return
            reduced = self.collective(all_reduce, product, path, group=group)
            self.env[node] = self.emit(aten.add.Tensor, (reduced, self.env[bias]), {}, path)
            self.placement[node] = REPLICATE
        else:
            if any(not isinstance(self.placement.get(a), Replicate) for a in node.all_input_nodes):
                raise self.fail(node, "a product of a replicated weight with a split input")
            self.copy(node, REPLICATE)

    def partial(self, node: fx.Node, shards: Mapping[fx.Node, object]) -> None:
        """An operator that keeps a Partial sum (`_keeps_partial`): the sum is still partial after it."""
        partial = [argument for argument, placement in shards.items() if isinstance(placement, Partial)]
        if len(shards) != 1 or not _keeps_partial(node, partial[0]):
            raise self.fail(node, f"inputs {[str(placement) for placement in shards.values()]}")
        self.copy(node, Partial())
        self.partial_group[node] = self.partial_group[partial[0]]
        self.pending_masks[node] = self.pending_masks.get(partial[0])
        self.mask_shapes[node] = self.mask_shapes.get(partial[0])

    # element-wise and shape rules ----------------------------------------------------------------
    def pointwise(self, node: fx.Node) -> None:
        """Operands broadcast against the output; a replicated operand that spans the split dimension
        in full is a parameter split with it (a bias, a norm's weight, a sink)."""
        rank = len(_shape(node))
        dims = set()
        for argument in node.all_input_nodes:
            placement = self.placement[argument]
            if isinstance(placement, Shard):
                dims.add(_normal(placement.dim, len(_shape(argument))) + rank - len(_shape(argument)))
            elif isinstance(placement, Partial):
                raise self.fail(node, "a Partial input")
        if len(dims) != 1:
            raise self.fail(node, f"inputs split on dimensions {sorted(dims)}")
        dim = dims.pop()
        args = list(node.args)
        for index, argument in enumerate(node.args):
            if not isinstance(argument, fx.Node) or not isinstance(self.placement[argument], Replicate):
                continue
            shape = _shape(argument)
            at = dim - (rank - len(shape))
            if 0 <= at < len(shape) and shape[at] > 1:
                args[index] = self.split_operand(node, argument, at)
        self.copy(node, Shard(dim), args=tuple(args))

    def split_operand(self, node: fx.Node, argument: fx.Node, dim: int) -> fx.Node:
        """A replicated operand spanning the split dimension: a parameter (possibly through views) is
        split with it."""
        source = argument
        while source.op == "call_function" and _RULES.get(
                getattr(source.target, "_overloadpacket", None)) in (_view, _same, _unsqueeze, _index):
            source = source.args[0]
        if source.op == "get_attr" and source.target in self.parameters:
            raise _Resplit(source.target, _parameter_dim(source, argument, dim))
        return self.localized(argument, dim)

    def localized(self, argument: fx.Node, dim: int) -> fx.Node:
        """A replicated activation as the rank's share along `dim` (no communication): an expansion
        of a size-1 dimension expanded to the share, anything else sliced."""
        path = argument.meta.get("module_path", "")
        shape = list(_shape(argument))
        share = shape[dim] // self.width
        if argument.target is aten.expand.default and _shape(argument.args[0])[dim] == 1:
            sizes = list(argument.args[1])
            sizes[dim] = share
            return self.emit(aten.expand.default, (self.env[argument.args[0]], sizes), {}, path)
        return self.emit(aten.slice.Tensor, (self.env[argument], dim, self.rank * share, (self.rank + 1) * share),
                         {}, path)

    def reduction(self, node: fx.Node) -> None:
        source, dim = self.single_shard(node)
        rank = len(_shape(source))
        reduced = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        reduced = [reduced] if isinstance(reduced, int) else list(reduced or range(rank))
        keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        if dim not in {_normal(d, rank) for d in reduced}:
            after = dim - sum(1 for d in reduced if _normal(d, rank) < dim) * (not keep)
            return self.copy(node, Shard(after))
        name = node.target._overloadpacket.__name__
        if name not in ("amax", "sum", "mean"):
            raise self.fail(node, f"a {name} over the split dimension")
        path = node.meta.get("module_path", "")
        self.copy(node, REPLICATE)
        if name == "mean":  # the mean of the ranks' means
            self.env[node] = self.emit(aten.div.Scalar, (self.env[node], self.width), {}, path)
        self.env[node] = self.collective(all_reduce, self.env[node], path, "max" if name == "amax" else "sum")

    def values_and_indices(self, node: fx.Node) -> None:
        """max(x, dim) / topk(x, k, dim): both outputs split as the input, the dimension not the split one."""
        source, dim = self.single_shard(node)
        rank = len(_shape(source))
        reduced = _normal(node.args[1] if node.target._overloadpacket is aten.max else (
            node.args[2] if len(node.args) > 2 else -1), rank)
        keep = node.target._overloadpacket is aten.topk or (len(node.args) > 2 and bool(node.args[2]))
        if reduced == dim:
            raise self.fail(node, "a maximum over the split dimension")
        after = dim if keep or reduced > dim else dim - 1
        self.copy(node, (Shard(after), Shard(after)))

    def lookup(self, node: fx.Node) -> None:
        """embedding(table, ids) or gather(source, dim, ids) into a table split on the looked-up dimension."""
        embedding = node.target is aten.embedding.default
        table, ids = (node.args[0], node.args[1]) if embedding else (node.args[0], node.args[2])
        placement = self.placement[table]
        looked_up = 0 if embedding else _normal(node.args[1], len(_shape(table)))
        if not isinstance(self.placement[ids], Replicate) or not isinstance(placement, Shard):
            raise self.fail(node, f"a lookup of {self.placement[ids]} indices")
        if _normal(placement.dim, len(_shape(table))) != looked_up:
            if embedding:
                raise self.fail(node, f"an embedding table split on {placement}")
            return self.copy(node, placement)
        path = node.meta.get("module_path", "")
        unsqueeze = ids.target is aten.unsqueeze.default and _normal(ids.args[1], len(_shape(ids))) == len(
            _shape(ids)) - 1
        if unsqueeze:  # mask the indices before they gain the lookup's dimension
            ids = ids.args[0]
        local_ids, outside = self.env[ids], None
        if self.width > 1:  # the indices outside the rank's rows look up its row 0, then are zeroed
            rows = _shape(table)[looked_up] // self.width
            start, end = self.rank * rows, (self.rank + 1) * rows
            below = self.emit(aten.lt.Scalar, (local_ids, start), {}, path)
            above = self.emit(aten.ge.Scalar, (local_ids, end), {}, path)
            outside = self.emit(aten.bitwise_or.Tensor, (below, above), {}, path)
            shifted = self.emit(aten.sub.Tensor, (local_ids, start), {}, path)
            local_ids = self.emit(aten.masked_fill.Scalar, (shifted, outside, 0), {}, path)
        index = self.unsqueezed(local_ids, path) if unsqueeze else local_ids
        args = (self.env[table], index) if embedding else (self.env[table], node.args[1], index)
        self.env[node] = self.emit(node.target, (*args, *node.args[len(args):]), {}, path)
        self.placement[node], self.partial_group[node] = Partial(), "tensor"
        self.pending_masks[node], self.mask_shapes[node] = outside, len(_shape(ids))

    def unsqueezed(self, value: fx.Node, path: str) -> fx.Node:
        return self.emit(aten.unsqueeze.default, (value, -1), {}, path)

    def norm(self, node: fx.Node) -> None:
        """rms_norm(x, shape, weight, eps) over a split last dimension: the mean of squares all-reduced."""
        source, dim = self.single_shard(node)
        rank = len(_shape(source))
        if node.target is not aten.rms_norm.default or dim != rank - 1:
            if dim < rank - len(node.args[1]):
                return self.copy(node, Shard(dim))
            raise self.fail(node, "a layer norm over the split dimension")
        path = node.meta.get("module_path", "")
        x = self.env[source]
        size = _shape(source)[-1]
        squares = self.emit(aten.pow.Tensor_Scalar, (x, 2), {}, path)
        total = self.emit(aten.sum.dim_IntList, (squares, [-1], True), {}, path)
        total = self.collective(all_reduce, total, path, "sum")
        eps = node.args[3] if len(node.args) > 3 and node.args[3] is not None else torch.finfo(torch.float32).eps
        mean = self.emit(aten.div.Scalar, (total, size), {}, path)
        scale = self.emit(aten.rsqrt.default, (self.emit(aten.add.Scalar, (mean, eps), {}, path),), {}, path)
        out = self.emit(aten.mul.Tensor, (x, scale), {}, path)
        weight = node.args[2] if len(node.args) > 2 else None
        if weight is not None:
            if not isinstance(self.placement[weight], Shard):
                raise _Resplit(weight.target, 0)
            out = self.emit(aten.mul.Tensor, (out, self.env[weight]), {}, path)
        self.env[node] = out
        self.placement[node] = Shard(dim)


def _fused_parts(module: fx.GraphModule, plan: Plan, parameters: Mapping[str, nn.Parameter]
                 ) -> dict[str, tuple[tuple[int, int], ...]]:
    """The parts of each colwise weight (and bias) whose product's output is cut into pieces on its
    last dimension (slices, chunks: a fused q, k, v or gate and up projection), as (start, size):
    each rank holds its share of every part, as Megatron lays a fused projection out."""
    found: dict[str, tuple[tuple[int, int], ...]] = {}
    for node in module.graph.nodes:
        if node.target is not aten.linear.default or plan.parameter_style(node.args[1].target) != COLWISE:
            continue
        features, last = _shape(node)[-1], len(_shape(node)) - 1
        parts: set[tuple[int, int]] = set()
        for user in node.users:
            if user.target is aten.slice.Tensor and _normal(user.args[1], last + 1) == last and (
                    len(user.args) < 5 or user.args[4] == 1):
                start = user.args[2] or 0
                end = min(user.args[3] if len(user.args) > 3 and user.args[3] is not None else features, features)
                parts.add((start, end - start))
            elif user.target is aten.chunk.default and _normal(user.args[2] if len(user.args) > 2 else 0,
                                                              last + 1) == last:
                size = features // user.args[1]
                parts.update((index * size, size) for index in range(user.args[1]))
        if len(parts) > 1 and sum(size for _, size in parts) == features:
            for argument in node.args[1:3]:
                if isinstance(argument, fx.Node):
                    found[argument.target] = tuple(sorted(parts))
    return found


#: Operators through which a Partial sum stays partial: moves and copies of its elements, and sums.
_MOVES = {aten.view, aten.view_as, aten.reshape, aten._unsafe_view, aten.flatten, aten.unflatten, aten.pad,
          aten.constant_pad_nd,
          aten.transpose, aten.permute, aten.unsqueeze, aten.squeeze, aten.contiguous, aten.clone, aten.to,
          aten._to_copy, aten.alias, aten._assert_tensor_metadata, aten.sum}


def _keeps_partial(user: fx.Node, value: fx.Node) -> bool:
    """Whether `user` of a Partial `value` gives a Partial sum of the same reduction: a move or copy of
    its elements, a row pick by indices, a product with a replicated factor."""
    packet = getattr(user.target, "_overloadpacket", None)
    if packet in _MOVES:
        return user.args[0] is value
    if packet in (aten.index_select, aten.index):
        return user.args[0] is value
    if packet is aten.mul:
        return sum(argument is value for argument in user.args) == 1
    return False


@dataclass(frozen=True, kw_only=True)
class _ExpertPoints:
    """Where a mixture's tokens go to their experts and back (an all-to-all over the expert-parallel
    group after each: the identity at one rank), and the module inputs the experts' split products
    read (copied into the experts' tensor-parallel group, `EXPERT_TENSOR`, once, as Megatron's MoE
    layer does), with the grouped products that read them."""

    dispatches: frozenset[fx.Node]
    combines: frozenset[fx.Node]
    entries: Mapping[fx.Node, str]
    entered: frozenset[fx.Node]


def _expert_points(module: fx.GraphModule, plan: Plan, parameters: Mapping[str, nn.Parameter]) -> _ExpertPoints:
    """The dispatch (the row pick that gathers a grouped product's tokens), the combine (the grouped
    down product's output, or its flattening of the experts' dimension) and the module input of each
    mixture (`_ExpertPoints`)."""
    dispatches, combines, entries, entered = set(), set(), {}, set()
    for node in module.graph.nodes:
        owner = _weight_product(node, parameters)
        if owner is None or len(_shape(node.args[1])) != 3:
            continue
        style = plan.parameter_style(owner)
        if style == ROWWISE:
            flattened = [user for user in node.users if user.target is aten.flatten.using_ints]
            combines.add(flattened[0] if len(_shape(node)) == 3 and flattened else node)
            continue
        if style != COLWISE:
            continue
        child = node.meta.get("module_path", "")
        source = node.args[0]
        while isinstance(source, fx.Node) and source.op == "call_function":
            packet = getattr(source.target, "_overloadpacket", None)
            if packet in (aten.index_select, aten.index) and not dispatches & {source}:
                dispatches.add(source)
            if source.meta.get("module_path", "") != child or packet not in (
                    _MOVES | {aten.index_select, aten.index}):
                break
            source = source.args[0]
        if isinstance(source, fx.Node):
            entries[source] = child
            entered.add(node)
    return _ExpertPoints(dispatches=frozenset(dispatches), combines=frozenset(combines), entries=entries,
                         entered=frozenset(entered))


def _kv_replicas(module: fx.GraphModule, plan: Plan, width: int) -> dict[str, int]:
    """Ranks per slice of each colwise weight whose product's heads are fewer than the ranks (the
    key/value heads of grouped-query attention at a width above them: each held by width / heads
    ranks, Megatron's rule)."""
    found: dict[str, int] = {}
    for node in module.graph.nodes:
        if node.target is not aten.linear.default or plan.parameter_style(node.args[1].target) != COLWISE:
            continue
        for user in node.users:
            if getattr(user.target, "_overloadpacket", None) in (aten.unflatten, aten.view, aten.reshape) and \
                    len(_shape(user)) == len(_shape(node)) + 1:
                heads = _shape(user)[-2]
                if heads < width and width % heads == 0:
                    for argument in node.args[1:3]:
                        if isinstance(argument, fx.Node):
                            found[argument.target] = width // heads
    return found


class _Resplit(Exception):
    """A replicated parameter turned out to be split with an activation: start again with it split."""

    def __init__(self, target: str, dim: int) -> None:
        super().__init__(target)
        self.target, self.dim = target, dim


def _parameter_dim(parameter: fx.Node, argument: fx.Node, dim: int) -> int:
    """The parameter's dimension that becomes `dim` of `argument` through views and row picks: the one
    of the same size, else the one aligned from the end."""
    shape, seen = _shape(parameter), _shape(argument)
    same = [index for index, size in enumerate(shape) if size == seen[dim]]
    return same[0] if len(same) == 1 else len(shape) - (len(seen) - dim)


def target_is_linear(node: fx.Node) -> bool:
    return node.target is aten.linear.default


def _local_sizes(rank: _Rank, node: fx.Node, dim: int, replicas: int = 1) -> list[int]:
    """The node's sizes on one rank, dimension `dim` split in width / `replicas` slices."""
    sizes, slices = list(_shape(node)), rank.width // replicas
    if sizes[dim] % slices:
        raise rank.fail(node, f"dimension {dim} of {sizes[dim]} does not split over {rank.width} ranks")
    sizes[dim] //= slices
    return sizes


def _same(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    rank.copy(node, Shard(dim + len(_shape(node)) - len(_shape(source))))


def _view(rank: _Rank, node: fx.Node) -> None:
    """view / reshape / expand: the split dimension is the output dimension that starts at the same
    element offset; the sizes given become the rank's."""
    source, dim = rank.single_shard(node)
    before = math.prod(_shape(source)[:dim])
    out, replicas = _shape(node), rank.replicas.get(source, 1)
    if node.target._overloadpacket is aten.expand:
        after = dim + len(out) - len(_shape(source))
        sizes = _local_sizes(rank, node, after, replicas)
        if replicas > 1 and after + 1 < len(out) and _shape(source)[dim + 1] == 1 < out[after + 1]:
            sizes[after + 1] //= replicas  # a replicated key/value head repeated for the rank's query heads
            rank.replicas[node] = replicas
        return rank.copy(node, Shard(after), args=(node.args[0], sizes, *node.args[2:]))
    after = next((j for j in range(len(out)) if math.prod(out[:j]) == before and out[j] > 1), None)
    if after is None or (out[after] % rank.width):
        raise rank.fail(node, f"a reshape of {Shard(dim)} to {list(out)}")
    if replicas > 1 and out[after] > _shape(source)[dim]:  # replicated heads merged with their repeats
        rank.replicas[node], replicas = 1, 1
    rank.copy(node, Shard(after), args=(node.args[0], _local_sizes(rank, node, after, replicas), *node.args[2:]))


def _unflatten(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1], len(_shape(source)))
    if at < dim:
        return rank.copy(node, Shard(dim + len(node.args[2]) - 1))
    if at > dim:
        return rank.copy(node, Shard(dim))
    sizes = _local_sizes(rank, node, at, rank.replicas.get(source, 1))
    rank.copy(node, Shard(at), args=(node.args[0], node.args[1], sizes[at:at + len(node.args[2])]))


def _flatten(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    length = len(_shape(source))
    start = _normal(node.args[1] if len(node.args) > 1 else 0, length)
    end = _normal(node.args[2] if len(node.args) > 2 else -1, length)
    if dim < start:
        return rank.copy(node, Shard(dim))
    if dim > end:
        return rank.copy(node, Shard(dim - (end - start)))
    if dim != start:
        raise rank.fail(node, f"a flatten of {Shard(dim)} inside dimensions {start}-{end}")
    if end > start:  # replicated key/value heads merged with their repeats: evenly split
        rank.replicas[node] = 1
    rank.copy(node, Shard(start))


def _transpose(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    length = len(_shape(source))
    a, b = _normal(node.args[1], length), _normal(node.args[2], length)
    rank.copy(node, Shard(b if dim == a else a if dim == b else dim))


def _permute(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    order = [_normal(d, len(_shape(source))) for d in node.args[1]]
    rank.copy(node, Shard(order.index(dim)))


def _unsqueeze(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1], len(_shape(node)))
    rank.copy(node, Shard(dim + 1 if at <= dim else dim))


def _squeeze(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    shape = _shape(source)
    dims = node.args[1] if len(node.args) > 1 else [d for d, size in enumerate(shape) if size == 1]
    dims = [dims] if isinstance(dims, int) else dims
    removed = [_normal(d, len(shape)) for d in dims if shape[_normal(d, len(shape))] == 1]
    rank.copy(node, Shard(dim - sum(1 for d in removed if d < dim)))


def _slice(rank: _Rank, node: fx.Node) -> None:
    """A slice along the split dimension is the rank's share of each part (a fused projection)."""
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1] if len(node.args) > 1 else 0, len(_shape(source)))
    if at != dim:
        return rank.copy(node, Shard(dim))
    size = _shape(source)[dim]
    start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
    end = min(node.args[3] if len(node.args) > 3 and node.args[3] is not None else size, size)
    step = node.args[4] if len(node.args) > 4 else 1
    if step > 1 and start < step and end == size:  # an interleaved part: every step-th of the rank's
        return rank.copy(node, Shard(dim))
    if start % rank.width or end % rank.width:
        raise rank.fail(node, f"a slice {start}:{end} of a dimension split over {rank.width} ranks")
    rank.copy(node, Shard(dim), args=(node.args[0], at, start // rank.width, end // rank.width, step))


def _index(rank: _Rank, node: fx.Node) -> None:
    """tensor[indices] (rows picked by replicated indices) of a tensor split on a later dimension."""
    source, indices = node.args[0], node.args[1]
    placement = rank.placement[source]
    if any(index is not None and not isinstance(rank.placement[index], Replicate) for index in indices) or \
            not isinstance(placement, Shard):
        raise rank.fail(node, "an indexing by split indices")
    dim = _normal(placement.dim, len(_shape(source)))
    if dim < len(indices):
        raise rank.fail(node, f"an indexing along the split dimension {dim}")
    rank.copy(node, Shard(dim + len(_shape(node)) - len(_shape(source))))


def _select(rank: _Rank, node: fx.Node) -> None:
    """x.select(dim, index) along another dimension than the split one."""
    source, dim = rank.single_shard(node)
    at = _normal(node.args[1], len(_shape(source)))
    if at == dim:
        raise rank.fail(node, "a pick along the split dimension")
    rank.copy(node, Shard(dim - (at < dim)))


def _chunk(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    chunks = node.args[1]
    rank.copy(node, tuple(Shard(dim) for _ in range(chunks)))


def _cat(rank: _Rank, node: fx.Node) -> None:
    tensors = node.args[0]
    length = len(_shape(node))
    at = _normal(node.args[1] if len(node.args) > 1 else 0, length)
    dims = {_normal(rank.placement[t].dim, length) for t in tensors if isinstance(rank.placement[t], Shard)}
    if len(dims) != 1 or at in dims:
        raise rank.fail(node, f"a concatenation of {[str(rank.placement[t]) for t in tensors]} on {at}")
    dim = dims.pop()
    args = list(tensors)
    for index, tensor in enumerate(tensors):
        if isinstance(rank.placement[tensor], Replicate) and _shape(tensor)[dim] > 1:
            args[index] = rank.split_operand(node, tensor, dim)
    rank.copy(node, Shard(dim), args=(args, *node.args[1:]))


def _matmul(rank: _Rank, node: fx.Node) -> None:
    """A product of activations split on a batch dimension (the heads) is split there."""
    a, b = node.args[0], node.args[1]
    pa, pb = rank.placement[a], rank.placement[b]
    la, lb, lo = len(_shape(a)), len(_shape(b)), len(_shape(node))
    if isinstance(pa, Shard) and isinstance(pb, Shard):
        da, db = _normal(pa.dim, la) + lo - la, _normal(pb.dim, lb) + lo - lb
        if da == db and da < lo - 2:
            return rank.copy(node, Shard(da))
    raise rank.fail(node, f"a product of {pa} and {pb} activations")


def _softmax(rank: _Rank, node: fx.Node) -> None:
    source, dim = rank.single_shard(node)
    if _normal(node.args[1], len(_shape(source))) == dim:
        raise rank.fail(node, "a softmax over the split dimension")
    rank.copy(node, Shard(dim))


def _no_grad(rank: _Rank, node: fx.Node) -> None:
    raise rank.fail(node, "a no-grad region reading a split tensor")


_RULES = {
    aten.view: _view, aten.reshape: _view, aten._unsafe_view: _view, aten.expand: _view,
    aten.unflatten: _unflatten, aten.flatten: _flatten, aten.transpose: _transpose, aten.permute: _permute,
    aten.unsqueeze: _unsqueeze, aten.squeeze: _squeeze, aten.slice: _slice, aten.chunk: _chunk, aten.select: _select,
    aten.cat: _cat, aten.index: _index, aten.matmul: _matmul, aten.bmm: _matmul, aten.softmax: _softmax, aten._softmax: _softmax,
    **{op: _same for op in (aten.contiguous, aten.clone, aten.to, aten._to_copy, aten.type_as, aten.alias,
                            aten.detach, aten.dropout, aten._assert_tensor_metadata)},
    aten.max: _Rank.values_and_indices, aten.topk: _Rank.values_and_indices,
    aten.amax: _Rank.reduction, aten.sum: _Rank.reduction, aten.mean: _Rank.reduction,
    aten.embedding: _Rank.lookup, aten.gather: _Rank.lookup,
    aten.rms_norm: _Rank.norm, aten.layer_norm: _Rank.norm,
}


def apply_plan(module: fx.GraphModule, plan: Plan, width: int, rank: int = 0,
               values: Mapping[str, torch.Tensor] | None = None) -> fx.GraphModule:
    """Rank `rank`'s graph at `width` of the exported graph `module` under `plan`, annotated as
    `graph_extract.export` annotates (shapes from running it on meta tensors). With `values` (the
    unsharded parameters and buffers by path, real tensors), the rank's parameters are their shares,
    so that the rank graphs run (`graph_extract.verify`)."""
    resplit: dict[str, int] = {}
    while True:
        try:
            built = _Rank(module, plan, width, rank, values, resplit).run()
            break
        except _Resplit as found:
            if found.target in resplit:
                raise InputError(f"plan: {found.target}: used split on two dimensions") from None
            resplit[found.target] = found.dim
    return _propagate(built, module)


def _propagate(built: fx.GraphModule, module: fx.GraphModule) -> fx.GraphModule:
    """Shapes of the rank graph: run it on meta tensors of the inputs' shapes."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from torch._subclasses.fake_tensor import FakeTensorMode

    inputs = [node.meta["val"] for node in module.graph.nodes if node.op == "placeholder"]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fake = [torch.empty(value.shape, dtype=value.dtype, device=value.device) for value in inputs]
    FakeTensorProp(built, mode).propagate(*fake)
    paths = {node: node.meta.get("module_path", "") for node in built.graph.nodes}
    annotate(built)
    for node, path in paths.items():
        node.meta["module_path"] = path
    return built
