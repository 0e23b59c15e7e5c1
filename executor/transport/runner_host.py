"""The persistent runner: one clean Python process per SSH connection, on the host.

This file is a host-side program (Python 3.7+ on Linux, stdlib only). `executor.transport.runner` starts
it once per connection through the user's login shell, which at once becomes `bash --noprofile
--norc` and then `python3 -I -S -u` (see `start_command`); the program itself arrives on stdin.
So the login shell's start-up (~/.bashrc: conda init, pyenv, motd-like echoes) runs once per
connection instead of once per command, and nothing it prints can reach a step: the controller
discards everything before the random token this program echoes first, and reads only frames after.

Frames, both ways: `HEADER` (payload length, request id, type), then the payload. The controller
sends RUN (the step's vars as `NAME=value` entries, see `pack_env`, and its script), STOP (the
step's timeout or interrupt) and ABANDON (stop forwarding output a leftover process holds open).
The runner answers with STDOUT / STDERR chunks (an empty one is that stream's end) and EXIT.

Each step runs as the per-channel wrapper (executor/render.py) runs it, and sees the same: the
script in a private temporary folder (umask 077), run by `bash SCRIPT` as its own session with
stdin at /dev/null and SIGINT/SIGQUIT ignored (as bash leaves a background job), in the
environment of the login shell (taken by `env -0` before python3 started, so a python3 that is a
pyenv or conda shim cannot change it) plus the step's vars, separate stdout and stderr, the exit
code as bash's `wait` reports it. Where the wrapper starts a bash that sources the vars and then
`exec`s the script's bash, the runner puts the vars straight into the script's bash's environment:
one bash start (~1 ms) less. The step sees the same (the names bash would treat apart, as SHLVL,
no step may have: executor.render.BASH_OWNED_NAMES), except that its folder holds only `script`:
no vars file, so no secret on the host's disk.
STOP sends TERM to every process of the step's session (whatever process group it moved to: GNU
`timeout`, `set -m`; only `setsid` leaves it) and KILL, round after round until the session is empty,
once STOP_GRACE_S has passed with the session not yet empty; the step's stderr then ends with a line
that says whether the host confirmed it (KILLED_NOTE, else UNCONFIRMED_NOTE: the wrapper writes the
same lines). When the step ends, whatever it left in its session is killed the same way. Several
steps run side by side.

When the controller goes away (stdin closed: the connection dropped) every step is stopped as on
STOP. If the runner itself dies, a small guard process it forked at start does that, so no step
outlives its runner.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Mapping

HEADER = struct.Struct(">IIB")  # payload length, request id, frame type
FIELD = struct.Struct(">I")  # a RUN payload is length-prefixed fields
TOKEN_BYTES = 32
# controller -> runner
RUN, STOP, ABANDON = 1, 2, 3
# runner -> controller
STDOUT, STDERR, EXIT = 1, 2, 3
#: As the wrapper's wait (up to 2 s) between TERM and KILL.
STOP_GRACE_S = 2.0
#: While a stopped step's session empties after TERM, how often the runner looks (as the wrapper's `sleep 0.1`).
STOP_POLL_S = 0.1
#: As executor.render.KILL_ROUNDS, EMPTY_SCANS, END_SCANS, KILLED_NOTE and UNCONFIRMED_NOTE (this program
#: imports nothing of the controller's; tests/executor/test_kill.py checks that they are equal).
KILL_ROUNDS = 40
EMPTY_SCANS, END_SCANS = 3, 2
#: Seconds between two scans that found the session empty (a forking chain seen in /proc in between).
EMPTY_SCAN_GAP_S = 0.005
KILLED_NOTE = b"[runbook] stopped: every process of the step's session was killed"
UNCONFIRMED_NOTE = b"[runbook] could not confirm that the step's processes were killed"
#: The end-of-step sweep reads only the pids handed out since the step started while there are at most
#: SINCE_MAX of them, and only for a step that ran less than pid_max / FORKS_PER_S seconds (a faster rate
#: of process starts than any host reaches: the pids cannot have come round all the way meanwhile).
SINCE_MAX = 4096
FORKS_PER_S = 200_000
#: How often the guard reads the steps the runner started and ended (the pipe holds 4096 of them and
#: more: a runner that starts steps faster than that waits on the write, never loses a line).
GUARD_DRAIN_S = 1.0
#: The exit code the wrapper gives a step that could not start (its payload could not be stored).
NOT_STARTED = 125
#: bash's code for a command not found (the wrapper's `exec bash`, where a var PATH lacks bash).
BASH_NOT_FOUND = 127
CHUNK = 65536
#: A step's `kill_at` once its group got KILL: no deadline left (a select timeout cannot be infinite).
KILLED = float("inf")
ENV_FD = 3
SCRIPT_FILE = "script"  # in the step's folder, as the wrapper names it


def pack_fields(*fields: bytes) -> bytes:
    return b"".join(FIELD.pack(len(field)) + field for field in fields)


def pack_env(env: Mapping[str, str]) -> bytes:
    """A step's vars as NUL-separated `NAME=value` entries (as `env -0` writes them)."""
    return b"\0".join(f"{name}={value}".encode() for name, value in env.items())


