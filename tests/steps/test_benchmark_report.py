"""The comparison report, built offline from facts: speedups, tables, determinism and the files."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from steps.benchmark_report import (
    FIGURE_PNG,
    NA,
    AcceptanceSet,
    Side,
    build_report,
    markdown,
    speedup,
    write_report,
)
from steps.benchmark_results import LATENCY_FIELDS, BenchRun, points
from tests.steps.test_benchmark import asked

METRICS = ("duration", "request_throughput", "input_throughput", "output_throughput", "total_throughput")
METRICS += ("max_output_tokens_per_s", "concurrency", *LATENCY_FIELDS, "accept_length")


def bench_run(concurrency: int, output_throughput: float | None, repeat: int = 1, **values: Any) -> BenchRun:
    fields: dict[str, Any] = dict.fromkeys(METRICS, 1.0) | {"total_input_tokens": 10, "total_output_tokens": 10}
    fields |= {"output_throughput": output_throughput, **values}
    about = asked(concurrency, 8, repeat=repeat, seed=repeat).model_dump()
    return BenchRun(completed=8, unknown={}, **about, **fields)


def side_of(label: str, runs: list[BenchRun], step: str | None = None) -> Side:
    return Side(step=step or label, label=label, input_len=256, output_len=64, runs=runs, points=points(runs, 0.05))


def side(label: str, throughputs: dict[int, float | None], step: str | None = None) -> Side:
    return side_of(label, [bench_run(c, t) for c, t in throughputs.items()], step)


BASELINE = side("baseline", {1: 100.0, 4: 350.0, 16: 1000.0}, "benchmark_baseline")
DFLASH = side("dflash", {1: 310.0, 4: 910.0, 16: 1500.0}, "benchmark_dflash")
SETS = {
    "math": AcceptanceSet(requests=20, mean=5.3, median=5.4, p10=4.1, min=3.0, max=7.9, tokens_per_s=512.3),
    "chat": AcceptanceSet(requests=20, mean=3.7, median=None, p10=2.0, min=1.0, max=6.0, tokens_per_s=None),
}


def test_speedup_per_concurrency_and_its_range() -> None:
    gain = speedup(BASELINE, DFLASH)
    assert gain.by_concurrency == {"1": 3.1, "4": 2.6, "16": 1.5}
    assert (gain.min, gain.max) == (1.5, 3.1) and abs((gain.mean or 0) - 7.2 / 3) < 1e-9 and gain.unknown == {}


def test_an_unknown_speedup_makes_the_range_unknown_with_the_reason() -> None:
    gain = speedup(side("baseline", {1: 0.0, 4: 350.0}), side("dflash", {1: 310.0, 4: 910.0}))
    assert gain.by_concurrency == {"1": None, "4": 2.6}
    assert gain.min is None and "unknown at concurrency 1" in gain.unknown["min"]
    assert "dflash 310.0, baseline 0.0" in gain.unknown["1"]


def test_no_common_concurrency_is_said() -> None:
    gain = speedup(side("baseline", {1: 1.0}), side("dflash", {2: 1.0}))
    assert gain.by_concurrency == {} and gain.min is None
    assert gain.unknown["min"] == "no concurrency ran in both benchmarks (baseline: [1], dflash: [2])"


def test_the_report_has_the_three_tables_and_names_what_was_not_compared() -> None:
    report = build_report(BASELINE, side("dflash", {1: 310.0, 4: 910.0, 64: 2000.0}), SETS)
    titles = [t.title for t in report.tables]
    assert titles == [
        "Acceptance length per prompt set",
        "Output throughput per concurrency",
        "Latency per concurrency (ms)",
    ]
    acceptance, throughput, latency = report.tables
    assert acceptance.rows == [
        ["math", "20", "5.30", "5.40", "4.10", "3.00", "7.90", "512.3"],
        ["chat", "20", "3.70", NA, "2.00", "1.00", "6.00", NA],
    ]
    assert throughput.columns[:4] == ["concurrency", "baseline output tok/s", "dflash output tok/s", "speedup"]
    assert [row[:4] for row in throughput.rows] == [["1", "100.0", "310.0", "3.10x"], ["4", "350.0", "910.0", "2.60x"]]
    assert [row[:2] for row in latency.rows] == [["1", "baseline"], ["1", "dflash"], ["4", "baseline"], ["4", "dflash"]]
    assert "concurrency 16 ran only for baseline: not compared." in report.notes
    assert "concurrency 64 ran only for dflash: not compared." in report.notes
    assert build_report(BASELINE, DFLASH).tables[0].title == "Output throughput per concurrency"  # no acceptance step


throughput = st.one_of(st.none(), st.floats(min_value=0, max_value=1e9, allow_nan=False))
runs = st.dictionaries(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]), throughput, max_size=6)
labels = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12)


@given(base=runs, cand=runs, base_label=labels, cand_label=labels)
def test_any_numbers_give_a_consistent_deterministic_report(
    base: dict[int, float | None], cand: dict[int, float | None], base_label: str, cand_label: str
) -> None:
    baseline, candidate = side(base_label, base, "b"), side(cand_label, cand, "c")
    gain = speedup(baseline, candidate)
    common = sorted(set(base) & set(cand))
    assert list(gain.by_concurrency) == [str(c) for c in common]
    for c in common:
        b, v = base[c], cand[c]
        expected = v / b if v is not None and b is not None and b > 0 else None
        expected = expected if expected is None or math.isfinite(expected) else None  # overflow: unknown
        assert gain.by_concurrency[str(c)] == expected
        assert (expected is None) == (str(c) in gain.unknown)
    known = [v for v in gain.by_concurrency.values() if v is not None]
    assert gain.min == (min(known) if common and len(known) == len(common) else None)
    if gain.min is None:
        assert gain.unknown["min"]
    report = build_report(baseline, candidate, SETS)
    text = json.dumps(report.model_dump(mode="json"), allow_nan=False)
    assert text == json.dumps(build_report(baseline, candidate, SETS).model_dump(mode="json"), allow_nan=False)
    assert len(report.tables[1].rows) == len(common) and len(report.tables[2].rows) == 2 * len(common)
    for table in report.tables:
        assert all(len(row) == len(table.columns) for row in table.rows)
    page = markdown(report)
    assert page.count("\n## ") == len(report.tables)
    assert page.count("\n|---|") == len(report.tables)


@settings(max_examples=50)
@given(cells=st.lists(st.text(st.sampled_from("a|\\\n\r\x1c\u2028 "), max_size=8), min_size=1, max_size=4))
def test_markdown_cells_never_break_the_table(cells: list[str]) -> None:
    report = build_report(BASELINE, DFLASH)
    report.tables[0].rows.append(cells + [""] * (len(report.tables[0].columns) - len(cells)))
    first_table = markdown(report).split("\n## ")[1]
    line = [line for line in first_table.splitlines() if line.startswith("|")][-1]  # the added row
    assert line.startswith("| ") and line.endswith(" |") and "\n" not in line
    unescaped_pipes = re.findall(r"(?<!\\)(?:\\\\)*\|", line)
    assert len(unescaped_pipes) == len(report.tables[0].columns) + 1


def test_the_files_are_written_and_rewritten_identically(tmp_path: Path) -> None:
    report, files = write_report(tmp_path, BASELINE, DFLASH, SETS)
    assert json.loads(Path(files.json_file).read_text()) == report.model_dump(mode="json")
    assert Path(files.markdown_file).read_text() == markdown(report)
    figure = Path(files.figure_file)
    assert figure == tmp_path / FIGURE_PNG and figure.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    first = [Path(f).read_bytes() for f in (files.json_file, files.markdown_file, files.figure_file)]
    write_report(tmp_path, BASELINE, DFLASH, SETS)
    assert [Path(f).read_bytes() for f in (files.json_file, files.markdown_file, files.figure_file)] == first
    page = markdown(report)
    assert "| 1 | 100.0 | 310.0 | 3.10x |" in page and "![Output throughput and speedup" in page


def test_a_figure_is_drawn_even_with_nothing_to_compare(tmp_path: Path) -> None:
    _, files = write_report(tmp_path, side("baseline", {1: None}), side("dflash", {2: 0.0}))
    assert Path(files.figure_file).read_bytes().startswith(b"\x89PNG")


def test_the_speedup_is_of_medians_and_a_noisy_point_is_marked() -> None:
    """Three repeats a side: the speedup is the ratio of the medians (not of a mean, nor of one run), and the
    throughput table gives each side's median with its min-max and relative MAD."""
    base = side_of("baseline", [bench_run(1, v, repeat=r) for r, v in enumerate((100.0, 90.0, 130.0), 1)])
    cand = side_of("dflash", [bench_run(1, v, repeat=r) for r, v in enumerate((300.0, 301.0, 299.0), 1)])
    gain = speedup(base, cand)
    assert gain.by_concurrency == {"1": 3.0}  # 300 / 100; the means would give 300 / 106.7
    report = build_report(base, cand)
    table = next(t for t in report.tables if t.title == "Output throughput per concurrency")
    assert table.rows == [
        ["1", "100.0 (noisy)", "300.0", "3.00x", "90.0-130.0", "10.0%", "299.0-301.0", "0.3%", "1.00", "1.00"]
    ]
    assert "baseline: each number is the median of 3 clean run(s) per concurrency." in report.notes
    assert not [note for note in report.notes if "not the same prompts" in note]
    other = side_of("dflash", [bench_run(1, 300.0, repeat=r).model_copy(update={"seed": 10 + r}) for r in (1, 2, 3)])
    expected = "concurrency 1: baseline ran seeds [1, 2, 3], dflash [11, 12, 13]: not the same prompts"
    assert any(note.startswith(expected) for note in build_report(base, other).notes)
    latency = next(t for t in report.tables if t.title == "Latency per concurrency (ms)")
    assert latency.columns[2:4] == ["TTFT median", "TTFT p99"] and latency.rows[0][2] == "1.0"
