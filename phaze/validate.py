"""`phaze validate FILE`: phaze's predictions against published measured training runs.

FILE is a calibration set (arch_configs/calibration/runs.json). A run is predicted when it is a
model on A100 or H100 GPUs whose configuration is given: the model's shape, t, p, d, the
micro-batch and batch sizes, the recomputation, the precision (16-bit, or FP8 on a chip with FP8
figures), a time per iteration, and a parallelism phaze models (t, p, d, v, context parallelism,
weights sharded as ZeRO-3 / FSDP do; for a mixture of experts, Megatron's EP x ETP ranks as e =
EP·ETP / t replicas with the experts split t ways). Every other run is listed with why it is left out. A GPT run is a Megatron
GPT of its shape, a Llama or MoE run (Qwen3) a Llama-family model (`graph_extract.zoo.LLAMA_FAMILY`:
grouped-query attention, SwiGLU, RMSNorm, untied embeddings; a Llama's vocabulary padded to 128·t
as Megatron does); the cluster is
DGX A100 or DGX H100 nodes; the gradient sync overlaps the backward pass where the run says so
(PyTorch DDP, --overlap-grad-reduce) or its recipe does.

Where a run states no time per iteration, it is the global batch's tokens / the measured tokens per
second (marked). FP8 runs price their GEMMs at the chip's FP8 rate and all else as in 16-bit
(`phaze_hardware.chips`). What a Llama run of NeMo 24.07 or Megatron-Bridge 25.11 does not state (the
Llama 2 shapes, recomputation, sequence parallelism, distributed optimizer, gradient-sync overlap) is
taken from that release's published recipe (`RECIPES`, `LLAMA2_SHAPES`; marked); d, when not
stated, is devices / (t·p·cp).

Every field phaze reads is checked before any prediction (`read_runs`, `run_error`, `run_cases`): a
file that is not a list of runs, a run without one of its sections, a field stated with a value it
cannot take (a count that is not a positive integer, a measured time or tokens/s that is not a
positive finite number), t·p·d·cp differing from the devices or a global batch not a multiple of
micro-batch × d is one line `phaze: error: FILE: run 'id': field: ...` and status 2. A field that is
absent or null is not stated: the run is left out when phaze needs it. The traced graphs are cached
in `cache_dir=PATH`, by default the per-user cache folder $XDG_CACHE_HOME/phaze (else ~/.cache/phaze),
never in the working directory unasked. `--markdown` prints the same report as Markdown tables (the
documentation site's validation page is made from it).
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from phaze_common.checks import InputError
from phaze.environment import user_cache_dir
from phaze.validation.cases import Case, predictions, run_cases, sharded_or_context_parallel
from phaze.validation.recipes import FROM_FLOPS, FROM_RECIPE, FROM_TOKENS, RECIPES
from phaze.validation.runs import read_runs





#: `phaze validate`'s overrides (key=value after FILE): what each sets.
OVERRIDES = {"cache_dir": "the folder extracted graphs are cached in"}
SYNOPSIS = "phaze validate FILE [cache_dir=PATH]"
USAGE = (f"usage: {SYNOPSIS}   (FILE: a calibration set of measured runs, e.g. arch_configs/calibration/runs.json; "
         "cache_dir: where extracted graphs are kept, by default $XDG_CACHE_HOME/phaze or ~/.cache/phaze; "
         "--markdown: the report as Markdown tables, as the documentation's validation page shows it)")


def parse_arguments(arguments: list[str]) -> tuple[str, dict[str, str]]:
    """(FILE, overrides) of `phaze validate FILE [key=value ...]` (InputError naming the argument)."""
    files, overrides = [], {}
    for argument in arguments:
        key, equals, value = argument.partition("=")
        if not equals or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            if argument.startswith("-") and argument != "-":
                raise InputError(f"{argument}: unknown option; {SYNOPSIS}")
            files.append(argument)
            continue
        if key not in OVERRIDES:
            allowed = ", ".join(f"{name} ({what})" for name, what in OVERRIDES.items())
            raise InputError(f"{key}: unknown override; allowed keys: {allowed}")
        if key in overrides:
            raise InputError(f"{key}: given twice ({overrides[key]!r} and {value!r})")
        if not value:
            raise InputError(f"{key}: must be a folder path, got an empty value")
        overrides[key] = value
    if not files:
        raise InputError(f"FILE: missing; {SYNOPSIS}")
    if len(files) > 1:
        raise InputError(f"FILE: one file, got {len(files)} ({', '.join(files)}); {SYNOPSIS}")
    return files[0], overrides


def usable_cache_dir(path: Path) -> Path:
    """`path`, made if absent, once a file can be written in it (InputError naming cache_dir otherwise)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"cache_dir: {path} is not a folder; give cache_dir=PATH, a folder phaze can write to")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise InputError(f"cache_dir: cannot write to {path} ({error.strerror or error}); give cache_dir=PATH, "
                         "a folder phaze can write to") from None
    return path



