"""A connection that cannot be made says what to check (the address:port it tried, sshd, DNS, a firewall) once
with the step's failure, not with each attempt; no command without an exit status is shown as `exit None`
(console, status, audit show); the host-key hint's command works on a controller with no ~/.ssh; and
`runbook trust-host` shows the key a host presents and records it only with `--fingerprint` (matching) or
`--yes`, never waiting for a person. Through the CLI; the test sshd only where a key is read."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import asyncssh
import pytest

from sandbox.sshd import SSHServer, free_port
from tests.clirun import runbook_cli

BOOK = """\
name: reach
hosts:
  box:
    address: 127.0.0.1
    port: {port}
{more}defaults: {{retry: {{attempts: 3, delay: 10ms}}}}
steps:
  - {{id: hello, kind: shell, script: echo hi}}
"""


def _book(tmp_path: Path, port: int, more: str = "") -> Path:
    path = tmp_path / "book.yaml"
    path.write_text(BOOK.format(port=port, more=more))
    return path


def test_a_refused_connection_says_what_to_check_once_and_never_exit_none(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    book, logs = _book(tmp_path, port), str(tmp_path / "logs")
    done = runbook_cli("run", str(book), "--log-dir", logs)
    assert done.returncode == 1
    check = f"to check: nothing accepts connections on 127.0.0.1:{port}: that sshd runs on the host"
    assert done.stderr.count(check) == 1, done.stderr  # once, though each of the 3 attempts failed
    assert done.stderr.count("attempt 3 failed: transport error: cannot connect to box") == 1
    status = runbook_cli("status", "--log-dir", logs, env={"COLUMNS": "400"})
    (step,) = json.loads(runbook_cli("status", "--json", "--log-dir", logs).stdout)["steps"]
    assert step["message"].count(check) == 1 and step["attempts"] == 3
    (run_dir,) = (tmp_path / "logs").iterdir()
    shown = runbook_cli("audit", "show", str(run_dir)).stdout
    assert shown.count("no exit status") == 3
    for said in (done.stdout, done.stderr, status.stdout, shown):
        assert "exit None" not in said


def test_a_name_that_does_not_resolve_is_said_to_be_the_address_or_dns() -> None:
    """Said of the resolver's own error (a test resolves no name: loopback only)."""
    from executor.transport.ssh import reach_check

    said = reach_check(socket.gaierror(-2, "Name or service not known"), "box", ("gpu-box.example", 22))
    assert said.startswith("to check: gpu-box.example does not resolve: the address (`address:`/`port:` of host box")
    assert said.endswith("and this machine's DNS")


