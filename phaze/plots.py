"""Plots of a run: throughput against area with the Pareto front, and the best placement's stages."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from phaze_common.files import atomic_write

MM2 = 1e6  # µm² per mm²


def save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lstrip("."), dpi=120, bbox_inches="tight")
    atomic_write(path, buffer.getvalue())
    return path


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """The points no smaller-or-equal-area point beats on throughput, by increasing area."""
    ordered = points.sort_values(["area", "throughput"], ascending=[True, False])
    return ordered[ordered["throughput"] > ordered["throughput"].cummax().shift(fill_value=0.0)]


def series_label(frame: pd.DataFrame) -> pd.Series:
    """"mbs <b>, <h> GiB" for each row of a results table."""
    return "mbs " + frame["micro_batch_size"].astype(str) + ", " + frame["hbm_size_gib"].map("{:.4g} GiB".format)


def plot_throughput_vs_area(frame: pd.DataFrame, marks: dict[str, tuple[float, float]], path: Path, title: str) -> Path:
    """`throughput_figure` saved to `path`."""
    return save(throughput_figure(frame, marks, title), path)


def throughput_figure(frame: pd.DataFrame, marks: dict[str, tuple[float, float]], title: str) -> Figure:
    """Every evaluated architecture (best of recomputation off/on) of each `series` of a results
    table, its Pareto front, and marked points (`marks`: label -> (area µm², throughput))."""
    figure = Figure(figsize=(8, 5))
    axes = figure.add_subplot()
    feasible = frame[frame["feasible"]]
    per_arch = feasible.groupby(["series", "candidate_index"], as_index=False).agg(
        area=("area", "first"), throughput=("throughput", "max")
    )
    for label, points in per_arch.groupby("series"):
        dots = axes.scatter(points["area"] / MM2, points["throughput"], s=10, alpha=0.5, label=label)
        front = pareto_front(points)
        axes.step(front["area"] / MM2, front["throughput"], where="post", color=dots.get_facecolor()[0])
    for label, (area, throughput) in marks.items():
        axes.scatter([area / MM2], [throughput], marker="*", s=180, edgecolors="black", zorder=3, label=label)
    axes.set_xlabel("accelerator area [mm²]")
    axes.set_ylabel("throughput [samples/s]")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def layer_ranges(layers: list[int]) -> str:
    """A device's layers as the ranges of its chunks: [0..4, 17..21] -> "0-4, 17-21" (a single layer
    as itself)."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def layout_title(model: str, placement: dict) -> str:
    """"model: t=4 c=2 p=4 d=2 v=20 (e=8): 64 devices" of a placement record (its widths; e when > 1)."""
    widths = {letter: placement.get(name, 1) for letter, name in (
        ("t", "tensor_parallel_width"), ("c", "context_parallel_width"), ("p", "pipeline_parallel_width"),
        ("d", "data_parallel_width"), ("v", "virtual_stages"), ("e", "expert_parallel_width"))}
    shown = " ".join(f"{letter}={width}" for letter, width in widths.items() if letter != "e" or width > 1)
    devices = widths["t"] * widths["c"] * widths["p"] * widths["d"]
    return f"{model}: {shown}: {devices:,} devices"


def stages_figure(loads: list[float], labels: list[str], title: str) -> Figure:
    """Per-stage compute time per micro-batch (forward + backward) of a placement, each bar named by
    `labels`."""
    figure = Figure(figsize=(max(6, 0.35 * len(loads) + 2), 4))
    axes = figure.add_subplot()
    axes.bar(range(len(loads)), [load * 1e3 for load in loads], color="tab:blue")
    axes.set_xticks(range(len(loads)), labels, rotation=90 if len(loads) > 8 or any(", " in label for label in labels)
                    else 0, fontsize="small")
    axes.set_xlabel("pipeline stage (its chunks' layers)")
    axes.set_ylabel("compute per micro-batch [ms]")
    axes.set_title(title)
    axes.grid(axis="y", alpha=0.3)
    return figure


def plot_stages(loads: list[float], labels: list[str], path: Path, title: str) -> Path:
    """`stages_figure` saved to `path`."""
    return save(stages_figure(loads, labels, title), path)


def plot_pareto(front: pd.DataFrame, path: Path, title: str, chips: pd.DataFrame | None = None,
                chips_label: str = "evaluated") -> Path:
    """The Pareto front of throughput against peak power and against cost (`results.write_pareto`'s
    rows), one panel each, over other chips (`chips`, grey, named `chips_label`) when given."""
    figure = Figure(figsize=(11, 4.5))
    for position, (column, label) in enumerate((("power_w", "peak power per chip [W]"),
                                                ("cost_usd", "cost per chip [US$]")), start=1):
        axes = figure.add_subplot(1, 2, position)
        if chips is not None and len(chips):
            axes.scatter(chips[column], chips["throughput"], s=6, color="0.6", label=chips_label)
        axes.scatter(front[column], front["throughput"], s=18, color="tab:red", label="Pareto front")
        axes.set_xlabel(label)
        axes.set_ylabel("throughput [samples/s]")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.suptitle(title)
    return save(figure, path)
