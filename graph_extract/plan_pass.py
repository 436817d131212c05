"""The plan pass: one rank's graph of an exported (unsharded) graph under a plan, at a
tensor-parallel width (module docstring of `graph_extract.plan`; the operator rules are
`graph_extract.plan_rules`)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from phaze_common.checks import InputError
from graph_extract.export import annotate, getattr_path
from graph_extract.opgraph import EXPERT_TENSOR
from graph_extract.parallel import all_reduce, all_to_all, copy_to_tensor_parallel_region
from graph_extract.plan import COLWISE, REPLICATE, ROWWISE, Plan, _normal, _shape, _weight_product, is_grouped_product
from graph_extract.plan_rules import RULES, VIEWS, Resplit, fused_parts, parameter_dim

aten = torch.ops.aten


class Rank:
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
        self.parts = _fused_parts(module, plan)
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
        if isinstance(self.placement.get(node), (Shard, tuple)) and node not in self.replicas:  # a tuple: a chunk's
            self.replicas[node] = max((self.replicas.get(argument, 1) for argument in node.all_input_nodes
                                       if isinstance(self.placement[argument], (Shard, tuple))), default=1)
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
        if target is aten.linear.default or is_grouped_product(target) or (
                target in (aten.matmul.default, aten.bmm.default) and _weight_product(node, self.parameters)):
            return self.product(node, path)
        if any(isinstance(placement, Partial) for placement in shards.values()):
            return self.partial(node, shards)
        if not shards and not any(isinstance(self.placement.get(a), tuple) for a in tensors):
            return self.copy(node, REPLICATE)
        if target is operator.getitem:
            return self.copy(node, self.placement[node.args[0]][node.args[1]])
        rule = RULES.get(getattr(target, "_overloadpacket", None))
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
        while source.op == "call_function" and RULES.get(
                getattr(source.target, "_overloadpacket", None)) in VIEWS:
            source = source.args[0]
        if source.op == "get_attr" and source.target in self.parameters:
            raise Resplit(source.target, parameter_dim(source, argument, dim))
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

    def unsqueezed(self, value: fx.Node, path: str) -> fx.Node:
        return self.emit(aten.unsqueeze.default, (value, -1), {}, path)


def _fused_parts(module: fx.GraphModule, plan: Plan) -> dict[str, tuple[tuple[int, int], ...]]:
    """The parts (start, size) of each colwise weight (and bias) whose product's output its users cut
    into pieces on its last dimension (`plan_rules.fused_parts`: a fused q, k, v or gate and up
    projection): each rank holds its share of every part, as Megatron lays a fused projection out."""
    found: dict[str, tuple[tuple[int, int], ...]] = {}
    for node in module.graph.nodes:
        if node.target is not aten.linear.default or plan.parameter_style(node.args[1].target) != COLWISE:
            continue
        parts = fused_parts(node)
        for argument in node.args[1:3] if parts else ():
            if isinstance(argument, fx.Node):
                found[argument.target] = parts
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


def target_is_linear(node: fx.Node) -> bool:
    return node.target is aten.linear.default


def apply_plan(module: fx.GraphModule, plan: Plan, width: int, rank: int = 0,
               values: Mapping[str, torch.Tensor] | None = None) -> fx.GraphModule:
    """Rank `rank`'s graph at `width` of the exported graph `module` under `plan`, annotated as
    `graph_extract.export` annotates (shapes from running it on meta tensors). With `values` (the
    unsharded parameters and buffers by path, real tensors), the rank's parameters are their shares,
    so that the rank graphs run (`graph_extract.verify`)."""
    resplit: dict[str, int] = {}
    while True:
        try:
            built = Rank(module, plan, width, rank, values, resplit).run()
            break
        except Resplit as found:
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
