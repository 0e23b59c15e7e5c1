"""The `deploy` step's program ON THE HOST: stdlib only, Python >= 3.8 (MIN_PYTHON); one result document.

Run by the SGLang virtualenv's python, shipped with the kit (hostprograms/kit.py). Its config: `action`
(start | stop), `port`, `bind`, `env` (set for the server), `ready_timeout`, `stop_timeout`,
`state_dir` and `launch`. `state_dir` (e.g. ~/.runbook/sglang; `~` and `$var` expand here) holds, per
port, `<port>.json`: the server this program started there (pid, its start time, argv, env, log file).
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

stop: stops the recorded server on the port, if any, and says so either way.

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
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from hostprograms import kit

MIN_PYTHON = (3, 8)
POLL_S = 0.5
PROGRESS_EVERY_S = 2.0
TAIL_LINES = 30
TAIL_BYTES = 64 * 1024
SERVER_INFO_MAX = 4 * 1024 * 1024  # bytes of /server_info read for its version
#: The prompt of the readiness probe: one token at temperature 0.
READY_PROMPT = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
_EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception)\b(?::|$)")
_ERROR_WORDS = re.compile(r"error|unsupported|failed|killed|out of memory", re.IGNORECASE)


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


def parse_stat(text: str) -> dict[str, Any]:
    """/proc/PID/stat: state, process group and start time (clock ticks after boot). The command name,
    in parentheses, may itself hold spaces and parentheses: the fields follow its last `)`."""
    fields = text[text.rindex(")") + 2 :].split()
    return {"state": fields[0], "pgrp": int(fields[2]), "starttime": int(fields[19])}


def listening_inodes(table: str, port: int) -> list[str]:
    """Socket inodes of /proc/net/tcp[6] rows LISTENing (state 0A) on `port`."""
    inodes = []
    for row in table.splitlines()[1:]:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            inodes.append(cols[9])
    return inodes


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


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def stop_group(pgid: int, timeout: float, child: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """TERM the group, wait up to `timeout` for every member to exit, then KILL what is left.

    `gpu_freed`: no process of the group is left, so none holds GPU memory any more.
    """
    members = group_members(pgid)
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


def port_holder(port: int) -> str:
    """Who listens on `port`, as `pid N (command line)`, or why that cannot be told."""
    inodes: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as handle:
            inodes += listening_inodes(handle.read(), port)
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for name in os.listdir("/proc") if wanted else []:
        if name.isdigit() and fd_links(name) & wanted:
            return f"pid {name} ({cmdline(int(name))[:200]})"
    return "a process this user cannot see"


def fd_links(pid: str) -> set[str]:
    """What the open files of a process point at (`socket:[123]`); fds that close meanwhile are skipped."""
    links = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


# ---------------------------------------------------------------- logs, HTTP


def log_tail(path: str) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(os.path.getsize(path) - TAIL_BYTES, 0))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]


def http(method: str, url: str, body: Any = None, timeout: float = 10.0, limit: int = 4096) -> tuple[int | None, str]:
    """(status, the body's first `limit` bytes as text) of one request; status None with the reason when there
    was no answer."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    try:
        with kit.request(url, method=method, headers=headers, data=data, timeout=timeout) as response:
            return response.status, response.read(limit).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:  # refused, reset, timed out
        reason = getattr(exc, "reason", exc)
        return None, str(reason)


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
    path = state_path(state_dir, port)
    with open(path + ".tmp", "w") as handle:
        json.dump(state, handle, indent=1)
    os.replace(path + ".tmp", path)


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
        status, body = http("GET", url + "/health", timeout=min(10.0, left))
        health = {"status": status, "body": body[:200]}
        if status == 200:
            status, body = http("POST", url + "/generate", READY_PROMPT, timeout=min(120.0, left))
            generate = {"status": status, "body": body[:300]}
            if status == 200 and '"text"' in body:
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
    except (ValueError, AttributeError):
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


def start(config: dict[str, Any], state_dir: str, argv: list[str]) -> dict[str, Any]:
    port, bind = config["port"], config["bind"]
    url = base_url(bind, port)
    env = {str(k): str(v) for k, v in config["env"].items()}
    report: dict[str, Any] = {
        "action": "start", "port": port, "bind": bind, "base_url": url, "argv": argv,
        "state_file": state_path(state_dir, port), "pid": None, "log_file": None, "reused": False,
        "previous": None, "ready": False, "ready_s": None, "exit_code": None, "health": None, "generate": None,
        "error_line": None, "log_tail": [], "failure": None,
        "server_version": None, "server_version_unknown": "the server did not become ready",
    }  # fmt: skip
    recorded = read_state(state_dir, port)
    if recorded is not None and not alive(recorded["pid"], recorded.get("starttime")):
        report["previous"] = {"pid": recorded["pid"], "action": "forgotten", "reason": "no longer running"}
        forget(state_dir, port)
        recorded = None
    if recorded is not None:
        same = recorded.get("argv") == argv and recorded.get("env") == env
        if same:
            report["reused"] = True
            progress(f"a server with these arguments runs already (pid {recorded['pid']}): checking it", phase="reuse")
            child, pid, starttime, log_file = None, recorded["pid"], recorded.get("starttime"), recorded["log_file"]
        else:
            why = "its arguments differ" if recorded.get("argv") != argv else "its environment differs"
            progress(f"stopping the server on port {port} (pid {recorded['pid']}): {why}", phase="stop")
            stopped = stop_group(recorded["pgid"], config["stop_timeout"])
            report["previous"] = {"pid": recorded["pid"], "action": "stopped", "reason": why,
                                  "argv": recorded.get("argv"), **stopped}  # fmt: skip
            if stopped["left"]:
                report["failure"] = (
                    f"the previous server's processes {stopped['left']} survived SIGKILL; port {port} not reused"
                )
                return report
            forget(state_dir, port)
            recorded = None
    if recorded is None:
        try:
            free = port_free(bind, port)
        except BindError as exc:
            report["failure"] = str(exc)
            return report
        if not free:
            holder = port_holder(port)
            report["port_holder"] = holder
            report["failure"] = (
                f"port {port} is taken by {holder}, which is not a server this runbook started (no record in "
                f"{state_path(state_dir, port)}); stop it or deploy on another port"
            )
            return report
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        log_file = os.path.join(state_dir, f"{port}-{stamp}.log")
        with open(log_file, "ab") as log:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and process group: it outlives the step and SSH
                env={**os.environ, **env},
                cwd=os.path.expanduser("~"),
            )
        pid = child.pid
        stat = proc_stat(pid)
        starttime = None if stat is None else stat["starttime"]
        write_state(state_dir, port, {
            "pid": pid, "pgid": pid, "starttime": starttime, "argv": argv, "env": env, "log_file": log_file,
            "port": port, "bind": bind, "started_at": time.time(),
        })  # fmt: skip
        progress(f"started the server: pid {pid}, log {log_file}", phase="started", pid=pid, log_file=log_file)
    report["pid"], report["log_file"] = pid, log_file
    waited = wait_ready(url, pid, starttime, log_file, config["ready_timeout"], child)
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
    report["stopped"] = stop_group(pid, config["stop_timeout"], child)
    forget(state_dir, port)
    return report


