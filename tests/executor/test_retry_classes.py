"""Failures that retrying cannot fix are not retried (README, "Retries"): each failure class through the engine,
in-process on `address: local`, and `retry.non_retryable` narrowing or widening the default set.

A class a kind recognises (ConfigRefused, AccessDenied, OutOfMemory, PortInUse) reaches the engine as the
facts' `failure_class`, as deploy, download and verify report it; a shell step printing such facts stands in
for them here (the host programs' detection has its own tests: tests/hostprograms/test_failure_classes.py).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from executor.command_result import CommandResult
from executor.errors import FAILURE_CLASSES, NON_RETRYABLE_DEFAULT, OutOfMemory
from executor.faces.cli import main
from executor.run.events import EVENTS_FILE
from executor.stepkind import RenderContext, StepSpec

RETRY = "{attempts: 3, delay: 10ms}"


@dataclass
class Run:
    code: int
    err: str
    step: dict[str, Any]  # the step's record, as `runbook status --json` shows it
    events: list[dict[str, Any]]


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], steps: str, defaults: str = "", variables: str = "") -> Run:
    """One run of a runbook of `steps` (YAML, indented as a list under `steps:`) on this machine."""
    tmp_path.mkdir(exist_ok=True)
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: t\nhosts:\n  box: {address: local}\n"
        + (f"vars:\n  {variables}\n" if variables else "")
        + (f"defaults:\n  {defaults}\n" if defaults else "")
        + "steps:\n"
        + textwrap.indent(textwrap.dedent(steps), "  ")
    )
    logs = tmp_path / "logs"
    code = main(["run", str(book), "--log-dir", str(logs)])
    err = capsys.readouterr().err
    assert main(["status", "--log-dir", str(logs), "--json"]) == 0
    step = json.loads(capsys.readouterr().out)["steps"][0]
    (folder,) = [p for p in logs.iterdir() if p.is_dir()]
    events = [json.loads(line) for line in (folder / EVENTS_FILE).read_text().splitlines()]
    return Run(code, err, step, events)


def reporting(failure_class: str, retry: str = RETRY) -> str:
    """A step whose facts report an error of `failure_class`, gated as deploy's default gate is."""
    facts = json.dumps({"failure": "the host said no", "failure_class": failure_class})
    script = json.dumps(f"echo '{facts}'")  # quoted for YAML
    return f"""\
        - id: s
          kind: shell
          parse: json
          script: {script}
          retry: {retry}
          gates: ["facts.failure is none"]
        """


@pytest.mark.parametrize("name", ["ConfigRefused", "AccessDenied", "OutOfMemory", "PortInUse"])
def test_a_class_a_kind_recognises_is_not_retried_unless_narrowed(name: str, tmp_path: Path, capsys: Any) -> None:
    refused = run(tmp_path / "default", capsys, reporting(name))
    assert refused.code == 1 and refused.step["attempts"] == 1
    assert refused.step["message"].startswith(
        f"[primary] not retried: {name}: gate failed\n  gate: facts.failure is none"
    )
    (finished,) = [e for e in refused.events if e["event"] == "step_finished"]
    assert finished["failures"][0].startswith(f"s@box: [primary] not retried: {name}")
    assert f"not retried: {name}" in refused.err  # the terminal

    narrowed = [n for n in NON_RETRYABLE_DEFAULT if n != name]
    retried = run(
        tmp_path / "narrowed", capsys, reporting(name, f"{{attempts: 3, delay: 10ms, non_retryable: {narrowed}}}")
    )
    assert retried.code == 1 and retried.step["attempts"] == 3
    assert "not retried" not in retried.step["message"] + retried.err


def test_a_gate_that_reads_a_false_value_is_not_retried(tmp_path: Path, capsys: Any) -> None:
    """A gate on a value that asking again reads the same (a var here; a probe's facts) is a GateFalse."""
    steps = """\
        - id: s
          kind: shell
          script: "true"
          retry: __RETRY__
          gates: [{that: "vars.gpu_count > 0", message: no GPU}]
        """
    refused = run(tmp_path / "default", capsys, steps.replace("__RETRY__", RETRY), variables="gpu_count: 0")
    assert refused.step["attempts"] == 1 and refused.step["message"].startswith(
        "[primary] not retried: GateFalse: no GPU"
    )
    retried = run(
        tmp_path / "narrowed",
        capsys,
        steps.replace("__RETRY__", "{attempts: 3, delay: 10ms, non_retryable: []}"),
        variables="gpu_count: 0",
    )
    assert retried.step["attempts"] == 3 and "not retried" not in retried.step["message"]


def test_a_shell_step_polling_its_own_json_facts_is_retried_until_they_hold(tmp_path: Path, capsys: Any) -> None:
    """A shell step's facts are what its script printed: a false gate on them may pass when it runs again."""
    counter = tmp_path / "count"
    steps = f"""\
        - id: s
          kind: shell
          parse: json
          script: |
            n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}
            echo "{{\\"ready\\": $([ "$n" -ge 3 ] && echo true || echo false)}}"
          retry: {{attempts: 5, delay: 10ms}}
          gates: [facts.ready]
        """
    polled = run(tmp_path, capsys, steps)
    assert polled.code == 0 and polled.step["attempts"] == 3, polled.step["message"]


