"""Issue 27, items 1 and 6: a secret reaches no file and no answer by a path around the redactor, and every
JSON answer is strict.

- A secret pasted into a matrix value (a scalar, a mapping's field or field name, a list's item) is refused
  by `validate`, `plan` and `run` alike (`executor.runbook.loader.secret_values`, the one place all of them read the
  secrets), naming where and never the value: a matrix value is written unmasked into cell ids, events,
  the campaign report and its figures, so no run may hold one.
- A local step gets a declared environment (PATH, HOME, LANG, then its vars and secrets), never the
  controller's: a token in the environment of the MCP server or CI job that runs `runbook` reaches no
  local step, so neither the audit log, `status`, `tail` nor an MCP answer can show it.
- A non-finite number (a host's `NaN` in its JSON facts) leaves as strict JSON from every answer: the
  `--json` events and events.jsonl, `status`/`runs`/`report`/`plan --json`, report.json, the MCP results.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor import strict_json
from executor.diagnostics import DEBUG_FILE
from executor.errors import InvalidRunbook
from executor.faces.cli import main
from executor.faces.views import REPORT_MAX_DEPTH
from executor.redact import MIN_SECRET_CHARS, Redactor
from executor.render import render_command
from executor.run.event_models import Progress
from executor.run.events import json_line
from executor.run.state import JSON_COLUMN_MAX_DEPTH
from executor.runbook.loader import load_runbook, secret_values
from executor.transport.local import LOCAL_ENV_NAMES, LocalTransport
from tests.executor.test_cli_report import write

# -- a secret as a matrix value ----------------------------------------------------------------------------

BOOK = """\
name: sweep
hosts:
  box: {{address: local}}
secrets:
  TOKEN: {{env: RB_MATRIX_TOKEN}}
steps:
  - group: g
    matrix:
      drafter:
        - {{name: zlab, repo: {repo}, dirs: [{first}, {second}]}}
      tokens: [{tokens}, 8]
    steps:
      - id: note
        kind: shell
        script: echo "$matrix_drafter_repo $matrix_tokens"
