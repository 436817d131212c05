"""Megatron's split against the searched one (`tensor_parallel_plan=searched`), per model and
tensor-parallel width: the zoo's megatrongpt3, llama3-70b, mixtral-8x7b and deepseek-v3 and the
Hugging Face config.json files of tests/data/hf_configs, on 256 H100s (dgx_h100; p = 8, or 1 and 4
where the blocks do not split in 8; d fills the cluster; micro-batch 1, batch 256, 2,048 tokens,
selective recomputation). Prints one markdown row per model and width: whether the searched plan differs from Megatron's (and where), whether each was
verified, the ILP's cost of each for the traced blocks, and the step time and memory of each.
Run from the repository root: python scripts/plan_comparison.py [--models llama3-70b] [--widths 2 4]
[--markdown docs/reference/plans.md] (the docs page: its introduction and the table).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import phaze.api  # noqa: E402
from phaze.modes.predict import prediction_record  # noqa: E402
from graph_extract import valid_tensor_parallel_widths  # noqa: E402
from phaze_common.files import atomic_write  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf_configs"
ZOO = ("megatrongpt3", "llama3-70b", "mixtral-8x7b", "deepseek-v3")
KEYS = dict(chip="h100_sxm", system="dgx_h100", num_devices=256, global_batch_size=256, micro_batch_size=1,
            sequence_length=2048, recompute="selective")
#: Pipeline stages: 8, but where the blocks do not split in 8 (DeepSeek-V3's 61).
STAGES = {"deepseek-v3": 1, "Qwen2.5-7B": 4, "gemma-2-9b": 2}
GIB = 2**30


def predicted(model: str, width: int, plan: str, cache_dir: str) -> dict:
    stages = STAGES.get(Path(model).parent.name if model.endswith(".json") else model, 8)
    checked = phaze.api.settings("predict", model, tensor_parallel_width=width, pipeline_parallel_width=stages,
                                 data_parallel_width=KEYS["num_devices"] // (width * stages), tensor_parallel_plan=plan,
                                 cache_dir=cache_dir, **KEYS)
    return prediction_record(checked, phaze.api.run_prediction(checked), phaze.api.graphs(checked))


def differences(megatron: dict, searched: dict) -> str:
    """The modules whose style differs (`pattern: megatron -> searched`), or "same"."""
    names = sorted(set(megatron) | set(searched))
    changed = [f"`{name}`: {megatron.get(name, 'whole')} → {searched.get(name, 'whole')}" for name in names
               if megatron.get(name) != searched.get(name)]
    return "; ".join(changed) or "same"


def row(name: str, model: str, width: int, cache_dir: str) -> str:
    megatron, searched = (predicted(model, width, plan, cache_dir) for plan in ("megatron", "searched"))
    search = searched.get("plan_search") or {}
    cost = (f"{search['megatron_objective'] * 1e3:.3f} / {search['objective'] * 1e3:.3f}"
            if search.get("objective") is not None else f"search refused ({search.get('refused')})")
    if not search.get("megatron_priced", True):
        cost += " (Megatron's plan pays a conversion the ILP prices as refused: no comparison)"
    memory = (f"{megatron['memory_bytes']['total'] / GIB:.1f} / {searched['memory_bytes']['total'] / GIB:.1f}")
    return (f"| {name} | {width} | {differences(megatron['plan'], searched['plan'])} | "
            f"{megatron['plan_verified']} / {searched['plan_verified']} | {cost} | "
            f"{megatron['time_per_batch_s']:.3f} / {searched['time_per_batch_s']:.3f} | {memory} |")


INTRODUCTION = """# Searched plans

Megatron's tensor-parallel split (`tensor_parallel_plan=megatron`, derived by structure) beside the
plan the sharding ILP finds (`tensor_parallel_plan=searched`), for the zoo's GPT-3 175B, Llama-3-70B,
Mixtral-8x7B and DeepSeek-V3 and five Hugging Face config.json files phaze has no code for, on 256
H100s (dgx_h100; p = 8, but 1 for DeepSeek-V3 (61 blocks), 4 for Qwen2.5 (28), 2 for Gemma-2 (42); d fills the
cluster; micro-batch 1, batch 256, 2,048 tokens, selective recomputation). "same": the search kept
Megatron's plan (its cost equal, to 10⁻⁶, or the search refused an operator of the block, named in
the cost column, or the ILP could not price Megatron's plan); a difference names each module whose
style changed. The ILP's cost is of the traced blocks (one per kind of block, times its blocks), the
step and the memory phaze's prediction with each plan (the memory of the busiest device). Every
plan is verified by running its ranks on a shrunk model of the family. Written by
`python scripts/plan_comparison.py --markdown docs/reference/plans.md`.

"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=[*ZOO, *sorted(path.name for path in CONFIGS.iterdir()
                                                                    if path.is_dir())])
    parser.add_argument("--widths", nargs="*", type=int, default=[2, 4, 8])
    parser.add_argument("--markdown", type=Path, help="write the docs page (introduction and table) here")
    arguments = parser.parse_args()
    lines = ["| model | t | searched plan vs Megatron's | verified (Megatron / searched) | ILP cost of the traced "
             "blocks [ms] (Megatron / searched) | step [s] (Megatron / searched) | memory [GiB] (Megatron / "
             "searched) |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as cache_dir:
        for name in arguments.models:
            model = str(CONFIGS / name / "config.json") if (CONFIGS / name).is_dir() else name
            spec = phaze.api.settings("extract_graph", model, cache_dir=cache_dir).spec
            for width in arguments.widths:
                if width in valid_tensor_parallel_widths(spec, width):
                    lines.append(row(name, model, width, cache_dir))
                    print(lines[-1], flush=True)
    if arguments.markdown:
        atomic_write(arguments.markdown, INTRODUCTION + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
