"""How the operators of a layer run on a device: one hashable value that every cost path (the template's
estimates and schedules, a GPU's roofline, the memory model) and every cache key reads.

Today it holds sequence parallelism (Korthikanti et al. 2022): the operators whose outputs are
replicated over the tensor-parallel group (norms, dropout, residual adds; `graph_extract.regions`)
run on 1/t of the tokens, so their work and bytes, and the activations they keep, are divided by t.
A new kernel option (the attention kernel, the precision) is a field here and the pass that reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.checks import boolean
from graph_extract.opgraph import OpGraph
from graph_extract.regions import replicated_outputs


@dataclass(frozen=True)
class KernelOptions:
    """`sequence_parallel`: Megatron's sequence parallelism (module docstring)."""

    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        boolean("sequence_parallel", self.sequence_parallel)

    def split_operators(self, graph: OpGraph) -> tuple[bool, ...]:
        """Per operator of `graph` (by id): whether its work and bytes are divided over the t ranks
        (empty: none is)."""
        if not self.sequence_parallel or graph.tensor_parallel_width == 1:
            return ()
        return replicated_outputs(graph)

    def replicated_share(self, width: int) -> float:
        """The fraction of a replicated activation that leaves a device of a width-t group."""
        return 1.0 - 1.0 / width if self.sequence_parallel else 0.0

    def record(self) -> dict:
        return dataclasses.asdict(self)
