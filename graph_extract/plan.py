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

The pass (`graph_extract.plan_pass.apply_plan`, its operator rules in `graph_extract.plan_rules`)
walks the graph once in program order and gives every tensor a placement
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Replicate

from phaze_common.checks import InputError

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


def _plan_data(path: str | Path) -> dict:
    """The mapping of a YAML plan file; InputError naming the file and what is wrong."""
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
    return data


def plan_widths(path: str | Path) -> tuple[int, ...] | None:
    """The tensor-parallel widths a plan file has a plan for (its top-level keys are widths), None
    for a plan of every width (its keys are module patterns)."""
    data = _plan_data(path)
    if not all(isinstance(key, int) and not isinstance(key, bool) for key in data):
        return None
    return tuple(sorted(data))


def read_plan(path: str | Path, width: int | None = None) -> Plan:
    """The plan of a YAML file at `width`: a mapping of module (or parameter) path patterns to
    `ColwiseParallel` or `RowwiseParallel` (every width), or of tensor-parallel widths to such
    mappings (the plan of each width: what `tensor_parallel_plan=searched` writes); InputError naming
    the file and what is wrong. A width the file has no plan for is refused, but one rank, which any
    plan gives whole: the file's first plan."""
    data = _plan_data(path)
    widths = plan_widths(path)
    if widths is not None:
        if width is None or (width not in data and width != 1):
            raise InputError(f"model.plan: {path}: no plan for tensor_parallel_width {width}; allowed: "
                             f"{', '.join(map(str, widths))}")
        data = data.get(width, data[widths[0]])
        if not isinstance(data, dict) or not data:
            raise InputError(f"model.plan: {path}: width {width}: must map module patterns to ColwiseParallel or "
                             f"RowwiseParallel, got {type(data).__name__}")
    try:
        return Plan.of(data)
    except InputError as error:
        raise InputError(f"model.plan: {path}: {str(error).removeprefix('plan: ')}") from None


def plan_digest(path: str | Path, width: int | None = None) -> str:
    """SHA-1 of the plan a file gives at `width` (its patterns and styles, in order): another plan is
    another graph; the same plan in another file, or beside other widths' plans, is the same graph."""
    return hashlib.sha1(repr(read_plan(path, width).styles).encode()).hexdigest()


def write_plan(path: str | Path, plans: Mapping[int, Plan]) -> None:
    """Write the plans of several tensor-parallel widths as one YAML file `read_plan` reads (styles
    as PyTorch names them), atomically."""
    import yaml

    from phaze_common.files import atomic_write

    names = {COLWISE: "ColwiseParallel", ROWWISE: "RowwiseParallel"}
    data = {width: {pattern: names[style] for pattern, style in plan.styles} for width, plan in sorted(plans.items())}
    atomic_write(Path(path), yaml.safe_dump(data, sort_keys=False))


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

#: transformers' stand-in for `aten._grouped_mm` where that has no kernel (float32 on the CPU, as a
#: model shrunk for verification runs): the same product of (input, weight, offsets).
GROUPED_FALLBACK = "transformers::grouped_mm_fallback"


def is_grouped_product(target: object) -> bool:
    """Whether `target` is a grouped expert product: `aten._grouped_mm` or transformers' stand-in."""
    return target is aten._grouped_mm.default or (isinstance(target, torch._ops.OpOverload)
                                                  and target.name() == GROUPED_FALLBACK)


def _weight_product(node: fx.Node, parameters: Mapping[str, nn.Parameter]) -> str | None:
    """What a plan names for the weight `node` multiplies: the module of a linear map, the parameter
    of a grouped expert product (one module holds several); None for another operator."""
    if node.op != "call_function" or not (node.target in (aten.linear.default, aten.matmul.default, aten.bmm.default)
                                          or is_grouped_product(node.target)):
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
    replicated; outside the blocks, `vocabulary_styles`."""
    parameters = dict(module.named_parameters(remove_duplicate=False))
    products: dict[str, list[tuple[fx.Node, str]]] = {}
    styles: dict[str, str] = dict(vocabulary_styles(module, blocks))
    for node in module.graph.nodes:
        path = node.meta.get("module_path", "")
        if path.startswith(f"{blocks}.") and (owner := _weight_product(node, parameters)) is not None:
            child = ".".join(path.split(".")[: len(blocks.split(".")) + 2])
            products.setdefault(child, []).append((node, owner))
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


def vocabulary_styles(module: fx.GraphModule, blocks: str) -> dict[str, str]:
    """The styles outside the blocks: the token embedding (the largest table looked up) rowwise
    (vocabulary-parallel) and the weight product after the blocks onto the vocabulary colwise (its
    logits split, the loss computed on them as Megatron's)."""
    parameters = dict(module.named_parameters(remove_duplicate=False))
    styles: dict[str, str] = {}
    tables = [node.args[0] for node in module.graph.nodes
              if node.target is aten.embedding.default and isinstance(node.args[0], fx.Node)]
    vocabulary = max(tables, key=lambda table: _shape(table)[0]) if tables else None  # the token embedding
    if vocabulary is None:
        return styles
    styles[vocabulary.target.rpartition(".")[0]] = ROWWISE
    after_blocks = False
    for node in module.graph.nodes:
        path = node.meta.get("module_path", "")
        after_blocks |= path.startswith(f"{blocks}.")
        if after_blocks and not path.startswith(f"{blocks}.") and _shape(node)[-1:] == _shape(vocabulary)[:1] \
                and (owner := _weight_product(node, parameters)) is not None:
            styles[owner] = COLWISE  # the output projection over the vocabulary
    return styles


def _data_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs whose values flow into `node`'s: a product's activation (not its group offsets), a
    lookup's table (not its indices), and only floating-point tensors (not the routing's integers)."""
    if is_grouped_product(node.target) or node.target in (aten.index.Tensor, aten.embedding.default):
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


def _normal(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _shape(node: fx.Node) -> tuple[int, ...]:
    value = node.meta.get("val")
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()