def unpack_env(data: bytes) -> dict[bytes, bytes]:
    env = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name] = value
    return env


def unpack_fields(data: bytes) -> list[bytes]:
    fields, pos = [], 0
    while pos < len(data):
        (size,) = FIELD.unpack_from(data, pos)
        pos += FIELD.size
        fields.append(data[pos : pos + size])
        pos += size
    return fields


def frame(request: int, kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), request, kind) + payload


def exit_code(returncode: int) -> int:
    """As bash's `wait` reports it: 128 + the signal for a killed process."""
    return returncode if returncode >= 0 else 128 - returncode


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def session_members(sid: int, since: int | None = None) -> list[int] | None:
    """Every live process of session `sid` (field 6 of /proc/PID/stat, counted after the command
    name, which may hold spaces and parens), whatever process group it is in; None without /proc.

    `since`: the newest pid when the session's leader was started. Every member started after it, so
    only the pids handed out since are read (`_members_since`) where that can be trusted; else all."""
    if since is not None:
        found = _members_since(sid, since)
        if found is not None:
            return found
    before = newest_pid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    if not os.path.exists("/proc/self/stat"):
        return None
    found = [int(entry) for entry in entries if entry.isdigit() and _in_session(entry, sid)]
    # a process that forked and exited while /proc was read lives on in a pid the listing did not hold: chase
    # the pids handed out since, as `_members_since` does (CI: a fork chain outlived a kill confirmed so)
    later = _members_since(sid, before) if before is not None else None
    return found + [pid for pid in later or () if pid not in found]


def _in_session(pid: str | int, sid: int) -> bool:
    """Whether process `pid` lives (not a zombie) in session `sid`; False when it is gone."""
    try:  # os.open/os.read: a third cheaper than open(); every step's end pays for a scan or two
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:  # it ended meanwhile (or never was)
        return False
    fields = stat[stat.rfind(b")") + 1 :].split()
    return len(fields) > 3 and fields[0] not in (b"Z", b"X") and int(fields[3]) == sid


def newest_pid() -> int | None:
    """The pid the kernel handed out last (the 5th field of /proc/loadavg); None where it cannot be read."""
    try:
        fd = os.open("/proc/loadavg", os.O_RDONLY)
        try:
            return int(os.read(fd, 256).split()[4])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return None


def _members_since(sid: int, since: int) -> list[int] | None:
    """The members of session `sid` among the pids handed out after `since` (pids go up one by one,
    skipping those in use, until they come round at pid_max): the range is read, then the pids handed
    out meanwhile, range after range until none is new, so that a process that forks and exits while
    the range is read is seen through its child. None (read them all) once pids came round since, or
    more than SINCE_MAX were handed out. The caller makes sure that they cannot have come round all
    the way (`Runner.since_for`)."""
    found: list[int] = []
    seen = since
    while True:
        newest = newest_pid()
        if newest is None or newest < seen or newest - since > SINCE_MAX:
            return None
        if newest == seen:
            return found
        found += [pid for pid in range(seen + 1, newest + 1) if _in_session(pid, sid)]
        seen = newest


def signal_session(sid: int, signum: int, since: int | None = None) -> list[int] | None:
    """Send `signum` to the step's process group, to its leader and to every process of its session;
    the processes found there (None without /proc: then only the group got it). `since`: as for
    `session_members`."""
    signal_group(sid, signum)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(sid, signum)
    members = session_members(sid, since)
    for pid in members or ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    return members