"""
PLAIN = {"repo": '"z-lab/Kimi"', "first": "a", "second": "b", "tokens": "4"}
#: A token none of the runbooks below holds, for the check that a runbook without the secret passes.
ABSENT = "hf_absentFromEveryRunbook0123"

#: Secrets of odd shape: quotes, backslashes, regex metacharacters, newlines, unicode (no surrogates:
#: an environment variable is UTF-8 text; of the BMP, whose escapes PyYAML reads), and ordinary words
#: (`password`, a substring of `passwords`).
odd_secrets = st.one_of(
    st.text(
        st.characters(max_codepoint=0xFFFF, exclude_categories=["Cs", "Cc"]) | st.sampled_from("\n\t"), max_size=40
    ),
    st.sampled_from(["password", "changeme1", ".*+?[](){}|^$\\", "a'b\"c\\nd%40"]),
).filter(lambda s: len(s.strip()) >= MIN_SECRET_CHARS)
#: A secret an axis value's text can be (`[A-Za-z0-9_.+-]+`), for a scalar value.
id_secrets = st.text("abcXYZ0189_.+-", min_size=MIN_SECRET_CHARS, max_size=30)


def quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar (JSON's escapes are YAML's)."""
    return json.dumps(text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    secret=odd_secrets,
    place=st.sampled_from(["repo", "first", "second"]),
    around=st.sampled_from(["{s}", "x/{s}", "{s}-y", "pre {s} post"]),
)
def test_a_secret_in_a_matrix_mapping_field_or_list_item_is_refused_naming_where_not_what(
    secret: str, place: str, around: str, tmp_path: Path
) -> None:
    """Before: only ids were checked, so a secret in a mapping's field (not in the cell id) was written as it
    is into report.json, report.md and the campaign figures. Refused now by validate, plan and run alike."""
    path = tmp_path / "sweep.yaml"
    path.write_text(BOOK.format(**PLAIN | {place: quoted(around.format(s=secret))}))
    runbook = load_runbook(path)
    assert secret_values(runbook, {"RB_MATRIX_TOKEN": ABSENT}) == {"TOKEN": ABSENT}
    for required in (True, False):  # run; validate and plan
        with pytest.raises(InvalidRunbook) as refused:
            secret_values(runbook, {"RB_MATRIX_TOKEN": secret}, required=required)
        (problem,) = refused.value.problems
        assert (problem.line, problem.column) == (9, 7), problem  # the matrix
        where = "field 'repo'" if place == "repo" else "field 'dirs'"
        assert "secret TOKEN: its value is in the matrix axis 'drafter' value" in problem.message
        assert where in problem.message or "matrix cell" in problem.message, problem.message
        assert Redactor([secret]).text(str(refused.value)) == str(refused.value)  # no form of it is shown


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=id_secrets)
def test_a_secret_as_a_scalar_axis_value_is_refused(secret: str, tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(BOOK.format(**PLAIN | {"tokens": quoted(secret)}))
    with pytest.raises(InvalidRunbook) as refused:
        secret_values(load_runbook(path), {"RB_MATRIX_TOKEN": secret})
    assert "secret TOKEN: its value is in the step id 'note[drafter=zlab,tokens=***]'" in str(refused.value)
    assert secret not in str(refused.value)


def test_a_secret_as_a_field_name_is_refused(tmp_path: Path) -> None:
    secret = "fieldNameToken01"
    path = tmp_path / "sweep.yaml"
    path.write_text(BOOK.format(**PLAIN).replace("repo:", f"{secret}: x, repo:"))
    with pytest.raises(InvalidRunbook) as refused:
        secret_values(load_runbook(path), {"RB_MATRIX_TOKEN": secret})
    assert "matrix axis 'drafter' value 'zlab', a field name '***'" in str(refused.value)


NAMES_BOOK = """\
name: {name}
hosts: {{{host}: {{address: local}}}}
pools: {{{pool}: [{host}]}}
vars: {{{var}: plain}}
secrets: {{{secret}: {{env: RB_NAME_TOKEN}}}}
steps:
  - {{id: note, kind: shell, script: 'true'}}
"""
NAMES_PLAIN = {"name": "names", "host": "box", "pool": "gpus", "var": "greeting", "secret": "TOKEN"}
#: Where each name is (line, column) in NAMES_BOOK, and what the refusal calls it.
NAME_PLACES = {
    "name": ((1, 7), "runbook name"),
    "host": ((2, 9), "host name"),
    "pool": ((3, 9), "pool name"),
    "var": ((4, 8), "var name"),
    "secret": ((5, 11), "secret name"),
}
#: A secret a name can hold (letters, digits, `_`: every kind of name allows these).
name_secrets = st.text("abcXYZ0189_", min_size=MIN_SECRET_CHARS, max_size=20).filter(lambda s: not s[0].isdigit())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=name_secrets, place=st.sampled_from(sorted(NAME_PLACES)), around=st.sampled_from(["{s}", "x{s}_y"]))
def test_a_secret_in_the_runbooks_name_or_a_host_pool_var_or_secret_name_is_refused(
    secret: str, place: str, around: str, tmp_path: Path
) -> None:
    """Before: only ids and matrix values were checked, so a runbook name or host name pasted from the secret was
    written as it is into run.json and state.db and shown by `runs --json` and `status --json` (names are
    stored unmasked, as ids are)."""
    path = tmp_path / "names.yaml"
    path.write_text(NAMES_BOOK.format(**NAMES_PLAIN | {place: around.format(s=secret)}))
    runbook = load_runbook(path)
    env = "RB_NAME_TOKEN"
    assert secret_values(runbook, {env: ABSENT}) == {"TOKEN" if place != "secret" else around.format(s=secret): ABSENT}
    with pytest.raises(InvalidRunbook) as refused:
        secret_values(runbook, {env: secret})
    (problem,) = refused.value.problems
    where, what = NAME_PLACES[place]
    assert (problem.line, problem.column) == where, problem
    assert f"its value is in the {what} '" in problem.message, problem.message
    assert secret not in str(refused.value)


# -- a local step's environment ----------------------------------------------------------------------------

