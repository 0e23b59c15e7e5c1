"""The run loop through the CLI, against the real sshd: hosts, host keys, connections, transfers, the CLI's own
output. Gates, retries, fallbacks, facts per host and max_parallel run on scripted hosts:
tests/executor/test_engine_offline.py."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main
from executor.runbook.loader import load_runbook
from sandbox.sshd import SSHServer, free_port


def run(path: Path, log_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["run", str(path), "--log-dir", str(log_dir), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["status", "--log-dir", str(log_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def audit_records(log_dir: Path) -> list[dict[str, Any]]:
    (run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]
    return [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]


def test_unknown_host_key_refuses_without_retrying(write_runbook, sshd: SSHServer, tmp_path, capsys) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    hosts = sshd.host_yaml().replace(str(sshd.known_hosts), str(empty))
    path = write_runbook(
        """\
        name: t
        __HOSTS__
        defaults: {retry: {attempts: 3, delay: 10ms}}
        steps:
          - {id: a, kind: shell, script: "true"}
        """,
        hosts=hosts,
    )
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 1
    assert "not trusted" in err and f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in err
    assert status(tmp_path / "logs", capsys)["steps"][0]["attempts"] == 1
    # a changed key is refused the same way
    empty.write_text(
        f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOGn6RmQCHjD0XKsCHOqzRBtg9Y3m2S4hYb9r9Y0xOcw\n"
    )
    code, _out, err = run(path, tmp_path / "logs2", capsys)
    assert code == 1 and "not trusted" in err
    # turning verification off takes an explicit setting
    path.write_text(
        path.read_text().replace("connect_timeout: 10s", "connect_timeout: 10s\n    verify_host_key: false")
    )
    code, _out, err = run(path, tmp_path / "logs3", capsys)
    assert code == 0, err


def test_openssh_config_alias_and_proxyjump(write_runbook, sshd: SSHServer, tmp_path, capsys) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        textwrap.dedent(f"""\
        Host bastion
          HostName 127.0.0.1
          Port {sshd.port}
          User {sshd.user}
          IdentityFile {sshd.client_key}
          UserKnownHostsFile {sshd.known_hosts}
        Host gpu-alias
          HostName 127.0.0.1
          Port {sshd.port}
          User {sshd.user}
          IdentityFile {sshd.client_key}
          UserKnownHostsFile {sshd.known_hosts}
          ProxyJump bastion
        """)
    )
    hosts = f"hosts:\n  gpu:\n    address: gpu-alias\n    ssh_config: {config}\n    known_hosts: {sshd.known_hosts}\n"
    path = write_runbook(
        """\
        name: t
        __HOSTS__
        steps:
          - id: a
            kind: shell
            script: echo "via $SSH_CONNECTION"
        """,
        hosts=hosts,
    )
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 0, err
    (record,) = audit_records(tmp_path / "logs")
    assert record["stdout"].startswith("via 127.0.0.1")
    # the jump is really taken: with the bastion unreachable, the same host cannot be reached
    config.write_text(config.read_text().replace(f"Port {sshd.port}", f"Port {free_port()}", 1))
    code, _out, err = run(path, tmp_path / "logs2", capsys)
    assert code == 1 and "cannot connect to gpu (gpu-alias)" in err


def test_dropped_connection_reconnects_and_retries(write_runbook, sshd: SSHServer, tmp_path, capsys) -> None:
    marker = tmp_path / "dropped"
    path = write_runbook(f"""\
        name: t
        __HOSTS__
        steps:
          - id: first
            kind: shell
            script: "true"
          - id: drop
            kind: shell
            retry: {{attempts: 2, delay: 10ms}}
            script: |
              if [ ! -e {marker} ]; then
                touch {marker}
                # kill the sshd processes serving this connection (not the listener)
                pkill -KILL -P {sshd.pid}; sleep 5
              fi
              echo survived
        """)
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 0, err
    records = audit_records(tmp_path / "logs")
    drop = [r for r in records if r["step"] == "drop"]
    assert len(drop) == 2
    assert drop[0]["exit_code"] is None and "transport error" in drop[0]["stderr"]
    assert drop[1]["stdout"] == "survived\n"


def test_missing_secret_is_invalid_input(write_runbook, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("RB_TEST_TOKEN", raising=False)
    path = write_runbook("""\
        name: t
        __HOSTS__
        secrets:
          HF_TOKEN: {env: RB_TEST_TOKEN}
        steps:
          - {id: a, kind: shell, script: "true"}
        """)
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 2
    assert "secret HF_TOKEN: environment variable RB_TEST_TOKEN is not set" in err


def test_json_events_on_stdout(write_runbook, tmp_path, capsys) -> None:
    path = write_runbook("""\
        name: t
        __HOSTS__
        steps:
          - {id: a, kind: shell, script: "echo one"}
          - {id: b, kind: shell, script: "exit 3"}
        """)
    code, out, _err = run(path, tmp_path / "logs", capsys, "--json")
    assert code == 1
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in events] == [
        "run_started",
        "step_started",
        "command_finished",
        "step_finished",
        "step_started",
        "command_finished",
        "attempt_failed",
        "step_finished",
        "run_finished",
    ]
    assert events[-1]["status"] == "failed" and events[-1]["exit_code"] == 1
    assert "\x1b[" not in out


def test_plan_prints_commands_and_runs_nothing(write_runbook, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RB_TEST_TOKEN", "hf_plan_secret_value")
    canary = tmp_path / "canary"
    path = write_runbook(f"""\
        name: t
        __HOSTS__
        vars: {{greeting: "it's $(here)"}}
        secrets: {{HF_TOKEN: {{env: RB_TEST_TOKEN}}}}
        steps:
          - id: a
            kind: shell
            script: touch {canary}
            fallbacks:
              - script: touch {canary}.fallback
        """)
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert not canary.exists()
    assert f"touch {canary}\n" in out and f"touch {canary}.fallback" in out
    assert "export greeting='it'\"'\"'s $(here)'" in out
    assert "export HF_TOKEN='***'" in out and "hf_plan_secret_value" not in out
    assert "step 1 'a' (shell) on box [127.0.0.1], fallback 1" in out


def test_run_folder_is_private(write_runbook, tmp_path, capsys) -> None:
    path = write_runbook("""\
        name: t
        __HOSTS__
        steps:
          - {id: a, kind: shell, script: "true"}
        """)
    assert run(path, tmp_path / "logs", capsys)[0] == 0
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for item in run_dir.iterdir():
        assert stat.S_IMODE(item.stat().st_mode) == 0o600, item.name


def test_upload_and_fetch_are_audited(write_runbook, tmp_path, capsys) -> None:
    (tmp_path / "helper.sh").write_text('echo helper-ran > "$1"\n')
    remote = tmp_path / "remote"
    remote.mkdir()
    path = write_runbook(f"""\
        name: t
        __HOSTS__
        steps:
          - id: ship
            kind: shell
            upload: [{{src: helper.sh, dest: {remote}/helper.sh}}]
            script: bash {remote}/helper.sh {remote}/result.txt
            fetch: [{{src: {remote}/result.txt, dest: result.txt}}]
        """)
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 0, err
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert (run_dir / "hosts" / "box" / "result.txt").read_text() == "helper-ran\n"
    transfers = [r for r in audit_records(tmp_path / "logs") if r["event"] == "transfer"]
    helper = (tmp_path / "helper.sh").read_bytes()
    assert [(t["direction"], t["size"]) for t in transfers] == [("put", len(helper)), ("get", 11)]
    assert transfers[0]["sha256"] == hashlib.sha256(helper).hexdigest()
    assert transfers[1]["sha256"] == hashlib.sha256(b"helper-ran\n").hexdigest()


def test_cli_entry_point_is_installed(tmp_path: Path) -> None:
    done = subprocess.run(
        ["runbook", "validate", "runbooks/demo_local.yaml"], capture_output=True, text=True, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr


def test_inventory_points_the_same_runbook_at_another_site(sshd: SSHServer, tmp_path, capsys) -> None:
    book = tmp_path / "site.yaml"
    book.write_text(
        textwrap.dedent("""\
        name: site
        hosts:
          gpu: {address: gpu-box.example, user: root}
        vars: {models_dir: /root/models}
        steps:
          - {id: where, kind: shell, script: 'echo "models in $models_dir"'}
        """)
    )
    inventory = tmp_path / "inventory.yaml"
    host = "".join(f"    {k}: {v}\n" for k, v in sshd.host_dict().items())
    inventory.write_text(f"hosts:\n  gpu:\n{host}vars:\n  models_dir: {tmp_path}/models\n")
    code, _out, err = run(book, tmp_path / "logs", capsys, "--inventory", str(inventory))
    assert code == 0, err
    (record,) = audit_records(tmp_path / "logs")
    assert record["stdout"] == f"models in {tmp_path}/models\n"
    # --var still wins over the inventory
    code, _out, err = run(book, tmp_path / "logs2", capsys, "--inventory", str(inventory), "--var", "models_dir=/x")
    assert code == 0 and audit_records(tmp_path / "logs2")[0]["stdout"] == "models in /x\n"


def test_inventory_names_must_exist_in_the_runbook(tmp_path, capsys) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  gpux: {address: local}\nvars:\n  model_dir: /x\n")
    code = main(["validate", "runbooks/example_remote.yaml", "--inventory", str(inventory)])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{inventory}:2:3: hosts: 'gpux' is not in the runbook (a host the runbook does not name is added by "
        "listing it in one of the inventory's pools); did you mean 'gpu'?",
        f"{inventory}:4:3: vars: 'model_dir' is not in the runbook; did you mean 'models_dir'?",
    ]


def test_masking_a_secret_does_not_mark_output_truncated(tmp_path, capsys, monkeypatch) -> None:
    """Redaction shortens the kept output; the audit record must not call that truncation."""
    monkeypatch.setenv("RB_TEST_TOKEN", "hf_a_long_secret_value_0123456789")
    path = tmp_path / "runbook.yaml"
    path.write_text(
        textwrap.dedent("""\
            name: t
            hosts: {here: {address: local}}
            secrets:
              TOK: {env: RB_TEST_TOKEN}
            steps:
              - {id: a, kind: shell, script: 'echo "token=$TOK"; echo "$TOK" >&2'}
            """)
    )
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 0, err
    (record,) = audit_records(tmp_path / "logs")
    assert record["stdout"] == "token=***\n" and record["stderr"] == "***\n"
    assert record["stdout_truncated"] is False and record["stderr_truncated"] is False


@pytest.mark.timeout(60)
def test_a_stalled_file_transfer_times_out(tmp_path, capsys, monkeypatch) -> None:
    """Nothing waits forever: a transfer that never finishes fails the attempt at the step's timeout."""

    from executor.transport.local import LocalTransport

    async def stall(self: LocalTransport, local: Path, remote: str) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(LocalTransport, "put", stall)
    (tmp_path / "helper.sh").write_text("true\n")
    path = tmp_path / "runbook.yaml"
    path.write_text(
        textwrap.dedent(f"""\
            name: t
            hosts: {{here: {{address: local}}}}
            steps:
              - id: ship
                kind: shell
                timeout: 1s
                retry: {{attempts: 1}}
                upload: [{{src: helper.sh, dest: {tmp_path}/copy.sh}}]
                script: "true"
            """)
    )
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 1
    assert "file transfer timed out after 1s" in err