def stop(config: dict[str, Any], state_dir: str) -> dict[str, Any]:
    port = config["port"]
    report: dict[str, Any] = {"action": "stop", "port": port, "state_file": state_path(state_dir, port),
                              "stopped": False, "pid": None, "argv": None, "log_file": None, "pids": [],
                              "killed": False, "gpu_freed": None, "note": None, "failure": None}  # fmt: skip
    recorded = read_state(state_dir, port)
    if recorded is None:
        report["note"] = f"no server recorded on port {port}: nothing to stop"
        return report
    report.update(pid=recorded["pid"], argv=recorded.get("argv"), log_file=recorded.get("log_file"))
    if not alive(recorded["pid"], recorded.get("starttime")):
        report["note"] = f"the server recorded on port {port} (pid {recorded['pid']}) was no longer running"
        report["gpu_freed"] = not group_members(recorded["pgid"])
    else:
        progress(f"stopping the server on port {port} (pid {recorded['pid']})", phase="stop")
        stopped = stop_group(recorded["pgid"], config["stop_timeout"])
        report.update(stopped=True, pids=stopped["pids"], killed=stopped["killed"], gpu_freed=stopped["gpu_freed"])
        if stopped["left"]:
            report["failure"] = f"processes {stopped['left']} of the server survived SIGKILL"
            return report
    forget(state_dir, port)
    return report


def run(config: dict[str, Any]) -> dict[str, Any]:
    state_dir = kit.expand_path(config["state_dir"])
    launch = [kit.expand_path(text) if expands else text for text, expands in config.get("launch", [])]
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    with port_lock(state_dir, config["port"]):
        return start(config, state_dir, launch) if config["action"] == "start" else stop(config, state_dir)


def main() -> int:
    return kit.main(run)
