"""`runbook report RUN_DIR`: prints a run's report.json tables, whatever wrote them."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor import terminal
from executor.faces.cli import main
from tests.clirun import runbook_cli

cell = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc", "Zl", "Zp"]), min_size=1, max_size=10)
tables = st.lists(
    st.integers(1, 6).flatmap(
        lambda width: st.fixed_dictionaries(
            {
                "title": cell,
                "columns": st.lists(cell, min_size=width, max_size=width),
                "rows": st.lists(st.lists(cell, min_size=width, max_size=width), max_size=4),
            }
        )
    ),
    min_size=1,
    max_size=3,
)


#: A complete provenance: `runbook report` shows only a report that says what its numbers are of.
PROVENANCE = {"generated_at": "2026-12-01T18:00:00+00:00", "repos": [], "deployments": [], "gpus": None}
PROVENANCE |= {"benchmarks": [], "unknown": {"gpus": "no probe step ran on host gpu"}}


def write(run_dir: Path, report: dict[str, object], provenance: object = PROVENANCE) -> None:
    """report.json with `provenance` (left out where it is None)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    document = report if provenance is None else {**report, "provenance": provenance}
    (run_dir / "report.json").write_text(json.dumps(document))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tables=tables)
def test_every_cell_of_every_table_is_printed_as_data(
    tables: list[dict[str, object]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "run", {"title": "[bold]T[/bold]", "notes": ["a note"], "tables": tables, "figures": []})
    assert main(["report", str(tmp_path / "run")]) == 0
    shown = capsys.readouterr().out
    assert "[bold]T[/bold]" in shown and "- a note" in shown  # never read as rich markup
    squashed = "".join(shown.split())
    for table in tables:
        for text in [table["title"], *table["columns"], *(c for row in table["rows"] for c in row)]:  # type: ignore[misc]
            # as the console shows it: format characters (U+00AD) escaped, and a cell of zero-width ones only
            assert "".join(terminal.shown_text(str(text)).plain.split()) in squashed


def test_a_wide_table_is_split_by_columns_never_squeezed(tmp_path: Path) -> None:
    """On a terminal of 80 columns: the table goes into several that fit, each with the first column again; the
    numbers are never cut or folded, and a figure's path is whole on its line."""
    row = [f"{n:,}.5" for n in range(1_000_000, 1_000_012)]
    table = {"title": "wide", "columns": [f"column {n}" for n in range(12)], "rows": [row]}
    write(tmp_path / "run", {"title": "t", "tables": [table], "figures": [{"title": "plot", "path": "speedup.png"}]})
    done = runbook_cli("report", str(tmp_path / "run"), env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert all(number in done.stdout for number in row)
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in done.stdout.splitlines()), done.stdout
    parts = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("wide (")]
    assert len(parts) > 1 and parts[-1] == f"wide ({len(parts)}/{len(parts)})"
    assert sum(line.startswith(f"│ {row[0]} ") for line in done.stdout.splitlines()) == len(parts)  # the key again
    assert str(tmp_path / "run" / "speedup.png") in done.stdout.split()


def test_json_prints_the_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = {"title": "t", "tables": [], "figures": [], "data": {"x": [1.5]}}
    write(tmp_path / "run", report)
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**report, "provenance": PROVENANCE}


