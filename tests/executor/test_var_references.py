"""A `$name` that nothing defines: an error at `validate` in a step's parameter or a gate (FILE:LINE:COL, with
did-you-mean), a warning in a script; and no runbook of the repo has either (README, "A `$name` is checked")."""

from __future__ import annotations

import re
import signal
import string
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from executor.errors import InvalidRunbook
from executor.runbook.loader import parse_runbook
from executor.runbook.references import unknown_in_script
from tests.clirun import runbook_cli

REPO = Path(__file__).resolve().parents[2]
#: Every runbook file of the repo (an inventory has no `steps:`), each with the inventories it is used with.
RUNBOOK_FILES = sorted(
    path
    for folder in ("runbooks", "docs", "examples", "tests")
    for path in (REPO / folder).rglob("*.y*ml")
    if re.search(r"^steps:", path.read_text(encoding="utf-8"), re.MULTILINE)
)
#: The flagship's sites: the inventories laid over it.
SITES = sorted((REPO / "runbooks" / "sites").glob("*.yaml"))
FLAGSHIP = REPO / "runbooks" / "k26_dflash.yaml"
#: Whole runbooks written in the documentation (a block starting at `name:`).
DOC_BLOCKS = [
    (doc, block)
    for doc in (REPO / "README.md", REPO / "docs" / "agents.md")
    for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL)
    if block.startswith("name:") and "\nsteps:" in block
]

HEADER = """\
name: refs
hosts: {box: {address: local}}
vars:
  models_dir: /srv/models
  sglang_port: 30000
secrets:
  HF_TOKEN: {env: RUNBOOK_TEST_REFS_TOKEN, required: false}
steps:
"""


def validate(tmp_path: Path, text: str, *args: str) -> tuple[int, list[str]]:
    book = tmp_path / "refs.yaml"
    book.write_text(text, encoding="utf-8")
    done = runbook_cli("validate", str(book), *args)
    return done.returncode, [line.replace(str(book), "F") for line in done.stderr.splitlines()]


