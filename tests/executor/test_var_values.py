"""`--var K=V`: V is the exact text after the first `=`, never re-read as YAML, in the script's
environment, in run.json and through `--resume`; typed only where the runbook's value is a number or a
boolean, and then only when V is one in the form the steps get back."""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from tests.clirun import runbook_cli

LOCAL = """\
name: typed
hosts:
  box: {address: local}
vars:
  v: text
  port: 30000
  ratio: 1.5
  flag: true
  out: /dev/null
steps:
  - id: a
    kind: shell
    script: printf '%s|%s|%s|%s' "$v" "$port" "$ratio" "$flag" > "$out"
    gates: ["vars.port > 30000 and vars.ratio > 1.5 and not vars.flag"]
"""
#: what YAML 1.1 turned them into: 83, 1.1, 750, true, 'fix', a space for the newline, a parse error...
TEXTS = ["0123", "1.10", "12:30", "yes", "fix #42", "a\nb", "", "~", "[a", "*a", "{x: 1}", "x=y", " lead", "end\n"]


@pytest.fixture
def local_book(tmp_path: Path) -> Path:
    path = tmp_path / "typed.yaml"
    path.write_text(LOCAL)
    return path


@pytest.mark.parametrize("text", TEXTS, ids=repr)
def test_a_var_is_the_exact_text_given(local_book: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    assert main(["plan", "--full", str(local_book), "--var", f"v={text}"]) == 0
    assert f"\nexport v={shlex.quote(text)}\n" in capsys.readouterr().out


def test_a_nul_is_refused(local_book: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(local_book), "--var", "v=a\x00b"]) == 2
    assert capsys.readouterr().err == "--var:1:1: v: the value contains a NUL byte, which no environment can carry\n"


def test_an_argument_that_is_no_utf8_text_is_refused(local_book: Path) -> None:
    done = runbook_cli("plan", str(local_book), "--var", "v=\udcff")  # the argument's byte 0xff
    assert (done.returncode, done.stderr) == (2, "--var:1:1: v: the value is not UTF-8 text\n")


def test_a_number_or_boolean_var_takes_the_text_typed_and_the_gate_compares_it(
    local_book: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    given = ["v=0123", "port=30001", "ratio=2", "flag=false", f"out={out}"]
    code = main(["run", str(local_book), "--log-dir", str(tmp_path / "logs"), *(f"--var={p}" for p in given)])
    assert code == 0, capsys.readouterr().err
    assert out.read_text() == "0123|30001|2|false"


NUMBER_RULE = "give one as the steps get it back"


@pytest.mark.parametrize(
    ("pair", "expected"),
    [
        ("port=030001", f"port=030001: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("port=+30001", f"port=+30001: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("port=30_001", f"port=30_001: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("port=3e4", f"port=3e4: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("port= 30001", f"port= 30001: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("port=٣٠٠٠١", f"port=٣٠٠٠١: port is a number in the runbook (30000); {NUMBER_RULE}"),  # int() reads it
        ("port=abc", f"port=abc: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("port=", f"port=: port is a number in the runbook (30000); {NUMBER_RULE}"),
        ("ratio=2.50", f"ratio=2.50: ratio is a number in the runbook (1.5); {NUMBER_RULE}"),
        ("ratio=-0", f"ratio=-0: ratio is a number in the runbook (1.5); {NUMBER_RULE}"),
        ("flag=yes", "flag=yes: flag is a boolean in the runbook; give true or false"),
        ("flag=True", "flag=True: flag is a boolean in the runbook; give true or false"),
    ],
)
def test_a_text_that_would_not_reach_the_steps_as_given_is_refused(
    local_book: Path, capsys: pytest.CaptureFixture[str], pair: str, expected: str
) -> None:
    assert main(["plan", str(local_book), "--var", pair]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"--var:1:1: {expected}")


def test_a_mistyped_var_name_says_which_it_may_mean(local_book: Path) -> None:
    """Before: `unknown var 'prot' (the runbook declares: v, port, ...)`, the list to read through for the typo."""
    for command in ("plan", "run"):
        done = runbook_cli(command, str(local_book), "--var", "prot=1")
        assert done.returncode == 2, done.stderr
        said = " ".join(done.stderr.split())
        assert (
            "--var:1:1: unknown var 'prot' (the runbook declares: v, port, ratio, flag, out); did you mean 'port'?"
            in said
        )


def test_var_and_secret_names_are_matched_whole(
    local_book: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name with a trailing newline is no name (a `$`-anchored pattern would accept it)."""
    assert main(["plan", str(local_book), "--var", "v\n=x"]) == 2
    assert "unknown var 'v\\x0a'" in capsys.readouterr().err
    book = tmp_path / "secret.yaml"
    book.write_text(LOCAL.replace("steps:", 'secrets:\n  TOK: {env: "TOK\\n"}\nsteps:'))
    assert main(["validate", str(book)]) == 2
    assert capsys.readouterr().err == (
        f"{book}:11:14: secrets.TOK.env: 'TOK\\n' is not a valid environment variable name\n"
    )


# ---- against the real sshd: the script's environment, run.json and --resume -------------------------

SSH_BOOK = """\
name: exact
__HOSTS__
vars:
  v: x
  out: /dev/null
steps:
  - id: echo
    kind: shell
    script: printf %s "$v" > "$out"
"""


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# no lone surrogate: what a command line cannot carry but as undecodable bytes, refused with exit 2 (above)
@given(text=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40))
def test_any_text_reaches_the_script_and_run_json_exactly(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    book = write_runbook(SSH_BOOK)
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    out = folder / "out"
    code = main(["run", str(book), "--log-dir", str(folder / "logs"), "--var", f"v={text}", "--var", f"out={out}"])
    assert code == 0, capsys.readouterr().err
    assert out.read_bytes() == text.encode("utf-8")
    (meta,) = (folder / "logs").glob("*/run.json")
    started = json.loads(meta.read_text())
    assert started["var_args"] == [f"v={text}", f"out={out}"] and started["vars"]["v"] == text


def test_resume_starts_again_with_the_exact_texts(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's --var texts carry over exactly: the step that passed is reused (its fingerprint is the
    same), the one that failed runs again and gets them byte for byte."""
    names = [f"v{i}" for i in range(len(TEXTS))]
    each = f'for n in {" ".join(names)}; do printf %s "${{!n}}" > "$out/$n.$step"; done'
    book = write_runbook(
        "name: resumed\n__HOSTS__\nvars:\n"
        + "".join(f"  {name}: x\n" for name in names)
        + f"  out: {tmp_path}\n"
        + "steps:\n"
        + f"  - id: first\n    kind: shell\n    script: {json.dumps('step=first; ' + each)}\n"
        + f"  - id: second\n    kind: shell\n    script: {json.dumps('step=second; ' + each + '; test -f $out/go')}\n"
    )
    logs = tmp_path / "logs"
    given = [f"--var={name}={text}" for name, text in zip(names, TEXTS, strict=True)]
    assert main(["run", str(book), "--log-dir", str(logs), *given]) == 1  # `second` fails: no go yet
    capsys.readouterr()
    for written in tmp_path.glob("v*.second"):
        written.unlink()
    (tmp_path / "go").touch()
    assert main(["run", str(book), "--log-dir", str(logs), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "first" in err and "reused (passed in" in err and "changed since" not in err, err
    assert [(tmp_path / f"{name}.second").read_text() for name in names] == TEXTS
    assert [(tmp_path / f"{name}.first").read_text() for name in names] == TEXTS
