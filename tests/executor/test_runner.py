"""The persistent runner (executor/transport/runner.py, runner_host.py) against real sshd servers.

The transport suite (test_transport.py) runs every transport test against the runner and the
exec path both; these tests are about what only the runner has: one shell start-up per connection
whatever the host's ~/.bashrc prints or costs (the noisy test host, sandbox/testhost.py), several
commands multiplexed over one channel, a runner that dies or loses its connection, and the
fallback to the exec path on a host that cannot run it.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.diagnostics import DEBUG_FILE, DebugLog
from executor.errors import TransportError
from executor.redact import NO_SECRETS
from executor.render import render_command
from executor.runbook.model import Host
from executor.transport import SSHTransport
from executor.transport import runner_host as host_program
from executor.transport.base import CommandResult
from sandbox import testhost as sandbox_host
from sandbox.sshd import SSHServer, start_sshd
from tests.clirun import runbook_cli
from tests.conftest import SandboxHost
from tests.executor.test_engine import audit_records, run, status
from tests.executor.test_transport import live_pids, sleeper, wait_until

__all__ = ["sleeper"]  # a fixture of the transport suite, used here too

RUNNERS = ["persistent", "exec"]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def noisy(testhost: Callable[..., SandboxHost]) -> SandboxHost:
    """The test host whose ~/.bashrc is slow, chatty on both streams and changes the environment."""
    return testhost("h200", shell="noisy")


def transport_to(server: SSHServer, runner: str = "persistent") -> SSHTransport:
    return SSHTransport("box", Host(**server.host_dict(), runner=runner))


def run_one(loop: asyncio.Runner, transport: SSHTransport, script: str, timeout: float = 30) -> CommandResult:
    return loop.run(transport.run(render_command(script, {"V": "it's"}), timeout))


def bashrc_runs(host: SandboxHost) -> int:
    runs = host.home / sandbox_host.NOISY_RUNS
    return len(runs.read_bytes()) if runs.exists() else 0


# --- the login shell's start-up: paid once, never heard ------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_noisy_login_shell_and_the_step(noisy: SandboxHost, loop: asyncio.Runner, runner: str) -> None:
    """Both ways run the step in the environment the login shell made; only the exec path lets the
    shell's output into the step's (it prints before the wrapper starts), the runner never does."""
    transport = transport_to(noisy.server, runner)
    try:
        result = run_one(
            loop, transport, 'echo out; echo err >&2; printenv RUNBOOK_TESTHOST_BASHRC V; echo "$PATH"; exit 3'
        )
    finally:
        loop.run(transport.close())
    shell_path = f"{noisy.home / sandbox_host.NOISY_PATH_DIR}:"
    step_out = f"out\n{sandbox_host.NOISY_EXPORT[1]}\nit's\n".encode()
    leaked_out, leaked_err = (
        (b"", b"") if runner == "persistent" else (sandbox_host.NOISY_STDOUT, sandbox_host.NOISY_STDERR)
    )
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout.startswith(leaked_out + step_out)
    assert result.stdout.removeprefix(leaked_out + step_out).decode().startswith(shell_path)
    assert result.stderr == leaked_err + b"err\n"


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_runner_runs_the_login_shell_once_per_connection(
    noisy: SandboxHost, loop: asyncio.Runner, runner: str
) -> None:
    transport = transport_to(noisy.server, runner)
    before = bashrc_runs(noisy)
    try:
        loop.run(transport.connect())
        started = time.monotonic()
        results = [run_one(loop, transport, "echo $$") for _ in range(5)]
        elapsed = time.monotonic() - started
    finally:
        loop.run(transport.close())
    assert all(r.exit_code == 0 for r in results)
    if runner == "persistent":
        assert bashrc_runs(noisy) - before == 1
        assert elapsed < 5 * sandbox_host.NOISY_BASHRC_SLEEP_S  # the exec path cannot be this fast here
        assert all(r.stdout.strip().isdigit() for r in results)
    else:
        assert bashrc_runs(noisy) - before == 5
        assert elapsed >= 5 * sandbox_host.NOISY_BASHRC_SLEEP_S


def _normalised(output: bytes) -> str:
    """A step's view of itself, without what differs between any two runs (pids, temp names, ports)."""
    text = output.decode()
    text = re.sub(r"runbook\.[A-Za-z0-9]+", "runbook.TMP", text)
    text = re.sub(r"pipe:\[\d+\]", "pipe", text)
    text = re.sub(r"(SSH_CLIENT|SSH_CONNECTION)=.*", r"\1=...", text)
    return re.sub(r'PPID="\d+"', 'PPID="..."', text)