def test_a_refused_resume_releases_the_run_it_would_continue(tmp_path, capsys) -> None:
    """A resume stopped by a planning error (unknown step) leaves the earlier run resumable."""
    path = tmp_path / "runbook.yaml"
    path.write_text(
        textwrap.dedent("""\
            name: t
            hosts: {here: {address: local}}
            steps:
              - {id: a, kind: shell, script: "true"}
            """)
    )
    logs = tmp_path / "logs"
    assert run(path, logs, capsys)[0] == 0
    code, _out, err = run(path, logs, capsys, "--resume", "--from", "nosuch")
    assert code == 2 and "no step 'nosuch'" in err
    code, _out, err = run(path, logs, capsys, "--resume")
    assert code == 0, err


def test_a_var_read_only_by_a_kinds_host_program_counts_as_used() -> None:
    """download's host program reads HF_ENDPOINT from the environment: changing it reruns the step."""
    from executor.run.resume import definition_parts, fingerprint

    book = load_runbook(Path("runbooks/k26_dflash.yaml"))
    (step,) = [s for s in book.steps if s.id == "download_drafter"]
    before = fingerprint(definition_parts(book, step, "gpu", {**book.header.vars, "HF_ENDPOINT": "http://127.0.0.1:1"}))
    after = fingerprint(definition_parts(book, step, "gpu", {**book.header.vars, "HF_ENDPOINT": "http://127.0.0.1:2"}))
    unrelated = fingerprint(
        definition_parts(book, step, "gpu", {**book.header.vars, "HF_ENDPOINT": "http://127.0.0.1:1", "x": 1})
    )
    assert before != after and before == unrelated


