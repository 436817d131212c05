"""What the sharding graph of an exported block (`export_graph`) reads off single ATen nodes: shapes,
the weight a product multiplies, how a reshape groups dims, which operators move a tensor's rows
(dispatch and combine of a mixture of experts), and which blocks of a stack are alike."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

aten = torch.ops.aten

#: Products of an activation and a [out, in] (linear) or [in, out] weight.
WEIGHT_PRODUCTS = (aten.linear.default, aten.mm.default, aten.matmul.default)
#: Products of an activation and an experts' [experts, in, out] weight.
EXPERT_PRODUCTS = (aten.bmm.default, aten.matmul.default, aten._grouped_mm.default)
RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unflatten.int,
            aten.flatten.using_ints, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
            aten.squeeze.default, aten.view_as.default)
IDENTITIES = (aten.clone.default, aten.contiguous.default, aten._to_copy.default, aten.to.dtype,
              aten.alias.default, aten.detach.default, aten.dropout.default, aten.type_as.default)
PADS = (aten.pad.default, aten.constant_pad_nd.default)
ROW_PICKS = (aten.index_select.default, aten.index.Tensor)
TOP_K = (aten.topk.default,)


def node_shape(node: object) -> tuple[int, ...] | None:
    """The shape of a node's one tensor output; None for a constant, or several outputs."""
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    if not hasattr(meta, "shape"):  # none, or a tuple of outputs
        return None
    return tuple(int(size) for size in meta.shape)


def first_shape(node: fx.Node) -> tuple[int, ...] | None:
    """The shape of a node's first output (a top-k's values)."""
    value = node.meta.get("val")
    value = value[0] if isinstance(value, (tuple, list)) and value else value
    return tuple(int(size) for size in value.shape) if isinstance(value, torch.Tensor) else None


def is_floating(node: fx.Node) -> bool:
    """Whether a node's output is not a tensor of integers or booleans (routing bookkeeping, masks)."""
    value = node.meta.get("val")
    return not isinstance(value, torch.Tensor) or value.dtype.is_floating_point


def in_block(node: fx.Node, prefix: str) -> bool:
    path = node.meta.get("module_path", "")
    return path == prefix or path.startswith(prefix + ".")


def dim_groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The dims of two shapes of the same elements in consecutive groups of equal products (a size-1
    dim alone in its group)."""
    i = j = 0
    found: list[tuple[list[int], list[int]]] = []
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1:
            found.append(([i], []))
            i += 1
            continue
        if j < len(b) and b[j] == 1:
            found.append(([], [j]))
            j += 1
            continue
        left, right, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                left.append(i)
                pa *= a[i]
                i += 1
            else:
                right.append(j)
                pb *= b[j]
                j += 1
        found.append((left, right))
    return found


def weight_of(node: fx.Node) -> fx.Node | None:
    """The `get_attr` weight a product multiplies: a [out, in] or [in, out] one (`WEIGHT_PRODUCTS`) or an
    experts' [experts, in, out] one (`EXPERT_PRODUCTS`); None for another operator."""
    if node.op != "call_function" or node.target not in (*WEIGHT_PRODUCTS, *EXPERT_PRODUCTS) or len(node.args) < 2:
        return None
    weight = node.args[1]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    rank = len(node_shape(weight) or ())
    if rank == 3 and node.target in EXPERT_PRODUCTS or node.target in WEIGHT_PRODUCTS and rank != 3:
        return weight
    return None


def is_expert_product(node: fx.Node) -> bool:
    weight = weight_of(node)
    return weight is not None and len(node_shape(weight)) == 3


