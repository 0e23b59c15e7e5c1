"""Host keys are verified unless the runbook or inventory says `verify_host_key: false` for the host.

An ssh config (the host's `ssh_config:` or ~/.ssh/config) that would take checking off is overridden,
so an unknown key is still refused; a known_hosts file that does not exist is a refusal, never retried;
a host run unverified is said on the console once, in run.json and in the audit log. All through the
CLI against the real sshd, with HOME a temporary folder so that the user's own ~/.ssh stays out.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from sandbox.sshd import SSHServer, start_sshd
from tests.clirun import runbook_cli

TURN_OFF = "set `verify_host_key: false` on the host (runbook or --inventory) to turn verification off on purpose"

RUNBOOK = """\
name: t
__HOSTS__
defaults: {retry: {attempts: 3, delay: 10ms}}
steps:
  - {id: a, kind: shell, script: "echo first"}
  - {id: b, kind: shell, script: "echo second"}
"""


def _host(sshd: SSHServer, **keys: object) -> str:
    """The sshd as host `box`, with `keys` replacing (None: removing) its default keys."""
    fields: dict[str, object] = {**sshd.host_dict(), "connect_timeout": "10s", **keys}
    lines = "".join(f"    {k}: {v}\n" for k, v in fields.items() if v is not None)
    return f"hosts:\n  box:\n{lines}"


def _home(tmp_path: Path, config: str | None = None, known_hosts: str | None = None) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    if config is not None:
        (home / ".ssh" / "config").write_text(config)
    if known_hosts is not None:
        (home / ".ssh" / "known_hosts").write_text(known_hosts)
    return {"HOME": str(home)}


def _run_json(logs: Path) -> dict[str, object]:
    (run_dir,) = (p for p in logs.iterdir() if p.is_dir())
    return dict(json.loads((run_dir / "run.json").read_text()))


def _audit(logs: Path) -> list[dict[str, object]]:
    (run_dir,) = (p for p in logs.iterdir() if p.is_dir())
    return [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]


def _attempts(logs: Path) -> int:
    done = runbook_cli("status", "--json", "--log-dir", str(logs))
    return int(json.loads(done.stdout)["steps"][0]["attempts"])


DISABLING = {
    "known-hosts-none": "UserKnownHostsFile none",
    "known-hosts-dev-null": "UserKnownHostsFile /dev/null",
    "strict-no": "StrictHostKeyChecking no",
    "both": "StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null",
}


@pytest.mark.parametrize("setting", DISABLING.values(), ids=DISABLING.keys())
def test_host_ssh_config_cannot_turn_verification_off(write_runbook, sshd: SSHServer, tmp_path, setting) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  {setting}\n")
    path = write_runbook(RUNBOOK, hosts=_host(sshd, ssh_config=config, known_hosts=None))
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), env=_home(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "host key of box (127.0.0.1) not trusted" in done.stderr
    assert TURN_OFF in done.stderr
    assert _attempts(tmp_path / "logs") == 1  # a refusal is never retried
    assert [r["exit_code"] for r in _audit(tmp_path / "logs") if r["event"] == "command"] == [None]  # nothing ran


@pytest.mark.parametrize("setting", DISABLING.values(), ids=DISABLING.keys())
def test_user_ssh_config_cannot_turn_verification_off(write_runbook, sshd: SSHServer, tmp_path, setting) -> None:
    env = _home(tmp_path, config=f"Host *\n  {setting}\n")
    path = write_runbook(RUNBOOK, hosts=_host(sshd, ssh_config=None, known_hosts=None))
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), env=env)
    assert done.returncode == 1, done.stderr
    assert "not trusted" in done.stderr and TURN_OFF in done.stderr
    assert _attempts(tmp_path / "logs") == 1


def test_overridden_config_still_trusts_a_known_key_and_says_so(write_runbook, sshd: SSHServer, tmp_path) -> None:
    """`UserKnownHostsFile none` is replaced by ~/.ssh/known_hosts: a key there is trusted, with a note."""
    env = _home(tmp_path, config="Host *\n  UserKnownHostsFile none\n", known_hosts=sshd.known_hosts.read_text())
    path = write_runbook(RUNBOOK, hosts=_host(sshd, ssh_config=None, known_hosts=None))
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), env=env)
    assert done.returncode == 0, done.stderr
    assert "the ssh config says `UserKnownHostsFile none` for box (127.0.0.1): not honoured" in done.stderr
    assert _run_json(tmp_path / "logs")["host_key_unverified"] == []


def test_jump_host_key_is_verified_despite_its_ssh_config(write_runbook, sshd: SSHServer, tmp_path) -> None:
    """A ProxyJump host is connected by runbook itself, its key checked as the host's is: an ssh config
    saying `UserKnownHostsFile none` for it does not let an unknown jump host through."""
    proc, jump = start_sshd(tmp_path / "jump-sshd")
    try:
        config = tmp_path / "ssh_config"
        config.write_text(
            textwrap.dedent(f"""\
            Host jumpbox
              HostName 127.0.0.1
              Port {jump.port}
              User {jump.user}
              IdentityFile {jump.client_key}
              UserKnownHostsFile none
            """)
        )
        path = write_runbook(RUNBOOK, hosts=_host(sshd, ssh_config=config, proxy_jump="jumpbox"))
        done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), env=_home(tmp_path))
        assert done.returncode == 1, done.stderr
        assert "host key of jump host jumpbox of box not trusted" in done.stderr
        assert _attempts(tmp_path / "logs") == 1
        # with the jump host's key known (in the host's known_hosts), the jump is taken
        known = tmp_path / "known_hosts"
        key = " ".join((jump.root / "host_ed25519.pub").read_text().split()[:2])
        known.write_text(sshd.known_hosts.read_text() + f"[127.0.0.1]:{jump.port} {key}\n")
        path = write_runbook(RUNBOOK, hosts=_host(sshd, ssh_config=config, proxy_jump="jumpbox", known_hosts=known))
        done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs2"), env=_home(tmp_path))
        assert done.returncode == 0, done.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("what", ["does not exist", "is not a file"])
def test_missing_known_hosts_file_is_a_refusal_not_retried(write_runbook, sshd: SSHServer, tmp_path, what) -> None:
    missing = tmp_path / "no" / "known_hosts"
    if what == "is not a file":
        missing.mkdir(parents=True)
    path = write_runbook(RUNBOOK, hosts=_host(sshd, known_hosts=missing))
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), env=_home(tmp_path))
    assert done.returncode == 1, done.stderr
    assert f"its known_hosts file {missing} {what}" in done.stderr
    assert TURN_OFF in done.stderr
    assert _attempts(tmp_path / "logs") == 1


def test_missing_identity_file_is_named_not_retried_nor_blamed_on_the_network(
    write_runbook, sshd: SSHServer, tmp_path
) -> None:
    """A fresh controller has no ~/.ssh/id_ed25519 (the flagship's default): asyncssh's `No such file` was retried
    three times, then said to check the address, sshd, DNS and firewalls."""
    missing = tmp_path / "home" / ".ssh" / "id_ed25519"
    path = write_runbook(RUNBOOK, hosts=_host(sshd, identity_file=missing))
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), env=_home(tmp_path))
    assert done.returncode == 1, done.stderr
    said = " ".join(done.stderr.split())  # the console's lines joined where they were fitted to the width
    assert f"its identity_file {missing} does not exist on this machine" in said, said
    assert "set `identity_file:` of host box in the runbook or --inventory" in said, said
    assert "did not let this machine in" not in said and "attempt 2" not in said
    assert _attempts(tmp_path / "logs") == 1


def test_verification_off_from_inventory_is_warned_once_and_recorded(write_runbook, sshd: SSHServer, tmp_path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")  # the key is unknown: only verify_host_key: false lets it through
    path = write_runbook(RUNBOOK)
    inventory = tmp_path / "site.yaml"
    inventory.write_text(_host(sshd, known_hosts=empty, verify_host_key="false"))
    logs = tmp_path / "logs"
    done = runbook_cli("run", str(path), "--inventory", str(inventory), "--log-dir", str(logs), env=_home(tmp_path))
    assert done.returncode == 0, done.stderr
    warning = "box: host key verification is OFF (verify_host_key: false)"
    assert done.stderr.count(warning) == 1, done.stderr  # once, though two steps connect
    assert _run_json(logs)["host_key_unverified"] == ["box"]
    records = _audit(logs)
    unverified = [r for r in records if r["event"] == "host_key_unverified"]
    assert [r["host"] for r in unverified] == ["box"]
    assert records.index(unverified[0]) < min(i for i, r in enumerate(records) if r["event"] == "command")
    assert runbook_cli("audit", "verify", str(next(p for p in logs.iterdir() if p.is_dir()))).returncode == 0
    # the same runbook without the inventory verifies the key, and records nothing of the kind
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs2"), env=_home(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "verification is OFF" not in done.stderr
    assert _run_json(tmp_path / "logs2")["host_key_unverified"] == []
