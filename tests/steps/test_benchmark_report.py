"""The comparison report, built offline from facts: speedups, tables, determinism and the files."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from steps.benchmark_figures import write_report
from steps.benchmark_report import (
    ACCEPTANCE_PNG,
    FIGURE_PNG,
    NA,
    PARETO_PNG,
    Acceptance,
    AcceptanceSet,
    HistogramBin,
    LosslessSet,
    Side,
    build_report,
    markdown,
    pareto_points,
    speedup,
)
from steps.benchmark_results import LATENCY_FIELDS, MEASURED_MAX, BenchRun, points
from steps.provenance import Measured, Provenance, Sources, build
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
MATH_BINS = [HistogramBin(low=1.0 + i / 2, high=1.5 + i / 2, count=n) for i, n in enumerate([0, 1, 2, 3, 5, 4, 3, 2])]
SETS = {
    "math": AcceptanceSet(
        requests=20, mean=5.3, weighted_mean=5.6, median=5.4, p10=4.1, min=3.0, max=7.9, tokens_per_s=512.3,
        histogram=MATH_BINS,
    ),
    # facts of an eval before the weighted mean and the histogram: `prompts` counts the requests, the rest is n/a
    "chat": AcceptanceSet.model_validate(
        {"prompts": 20, "mean": 3.7, "median": None, "p10": 2.0, "min": 1.0, "max": 6.0, "tokens_per_s": None}
    ),
}  # fmt: skip
ACCEPTANCE = Acceptance(
    step="eval",
    sets=SETS,
    api="chat",
    template="the server's chat template (/v1/chat/completions)",
    thinking=True,
    lossless={
        "math": LosslessSet(compared=20, identical=19, differing=1, first_divergence=[37], max_differing_fraction=0.05),
        "chat": LosslessSet(compared=20, identical=20, differing=0, first_divergence=[], max_differing_fraction=0.05),
    },
    speculation_on=True,
)


def deployed(tp: int) -> dict[str, Any]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/models/m", "--tp-size", str(tp)]
    return {"argv": argv, "model_path": "/models/m", "server_version": "0.5.23"}


def provenance_of(baseline: Side, candidate: Side) -> Provenance:
    """The provenance of a comparison whose two deployments run on 2 GPUs each."""
    sources = Sources("gpu", {}, {}, {}, {"deploy_b": deployed(2), "deploy_c": deployed(2)})
    sides = [Measured(baseline.label, baseline.step, "deploy_b", baseline.runs)]
    sides.append(Measured(candidate.label, candidate.step, "deploy_c", candidate.runs))
    return build(sources, sides, "2026-12-01T18:00:00+00:00", "eval", ACCEPTANCE.model_dump())


PROVENANCE = provenance_of(BASELINE, DFLASH)


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


PROVENANCE_TITLES = ["Provenance: repos", "Provenance: deployments", "Provenance: GPUs", "Provenance: benchmark runs"]
PROVENANCE_TITLES += ["Provenance: commands", "Provenance: acceptance eval", "Provenance: not known"]


def test_the_report_has_its_tables_and_names_what_was_not_compared() -> None:
    report = build_report(BASELINE, side("dflash", {1: 310.0, 4: 910.0, 64: 2000.0}), PROVENANCE, ACCEPTANCE)
    titles = [t.title for t in report.tables]
    assert titles == [
        "Acceptance length per prompt set",
        "Lossless check: greedy outputs of dflash against baseline",
        "Speculative decoding was on",
        "Output throughput per concurrency",
        "Latency per concurrency (ms)",
        "Acceptance length per run: exact and estimates",
        *PROVENANCE_TITLES,
    ]
    acceptance, lossless, speculation, throughput, latency = report.tables[:5]
    assert acceptance.columns == [
        "prompt set", "requests", "mean (per request)", "token-weighted mean", "median", "p10", "min", "max", "tokens/s"
    ]  # fmt: skip
    assert acceptance.rows == [
        ["math", "20", "5.30", "5.60", "5.40", "4.10", "3.00", "7.90", "512.3"],
        ["chat", "20", "3.70", NA, NA, "2.00", "1.00", "6.00", NA],
    ]
    note = next(n for n in report.notes if n.startswith("acceptance length (step eval)"))
    assert "api chat, template the server's chat template (/v1/chat/completions), thinking on" in note
    # the benchmark's own accept length is of random token ids: the report says which numbers are of real prompts
    assert any(n.startswith("the latency table's accept length is of dflash's benchmark prompts") for n in report.notes)
    assert lossless.columns == [
        "prompt set", "compared", "identical", "differing", "first divergence (token index)", "tolerance"
    ]  # fmt: skip
    assert lossless.rows == [
        ["math", "20", "19", "1", "37", "5.0% of outputs may differ"],
        ["chat", "20", "20", "0", "-", "5.0% of outputs may differ"],
    ]
    assert speculation.rows == [["eval", "yes", "every answered request had spec_verify_ct > 0"]]
    assert throughput.columns[:4] == ["concurrency", "baseline output tok/s", "dflash output tok/s", "speedup"]
    assert [row[:4] for row in throughput.rows] == [["1", "100.0", "310.0", "3.10x"], ["4", "350.0", "910.0", "2.60x"]]
    assert [row[:2] for row in latency.rows] == [["1", "baseline"], ["1", "dflash"], ["4", "baseline"], ["4", "dflash"]]
    assert "concurrency 16 ran only for baseline: not compared." in report.notes
    assert "concurrency 64 ran only for dflash: not compared." in report.notes
    assert build_report(BASELINE, DFLASH, PROVENANCE).tables[0].title == "Output throughput per concurrency"


def test_an_older_eval_s_facts_show_n_a_and_no_lossless_table() -> None:
    """Facts of an eval_acceptance without the API, lossless check or speculation proof still give a report."""
    old = Acceptance.model_validate({"step": "eval", "sets": {"math": {"prompts": 4, "mean": 4.0, "x": 1}}})
    report = build_report(BASELINE, DFLASH, PROVENANCE, old)
    titles = [t.title for t in report.tables]
    assert titles[:3] == ["Acceptance length per prompt set", "Speculative decoding was on", titles[2]]
    assert not any(t.startswith("Lossless") for t in titles)
    assert report.tables[1].rows == [["eval", NA, "the eval's facts do not say"]]
    assert "api n/a, template n/a, thinking n/a" in next(n for n in report.notes if n.startswith("acceptance length"))
    assert [f.path for f in report.figures] == [FIGURE_PNG, PARETO_PNG]  # no histogram: no acceptance.png
    assert "no acceptance histogram: the facts of eval have none." in report.notes


@pytest.mark.parametrize(
    ("hostile", "where"),
    [
        ({"histogram": [{"low": 1.0, "high": 2.0, "count": 10**400}]}, "histogram.0.count"),  # OverflowError drawing
        (
            {"histogram": [{"low": -1e308, "high": 1e308, "count": 3}]},
            "histogram.0.low histogram.0.high",
        ),  # matplotlib's ValueError
        ({"requests": -4}, "requests"),
        ({"mean": 1e308}, "mean"),
        ({"tokens_per_s": 10**400}, "tokens_per_s"),
    ],
)
def test_stored_acceptance_numbers_out_of_bounds_are_refused_naming_the_field(hostile: Any, where: str) -> None:
    """An eval's facts as a tampered state.db holds them: refused where they are read (the benchmark step then fails
    naming the field: `acceptance: the sets of step ... are not acceptance facts`), never drawn."""
    with pytest.raises(ValidationError) as refused:
        Acceptance.model_validate({"step": "eval", "sets": {"math": {"prompts": 4, "mean": 4.0} | hostile}})
    assert [".".join(map(str, e["loc"][2:])) for e in refused.value.errors()] == where.split()


def test_the_largest_acceptance_numbers_allowed_are_drawn(tmp_path: Path) -> None:
    top = MEASURED_MAX - 1
    bins = [{"low": 0.0, "high": top, "count": int(top)}, {"low": 0.0, "high": 5e-324, "count": 0}]
    sets = {"math": {"prompts": int(top), "mean": top, "tokens_per_s": top, "histogram": bins}}
    write_report(tmp_path, BASELINE, DFLASH, PROVENANCE, Acceptance.model_validate({"step": "eval", "sets": sets}))
    assert (tmp_path / ACCEPTANCE_PNG).stat().st_size > 0


SIDE_LABELS = ("baseline", "dflash")


def test_the_provenance_is_in_report_json_and_its_tables() -> None:
    report = build_report(BASELINE, DFLASH, PROVENANCE, ACCEPTANCE)
    document = report.model_dump(mode="json")
    assert set(document["provenance"]) >= {"generated_at", "repos", "deployments", "gpus", "benchmarks", "unknown"}
    tables = {t.title: t for t in report.tables}
    deployments = tables["Provenance: deployments"]
    assert deployments.columns == ["side", "step", "host", "SGLang", "algorithm", "GPUs", "model", "drafter"]
    assert deployments.rows[0] == ["baseline", "deploy_b", "gpu", "0.5.23", "none (baseline)", "2", "/models/m", "-"]
    runs = tables["Provenance: benchmark runs"]
    assert runs.columns == ["side", "workload", "concurrency", "repeat", "seed", "started (UTC)", "finished (UTC)"]
    assert [row[:3] for row in runs.rows] == [
        [s, "random-ids", str(c)] for s in ("baseline", "dflash") for c in (1, 4, 16)
    ]
    commands = tables["Provenance: commands"]
    assert commands.columns == ["side", "what", "command"]
    launch = "python -m sglang.launch_server --model-path /models/m --tp-size 2"
    assert commands.rows[:2] == [["baseline", "launch_server", launch], ["dflash", "launch_server", launch]]
    # one bench_serving row a side (its runs differ in concurrency, prompts and seed: the runs table)
    assert [row[:2] for row in commands.rows[2:]] == [[s, "bench_serving (the first of 3 runs)"] for s in SIDE_LABELS]
    assert commands.rows[2][2] == BASELINE.runs[0].command
    assert tables["Provenance: GPUs"].rows == []  # no probe: said in the unknowns
    unknown = dict(map(tuple, tables["Provenance: not known"].rows))  # type: ignore[arg-type]
    assert unknown == PROVENANCE.unknown and unknown["gpus"].startswith("no probe step ran on host gpu")
    assert any(note.startswith("generated at 2026-12-01T18:00:00+00:00") for note in report.notes)


def test_pareto_points_are_throughput_per_gpu_against_tokens_per_user() -> None:
    baseline = side_of("baseline", [
        bench_run(1, 100.0, median_tpot_ms=10.0), bench_run(4, 300.0, repeat=1, median_tpot_ms=20.0),
        bench_run(4, 340.0, repeat=2, median_tpot_ms=25.0), bench_run(4, 310.0, repeat=3, median_tpot_ms=30.0),
        bench_run(16, 900.0, median_tpot_ms=None),
    ])  # fmt: skip
    points = pareto_points(baseline, gpus=2)
    assert [(p.concurrency, p.tokens_per_s_per_gpu, p.tokens_per_s_per_user) for p in points] == [
        (1, 50.0, 100.0),
        (4, 155.0, 40.0),
    ]  # medians over repeats; 16: no TPOT
    assert pareto_points(baseline, gpus=None) == []
    report = build_report(baseline, baseline.model_copy(update={"label": "dflash"}), provenance_of(baseline, baseline))
    assert "pareto.png leaves out baseline at concurrency 16: no output throughput or TPOT there." in report.notes


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
    report = build_report(baseline, candidate, PROVENANCE, ACCEPTANCE)
    text = json.dumps(report.model_dump(mode="json"), allow_nan=False)
    again = build_report(baseline, candidate, PROVENANCE, ACCEPTANCE).model_dump(mode="json")
    assert text == json.dumps(again, allow_nan=False)
    tables = {t.title: t for t in report.tables}
    assert len(tables["Output throughput per concurrency"].rows) == len(common)
    assert len(tables["Latency per concurrency (ms)"].rows) == 2 * len(common)
    for table in report.tables:
        assert all(len(row) == len(table.columns) for row in table.rows)
    page = markdown(report)
    assert page.count("\n## ") == len(report.tables)
    assert page.count("\n|---|") == len(report.tables)


@settings(max_examples=50)
@given(cells=st.lists(st.text(st.sampled_from("a|\\\n\r\x1c\u2028 "), max_size=8), min_size=1, max_size=4))
def test_markdown_cells_never_break_the_table(cells: list[str]) -> None:
    report = build_report(BASELINE, DFLASH, PROVENANCE)
    report.tables[0].rows.append(cells + [""] * (len(report.tables[0].columns) - len(cells)))
    first_table = markdown(report).split("\n## ")[1]
    line = [line for line in first_table.splitlines() if line.startswith("|")][-1]  # the added row
    assert line.startswith("| ") and line.endswith(" |") and "\n" not in line
    unescaped_pipes = re.findall(r"(?<!\\)(?:\\\\)*\|", line)
    assert len(unescaped_pipes) == len(report.tables[0].columns) + 1


def test_host_text_reaches_report_md_with_its_control_characters_escaped() -> None:
    # /server_info's version, nvidia-smi's names and a host-expanded argv are the host's words: `cat report.md`
    # must not let them set the clipboard (OSC 52), clear the screen or reverse the text (U+202E)
    hostile = "0.5.23\x1b]52;c;aGk=\x07\x1b[2J\u202e"
    facts = deployed(2) | {"server_version": hostile, "argv": ["python", "--model-path", "/m\x9b31m"]}
    sources = Sources("gpu", {}, {}, {}, {"deploy_b": facts, "deploy_c": facts})
    sides = [Measured("baseline", BASELINE.step, "deploy_b", BASELINE.runs)]
    sides.append(Measured("dflash\x1b[8m", DFLASH.step, "deploy_c", DFLASH.runs))
    report = build_report(BASELINE, DFLASH.model_copy(update={"label": "dflash\x1b[8m"}), build(sources, sides, "t"))
    page = markdown(report)
    assert not any(char in page for char in "\x1b\x07\x9b\u202e")
    assert "0.5.23\\\\x1b\\]52;c;aGk=\\\\x07" in page  # shown's escape, its backslash escaped for markdown
    assert "- dflash\\\\x1b\\[8m (step benchmark\\_dflash)" in page  # a note too


def test_the_files_are_written_listed_and_rewritten_identically(tmp_path: Path) -> None:
    report, files = write_report(tmp_path, BASELINE, DFLASH, PROVENANCE, ACCEPTANCE)
    assert json.loads(Path(files.json_file).read_text()) == report.model_dump(mode="json")
    assert Path(files.markdown_file).read_text() == markdown(report)
    assert [f.path for f in report.figures] == [FIGURE_PNG, PARETO_PNG, ACCEPTANCE_PNG]
    written = [files.figure_file, files.pareto_file, files.acceptance_file]
    assert written == [str(tmp_path / f.path) for f in report.figures]
    for figure in written:
        assert Path(str(figure)).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    every = [files.json_file, files.markdown_file, *map(str, written)]
    first = [Path(f).read_bytes() for f in every]
    write_report(tmp_path, BASELINE, DFLASH, PROVENANCE, ACCEPTANCE)
    assert [Path(f).read_bytes() for f in every] == first
    page = markdown(report)
    assert "| 1 | 100.0 | 310.0 | 3.10x |" in page and "![Output throughput and speedup" in page
    assert "![Output tokens/s per GPU against tokens/s per user (Pareto view)](pareto.png)" in page
    assert "\n## Provenance: deployments\n" in page


def test_a_figure_is_drawn_even_with_nothing_to_compare(tmp_path: Path) -> None:
    baseline, candidate = side("baseline", {1: None}), side("dflash", {2: 0.0})
    _, files = write_report(tmp_path, baseline, candidate, provenance_of(baseline, candidate))
    assert Path(files.figure_file).read_bytes().startswith(b"\x89PNG")
    assert Path(files.pareto_file).read_bytes().startswith(b"\x89PNG") and files.acceptance_file is None


def test_the_speedup_is_of_medians_and_a_noisy_point_is_marked() -> None:
    """Three repeats a side: the speedup is the ratio of the medians (not of a mean, nor of one run), and the
    throughput table gives each side's median with its min-max and relative MAD."""
    base = side_of("baseline", [bench_run(1, v, repeat=r) for r, v in enumerate((100.0, 90.0, 130.0), 1)])
    cand = side_of("dflash", [bench_run(1, v, repeat=r) for r, v in enumerate((300.0, 301.0, 299.0), 1)])
    gain = speedup(base, cand)
    assert gain.by_concurrency == {"1": 3.0}  # 300 / 100; the means would give 300 / 106.7
    report = build_report(base, cand, provenance_of(base, cand))
    table = next(t for t in report.tables if t.title == "Output throughput per concurrency")
    assert table.rows == [
        ["1", "100.0 (noisy)", "300.0", "3.00x", "90.0-130.0", "10.0%", "299.0-301.0", "0.3%", "1.00", "1.00"]
    ]
    assert "baseline: each number is the median of 3 clean run(s) per concurrency." in report.notes
    assert not [note for note in report.notes if "not the same prompts" in note]
    other = side_of("dflash", [bench_run(1, 300.0, repeat=r).model_copy(update={"seed": 10 + r}) for r in (1, 2, 3)])
    expected = "concurrency 1: baseline ran seeds [1, 2, 3], dflash [11, 12, 13]: not the same prompts"
    assert any(note.startswith(expected) for note in build_report(base, other, provenance_of(base, other)).notes)
    latency = next(t for t in report.tables if t.title == "Latency per concurrency (ms)")
    assert latency.columns[2:4] == ["TTFT median", "TTFT p99"] and latency.rows[0][2] == "1.0"


