"""Both transports, end to end: `LocalTransport`, and `SSHTransport` against a real sshd both
through its persistent runner (the default) and with an exec channel per command (`runner: exec`).

Nothing is mocked. The sshd of conftest runs on this machine as this user, so a test can look
at the "remote" processes and files directly (/proc, the file system).

The tests of the `contract` fixture hold for the `ScriptedTransport` too (executor/transport/scripted.py):
what a command's result says (streams, exit code, sizes and hashes, a timeout as a result with the output so
far), commands side by side, and transfers; the scripted host is told what each script does (`does`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.render import render_command
from executor.runbook.model import Host
from executor.transport import LocalTransport, SSHTransport, Transport
from executor.transport.base import CommandInterrupted, CommandResult
from executor.transport.scripted import Answer, ScriptedCommand, ScriptedTransport

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))


# --- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for the module, so that an SSH connection serves many tests."""
    with asyncio.Runner() as loop:
        yield loop


def made_transport(kind: str, request: pytest.FixtureRequest, runner: asyncio.Runner) -> Transport:
    if kind == "scripted":
        return ScriptedTransport("scripted")
    if kind == "local":
        return LocalTransport("here")
    sshd = request.getfixturevalue("sshd")
    made = SSHTransport("box", Host(**sshd.host_dict(), runner=kind.removeprefix("ssh-")))
    runner.run(made.connect())
    assert made.runner_unavailable is None
    return made


@pytest.fixture(scope="module", params=["local", "ssh-persistent", "ssh-exec"])
def transport(request: pytest.FixtureRequest, runner: asyncio.Runner) -> Iterator[Transport]:
    """Every transport and both ways of the SSH one: its persistent runner and an exec channel per command."""
    made = made_transport(request.param, request, runner)
    yield made
    runner.run(made.close())


@dataclass
class Contract:
    """A transport under the contract, the scripted one among them: `does` tells the scripted host what a script
    does (a real host runs it)."""

    transport: Transport
    runner: asyncio.Runner

    def does(self, script: str, *answers: Answer | Callable[[ScriptedCommand], Answer], **answer: Any) -> str:
        if isinstance(self.transport, ScriptedTransport):
            self.transport.on(lambda command: command.script == script, *answers, **answer)
        return script

    def run(self, script: str, env: dict[str, str] | None = None, timeout: float = 30) -> CommandResult:
        return self.runner.run(self.transport.run(render_command(script, env or {}), timeout))

    def remote(self, path: Path) -> bytes:
        """A file on the host."""
        if isinstance(self.transport, ScriptedTransport):
            return self.transport.files[str(path)]
        return path.read_bytes()


@pytest.fixture(scope="module", params=["local", "ssh-persistent", "ssh-exec", "scripted"])
def contract(request: pytest.FixtureRequest, runner: asyncio.Runner) -> Iterator[Contract]:
    made = made_transport(request.param, request, runner)
    yield Contract(made, runner)
    runner.run(made.close())


@pytest.fixture
def run(transport: Transport, runner: asyncio.Runner) -> Callable[..., CommandResult]:
    def run(script: str | bytes, env: dict[str, str] | None = None, timeout: float = 30) -> CommandResult:
        return runner.run(transport.run(render_command(script, env or {}), timeout))

    return run


