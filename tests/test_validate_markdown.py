"""`phaze validate FILE --markdown`: the same report as the text one, as Markdown tables (the
documentation's validation page is built from it)."""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from phaze.validate import main

RUNS = Path(__file__).resolve().parents[1] / "arch_configs" / "calibration" / "runs.json"
#: Two chips (one run each of SC'21 on A100 and Megatron-Core on H100) and a V100 run left out.
SUBSET = ("sc21_t1_1.7B", "mcore2024_weak_1.7B", "megatron2020_mp_1B_DGX-2")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """(text, Markdown) of `phaze validate` on the subset, graphs cached in a folder of the test's."""
    folder = tmp_path_factory.mktemp("validate")
    runs = [run for run in json.loads(RUNS.read_text()) if run["run_id"] in SUBSET]
    assert len(runs) == len(SUBSET)
    path = folder / "runs.json"
    path.write_text(json.dumps(runs))
    outputs = []
    for flags in ([], ["--markdown"]):
        stream = io.StringIO()
        with contextlib.redirect_stdout(stream):
            assert main([str(path), f"cache_dir={folder / 'cache'}", *flags]) == 0
        outputs.append(stream.getvalue())
    return tuple(outputs)


def text_summaries(text: str) -> dict[str, tuple[str, str, str]]:
    """{name: (runs, mean, max)} of the text report's summary lines."""
    return {name: (runs, mean, largest) for name, runs, mean, largest in re.findall(
        r"^(.+): (\d+) runs, mean absolute error ([\d.]+%), max ([\d.]+%)$", text, re.MULTILINE)}


def markdown_section(markdown: str, title: str) -> list[str]:
    """The lines of the section `## title` up to the next one of its level."""
    lines = markdown.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"## {title}"))
    end = next((index for index in range(start + 1, len(lines)) if lines[index].startswith("## ")), len(lines))
    return lines[start + 1:end]


def table_rows(lines: list[str]) -> list[list[str]]:
    """The body rows of the Markdown tables among `lines`, their cells stripped."""
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines if line.startswith("| ")]
    return [row for row in rows if row[0] not in ("run", "runs") and not set(row[0]) <= set("-: ")]


def test_the_summary_table_holds_the_text_report_s_figures(reports):
    text, markdown = reports
    summaries = text_summaries(text)
    assert set(summaries) == {"all", "a100_80gb 16-bit", "h100_sxm 16-bit"}
    rows = table_rows(markdown_section(markdown, "Summary"))
    assert {name: (runs, mean, largest) for name, runs, mean, largest in rows} == summaries


def test_each_run_has_a_row_with_its_measured_and_predicted_time(reports):
    text, markdown = reports
    rows = table_rows(markdown_section(markdown, "Runs"))
    assert [row[0] for row in rows] == ["sc21_t1_1.7B", "mcore2024_weak_1.7B‡"]
    for run, *_, measured, predicted, error, fits in rows:
        line = next(line for line in text.splitlines() if run in line)
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[-4:] == [measured, predicted, error, fits]
        assert float(predicted) / float(measured.rstrip("†§")) - 1 == pytest.approx(float(error.rstrip("%")) / 100,
                                                                                   abs=6e-4)
    headings = [line for line in markdown_section(markdown, "Runs") if line.startswith("### ")]
    assert headings == ["### a100_80gb 16-bit (1 runs)", "### h100_sxm 16-bit (1 runs)"]


def test_the_recipes_and_the_runs_left_out_are_listed(reports):
    _, markdown = reports
    assert any(line.startswith("- **Megatron-Core r0.8.0**: ") for line in markdown_section(markdown, "Recipes"))
    left_out = markdown_section(markdown, "Left out (1)")
    assert any(line.startswith("- hardware V100") and "megatron2020_mp_1B_DGX-2" in line for line in left_out)


def test_markdown_is_plain_markdown(reports):
    _, markdown = reports
    assert "│" not in markdown and "┃" not in markdown
    for line in markdown.splitlines():
        if line.startswith("|"):
            assert line.endswith("|")