STEP_SELF_PORTRAIT = r"""
env | sort
echo "umask $(umask) cwd $(pwd) flags $-"
grep -E '^Sig(Ign|Cgt):' /proc/$$/status
ps -o sid=,pgid= -p $$ | awk -v pid=$$ '{print ($1 == pid) " " ($2 == pid)}'
ulimit -a
for fd in /proc/$$/fd/*; do echo "${fd##*/} -> $(readlink "$fd")"; done; unset fd
shopt; set -o
changing='BASH_ARGV|BASH_ARGC|BASHPID|SRANDOM|RANDOM|_|EPOCH[A-Z]*|SECONDS|LINENO|BASH_LINENO'
declare -p | grep -vE "^declare -[a-zA-Z-]+ ($changing)="; unset changing
tr '\0' ' ' < /proc/$$/cmdline; echo
"""


def test_a_step_runs_alike_through_the_runner_and_the_exec_path(noisy: SandboxHost, loop: asyncio.Runner) -> None:
    """Environment, umask, working folder, signal dispositions, session, limits, open files, shell
    options and variables, command line: the step cannot tell which way it came."""
    views = {}
    for runner in RUNNERS:
        transport = transport_to(noisy.server, runner)
        try:
            result = run_one(loop, transport, STEP_SELF_PORTRAIT)
        finally:
            loop.run(transport.close())
        assert result.exit_code == 0, result.stderr
        views[runner] = _normalised(
            result.stdout.removeprefix(b"" if runner == "persistent" else sandbox_host.NOISY_STDOUT)
        )
    assert "RUNBOOK_TESTHOST_BASHRC=sourced" in views["persistent"]
    assert "\n1 1\n" in views["persistent"]  # its own session and group
    difference = difflib.unified_diff(views["exec"].splitlines(), views["persistent"].splitlines(), lineterm="")
    assert views["persistent"] == views["exec"], "\n".join(difference)


def test_the_runner_keeps_no_vars_file_on_the_host(noisy: SandboxHost, loop: asyncio.Runner) -> None:
    """The runner puts the vars straight into the script's bash's environment (one bash start, not
    the wrapper's two): the step's folder holds its script alone, and no secret is written to disk."""
    transport = transport_to(noisy.server)
    script = 'ls -A "$(dirname "$0")"; printenv TOKEN; grep -rlF -- "$TOKEN" "$(dirname "$0")" || echo none'
    try:
        result = loop.run(transport.run(render_command(script, {}, {"TOKEN": "s3cret-value"}), 30))
    finally:
        loop.run(transport.close())
    assert (result.exit_code, result.stdout) == (0, b"script\ns3cret-value\nnone\n"), result.stderr


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_path_var_without_bash_fails_alike(sshd: SSHServer, loop: asyncio.Runner, runner: str) -> None:
    """The wrapper finds the script's bash on the step's PATH (`exec bash`), and so does the runner."""
    transport = transport_to(sshd, runner)
    try:
        result = loop.run(transport.run(render_command("echo never", {"PATH": "/nonexistent"}), 30))
    finally:
        loop.run(transport.close())
    assert (result.exit_code, result.stdout, result.stderr) == (
        127,
        b"",
        b"runbook-step: line 1: exec: bash: not found\n",
    )


# --- several commands on one runner -------------------------------------------------------


def test_commands_share_one_runner_side_by_side(sshd: SSHServer, loop: asyncio.Runner) -> None:
    """A long command streams its output (a download's) while short ones (its progress poll) come and go."""
    transport = transport_to(sshd)
    chunks: list[tuple[float, bytes]] = []

    async def scenario() -> tuple[CommandResult, list[CommandResult], float]:
        long = asyncio.ensure_future(
            transport.run(
                render_command("echo $PPID; for i in $(seq 1 10); do echo tick $i; sleep 0.2; done", {}),
                30,
                lambda _name, chunk: chunks.append((time.monotonic(), chunk)),
            )
        )
        await asyncio.sleep(0.3)
        shorts = [await transport.run(render_command("echo $PPID", {}), 30) for _ in range(5)]
        shorts_done = time.monotonic()
        return await long, shorts, shorts_done

    try:
        long, shorts, shorts_done = loop.run(scenario())
    finally:
        loop.run(transport.close())
    runner_pid = long.stdout.split(b"\n")[0]
    assert [r.stdout for r in shorts] == [runner_pid + b"\n"] * 5  # one runner served them all
    assert long.stdout.split(b"\n")[1:] == [b"tick %d" % i for i in range(1, 11)] + [b""]
    assert shorts_done < chunks[-1][0]  # the short ones finished while the long one still ran
    assert len(chunks) >= 5  # its output arrived as it was printed