@dataclass(frozen=True)
class Row:
    """One predicted run as `validate` shows it: the run, its prediction and the relative error."""

    item: Case
    predicted_s: float
    fits: bool

    @property
    def error(self) -> float:
        return self.predicted_s / self.item.measured - 1

    @property
    def group(self) -> str:
        """The chip and precision whose summary the run counts in."""
        return f"{self.item.chip} {self.item.precision}{' MoE' if self.item.moe else ''}"

    @property
    def layout(self) -> str:
        item = self.item
        return (f"{item.width} {item.stages} {item.degree} {item.virtual_stages}"
                + (f" e{item.expert_parallel_width}" if item.expert_parallel_width > 1 else "")
                + (f" et{item.expert_tensor_parallel_width}"
                   if item.expert_tensor_parallel_width not in (None, item.width) else "")
                + (f" c{item.context_parallel_width}" if item.context_parallel_width > 1 else "")
                + (" fsdp" if item.training.data_parallel_sharding == "full" else ""))

    @property
    def cells(self) -> tuple[str, ...]:
        """run, devices, t p d v, mbs, batch, recompute, measured s, predicted s, error, fits."""
        item = self.item
        return (f"{item.run_id}{FROM_RECIPE if item.assumed else ''}", str(item.devices), self.layout,
                str(item.micro_batch_size), str(item.global_batch_size), item.recompute,
                f"{item.measured:.4g}{item.time_from}", f"{self.predicted_s:.4g}", f"{self.error:+.1%}",
                "yes" if self.fits else "no")


ROW_HEADERS = ("run", "devices", "t p d v", "mbs", "batch", "recompute", "measured s", "predicted s", "error", "fits")
MARKS = (f"{FROM_TOKENS} measured time = global batch tokens / measured tokens per second; {FROM_FLOPS} "
         "measured time = FLOPs per iteration by Megatron's formula / (measured model TFLOP/s x devices); "
         f"{FROM_RECIPE} "
         "settings the run does not state taken from its framework's published recipe; fits: within the chip's HBM "
         "per device by phaze's memory model")


def summaries(rows: list[Row]) -> list[tuple[str, list[float]]]:
    """(name, absolute errors) of every run, of each chip and precision (when more than one), and of
    the runs that shard their weights or split their sequences, all and on GPUs."""
    errors: dict[str, list[float]] = {}
    split: dict[str, list[float]] = {}
    for row in rows:
        errors.setdefault(row.group, []).append(abs(row.error))
        if sharded_or_context_parallel(row.item):
            split.setdefault("sharded or context-parallel", []).append(abs(row.error))
            if not row.item.chip.startswith("tpu"):
                split.setdefault("sharded or context-parallel, GPUs", []).append(abs(row.error))
    every = [error for group in errors.values() for error in group]
    named = [("all", every)] + (list(errors.items()) if len(errors) > 1 else []) + list(split.items())
    return [(name, group) for name, group in named if group]


def recipes_used(rows: list[Row]) -> list[str]:
    """The recipes the marked runs take their unstated settings from, by name."""
    return sorted({row.item.recipe for row in rows if row.item.assumed and row.item.recipe})


