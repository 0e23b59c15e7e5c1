"""What reaches a step is what its fingerprint covers (StepSpec.env_names): one set, for run and resume.

Through the CLI against the real sshd: a var read by a program the script starts (never named in the
script) reruns the step when it changes; a var that reaches no step of a kind reruns nothing; the
console names the var that changed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main
from executor.runbook.loader import load_runbook
from tests.executor.test_resume import audited_steps, cli, header, newest, side_lines


def test_a_var_read_by_a_program_the_script_starts_reruns_the_step(tmp_path: Path, write_runbook: Any) -> None:
    side, logs, marker = tmp_path / "side.txt", tmp_path / "logs", tmp_path / "marker"
    app = tmp_path / "app.sh"
    app.write_text('echo "serve-$port" >> "$side"\n')  # the step's script never names the var
    book = write_runbook(
        header("indirect", tmp_path, extra_vars="  port: 8000\n")
        + "steps:\n"
        + "  - id: serve\n    kind: shell\n    upload: [{src: app.sh, dest: /tmp/runbook-test-app.sh}]\n"
        + "    script: bash /tmp/runbook-test-app.sh\n"
        + '  - id: check\n    kind: shell\n    script: test -f "$marker"\n'
    )
    first = cli("run", str(book), "--log-dir", str(logs))
    assert first.returncode == 1  # check fails: no marker yet
    assert side_lines(side) == ["serve-8000"]

    marker.touch()
    again = cli("run", str(book), "--resume", "--var", "port=9000", "--log-dir", str(logs))
    assert again.returncode == 0, again.stderr
    assert re.search(r"serve .* runs again \(changed since [0-9a-f-]+: var port\)", again.stderr), again.stderr
    assert side_lines(side) == ["serve-8000", "serve-9000"]  # the new port is served, not the old one


def test_a_step_that_lists_what_it_gets_is_not_rerun_for_another_var(tmp_path: Path, write_runbook: Any) -> None:
    side, logs = tmp_path / "side.txt", tmp_path / "logs"
    book = write_runbook(
        header("declared", tmp_path, extra_vars="  only_third: one\n")
        + "steps:\n"
        + '  - id: v1\n    kind: shell\n    pass_env: []\n    script: echo "v1-${only_third:-unset}" >> "$side"\n'
        + '  - id: v2\n    kind: shell\n    script: echo v2 >> "$side"\n'
    )
    first = cli("run", str(book), "--log-dir", str(logs))
    assert first.returncode == 0, first.stderr
    # `pass_env: []`: only the vars its script names reach it (side, only_third); v2 gets every var
    assert side_lines(side) == ["v1-one", "v2"]

    changed = cli("run", str(book), "--resume", "--var", "marker=/elsewhere", "--log-dir", str(logs))
    assert changed.returncode == 0, changed.stderr
    assert "v1 " in changed.stderr and re.search(r"v1 .* reused", changed.stderr), changed.stderr
    assert re.search(r"v2 .* runs again \(changed since [0-9a-f-]+: var marker\)", changed.stderr), changed.stderr
    assert audited_steps(newest(logs)) == ["v2"]


def test_only_what_reaches_a_command_is_exported_and_plan_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\n"
        "vars: {models_dir: /m, timeout: 5, json: x, path: /p, HF_ENDPOINT: 'http://127.0.0.1:1'}\n"
        "steps:\n"
        "  - id: probe\n    kind: probe\n    models_dir: $models_dir\n"
        "  - id: narrow\n    kind: shell\n    pass_env: ['HF_*']\n    script: echo \"$path\"\n"
    )
    assert main(["plan", "--full", str(path)]) == 0
    plan = capsys.readouterr().out
    probe, narrow = plan.split("## step 2")
    assert "export models_dir=/m" in probe and "export HF_ENDPOINT=" in probe
    # the probe's own program mentions `timeout`, `json` and `path`: none of those vars reaches it
    for name in ("timeout", "json", "path"):
        assert f"export {name}=" not in probe
    assert "export path=/p" in narrow and "export HF_ENDPOINT=" in narrow and "export json=" not in narrow


def test_the_fingerprint_counts_exactly_the_exported_vars_and_the_gate_vars(tmp_path: Path) -> None:
    from executor.run.resume import definition_parts

    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\n"
        "vars: {models_dir: /m, timeout: 5, json: x, min_free: 3, HF_HUB_OFFLINE: 1}\n"
        "secrets: {HF_TOKEN: {env: HF_TOKEN, required: false}, OTHER: {env: OTHER, required: false}}\n"
        "steps:\n"
        "  - id: probe\n    kind: probe\n    models_dir: $models_dir\n"
        "    gates: ['facts.models.disk.avail_bytes > vars.min_free']\n"
    )
    runbook = load_runbook(path)
    (spec,) = runbook.steps
    variables = runbook.header.vars
    parts = definition_parts(runbook, spec, "h", variables, ["HF_TOKEN", "OTHER"])
    exported, secrets = spec.environment({k: str(v) for k, v in variables.items()}, {"HF_TOKEN": "t", "OTHER": "o"})
    assert sorted(exported) == ["HF_HUB_OFFLINE", "models_dir"]
    assert sorted(secrets) == ["HF_TOKEN"]
    counted = sorted(name for name in parts if name.startswith(("var ", "secret ")))
    assert counted == ["secret HF_TOKEN", "var HF_HUB_OFFLINE", "var min_free", "var models_dir"]


def test_pass_env_names_what_the_runbook_declares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(
        "name: t\nhosts: {h: {address: local}}\nvars: {port: 1}\n"
        "steps:\n  - id: a\n    kind: shell\n    pass_env: [port, prot, 'HF_*']\n    script: echo\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:7:22: step 'a': pass_env names 'prot', which is neither a var nor a secret" in err
    assert err.count("pass_env names") == 1  # a declared var and a pattern are fine