def test_concurrent_large_outputs_are_not_mixed(sshd: SSHServer, loop: asyncio.Runner) -> None:
    transport = transport_to(sshd)
    size = 1 << 20
    script = 'head -c {n} /dev/zero | tr "\\0" "{c}"; head -c {n} /dev/zero | tr "\\0" "{e}" >&2'

    async def many() -> list[CommandResult]:
        return await asyncio.gather(
            *(transport.run(render_command(script.format(n=size, c=c, e=c.upper()), {}), 60) for c in "abcdef")
        )

    try:
        results = loop.run(many())
    finally:
        loop.run(transport.close())
    for c, result in zip("abcdef", results, strict=True):
        assert result.exit_code == 0
        assert result.stdout_sha256 == hashlib.sha256(c.encode() * size).hexdigest()
        assert result.stderr_sha256 == hashlib.sha256(c.upper().encode() * size).hexdigest()


def test_a_step_that_ignores_term_is_killed_and_the_runner_serves_on(sshd: SSHServer, loop: asyncio.Runner) -> None:
    """A timed-out step that ignores TERM gets KILL after the grace and is reported as killed; the
    runner, and the command running beside it, carry on (no deadline left must not stop its loop)."""
    transport = transport_to(sshd)

    started = asyncio.Event()

    async def scenario() -> tuple[CommandResult, CommandResult]:
        beside = asyncio.ensure_future(
            transport.run(render_command("echo $PPID; sleep 5; echo done", {}), 30, lambda _n, _c: started.set())
        )
        await asyncio.wait_for(started.wait(), 30)  # the runner is up: the 0.5 s below is the step's, not connecting's
        stubborn = await transport.run(render_command("trap '' TERM; sleep 30", {}), 0.5)
        return stubborn, await beside

    try:
        stubborn, beside = loop.run(scenario())
        again = run_one(loop, transport, "echo $PPID")
    finally:
        loop.run(transport.close())
    assert stubborn.timed_out and stubborn.exit_code == 128 + signal.SIGKILL
    assert beside.exit_code == 0 and beside.stdout.endswith(b"\ndone\n")
    assert again.stdout == beside.stdout.split(b"\n")[0] + b"\n"  # the same runner


# --- a runner that dies, a connection that drops ------------------------------------------


def test_a_killed_runner_fails_the_command_and_its_step_dies_too(
    sshd: SSHServer, loop: asyncio.Runner, sleeper: Callable[[], str]
) -> None:
    """The command in flight fails with a transport error carrying its partial output (never a
    result), the runner's guard stops the orphaned step, and the next command gets a new runner."""
    transport = transport_to(sshd)
    long_sleep = sleeper()
    seen: list[bytes] = []

    async def scenario() -> TransportError:
        task = asyncio.ensure_future(
            transport.run(
                render_command(f"echo $PPID\n{long_sleep} &\nwait\necho never\n", {}),
                60,
                lambda _name, chunk: seen.append(chunk),
            )
        )
        for _ in range(200):
            if seen and live_pids(cmdline=long_sleep):
                break
            await asyncio.sleep(0.05)
        os.kill(int(seen[0].split(b"\n")[0]), signal.SIGKILL)
        with pytest.raises(TransportError) as caught:
            await task
        return caught.value

    try:
        error = loop.run(scenario())
        runner_pid = seen[0].split(b"\n")[0]
        assert error.partial_stdout == runner_pid + b"\n"
        assert "runner" in str(error) and "killed by signal" in str(error)
        assert wait_until(lambda: not live_pids(cmdline=long_sleep), 5), "the step outlived its runner"
        again = run_one(loop, transport, "echo $PPID")
        assert again.exit_code == 0 and again.stdout not in (b"", runner_pid + b"\n")
    finally:
        loop.run(transport.close())


