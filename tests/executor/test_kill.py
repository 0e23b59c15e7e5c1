"""Everything a step started dies with it: on a timeout, an interrupt or the end of its script, every
process of the step's session is killed, whatever process group it moved to (GNU `timeout`, jobs
under `set -m`); only a process that started its own session (`setsid`) survives. What the messages
say of it is only what the host confirmed.

Every transport (local, SSH through the persistent runner, SSH exec channel) against the real sshd of
conftest, which runs on this machine as this user, so a test looks at the "remote" processes in /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from executor import render
from executor.render import KILLED_NOTE, UNCONFIRMED_NOTE, render_command
from executor.runbook.model import Host
from executor.transport import SSHTransport, Transport, runner_host
from executor.transport import base as transport_base
from executor.transport import runner as runner_module
from executor.transport import ssh as ssh_module
from executor.transport.base import CommandInterrupted, CommandResult
from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli
from tests.executor.test_engine import audit_records, status
from tests.executor.test_engine import run as run_cli
from tests.executor.test_render import run_rendered
from tests.executor.test_transport import live_pids, run, runner, sleeper, transport, wait_until

__all__ = ["run", "runner", "sleeper", "transport"]  # fixtures of the transport suite, used here too

RUNNERS = ["persistent", "exec"]


def escapers(make: Callable[[], str]) -> tuple[str, str, str, str]:
    """Commands that leave the step's process group but not its session: GNU timeout (its own group),
    a job under `set -m` (its own group), a job of a job under `set -m`; and the script that starts them."""
    timed, job, nested = make(), make(), make()
    script = (
        f"timeout 100000 {timed} &\n"
        "set -m\n"
        f"{job} &\n"
        f"bash -c '{nested} & wait' &\n"
        "set +m\n"
        f'until pgrep -f "^{timed}$" > /dev/null && pgrep -f "^{job}$" > /dev/null'
        f' && pgrep -f "^{nested}$" > /dev/null; do sleep 0.02; done\n'
    )
    return timed, job, nested, script


def all_gone(*commands: str, within: float = 5.0) -> bool:
    return wait_until(lambda: not any(live_pids(cmdline=c) for c in commands), within)


def left_their_group(*commands: str) -> bool:
    """Each command runs in a process group other than its session's (the step's): a group kill misses it."""
    for command in commands:
        for pid in live_pids(cmdline=command):
            try:
                if os.getpgid(pid) == os.getsid(pid):
                    return False
            except ProcessLookupError:  # gone since it was listed (a shell's short-lived fork): not yet settled
                return False
    return True


# --- the transports -------------------------------------------------------------------------


def test_a_timeout_kills_what_left_the_group(run: Callable[..., CommandResult], sleeper: Callable[[], str]) -> None:
    timed, job, nested, script = escapers(sleeper)
    result = run(script + f"echo ready\n{sleeper()}\n", timeout=3)
    assert result.timed_out and result.stdout == b"ready\n"
    assert all_gone(timed, job, nested), "a process of the step's session outlived its timeout"
    assert result.kill_confirmed is True
    assert result.stderr.endswith(f"\n{KILLED_NOTE}\n".encode()), result.stderr


def test_the_end_of_a_script_kills_what_left_the_group_but_not_a_new_session(
    run: Callable[..., CommandResult], sleeper: Callable[[], str]
) -> None:
    timed, job, nested, script = escapers(sleeper)
    daemon = sleeper()
    script += (
        f"setsid {daemon} > /dev/null 2>&1 < /dev/null &\n"
        "child=$!\n"  # setsid does not fork here: $! becomes the session leader; wait until it is one
        'until [ "$(ps -o sid= -p "$child" | tr -d " ")" = "$child" ]; do sleep 0.02; done\n'
    )
    result = run(script, timeout=30)
    assert (result.exit_code, result.timed_out, result.stderr) == (0, False, b"")
    assert result.kill_confirmed is None  # nothing was stopped, nothing survived
    assert all_gone(timed, job, nested), "a process the script left in its session survived its end"
    survivors = live_pids(cmdline=daemon)
    assert len(survivors) == 1, "a process in a session of its own was killed"
    os.kill(survivors[0], signal.SIGKILL)


def test_an_interrupt_kills_what_left_the_group(
    transport: Transport, runner: asyncio.Runner, sleeper: Callable[[], str]
) -> None:
    timed, job, nested, script = escapers(sleeper)
    started: list[bytes] = []

    async def scenario() -> CommandResult:
        task = asyncio.ensure_future(
            transport.run(
                render_command(script + f"echo ready\n{sleeper()}\n", {}), 120, lambda _n, c: started.append(c)
            )
        )
        for _ in range(400):
            if b"ready\n" in b"".join(started):
                break
            await asyncio.sleep(0.02)
        assert left_their_group(timed, job, nested)
        task.cancel()
        with pytest.raises(CommandInterrupted) as caught:
            await task
        return caught.value.result

    result = runner.run(scenario())
    assert result.interrupted
    assert all_gone(timed, job, nested), "a process of the step's session outlived the interrupt"
    assert result.kill_confirmed is True


def test_a_process_that_ignores_term_in_another_group_gets_kill(
    run: Callable[..., CommandResult], sleeper: Callable[[], str]
) -> None:
    stubborn = sleeper()
    script = (
        f"set -m\nbash -c \"trap '' TERM; {stubborn}; :\" &\nset +m\n"
        f'until pgrep -f "^{stubborn}$" > /dev/null; do sleep 0.02; done\necho ready\nsleep 100000\n'
    )
    result = run(script, timeout=2)
    assert result.timed_out and result.kill_confirmed is True
    assert all_gone(stubborn)


def test_a_command_name_with_spaces_and_parens_is_read_right(run: Callable[..., CommandResult], tmp_path: Path) -> None:
    """/proc/PID/stat's second field is the command name in parens, which may hold `) ` and words: this
    one makes a parser that splits after the first `)` read state `Z` (a zombie, skipped)."""
    odd = tmp_path / "a) Z 1 1 1 (b"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    seconds = str(800_000 + os.getpid() % 1000)
    try:
        result = run(f"set -m\n'{odd}' {seconds} &\nset +m\nsleep 0.3\nexit 0\n", timeout=30)
        assert result.exit_code == 0, result.stderr
        assert all_gone(f"{odd} {seconds}"), "a process whose name holds ') Z ' survived the step"
    finally:
        for pid in live_pids(cmdline=f"{odd} {seconds}"):
            os.kill(pid, signal.SIGKILL)


def test_a_command_name_with_a_newline_is_read_right(run: Callable[..., CommandResult], tmp_path: Path) -> None:
    """A name may hold a newline too: a reader that stops at the first line never sees the session field."""
    odd = tmp_path / "nl\nZ 1 1 1"
    os.symlink(shutil.which("sleep") or "/bin/sleep", odd)
    seconds = str(810_000 + os.getpid() % 1000)
    try:
        result = run(f'set -m\n"{tmp_path}/nl"$\'\\n\'"Z 1 1 1" {seconds} &\nset +m\nsleep 0.3\nexit 0\n', timeout=30)
        assert result.exit_code == 0, result.stderr
        assert all_gone(f"{seconds}"), "a process whose name holds a newline survived the step"
    finally:
        for pid in live_pids(cmdline=seconds):
            os.kill(pid, signal.SIGKILL)


CHAIN = """import os, sys, time
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:  # one process at a time, each in a new group: forks, then exits
    if os.fork():
        os._exit(0)
    os.setpgid(0, 0)
    time.sleep(0.002)