def extra_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    """A step kind of a test's own, a module of the `steps` package imported (adding one touches no engine code)."""
    import steps

    extra = tmp_path / "extra_steps"
    extra.mkdir(exist_ok=True)
    (extra / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.setattr(steps, "__path__", [*steps.__path__, str(extra)])
    importlib.import_module(f"steps.{name}")


def test_a_bug_in_a_step_kind_fails_the_step_without_crashing_the_run(tmp_path, capsys, monkeypatch) -> None:
    extra_kind(
        tmp_path,
        monkeypatch,
        "buggy",
        """\
        from typing import Literal
        from executor.stepkind import Outcome, StepContext, StepSpec

        class Buggy(StepSpec):
            kind: Literal["buggy"] = "buggy"

            async def execute(self, ctx: StepContext) -> Outcome:
                return {}["missing"]
        """,
    )
    path = tmp_path / "rb.yaml"
    path.write_text("name: t\nsteps:\n  - {id: b, kind: buggy, retry: {attempts: 1}}\n")
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 1
    assert "step kind 'buggy' failed unexpectedly" in err and "KeyError: 'missing'" in err
    assert status(tmp_path / "logs", capsys)["run"]["status"] == "failed"


def test_status_shows_run_data_as_written_not_as_markup(tmp_path, capsys) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: "[red]t"
        steps:
          - id: a
            kind: shell
            retry: {attempts: 1}
            script: echo '[bold]oops' >&2; exit 2
            gates: [{that: "exit_code == 0", message: "[primary] broken [/]"}]
        """)
    )
    assert run(path, tmp_path / "logs", capsys)[0] == 1
    assert main(["status", "--log-dir", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    assert "[primary]" in out and "[/]" in out and "[bold]oops" in out and "([red]t)" in out


def test_changed_parts_names_what_differs() -> None:
    from executor.run.resume import changed_parts

    old = {"step": "a", "host": "h", "var models_dir": "1", "file conf.txt": "x"}
    new = {"step": "a", "host": "h", "var models_dir": "2", "file conf.txt": "y", "var extra": "z"}
    assert changed_parts(old, new) == "file conf.txt, var extra, var models_dir"
    assert changed_parts(None, new) == "its definition"  # a record from before parts were kept


def test_facts_of_kind_gives_the_earlier_steps_of_a_kind_on_the_host(tmp_path, capsys, monkeypatch) -> None:
    """What a report's provenance reads: every earlier step of a kind with facts, on this host only."""
    extra_kind(
        tmp_path,
        monkeypatch,
        "gather",
        """\
        from typing import Literal
        from executor.stepkind import Outcome, StepContext, StepSpec
        from executor.transport.base import CommandResult

        class Gather(StepSpec):
            kind: Literal["gather"] = "gather"

            async def execute(self, ctx: StepContext) -> Outcome:
                result = await ctx.run("true")
                return Outcome(result, {"shell": ctx.facts_of_kind("shell"), "none": ctx.facts_of_kind("probe")})
        """,
    )
    path = tmp_path / "rb.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: t
        hosts: {a: {address: local}, b: {address: local}}
        steps:
          - {id: mark, kind: shell, hosts: all, parse: json, script: 'printf "{\\"m\\": \\"%s\\"}" "$(mktemp -u)"'}
          - {id: plain, kind: shell, hosts: all, script: "true"}
          - {id: gather, kind: gather, host: a}
          - {id: later, kind: shell, host: a, parse: json, script: "echo '{}'"}
        """)
    )
    code, _out, err = run(path, tmp_path / "logs", capsys)
    assert code == 0, err
    facts = {(s["step"], s["host"]): s["facts"] for s in status(tmp_path / "logs", capsys)["steps"]}
    assert facts[("mark", "a")] != facts[("mark", "b")]
    # host a's facts of the shell step before it that has facts: not b's, not the step without facts, not later
    assert facts[("gather", "a")] == {"shell": {"mark": facts[("mark", "a")]}, "none": {}}
