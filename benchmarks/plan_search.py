"""Time of the plan search from an exported model (solver.auto_sharding.from_export.search_plan) on the
zoo's mixtures of experts (mixtral-8x7b; qwen3-235b-a22b; deepseek-v3 with its latent attention,
shared expert and dense first blocks), at their sequence length and micro-batch 1, t = 2, 4, 8, with
the default prices (an H100's bf16 rate at half, NVLink 4). Target: well under 1 s each on 2 cores.

The model is exported once on the meta device with `--blocks` blocks (default: the first dense
blocks, if any, and 2 more; `--blocks 0`: all of them), padded for t = 8. Each row gives the best of
`--repeats` searches (grouping the blocks into kinds, each kind's sharding graph, its ILP), the
kinds, the ILP variables of each, whether the searched plan's style of every weight product of every
block equals derived_plan's, the searched and derived_plan's objectives by the ILP's cost model
(their sum over the kinds) and, at t = 2 and 4, the largest difference between the tiny zoo model's
outputs (graph_extract.verify's configuration) and its ranks' under the searched plan, run in lockstep.

    python benchmarks/plan_search.py [--repeats 3] [--blocks N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from graph_extract.export import export  # noqa: E402
from graph_extract.plan import derived_plan  # noqa: E402
from graph_extract.transformer import TransformerModel, example_inputs  # noqa: E402
from graph_extract.verify import verify_plan  # noqa: E402
from graph_extract.zoo import get_spec  # noqa: E402
from solver.auto_sharding.costs import CostModel  # noqa: E402
from solver.auto_sharding.from_export import (  # noqa: E402
    plan_strategies, search_blocks, search_model, search_plan, tiny_zoo_model)

MODELS = ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
WIDTHS = (2, 4, 8)
VERIFIED_WIDTHS = (2, 4)


def exported(name: str, blocks: int) -> tuple[torch.fx.GraphModule, int]:
    spec = get_spec(name)
    spec = spec.with_overrides(num_layers=blocks or spec.num_layers)
    with torch.device("meta"):
        model = TransformerModel(spec, spec.default_sequence_length, spec.padded_vocab_size(max(WIDTHS)), 1)
    return export(model, example_inputs(model, 1, spec.default_sequence_length)), spec.num_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=None)
    arguments = parser.parse_args()
    print(f"{'model':16} {'blocks':>6} {'t':>2} {'seconds':>8} {'kinds':14} {'variables':>9} {'derived':8} "
          f"{'objective [ms]':>14} {'derived [ms]':>12} {'tiny error':>10}")
    for name in MODELS:
        blocks = arguments.blocks if arguments.blocks is not None else get_spec(name).first_dense_layers + 2
        graph, count = exported(name, blocks)
        derived = derived_plan(graph, "layers")
        for width in WIDTHS:
            seconds = []
            for _ in range(arguments.repeats):
                start = time.perf_counter()
                plan, _ = search_plan(graph, "layers", width)
                seconds.append(time.perf_counter() - start)
            searched = search_blocks(graph, "layers", width)
            equal = all(plan.style(path) == derived.style(path)
                        for kind in searched for index in kind.indices for path in _paths(kind, index))
            derived_total = 0.0
            for kind in searched:
                mesh, settings = search_model(kind.block, width)
                costs = CostModel(kind.block.graph, mesh, settings)
                derived_total += costs.evaluate(plan_strategies(kind.block, derived, costs)).total
            error = f"{verify_plan(*tiny_zoo_model(name, width), plan, width, 'layers'):.2e}" \
                if width in VERIFIED_WIDTHS else "-"
            kinds = "+".join(str(len(kind.indices)) for kind in searched)
            variables = "+".join(str(kind.result.variables) for kind in searched)
            objective = sum(kind.result.objective for kind in searched)
            print(f"{name:16} {count:6d} {width:2d} {min(seconds):8.3f} {kinds:14} {variables:>9} "
                  f"{'equal' if equal else 'differs':8} {objective * 1e3:14.6f} {derived_total * 1e3:12.6f} "
                  f"{error:>10}")


def _paths(kind, index: int) -> list[str]:
    """The plan entry of each weight product of block `index` (the kind's paths moved to that block)."""
    prefix = f"{kind.block.blocks}.{kind.block.index}."
    return [f"{kind.block.blocks}.{index}.{path.removeprefix(prefix)}" for path in kind.block.products.values()]


if __name__ == "__main__":
    main()
