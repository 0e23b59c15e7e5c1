"""How each tool runs N steps on given hosts: the same work, each tool's own way, timed alike.

Every `Runner` answers one question: how long does this tool take, from start to exit, to run the
scripts `scripts` in order as separate steps (each step on every host at once, the next step only
after the last one finished everywhere) against the real sshd servers `hosts`?

    runner.run(hosts, scripts) -> seconds

Hosts are `sandbox.sshd.SSHServer`s (real OpenSSH on 127.0.0.1); `bench.fleet.sshd_fleet(root,
count, shell)` starts as many as needed. Each runner writes its own inputs (runbook, playbook and inventory,
deploy file) into a fresh temporary folder first and times only the tool itself. A run that did not
finish cleanly (an exit status other than 0, a script whose own check failed) raises
`harness.ToolFailed` with the tool's words, so a tool that cannot do a thing is reported, not timed.
`missing()` says why a runner cannot be used on this machine (ansible-core or pyinfra not installed).

Every tool is given its fastest honest configuration: runbook as a user runs it (`python -m
executor.faces.cli run`), or its Engine in-process, each with the host's `runner` as chosen (the
persistent runner by default, or `exec`: one exec channel per command); runbook's SSH transport
alone, without the engine; one long-lived bash on one channel, the floor for a runner (issue 7);
a raw asyncssh loop (the floor: one connection per
host, one exec channel per command, nothing else); ansible-playbook with pipelining, ControlPersist,
no fact gathering, the interpreter set (no discovery) and forks = hosts; pyinfra with `--yes` and
`--parallel` = hosts.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import asyncssh
import yaml

from bench.harness import REPO, Stopwatch, ToolFailed
from executor.errors import TransportError
from executor.render import render_command
from executor.run import run_folder
from executor.run.engine import Engine, RunOptions
from executor.run.events import Reporter
from executor.runbook.loader import load_runbook
from executor.runbook.model import Host
from executor.transport import SSHTransport
from sandbox.sshd import SSHServer

#: Longest a tool may take for one run before it counts as failed.
RUN_TIMEOUT_S = 3600.0


def _tail(text: str, lines: int = 6, width: int = 400) -> str:
    """A tool's last words on one line; a long line keeps its start and its end, where the error is."""
    kept = [line.strip() for line in text.strip().splitlines()[-lines:] if line.strip()]
    half = width // 2
    return " | ".join(line if len(line) <= width else f"{line[:half]} ... {line[-half:]}" for line in kept)


