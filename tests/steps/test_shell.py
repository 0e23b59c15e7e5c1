"""The `shell` kind, and the promise that a new kind is one module in steps/."""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

import pytest

import steps
from executor.faces.cli import main
from executor.stepkind import FactsError, step_kinds
from executor.transport.base import Collector
from steps.shell import ShellStep


def finished(stdout: bytes, exit_code: int = 0):  # type: ignore[no-untyped-def]
    collect = Collector()
    collect.stdout.feed(stdout)
    return collect.result(exit_code)


def test_parse_json_makes_facts() -> None:
    step = ShellStep(id="a", script="x", parse="json")
    assert step.parse_facts(finished(b'{"gpus": [1, 2]}\n')) == {"gpus": [1, 2]}


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        (b"", "stdout was empty"),
        (b"  \n", "stdout was empty"),
        (b"{nope", "could not parse stdout"),
        # before: a ValueError, so the step failed "unexpectedly" with a traceback for a message
        pytest.param(b'{"n": ' + b"9" * 5000 + b"}", "could not parse stdout: Exceeds the limit", id="5000 digits"),
    ],
)
def test_parse_json_is_loud_about_bad_output(stdout: bytes, message: str) -> None:
    with pytest.raises(FactsError, match=message):
        ShellStep(id="a", script="x", parse="json").parse_facts(finished(stdout))


def test_default_gate_is_exit_code_zero() -> None:
    assert [g.that for g in ShellStep(id="a", script="x").effective_gates()] == ["exit_code == 0"]
    assert ShellStep(id="a", script="x", gates=[]).effective_gates() == []


def test_empty_json_output_fails_the_step_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: t
        steps:
          - {id: probe, kind: shell, parse: json, script: "true"}
        """)
    )
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs")]) == 1
    assert "parse: json expected a JSON document on stdout, but stdout was empty" in capsys.readouterr().err


def test_a_new_kind_is_one_module_in_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of the `steps` package's path defining a kind: once imported, the engine finds and runs it (an
    installed package's kind comes through an entry point: tests/docs/test_kind_plugin.py)."""
    extra = tmp_path / "extra_steps"
    extra.mkdir()
    (extra / "count_words.py").write_text(
        textwrap.dedent("""\
        from typing import Literal
        from pydantic import BaseModel
        from executor.runbook.model import Gate
        from executor.stepkind import RenderContext, StepSpec
        from executor.transport.base import CommandResult

        class WordCount(BaseModel):
            words: int

        class CountWords(StepSpec):
            kind: Literal["count_words"] = "count_words"
            text: str

            def render(self, ctx: RenderContext) -> str:
                return 'printf "%s" "$1" | wc -w'.replace("$1", self.text.replace('"', ""))

            def parse_facts(self, result: CommandResult) -> WordCount:
                return WordCount(words=int(result.stdout_text.strip()))

            def default_gates(self) -> list[Gate]:
                return [Gate(that="facts.words > 0", message="no words")]
        """)
    )
    monkeypatch.setattr(steps, "__path__", [*steps.__path__, str(extra)])
    assert "count_words" not in step_kinds()
    importlib.import_module("steps.count_words")
    assert "count_words" in step_kinds()
    path = tmp_path / "rb.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: t
        steps:
          - {id: count, kind: count_words, text: "three small words"}
          - {id: empty, kind: count_words, text: ""}
        """)
    )
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs"), "--json"]) == 1
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    finished_steps = {e["step"]: e for e in events if e["event"] == "step_finished"}
    assert finished_steps["count"]["status"] == "passed"
    assert finished_steps["empty"]["status"] == "failed" and "no words" in finished_steps["empty"]["failures"][0]