def _home(tmp_path: Path) -> dict[str, str]:
    """A controller that has never used SSH: HOME without ~/.ssh."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home)}


def _sshd_book(tmp_path: Path, sshd: SSHServer) -> Path:
    more = f"    user: {sshd.user}\n    identity_file: {sshd.client_key}\n    ssh_config: {sshd.root / 'ssh_config'}\n"
    return _book(tmp_path, sshd.port, more)


def test_the_host_key_hint_pasted_on_a_fresh_controller_trusts_the_key(sshd: SSHServer, tmp_path: Path) -> None:
    env, book, logs = _home(tmp_path), _sshd_book(tmp_path, sshd), str(tmp_path / "logs")
    refused = runbook_cli("run", str(book), "--log-dir", logs, env=env)
    assert refused.returncode == 1 and "not trusted" in refused.stderr
    assert "`runbook trust-host RUNBOOK box`" in refused.stderr
    known = f"{env['HOME']}/.ssh/known_hosts"
    pasted = re.search(r"or run: (mkdir -p \S+ && ssh-keyscan .*? >> \S+) \(", refused.stderr)
    assert pasted is not None and pasted.group(1).endswith(f">> {known}"), refused.stderr
    subprocess.run(["bash", "-c", pasted.group(1)], env={**os.environ, **env}, check=True, capture_output=True)
    assert runbook_cli("run", str(book), "--log-dir", logs, env=env).returncode == 0


def test_trust_host_shows_the_fingerprint_and_records_it_only_when_told(sshd: SSHServer, tmp_path: Path) -> None:
    env, book = _home(tmp_path), _sshd_book(tmp_path, sshd)
    known = Path(env["HOME"]) / ".ssh" / "known_hosts"
    shown = runbook_cli("trust-host", str(book), "box", env=env)
    assert shown.returncode == 1 and not known.exists()  # shown, not recorded: nothing waited for an answer
    fingerprint = re.search(r"presents the ssh-ed25519 key (SHA256:\S+)", shown.stdout)
    assert fingerprint is not None, shown.stdout
    assert f"runbook trust-host {book} box --fingerprint {fingerprint.group(1)}" in shown.stdout
    not_it = "SHA256:" + "A" * 43  # a fingerprint, of another key
    wrong = runbook_cli("trust-host", str(book), "box", "--fingerprint", not_it, env=env)
    assert wrong.returncode == 1 and "not the key you gave" in wrong.stdout and not known.exists()

    taken = runbook_cli("trust-host", str(book), "box", "--fingerprint", fingerprint.group(1), env=env)
    assert taken.returncode == 0 and f"recorded in {known}" in taken.stdout, taken.stdout
    assert oct(known.parent.stat().st_mode & 0o777) == "0o700" and oct(known.stat().st_mode & 0o777) == "0o600"
    assert known.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert runbook_cli("run", str(book), "--log-dir", str(tmp_path / "logs"), env=env).returncode == 0
    again = runbook_cli("trust-host", str(book), "box", "--yes", env=env)
    assert again.returncode == 0 and "already trusted" in again.stdout and len(known.read_text().splitlines()) == 1

    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()  # the host's key changed
    known.write_text(f"[127.0.0.1]:{sshd.port} {other}")
    changed = runbook_cli("trust-host", str(book), "box", "--yes", env=env)
    assert changed.returncode == 1, changed.stdout
    assert f"ssh-keygen -f {known} -R '[127.0.0.1]:{sshd.port}'" in changed.stdout


def test_trust_host_refuses_a_host_it_cannot_use(sshd: SSHServer, tmp_path: Path) -> None:
    book = _sshd_book(tmp_path, sshd)
    missing = runbook_cli("trust-host", str(book), "bx", env=_home(tmp_path))
    assert missing.returncode == 2 and "'bx' is no host of it (its hosts: box)" in missing.stderr
    closed = free_port()
    book.write_text(book.read_text().replace(f"port: {sshd.port}", f"port: {closed}"))
    refused = runbook_cli("trust-host", str(book), "box", env={"HOME": str(tmp_path / "home")})
    assert refused.returncode == 1 and f"to check: nothing accepts connections on 127.0.0.1:{closed}" in refused.stderr


def test_trust_host_says_why_it_cannot_record_where_known_hosts_is_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A known_hosts that is a folder, a FIFO (whose open would wait for a reader forever), or under a file: exit 1
    with a line naming it, not a traceback or a hang. The key is offered in-process (no sshd: nothing is read)."""
    from executor.transport.ssh import OfferedKey, SSHTransport

    key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("")
    env = _home(tmp_path)
    for known in ("folder", "fifo", "file/known_hosts"):
        path = str(tmp_path / known)

        async def offered(self: SSHTransport, file: str = path) -> OfferedKey:
            return OfferedKey(key, "127.0.0.1", 2222, file)

        monkeypatch.setattr(SSHTransport, "offered_key", offered)
        said = runbook_cli("trust-host", str(_book(tmp_path, 2222)), "box", "--yes", env=env)
        assert said.returncode == 1 and "Traceback" not in said.stderr, said.stderr
        assert said.stderr.startswith(f"runbook: cannot record the key in {path}: "), said.stderr


def test_trust_host_takes_an_md5_fingerprint_and_refuses_text_that_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the key's own MD5 fingerprint (`ssh-keygen -E md5`) and text that is no fingerprint at all were both
    "not the key you gave; ask the host's owner", a changed key. Now the MD5 form records it, and no fingerprint
    is a usage error (exit 2) before the host is asked. The key is offered in-process (no sshd)."""
    from executor.transport.ssh import OfferedKey, SSHTransport

    key = asyncssh.generate_private_key("ssh-ed25519")
    known = tmp_path / "known_hosts"

    async def offered(self: SSHTransport) -> OfferedKey:
        return OfferedKey(key, "127.0.0.1", 2222, str(known))

    monkeypatch.setattr(SSHTransport, "offered_key", offered)
    book, env = str(_book(tmp_path, 2222)), _home(tmp_path)
    bare = key.get_fingerprint("sha256").removeprefix("SHA256:")
    for given in (bare, "garbage", "SHA256:" + bare + "x"):
        refused = runbook_cli("trust-host", book, "box", "--fingerprint", given, env=env)
        assert refused.returncode == 2 and "is no fingerprint: give it as `ssh-keygen -lf" in refused.stderr
        assert not known.exists()
    md5 = runbook_cli("trust-host", book, "box", "--fingerprint", key.get_fingerprint("md5"), env=env)
    assert md5.returncode == 0 and f"recorded in {known}" in md5.stdout, md5.stdout