CONTROLLER_TOKEN = "hf_controllerOnlyToken0123456789"
#: What bash and the wrapper set themselves, besides LOCAL_ENV_NAMES and the step's exports.
BASH_OWN = {"PWD", "OLDPWD", "SHLVL", "_", "DEBIAN_FRONTEND", "SUDO_ASKPASS"}


def test_a_local_step_starts_from_path_home_and_lang_and_its_exports_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the wrapper inherited os.environ whole (PYTHONPATH, AWS keys, the MCP server's HF_TOKEN)."""
    monkeypatch.setenv("HF_TOKEN", CONTROLLER_TOKEN)
    monkeypatch.setenv("LANG", "C.UTF-8")
    command = render_command("env -0", {"greeting": "hi"}, {"TOKEN": "declaredSecret01"})
    result = asyncio.run(LocalTransport("here").run(command, 30))
    assert result.exit_code == 0, result.stderr
    names = {entry.partition("=")[0] for entry in result.stdout.decode().split("\0") if entry}
    assert names - BASH_OWN == {*LOCAL_ENV_NAMES, "greeting", "TOKEN"}, names
    environment = dict(entry.partition("=")[::2] for entry in result.stdout.decode().split("\0") if entry)
    assert environment["PATH"] == os.environ["PATH"] and environment["LANG"] == "C.UTF-8"


def test_the_controllers_token_reaches_no_file_status_or_tail_of_a_local_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The MCP server's HF_TOKEN, not declared by the runbook: a local step that prints its environment (or
    names the variable) shows nothing of it, so no run file, `status --json` or tail holds it."""
    monkeypatch.setenv("HF_TOKEN", CONTROLLER_TOKEN)
    book = tmp_path / "local.yaml"
    book.write_text(
        "name: local\nhosts: {here: {address: local}}\nsteps:\n"
        "  - {id: leak, kind: shell, script: 'env; echo \"token=$HF_TOKEN\"'}\n"
    )
    logs = tmp_path / "logs"
    assert main(["run", str(book), "--log-dir", str(logs), "--json"]) == 0
    assert main(["status", "--log-dir", str(logs), "--json"]) == 0
    shown = capsys.readouterr()
    (run_dir,) = logs.iterdir()
    from executor.faces.mcp_server import step_tail  # the MCP `tail` answer, as its tool gives it

    answer = step_tail(run_dir, "leak", None, 200)
    assert answer["stdout"].endswith("\ntoken="), answer  # the step ran and printed the variable: empty
    tail = json.dumps(answer)
    for text in (shown.out, shown.err, tail, *(f.read_text(errors="replace") for f in run_dir.iterdir())):
        assert CONTROLLER_TOKEN not in text


# -- strict JSON -------------------------------------------------------------------------------------------

NON_FINITE = [math.nan, math.inf, -math.inf]


def strict_load(text: str) -> Any:
    """`text` read as a strict reader reads it: a bare NaN or Infinity is an error."""

    def refuse(word: str) -> Any:
        raise ValueError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(data=json_data)
def test_any_data_leaves_as_strict_json_with_non_finite_numbers_named(data: Any) -> None:
    text = strict_json.dumps(data)
    again = strict_load(text)
    assert strict_load(strict_json.dumps(again)) == again  # a fixed point: nothing is lost twice
    line = strict_load(json_line(Progress(run_id="r", seq=1, time=0.0, message="m", fields={"x": data})))
    assert line["fields"]["x"] == again


def test_non_finite_names_are_decided_once() -> None:
    assert strict_load(strict_json.dumps(NON_FINITE)) == ["NaN", "Infinity", "-Infinity"]


def test_a_float_subclass_with_its_own_repr_is_named_too() -> None:
    """Before: a KeyError, as the name was looked up by the value's repr (numpy 2's `np.float64(nan)`)."""

    class Float64(float):
        def __repr__(self) -> str:
            return f"np.float64({float(self)!r})"

    assert strict_load(strict_json.dumps([Float64(v) for v in NON_FINITE])) == ["NaN", "Infinity", "-Infinity"]


def test_a_hosts_nan_facts_leave_every_answer_as_strict_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `{"tps": NaN}` printed by a host became facts that `status --json`, the events and the MCP
    `status` answer wrote back as bare NaN, which JSON.parse, jq and Go refuse."""
    book = tmp_path / "nan.yaml"
    printed = '{"tps": NaN, "deep": [{"up": Infinity, "down": -Infinity}]}'
    book.write_text(
        "name: nan\nhosts: {here: {address: local}}\nsteps:\n"
        f"  - {{id: measure, kind: shell, parse: json, script: {json.dumps('echo ' + repr(printed))}}}\n"
    )
    logs = tmp_path / "logs"
    assert main(["run", str(book), "--log-dir", str(logs), "--json"]) == 0
    (run_dir,) = logs.iterdir()
    answers = [capsys.readouterr().out.splitlines(), (run_dir / "events.jsonl").read_text().splitlines()]
    answers.append((run_dir / DEBUG_FILE).read_text().splitlines())
    for command in (["status", "--log-dir", str(logs), "--json"], ["runs", "--log-dir", str(logs), "--json"]):
        assert main(command) == 0
        answers.append([capsys.readouterr().out])
    assert main(["plan", str(book), "--json"]) == 0
    answers.append([capsys.readouterr().out])
    write(run_dir, {"title": "t", "tables": [{"title": "x", "columns": ["a"], "rows": [[math.nan]]}], "figures": []})
    assert main(["report", str(run_dir), "--json"]) == 0
    answers.append([capsys.readouterr().out])
    for lines in answers:
        for line in lines:
            strict_load(line)
    status = strict_load(answers[3][0])
    assert status["steps"][0]["facts"] == {"tps": "NaN", "deep": [{"up": "Infinity", "down": "-Infinity"}]}


