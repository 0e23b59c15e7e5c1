"""The `deploy` step's program ON THE HOST: stdlib only, Python >= 3.8 (MIN_PYTHON); one result document.

Run by the SGLang virtualenv's python, shipped with the kit (hostprograms/kit.py). Its config: `action`
(start | launch | watch | stop), `port`, `bind`, `env` (set for the server), `ready_timeout`,
`stop_timeout`, `state_dir`, `launch`, and for a node group's ranks `serves_http` (launch) and
`probe_http` (watch). `state_dir` (e.g. ~/.runbook/sglang; `~` and `$var` expand here) holds, per port,
`<port>.json`: the server this program started there (pid, its start time, argv, env, log file).
`launch` is the full launch command, each word `[text, expands]`: a word that expands is a path or
argument of the runbook's, in which `~` and `$var` expand as bash would (kit.expand_path).

start: a recorded server that is alive with the same argv and env is adopted (`reused`) and only its
readiness is checked; one with other arguments is stopped first (TERM to its process group, wait,
KILL). A port held by anything else is refused, naming the holder. A new server runs in its own
session (it outlives the SSH connection and the step's process group), its stdout and stderr in its
own log file. Readiness is `/health` 200 and then a real one-token `/generate`, polled while the
process is watched: if it exits, the answer comes at once with the error line and tail of its log;
if it is not ready in `ready_timeout`, it is stopped (its GPUs freed) and the answer says what
/health last said.

launch: one rank of a node group. Starts or adopts its server as start does, but answers at once,
without the readiness wait (the controller waits for all ranks together, by watch); a keeper process
records the server's exit status in `<port>.exit.json`. `serves_http: false` (a rank > 0, which serves
no HTTP: its port only names its state file) skips the check that the port is free.

watch: one look at the recorded server, changing nothing: alive or its exit status, its log's error
line (an NCCL error counts even while the process lives), last line and seconds since it was last
written (its tail only once it exited or printed an error line), and with `probe_http` (rank 0)
/health, then a one-token /generate.

stop: stops the recorded server on the port, if any, and says so either way; a server that ended by itself
with status 0 (a node group's rank > 0 once rank 0 stopped) is stopped too, and any process left of its group
is stopped all the same (`gpu_freed` after the same bounded wait).

Progress goes to stderr as `runbook-progress {json}` lines, for the controller's live display.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from stat import S_ISREG
from typing import Any, NamedTuple

from hostprograms import kit
from hostprograms.kit import port_holder

MIN_PYTHON = (3, 8)
POLL_S = 0.5
PROGRESS_EVERY_S = 2.0
TAIL_LINES = 30
TAIL_BYTES = 64 * 1024
LINE_CHARS = 1000  # of a log line as a look reads it (log_tail)
SERVER_INFO_MAX = 4 * 1024 * 1024  # bytes of /server_info read for its version
#: The prompt of the readiness probe: one token at temperature 0.
READY_PROMPT = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
_EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception)\b(?::|$)")
_ERROR_WORDS = re.compile(r"error|unsupported|failed|killed|out of memory", re.IGNORECASE)
#: Lines of torch.distributed/NCCL that mean a rank is lost even while its process lives on: an NCCL error
#: (`torch.distributed.DistBackendError: NCCL error in: ...`), and ProcessGroupNCCL's watchdog timing a
#: collective out. Not any ProcessGroupNCCL line: its warnings (`using GPU 0 to perform barrier ...`) are
#: part of a healthy start-up.
_NCCL_ERROR = re.compile(r"NCCL error|DistBackendError|ProcessGroupNCCL.*(?:watchdog|timed out|timeout)", re.IGNORECASE)
#: A server's start-up failures that a second start meets again, as executor/errors.py names their classes:
#: argparse refusing the launch command (it prints `PROG: error: ...` and exits 2), and memory running out
#: (torch's OutOfMemoryError, SGLang's "Not enough memory" for its KV cache).
_ARGPARSE_ERROR = re.compile(r"^\S+: error: ")
_OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|Not enough memory", re.IGNORECASE)
#: How long watch's /health and /generate may take: one look, not a wait.
WATCH_HTTP_S = 30.0
#: How long a stop waits for the keeper's record of a kept server that it found exited (written right after
#: the exit; only a keeper that died itself never writes it).
EXIT_RECORD_WAIT_S = 5.0


# ---------------------------------------------------------------- pure helpers


def client_host(bind: str) -> str:
    """The address a client ON THE HOST uses for a server bound to `bind`."""
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind == "::":
        return "[::1]"
    return f"[{bind}]" if ":" in bind else bind


def base_url(bind: str, port: int) -> str:
    return f"http://{client_host(bind)}:{port}"


def error_line(lines: list[str]) -> str | None:
    """The line of a server log that says what went wrong: the last exception line (`RuntimeError: ...`),
    else the last line with an error word, else None."""
    for pattern in (_EXCEPTION_LINE, _ERROR_WORDS):
        for line in reversed(lines):
            if pattern.search(line):
                return line.strip()
    return None


def startup_failure_class(lines: list[str], exit_code: int | None) -> str | None:
    """The failure class of a server that exited during start-up, when its log shows one that retrying cannot
    fix ("ConfigRefused", "OutOfMemory": by its error line, not a warning that mentions memory); None when its
    log does not say (it may pass on another start)."""
    if exit_code == 2 and any(_ARGPARSE_ERROR.match(line) for line in lines):
        return "ConfigRefused"
    if _OUT_OF_MEMORY.search(error_line(lines) or ""):
        return "OutOfMemory"
    return None


def nccl_error_line(lines: list[str]) -> str | None:
    """The last line of a rank's log that says its process group is broken (an NCCL error, a watchdog
    timeout), or None: such a rank may live on, hung, until the dist-timeout, so this is read while it runs."""
    for line in reversed(lines):
        if _NCCL_ERROR.search(line):
            return line.strip()
    return None


def watched_error_line(lines: list[str], running: bool) -> str | None:
    """What a look at a rank's log names as its error: while it runs, only an NCCL line (a running server's
    log may say `failed` in a warning); once it exited, `error_line`, else an NCCL line that has none of
    its words (a watchdog timeout)."""
    if running:
        return nccl_error_line(lines)
    return error_line(lines) or nccl_error_line(lines)


def parse_stat(text: str) -> dict[str, Any]:
    """/proc/PID/stat: state, process group and start time (clock ticks after boot). The command name,
    in parentheses, may itself hold spaces and parentheses: the fields follow its last `)`."""
    fields = text[text.rindex(")") + 2 :].split()
    return {"state": fields[0], "pgrp": int(fields[2]), "starttime": int(fields[19])}


# ---------------------------------------------------------------- processes


def proc_stat(pid: int) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return parse_stat(handle.read())
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, starttime: int | None) -> bool:
    """The process `pid` runs (not a zombie) and is the one that started at `starttime` (pids get reused)."""
    stat = proc_stat(pid)
    return stat is not None and stat["state"] != "Z" and (starttime is None or stat["starttime"] == starttime)


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group: a server's workers (schedulers, detokenizer) hold GPU memory too."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat["pgrp"] == pgid and stat["state"] != "Z":
                members.append(int(name))
    return sorted(members)


def new_log(state_dir: str, port: int) -> str:
    """A log file of this start's own, created empty (`PORT-STAMP.log`, `PORT-STAMP-N.log` after another start on
    the port in the same second: a retry, a fallback). A shared one would hold the earlier server's lines, and its
    out-of-memory or argparse error would be read as this server's failure class."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    taken = 0
    while True:  # ends: each turn tries a name no earlier turn tried, and the folder holds finitely many
        log_file = os.path.join(state_dir, f"{port}-{stamp}{f'-{taken}' if taken else ''}.log")
        try:
            os.close(os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return log_file
        except FileExistsError:
            taken += 1


def spawn(argv: list[str], env: dict[str, str], log_file: str) -> subprocess.Popen[bytes]:
    """Start the server in its own session and process group (it outlives the step and the SSH connection),
    stdout and stderr appended to `log_file`."""
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env},
            cwd=os.path.expanduser("~"),
        )