@pytest.mark.parametrize("runbook", RUNBOOK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_runbook_of_the_repo_validates_without_a_problem_or_warning(runbook: Path) -> None:
    for inventory in [[], *(["--inventory", str(site)] for site in SITES if runbook == FLAGSHIP)]:
        done = runbook_cli("validate", str(runbook), *inventory)
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr


@pytest.mark.parametrize("block", [block for _, block in DOC_BLOCKS], ids=[f"{doc.name}" for doc, _ in DOC_BLOCKS])
def test_the_runbooks_of_the_documentation_name_only_what_they_define(block: str) -> None:
    """README's first example is a sketch (its host var is not declared): only the references are checked here."""
    try:
        runbook = parse_runbook(block, Path("doc.yaml"))
    except InvalidRunbook as exc:
        said = [str(problem) for problem in exc.problems]
        assert not [line for line in said if re.search(r"\$\w+ is not a var|: vars\.\w+ is not a var", line)], said
    else:
        assert runbook.warnings == []


def test_a_typo_in_a_parameter_is_refused_at_its_column_with_the_name_it_may_mean(tmp_path: Path) -> None:
    text = HEADER + (
        "  - id: dl\n"
        "    kind: download\n"
        "    repo: org/model\n"
        "    local_dir: $modles_dir/Kimi\n"
        '    python: "${models_dir}/venv/bin/python $HOME"\n'
        "    hf_cli: ${models_dir}/hf/${sglang_prot:-x}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        "F:12:16: step 'dl': local_dir: $modles_dir is not a var or secret of the runbook (declare it under `vars:`);"
        " did you mean 'models_dir'?",
        "F:14:30: step 'dl': hf_cli: $sglang_prot is not a var or secret of the runbook (declare it under `vars:`);"
        " did you mean 'sglang_port'?",
    ]


def test_a_typo_in_a_gate_or_when_is_refused_and_a_secret_or_axis_is_defined(tmp_path: Path) -> None:
    text = HEADER + (
        "  - id: probe\n"
        "    kind: probe\n"
        "    python: $HF_TOKEN\n"
        "    when: vars.sglang_prot > 1\n"
        "    gates: ['vars.models_dir and vars.modelsdir']\n"
        "  - group: g\n"
        "    matrix: {tokens: [4, 8]}\n"
        "    steps:\n"
        "      - {id: show, kind: shell, script: 'echo $matrix_tokens $matrix_tokenz'}\n"
        "      - {id: serve, kind: probe, python: $matrix_tokens,\n"
        "         models_dir: '/m/${{ matrix.tokens }}/$matrix_tokenz'}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        "F:12:11: step 'probe': when: vars.sglang_prot is not a var of the runbook; did you mean 'sglang_port'?",
        "F:13:13: step 'probe': gates[0]: vars.modelsdir is not a var of the runbook; did you mean 'models_dir'?",
        "F:19:47: step 'serve': models_dir: $matrix_tokenz is not a var or secret of the runbook (declare it under "
        "`vars:`); did you mean 'matrix_tokens'?",
    ]


def test_plan_and_run_stop_at_the_typo_before_any_step_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    text = (
        HEADER
        + f"  - {{id: first, kind: shell, script: 'touch {ran}'}}\n"
        + ("  - {id: second, kind: probe, models_dir: $model_dir}\n")
    )
    book = tmp_path / "refs.yaml"
    book.write_text(text, encoding="utf-8")
    for command in (["plan"], ["run", "--log-dir", str(tmp_path / "logs")]):
        done = runbook_cli(*command, str(book))
        assert done.returncode == 2, done.stderr
        assert f"{book}:10:43: step 'second': models_dir: $model_dir is not a var" in done.stderr
    assert not ran.exists() and not (tmp_path / "logs").exists()


def test_a_scripts_unknown_name_is_a_warning_at_its_line_and_column(tmp_path: Path) -> None:
    text = HEADER + (
        "  - id: serve\n"
        "    kind: shell\n"
        "    script: |\n"
        "      port=$sglang_port; read -r pid < /tmp/pid\n"
        '      for f in "$models_dir"/*; do echo "$f $pid $port $PPID $RANDOM $1 $@ $HF_TOKEN"; done\n'
        "      echo '$not_expanded' \\$nor_this  # $nor_in_a_comment\n"
        '      curl "localhost:$sglang_prot/health"\n'
        "      python3 - <<'EOF'\n"
        "      print('$quoted_heredoc')\n"
        "      EOF\n"
        "      cat <<EOF\n"
        "      $unquoted_heredoc\n"
        "      EOF\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 0
    assert lines[:2] == [
        "F:15:23: warning: step 'serve': script: $sglang_prot is neither a var or secret of the runbook nor set in "
        "the script; did you mean 'sglang_port'?",
        "F:20:7: warning: step 'serve': script: $unquoted_heredoc is neither a var or secret of the runbook nor set "
        "in the script",
    ]
    assert lines[2].startswith("F: ok (1 steps")


def test_a_script_ending_in_a_comment_sign_validates(tmp_path: Path) -> None:
    """`echo $HOME #`, the script's last character a `#` that opens a comment: the scanner stood on it for ever
    (validate, plan and run never returned). An alarm ends the test instead of the suite hanging."""

    def too_long(signum: int, frame: object) -> None:
        raise TimeoutError("validate did not return in 10 s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(10)
    try:
        code, lines = validate(tmp_path, HEADER + '  - {id: s, kind: shell, script: "echo $HOME $nope #"}\n')
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert code == 0 and "$nope is neither" in lines[0], lines


def test_an_escaped_quote_in_ansi_c_or_a_shift_in_arithmetic_quotes_nothing_after_it(tmp_path: Path) -> None:
    """`$'don\\'t'` ends at its last quote (bash's escape), and `$((1 << n))` shifts, opening no heredoc: the
    scanner ended the first at `\\'` and read the rest of the script as a heredoc's body after the second, so
    every later single-quoted `'$name'` was warned of; a `$name` inside the arithmetic still is."""
    text = HEADER + "  - id: quotes\n    kind: shell\n    script: |\n"
    text += "      echo $'don\\'t' '$in_single_quotes'\n"
    text += "      n=2; echo $((1 << n)) $((1 << $shift_undefined)) '$after_the_shift'\n"
    assert validate(tmp_path, text)[1][:2] == [
        "F:13:37: warning: step 'quotes': script: $shift_undefined is neither a var or secret of the runbook nor "
        "set in the script",
        "F: ok (1 steps, 1 step-host pairs)",
    ]


def test_twenty_thousand_unknown_names_are_reported_up_to_the_limit_in_a_moment(tmp_path: Path) -> None:
    """Where each unknown name is written was found from the text's start, for every one of them: 20 000 in a
    parameter, and as many in a script, took a minute and a half to say the first 100 of each."""
    text = HEADER + "  - id: many\n    kind: shell\n    script: |\n" + "      echo $nope\n" * 20_000
    text += "  - {id: probe, kind: probe, models_dir: /m, paths: [], python: '" + "/$nope" * 20_000 + "'}\n"
    started = time.monotonic()
    code, lines = validate(tmp_path, text)
    assert time.monotonic() - started < 10, "quadratic again: this took 90 s before"
    assert code == 2 and lines[0].startswith("F:20012:67: step 'probe': python: $nope is not a var"), lines[:3]
    assert lines[-1] == "F:20012:667: more problems from here on; only the first 100 are reported (the limit)"
    warned = validate(tmp_path, text.rpartition("  - {id: probe")[0])[1]
    assert warned[0].startswith("F:12:12: warning: step 'many': script: $nope is neither"), warned[:2]
    assert warned[100] == "F:112:12: warning: more warnings from here on; only the first 100 are shown (the limit)"


def test_a_long_word_or_many_open_subscripts_in_a_script_validate_in_linear_time(tmp_path: Path) -> None:
    """A script's assignments were found by a pattern that tried every offset of a word as a name (`NAME++`)
    and every `NAME[` to the end of its line: a 100 KB word (a hex blob pasted into an `echo`) took minutes, as
    did a line of open subscripts. Each is read once now; both still warn of the undefined name after them."""
    blob, subscripts = "f" + "0a" * 50_000, "x[" * 50_000
    text = HEADER + "  - id: blob\n    kind: shell\n    script: |\n"
    text += f"      echo {blob} '{subscripts}'\n      echo $undefined_after\n"
    started = time.monotonic()
    code, lines = validate(tmp_path, text)
    assert time.monotonic() - started < 10, "quadratic again: this took 3 minutes before"
    assert code == 0 and "$undefined_after is neither" in lines[0], lines


def test_the_mcp_validate_answers_warnings_and_problems(tmp_path: Path) -> None:
    from tests.executor.test_mcp_server import in_process  # the SDK is an optional extra

    book = tmp_path / "refs.yaml"
    book.write_text(HEADER + "  - {id: a, kind: shell, script: 'echo $model_dir'}\n", encoding="utf-8")
    answer = in_process("validate", tmp_path, file=str(book))
    message = "warning: step 'a': script: $model_dir is neither a var or secret of the runbook nor set in the script"
    assert {key: answer[key] for key in ("ok", "steps", "problems", "warnings")} == {
        "ok": True,
        "steps": 1,
        "problems": [],
        "warnings": [{"file": str(book), "line": 9, "column": 40, "message": f"{message}; did you mean 'models_dir'?"}],
    }
    book.write_text(HEADER + "  - {id: a, kind: probe, python: $model_dir}\n", encoding="utf-8")
    answer = in_process("validate", tmp_path, file=str(book))
    assert answer["ok"] is False and answer["exit_code"] == 2
    assert [(p["line"], p["column"]) for p in answer["problems"]] == [(9, 34)]
    assert "did you mean 'models_dir'?" in answer["problems"][0]["message"]


# ---- properties --------------------------------------------------------------------------------------------

#: Names no environment variable has (the environment's are upper case, or `_`).
names = st.text(string.ascii_lowercase, min_size=5, max_size=12)


def _book(variables: list[str], parameter: str, script: str) -> str:
    declared = "".join(f"  {name}: x\n" for name in variables)
    return (
        f"name: p\nhosts: {{box: {{address: local}}}}\nvars:\n{declared}steps:\n"
        f"  - {{id: p, kind: probe, models_dir: '{parameter}'}}\n"
        f"  - {{id: s, kind: shell, script: '{script}'}}\n"
    )


#: The forms of a reference bash expands, each of a name.
FORMS = ("${}", "${{{}}}", "${{{}:-x}}", "${{#{}}}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variables=st.lists(names, min_size=1, max_size=6, unique=True), data=st.data())
def test_a_defined_name_is_never_flagged(variables: list[str], data: st.DataObject) -> None:
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(variables), st.sampled_from(FORMS)), min_size=1, max_size=4))
    refs = [form.format(name) for name, form in pairs]
    runbook = parse_runbook(_book(variables, "/".join(refs), " ".join(refs)), Path("p.yaml"))
    assert runbook.warnings == []


def _one_edit(name: str, draw: st.DataObject) -> str:
    where = draw.draw(st.integers(0, len(name) - 1))
    letter = draw.draw(st.sampled_from(string.ascii_lowercase))
    edit = draw.draw(st.sampled_from(["swap", "insert", "delete"]))
    if edit == "swap":
        return name[:where] + letter + name[where + 1 :]
    if edit == "insert":
        return name[:where] + letter + name[where:]
    return name[:where] + name[where + 1 :]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names, data=st.data())