def live_pids(*, cmdline: str | None = None, pgid: int | None = None) -> list[int]:
    """Processes that are alive (not zombies) with `cmdline` in their command line / in group `pgid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, group = fields[0], int(fields[2])
        if state in ("Z", "X"):
            continue
        if cmdline is not None and cmdline not in args:
            continue
        if pgid is not None and group != pgid:
            continue
        found.append(int(entry))
    return found


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def sleeper() -> Iterator[Callable[[], str]]:
    """Unique `sleep N` commands (so /proc matches are unambiguous), killed after the test."""
    made: list[str] = []

    def make() -> str:
        command = f"sleep {700_000 + secrets.randbelow(200_000)}"
        made.append(command)
        return command

    yield make
    for command in made:
        for pid in live_pids(cmdline=command):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- 1. byte-for-byte delivery ----------------------------------------------------------

# `$0` is the script's file on the host, so this prefix makes a script print its own bytes;
# bash reads a script as it runs it and never parses what follows `exit`.
SELF_PRINT = b'cat -- "$0"\nexit 0\n'

TRICKY_TAILS = {
    "single-quotes": b"echo 'it''s' '\n",
    "double-quotes": b'echo "say "hi"" "\n',
    "backslashes": b"\\ \\\\ \\n \\' \\\"\n\\",
    "command-substitution": b"$(touch /tmp/runbook_should_not_exist) ${HOME}\n",
    "backticks": b"`touch /tmp/runbook_should_not_exist`\n",
    "line-EOF": b"cat <<EOF\nEOF\nEOF\n",
    "line-RUNBOOK_EOF": b"RUNBOOK_EOF_x\nRUNBOOK_EOF_0123456789abcdef\n",
    "crlf": b"echo a\r\necho b\r\n",
    "non-ascii": "héllo wörld ✓ 日本 🚀\n".encode(),
    "invalid-utf8": b"\xff\xfe\xc3(\x80\n",
    "no-trailing-newline": b"echo last",
    "nul": b"a\x00b\x00\n",
}


@pytest.mark.parametrize("tail", TRICKY_TAILS.values(), ids=TRICKY_TAILS.keys())
def test_script_arrives_byte_for_byte(run: Callable[..., CommandResult], tail: bytes) -> None:
    script = SELF_PRINT + tail
    result = run(script)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == script
    assert not Path("/tmp/runbook_should_not_exist").exists()


@PROPERTY
@given(tail=st.binary(max_size=4096))
def test_arbitrary_script_bytes_arrive_intact(run: Callable[..., CommandResult], tail: bytes) -> None:
    script = SELF_PRINT + tail
    result = run(script)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == script


def test_tricky_script_runs_as_written(run: Callable[..., CommandResult]) -> None:
    script = (
        "cat <<'END'\n"
        "'single' \"double\" \\back $(reboot) `reboot` ${HOME}\n"
        "EOF\n"
        "RUNBOOK_EOF_x\n"
        "END\n"
        "printf '%s\\n' 'it'\\''s' \"say \\\"hi\\\"\" 'a\\b' héllo✓\n"
        "printf 'no newline'"
    )
    result = run(script)
    assert result.exit_code == 0, result.stderr
    assert (
        result.stdout
        == (
            "'single' \"double\" \\back $(reboot) `reboot` ${HOME}\nEOF\nRUNBOOK_EOF_x\n"
            'it\'s\nsay "hi"\na\\b\nhéllo✓\nno newline'
        ).encode()
    )


def test_crlf_script_keeps_its_carriage_returns(run: Callable[..., CommandResult]) -> None:
    result = run(b"echo one\r\nprintf two\r\n")
    assert result.stdout == b"one\r\ntwo\r"


def test_script_file_is_private_and_removed(run: Callable[..., CommandResult]) -> None:
    result = run('printf "%s\\n" "$0"; stat -c %a "$0" "$(dirname "$0")"')
    assert result.exit_code == 0, result.stderr
    path, script_mode, dir_mode = result.stdout.decode().split("\n")[:3]
    assert (script_mode, dir_mode) == ("600", "700")
    # the persistent runner reports the exit first and removes the folder right after (issue 14's per-step
    # cost): gone within moments, not necessarily when the result arrives
    deadline = time.monotonic() + 10
    while Path(path).parent.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not Path(path).parent.exists()


# --- 2. var values round-trip -----------------------------------------------------------


@PROPERTY
@given(value=TEXT)
def test_var_value_round_trips(run: Callable[..., CommandResult], value: str) -> None:
    result = run('printf %s "$V"', {"V": value})
    assert result.exit_code == 0, result.stderr
    assert result.stdout == value.encode()


def test_many_vars_arrive_and_are_exported(run: Callable[..., CommandResult]) -> None:
    env = {f"V{i}": f"value {i} 'q' \"d\" \\ $(x)\n" for i in range(50)}
    result = run('for i in $(seq 0 49); do printenv "V$i"; done', env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "".join(f"{v}\n" for v in env.values()).encode()


def test_injection_in_vars_stays_literal(run: Callable[..., CommandResult], tmp_path: Path) -> None:
    pwned = tmp_path / f"pwned_{secrets.token_hex(4)}"
    values = [
        f"'; touch {pwned}; '",
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f'"; touch {pwned}; "',
        f"\\'; touch {pwned} #",
        "$(reboot)",
        "`reboot`",
    ]
    env = {f"V{i}": v for i, v in enumerate(values)}
    result = run("".join(f'printf "%s\\n" "$V{i}"\n' for i in range(len(values))), env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split("\n")[:-1] == values
    assert not pwned.exists()


# --- 3. size ------------------------------------------------------------------------------


def test_one_mebibyte_script_runs(run: Callable[..., CommandResult]) -> None:
    line = b"# " + b"x" * 1021 + b"\n"  # 1 KiB
    script = line * 1024 + b"echo ok\n"
    assert len(script) > 1024 * 1024  # far above MAX_ARG_STRLEN (128 KiB)
    result = run(script)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"ok\n"


def test_large_output_is_complete(contract: Contract) -> None:
    size = 5 * 1024 * 1024
    script = contract.does(f"head -c {size} /dev/zero | tr '\\0' 'a'; echo err >&2", stdout=b"a" * size, stderr="err\n")
    result = contract.run(script)
    assert result.exit_code == 0, result.stderr
    assert result.stdout_total == len(result.stdout) == size
    assert result.stdout_sha256 == hashlib.sha256(b"a" * size).hexdigest()
    assert result.stderr == b"err\n"


# --- 4. stdin at EOF ----------------------------------------------------------------------


def test_script_stdin_is_at_eof(run: Callable[..., CommandResult]) -> None:
    started = time.monotonic()
    result = run("read -r line || echo eof\ncat\necho after\n", timeout=10)
    assert not result.timed_out
    assert time.monotonic() - started < 8
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"eof\nafter\n"


def test_read_cannot_swallow_the_rest_of_the_script(run: Callable[..., CommandResult]) -> None:
    result = run('read -r line\necho "got:${line-}"\necho second\n', timeout=10)
    assert result.stdout == b"got:\nsecond\n"


# --- 5. timeout ---------------------------------------------------------------------------


def test_timeout_kills_the_whole_step(contract: Contract, sleeper: Callable[[], str]) -> None:
    first, second = sleeper(), sleeper()
    started = time.monotonic()
    result = contract.run(
        contract.does(f"echo started\n{first} &\n{second}\n", stdout="started\n", hang=True), timeout=1
    )
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert not result.interrupted
    assert result.exit_code != 0
    assert 1 <= elapsed < 15
    assert result.stdout == b"started\n"
    assert result.kill_confirmed is True
    assert wait_until(lambda: not live_pids(cmdline=first) and not live_pids(cmdline=second), 3), (
        "the step's processes outlived its timeout"
    )


def test_command_within_timeout_is_not_timed_out(contract: Contract) -> None:
    result = contract.run(contract.does("sleep 0.2; echo done", stdout="done\n", delay=0.2), timeout=10)
    assert (result.timed_out, result.interrupted, result.exit_code, result.stdout) == (False, False, 0, b"done\n")


# --- 6. cancellation ----------------------------------------------------------------------


def test_cancellation_interrupts_and_kills_the_group(
    transport: Transport, runner: asyncio.Runner, sleeper: Callable[[], str]
) -> None:
    first, second = sleeper(), sleeper()
    caught: list[CommandInterrupted] = []

    async def attempt() -> CommandResult:
        try:
            return await transport.run(render_command(f"echo $$\n{first} &\n{second}\n", {}), 120)
        except CommandInterrupted as exc:
            caught.append(exc)
            raise

    async def scenario() -> tuple[asyncio.Task[CommandResult], int, float]:
        task = asyncio.ensure_future(attempt())
        await asyncio.sleep(0.5)
        for _ in range(100):  # the step is running once its sleeps are
            if live_pids(cmdline=first) and live_pids(cmdline=second):
                break
            await asyncio.sleep(0.05)
        pids = live_pids(cmdline=second)
        assert pids, "the step never started"
        group = os.getpgid(pids[0])
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task, group, time.monotonic() - started

    task, group, elapsed = runner.run(scenario())
    assert task.cancelled()
    assert len(caught) == 1
    result = caught[0].result
    assert isinstance(caught[0], asyncio.CancelledError)
    assert result.interrupted and not result.timed_out
    assert result.stdout.decode().strip() == str(group)  # partial output kept: the step printed its pid
    assert elapsed < 15
    assert wait_until(lambda: not live_pids(pgid=group), 3), "the step's process group outlived the interrupt"
    assert not live_pids(cmdline=first)


# --- 7. leftovers after a normal exit ------------------------------------------------------


def test_children_in_the_group_die_with_the_step(run: Callable[..., CommandResult], sleeper: Callable[[], str]) -> None:
    orphan, daemon = sleeper(), sleeper()
    script = (
        f"{orphan} &\n"
        f"setsid {daemon} > /dev/null 2>&1 < /dev/null &\n"
        "child=$!\n"  # setsid does not fork here: $! becomes the session leader; wait until it is one
        'until [ "$(ps -o sid= -p "$child" | tr -d " ")" = "$child" ]; do sleep 0.02; done\n'
        "exit 0\n"
    )
    result = run(script, timeout=20)
    assert not result.timed_out
    assert result.exit_code == 0, result.stderr
    assert wait_until(lambda: not live_pids(cmdline=orphan), 3), "a child left in the step's group survived"
    survivors = live_pids(cmdline=daemon)
    assert len(survivors) == 1, "a child in its own session was killed"
    os.kill(survivors[0], signal.SIGKILL)


# --- 8. streams and exit codes -----------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 7, 124, 255])
def test_streams_are_separate_and_exit_code_passes(contract: Contract, code: int) -> None:
    script = f"echo out\necho err >&2\nprintf more\nprintf ERR >&2\nexit {code}\n"
    result = contract.run(contract.does(script, exit_code=code, stdout="out\nmore", stderr="err\nERR"))
    assert result.exit_code == code
    assert result.stdout == b"out\nmore"
    assert result.stderr == b"err\nERR"
    assert (result.stdout_total, result.stderr_total) == (8, 7)
    assert result.stdout_sha256 == hashlib.sha256(b"out\nmore").hexdigest()
    assert result.stderr_sha256 == hashlib.sha256(b"err\nERR").hexdigest()
    assert not result.timed_out and not result.interrupted


def test_exit_code_of_a_killed_script(run: Callable[..., CommandResult]) -> None:
    result = run("kill -KILL $$")
    assert result.exit_code == 128 + signal.SIGKILL


def test_concurrent_commands_on_one_transport(contract: Contract) -> None:
    script = contract.does('sleep 1; printf %s "$N"', lambda command: Answer(stdout=command.env["N"], delay=1))

    async def many() -> list[CommandResult]:
        return await asyncio.gather(
            *(contract.transport.run(render_command(script, {"N": str(i)}), 30) for i in range(8))
        )

    started = time.monotonic()
    results = contract.runner.run(many())
    assert [r.stdout for r in results] == [str(i).encode() for i in range(8)]
    assert time.monotonic() - started < 5  # side by side; one after another would take 8 s


# --- 9. unattended environment -----------------------------------------------------------


def test_debian_frontend_is_noninteractive_and_exported(run: Callable[..., CommandResult]) -> None:
    result = run("printenv DEBIAN_FRONTEND; bash -c 'echo \"$DEBIAN_FRONTEND\"'; printenv SUDO_ASKPASS")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"noninteractive\nnoninteractive\n/bin/false\n"


def test_step_shell_does_not_read_bashrc_when_run_by_sshd(
    runner: asyncio.Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bash sources ~/.bashrc for `bash -c` when SSH_CLIENT is set at shell level 1, as under sshd;
    the step's shell must not (the login shell already did): its output would corrupt the step's."""
    marker = tmp_path / "bashrc-ran"
    (tmp_path / ".bashrc").write_text(f'echo BASHRC-OUT; echo BASHRC-ERR >&2; touch "{marker}"\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SSH_CLIENT", "192.0.2.1 50000 22")
    monkeypatch.delenv("SHLVL", raising=False)  # sshd's login shell `exec`s the wrapper at level 0
    result = runner.run(LocalTransport("here").run(render_command("echo step", {}), 30))
    assert result.exit_code == 0
    assert (result.stdout, result.stderr) == (b"step\n", b"")
    assert not marker.exists()


# --- 12. file transfers -------------------------------------------------------------------


def test_put_and_get_report_size_and_sha256(contract: Contract, tmp_path: Path) -> None:
    transport, runner = contract.transport, contract.runner
    data = os.urandom(300_000) + b"\x00\r\n end"
    local = tmp_path / "payload.bin"
    local.write_bytes(data)
    remote = tmp_path / "remote.bin"
    digest = hashlib.sha256(data).hexdigest()

    put = runner.run(transport.put(local, str(remote)))
    assert (put.direction, put.size, put.sha256) == ("put", len(data), digest)
    assert contract.remote(remote) == data

    back = tmp_path / "back.bin"
    got = runner.run(transport.get(str(remote), back))
    assert (got.direction, got.size, got.sha256) == ("get", len(data), digest)
    assert back.read_bytes() == data


def test_put_of_an_empty_file(contract: Contract, tmp_path: Path) -> None:
    local = tmp_path / "empty"
    local.write_bytes(b"")
    put = contract.runner.run(contract.transport.put(local, str(tmp_path / "empty.remote")))
    assert (put.size, put.sha256) == (0, hashlib.sha256(b"").hexdigest())
    assert contract.remote(tmp_path / "empty.remote") == b""


def test_a_background_process_holding_the_output_does_not_make_a_timeout(run: Callable[..., CommandResult]) -> None:
    """`setsid cmd &` without redirection keeps stdout open; the command still finishes at its exit."""
    marker = f"sleep {secrets.randbelow(1000) + 9000}"
    try:
        # (the pause lets setsid leave the step's group before the step ends and its group is killed)
        result = run(f"setsid {marker} &\nsleep 0.5\necho started\n", timeout=30)
        assert result.exit_code == 0 and not result.timed_out
        assert result.stdout == b"started\n"
        assert b"still holds its output open" in result.stderr
        assert result.duration_s < 10
    finally:
        subprocess.run(["pkill", "-f", f"^{marker}$"], check=False)