def moves_rows(node: fx.Node, value: fx.Node, combine: bool) -> bool:
    """Whether `node` moves the rows of `value` and nothing else: its last dim (a product's features)
    stays whole and last, each row's elements unchanged: a reshape of the other dims, a copy, a
    padding with rows, a pick of rows by indices; with `combine` also a product with a factor
    constant along the last dim (the routing weights) and a sum over other dims. These are the
    operators through which the plan pass keeps a `Partial` sum partial (`graph_extract.plan_pass`)."""
    out, source = node_shape(node), node_shape(value)
    if not out or not source or out[-1] != source[-1] or not node.args or node.args[0] is not value:
        return combine and _weighs_rows(node, value, out, source)
    last = len(source) - 1
    if node.target in RESHAPES:
        return dim_groups(source, out)[-1] == ([last], [len(out) - 1])
    if node.target in IDENTITIES:
        return True
    if node.target in PADS:
        return not any(node.args[1][:2])
    if node.target is aten.index_select.default:
        return node.args[1] % len(source) != last
    if node.target is aten.index.Tensor:
        return len(node.args[1]) < len(source)
    if combine and node.target is aten.sum.dim_IntList:
        dims = node.args[1] if len(node.args) > 1 else None
        return dims is not None and last not in {d % len(source) for d in ([dims] if isinstance(dims, int) else dims)}
    return combine and _weighs_rows(node, value, out, source)


def _weighs_rows(node: fx.Node, value: fx.Node, out: tuple[int, ...] | None,
                 source: tuple[int, ...] | None) -> bool:
    """A product of `value` and one factor of size 1 along the last dim (element-wise)."""
    if node.target is not aten.mul.Tensor or not out or not source or out[-1] != source[-1]:
        return False
    others = [argument for argument in node.args if argument is not value]
    if len(others) != 1 or len(node.args) != 2:
        return False
    shape = node_shape(others[0]) if isinstance(others[0], fx.Node) else ()
    return shape is not None and (not shape or shape[-1] == 1)


def reaches_expert_product(node: fx.Node, inside: set[fx.Node]) -> bool:
    """Whether the rows `node` moves reach an expert product's input through moves of rows only
    (`moves_rows`): whether `node` is part of a dispatch."""
    stack, seen = [node], {node}
    while stack:
        current = stack.pop()
        for user in current.users:
            if user not in inside or user in seen:
                continue
            if is_expert_product(user) and user.args[0] is current:
                return True
            if moves_rows(user, current, combine=False):
                seen.add(user)
                stack.append(user)
    return False


def combine_chain(product: fx.Node, inside: set[fx.Node]) -> list[fx.Node]:
    """The operators after an expert product that move its rows back to the tokens and weigh and sum
    them (the combine: `moves_rows`), each the one user of the one before."""
    chain, current = [], product
    while len(current.users) == 1:
        (user,) = current.users
        if user not in inside or not moves_rows(user, current, combine=True):
            break
        chain.append(user)
        current = user
    return chain


def routers(nodes: Sequence[fx.Node], inside: set[fx.Node]) -> frozenset[fx.Node]:
    """The weight products whose values reach a top-k (the experts' choice) through other operators
    only: the routers."""
    found: set[fx.Node] = set()
    for node in nodes:
        if node.target not in TOP_K:
            continue
        stack, seen = [node.args[0]], set()
        while stack:
            current = stack.pop()
            if not isinstance(current, fx.Node) or current in seen or current not in inside:
                continue
            seen.add(current)
            if weight_of(current) is not None:
                found.add(current)
            else:
                stack.extend(current.all_input_nodes)
    return frozenset(found)


def block_kinds(module: fx.GraphModule, blocks: str) -> tuple[tuple[int, ...], ...]:
    """The indices of the blocks `<blocks>.<i>` grouped by structure (the same operators, module paths
    below the block, shapes, arguments and weights' shapes), in the order of their first block."""
    depth = len(blocks.split("."))
    members: dict[int, list[fx.Node]] = {}
    for node in module.graph.nodes:
        parts = node.meta.get("module_path", "").split(".")
        if node.op == "call_function" and len(parts) > depth and parts[:depth] == blocks.split(".") \
                and parts[depth].isdigit():
            members.setdefault(int(parts[depth]), []).append(node)
    kinds: dict[tuple, list[int]] = {}
    for index in sorted(members):
        kinds.setdefault(_signature(members[index], f"{blocks}.{index}"), []).append(index)
    return tuple(tuple(indices) for indices in kinds.values())


def _signature(nodes: Sequence[fx.Node], prefix: str) -> tuple:
    position = {node: index for index, node in enumerate(nodes)}

    def argument(value: fx.Node) -> object:
        return ("node", position[value]) if value in position else ("outside", node_shape(value))

    return tuple((str(node.target), node.meta.get("module_path", "").removeprefix(prefix), node_shape(node),
                  repr(fx.map_arg((node.args, node.kwargs), argument))) for node in nodes)