"""


@pytest.mark.parametrize("ends", ["timeout", "end of script"])
def test_a_chain_of_forks_that_exit_is_killed_or_not_claimed(
    run: Callable[..., CommandResult], tmp_path: Path, ends: str
) -> None:
    """A process that forks and exits in a loop is never where one scan of /proc saw it: the session
    counts as empty only after several scans in a row find nothing, and the chain dies with the step. On a
    loaded machine a chain may slip between the scans: never claimed killed then, and a second try kills it
    (CI's 2 cores, both busy, let one through once in a few hundred runs)."""
    chain = tmp_path / "chain.py"
    chain.write_text(CHAIN)
    tail = "sleep 100" if ends == "timeout" else "sleep 0.5"
    for attempt in range(2):
        marker = str(12.0 + (os.getpid() % 1000) / 10_000 + attempt / 100_000)  # its own argv, found in /proc
        result = run(f"python3 {chain} {marker} > /dev/null 2>&1 < /dev/null &\n{tail}\n", timeout=2)
        try:
            survived = wait_until(lambda m=marker: bool(live_pids(cmdline=m)), 1.0)  # seen in any scan for 1 s
            if survived:  # honest at least: never "confirmed" while it runs on
                assert result.kill_confirmed is not True, "the chain survived a kill the host confirmed"
        finally:
            for pid in live_pids(cmdline=marker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if not survived:
            return
    raise AssertionError("a chain of forks outlived its step, twice")


# --- what could not be confirmed ------------------------------------------------------------


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller waits 1 s (not 10) for the host to confirm a kill."""
    for module in (transport_base, runner_module, ssh_module):
        monkeypatch.setattr(module, "KILL_GRACE_S", 1.0)


def frozen_parent(seen: list[bytes]) -> int:
    """The wrapper or the runner whose pid the step printed first (`echo $PPID`)."""
    return int(b"".join(seen).split(b"\n")[0])


@pytest.mark.parametrize("runner_kind", RUNNERS)
def test_a_host_that_does_not_answer_the_stop_is_not_said_to_have_killed(
    sshd: SSHServer, runner: asyncio.Runner, short_grace: None, runner_kind: str, sleeper: Callable[[], str]
) -> None:
    """The step's runner (or wrapper) is frozen (SIGSTOP), so nothing answers the stop: the result says
    the kill could not be confirmed, never that it happened."""
    transport = SSHTransport("box", Host(**sshd.host_dict(), runner=runner_kind))
    long_sleep = sleeper()
    seen: list[bytes] = []
    script = f"echo $PPID\nsleep 0.5\nkill -STOP $PPID\n{long_sleep}\n"  # (the pause: its pid reaches us)
    try:
        result = runner.run(transport.run(render_command(script, {}), 2, lambda _n, c: seen.append(c)))
    finally:
        if seen:
            os.kill(frozen_parent(seen), signal.SIGCONT)
        runner.run(transport.close())
    assert result.timed_out
    assert result.kill_confirmed is False
    assert result.stderr.rstrip(b"\n").split(b"\n")[-1].startswith(f"{UNCONFIRMED_NOTE}: no answer".encode())
    assert all_gone(long_sleep, within=10)  # continued, the host finishes the kill


@pytest.mark.parametrize("runner_kind", RUNNERS)
def test_the_cli_says_it_could_not_confirm_the_kill(
    write_runbook, sshd: SSHServer, tmp_path: Path, capsys, short_grace: None, runner_kind: str, sleeper
) -> None:
    long_sleep = sleeper()
    path = write_runbook(
        f"""\
        name: t
        __HOSTS__
        steps:
          - id: hang
            kind: shell
            timeout: 2s
            retry: {{attempts: 1}}
            script: |
              echo $PPID
              sleep 0.5
              kill -STOP $PPID
              {long_sleep}
        """,
        hosts=sshd.host_yaml() + f"    runner: {runner_kind}\n",
    )
    try:
        code, out, err = run_cli(path, tmp_path / "logs", capsys)
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            (record,) = [r for r in audit_records(tmp_path / "logs") if r["event"] == "command"]
            os.kill(int(record["stdout"].split("\n")[0]), signal.SIGCONT)
    assert code == 1
    (step,) = status(tmp_path / "logs", capsys)["steps"]
    assert step["message"].startswith(
        "[primary] timed out after 2s; could not confirm that the step's processes were killed"
    )
    assert "could not confirm that the step's processes were killed" in out + err
    (record,) = [r for r in audit_records(tmp_path / "logs") if r["event"] == "command"]
    assert record["timed_out"] and record["kill_confirmed"] is False
    assert "could not confirm that the step's processes were killed" in record["stderr"]
    assert all_gone(long_sleep, within=10)


def test_a_host_without_proc_says_only_the_group_was_killed() -> None:
    """Where /proc is missing (hidden here by an empty tmpfs in a mount namespace of its own), the
    wrapper falls back to the group kill and says that it could not confirm more."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare(1) to hide /proc")
    command = render_command("sleep 100000", {})
    hidden = render.RenderedCommand(
        argv=("unshare", "--mount", "bash", "-c", 'mount -t tmpfs none /proc && exec "$@"', "x", *command.argv),
        stdin=command.stdin,
        display=command.display,
        env=command.env,
    )
    proc = subprocess.Popen(hidden.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(hidden.stdin)
    proc.stdin.flush()
    time.sleep(0.5)
    proc.stdin.close()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.wait(timeout=30) != 0
    assert err.endswith(f"\n{UNCONFIRMED_NOTE}: this host has no /proc, only its process group was killed\n".encode())
    assert transport_base.kill_note(err) is False


def test_the_runner_without_proc_says_only_the_group_was_killed() -> None:
    """The runner's side of it, in the same kind of namespace: a stopped step's session (a `setsid`
    child) gets the group kill, and the note says no more was confirmed."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare(1) to hide /proc")
    program = (
        "import runpy, subprocess, sys\n"
        "host = runpy.run_path(sys.argv[1])\n"
        "step = subprocess.Popen(['sleep', '100000'], start_new_session=True)\n"
        "print(host['session_members'](step.pid), flush=True)\n"
        "sys.stdout.buffer.write(host['kill_note'](host['kill_session'](step.pid), stopped=True))\n"
        "sys.stdout.buffer.flush()\n"
        "print(step.wait())\n"
    )
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "bash",
            "-c",
            'mount -t tmpfs none /proc && exec "$@"',
            "x",
            sys.executable,
            "-I",
            "-S",
            "-c",
            program,
            runner_host.__file__,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"None\n\n{UNCONFIRMED_NOTE}: this host has no /proc, only its process group was killed\n-9\n".encode()
    )


# --- both ways alike ------------------------------------------------------------------------


def test_the_runner_and_the_wrapper_stop_a_step_alike(
    sshd: SSHServer, runner: asyncio.Runner, sleeper: Callable[[], str]
) -> None:
    seen = {}
    for kind in RUNNERS:
        transport = SSHTransport("box", Host(**sshd.host_dict(), runner=kind))
        timed, job, nested, script = escapers(sleeper)
        try:
            result = runner.run(transport.run(render_command(script + "echo out; echo err >&2; sleep 100000\n", {}), 2))
        finally:
            runner.run(transport.close())
        assert all_gone(timed, job, nested)
        seen[kind] = (result.exit_code, result.stdout, result.stderr, result.timed_out, result.kill_confirmed)
    assert seen["persistent"] == seen["exec"]
    assert seen["exec"] == (143, b"out\n", f"err\n\n{KILLED_NOTE}\n".encode(), True, True)


def test_the_runner_writes_the_wrapper_s_lines() -> None:
    """runner_host.py is a host program that imports nothing of the controller's: its copies must match."""
    assert KILLED_NOTE.encode() == runner_host.KILLED_NOTE
    assert UNCONFIRMED_NOTE.encode() == runner_host.UNCONFIRMED_NOTE
    assert runner_host.KILL_ROUNDS == render.KILL_ROUNDS
    assert (runner_host.EMPTY_SCANS, runner_host.END_SCANS) == (render.EMPTY_SCANS, render.END_SCANS)


def test_the_wrapper_confirms_the_kill_when_its_stdin_closes(sleeper: Callable[[], str]) -> None:
    timed, job, nested, script = escapers(sleeper)
    done = run_rendered(script + "echo ready\nsleep 100000\n", {}, hold_stdin=False)
    assert all_gone(timed, job, nested)
    assert done.stderr.endswith(f"\n{KILLED_NOTE}\n".encode())


# --- through the CLI ------------------------------------------------------------------------


@pytest.mark.parametrize("runner_kind", RUNNERS)
def test_a_timed_out_step_leaves_nothing_behind_for_its_retry(
    write_runbook, sshd: SSHServer, tmp_path: Path, runner_kind: str, sleeper
) -> None:
    """`timeout 3600 hf download ...` in a step that times out: its retry must not run beside a survivor."""
    download = sleeper()
    path = write_runbook(
        f"""\
        name: t
        __HOSTS__
        steps:
          - id: download
            kind: shell
            timeout: 2s
            retry: {{attempts: 2, delay: 100ms}}
            script: |
              echo "copies already running: $(pgrep -fc '^{download}$')"
              timeout 3600 {download}
        """,
        hosts=sshd.host_yaml() + f"    runner: {runner_kind}\n",
    )
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 1, done.stderr
    assert all_gone(download), "the step's download outlived its timeout"
    records = [r for r in audit_records(tmp_path / "logs") if r["event"] == "command"]
    assert [r["stdout"].split("\n")[0] for r in records] == ["copies already running: 0"] * 2
    assert all(r["kill_confirmed"] is True for r in records)
    said = done.stdout + done.stderr
    assert "every process it started was killed" in said
    assert "process group was killed" not in said


def test_an_interrupted_run_kills_what_left_the_group(write_runbook, tmp_path: Path, sleeper) -> None:
    timed, job, nested, script = escapers(sleeper)
    body = "".join(f"      {line}\n" for line in (script + "echo ready\nsleep 100000\n").splitlines())
    path = write_runbook(
        "name: t\n__HOSTS__\nsteps:\n  - id: long\n    kind: shell\n    timeout: 10m\n    script: |\n" + body
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.faces.cli", "run", str(path), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        running = (timed, job, nested)
        assert wait_until(lambda: all(live_pids(cmdline=c) for c in running) and left_their_group(*running), 30)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert all_gone(timed, job, nested), "a process of the step's session outlived the interrupt"
    listed = runbook_cli("status", "--log-dir", str(tmp_path / "logs"), "--json")
    assert "every process it started was killed" in listed.stdout
    assert "process group killed" not in listed.stdout


# ---- the end-of-step sweep reads only the pids handed out since the step started ----------------------


@contextlib.contextmanager
def _session_with_a_job_in_another_group() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A session leader (as the runner starts a step) whose job moved to a process group of its own
    (`set -m`), and the newest pid before it started."""
    since = runner_host.newest_pid()
    assert since is not None
    leader = subprocess.Popen(
        ["bash", "-c", "set -m; sleep 30 & echo started; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert leader.stdout is not None and leader.stdout.readline() == b"started\n"
        yield leader, since
    finally:
        runner_host.kill_session(leader.pid)
        leader.wait()


def test_the_sweep_since_the_step_started_finds_what_a_full_listing_finds_without_listing_proc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _session_with_a_job_in_another_group() as (leader, since):
        everyone = runner_host.session_members(leader.pid)
        assert everyone is not None and len(everyone) == 2  # the leader and its job, in another group
        monkeypatch.setattr(runner_host.os, "listdir", lambda _path: pytest.fail("listed all of /proc"))
        assert sorted(runner_host.session_members(leader.pid, since) or []) == sorted(everyone)
        monkeypatch.undo()
        assert runner_host.kill_session(leader.pid, since=since) == []
        assert runner_host.session_members(leader.pid) == []


def test_the_sweep_lists_all_of_proc_once_pids_came_round_or_too_many_were_handed_out() -> None:
    with _session_with_a_job_in_another_group() as (leader, _since):
        newest = runner_host.newest_pid()
        assert newest is not None
        assert runner_host._members_since(leader.pid, newest + 1) is None  # the newest is below it: came round
        assert runner_host._members_since(leader.pid, newest - runner_host.SINCE_MAX - 1) is None
        assert runner_host.session_members(leader.pid, newest + 1) == runner_host.session_members(leader.pid)


def test_a_step_trusts_the_pids_since_it_started_only_while_they_cannot_have_come_round() -> None:
    host = runner_host.Runner.__new__(runner_host.Runner)  # only its pid_max is read
    host.pid_max = 32768
    step = runner_host.Step(1, subprocess.Popen(["true"]), "", since=100)
    step.proc.wait()
    assert host.since_for(step) == 100
    step.started -= host.pid_max / runner_host.FORKS_PER_S
    assert host.since_for(step) is None
    host.pid_max = 0  # unreadable
    assert host.since_for(runner_host.Step(1, step.proc, "", since=100)) is None