@pytest.mark.parametrize(
    ("provenance", "lacks"),
    [
        (None, "no provenance"),
        ([], "a provenance that is list"),
        ({k: v for k, v in PROVENANCE.items() if k not in ("gpus", "unknown")}, "a provenance without gpus, unknown"),
        # every key there, but saying nothing
        (
            dict.fromkeys(PROVENANCE),
            "a provenance whose generated_at is NoneType, repos is NoneType, deployments is "
            "NoneType, benchmarks is NoneType, unknown is NoneType",
        ),
        (
            {**PROVENANCE, "generated_at": "", "repos": {"r": 1}, "gpus": "H200"},
            "a provenance whose generated_at is empty, repos is dict, gpus is str",
        ),
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_report_without_a_complete_provenance_is_refused(
    provenance: object, lacks: str, as_json: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Numbers that do not say which commits, servers, GPUs and commands they are of are not shown, as
    tables or as JSON: exit 2, one line naming the file and what is missing."""
    write(tmp_path / "run", {"title": "t", "tables": [], "figures": []}, provenance)
    assert main(["report", str(tmp_path / "run"), *(["--json"] if as_json else [])]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"runbook: {tmp_path / 'run' / 'report.json'}: refused: {lacks} (needs generated_at, ")
    assert "Traceback" not in captured.err


def test_no_report_is_exit_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "no report.json (a run folder without a report;" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no report.json (not a run folder;" in capsys.readouterr().err


@pytest.mark.parametrize(
    "document",
    [
        *("{oops", "[1, 2]", '{"tables": [{"title": "t"}]}', '{"notes": 5}', '{"figures": [1]}', '{"figures": "ab"}'),
        pytest.param("[" * 100_000 + "]" * 100_000, id="deeper-than-json-recurses"),
    ],
)
def test_a_broken_report_is_exit_2(document: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "report.json").write_text(document)
    assert main(["report", str(tmp_path)]) == 2
    assert "not a report" in capsys.readouterr().err


def test_a_report_of_a_newer_schema_version_is_refused_and_one_without_a_version_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report a newer runbook wrote (schema_version 2) is refused with the reason, not half-read; one written
    before reports carried a version reads as version 1, whose keys it has."""
    table = {"title": "t", "columns": ["a"], "rows": [["1"]]}
    write(tmp_path / "new", {"schema_version": 2, "title": "t", "notes": [], "tables": [table], "figures": []})
    assert main(["report", str(tmp_path / "new")]) == 2
    assert "refused: schema_version 2, written by a newer runbook (this one reads up to 1)" in capsys.readouterr().err
    write(tmp_path / "old", {"title": "old", "notes": [], "tables": [table], "figures": []})
    assert main(["report", str(tmp_path / "old")]) == 0
    assert "old" in capsys.readouterr().out


def test_a_provenance_per_host_is_read_whatever_the_hosts_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A campaign's provenance is one per host, told from a benchmark's one by its shape, not by the report's kind
    nor by the hosts' names: hosts named `gpus` and `repos` are hosts; one of them lacking a key is named."""
    report = {"title": "campaign", "notes": [], "tables": [], "figures": []}
    write(tmp_path / "run", report, {"gpus": PROVENANCE, "repos": PROVENANCE})
    assert main(["report", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    write(tmp_path / "run", report, {"gpus": PROVENANCE, "repos": {k: v for k, v in PROVENANCE.items() if k != "gpus"}})
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "refused: host repos: a provenance without gpus (needs " in capsys.readouterr().err


def test_the_provenance_runbook_report_requires_is_what_the_steps_write() -> None:
    """executor/documents.py's Provenance (read without pydantic) names fields of steps/provenance.py's, each of
    the JSON type that model writes: the two cannot drift apart."""
    import dataclasses

    from executor import documents
    from steps.provenance import Provenance

    written = Provenance.model_json_schema()["properties"]
    json_types = {str: "string", list: "array", dict: "object", type(None): "null"}
    for field in dataclasses.fields(documents.Provenance):
        wanted = {alt.get("type", "object") for alt in written[field.name].get("anyOf", [written[field.name]])}
        hint = typing.get_type_hints(documents.Provenance)[field.name]
        alternatives = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        said = {json_types[typing.get_origin(one) or one] for one in alternatives}
        assert said == wanted, field.name


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/etc/passwd", "plots/../../x.png", "a\n/../../x", "", ".", "a\x00b"]
)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_figure_that_is_no_file_of_the_run_folder_is_refused(
    path: str, as_json: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tampered report.json naming another file as its figure (absolute, or climbing out of the run folder) is
    not shown, as tables or as JSON (the MCP `report` reads it the same way): exit 2, one line naming it."""
    write(
        tmp_path / "run",
        {"title": "t", "tables": [], "figures": [{"title": "p", "path": "ok.png"}, {"title": "x", "path": path}]},
    )
    assert main(["report", str(tmp_path / "run"), *(["--json"] if as_json else [])]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.splitlines()
    assert "not a report" in line and "report.figures[1]: path " in line and "is no file of the run folder" in line


def test_a_row_of_another_width_than_its_columns_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its cells would be drawn under the wrong heads, or as columns of no head."""
    table = {"title": "t", "columns": ["a", "b"], "rows": [["1", "2"], ["1", "2", "3"]]}
    write(tmp_path / "run", {"title": "t", "tables": [table], "figures": []})
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "report.tables[0]: rows[1] has 3 cells for 2 columns" in capsys.readouterr().err


def test_a_report_past_what_a_console_shows_is_cut_saying_how_much_was_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report.json within its size limit may hold millions of rows, notes or tables (minutes to draw): the
    printout stops at views.SHOWN_MAX parts (here 12), in order, and says how many it left out; --json has all."""
    from executor.faces import views

    shown_within = views.shown_within
    monkeypatch.setattr(views, "shown_within", lambda shown: shown_within(shown, 12))
    rows = [[f"r{n}", f"v{n}"] for n in range(10)]
    tables = [
        {"title": "first", "columns": ["a", "b"], "rows": rows},
        {"title": "second", "columns": ["c"], "rows": [["x"]]},
    ]
    write(
        tmp_path / "run",
        {"title": "t", "notes": ["n1"], "tables": tables, "figures": [{"title": "f", "path": "f.png"}]},
    )
    assert main(["report", str(tmp_path / "run")]) == 0
    shown = capsys.readouterr().out
    # a note (1), the first table's frame and heads (4 + 2), its first two rows (2 cells each); nothing after
    assert "n1" in shown and "r1" in shown and "r2" not in shown and "second" not in shown and "f.png" not in shown
    assert "(23 more notes, cells or figures left out: --json prints them all)" in shown
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tables"] == tables


def test_shown_within_keeps_the_first_parts_in_order_and_counts_the_rest() -> None:
    from executor.documents import Figure, Shown, Table
    from executor.faces.views import TABLE_FRAME, shown_within

    wide = Table("wide", ["a"] * 10, [["1"] * 10])
    small = Table("small", ["a"], [["1"], ["2"]])
    shown = Shown("t", ["n"] * 3, [small, wide, small], [Figure("f", "f.png")])
    assert shown_within(shown, 10**6) == (shown, 0)
    head = TABLE_FRAME + 1
    cut, left_out = shown_within(shown, 3 + head + 1)
    assert (
        cut == Shown("t", ["n"] * 3, [Table("small", ["a"], [["1"]])], [])
        and left_out == 1 + (TABLE_FRAME + 20) + (head + 2) + 1
    )
    assert shown_within(shown, 2) == (
        Shown("t", ["n"] * 2, [], []),
        1 + (head + 2) + (TABLE_FRAME + 20) + (head + 2) + 1,
    )


def test_a_report_is_read_once_and_its_types_made_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a table costs its cells, not a type evaluation (typing reads this module's annotations from
    their text each time it is asked: 100 000 tables took 20 s), and `runbook report` reads report.json once."""
    from executor.faces import views

    calls = {"hints": 0, "read": 0}
    hints, read_shown = typing.get_type_hints, views.read_shown

    def counted(name: str, call: typing.Callable[..., typing.Any]) -> typing.Callable[..., typing.Any]:
        def count(*args: typing.Any) -> typing.Any:
            calls[name] += 1
            return call(*args)

        return count

    monkeypatch.setattr(typing, "get_type_hints", counted("hints", hints))
    monkeypatch.setattr(views, "read_shown", counted("read", read_shown))
    tables = [{"title": f"t{n}", "columns": ["a"], "rows": [["1"]]} for n in range(200)]
    write(tmp_path / "run", {"title": "t", "notes": [], "tables": tables, "figures": []})
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "t199" in capsys.readouterr().out
    assert calls["read"] == 1 and calls["hints"] <= 4  # once per kind of its parts, at most


def test_a_run_that_wrote_a_report_ends_saying_where_it_is_and_report_finds_it_by_its_run_id(tmp_path: Path) -> None:
    """`runbook run` ends with report.md's path, each figure's, and the `runbook report` command that shows it
    again (by its run id, with --log-dir as `status` takes it); `report` also takes an id's prefix, no id (the
    latest run) and a run folder, and refuses an id no run has as `status` does."""
    book = tmp_path / "campaign.yaml"
    book.write_text(
        "name: campaign\nhosts: {here: {address: local}}\nsteps:\n"
        "  - {id: bench_baseline, kind: shell, script: 'true'}\n"
        "  - {id: report, kind: campaign_report, baseline: bench_baseline,\n"
        "     gates: [{that: 'facts.counts.cells == 0'}]}\n"  # passes: a report written by a passed run
    )
    logs = tmp_path / "logs"
    ran = runbook_cli("run", str(book), "--log-dir", str(logs))
    assert ran.returncode == 0, ran.stderr
    [run_dir] = logs.iterdir()
    figures = [run_dir / figure["path"] for figure in json.loads((run_dir / "report.json").read_text())["figures"]]
    again = f"runbook report {run_dir.name} --log-dir {logs}"
    said = [f"report: {run_dir / 'report.md'}", *(f"figure: {figure}" for figure in figures), f"see it again: {again}"]
    assert ran.stderr.splitlines()[-len(said) :] == said and figures
    shown = runbook_cli("report", str(run_dir)).stdout
    assert "Campaign" in shown
    for argv in (again.split()[2:], [run_dir.name[:12], "--log-dir", str(logs)], ["--log-dir", str(logs)]):
        assert (runbook_cli("report", *argv).stdout, argv) == (shown, argv)
    in_logs = runbook_cli("report", run_dir.name, cwd=logs).stdout  # a folder of that name here: read as before
    assert in_logs == shown.replace(str(run_dir), run_dir.name)
    refused = runbook_cli("report", "20991231-nope", "--log-dir", str(logs))
    assert refused.returncode == 2 and refused.stderr == f"runbook: no run 20991231-nope in {logs}\n"
    for command in ("report", "status"):  # the runbook, as `run` takes it: not `no run campaign.yaml in logs`
        mistaken = runbook_cli(command, str(book), "--log-dir", str(logs))
        assert mistaken.returncode == 2, mistaken.stderr
        assert f"runbook: {book} is a runbook, not a run: give a run's id (runbook runs" in mistaken.stderr


def test_a_name_too_long_for_the_system_is_no_run_not_a_traceback(tmp_path: Path) -> None:
    """A run id, a run folder or a --log-dir longer than a file name may be (ENAMETOOLONG, which pathlib's
    is_dir and exists raise rather than answer False): `report` and `status` say there is no such run (exit 2)."""
    long = "a" * 300
    for argv in (
        ["report", long * 10, "--log-dir", str(tmp_path)],
        ["report", str(tmp_path / long / "run")],
        ["report", "--log-dir", str(tmp_path / long)],
        ["status", "--log-dir", str(tmp_path / long)],
    ):
        said = runbook_cli(*argv)
        assert said.returncode == 2 and said.stderr.startswith("runbook: ") and "Traceback" not in said.stderr, argv
        assert "no run" in said.stderr or "no report.json (not a run folder" in said.stderr, said.stderr


def test_the_end_of_a_run_never_points_at_a_report_file_that_was_not_written(tmp_path: Path) -> None:
    """A run stopped by a full disk after report.json (report.md and the figures are written after it): `runbook
    run`'s last lines (`results_lines`) said `report: .../report.md` and `figure: ...` for files that are not
    there. Now each one missing says so; those written are named as before."""
    from executor.faces.cli import LOG_DIR, results_lines

    run_dir = tmp_path / "run"
    figures = [{"title": "plot", "path": "speedup.png"}, {"title": "front", "path": "pareto.png"}]
    write(run_dir, {"title": "t", "tables": [], "figures": figures})
    (run_dir / "pareto.png").write_bytes(b"\x89PNG")
    lines = results_lines(run_dir, LOG_DIR)
    assert lines[:3] == [
        f"report: {run_dir / 'report.md'} (not written: the run stopped before it; runbook report shows report.json)",
        f"figure: {run_dir / 'speedup.png'} (not written)",
        f"figure: {run_dir / 'pareto.png'}",
    ]
    (run_dir / "report.md").write_text("# t\n")
    assert results_lines(run_dir, LOG_DIR)[0] == f"report: {run_dir / 'report.md'}"
