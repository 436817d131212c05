"""A Gantt chart of a schedule: one lane per TC and per VC, and lanes for collectives."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from solver.schedule.cores import assign_cores, lanes
from solver.schedule.listsched import Schedule
from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import ScheduleResult

COLOURS = {"TC": "tab:blue", "VC": "tab:orange", "TCandVC": "tab:green", "collective": "tab:gray"}


def _rows(problem: ScheduleProblem, result: ScheduleResult) -> tuple[list[str], list[list[int]], str]:
    """Lane labels, the lanes each operator is drawn on, and a note on the lanes left out.

    Only the cores that one-core runs use get a lane (a chip may have thousands of cores); a
    parallel run covers every lane of its type."""
    schedule = Schedule(result.start, result.parallel)
    cores = assign_cores(problem, schedule)
    shown = []
    for kind, count in enumerate((problem.num_tc, problem.num_vc)):
        used = max((c[kind] + 1 for c in cores if c[kind] is not None), default=0)
        needed = any((op.uses_tc, op.uses_vc)[kind] and op.uses_cores for op in problem.ops)
        shown.append(min(count, max(used, int(needed))))
    collectives = [i for i, op in enumerate(problem.ops) if op.core == "collective" and op.latency > 0]
    ends = [s + op.latency for s, op in zip(result.start, problem.ops)]
    collective_lane = dict(zip(collectives, lanes([(result.start[i], ends[i]) for i in collectives], 0.0)))
    tc_rows = list(range(shown[0]))
    vc_rows = [shown[0] + c for c in range(shown[1])]
    labels = [f"TC{c}" for c in tc_rows] + [f"VC{c}" for c in range(shown[1])]
    labels += [f"collective{c}" for c in range(max(collective_lane.values(), default=-1) + 1)]
    drawn: list[list[int]] = []
    for i, op in enumerate(problem.ops):
        if i in collective_lane:
            drawn.append([shown[0] + shown[1] + collective_lane[i]])
        elif not op.uses_cores:
            drawn.append([])
        elif result.parallel[i]:
            pairs = min(shown)
            drawn.append({"TC": tc_rows, "VC": vc_rows, "TCandVC": tc_rows[:pairs] + vc_rows[:pairs]}[op.core])
        else:
            tc, vc = cores[i]
            drawn.append(([] if tc is None else [tc_rows[tc]]) + ([] if vc is None else [vc_rows[vc]]))
    note = f"lanes: {shown[0]} of {problem.num_tc} TCs, {shown[1]} of {problem.num_vc} VCs (the others stay idle)"
    return labels, drawn, note


#: The figure's width [inches], the least share of it the time axis keeps beside the lane names and
#: the legend, and the labels' font size [points]; a label is drawn only on a bar at least as long as
#: its text (about 0.6 of the font size a character), so no two labels overlap.
FIGURE_WIDTH = 10.0
AXES_SHARE = 0.7
LABEL_FONT_SIZE = 7
CHARACTER_WIDTH = 0.6 * LABEL_FONT_SIZE


def gantt_figure(problem: ScheduleProblem, result: ScheduleResult, title: str = "") -> Figure:
    """The Gantt chart of `result`: a bar per operator on each lane it holds, named where the bar is
    long enough for its name, and a legend of the kinds of bar drawn (a parallel run hatched)."""
    labels, drawn, note = _rows(problem, result)
    scale, unit = next((s, u) for s, u in ((1e6, "µs"), (1e3, "ms"), (1.0, "s")) if result.makespan * s < 1000)
    figure = Figure(figsize=(FIGURE_WIDTH, 0.45 * len(labels) + 1.5))
    axes = figure.add_subplot()
    span = max(result.makespan * scale, 1e-12)
    points = AXES_SHARE * FIGURE_WIDTH * 72  # the time axis's width, at least
    kinds, parallel = [], False
    for i, rows in enumerate(drawn):
        op = problem.ops[i]
        if rows and op.core not in kinds:
            kinds.append(op.core)
        parallel |= bool(rows) and result.parallel[i]
        duration = op.duration(result.parallel[i]) * scale
        name = op.name or str(i)
        for row in rows:
            axes.broken_barh(
                [(result.start[i] * scale, duration)], (row - 0.4, 0.8), facecolors=COLOURS[op.core],
                edgecolor="black", linewidth=0.5, hatch="//" if result.parallel[i] else None,
            )
            if duration / span * points >= CHARACTER_WIDTH * len(name):
                axes.text(result.start[i] * scale + duration / 2, row, name, ha="center", va="center",
                          fontsize=LABEL_FONT_SIZE, clip_on=True)
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()
    axes.set_xlim(0, span)
    axes.set_xlabel(f"time [{unit}]; {note}")
    axes.set_title(title or f"makespan {result.makespan * scale:.4g} {unit} ({result.backend}, {result.status})")
    handles = [Patch(facecolor=COLOURS[kind], label=kind) for kind in COLOURS if kind in kinds]
    if parallel:
        handles.append(Patch(facecolor="white", hatch="//", label="parallel"))
    if handles:
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=LABEL_FONT_SIZE)
    figure.tight_layout()
    return figure


def plot_gantt(problem: ScheduleProblem, result: ScheduleResult, path: str | Path, title: str = "") -> Path:
    """Draw `result` (`gantt_figure`) to `path` (any format matplotlib writes, by suffix);
    write-then-rename."""
    path = Path(path)
    figure = gantt_figure(problem, result, title)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    figure.savefig(temporary)
    os.replace(temporary, path)
    return path