def spawn_kept(argv: list[str], env: dict[str, str], log_file: str, exit_file: str) -> tuple[int, int | None]:
    """`spawn` from a keeper: a forked process of its own session that waits for the server and writes its
    exit status to `exit_file` (with the pid and start time it belongs to). Returns (pid, start time).

    For `launch`, which returns at once: the server's exit status is only its parent's to read, and once
    this program exits, the parent would be init. The keeper holds none of this program's files (not its
    stdout, the SSH channel, which would stay open; not the port's lock).
    """
    read_end, write_end = os.pipe()
    if os.fork() == 0:  # the keeper: never returns into the program
        try:
            os.setsid()
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            for name in os.listdir("/proc/self/fd"):
                if int(name) > 2 and int(name) != write_end:
                    with contextlib.suppress(OSError):
                        os.close(int(name))
            try:
                child = spawn(argv, env, log_file)
            except OSError as exc:
                os.write(write_end, json.dumps({"error": str(exc)}).encode())
                raise
            stat = proc_stat(child.pid)
            starttime = None if stat is None else stat["starttime"]
            os.write(write_end, json.dumps({"pid": child.pid, "starttime": starttime}).encode())
            os.close(write_end)
            code = child.wait()
            write_json(exit_file, {"pid": child.pid, "starttime": starttime, "exit_code": code})
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = json.loads(pipe.read() or b'{"error": "the keeper process died before it started the server"}')
    if "error" in said:
        raise OSError(said["error"])
    return said["pid"], said["starttime"]