def test_a_sub_millisecond_latency_keeps_two_significant_digits() -> None:
    """A stand-in's or a small model's TPOT under 1 ms is shown as measured, not as 0.0 ms."""
    fast = [bench_run(1, 300.0, median_tpot_ms=0.041, p99_tpot_ms=0.0, median_ttft_ms=5.375, median_itl_ms=0.2)]
    report = build_report(BASELINE, side_of("dflash", fast), provenance_of(BASELINE, side_of("dflash", fast)))
    latency = next(t for t in report.tables if t.title == "Latency per concurrency (ms)")
    assert latency.rows[1][2:7] == ["5.4", "1.0", "0.041", "0.0", "0.20"]  # 0.20 beside 0.21, not 0.2


def test_the_eval_s_acceptance_per_prompt_set_says_it_is_an_estimate() -> None:
    """The first table a reader meets gives meta_info's lengths per prompt set; its note says they are estimates
    and where the exact one is."""
    notes = build_report(BASELINE, DFLASH, PROVENANCE, ACCEPTANCE).notes
    (note,) = [n for n in notes if n.startswith(f"acceptance length (step {ACCEPTANCE.step})")]
    assert "from each request's meta_info, per prompt set: estimates; the exact length of the whole eval" in note
    assert any(n.endswith("A benchmark run's meta_info columns are n/a: the serving client's per-request details "
                          "(--output-details) carry no meta_info.") for n in notes)  # fmt: skip


def test_what_a_report_shows_is_one_shape_for_its_writers_and_runbook_report() -> None:
    """report.md renders the writers' Document, `runbook report` the Shown it reads back without pydantic: the
    same fields in the same order, and a written report reads back as the Shown its model gives."""
    import dataclasses

    from executor.documents import Shown, read_shown
    from steps.benchmark_report import Document

    assert [f.name for f in dataclasses.fields(Shown)] == [n for n in Document.model_fields if n != "schema_version"]
    report = build_report(BASELINE, DFLASH, PROVENANCE, ACCEPTANCE)
    assert read_shown(report.model_dump(mode="json")) == report.shown()
