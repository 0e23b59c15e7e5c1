"""`runbook validate`: every problem as FILE:LINE:COL: message, exit 2, never a traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from executor.stepkind import step_kinds

GOOD = """\
name: t
hosts:
  box: {address: local}
steps:
  - id: a
    kind: shell
    script: echo hi
"""


def validate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(text))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    return code, [line.replace(str(path), "F") for line in err.splitlines()]


@pytest.mark.parametrize("runbook", sorted(Path("runbooks").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_runbooks_are_valid(runbook: Path) -> None:
    assert main(["validate", str(runbook)]) == 0


def test_valid_runbook(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = validate(tmp_path, GOOD, capsys)
    assert code == 0
    assert "ok (1 steps" in lines[0]


def test_yaml_syntax_error_has_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = validate(tmp_path, "name: t\nsteps:\n  - id: [a\n", capsys)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("F:4:1: YAML syntax error")


def test_duplicate_keys_are_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = validate(tmp_path, GOOD + "    script: echo again\n", capsys)
    assert code == 2
    assert lines == ["F:8:5: duplicate key 'script' (first defined at line 7)"]


def test_every_problem_is_reported_with_its_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = """\
        name: t
        hosts:
          box: {address: local, prot: 22}
        defaults:
          timeout: 3 parsecs
        steps:
          - id: a
            kind: shell
            scirpt: echo hi
          - id: b
            kind: shel
          - id: c
            kind: shell
            script: 42
            host: bx
            gates:
              - that: "exit_code == "
              - "steps.zz.facts.x"
            fallbacks:
              - id: other
          - id: c
            kind: shell
            script: echo
            retry: {attempts: 0}
        """
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert lines == [
        "F:3:25: unknown key 'prot'; did you mean 'port'?",
        "F:5:12: defaults.timeout: expected a duration such as 500ms, 30s, 10m or 2h, got '3 parsecs'",
        "F:7:5: steps[0]: missing required key 'script'",
        "F:9:5: unknown key 'scirpt'; did you mean 'script'?",
        f"F:11:11: unknown step kind 'shel'; did you mean 'shell'? (known: {', '.join(sorted(step_kinds()))})",
        "F:14:13: steps[2].script: Input should be a valid string",
        "F:20:9: a fallback cannot change 'id'",
        "F:24:23: steps[3].retry.attempts: Input should be greater than or equal to 1",
    ]


def test_cross_references_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = """\
        name: t
        hosts:
          box: {address: local}
          other: {address: local}
        steps:
          - id: a
            kind: shell
            script: echo
            host: bx
            gates:
              - that: "exit_code == "
              - "steps.zz.facts.x and steps.a.facts"
          - id: a
            kind: shell
            host: box
            script: echo
          - id: c
            kind: shell
            script: echo
        """
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert lines == [
        "F:9:11: step 'a': unknown host 'bx'; did you mean 'box'?",
        "F:11:15: gate 'exit_code == ' does not parse: unexpected 'end of template'",
        "F:12:9: gate refers to step 'zz', which does not run before 'a'",
        "F:12:9: gate refers to step 'a', which does not run before 'a'",
        "F:13:9: duplicate step id 'a' (also step 1)",
        "F:17:5: step 'c' needs `host:`; the runbook defines 2 hosts",
    ]


def test_a_parameter_naming_a_step_must_name_an_earlier_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = """\
        name: t
        hosts: {box: {address: local}}
        steps:
          - id: probes
            kind: shell
            script: echo
          - id: deploy
            kind: deploy
            model_path: /m
            probe: probe
          - id: bench
            kind: benchmark
            server: deploy
            compare_to: later
          - id: later
            kind: shell
            script: echo
        """
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert lines == [
        "F:7:5: step 'deploy' uses the facts of step 'probe', which does not run before it; did you mean 'probes'?",
        "F:11:5: step 'bench' uses the facts of step 'later', which does not run before it",
    ]


def test_a_step_that_does_not_validate_is_not_also_reported_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = """\
        name: t
        hosts: {box: {address: local}}
        steps:
          - id: deploy
            kind: deploy
            model_path: /m
            tp_size: 0
          - id: bench
            kind: benchmark
            server: deploy
        """
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert lines and all(line.startswith("F:7:14: steps[0].tp_size") for line in lines)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "F:1:1: the file is empty; expected a runbook mapping"),
        ("- a\n- b\n", "F:1:1: expected a mapping with name, hosts, steps"),
        ("name: t\nsteps: []\n", "F:2:8: steps: List should have at least 1 item after validation, not 0"),
        (
            "name: t\nvars: {bad-name: 1}\nsteps: [{id: a, kind: shell, script: x}]\n",
            "F:2:7: vars: Value error, 'bad-name' is not a valid environment variable name",
        ),
        (  # YAML's `\0` escape: a byte that no path, argument or environment variable on a host can hold
            'name: t\nsteps: [{id: a, kind: shell, script: "cat /tmp/a\\0b"}]\n',
            "F:2:38: a NUL byte (\\0) in text: no path, command line or environment variable can hold one",
        ),
        (
            "name: t\nsecrets: {SHLVL: {env: X}}\nsteps: [{id: a, kind: shell, script: x}]\n",
            "F:2:10: secrets: Value error, bash sets SHLVL itself: a step's var or secret cannot have that name",
        ),
    ],
)
def test_shape_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert lines == [expected.replace("Value error, ", "")]


def test_missing_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the runbook" in capsys.readouterr().err


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
step_like = st.fixed_dictionaries(
    {"id": st.text(max_size=8), "kind": st.sampled_from(["shell", "she", 3])},
    optional={
        "script": yaml_values,
        "timeout": yaml_values,
        "gates": yaml_values,
        "fallbacks": yaml_values,
        "retry": yaml_values,
        "host": yaml_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    doc=st.one_of(
        yaml_values,
        st.fixed_dictionaries(
            {"name": yaml_values, "steps": st.lists(step_like, max_size=3)},
            optional={"hosts": yaml_values, "vars": yaml_values, "defaults": yaml_values},
        ),
    )
)
def test_any_yaml_gets_exit_0_or_2_and_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object
) -> None:
    code, lines = validate(tmp_path, yaml.safe_dump(doc), capsys)
    assert code in (0, 2)
    if code == 2:
        assert lines and all(line.startswith("F:") for line in lines), lines


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_any_text_gets_exit_2_and_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert lines and all(line.startswith("F:") for line in lines), lines