def left_out_reasons(left_out: list[tuple[str, str]]) -> dict[str, list[str]]:
    """The left-out runs by reason."""
    reasons: dict[str, list[str]] = {}
    for run, why in left_out:
        reasons.setdefault(why, []).append(run)
    return reasons


def print_text(name: str, rows: list[Row], left_out: list[tuple[str, str]]) -> None:
    """The table, the marks, the recipes, the summaries and the runs left out, for a terminal."""
    table = Table(title=f"phaze validate {name}")
    for header in ("run", "chip", "precision", *ROW_HEADERS[1:]):
        table.add_column(header, justify="left" if header in ("run", "chip", "precision", "recompute") else "right",
                         no_wrap=header == "run")
    for row in rows:
        run, *rest = row.cells
        table.add_row(run, row.item.chip, row.item.precision, *rest)
    console = Console(width=max(Console().width, 160))
    console.print(table)
    console.print(MARKS)
    for recipe in recipes_used(rows):
        console.print(f"{FROM_RECIPE} {recipe}: {RECIPES[recipe].source}")
    for group, errors in summaries(rows):
        console.print(f"{group}: {len(errors)} runs, mean absolute error {sum(errors) / len(errors):.1%}, "
                      f"max {max(errors):.1%}")
    console.print(f"left out ({len(left_out)}):")
    for why, names in left_out_reasons(left_out).items():
        console.print(f"  {why}: {len(names)} ({', '.join(names) if len(names) <= 4 else names[0] + ', ...'})")


def _cell(text: str) -> str:
    """`text` as a Markdown table cell or list item: its bars and asterisks literal."""
    return text.replace("|", "\\|").replace("*", "\\*")


def markdown_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table, numbers right-aligned."""
    align = ["---" if header in ("run", "runs", "recompute") else "---:" for header in headers]
    return ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows)]


def print_markdown(rows: list[Row], left_out: list[tuple[str, str]]) -> None:
    """The same report as Markdown: the summaries as a table, the runs grouped by chip and precision,
    the marks, the recipes and the runs left out (the docs' validation page)."""
    lines = ["## Summary", ""]
    lines += markdown_table(("runs", "count", "mean absolute error", "max"), [
        (group, str(len(errors)), f"{sum(errors) / len(errors):.1%}", f"{max(errors):.1%}")
        for group, errors in summaries(rows)])
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    lines += ["", "## Runs", "", MARKS + "."]
    for group, members in groups.items():
        lines += ["", f"### {group} ({len(members)} runs)", ""]
        lines += markdown_table(ROW_HEADERS, [row.cells for row in members])
    recipes = recipes_used(rows)
    if recipes:
        lines += ["", "## Recipes", "", f"What each run marked {FROM_RECIPE} takes from its release's published recipe:",
                  ""]
        lines += [f"- **{recipe}**: {_cell(RECIPES[recipe].source)}" for recipe in recipes]
    lines += ["", f"## Left out ({len(left_out)})", ""]
    lines += [f"- {why}: {len(names)} ({', '.join(names)})" for why, names in left_out_reasons(left_out).items()]
    print("\n".join(lines))


def main(arguments: list[str]) -> int:
    if not arguments:
        print(USAGE, file=sys.stderr)
        return 2
    if "-h" in arguments or "--help" in arguments:
        print(USAGE)
        return 0
    markdown = "--markdown" in arguments
    arguments = [argument for argument in arguments if argument != "--markdown"]
    try:  # every input checked before any prediction: a wrong one is one line and status 2
        name, overrides = parse_arguments(arguments)
        cache_dir = Path(overrides["cache_dir"]).expanduser() if "cache_dir" in overrides else user_cache_dir()
        cases = run_cases(read_runs(name))
        predicted, left_out = predictions(cases, usable_cache_dir(cache_dir))
    except InputError as problem:
        print(f"phaze: error: {problem}", file=sys.stderr)
        return 2
    rows = [Row(item, result.step.time_per_batch, result.step.feasible) for item, result in predicted]
    if markdown:
        print_markdown(rows, left_out)
    else:
        print_text(name, rows, left_out)
    return 0