def test_every_mcp_result_is_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one place MCP answers leave (`mcp_server.answer`): a NaN in stored facts or a report's table."""
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    from tests.executor.test_mcp_server import in_process

    book = tmp_path / "nan.yaml"
    book.write_text(
        "name: nan\nhosts: {here: {address: local}}\nsteps:\n"
        '  - {id: measure, kind: shell, parse: json, script: "echo \'{\\"tps\\": NaN}\'"}\n'
    )
    logs = tmp_path / "logs"
    assert main(["run", str(book), "--log-dir", str(logs)]) == 0
    capsys.readouterr()
    (run_dir,) = logs.iterdir()
    write(run_dir, {"title": "t", "tables": [{"title": "x", "columns": ["a"], "rows": [[math.inf]]}], "figures": []})
    where = {"log_dir": str(logs)}
    results = [
        in_process("status", tmp_path, **where),
        in_process("events", tmp_path, run_id=run_dir.name, **where),
        in_process("runs", tmp_path, **where),
        in_process("report", tmp_path, run_dir=str(run_dir)),
        in_process("plan", tmp_path, file=str(book)),
        in_process("report", tmp_path, run_dir=str(run_dir), section="x"),  # the table, asked for by its title
    ]
    for result in results:
        json.dumps(result, allow_nan=False)
    assert results[0]["steps"][0]["facts"] == {"tps": "NaN"}
    assert results[5]["rows"] == [["inf"]]  # a cell as the typed table (and `runbook report`) shows it