def timed_subprocess(argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    """Run a tool to its end; its wall time, or `ToolFailed` with its last words."""
    with Stopwatch() as watch:
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ToolFailed(f"{Path(argv[0]).name} did not finish within {RUN_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise ToolFailed(f"exit {done.returncode}: {_tail(done.stdout + done.stderr)}")
    return watch.seconds


class Runner(abc.ABC):
    """A tool that runs steps on hosts. `name` labels its rows in the report."""

    name: str
    #: Runs in this Python process (its first run pays one-time imports and caches; a new process
    #: pays them every time, so only in-process runners need a warm-up before being timed).
    in_process = False

    def missing(self) -> str | None:
        """Why this runner cannot run on this machine, or None."""
        return None

    @abc.abstractmethod
    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        """Run each script as one step on all `hosts` at once, steps in order; wall seconds."""


# ---- the floor: raw asyncssh ---------------------------------------------------------------------


class AsyncsshRunner(Runner):
    """A runner driving asyncssh in this process: one connection per host, timed from connecting to
    closing; subclasses say what one run does with the connections."""

    in_process = True

    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        with Stopwatch() as watch:
            asyncio.run(self._run(hosts, scripts))
        return watch.seconds

    async def _run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> None:
        try:
            conns = await asyncio.gather(*(self._connect(server) for server in hosts))
        except (OSError, asyncssh.Error) as exc:
            raise ToolFailed(f"cannot connect: {exc}") from None
        try:
            await self._steps(conns, scripts)
        finally:
            for conn in conns:
                conn.close()
            await asyncio.gather(*(conn.wait_closed() for conn in conns), return_exceptions=True)

    @abc.abstractmethod
    async def _steps(self, conns: list[Any], scripts: Sequence[str]) -> None:
        """Run each script as one step on every connection at once, steps in order."""

    @staticmethod
    async def _connect(server: SSHServer) -> Any:
        return await asyncssh.connect(
            "127.0.0.1",
            port=server.port,
            username=server.user,
            client_keys=[str(server.client_key)],
            known_hosts=str(server.known_hosts),
            config=[str(server.root / "ssh_config")],
        )


class AsyncsshFloor(AsyncsshRunner):
    """One asyncssh connection per host, one exec channel per command, nothing else (in-process).

    By default the script is the exec request's command line, as `ssh host 'script'` sends it; with
    `stdin=True` the script follows on the channel's stdin, which no argument-length limit applies
    to, into a temporary file that bash then runs (`bash -s` would read a script from a pipe one
    byte per read(2): 124 ms for 256 KiB, against 28 ms this way). Timed from connecting to closing.
    """

    #: The command for `stdin=True`: the script from stdin to a file, run, removed.
    FROM_STDIN = 'f=$(mktemp) && cat > "$f" && bash "$f"; rc=$?; rm -f "$f"; exit $rc'

    def __init__(self, stdin: bool = False) -> None:
        self.stdin = stdin
        self.name = "raw asyncssh, script on stdin to a file" if stdin else "raw asyncssh (floor)"

    async def _steps(self, conns: list[Any], scripts: Sequence[str]) -> None:
        for script in scripts:
            await asyncio.gather(*(self._one(conn, script) for conn in conns))

    async def _one(self, conn: Any, script: str) -> None:
        try:
            if self.stdin:
                done = await conn.run(self.FROM_STDIN, input=script, check=False)
            else:
                done = await conn.run(script, check=False)
        except (OSError, asyncssh.Error) as exc:
            raise ToolFailed(f"the channel failed: {exc}") from None
        if done.exit_status != 0:
            raise ToolFailed(f"exit {done.exit_status}: {_tail(str(done.stderr or ''))}")


# ---- runbook -------------------------------------------------------------------------------------


class _RunbookDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Writes YAML as a person would: multi-line scripts as literal blocks (`script: |`).
    libyaml's dumper where PyYAML has it: it writes 13 MB of scripts in a tenth of a second."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_RunbookDumper.add_representer(str, _text)


HostRunner = Literal["persistent", "exec"]


def runner_label(runner: HostRunner) -> str:
    """How a row names the host's `runner` setting; the default one goes unnamed."""
    return "" if runner == "persistent" else ", runner: exec"


def write_runbook(
    folder: Path, hosts: Sequence[SSHServer], scripts: Sequence[str], runner: HostRunner = "persistent"
) -> Path:
    """A runbook with hosts h0..hN-1 and one `shell` step per script on all of them.

    One attempt per step (a failure is reported, not retried) and `max_parallel` = hosts, so that
    every step runs on all hosts at once, as the other tools are told to. `runner: exec` is written
    only when asked for: the default is what users get.
    """
    chosen = {} if runner == "persistent" else {"runner": runner}
    document = {
        "name": "bench",
        "hosts": {
            f"h{i}": {**server.host_dict(), "connect_timeout": "60s", **chosen} for i, server in enumerate(hosts)
        },
        "defaults": {"timeout": "10m", "retry": {"attempts": 1}, "max_parallel": max(1, len(hosts))},
        "steps": [{"id": f"s{i}", "kind": "shell", "hosts": "all", "script": s} for i, s in enumerate(scripts)],
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.dump(document, Dumper=_RunbookDumper, sort_keys=False, width=1 << 30))
    return path


def cli_module(tree: Path) -> str:
    """The module that is a checkout's CLI: `executor.faces.cli`, or `executor.cli` in a checkout from before
    executor/ had its rooms (issue 28), so that `--before` measures against such a tree too."""
    return "executor.faces.cli" if (tree / "executor" / "faces" / "cli.py").exists() else "executor.cli"


class RunbookCLI(Runner):
    """runbook as a user runs it: `python -m executor.faces.cli run FILE --log-dir DIR`, a new process
    each time (interpreter start and imports included), audit log and state store on.

    `tree`: another checkout of runbook to run instead of this one (its folder first on PYTHONPATH),
    so that one interleaved run measures a change before and after (`python -m bench --before TREE`)."""

    def __init__(self, runner: HostRunner = "persistent", tree: Path | None = None) -> None:
        self.runner = runner
        self.tree = tree
        self.name = f"runbook (CLI{runner_label(runner)})" + (f", before: {tree}" if tree else "")

    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        with tempfile.TemporaryDirectory(prefix="bench-runbook-") as tmp:
            path = write_runbook(Path(tmp), hosts, scripts, self.runner)
            argv = [
                sys.executable,
                "-m",
                cli_module(self.tree or REPO),
                "run",
                str(path),
                "--log-dir",
                str(Path(tmp) / "logs"),
            ]
            if self.tree is None:
                return timed_subprocess(argv, cwd=REPO)
            return timed_subprocess(argv, cwd=self.tree, env={"PYTHONPATH": str(self.tree)})


class NoAudit:
    """Stands in for executor.run.audit.AuditLog in a run with the audit log off: records nothing,
    writes no file. Only `RunbookEngine(audit=False)` uses it, to price the audit log; runbook
    itself has no such switch."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        """Takes what AuditLog takes, and keeps nothing."""

    def command(self, *_args: Any) -> None:
        """Drop a command record."""

    def transfer(self, *_args: Any) -> None:
        """Drop a transfer record."""

    #: (records written, last hash) as an empty log's: nothing is ever written
    position = (0, "")

    def finish(self) -> None:
        """No head to make durable."""

    def close(self) -> None:
        """Nothing to close."""


class RunbookEngine(Runner):
    """runbook's Engine in this process (no interpreter start, no reporter output): load the
    runbook, then `Engine.run()`. With `audit=False` the engine's AuditLog is swapped for `NoAudit`
    for the run (a patch of `executor.run.run_folder.AuditLog`), the "build with the audit log off"."""

    in_process = True

    def __init__(self, audit: bool = True, runner: HostRunner = "persistent") -> None:
        self.audit = audit
        self.runner = runner
        self.name = f"runbook (in-process{'' if audit else ', audit log off'}{runner_label(runner)})"

    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
            path = write_runbook(Path(tmp), hosts, scripts, self.runner)
            options = RunOptions(log_dir=Path(tmp) / "logs")
            swap = contextlib.nullcontext() if self.audit else mock.patch.object(run_folder, "AuditLog", NoAudit)
            with swap, Stopwatch() as watch:
                code = asyncio.run(Engine(load_runbook(path), options, Reporter()).run())
        if code != 0:
            raise ToolFailed(f"the run ended with exit code {code}")
        return watch.seconds


class RunbookTransport(Runner):
    """runbook's SSH transport alone (in-process): `SSHTransport.run` of each rendered script, no
    engine, no audit log; the per-command cost of the way commands reach the host. Timed from
    connecting (and starting the runner, where used) to closing."""

    in_process = True

    def __init__(self, runner: HostRunner) -> None:
        self.runner = runner
        self.name = (
            "runbook transport, persistent runner" if runner == "persistent" else "runbook transport, exec channels"
        )

    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        with Stopwatch() as watch:
            asyncio.run(self._run(hosts, scripts))
        return watch.seconds

    async def _run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> None:
        transports = [
            SSHTransport(f"h{i}", Host.model_validate({**server.host_dict(), "runner": self.runner}))
            for i, server in enumerate(hosts)
        ]
        try:
            await asyncio.gather(*(t.connect() for t in transports))
            for script in scripts:
                command = render_command(script, {})
                for result in await asyncio.gather(*(t.run(command, RUN_TIMEOUT_S) for t in transports)):
                    if result.exit_code != 0:
                        raise ToolFailed(f"exit {result.exit_code}: {_tail(result.stderr_text)}")
            if self.runner == "persistent" and any(t.runner_unavailable for t in transports):
                raise ToolFailed(f"no runner: {next(t.runner_unavailable for t in transports if t.runner_unavailable)}")
        except TransportError as exc:
            raise ToolFailed(str(exc)) from None
        finally:
            await asyncio.gather(*(t.close() for t in transports))


class LongLivedBash(AsyncsshRunner):
    """The floor for a persistent runner (issue 7): one asyncssh connection per host, one channel
    running one `bash` for the whole run, each script written to its stdin followed by a line that
    echoes a marker and the exit status, read back before the next script. With `fork` (the floor
    the issue defines: one round trip plus one fork/exec) the long-lived bash runs each script as a
    child `bash -c SCRIPT`, as any runner must run a step as a process of its own; without, the
    script runs inside the long-lived bash itself (`true` is a builtin: a round trip and nothing
    else). No separate streams, no timeout, no isolation. Timed from connecting to closing."""

    def __init__(self, fork: bool = True) -> None:
        self.fork = fork
        self.name = (
            "one long-lived bash on one channel, a child bash per command (runner floor)"
            if fork
            else "one long-lived bash on one channel, commands run inside it"
        )

    async def _steps(self, conns: list[Any], scripts: Sequence[str]) -> None:
        try:
            shells = await asyncio.gather(
                *(conn.create_process("exec bash --noprofile --norc", encoding=None) for conn in conns)
            )
            for number, script in enumerate(scripts):
                marker = f"__bench_done_{number}_".encode()
                line = shlex.join(["bash", "--norc", "-c", script]) + " < /dev/null" if self.fork else script
                await asyncio.gather(*(self._one(shell, line, marker) for shell in shells))
        except (OSError, asyncssh.Error, asyncio.IncompleteReadError) as exc:
            raise ToolFailed(f"the shell's channel failed: {exc}") from None

    @staticmethod
    async def _one(shell: Any, script: str, marker: bytes) -> None:
        shell.stdin.write(script.encode() + b"\necho " + marker + b"$?\n")
        await shell.stdout.readuntil(marker)  # whatever came before (the login shell's noise) is skipped
        status = (await shell.stdout.readline()).strip()
        if status != b"0":
            raise ToolFailed(f"exit {status.decode(errors='replace')}")


# ---- ansible-playbook ----------------------------------------------------------------------------


def _close_control_masters(folder: Path) -> None:
    """Stop the ControlPersist masters a run left in `folder` (each would linger otherwise)."""
    for socket_path in folder.iterdir() if folder.exists() else ():
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "bench"],
            capture_output=True,
            timeout=30,
            check=False,
        )


class Ansible(Runner):
    """ansible-playbook from ansible-core with a generated inventory, ansible.cfg and playbook.

    `module="shell"`: each step is a `shell` task (bash) with the script inline, its nearest
    equivalent of a runbook step. `module="script"`: each step is a `script` task, which copies the
    script to the host as a file and runs it. Every run gets a fresh ControlPath folder, so each
    run opens its own connections (as every other tool does) and then reuses them.
    """

    def __init__(self, module: Literal["shell", "script"] = "shell") -> None:
        self.module = module
        self.name = "ansible-playbook" if module == "shell" else "ansible-playbook, `script` module (copy, then run)"

    def missing(self) -> str | None:
        if shutil.which("ansible-playbook") is None:
            return "ansible-playbook not found: install ansible-core (`pip install -e '.[bench]'`)"
        return None

    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        # Short folder: ControlPath is a unix socket path, limited to about 100 bytes.
        tmp = Path(tempfile.mkdtemp(prefix="rbb-", dir="/tmp"))
        control = tmp / "cp"
        try:
            self._write(tmp, hosts, scripts)
            return timed_subprocess(
                [shutil.which("ansible-playbook") or "ansible-playbook", "playbook.yml"],
                cwd=tmp,
                env={"ANSIBLE_CONFIG": str(tmp / "ansible.cfg")},
            )
        finally:
            _close_control_masters(control)
            shutil.rmtree(tmp, ignore_errors=True)

    def _write(self, tmp: Path, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> None:
        known = tmp / "known_hosts"
        known.write_text("".join(server.known_hosts.read_text() for server in hosts))
        (tmp / "inventory.ini").write_text(
            "[bench]\n"
            + "".join(
                f"h{i} ansible_host=127.0.0.1 ansible_port={s.port} ansible_user={s.user} "
                f"ansible_ssh_private_key_file={s.client_key}\n"
                for i, s in enumerate(hosts)
            )
        )
        ssh_config = hosts[0].root / "ssh_config"  # empty: keeps ~/.ssh/config out, as for runbook
        (tmp / "ansible.cfg").write_text(
            "[defaults]\n"
            f"inventory = {tmp / 'inventory.ini'}\n"
            f"forks = {max(1, len(hosts))}\n"
            "gathering = explicit\n"
            "host_key_checking = True\n"
            "interpreter_python = /usr/bin/python3\n"
            "retry_files_enabled = False\n"
            f"local_tmp = {tmp / 'local'}\n"
            "[ssh_connection]\n"
            "pipelining = True\n"
            f"control_path_dir = {tmp / 'cp'}\n"
            f"ssh_args = -F {ssh_config} -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes "
            "-o ControlMaster=auto -o ControlPersist=120s\n"
        )
        # Written as YAML by hand for the `!unsafe` tag: a script is data, never a Jinja template
        # (base64 text holds "{#" often enough). A JSON string is a valid YAML double-quoted scalar.
        # The tag only where needed, as a user would: ansible-core 2.19 reads `!unsafe "true"` as a bool.
        lines = ["- hosts: all", "  gather_facts: false", "  tasks:"]
        for i, script in enumerate(scripts):
            if self.module == "shell":
                tag = "!unsafe " if any(mark in script for mark in ("{{", "{%", "{#")) else ""
                lines += [f"  - name: s{i}", "    ansible.builtin.shell:", f"      cmd: {tag}{json.dumps(script)}"]
            else:
                file = tmp / f"s{i}.sh"
                file.write_text(script)
                lines += [f"  - name: s{i}", "    ansible.builtin.script:", f"      cmd: {json.dumps(str(file))}"]
            lines.append("      executable: /bin/bash")
        (tmp / "playbook.yml").write_text("\n".join(lines) + "\n")


# ---- pyinfra -------------------------------------------------------------------------------------


class Pyinfra(Runner):
    """pyinfra with a generated inventory.py and deploy.py, `--yes` (no prompt, no change check)
    and `--parallel` = hosts.

    `operation="shell"`: each step is `server.shell` with the script inline (run by bash);
    `operation="script"`: each step is `server.script`, which uploads the script and runs it.
    """

    def __init__(self, operation: Literal["shell", "script"] = "shell") -> None:
        self.operation = operation
        self.name = "pyinfra" if operation == "shell" else "pyinfra, `server.script` (upload, then run)"

    def missing(self) -> str | None:
        if shutil.which("pyinfra") is None:
            return "pyinfra not found: install it (`pip install -e '.[bench]'`)"
        return None

    def run(self, hosts: Sequence[SSHServer], scripts: Sequence[str]) -> float:
        with tempfile.TemporaryDirectory(prefix="bench-pyinfra-") as name:
            tmp = Path(name)
            inventory = [
                (
                    f"h{i}",
                    {
                        "ssh_hostname": "127.0.0.1",
                        "ssh_port": s.port,
                        "ssh_user": s.user,
                        "ssh_key": str(s.client_key),
                        "ssh_known_hosts_file": str(s.known_hosts),
                        "ssh_strict_host_key_checking": "yes",
                        "ssh_config_file": str(s.root / "ssh_config"),
                        "ssh_allow_agent": False,
                        "ssh_look_for_keys": False,
                    },
                )
                for i, s in enumerate(hosts)
            ]
            (tmp / "inventory.py").write_text(f"hosts = {inventory!r}\n")
            files = []
            for i, script in enumerate(scripts):
                file = tmp / f"s{i}.sh"
                file.write_text(script)
                files.append(str(file))
            if self.operation == "shell":
                body = 'server.shell(name=f"s{i}", commands=[Path(path).read_text()], _shell_executable="bash")'
            else:
                body = 'server.script(name=f"s{i}", src=path)'
            (tmp / "deploy.py").write_text(
                "from pathlib import Path\n\n"
                "from pyinfra.operations import server\n\n"
                f"for i, path in enumerate({files!r}):\n"
                f"    {body}\n"
            )
            argv = [
                shutil.which("pyinfra") or "pyinfra",
                "inventory.py",
                "deploy.py",
                "--yes",
                "--parallel",
                str(max(1, len(hosts))),
            ]
            return timed_subprocess(argv, cwd=tmp)
