"""The sharding graph of an exported model's transformer block (the search of
`solver.auto_sharding.from_export`).

A block's nodes of the exported, unsharded graph (`graph_extract.export`: module path `<blocks>.<i>`
or under it) become a `ShardingGraph`, one operator per node, each tensor with the node's shape; an
operator's iteration dims are named by position:

- a weight product (aten.linear, mm or matmul of a `get_attr` weight): `x[..,k] w[n,k] -> y[..,n]`;
  splitting n is `colwise`, k `rowwise`, nothing is replicated compute;
- an activation product (matmul, bmm: the explicit attention core) and
  aten.scaled_dot_product_attention (and its flash and efficient variants) over (b, heads, s,
  head_dim): only the heads may split;
- element-wise operators (operands aligned from the last dim; a broadcast size-1 dim is its own,
  unsplit dim), norms (rms_norm, layer_norm), softmax, amax and max over a dim (its values; its
  indices are integers) with their reduced dims unsplit; sum and mean, whose reduced dim may split,
  their output then a partial sum all-reduced where it is read whole (the mean of squares of a norm
  written out over split features, as the plan pass all-reduces it);
- views (view, reshape, unflatten, flatten, unsqueeze, squeeze, expand, transpose, permute, slice,
  select, cat, the pieces of chunk, split, split_with_sizes and unbind read through getitem, a pick
  of rows by constant indices that is no dispatch): dims mapped by their sizes, a merged dim
  (heads·head_dim) and its leading factor (heads) being one iteration dim that splits as many ways
  as the factor (a split of the merged dim is a split of its leading factor, so that a fused q, k, v
  viewed as [.., heads, 3, head_dim] splits on its heads); a picked dim (select, unbind) is consumed;
  the other factors, a concatenated dim, an expanded one and the indexed dims of a row pick do not
  split. A sliced or cut dim does not split, but where the plan pass splits it with the part
  (`graph_extract.plan_rules`): a part of a fused projection's output (a linear map whose users all
  slice or cut its features into parts, each a multiple of t: a fused q, k, v or gate and up,
  `fused_parts`; each rank holds its share of every part, Megatron's layout of a fused weight), and
  every step-th element from one of the first `step` to the end (an interleaved gate and up: each
  rank's contiguous share holds whole steps). An expansion of size-1 dims read only by element-wise
  operators and concatenations is left to them as a broadcast (a latent attention's one rotated key
  expanded to the heads): they read it whole where they split the expanded dim, and its gradient is
  then a partial sum all-reduced (the plan pass cuts the expansion to the rank's heads).

A mixture of experts (the zoo's `MixtureOfExperts`: Mixtral, Qwen3-MoE, DeepSeek-V3's routed
experts; transformers' grouped experts, GPT-OSS's):

- the router (a weight product whose values reach a top-k through other operators only) is
  replicated, as derived_plan leaves it; softmax, top-k (its values; a `route` operator over the
  experts' dim) and the weights' normalisation follow it; integer and boolean tensors (the chosen
  experts, the slots of the dispatch, masks) are constants;
- an expert product (bmm, matmul or `_grouped_mm` of an [experts, in, out] weight) is
  `x[..,k] w[e,k,n] -> y[..,n]`, splitting n `colwise` and k `rowwise` as the plan pass splits the
  weight's out or in dimension, in the experts' own tensor-parallel group (taken as the t ranks);
  the experts' dim and the token slots never split: expert parallelism is phaze's placement
  search's, not this ILP's;
- the dispatch (pads, row picks and reshapes of the tokens whose rows reach an expert product,
  `moves_rows`) is part of the products that read it: they read the tokens [.., h] themselves, so
  that under a colwise split the gradient of the tokens (not of the k-times larger dispatched rows)
  is all-reduced, once for the tensor (the plan pass's one copy into the experts' group);
- the combine (the expert product's rows moved back to the tokens, weighed by the routing
  weights and summed, `moves_rows`) is part of the product that writes it: the product's output is
  the combine's [.., h], so that under a rowwise split the tokens' sum is all-reduced after the
  combine, as the plan pass keeps the `Partial` sum through these operators and all-reduces it
  there, and the routing weights' gradient (a sum over the split features) is all-reduced too. The
  combine's element-wise work (1/f of the product's, f the experts' width) is counted as the
  product's, split with it. A product whose rows are first added to a bias (GPT-OSS's experts) has
  no combine: its partial sum is all-reduced on the rows, as the plan pass all-reduces it there.

The batch and sequence dims (those of the block's input but its last, and every dim they flow into)
and the head dim never split: data and context parallelism are other axes of phaze's search. A dim
of size n splits t ways if t divides n or, as a grouped-query attention's key/value heads under
Megatron's rule, n divides t (each of the n parts then held by t/n ranks; the ILP prices such a split
as t ways). Parameters other than the weight products' (norms' scales, biases) and buffers (masks,
rotary tables) are constants outside the graph. Any other operator is refused in one line naming it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import fx

from phaze_common.checks import InputError, positive_integer
from graph_extract.plan_rules import CUTS, cut_pieces, slice_bounds

from .export_nodes import (IDENTITIES, PADS, RESHAPES, ROW_PICKS, TOP_K, block_kinds, combine_chain, first_shape,
                           in_block, is_expert_product, is_floating, moves_rows, reaches_expert_product, routers,
                           weight_of)
from .export_views import FIXED, FREE, TOKENS, ViewBuilder, _shape
from .graph import Op, Operand, ShardingGraph

aten = torch.ops.aten

_ACTIVATION_PRODUCTS = (aten.matmul.default, aten.bmm.default, aten.mm.default)
_ATTENTION = (aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention.default,
              aten._scaled_dot_product_efficient_attention.default,
              aten._scaled_dot_product_flash_attention_for_cpu.default)
_NORMS = (aten.rms_norm.default, aten.layer_norm.default)
_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_REDUCTIONS = (aten.mean.dim, aten.sum.dim_IntList, aten.amax.default)
#: Reductions whose result over a split dim is the sum of the ranks' results (then all-reduced).
_SUMS = (aten.mean.dim, aten.sum.dim_IntList)
#: Operators that take a broadcast operand as it is (an expansion of size-1 dims left to them).
_BROADCASTING = (aten.cat.default,)


@dataclass(frozen=True, kw_only=True)
class BlockGraph:
    """A block's sharding graph (block `<blocks>.<index>`), what each weight product's plan entry
    names (operator name -> the module path of a linear map, the parameter path of an experts'
    weight, in this block) and the product's output dim (its split: colwise) and contracted dim
    (rowwise)."""

    graph: ShardingGraph
    blocks: str
    index: int
    products: Mapping[str, str]
    out_dims: Mapping[str, str]
    in_dims: Mapping[str, str]


class _OperatorBuilder(ViewBuilder):
    """The block's operators by kind: weight and expert products, routing, element-wise products,
    attention kernels and reductions (`node` dispatches one node to them)."""

    def weight_product(self, node: fx.Node, source: fx.Node, weight: fx.Node, transposed: bool) -> None:
        """x[.., k] · w -> y[.., n], w [n, k] (a linear map) or [k, n]."""
        name = self.name(source)
        if name is None:
            raise self.refuse(node, "a product of a weight and a constant")
        x = self.tensors[name].shape
        (n, k) = weight_shape = _shape(weight) if transposed else tuple(reversed(_shape(weight)))
        if len(weight_shape) != 2 or x[-1] != k:
            raise self.refuse(node, f"a product of {list(x)} and a weight of {list(_shape(weight))}")
        lead = tuple(f"i{i}" for i in range(len(x) - 1))
        parameter = weight.target
        self.add_tensor(parameter, _shape(weight), [FREE, FREE], parameter=True)
        sizes = {**dict(zip(lead, x[:-1])), "k": k, "n": n}
        router = node in self.routers  # replicated
        labels = [*self.labels[name][:-1], FIXED if router else FREE]
        fixed = {"k", "n"} if router else {"k"} if self.labels[name][-1] is not FREE else set()
        self.add_op(node, "product", [(name, (*lead, "k")), (parameter, ("n", "k") if transposed else ("k", "n"))],
                    (*lead, "n"), sizes, fixed, labels, 2 * math.prod(x) * n)
        self.products[node.name] = parameter.rpartition(".")[0]
        self.out_dims[node.name], self.in_dims[node.name] = "n", "k"

    def expert_product(self, node: fx.Node, end: fx.Node, chain: list[fx.Node]) -> None:
        """x[.., k] · w[e, k, n] -> [.., n]: an experts' weight, x the tokens its dispatch picks rows of
        (or its own input), the output the combine's `end` after `chain` (or the product's own)."""
        source, weight = node.args[0], node.args[1]
        name = self.dispatched.get(source) or self.name(source)
        if name is None:
            raise self.refuse(node, "an expert product of a constant")
        x, (experts, k, n) = self.tensors[name].shape, _shape(weight)
        if x[-1] != k:
            raise self.refuse(node, f"an expert product of {list(x)} and a weight of {list(_shape(weight))}")
        parameter = weight.target
        self.add_tensor(parameter, _shape(weight), [FIXED, FREE, FREE], parameter=True)
        out = _shape(end)
        lead_in, lead_out = [f"x{i}" for i in range(len(x) - 1)], [f"y{i}" for i in range(len(out) - 1)]
        sizes = {**dict(zip(lead_in, x[:-1])), **dict(zip(lead_out, out[:-1])), "e": experts, "k": k, "n": n}
        inputs = [(name, (*lead_in, "k")), (parameter, ("e", "k", "n"))]
        flops = 2 * math.prod(_shape(node)) * k
        for link in chain:  # the combine's weighing (a factor: an operand of its own dims) and sum
            if link.target is aten.sum.dim_IntList:
                flops += math.prod(_shape(link.args[0]))
            if link.target is not aten.mul.Tensor:
                continue
            flops += math.prod(_shape(link))
            for factor in map(self.name, link.args):
                if factor is not None:
                    dims = tuple(f"w{len(inputs)}_{j}" for j in range(len(self.tensors[factor].shape)))
                    sizes.update(zip(dims, self.tensors[factor].shape))
                    inputs.append((factor, dims))
        fixed = set(sizes) - {"k", "n"} | ({"k"} if self.labels[name][-1] is not FREE else set())
        self.add_tensor(end.name, out, [FIXED] * (len(out) - 1) + [FREE])
        self.ops.append(Op(name=node.name, kind="product",
                           inputs=tuple(Operand(tensor=t, dims=d) for t, d in inputs),
                           output=Operand(tensor=end.name, dims=(*lead_out, "n")),
                           sizes=tuple((dim, self.capacity(size) if dim not in fixed else size)
                                       for dim, size in sizes.items()),
                           fixed=frozenset(fixed), flops=float(flops)))
        self.products[node.name] = parameter
        self.out_dims[node.name], self.in_dims[node.name] = "n", "k"

    def top_k(self, node: fx.Node) -> None:
        """The values of a top-k over one dim: a `route` operator, that dim unsplit."""
        name = self.name(node.args[0])
        shape, out = self.tensors[name].shape, first_shape(node)
        over = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)) % len(shape)
        dims = tuple(f"i{i}" if i != over else "x" for i in range(len(shape)))
        out_dims = tuple(dim if i != over else "j" for i, dim in enumerate(dims))
        sizes = {**dict(zip(dims, shape)), "j": out[over]}
        labels = [label if i != over else FIXED for i, label in enumerate(self.labels[name])]
        self.add_op(node, "route", [(name, dims)], out_dims, sizes, {"x", "j"}, labels, math.prod(shape), shape=out)

    def activation_product(self, node: fx.Node, left: fx.Node, right: fx.Node) -> None:
        """a[.., m, k] · b[.., k, n] -> [.., m, n] (batch dims aligned)."""
        out = _shape(node)
        names = [self.name(left), self.name(right)]
        if None in names or len(out) < 3:
            raise self.refuse(node, "a product of an activation and a constant")
        shapes = [self.tensors[name].shape for name in names]
        rank = len(out)
        batch = [f"i{i}" for i in range(rank - 2)]
        sizes = {**dict(zip(batch, out[:-2])), "m": out[-2], "k": shapes[0][-1], "n": out[-1]}
        inputs, fixed = [], set()
        labels: list[str | None] = [FREE] * (rank - 2) + [self.labels[names[0]][-2], self.labels[names[1]][-1]]
        for index, (name, shape, tail) in enumerate(zip(names, shapes, (("m", "k"), ("k", "n")))):
            dims = []
            for j, size in enumerate(shape[:-2]):
                i = j + rank - len(shape)
                if size == out[i]:
                    dims.append(batch[i])
                    if self.labels[name][j] is not FREE:
                        labels[i] = self.labels[name][j]
                else:
                    dims.append(f"u{index}_{j}")
                    sizes[f"u{index}_{j}"] = size
                    fixed.add(f"u{index}_{j}")
            inputs.append((name, (*dims, *tail)))
        if self.labels[names[0]][-1] is not FREE:
            fixed.add("k")
        self.add_op(node, "product", inputs, (*batch, "m", "n"), sizes, fixed, labels,
                    2 * math.prod(out) * shapes[0][-1])

    def attention(self, node: fx.Node) -> None:
        """softmax(q·kᵀ)·v over q [.., s, d], k [.., r, d], v [.., r, dv] -> [.., s, dv]."""
        names = [self.name(argument) for argument in node.args[:3]]
        if None in names:
            raise self.refuse(node, "an attention of constants")
        q, k, v = (self.tensors[name].shape for name in names)
        batch = [f"i{i}" for i in range(len(q) - 2)]
        sizes = {**dict(zip(batch, q[:-2])), "s": q[-2], "r": k[-2], "d": q[-1], "dv": v[-1]}
        inputs = [(names[0], (*batch, "s", "d")), (names[1], (*batch, "r", "d")), (names[2], (*batch, "r", "dv"))]
        labels = [*self.labels[names[0]][:-1], FIXED]
        self.add_op(node, "product", inputs, (*batch, "s", "dv"), sizes, {"s", "r", "d", "dv"}, labels,
                    2 * math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1]), shape=(*q[:-1], v[-1]))

    def reduced(self, node: fx.Node, kind: str, source: fx.Node, reduced: list[int], keep: bool | None,
                shape: tuple[int, ...] | None = None) -> None:
        """A norm or reduction of `source` over its `reduced` dims (kept as size-1 dims with `keep`; a
        norm: None), its output of `shape` (the node's, else given: a maximum's values). A `product`
        (a sum or mean) may split a reduced dim that may split, its output then a Partial sum."""
        name, out_shape = self.name(source), shape
        shape = self.tensors[name].shape
        dims = tuple(f"i{i}" for i in range(len(shape)))
        reduced = sorted({d % len(shape) for d in reduced})
        sizes = dict(zip(dims, shape))
        if keep is None:  # a norm: the output has the input's dims
            out_dims, labels = dims, list(self.labels[name])
        else:
            out_dims = tuple(dim if i not in reduced else f"o{i}" for i, dim in enumerate(dims) if keep or i not in reduced)
            sizes.update({f"o{i}": 1 for i in reduced if keep})
            labels = [label if i not in reduced else FIXED for i, label in enumerate(self.labels[name])
                      if keep or i not in reduced]
        fixed = {dims[i] for i in reduced if kind != "product" or self.labels[name][i] is not FREE}
        self.add_op(node, kind, [(name, dims)], out_dims, sizes, fixed, labels, math.prod(shape), shape=out_shape)

    def node(self, node: fx.Node) -> None:
        target, args = node.target, node.args
        if node in self.folded:
            return
        if node in self.combines:
            return self.expert_product(self.combines[node][0], node, self.combines[node][1])
        if not is_floating(node):  # the routing's integers, masks: constants
            return
        if _shape(node) is None and not node.users:  # a check without a value (_assert_tensor_metadata)
            return
        if any(argument in self.dispatched for argument in node.all_input_nodes) and not is_expert_product(node):
            if moves_rows(node, args[0], combine=False):
                self.dispatched[node] = self.dispatched[args[0]]
                return
            raise self.refuse(node, "a use of the experts' dispatched rows other than an expert product")
        if target in PADS + ROW_PICKS and moves_rows(node, args[0], combine=False) and self.name(args[0]) is not None \
                and reaches_expert_product(node, self.inside):
            self.dispatched[node] = self.name(args[0])  # a dispatch: read by the expert products
            return
        if target in CUTS:
            self.cuts.add(node)
            return
        if target is operator.getitem and args[0] in self.cuts:
            at, pieces = cut_pieces(args[0])
            if args[0].target is aten.unbind.int:
                return self.pick(node, args[0].args[0], at)
            return self.part(node, args[0].args[0], at, *pieces[args[1]], 1)
        if target is operator.getitem:
            if args[1] != 0 or self.name(args[0]) is None:
                raise self.refuse(node, f"output {args[1]} of {args[0].target}")
            self.alias[node] = self.name(args[0])
            return
        if is_expert_product(node):
            chain = combine_chain(node, self.inside)
            if not chain:
                return self.expert_product(node, node, [])
            self.combines[chain[-1]] = (node, chain)
            self.folded.update(chain[:-1])
            return
        if weight_of(node) is not None:
            return self.weight_product(node, args[0], args[1], transposed=target is aten.linear.default)
        if target in TOP_K:
            return self.top_k(node)
        if target is aten.max.dim:  # its values; the indices are integers
            keep = bool(args[2]) if len(args) > 2 else bool(node.kwargs.get("keepdim", False))
            return self.reduced(node, "normalise", args[0], [args[1]], keep, first_shape(node))
        if _shape(node) is None and target not in _ATTENTION:
            raise self.refuse(node, "an operator without one tensor output")
        if target in _ACTIVATION_PRODUCTS:
            return self.activation_product(node, args[0], args[1])
        if target in _ATTENTION:
            return self.attention(node)
        if target in _NORMS:
            return self.reduced(node, "normalise", args[0], list(range(-len(args[1]), 0)), None)
        if target in _SOFTMAX:
            return self.reduced(node, "normalise", args[0], [args[1]], None)
        if target in _REDUCTIONS:
            dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or range(len(_shape(args[0]))))
            keep = bool(args[2]) if len(args) > 2 else bool(node.kwargs.get("keepdim", False))
            return self.reduced(node, "product" if target in _SUMS else "normalise", args[0], dims, keep)
        if target in RESHAPES:
            return self.reshape(node, args[0])
        if target is aten.transpose.int:
            order = list(range(len(_shape(node))))
            a, b = args[1] % len(order), args[2] % len(order)
            order[a], order[b] = order[b], order[a]
            return self.permute(node, args[0], order)
        if target is aten.permute.default:
            return self.permute(node, args[0], [d % len(_shape(node)) for d in args[1]])
        if target is aten.expand.default:
            source = _shape(args[0])
            rank = len(_shape(node))
            grown = {i + rank - len(source) for i, size in enumerate(source) if size != _shape(node)[i + rank - len(source)]}
            if all(source[i - rank + len(source)] == 1 for i in grown) and node.users and all(
                    user.target in _BROADCASTING or torch.Tag.pointwise in getattr(user.target, "tags", ())
                    for user in node.users):
                self.alias[node] = self.name(args[0])  # a broadcast, left to its readers
                return
            return self.aligned(node, "view", [args[0]], grown | set(range(rank - len(source))), 0)
        if target is aten.slice.Tensor:
            return self.part(node, args[0], *slice_bounds(node))
        if target is aten.select.int:
            return self.pick(node, args[0], args[1])
        if target is aten.index.Tensor and all(index is not None for index in args[1]):
            return self.indexed(node, args[0], len(args[1]))
        if target is aten.cat.default:
            return self.aligned(node, "view", list(args[0]), {(args[1] if len(args) > 1 else 0) % len(_shape(node))}, 0)
        if target in IDENTITIES:
            return self.aligned(node, "view", [args[0]], set(), 0)
        if torch.Tag.pointwise in getattr(target, "tags", ()):
            return self.aligned(node, "elementwise", [a for a in node.all_input_nodes])
        raise self.refuse(node, "this operator")


def block_graph(module: fx.GraphModule, blocks: str, width: int, element_bytes: int = 2, index: int = 0) -> BlockGraph:
    """The sharding graph of block `<blocks>.<index>` of an exported graph at `width` ranks."""
    positive_integer("width", width)
    prefix = f"{blocks}.{index}"
    nodes = [node for node in module.graph.nodes if node.op == "call_function" and in_block(node, prefix)]
    if not nodes:
        raise InputError(f"blocks: no node of module {prefix} in the exported graph")
    inside = set(nodes)
    outputs = [node for node in nodes if any(user not in inside for user in node.users)]
    if len(outputs) != 1 or _shape(outputs[0]) is None:
        raise InputError(f"blocks: {prefix} must hand one tensor to what follows, got {[n.name for n in outputs]}")
    shape = _shape(outputs[0])
    builder = _OperatorBuilder(width, element_bytes, inside, routers(nodes, inside))
    for node in nodes:
        for argument in node.all_input_nodes:
            if argument not in inside and argument.op != "get_attr" and _shape(argument) == shape \
                    and argument.name not in builder.tensors:
                builder.add_tensor(argument.name, shape, [TOKENS] * (len(shape) - 1) + [FREE])
    if not builder.tensors:
        raise InputError(f"blocks: {prefix} reads no tensor of its output's shape {list(shape)}")
    for node in nodes:
        if builder.reads(node):
            builder.node(node)
    graph = ShardingGraph(tensors=tuple(builder.tensors.values()), ops=tuple(builder.ops),
                          input_boundary="replicated", output_boundary="replicated")
    return BlockGraph(graph=graph, blocks=blocks, index=index, products=MappingProxyType(builder.products),
                      out_dims=MappingProxyType(builder.out_dims), in_dims=MappingProxyType(builder.in_dims))


def kind_graphs(module: fx.GraphModule, blocks: str, width: int, element_bytes: int = 2
                ) -> tuple[tuple[tuple[int, ...], BlockGraph], ...]:
    """The blocks `<blocks>.<i>` grouped by structure (`export_nodes.block_kinds`: a model's dense and
    mixture-of-experts blocks), each group with the sharding graph of its first block."""
    kinds = block_kinds(module, blocks)
    if not kinds:
        raise InputError(f"blocks: no node of module {blocks}.<i> in the exported graph")
    return tuple((indices, block_graph(module, blocks, width, element_bytes, indices[0])) for indices in kinds)
