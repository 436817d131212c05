"""How the operators of a layer run on a device: one hashable value that every cost path (the template's
estimates and schedules, a GPU's roofline, the memory model) and every cache key reads.

* `sequence_parallel` (Korthikanti et al. 2022): the operators whose outputs are replicated over the
  tensor-parallel group (norms, dropout, residual adds; `graph_extract.regions`) run on 1/t of the
  tokens, so their work and bytes, and the activations they keep, are divided by t.
* `flash_attention`: each attention core runs as one fused kernel (`graph_extract.attention`):
  FlashAttention as Megatron-Core and every current framework run it; false: the s × s scores
  written to memory and kept, as 2021–22 Megatron did.
* `precision`: `bf16` or `fp16` (16-bit mixed precision: the same costs), or 8-bit products as
  Transformer Engine runs them: the blocks' weight products (`fp8_operators`) take 8-bit inputs at
  the chip's rate for the precision and keep their inputs in 8 bits; the attention, the embedding,
  the logits and every other operator stay 16-bit. `fp8`: one scale per tensor (E4M3/E5M2, TE's
  DelayedScaling or Float8CurrentScaling recipes); `mxfp8`: OCP Microscaling, one E8M0 scale byte
  per block of 32 elements (TE's MXFP8BlockScaling, Blackwell), so an MXFP8 tensor takes
  `MXFP8_ELEMENT_BYTES` = 1 + 1/32 bytes an element (`narrow_bytes`).
* `fp8_recipe` (precision `fp8` only): how the per-tensor scale is found. `delayed` (TE's
  DelayedScaling): from an amax history of earlier steps, no pass over the tensor; `current` (TE's
  Float8CurrentScaling, Megatron's --fp8-recipe tensorwise, "FP8-CS"): each product's input (and,
  backward, its output gradient) is read once more for its amax before the cast, and an input
  gathered over the tensor-parallel group (sequence parallelism) has its amax all-reduced over the
  group first (NVIDIA/TransformerEngine docs/features/low_precision_training/fp8_current_scaling/
  fp8_current_scaling.rst @ 3ceb248e, "Performance analysis", "Amax reduction"). MXFP8 finds each
  block's scale inside its cast kernel and needs no synchronisation (mxfp8.rst, "Scale
  synchronization"), so it takes no recipe.
* `cuda_graphs`: the kernels are captured once and replayed from CUDA graphs (Megatron-Core's
  `--enable-cuda-graph` / `--cuda-graph-scope`, Transformer Engine's `make_graphed_callables`): no
  host dispatch per operator, each kernel at least the graph's own per-kernel cost; false: eager
  PyTorch, each kernel at least the host's time to issue it (`estimator.roofline`; a GPU's only).
A new kernel option is a field here and the pass that reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graph_extract.opgraph import OpGraph
from graph_extract.regions import block_weight_products, replicated_outputs
from phaze_common.checks import InputError, boolean, choice

#: Training precisions: 16-bit mixed precision (BF16 or FP16), Transformer Engine's FP8 (one scale a
#: tensor) and MXFP8 (one scale a block of 32 elements).
PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8")
#: The precisions whose blocks' weight products run in 8 bits.
NARROW_PRECISIONS = ("fp8", "mxfp8")
#: How `fp8` finds its per-tensor scales (`KernelOptions.fp8_recipe`).
FP8_RECIPES = ("delayed", "current")
#: Elements of one MXFP8 scaling block; each block has one E8M0 scale of one byte (OCP Microscaling
#: Formats (MX) v1.0 spec, Table 1: MXFP8 block size 32, scale E8M0; TransformerEngine
#: docs/features/low_precision_training/mxfp8/mxfp8.rst @ 3ceb248e).
MXFP8_BLOCK = 32
#: Bytes an element of an MXFP8 tensor takes: its E4M3 byte and its share of the block's scale byte.
MXFP8_ELEMENT_BYTES = 1.0 + 1.0 / MXFP8_BLOCK
#: Bytes of one amax: an fp32 number (what current scaling all-reduces over the tensor-parallel group).
AMAX_BYTES = 4


@dataclass(frozen=True)
class KernelOptions:
    """Sequence parallelism, the attention kernel, the precision and CUDA graphs (module docstring)."""

    sequence_parallel: bool = True
    flash_attention: bool = True
    precision: str = "bf16"
    fp8_recipe: str = "delayed"
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        boolean("sequence_parallel", self.sequence_parallel)
        boolean("flash_attention", self.flash_attention)
        choice("precision", self.precision, PRECISIONS)
        boolean("cuda_graphs", self.cuda_graphs)
        choice("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        if self.fp8_recipe != "delayed" and self.precision != "fp8":
            why = "scales each block of 32 as it casts" if self.precision == "mxfp8" else "has no 8-bit products"
            raise InputError(f"fp8_recipe: {self.fp8_recipe} applies to precision=fp8 only (precision={self.precision} "
                             f"{why}); allowed here: delayed (the default)")

    @property
    def fp8(self) -> bool:
        """Whether the blocks' weight products run in 8 bits (`fp8` or `mxfp8`)."""
        return self.precision in NARROW_PRECISIONS

    @property
    def narrow_bytes(self) -> float:
        """Bytes an element of an 8-bit tensor takes: 1 (`fp8`: the tensor's one scale is not counted),
        `MXFP8_ELEMENT_BYTES` (`mxfp8`: with its block's scale byte)."""
        return MXFP8_ELEMENT_BYTES if self.precision == "mxfp8" else 1.0

    @property
    def current_scaling(self) -> bool:
        """Whether each cast first reads its tensor for the amax (`fp8_recipe` current)."""
        return self.precision == "fp8" and self.fp8_recipe == "current"

    def split_operators(self, graph: OpGraph) -> tuple[bool, ...]:
        """Per operator of `graph` (by id): whether its work and bytes are divided over the t ranks
        (empty: none is)."""
        if not self.sequence_parallel or graph.tensor_parallel_width == 1:
            return ()
        return replicated_outputs(graph)

    def fp8_operators(self, graph: OpGraph) -> tuple[bool, ...]:
        """Per operator of `graph` (by id): whether it is a weight product run in FP8 — those of the
        transformer blocks (the layers between the first and the last; empty: none is)."""
        return block_weight_products(graph) if self.fp8 else ()

    def recomputed_core(self, core: frozenset[int]) -> frozenset[int]:
        """The operators of the attention core `core` that selective recomputation re-runs: all of them,
        none with a fused kernel (it keeps no s × s tensor to drop)."""
        return frozenset() if self.flash_attention else core

    def replicated_share(self, width: int) -> float:
        """The fraction of a replicated activation that leaves a device of a width-t group."""
        return 1.0 - 1.0 / width if self.sequence_parallel else 0.0

    def record(self) -> dict:
        """Its fields by name (cache keys, results), `fp8_recipe` only when not `delayed` and
        `cuda_graphs` only when true (the keys of the options before they were fields)."""
        fields = dataclasses.asdict(self)
        if self.fp8_recipe == "delayed":
            del fields["fp8_recipe"]
        if not self.cuda_graphs:
            del fields["cuda_graphs"]
        return fields