def stop_group(pgid: int, timeout: float, child: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """TERM the group, wait up to `timeout` for every member to exit, then KILL what is left.

    `gpu_freed`: no process of the group is left, so none holds GPU memory any more. An empty group is not
    signalled: its number, free again, may since lead another group.
    """
    members = group_members(pgid)
    if not members:
        return {"pids": [], "killed": False, "left": [], "gpu_freed": True}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    killed = False
    deadline = time.monotonic() + timeout
    while True:
        if child is not None:
            child.poll()  # reap our own child, else it lingers as a zombie
        left = group_members(pgid)
        if not left:
            break
        if time.monotonic() >= deadline:
            if killed:
                break
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.2)
    return {"pids": members, "killed": killed, "left": left, "gpu_freed": not left}


# ---------------------------------------------------------------- ports


class BindError(Exception):
    """The bind address cannot be used here at all (not this host's, say): the step fails saying so."""


def port_free(bind: str, port: int) -> bool:
    """Whether a server could listen on bind:port now (a listener there, on any address, says no)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind or "0.0.0.0", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise BindError(f"cannot listen on {bind}:{port} on this host: {exc.strerror}") from None
    return True


# ---------------------------------------------------------------- logs, HTTP


def log_tail(path: str) -> list[str]:
    """The last TAIL_LINES lines (not blank) of the log's last TAIL_BYTES, each cut to LINE_CHARS (` ...` marks a
    cut); [] when it cannot be read. Only a regular file is read, and at most TAIL_BYTES of it, whatever it
    grows to meanwhile: a look at a rank must end, and a log replaced by a FIFO would block it, one linked to
    /dev/zero never end; a line of megabytes would be carried (and scanned for errors) on every look."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        try:
            info = os.fstat(fd)
            if not S_ISREG(info.st_mode):
                return []
            handle.seek(max(info.st_size - TAIL_BYTES, 0))
            text = handle.read(TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    return [line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " ..." for line in lines]


def http(method: str, url: str, body: Any = None, timeout: float = 10.0, limit: int = 4096) -> tuple[int | None, str]:
    """(status, the body's first `limit` bytes as text) of one request whose whole answer comes within
    `timeout`; status None with the reason, naming the server, when there was no such answer."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    try:
        status, answer = kit.exchange(url, timeout, method=method, headers=headers, data=data, limit=limit)
    except kit.NoAnswer as exc:  # refused, reset, too slow
        return None, str(exc)
    return status, answer.decode("utf-8", "replace")


def progress(message: str, **fields: Any) -> None:
    kit.progress({"message": message, **fields})


# ---------------------------------------------------------------- state


def state_path(state_dir: str, port: int) -> str:
    return os.path.join(state_dir, f"{port}.json")


def read_state(state_dir: str, port: int) -> dict[str, Any] | None:
    """The state `write_state` left for `port`, or None: a file of another shape is no server of ours.

    The stop signals the group `pgid` names: write_state always records the pid, which leads its own
    session, so a file naming another group (0 is the program's own, 1 init's) is not trusted.
    """
    try:
        with open(state_path(state_dir, port)) as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    pid, starttime = state.get("pid"), state.get("starttime")
    ours = (
        type(pid) is int
        and pid > 1
        and type(state.get("pgid")) is int
        and state["pgid"] == pid
        and (starttime is None or type(starttime) is int)
        and isinstance(state.get("log_file"), str)
    )
    return state if ours else None


def write_state(state_dir: str, port: int, state: dict[str, Any]) -> None:
    write_json(state_path(state_dir, port), state)


def write_json(path: str, document: dict[str, Any]) -> None:
    """Replace `path` whole: a reader sees the old document or the new one, never half of one."""
    with open(path + ".tmp", "w") as handle:
        json.dump(document, handle, indent=1)
    os.replace(path + ".tmp", path)


def exit_path(state_dir: str, port: int) -> str:
    return os.path.join(state_dir, f"{port}.exit.json")


def recorded_exit_code(state_dir: str, port: int, recorded: dict[str, Any]) -> int | None:
    """The exit status `spawn_kept`'s keeper wrote for the recorded server, or None (not exited, not kept,
    or a file left by an earlier server on the port: another pid or start time)."""
    try:
        with open(exit_path(state_dir, port)) as handle:
            said = json.load(handle)
        same = said["pid"] == recorded["pid"] and said["starttime"] == recorded.get("starttime")
        code = said["exit_code"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return code if same and type(code) is int else None


def idle_seconds(path: str) -> float | None:
    """Seconds since `path` (a log) was last written, or None when it is not there."""
    try:
        return round(max(time.time() - os.path.getmtime(path), 0.0), 1)
    except OSError:
        return None


def forget(state_dir: str, port: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(state_path(state_dir, port))


@contextlib.contextmanager
def port_lock(state_dir: str, port: int) -> Iterator[None]:
    """One deploy program per port at a time on this host."""
    path = os.path.join(state_dir, f"{port}.lock")
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # said first, so that a step timing out here says why
            progress(f"another deploy program holds {path}: waiting for it", phase="lock")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# ---------------------------------------------------------------- readiness


def probe(url: str, limit: float) -> tuple[dict[str, Any], dict[str, Any] | None, bool]:
    """(/health's answer, /generate's to the one-token prompt, asked only after /health said 200, else
    None; whether it generated text: the server serves), both within `limit` seconds (and 10 s for
    /health, 120 s for /generate): /generate gets what /health left of it."""
    end = time.monotonic() + limit
    status, body = http("GET", url + "/health", timeout=min(10.0, limit))
    health = {"status": status, "body": body[:200]}
    if status != 200:
        return health, None, False
    status, body = http("POST", url + "/generate", READY_PROMPT, timeout=min(120.0, max(end - time.monotonic(), 0.0)))
    return health, {"status": status, "body": body[:300]}, status == 200 and '"text"' in body


def wait_ready(
    url: str, pid: int, starttime: int | None, log_file: str, timeout: float, child: subprocess.Popen[bytes] | None
) -> dict[str, Any]:
    """Poll /health, then /generate, until both answer or the process exits or `timeout` passes.

    Returns `ready`, `ready_s`, `exit_code` (when it exited; None for an adopted process, whose status is
    not ours to read), `health` and `generate` (the last answers).
    """
    started = time.monotonic()
    last_progress = 0.0
    health: dict[str, Any] = {"status": None, "body": "not asked yet"}
    generate: dict[str, Any] = {"status": None, "body": "not asked yet"}

    def answer(ready: bool, exited: bool = False, exit_code: int | None = None) -> dict[str, Any]:
        elapsed = round(time.monotonic() - started, 2)
        return {"ready": ready, "exited": exited, "exit_code": exit_code, "elapsed_s": elapsed,
                "health": health, "generate": generate}  # fmt: skip

    while True:
        exit_code = child.poll() if child is not None else None
        if exit_code is not None or not alive(pid, starttime):
            return answer(False, exited=True, exit_code=exit_code)
        left = max(timeout - (time.monotonic() - started), 0.1)
        health, asked, served = probe(url, left)
        if asked is not None:
            generate = asked
        if served:
            return answer(True)
        elapsed = time.monotonic() - started
        if elapsed >= timeout:
            return answer(False)
        if elapsed - last_progress >= PROGRESS_EVERY_S:
            last_progress = elapsed
            tail = log_tail(log_file)
            progress(
                f"waiting for the server (pid {pid}): /health {health['status'] or health['body'][:60]}, "
                f"{elapsed:.0f}s of {timeout:.0f}s" + (f"; log: {tail[-1][:120]}" if tail else ""),
                phase="waiting",
                elapsed_s=round(elapsed, 1),
                timeout_s=timeout,
                health=health["status"],
            )
        time.sleep(POLL_S)


def server_version(url: str) -> tuple[str | None, str | None]:
    """The `version` that /server_info answers (SGLang's `__version__`), or None and why it is not known."""
    # every server argument comes with it (a real 0.5.23 answers tens of kilobytes): read all of it
    status, body = http("GET", url + "/server_info", timeout=10.0, limit=SERVER_INFO_MAX)
    if status != 200:
        return None, f"/server_info answered {describe_answer({'status': status, 'body': body})}"
    try:
        version = json.loads(body).get("version")
    except (ValueError, AttributeError, RecursionError):  # RecursionError: nested past the parser's depth
        return None, f"/server_info answered no JSON object: {body[:100]!r}"
    if not isinstance(version, str) or not version:
        return None, f"/server_info has no version (it says {version!r})"
    return version, None


def exit_text(code: int | None) -> str:
    """` with status 1`, ` (killed by SIGKILL)`, or nothing when the status is not ours to read."""
    if code is None:
        return ""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f" (killed by {signal.Signals(-code).name})"
    return f" with status {code}"


def describe_answer(answer: dict[str, Any]) -> str:
    if answer["status"] is None:
        return f"no answer ({answer['body'][:100]})"
    return f"{answer['status']} {answer['body'][:100]!r}"


# ---------------------------------------------------------------- actions


class Server(NamedTuple):
    """The server `open_server` started or adopted on a port; `child` only when this program is its parent."""

    pid: int
    starttime: int | None
    log_file: str
    child: subprocess.Popen[bytes] | None


def server_report(action: str, config: dict[str, Any], state_dir: str, argv: list[str]) -> dict[str, Any]:
    """The document of `start` and `launch`, before the server is opened: nothing started, nothing known."""
    port, bind = config["port"], config["bind"]
    return {
        "action": action, "port": port, "bind": bind, "base_url": base_url(bind, port), "argv": argv,
        "state_file": state_path(state_dir, port), "pid": None, "log_file": None, "reused": False,
        "previous": None, "ready": False, "ready_s": None, "exit_code": None, "health": None, "generate": None,
        "error_line": None, "log_tail": [], "failure": None, "failure_class": None,
        "server_version": None, "server_version_unknown": "the server did not become ready",
    }  # fmt: skip


def open_server(
    config: dict[str, Any], state_dir: str, argv: list[str], report: dict[str, Any], kept: bool
) -> Server | None:
    """Adopt the server recorded on the port when it runs with the same argv and env, else stop it and
    start a new one (`kept`: from a keeper, `spawn_kept`, for a program that returns before the server
    exits), recording it in the state file. Fills `report`'s reused, previous, port_holder, pid and
    log_file; None when it cannot (`report["failure"]` says why).

    The port must be free for a new server unless config `serves_http` is false (a rank > 0 of a node
    group: its port only names its state file).
    """
    port, bind = config["port"], config["bind"]
    env = {str(k): str(v) for k, v in config["env"].items()}
    recorded = read_state(state_dir, port)
    if recorded is not None and not alive(recorded["pid"], recorded.get("starttime")):
        report["previous"] = {"pid": recorded["pid"], "action": "forgotten", "reason": "no longer running"}
        forget(state_dir, port)
        recorded = None
    if recorded is not None:
        if recorded.get("argv") == argv and recorded.get("env") == env:
            report["reused"] = True
            report["pid"], report["log_file"] = recorded["pid"], recorded["log_file"]
            progress(f"a server with these arguments runs already (pid {recorded['pid']}): checking it", phase="reuse")
            return Server(recorded["pid"], recorded.get("starttime"), recorded["log_file"], None)
        why = "its arguments differ" if recorded.get("argv") != argv else "its environment differs"
        progress(f"stopping the server on port {port} (pid {recorded['pid']}): {why}", phase="stop")
        stopped = stop_group(recorded["pgid"], config["stop_timeout"])
        report["previous"] = {"pid": recorded["pid"], "action": "stopped", "reason": why,
                              "argv": recorded.get("argv"), **stopped}  # fmt: skip
        if stopped["left"]:
            report["failure"] = (
                f"the previous server's processes {stopped['left']} survived SIGKILL; port {port} not reused"
            )
            return None
        forget(state_dir, port)
    if config.get("serves_http", True):
        try:
            free = port_free(bind, port)
        except BindError as exc:
            report["failure"] = str(exc)
            return None
        if not free:
            holder = port_holder(port)
            report["port_holder"], report["failure_class"] = holder, "PortInUse"
            report["failure"] = (
                f"port {port} is taken by {holder}, which is not a server this runbook started (no record in "
                f"{state_path(state_dir, port)}); stop it or deploy on another port"
            )
            return None
    log_file = new_log(state_dir, port)
    child = None
    if kept:
        pid, starttime = spawn_kept(argv, env, log_file, exit_path(state_dir, port))
    else:
        child = spawn(argv, env, log_file)
        pid = child.pid
        stat = proc_stat(pid)
        starttime = None if stat is None else stat["starttime"]
    write_state(state_dir, port, {
        "pid": pid, "pgid": pid, "starttime": starttime, "argv": argv, "env": env, "log_file": log_file,
        "port": port, "bind": bind, "started_at": time.time(), "kept": kept,
    })  # fmt: skip
    progress(f"started the server: pid {pid}, log {log_file}", phase="started", pid=pid, log_file=log_file)
    report["pid"], report["log_file"] = pid, log_file
    return Server(pid, starttime, log_file, child)


def start(config: dict[str, Any], state_dir: str, argv: list[str]) -> dict[str, Any]:
    report = server_report("start", config, state_dir, argv)
    server = open_server(config, state_dir, argv, report, kept=False)
    if server is None:
        return report
    url, port, log_file = report["base_url"], config["port"], server.log_file
    waited = wait_ready(url, server.pid, server.starttime, log_file, config["ready_timeout"], server.child)
    tail = log_tail(log_file)
    report.update(health=waited["health"], generate=waited["generate"], exit_code=waited["exit_code"])
    report["ready_s"] = waited["elapsed_s"] if waited["ready"] else None
    if waited["ready"]:
        report["ready"] = True
        report["server_version"], report["server_version_unknown"] = server_version(url)
        progress(f"ready after {waited['elapsed_s']:.1f}s: {url}", phase="ready", ready_s=waited["elapsed_s"])
        return report
    report["log_tail"], report["error_line"] = tail, error_line(tail)
    if waited["exited"]:
        code = exit_text(waited["exit_code"])
        said = report["error_line"] or (tail[-1] if tail else "its log is empty")
        report["failure_class"] = startup_failure_class(tail, waited["exit_code"])
        report["failure"] = (
            f"the server exited{code} during start-up after {waited['elapsed_s']:.1f}s: {said} (log: {log_file})"
        )
    else:
        report["failure"] = (
            f"the server was not ready after {config['ready_timeout']:g}s: /health answered "
            f"{describe_answer(waited['health'])}, /generate {describe_answer(waited['generate'])}; "
            f"stopped it (log: {log_file}, last line: {tail[-1][:200] if tail else '(empty)'})"
        )
    # a crashed server may leave workers behind, a server that never came up holds its GPUs: stop the group
    report["stopped"] = stop_group(server.pid, config["stop_timeout"], server.child)
    forget(state_dir, port)
    return report


def launch(config: dict[str, Any], state_dir: str, argv: list[str]) -> dict[str, Any]:
    """`start` without the readiness wait: one rank of a node group, whose readiness the controller waits
    for across all ranks at once (`watch`). Its exit status is kept for `watch` (spawn_kept)."""
    report = server_report("launch", config, state_dir, argv)
    report["server_version_unknown"] = "launch does not wait for the server to become ready"
    open_server(config, state_dir, argv, report, kept=True)
    return report


def watch(config: dict[str, Any], state_dir: str) -> dict[str, Any]:
    """One look at the server recorded on the port, changing nothing: whether it runs (else its exit
    status, when its keeper recorded it), its log (error line, last line, seconds since it was last
    written: a rank that hangs prints nothing) and, with `probe_http` (rank 0), /health and, once that
    says 200, a one-token /generate; once that answered, the version /server_info gives."""
    port = config["port"]
    report: dict[str, Any] = {"action": "watch", "port": port, "pid": None, "alive": False, "exit_code": None,
                              "log_file": None, "error_line": None, "last_line": None, "idle_s": None,
                              "log_tail": [], "health": None, "generate": None, "failure": None}  # fmt: skip
    recorded = read_state(state_dir, port)
    if recorded is None:
        report["failure"] = f"no server recorded on port {port}"
        return report
    running = alive(recorded["pid"], recorded.get("starttime"))
    log_file = recorded["log_file"]
    tail = log_tail(log_file)
    error = watched_error_line(tail, running)
    # the tail only when something went wrong: a group is watched every few seconds for up to an hour, and
    # every look's answer is audited
    report.update(pid=recorded["pid"], alive=running, log_file=log_file, log_tail=tail if error or not running else [],
                  error_line=error, last_line=tail[-1] if tail else None, idle_s=idle_seconds(log_file))  # fmt: skip
    if not running:
        report["exit_code"] = recorded_exit_code(state_dir, port, recorded)
    elif config.get("probe_http"):
        url = base_url(config["bind"], port)
        report["health"], report["generate"], served = probe(url, WATCH_HTTP_S)
        if served:  # the look that finds the group serving also records what serves (provenance)
            report["server_version"], report["server_version_unknown"] = server_version(url)
    return report


def stop(config: dict[str, Any], state_dir: str) -> dict[str, Any]:
    """Stop the server recorded on the port: its process group TERMed, waited for, KILLed. One that ended
    before this program looked (a node group's rank > 0 ends by itself once rank 0 stops, and every rank is
    stopped at once) has its group stopped all the same: its workers, which hold the GPU memory, may still
    be exiting or be left behind, so `gpu_freed` comes from the same bounded wait, never from one look."""
    port = config["port"]
    report: dict[str, Any] = {"action": "stop", "port": port, "state_file": state_path(state_dir, port),
                              "stopped": False, "pid": None, "argv": None, "log_file": None, "pids": [],
                              "killed": False, "gpu_freed": None, "note": None, "failure": None}  # fmt: skip
    recorded = read_state(state_dir, port)
    if recorded is None:
        report["note"] = f"no server recorded on port {port}: nothing to stop"
        return report
    report.update(pid=recorded["pid"], argv=recorded.get("argv"), log_file=recorded.get("log_file"))
    if alive(recorded["pid"], recorded.get("starttime")):
        progress(f"stopping the server on port {port} (pid {recorded['pid']})", phase="stop")
        report["stopped"] = True
    else:
        report["stopped"], report["note"] = how_it_ended(state_dir, port, recorded, config["stop_timeout"])
    stopped = stop_group(recorded["pgid"], config["stop_timeout"])
    report.update(pids=stopped["pids"], killed=stopped["killed"], gpu_freed=stopped["gpu_freed"])
    if stopped["left"]:
        report["failure"] = f"processes {stopped['left']} of the server survived SIGKILL"
        return report
    forget(state_dir, port)
    return report


def how_it_ended(state_dir: str, port: int, recorded: dict[str, Any], timeout: float) -> tuple[bool, str]:
    """(`stopped`, the note) for a server that a stop found no longer running. It was stopped when its keeper
    recorded status 0, a clean shutdown: how a node group's rank > 0 ends when rank 0's stop tells it to, so
    it is stopped whether its own node's stop came before that or after. The keeper writes the status just
    after the exit: for a kept server (launch) it is waited for, up to EXIT_RECORD_WAIT_S."""
    code = recorded_exit_code(state_dir, port, recorded)
    deadline = time.monotonic() + min(timeout, EXIT_RECORD_WAIT_S)
    while code is None and recorded.get("kept") is True and time.monotonic() < deadline:
        time.sleep(0.05)
        code = recorded_exit_code(state_dir, port, recorded)
    server = f"the server recorded on port {port} (pid {recorded['pid']})"
    if code == 0:
        return True, f"{server} had shut down cleanly (status 0), as a node group's rank > 0 does when rank 0 stops"
    return False, f"{server} was no longer running" + ("" if code is None else f": it had exited{exit_text(code)}")


def run(config: dict[str, Any]) -> dict[str, Any]:
    state_dir = kit.expand_path(config["state_dir"])
    if config["action"] == "watch":  # a look changes nothing: it neither creates the folder nor waits for the lock
        return watch(config, state_dir)
    argv = [kit.expand_path(text) if expands else text for text, expands in config.get("launch", [])]
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    with port_lock(state_dir, config["port"]):
        if config["action"] == "start":
            return start(config, state_dir, argv)
        if config["action"] == "launch":
            return launch(config, state_dir, argv)
        return stop(config, state_dir)


def main() -> int:
    return kit.main(run)