def test_a_one_edit_typo_is_flagged_with_the_name_it_is_a_typo_of(name: str, data: st.DataObject) -> None:
    typo = _one_edit(name, data)
    assume(typo != name)
    text = _book([name], f"${typo}/models", "true")
    with pytest.raises(InvalidRunbook) as caught:
        parse_runbook(text, Path("p.yaml"))
    (problem,) = caught.value.problems
    assert (problem.line, problem.column) == (6, 39)
    assert f"${typo} is not a var or secret" in problem.message and f"did you mean '{name}'?" in problem.message
    warned = parse_runbook(_book([name], f"${name}", f"echo ${typo}"), Path("p.yaml")).warnings
    assert [w.message.endswith(f"did you mean '{name}'?") for w in warned] == [True]


@given(name=names, value=st.text(string.ascii_letters + " ", max_size=10))
def test_a_name_the_script_sets_or_quotes_is_never_warned_of(name: str, value: str) -> None:
    setters = [f"{name}=x", f"read -r {name}", f"for {name} in a b; do :; done", f"local {name}", f"export {name}"]
    for setter in setters:
        assert unknown_in_script(f'{setter}\necho "${name}" ${{{name}:-{value}}}\n', ()) == []
    assert unknown_in_script(f"echo '${name}' \\${name} # ${name}\n", ()) == []
    assert unknown_in_script(f'echo "${name}"\n', ()) == [(6, name)]