@pytest.mark.parametrize(
    ("script", "gate"),
    [
        ("echo '{\"n\": 1}'; exit 1", "exit_code == 0"),  # CommandFailed: the command may do better next time
        ("echo '{\"n\": 1}'", "facts.absent.count > 0"),  # GateUndecided: nothing definite was read
        ('echo \'{"n": 1, "failure": "connection reset"}\'', "facts.failure is none"),  # StepFailed
    ],
)
def test_a_failure_that_may_pass_is_still_retried(script: str, gate: str, tmp_path: Path, capsys: Any) -> None:
    steps = f"""\
        - id: s
          kind: shell
          parse: json
          script: {json.dumps(script)}
          retry: {RETRY}
          gates: [{json.dumps(gate)}]
        """
    failed = run(tmp_path, capsys, steps)
    assert failed.code == 1 and failed.step["attempts"] == 3
    assert len([e for e in failed.events if e["event"] == "attempt_failed"]) == 3


def test_a_transient_failure_that_clears_passes_on_a_retry(tmp_path: Path, capsys: Any) -> None:
    counter = tmp_path / "count"
    steps = f"""\
        - id: s
          kind: shell
          script: |
            n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}
            [ "$n" -ge 2 ]
          retry: {RETRY}
        """
    passed = run(tmp_path, capsys, steps)
    assert passed.code == 0 and passed.step["attempts"] == 2 and passed.step["status"] == "passed"


def test_non_retryable_widens_to_a_timeout_from_the_defaults(tmp_path: Path, capsys: Any) -> None:
    steps = """\
        - id: s
          kind: shell
          script: sleep 5
          timeout: 200ms
        """
    timed_out = run(
        tmp_path / "widened", capsys, steps, "retry: {attempts: 3, delay: 10ms, non_retryable: [CommandTimedOut]}"
    )
    assert timed_out.step["attempts"] == 1
    assert timed_out.step["message"].startswith("[primary] not retried: CommandTimedOut: timed out after 0.2s")
    default = run(tmp_path / "default", capsys, steps, "retry: {attempts: 2, delay: 10ms}")
    assert default.step["attempts"] == 2


def test_a_non_retryable_failure_still_takes_the_fallbacks(tmp_path: Path, capsys: Any) -> None:
    steps = f"""\
        - id: s
          kind: shell
          parse: json
          script: "echo '{{\\"failure\\": \\"port taken\\", \\"failure_class\\": \\"PortInUse\\"}}'"
          retry: {RETRY}
          gates: ["facts.failure is none"]
          fallbacks:
            - script: "echo '{{\\"failure\\": null}}'"
        """
    passed = run(tmp_path, capsys, steps)
    assert passed.code == 0 and passed.step["via"] == "fallback 1" and passed.step["attempts"] == 2


def test_an_unknown_class_name_is_refused_at_its_line(tmp_path: Path, capsys: Any) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: t\nhosts:\n  box: {address: local}\nsteps:\n"
        "  - id: s\n    kind: shell\n    script: 'true'\n    retry:\n      non_retryable: [GateFalse, Flaky]\n"
    )
    assert main(["validate", str(book)]) == 2
    err = capsys.readouterr().err
    assert f"{book}:9:" in err and "'Flaky' is no failure class" in err and "Traceback" not in err
    assert all(name in err for name in FAILURE_CLASSES)


def test_a_class_name_in_place_of_a_list_is_refused_as_no_list(tmp_path: Path, capsys: Any) -> None:
    """`non_retryable: GateFalse` (no brackets): a list is expected, said so; YAML has no tuples."""
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: t\nhosts:\n  box: {address: local}\ndefaults:\n  retry: {non_retryable: GateFalse}\nsteps: []\n"
    )
    assert main(["validate", str(book)]) == 2
    err = capsys.readouterr().err
    assert f"{book}:5:" in err and "defaults.retry.non_retryable: Input should be a list" in err and "tuple" not in err


class _OwnOutOfMemory(OutOfMemory):
    """A kind's own class: no name `non_retryable` lists, so it would be retried though it says otherwise."""


def _refused_lookup() -> Any:
    raise KeyError("failure_class")


@pytest.mark.parametrize(
    ("decides", "said"),
    [
        (lambda: "AccessDenied", "classed this failure as 'AccessDenied', no class of executor.errors"),
        (_refused_lookup, "could not class this failure: KeyError: 'failure_class'"),
        (lambda: RuntimeError, "classed this failure as <class 'RuntimeError'>, no class of executor.errors"),
        (lambda: _OwnOutOfMemory, "classed this failure as <class '"),  # `non_retryable` cannot name it
    ],
    ids=["a-name", "raises", "no-failure-class", "a-class-of-its-own"],
)
def test_a_kind_whose_failure_class_is_broken_fails_its_attempt_not_the_run(
    decides: Callable[[], Any], said: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`failure_class` is a kind's code (README, "Retries"): its bug is a StepKindCrashed, retried, as a bug in
    `execute` is; it crashed the whole run with a traceback."""
    monkeypatch.setattr(StepSpec, "registry", dict(StepSpec.registry))  # the kind below: this test's alone

    class Misclassing(StepSpec):
        kind: Literal["misclassing"] = "misclassing"

        def render(self, ctx: RenderContext) -> str:
            return "true"

        def parse_facts(self, result: CommandResult) -> Any:
            return {"served": False}

        def failure_class(self, facts: Any) -> Any:
            return decides()

    failed = run(tmp_path, capsys, f"- {{id: s, kind: misclassing, retry: {RETRY}, gates: ['facts.served']}}\n")
    assert failed.code == 1 and failed.step["attempts"] == 3 and "Traceback" not in failed.err
    assert f"step kind 'misclassing' {said}" in failed.step["message"]
