"""The parallel layout of a training run as one value, the rules a layout must follow (in this module
only), the layouts a search enumerates, and the rank groups of each dimension.

A layout is Megatron-Core's: t tensor-parallel ranks split each layer, c context-parallel ranks split
the sequence, p pipeline stages (each holding v model chunks with interleaving) split the layers,
and d data-parallel replicas split the batch, of which e consecutive ones split the experts of a
mixture of experts (expert parallelism folded into data parallelism). Ranks are ordered
tp-cp-ep-dp-pp (Megatron-Core's default `order`):

    rank = tensor + t·(context + c·(data + d·pipeline)),  the expert rank = data mod e

so a tensor-parallel group is t consecutive devices, a context-parallel group c devices t apart, an
expert-parallel group e devices t·c apart, a data-parallel group d devices t·c apart, and
consecutive pipeline stages t·c·d apart (`Layout.groups`; the cluster says which tier of links each
group spans). The ranks holding the same weights, which reduce their gradients together and share
a sharded model state, are the c·d context- and data-parallel ranks: c·d devices t apart
(Megatron-Core's data-parallel group with context parallelism); those holding the same experts,
the c·d/e ranks of the context group and of the d/e replicas with the same experts (taken as c·d/e
devices t·e apart when d/e > 1: the same size and span).

Expert tensor parallelism. By default each expert is split over the t ranks like the dense layers
(Megatron's --expert-tensor-parallel-size equal to t). An expert tensor-parallel width τ ≠ t
(`expert_tensor_parallel_width`; 1 is what Megatron-Core recommends for fine-grained experts) lays
the experts over the t·c·d ranks of a stage as Megatron-Core's "MoE parallel folding" does (order
etp-ep-dp over the same ranks): τ consecutive ranks split each expert, e groups τ apart split the
experts, and the t·c·d/(e·τ) ranks e·τ apart hold the same experts; so e·τ divides t·c·d (the
context-parallel ranks fold into the experts' data-parallel ones, as Megatron-Core's expert rank
generator has no context dimension: expert data-parallel width = t·c·d/(e·τ)). A device
holds 1/(e·τ) of the experts (not 1/(e·t): the memory Megatron's own estimate once under-counted,
Megatron-LM issue #4050), routes the tokens it holds after sequence parallelism, and the routed
experts' collectives run over τ ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from phaze_common.checks import InputError, positive_integer
from phaze_hardware import Group

#: The dimensions of a layout's rank groups, innermost first (Megatron-Core's order), and the group of
#: replicas that hold the same experts.
DIMENSIONS = ("tensor", "context", "expert", "data", "pipeline")
#: The letter of each width in text (the field's order), and those always shown.
LETTERS = {"tensor_parallel_width": "t", "pipeline_parallel_width": "p", "data_parallel_width": "d",
           "virtual_stages": "v", "expert_parallel_width": "e", "context_parallel_width": "c",
           "expert_tensor_parallel_width": "et"}
SHOWN = ("tensor_parallel_width", "pipeline_parallel_width", "data_parallel_width", "virtual_stages")
#: How a Megatron layout splits the blocks into p·v chunks: `any` (the placement DP: any convex
#: split), `even` (p·v equal chunks), `even_or_ends` (also with the embedding and the loss counted as
#: a block each: Megatron's --account-for-embedding-in-pipeline-split and
#: --account-for-loss-in-pipeline-split).
SPLITS = ("any", "even", "even_or_ends")


@dataclass(frozen=True)
class Layout:
    """Widths of a parallel layout (each a positive integer; `devices` = t·c·p·d); the experts'
    tensor-parallel width τ None when it is t (the default; a τ equal to t is stored as None)."""

    tensor_parallel_width: int = 1
    pipeline_parallel_width: int = 1
    data_parallel_width: int = 1
    virtual_stages: int = 1
    expert_parallel_width: int = 1
    context_parallel_width: int = 1
    expert_tensor_parallel_width: int | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name == "expert_tensor_parallel_width" and self.expert_tensor_parallel_width is None:
                continue  # τ = t
            positive_integer(field.name, getattr(self, field.name))
        if self.expert_tensor_parallel_width == self.tensor_parallel_width:
            object.__setattr__(self, "expert_tensor_parallel_width", None)

    @property
    def expert_tensor_width(self) -> int:
        """τ: the ranks that split each expert (t unless given)."""
        return self.expert_tensor_parallel_width or self.tensor_parallel_width

    def experts_fit(self) -> bool:
        """With τ = t, e divides d (the experts split over data-parallel replicas); with τ given, τ
        divides t and e·τ divides t·c·d (the experts' ranks lie within the tensor, context and data
        ranks of a stage: module docstring)."""
        t, tau, e = self.tensor_parallel_width, self.expert_tensor_width, self.expert_parallel_width
        if self.expert_tensor_parallel_width is None:
            return self.data_parallel_width % e == 0
        return t % tau == 0 and (t * self.context_parallel_width * self.data_parallel_width) % (e * tau) == 0

    @property
    def expert_split(self) -> float:
        """e·τ/t: how many times fewer experts a device holds than a rank of the width-t graph (which
        splits every expert over t ranks)."""
        return self.expert_parallel_width * self.expert_tensor_width / self.tensor_parallel_width

    @property
    def devices(self) -> int:
        return (self.tensor_parallel_width * self.context_parallel_width * self.pipeline_parallel_width
                * self.data_parallel_width)

    @property
    def shard(self) -> Layout:
        """The widths that split each layer (t, e, c, τ), with p = d = v = 1: what a device's share of a
        layer depends on (one step model prices every p, d and v of it)."""
        return Layout(self.tensor_parallel_width, expert_parallel_width=self.expert_parallel_width,
                      context_parallel_width=self.context_parallel_width,
                      expert_tensor_parallel_width=self.expert_tensor_parallel_width)

    def replace(self, **widths: int) -> Layout:
        return dataclasses.replace(self, **widths)

    def groups(self) -> dict[str, Group]:
        """The communicator of each dimension (module docstring), `expert_tensor` (the ranks that split
        each expert), and `weights` and `expert_weights`: the ranks that hold the same dense weights,
        and the same experts."""
        t, c, e = self.tensor_parallel_width, self.context_parallel_width, self.expert_parallel_width
        d, p, tau = self.data_parallel_width, self.pipeline_parallel_width, self.expert_tensor_width
        if self.expert_tensor_parallel_width is None:
            expert_replicas = max(d // e, 1)
            expert, expert_weights = Group(e, t * c), Group(c * expert_replicas, t * e if expert_replicas > 1 else t)
        else:
            expert, expert_weights = Group(e, tau), Group(max(t * c * d // (e * tau), 1), e * tau)
        return {"tensor": Group(t, 1), "context": Group(c, t), "expert": expert, "data": Group(d, t * c),
                "weights": Group(c * d, t), "expert_weights": expert_weights, "pipeline": Group(p, t * c * d),
                "expert_tensor": Group(tau, 1)}

    def text(self) -> str:
        """t=8 p=16 d=8 v=1 (and the others when > 1: e=4; τ when given: et=1)."""
        return " ".join(f"{letter}={getattr(self, name)}" for name, letter in LETTERS.items()
                        if name in SHOWN or (getattr(self, name) or 0) > 1
                        or (name == "expert_tensor_parallel_width" and getattr(self, name) is not None))


@dataclass(frozen=True)
class MegatronSplit:
    """How a published Megatron layout splits the blocks into its chunks beyond an even split:
    `account_for_ends` (--account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split: the embedding and the loss counted as a block each), or the
    first and the last stage's blocks given (--decoder-first-pipeline-num-layers,
    --decoder-last-pipeline-num-layers; the other stages split the rest evenly; v = 1)."""

    account_for_ends: bool = False
    first_stage_blocks: int | None = None
    last_stage_blocks: int | None = None

    def __post_init__(self) -> None:
        for name in ("first_stage_blocks", "last_stage_blocks"):
            if getattr(self, name) is not None:
                positive_integer(name, getattr(self, name))
        if self.account_for_ends and self.uneven:
            raise InputError("account_for_embedding_and_loss: with first_stage_blocks or last_stage_blocks; "
                             "allowed: one of them")

    @property
    def uneven(self) -> bool:
        return self.first_stage_blocks is not None or self.last_stage_blocks is not None


@dataclass(frozen=True)
class FitRules:
    """What a layout must follow for one question, besides memory (the step model's): the cluster's
    devices (all of them with `whole_cluster`: a given layout; a search may leave some idle), the
    micro-batches per batch, the model's layers, blocks and experts, and how the blocks split."""

    num_devices: int
    micro_batches: int
    layers: int
    blocks: int
    experts: int | None = 1  # None: checked elsewhere
    whole_cluster: bool = False
    split: str = "any"

    # The rules, each once: the checks below and the generator of a search's layouts use them.

    def experts_split(self, experts_width: int) -> bool:
        """e divides the model's experts."""
        return self.experts is None or self.experts % experts_width == 0

    def room(self, shard: Layout, times: int = 1) -> int:
        """How many times t·c·`times` devices the cluster holds: the most replicas of `times` stages of
        a shard, or the most stages of `times` replicas."""
        return self.num_devices // (shard.tensor_parallel_width * shard.context_parallel_width * times)

    def replicas_fit(self, degree: int, shard: Layout) -> bool:
        """d divides the micro-batches per batch, and e divides d (the experts are split over replicas;
        with an expert tensor-parallel width τ: e·τ divides t·c·d)."""
        return self.micro_batches % degree == 0 and shard.replace(data_parallel_width=degree).experts_fit()

    def interleaves(self, stages: int, degree: int) -> bool:
        """Megatron's interleaved schedule: at least two stages, and the micro-batches per replica a
        multiple of them."""
        return stages >= 2 and (self.micro_batches // degree) % stages == 0

    def problem(self, layout: Layout) -> str | None:
        """The first rule `layout` breaks, as one line naming the width, or None."""
        return self.widths_problem(layout) or self.split_problem(layout)

    def widths_problem(self, layout: Layout) -> str | None:
        """The first rule of the widths `layout` breaks (all but how the blocks split into chunks: a
        placement whose chunks are given has them split already), or None."""
        t, c, p = layout.tensor_parallel_width, layout.context_parallel_width, layout.pipeline_parallel_width
        d, v, e = layout.data_parallel_width, layout.virtual_stages, layout.expert_parallel_width
        if not self.experts_split(e):
            return (f"expert_parallel_width: {e} does not divide the {self.experts} experts"
                    if self.experts > 1 else f"expert_parallel_width: {e} with a model without experts; allowed: 1")
        if self.whole_cluster and layout.devices != self.num_devices:
            return (f"data_parallel_width: tensor x context x pipeline x data parallel = {t} x {c} x {p} x {d} = "
                    f"{layout.devices}, must equal num_devices={self.num_devices}" if c > 1 else
                    f"data_parallel_width: tensor x pipeline x data parallel = {t} x {p} x {d} = {layout.devices}, "
                    f"must equal num_devices={self.num_devices}")
        if d > self.room(layout, p):
            return (f"devices: {p} stages x {t * c} x {d} replicas need {layout.devices}, the cluster has "
                    f"{self.num_devices}")
        tau = layout.expert_tensor_parallel_width
        if tau is not None and t % tau:
            allowed = [width for width in range(1, t + 1) if t % width == 0]
            return (f"expert_tensor_parallel_width: {tau} does not divide tensor_parallel_width={t}; allowed: "
                    f"{', '.join(map(str, allowed))}")
        if not self.replicas_fit(d, layout):
            return (f"data_parallel_width: {d} does not divide the {self.micro_batches} micro-batches per batch "
                    "(global_batch_size / micro_batch_size)" if self.micro_batches % d else
                    f"expert_parallel_width: {e} does not divide data_parallel_width={d} (the experts are split "
                    "over data-parallel replicas)" if tau is None else
                    f"expert_parallel_width: {e} x expert_tensor_parallel_width {tau} = {e * tau} does not divide "
                    + (f"tensor x context x data parallel = {t} x {c} x {d}" if c > 1 else
                       f"tensor x data parallel = {t} x {d}") + " (the experts are laid over those ranks)")
        if v > 1 and not self.interleaves(p, d):
            return ("virtual_stages: interleaving needs pipeline_parallel_width >= 2" if p < 2 else
                    f"virtual_stages: the interleaved schedule needs the {self.micro_batches // d} micro-batches "
                    f"per replica to be a multiple of pipeline_parallel_width={p}")
        return None

    def splits(self, chunks: int, virtual_stages: int = 1) -> bool:
        """Whether `chunks` chunks hold the blocks (the rule `split`)."""
        if self.split == "any" and virtual_stages == 1:
            return True
        return self.blocks % chunks == 0 or (self.split == "even_or_ends" and (self.blocks + 2) % chunks == 0)

    def split_problem(self, layout: Layout) -> str | None:
        """Why p stages of v chunks each cannot hold the model's blocks (`split`), or None."""
        stages, virtual_stages = layout.pipeline_parallel_width, layout.virtual_stages
        if stages > self.layers and self.split == "any":  # an even split lists the widths it allows below
            return f"pipeline_parallel_width: {stages} stages for {self.layers} layers; allowed: at most {self.layers}"
        if self.splits(stages * virtual_stages, virtual_stages):
            return None
        what = (f"divide neither the {self.blocks} blocks nor {self.blocks} + 2 (embedding and loss counted)"
                if self.split == "even_or_ends" else f"do not divide the {self.blocks} blocks")
        if not self.splits(stages):
            allowed = [p for p in range(1, self.blocks + 3) if self.splits(p)]
            return f"pipeline_parallel_width: {stages} stages {what}; allowed: {', '.join(map(str, allowed))}"
        allowed = [v for v in range(1, (self.blocks + 2) // stages + 1)
                   if self.splits(stages * v, v) and (v == 1 or stages > 1)]
        return (f"virtual_stages: {stages} stages x {virtual_stages} virtual stages {what}; allowed with "
                f"pipeline_parallel_width={stages}: {', '.join(map(str, allowed))}")

    def check(self, layout: Layout) -> Layout:
        """`layout`, or InputError with the rule it breaks."""
        problem = self.problem(layout)
        if problem is not None:
            raise InputError(problem)
        return layout


def data_parallel_widths(rules: FitRules, shard: Layout) -> list[int]:
    """The data-parallel widths d a shard shape (t, e, c) allows with some pipeline."""
    return [d for d in range(1, min(rules.room(shard), rules.micro_batches) + 1)
            if rules.replicas_fit(d, shard)]


def allowed_virtual_stages(blocks: int) -> tuple[int, ...]:
    """v values some pipeline of at least two stages can interleave: v divides the blocks, and
    blocks / v ≥ 2 (with 1 for no interleaving)."""
    return (1, *(v for v in range(2, blocks // 2 + 1) if blocks % v == 0))


def layouts(rules: FitRules, shard: Layout, virtual_stages: tuple[int, ...] | None = None) -> Iterator[Layout]:
    """The layouts of a shard shape (t, e, c) a search enumerates, per data-parallel width d:
    the plain pipeline (v = 1) of the most stages that fit — every shallower one fits too, so the
    placement DP takes each d with its largest p — then Megatron's interleaved layouts (v > 1, the
    blocks in p·v equal chunks) whose v is among `virtual_stages` (None: every v)."""
    even = dataclasses.replace(rules, split="even")
    for degree in data_parallel_widths(rules, shard):
        most = min(rules.layers, rules.room(shard, degree))
        if virtual_stages is None or 1 in virtual_stages:
            yield shard.replace(pipeline_parallel_width=most, data_parallel_width=degree)
        for stages in range(2, min(rules.blocks // 2, most) + 1):
            for v in range(2, rules.blocks // stages + 1):
                if ((virtual_stages is None or v in virtual_stages) and even.splits(stages * v, v)
                        and rules.interleaves(stages, degree)):
                    yield shard.replace(pipeline_parallel_width=stages, data_parallel_width=degree, virtual_stages=v)