def kill_session(sid: int, scans: int = EMPTY_SCANS, since: int | None = None) -> list[int] | None:
    """KILL session `sid` round after round until it is empty (its processes may fork meanwhile):
    [] once it is, the survivors of the last round, None without /proc (only the group got KILL).
    `since`: as for `session_members`."""
    empty = 0
    for turn in range(KILL_ROUNDS):
        members = signal_session(sid, signal.SIGKILL, since)
        if members is None:
            return None
        if not members:
            empty += 1
            if empty >= scans:  # `scans` in a row: one can miss a process that forks and exits meanwhile
                return members
            time.sleep(EMPTY_SCAN_GAP_S)  # spread apart: back to back, a loaded host can miss it every time
            continue
        empty, scans = 0, EMPTY_SCANS
        if turn >= 5:
            time.sleep(0.05)
    return session_members(sid, since)


def kill_note(survivors: list[int] | None, stopped: bool) -> bytes:
    """The last line of the step's stderr: what the host confirmed (as the wrapper writes it). Empty
    for a step that ended on its own and left nothing that survived."""
    if survivors is None:
        return (
            b"\n%s: this host has no /proc, only its process group was killed\n" % UNCONFIRMED_NOTE if stopped else b""
        )
    if survivors:
        what = b"still running after KILL" if stopped else b"the script left running survived KILL"
        pids = b" ".join(b"%d" % pid for pid in survivors)
        return b"\n%s: %d %s (pids %s)\n" % (UNCONFIRMED_NOTE, len(survivors), what, pids)
    return b"\n%s\n" % KILLED_NOTE if stopped else b""


