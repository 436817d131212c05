"""How the operators of a layer run on a device: one hashable value that every cost path (the template's
estimates and schedules, a GPU's roofline, the memory model) and every cache key reads.

* `sequence_parallel` (Korthikanti et al. 2022): the operators whose outputs are replicated over the
  tensor-parallel group (norms, dropout, residual adds; `graph_extract.regions`) run on 1/t of the
  tokens, so their work and bytes, and the activations they keep, are divided by t.
* `flash_attention`: each attention core runs as one fused kernel (`graph_extract.attention`):
  FlashAttention as Megatron-Core and every current framework run it; false: the s × s scores
  written to memory and kept, as 2021–22 Megatron did.
* `precision`: `bf16` or `fp16` (16-bit mixed precision: the same costs), or `fp8` as Transformer
  Engine runs it: the blocks' weight products (`fp8_operators`) take FP8 inputs at the chip's FP8
  rate and keep their inputs in FP8; the attention, the embedding, the logits and every other
  operator stay 16-bit.
* `cuda_graphs`: the kernels are captured once and replayed from CUDA graphs (Megatron-Core's
  `--enable-cuda-graph` / `--cuda-graph-scope`, Transformer Engine's `make_graphed_callables`): no
  host dispatch per operator, each kernel at least the graph's own per-kernel cost; false: eager
  PyTorch, each kernel at least the host's time to issue it (`estimator.roofline`; a GPU's only).
  Left out of `record()` when false, so every earlier cache key stays as it was.
A new kernel option is a field here and the pass that reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from phaze_common.checks import boolean, choice
from graph_extract.opgraph import OpGraph
from graph_extract.regions import block_weight_products, replicated_outputs

#: Training precisions: 16-bit mixed precision (BF16 or FP16) and Transformer Engine's FP8.
PRECISIONS = ("bf16", "fp16", "fp8")


@dataclass(frozen=True)
class KernelOptions:
    """Sequence parallelism, the attention kernel, the precision and CUDA graphs (module docstring)."""

    sequence_parallel: bool = True
    flash_attention: bool = True
    precision: str = "bf16"
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        boolean("sequence_parallel", self.sequence_parallel)
        boolean("flash_attention", self.flash_attention)
        choice("precision", self.precision, PRECISIONS)
        boolean("cuda_graphs", self.cuda_graphs)

    @property
    def fp8(self) -> bool:
        return self.precision == "fp8"

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
        """Its fields by name (cache keys, results), `cuda_graphs` only when true."""
        fields = dataclasses.asdict(self)
        if not self.cuda_graphs:
            del fields["cuda_graphs"]
        return fields