def test_a_dropped_connection_fails_the_command_and_the_next_one_reconnects(
    sshd: SSHServer, loop: asyncio.Runner, sleeper: Callable[[], str]
) -> None:
    transport = transport_to(sshd)
    long_sleep = sleeper()
    seen: list[bytes] = []

    async def scenario() -> TransportError:
        task = asyncio.ensure_future(
            transport.run(render_command(f"echo $PPID\n{long_sleep}\n", {}), 60, lambda _n, c: seen.append(c))
        )
        for _ in range(200):
            if seen and live_pids(cmdline=long_sleep):
                break
            await asyncio.sleep(0.05)
        runner_pid = int(seen[0].split(b"\n")[0])
        session = int(Path(f"/proc/{runner_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(session, signal.SIGKILL)  # the sshd process serving this connection
        with pytest.raises(TransportError) as caught:
            await task
        return caught.value

    try:
        error = loop.run(scenario())
        assert error.partial_stdout == seen[0]
        assert wait_until(lambda: not live_pids(cmdline=long_sleep), 5), "the step outlived its connection"
        assert run_one(loop, transport, "echo back").stdout == b"back\n"
    finally:
        loop.run(transport.close())


def test_closing_the_transport_ends_the_runner(sshd: SSHServer, loop: asyncio.Runner) -> None:
    transport = transport_to(sshd)
    runner_pid = int(run_one(loop, transport, "echo $PPID").stdout)
    loop.run(transport.close())
    assert wait_until(lambda: not Path(f"/proc/{runner_pid}").exists() or "Z" in _state(runner_pid), 5)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_step_whose_runner_dies_is_retried_and_never_passes_on_its_own(write_runbook, tmp_path: Path, capsys) -> None:
    """Through the engine: the attempt that lost its runner is a transport error in the audit log
    (no exit code), the retry runs on a new runner; with no retry left the step fails."""
    marker = tmp_path / "killed-once"
    body = f"""\
        name: t
        __HOSTS__
        steps:
          - id: step
            kind: shell
            retry: {{attempts: ATTEMPTS, delay: 10ms}}
            script: |
              if [ ! -e {marker} ]; then
                touch {marker}
                kill -KILL $PPID; sleep 5
              fi
              echo survived
        """
    code, _out, err = run(write_runbook(body.replace("ATTEMPTS", "2")), tmp_path / "logs", capsys)
    assert code == 0, err
    attempts = audit_records(tmp_path / "logs")
    assert [r["attempt"] for r in attempts] == [1, 2]
    assert attempts[0]["exit_code"] is None and "transport error" in attempts[0]["stderr"]
    assert attempts[1]["stdout"] == "survived\n"

    marker.unlink()
    code, _out, err = run(write_runbook(body.replace("ATTEMPTS", "1")), tmp_path / "logs-once", capsys)
    assert code == 1
    assert "transport error" in err
    step = status(tmp_path / "logs-once", capsys)["steps"][0]
    assert step["status"] == "failed" and step["attempts"] == 1


# --- hosts that cannot run it --------------------------------------------------------------


@pytest.fixture(scope="module")
def no_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """An sshd whose sessions find a python3 that cannot start (as bash says when there is none)."""
    root = tmp_path_factory.mktemp("no-python")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text('#!/bin/sh\necho "bash: python3: command not found" >&2\nexit 127\n')
    fake.chmod(0o755)
    (root / "home").mkdir()  # no ~/.bashrc to put another python3 first
    setenv = f'SetEnv "PATH={bin_dir}:/usr/bin:/bin" "HOME={root / "home"}"\n'
    proc, server = start_sshd(root / "sshd", extra_config=setenv)
    yield server
    proc.terminate()
    proc.wait(timeout=10)


def test_a_host_without_python_falls_back_to_the_exec_path(
    no_python: SSHServer, loop: asyncio.Runner, tmp_path: Path
) -> None:
    transport = transport_to(no_python)
    debug = DebugLog(tmp_path / DEBUG_FILE, NO_SECRETS)
    transport.log = debug.log.bind(host="box")
    try:
        results = [run_one(loop, transport, "echo ok; exit 4") for _ in range(2)]
    finally:
        loop.run(transport.close())
        debug.close()
    assert [(r.exit_code, r.stdout) for r in results] == [(4, b"ok\n")] * 2
    assert transport.runner_unavailable is not None
    assert "exit status 127" in transport.runner_unavailable
    assert "python3: command not found" in transport.runner_unavailable
    lines = [json.loads(line) for line in (tmp_path / DEBUG_FILE).read_text().splitlines()]
    warnings = [line for line in lines if line["level"] == "warning"]  # said once, in the run's diagnostics
    assert len(warnings) == 1 and "exec channel of its own" in warnings[0]["event"]
    assert warnings[0]["host"] == "box" and "python3: command not found" in warnings[0]["reason"]


def test_the_fallback_is_said_once_in_the_run_s_events(
    no_python: SSHServer, write_runbook: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_runbook(
        """\
        name: fallback
        __HOSTS__
        steps:
          - {id: one, kind: shell, script: echo one}
          - {id: two, kind: shell, script: echo two}
        """,
        hosts=no_python.host_yaml(),
    )
    code, out, _ = run(path, tmp_path / "logs", capsys, "--json")
    assert code == 0
    notes = [e for e in map(json.loads, out.splitlines()) if e["event"] == "note"]
    assert [(n["host"], n["step"]) for n in notes] == [("box", "one")]
    message = notes[0]["message"]
    assert message.startswith("no persistent runner (") and "python3: command not found" in message
    _, _, err = run(path, tmp_path / "logs-console", capsys)
    assert "note box: no persistent runner" in err


def test_the_fallback_note_reaches_the_console_once_and_masked(
    no_python: SSHServer, write_runbook: Callable[..., Path], tmp_path: Path
) -> None:
    """The login shell's last words (here `bash: python3: command not found`) are quoted in the note; when
    they hold a secret's value (a ~/.bashrc under `set -x` exporting the token), it is masked. Before, the
    transport's logging warning printed the note a second time on stderr, raw (Python's last-resort handler).
    The run's debug.log (and `-v`, on stderr) says it too, masked as well."""
    path = write_runbook(
        """\
        name: fallback
        __HOSTS__
        secrets:
          TOKEN: {env: RB_SHELL_TOKEN}
        steps:
          - {id: one, kind: shell, script: echo one}
        """,
        hosts=no_python.host_yaml(),
    )
    for options in ([], ["-v"], ["--json"]):
        done = runbook_cli(
            "run",
            str(path),
            "--log-dir",
            str(tmp_path / "logs"),
            *options,
            env={"RB_SHELL_TOKEN": "command not found"},
        )
        assert done.returncode == 0, done.stderr
        assert "command not found" not in done.stderr + done.stdout
        assert ("debug: fallback to the exec path" in done.stderr) == (options == ["-v"])
    assert done.stderr == ""  # --json: every note is an event on stdout
    for debug_log in (tmp_path / "logs").glob(f"*/{DEBUG_FILE}"):
        assert "command not found" not in debug_log.read_text()
        (said,) = [json.loads(line) for line in debug_log.read_text().splitlines() if "exec path" in line]
        assert said["host"] == "box" and "bash: python3: ***" in said["reason"]
    assert len(list((tmp_path / "logs").glob(f"*/{DEBUG_FILE}"))) == 3
    assert (
        '"message": "no persistent runner (the runner did not start (exit status 127; stderr: \'bash: python3: ***\')'
        in done.stdout
    )


def test_runner_exec_never_starts_a_runner(noisy: SandboxHost, loop: asyncio.Runner) -> None:
    transport = transport_to(noisy.server, "exec")
    try:
        result = run_one(loop, transport, "tr '\\0' ' ' < /proc/$PPID/cmdline")
    finally:
        loop.run(transport.close())
    assert b"runbook-runner" not in result.stdout and b"runbook step wrapper" in result.stdout


# --- the protocol -------------------------------------------------------------------------


@given(fields=st.lists(st.binary(max_size=300), max_size=5))
def test_fields_round_trip(fields: list[bytes]) -> None:
    assert host_program.unpack_fields(host_program.pack_fields(*fields)) == fields


@pytest.mark.parametrize(
    ("script", "code"), [("exit 0", 0), ("exit 3", 3), ("exit 255", 255), ("kill -KILL $$", 137), ("kill $$", 143)]
)
def test_exit_codes_are_reported_as_bash_reports_them(script: str, code: int) -> None:
    assert host_program.exit_code(subprocess.run(["sh", "-c", script], check=False).returncode) == code