@pytest.mark.parametrize("depth", [JSON_COLUMN_MAX_DEPTH + 1, 900, 100_000])
def test_run_files_nested_past_their_bound_are_refused_not_a_recursion_error(
    depth: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: facts in state.db or a report.json nested 900 deep (json.loads reads them) ended `status`
    (dataclasses.asdict), `status --json` and `report --json` (strict_json.strict) in a RecursionError traceback,
    100 000 deep (past json.loads) too. Now each says which file and why, exit 2."""
    import sqlite3

    from executor.stepkind import FACTS_MAX_DEPTH

    assert JSON_COLUMN_MAX_DEPTH == FACTS_MAX_DEPTH  # what a run stores is what it reads back
    book = tmp_path / "deep.yaml"
    book.write_text("name: deep\nhosts: {here: {address: local}}\nsteps:\n  - {id: s, kind: shell, script: 'true'}\n")
    logs = tmp_path / "logs"
    assert main(["run", str(book), "--log-dir", str(logs)]) == 0
    (run_dir,) = logs.iterdir()
    nested = "[" * depth + "]" * depth
    with contextlib.closing(sqlite3.connect(run_dir / "state.db")) as db, db:
        db.execute("UPDATE steps SET facts = ?", (nested,))
    write(run_dir, {"title": "t", "tables": [], "figures": [], "deep": []})
    (run_dir / "report.json").write_text(
        (run_dir / "report.json").read_text().replace('"deep": []', f'"deep": {nested}')
    )
    capsys.readouterr()
    for command in (["status", "--log-dir", str(logs)], ["status", "--log-dir", str(logs), "--json"]):
        assert main(command) == 2
        err = capsys.readouterr().err  # counted before json.loads, whose RecursionError would be past its own depth
        assert f"field 'facts': nested deeper than {JSON_COLUMN_MAX_DEPTH} levels" in err, err
    if depth <= REPORT_MAX_DEPTH:
        return  # a report that deep is one a step may write
    assert main(["report", str(run_dir), "--json"]) == 2
    assert "report.json: not a report" in capsys.readouterr().err


# -- a secret of any shape through every writer and answer -------------------------------------------------

#: Secrets from characters the run's own files never hold in a row of 8 (no hex digit, no lowercase word, no
#: timestamp): quotes, a backslash, regex metacharacters, whitespace and newlines, unicode, a `%` and `@`.
writer_secrets = st.text(
    st.sampled_from("GHJKLMNPRSTVWXYZ'\"\\$^*+?()[]|@%é€中\u00a0 \n\t"), min_size=MIN_SECRET_CHARS, max_size=40
).filter(lambda s: len(s.strip()) >= MIN_SECRET_CHARS and len(s.replace("\n", "").strip()) >= MIN_SECRET_CHARS)

WRITERS_BOOK = """\
name: writers
hosts: {here: {address: local}}
secrets: {TOKEN: {env: RB_WRITERS_TOKEN}}
steps:
  - id: say
    kind: shell
    script: |
      printf 'out %s\\n' "$TOKEN"; printf 'err %s' "$TOKEN" >&2
    gates:
      - that: "stdout == ''"
        message: "saw {{ stdout }}"
"""


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=writer_secrets)
def test_a_secret_of_any_shape_is_in_no_run_file_and_no_json_or_mcp_answer(
    secret: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step prints the secret to both streams and fails a gate that quotes its stdout: the console,
    `--json` lines, every file of the run (state.db, audit, events, debug log, run.json), `status`/`runs
    --json` and the MCP `events`, `tail` and `status` answers hold no form of it."""
    from executor.faces import views
    from executor.faces.mcp_server import read_events, step_tail

    monkeypatch.setenv("RB_WRITERS_TOKEN", secret)
    root = tmp_path_factory.mktemp("writers")
    book, logs = root / "writers.yaml", root / "logs"
    book.write_text(WRITERS_BOOK)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["run", str(book), "--log-dir", str(logs), "--json"]) == 1
        assert main(["status", "--log-dir", str(logs), "--json"]) == 0
        assert main(["runs", "--log-dir", str(logs), "--json"]) == 0
    (run_dir,) = logs.iterdir()
    answers = [out.getvalue(), err.getvalue()]
    answers += [json.dumps(views.status(logs, None)), json.dumps(read_events(run_dir, 0, 500))]
    answers += [json.dumps(step_tail(run_dir, "say", None, 200), ensure_ascii=False)]
    answers += [f.read_bytes().decode("utf-8", "replace") for f in run_dir.iterdir() if f.is_file()]
    assert "out ***" in answers[0] and "err ***" in json.dumps(step_tail(run_dir, "say", None, 200))
    redactor = Redactor([secret])
    for text in answers:
        assert redactor.text(text) == text, text