def login_environment() -> dict[bytes, bytes]:
    """The login shell's environment as `env -0` wrote it on fd 3, else this process's own."""
    try:
        chunks = []
        while True:
            chunk = os.read(ENV_FD, CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(ENV_FD)
    except OSError:
        return dict(os.environb)
    env = unpack_env(b"".join(chunks))
    env.pop(b"_", None)  # env's own path; bash sets the step's own
    return env


class Step:
    """One running step: its process, its open output pipes, its folder."""

    def __init__(self, request: int, proc: subprocess.Popen[bytes], folder: str, since: int | None) -> None:
        self.request = request
        self.proc = proc
        self.folder = folder
        #: the newest pid before it started (every process of its session came after), and when
        self.since = since
        self.started = time.monotonic()
        self.exited = False
        self.kill_at: float | None = None
        self.streams: dict[int, int] = {}  # fd -> STDOUT | STDERR
        #: Its stderr ended before its session was killed: the end is sent after the note that says so.
        self.stderr_ended = False


class Guard:
    """A forked process that stops every step's group if the runner dies without doing so."""

    def __init__(self) -> None:
        read_end, self.fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guard: nothing of the channel stays open in it
            os.close(self.fd)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            self._watch(read_end)
        os.close(read_end)

    @staticmethod
    def _watch(fd: int) -> None:
        """Wait for the runner's end (its end of the pipe closes), reading what it said meanwhile once a
        GUARD_DRAIN_S, not at every line: a step's start and end then wake no second process."""
        groups: set[int] = set()  # the steps' sessions (a step's pid is its session's and its group's id)
        data = b""
        os.set_blocking(fd, False)
        poller = select.poll()
        poller.register(fd, 0)  # POLLHUP only (always reported): the runner is gone
        ended = False
        while not ended:
            ended = bool(poller.poll(GUARD_DRAIN_S * 1000))
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    ended = True
                    break
                data += chunk
            *lines, data = data.split(b"\n")
            for line in lines:
                (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
        for sid in groups:
            signal_session(sid, signal.SIGTERM)
        if groups:
            time.sleep(STOP_GRACE_S)
        for sid in groups:
            kill_session(sid)
        os._exit(0)

    def tell(self, sign: bytes, pgid: int) -> None:
        with contextlib.suppress(OSError):  # the guard is gone: the runner still works, unguarded
            os.write(self.fd, b"%s%d\n" % (sign, pgid))


class Runner:
    def __init__(self, env: dict[bytes, bytes]) -> None:
        self.env = env
        self.steps: dict[int, Step] = {}
        self.selector = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.connected = True
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(wake_read, selectors.EVENT_READ, "wake")
        self.selector.register(0, selectors.EVENT_READ, "stdin")
        self.pid_max = read_pid_max()
        self.guard = Guard()

    # --- to the controller ---

    def send(self, request: int, kind: int, payload: bytes = b"") -> None:
        """Queue a frame; `flush` writes the queue at the end of each turn of the loop, in one write
        where it fits (fewer SSH packets than a write per frame)."""
        if self.connected:
            self.outbox += frame(request, kind, payload)

    def flush(self) -> None:
        try:
            write_all(1, self.outbox)
        except OSError:  # the channel is gone
            self.lost()
        self.outbox.clear()

    # --- from the controller ---

    def receive(self) -> None:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            self.lost()
            return
        self.inbox += chunk
        while len(self.inbox) >= HEADER.size:
            size, request, kind = HEADER.unpack_from(self.inbox)
            if len(self.inbox) < HEADER.size + size:
                break
            payload = bytes(self.inbox[HEADER.size : HEADER.size + size])
            del self.inbox[: HEADER.size + size]
            if kind == RUN:
                self.start(request, payload)
            elif kind == STOP and request in self.steps:
                self.stop(self.steps[request])
            elif kind == ABANDON and request in self.steps:
                self.close_streams(self.steps[request])

    def lost(self) -> None:
        """The controller is gone: stop every step, as the wrapper does when its stdin closes."""
        if not self.connected:
            return
        self.connected = False
        self.selector.unregister(0)
        for step in list(self.steps.values()):
            self.close_streams(step)
            self.stop(step)

    # --- steps ---

    def start(self, request: int, payload: bytes) -> None:
        step_env, script = unpack_fields(payload)
        folder = ""
        try:
            base = os.environb.get(b"TMPDIR") or b"/tmp"
            folder = os.path.join(base.decode(), "runbook." + os.urandom(6).hex())
            os.mkdir(folder, 0o700)
            path = os.path.join(folder, SCRIPT_FILE)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                write_all(fd, script)
            finally:
                os.close(fd)
            since = newest_pid()
            proc, out, err = self.spawn([b"bash", os.fsencode(path)], {**self.env, **unpack_env(step_env)})
        except OSError as exc:
            if folder:
                remove_folder(folder)
            if folder and isinstance(exc, FileNotFoundError) and exc.filename == b"bash":
                # a var PATH without bash in it: as the wrapper's `exec bash` says
                self.refuse(request, b"runbook-step: line 1: exec: bash: not found\n", BASH_NOT_FOUND)
            else:
                self.refuse(request, f"runbook: the runner could not start the step: {exc}\n".encode(), NOT_STARTED)
            return
        self.guard.tell(b"+", proc.pid)
        step = Step(request, proc, folder, since)
        for fd, kind in ((out, STDOUT), (err, STDERR)):
            step.streams[fd] = kind
            self.selector.register(fd, selectors.EVENT_READ, step)
        self.steps[request] = step
        self.reap(step)  # a SIGCHLD may have come before the step was known

    def refuse(self, request: int, message: bytes, code: int) -> None:
        """A step that did not start: `message` on its stderr, its streams' ends, `code`."""
        for kind, data in ((STDERR, message), (STDOUT, b""), (STDERR, b"")):
            self.send(request, kind, data)
        self.send(request, EXIT, struct.pack(">i", code))

    @staticmethod
    def spawn(argv: list[bytes], env: dict[bytes, bytes]) -> tuple[subprocess.Popen[bytes], int, int]:
        """Start `argv` (found on `env`'s PATH, as the wrapper's `exec bash` finds it) as its own
        session, stdin at /dev/null, nothing else of the runner open in it; the process and the read
        ends of its stdout and stderr. (Popen rather than os.posix_spawn: glibc's posix_spawn leaves
        its internal signals 32 and 33 ignored in the child, which the wrapper's steps never see.)"""
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        fds = []
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            fds.append(os.dup(pipe.fileno()))
            pipe.close()
        return proc, fds[0], fds[1]

    def stop(self, step: Step) -> None:
        """TERM to the step's session; KILL follows once it is empty or STOP_GRACE_S has passed (`serve`)."""
        if not step.exited and step.kill_at is None:
            signal_session(step.proc.pid, signal.SIGTERM)
            step.kill_at = time.monotonic() + STOP_GRACE_S

    def forward(self, fd: int, step: Step) -> None:
        data = os.read(fd, CHUNK)
        kind = step.streams[fd]
        if data:
            self.send(step.request, kind, data)
            return
        self.selector.unregister(fd)
        os.close(fd)
        del step.streams[fd]
        if kind == STDERR and not step.exited:
            step.stderr_ended = True  # `reap` sends the end after its note
        else:
            self.send(step.request, kind, b"")
        self.forget(step)

    def drain(self, step: Step) -> None:
        """Forward what the step's pipes still hold, once its session is dead (so before the note that
        says so, as in the wrapper, where the note follows the step's output in the same pipe).
        Bounded: a process that left the session (setsid) may hold a pipe and keep writing."""
        for fd in list(step.streams):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            for _ in range(256):
                if fd not in step.streams or not poller.poll(0):
                    break
                self.forward(fd, step)

    def close_streams(self, step: Step) -> None:
        for fd in list(step.streams):
            self.selector.unregister(fd)
            os.close(fd)
        step.streams.clear()
        self.forget(step)

    def reap(self, step: Step) -> None:
        """Once the step's process has exited: kill what it left in its session (a stopped step's
        session gets TERM's grace to empty itself first), say what the host confirmed, report the exit."""
        pid = step.proc.pid
        if step.exited or os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return
        kill_at = step.kill_at
        if kill_at is not None and time.monotonic() < kill_at < KILLED and session_members(pid):
            return  # `serve` looks again every STOP_POLL_S
        # before reaping: the session's id cannot be reused yet
        if kill_at is None:  # it ended on its own: the common case, paid by every step
            survivors = kill_session(pid, END_SCANS, self.since_for(step))
        else:
            survivors = kill_session(pid, EMPTY_SCANS)
        self.drain(step)
        note = kill_note(survivors, stopped=kill_at is not None)
        if note:
            self.send(step.request, STDERR, note)
        if step.stderr_ended:
            self.send(step.request, STDERR, b"")
        code = exit_code(step.proc.wait())
        self.guard.tell(b"-", pid)
        step.exited = True
        self.send(step.request, EXIT, struct.pack(">i", code))
        self.flush()  # the controller goes on while the folder is removed (an rmdir is ~0.2 ms)
        remove_folder(step.folder)
        self.forget(step)

    def since_for(self, step: Step) -> int | None:
        """The step's `since` while pids cannot have come round all the way since it started (that takes
        pid_max of them: at most FORKS_PER_S a second); None (read every process) after that."""
        trusted = step.since is not None and time.monotonic() - step.started < self.pid_max / FORKS_PER_S
        return step.since if trusted else None

    def forget(self, step: Step) -> None:
        if step.exited and not step.streams:
            self.steps.pop(step.request, None)

    def serve(self) -> None:
        while self.connected or self.steps:
            now = time.monotonic()
            deadlines = [
                min(s.kill_at, now + STOP_POLL_S)  # a stopped step's session may empty before its grace ends
                for s in self.steps.values()
                if s.kill_at is not None and s.kill_at < KILLED and not s.exited
            ]
            for key, _ in self.selector.select(max(0.0, min(deadlines) - now) if deadlines else None):
                if key.data == "stdin":
                    self.receive()
                elif key.data == "wake":
                    os.read(key.fd, 4096)
                elif isinstance(key.data, Step) and key.fd in key.data.streams:
                    self.forward(key.fd, key.data)
            for step in list(self.steps.values()):
                self.reap(step)
                if not step.exited and step.kill_at is not None and time.monotonic() >= step.kill_at:
                    kill_session(step.proc.pid)
                    step.kill_at = KILLED
            self.flush()


def read_pid_max() -> int:
    """/proc/sys/kernel/pid_max (pids come round after it); 0 where it cannot be read (then no step's
    sweep trusts the pids handed out since it started)."""
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 0


def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def remove_folder(folder: str) -> None:
    """A step's folder, with whatever the step added to it (as the wrapper's `rm -rf`)."""
    try:
        os.unlink(os.path.join(folder, SCRIPT_FILE))
        os.rmdir(folder)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


def read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            sys.exit(3)
        data += chunk
    return data


def main() -> None:
    """Echo the controller's token (everything before it on stdout is the login shell's), then serve."""
    if not hasattr(os, "waitid"):  # before the token: the host falls back to the exec path
        sys.exit("runbook runner: needs Linux (os.waitid)")
    env = login_environment()
    os.umask(0o077)
    for signum in (signal.SIGINT, signal.SIGQUIT):  # inherited by steps, as by a bash background job
        signal.signal(signum, signal.SIG_IGN)
    token = read_exactly(0, TOKEN_BYTES)
    runner = Runner(env)
    os.write(1, token)
    runner.serve()


if __name__ == "__main__":
    main()