@pytest.fixture
def mcp_tool() -> Any:
    """The MCP server's tools called in this process (`in_process`), imported before a property test draws
    (the module holds @given tests of its own, which Hypothesis refuses to define inside one)."""
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    from tests.executor.test_mcp_server import in_process

    return in_process


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=writer_secrets, var=st.sampled_from(["url", "port", "nope"]))
def test_a_secret_of_any_shape_is_in_no_plan_or_validate_answer(
    secret: str, var: str, mcp_tool: Any, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answers the writers test does not reach: `plan --json`, `plan --full` and the MCP `plan` and
    `validate` given a `--var` pasted from the secret (a var of the runbook, a number, an unknown name)."""
    monkeypatch.setenv("RB_WRITERS_TOKEN", secret)
    root = tmp_path_factory.mktemp("answers")
    book = root / "plan.yaml"
    book.write_text(WRITERS_BOOK.replace("steps:", "vars: {url: 'http://h', port: 8000}\nsteps:", 1))
    pasted = f"https://u:{secret}@h/"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for shape in ("--json", "--full"):
            main(["plan", str(book), shape, "--var", f"{var}={pasted}"])
    answers = [out.getvalue(), err.getvalue()]
    answers += [json.dumps(mcp_tool(tool, root, file=str(book), vars={var: pasted})) for tool in ("plan", "validate")]
    redactor = Redactor([secret])
    for text in answers:
        assert redactor.text(text) == text, text


# -- the reports: what the runbook wrote (a label, a title, a cell value) masked where a report leaves --------

REPORT_SECRET = "hf_Zq9-pasted.+Secret7é"


@pytest.fixture
def drawn_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every figure saved from now on, also as SVG with its texts as text (`svg.fonttype: none`): what the
    PNG shows, readable."""
    import matplotlib
    from matplotlib.figure import Figure as MplFigure

    drawn: list[str] = []
    original = MplFigure.savefig

    def also_as_svg(self: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        original(self, target, *args, **kwargs)
        svg = io.StringIO()
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            original(self, svg, format="svg")
        drawn.append(svg.getvalue())

    monkeypatch.setattr(MplFigure, "savefig", also_as_svg)
    return drawn


def assert_masked(run_dir: Path, drawn: list[str]) -> None:
    """The secret is in neither file nor any figure's text; its mask is, as each writes it (report.md escapes
    Markdown: `md_text`)."""
    from steps.benchmark_report import md_text

    report_json, report_md = ((run_dir / name).read_text() for name in ("report.json", "report.md"))
    assert drawn and all(REPORT_SECRET not in text for text in [report_json, report_md, *drawn])
    assert "***" in report_json and md_text("***") in report_md and any("***" in svg for svg in drawn)


def test_a_benchmark_label_holding_a_secret_is_masked_in_report_json_md_and_figures(
    tmp_path: Path, drawn_texts: list[str]
) -> None:
    """Before: a `label:` pasted from a secret was written as it is into report.json, report.md and the
    legends and titles of speedup.png and pareto.png (a report is the step's own file, not the engine's)."""
    from steps.benchmark_figures import write_report
    from tests.steps.test_benchmark_report import ACCEPTANCE, BASELINE, DFLASH, PROVENANCE

    candidate = DFLASH.model_copy(update={"label": f"dflash {REPORT_SECRET}"})
    write_report(tmp_path, BASELINE, candidate, PROVENANCE, ACCEPTANCE, redactor=Redactor([REPORT_SECRET]))
    assert_masked(tmp_path, drawn_texts)


def test_a_campaign_title_and_cell_value_holding_a_secret_are_masked_in_its_report_and_figures(
    tmp_path: Path, drawn_texts: list[str]
) -> None:
    """The campaign report through its step, as the engine gives it `ctx.redactor`: the loader refuses a
    secret in a matrix value, and should one come another way (a title, a host's views), the writer masks it."""
    import dataclasses

    from steps.campaign_report import CampaignReportStep
    from tests.steps.test_campaign_report import StepsBeforeDouble, host_views

    pasted = [
        dataclasses.replace(
            v,
            step=v.step.replace("drafter=zlab", f"drafter={REPORT_SECRET}"),
            cell={k: REPORT_SECRET if x == "zlab" else x for k, x in v.cell.items()},
        )
        for v in host_views()
    ]
    params = {"id": "report", "kind": "campaign_report", "baseline": "bench_baseline", "title": REPORT_SECRET}
    context = StepsBeforeDouble(pasted, tmp_path)
    context.redactor = Redactor([REPORT_SECRET])
    outcome = asyncio.run(CampaignReportStep.model_validate(params).execute(context))
    assert outcome.result.exit_code == 0
    assert_masked(tmp_path, drawn_texts)
