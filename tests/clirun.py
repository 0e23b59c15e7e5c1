"""`runbook_cli`, in this process: the `runbook` command as a test calls it when no process boundary is under test.

A subprocess (tests.conftest.runbook_cli) pays an interpreter's start and the CLI's imports, about half a second
to a second of CI per call, and the suite makes hundreds. This runs `executor.faces.cli.main(argv)` here instead, as
the process would: stdout and stderr are fresh byte streams in the encoding the process would get
(`PYTHONIOENCODING`, else UTF-8; stderr's `backslashreplace`), read back as `subprocess.run(text=True)`
decodes a pipe; stdin is empty (`DEVNULL`); the environment is this process's with `env` laid over it (and
no `COLUMNS` unless given: a command with no terminal then prints whole lines, as into a pipe or a file, and one
given `COLUMNS` fits its lines to it, as on a terminal); `cwd` is the working directory. What a
command changes of the process (environment, working directory, umask, the CLI's cached consoles, which read
the width and colour settings once) is put back after it, so calls never see each other; `run`'s signal
handlers go with its event loop (asyncio.run closes it), and tests/test_clirun.py checks that none is left.

Called from a thread other than the main one (a test's pool of resumes), it runs the subprocess: a run's signal
handlers can only be set there, and the streams and environment it swaps are the whole process's.

A test whose subject is the process itself keeps the subprocess: a signal, `kill -9`, an rlimit
(`memory_bytes`), a pipe that closes, the installed `runbook` script, start-up time.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from executor.faces import cli
from tests import conftest


def runbook_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`runbook ARGS...` in this process; its exit status, stdout and stderr as `subprocess.run` gives them."""
    if threading.current_thread() is not threading.main_thread():
        return conftest.runbook_cli(*args, env=env, cwd=cwd)
    given = dict(env or {})
    encoding = given.get("PYTHONIOENCODING") or os.environ.get("PYTHONIOENCODING") or "utf-8"
    stdout = io.TextIOWrapper(io.BytesIO(), encoding=encoding, write_through=True)
    stderr = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="backslashreplace", write_through=True)
    with _process_state(given, cwd, unset=() if "COLUMNS" in given else ("COLUMNS",)), _streams(stdout, stderr):
        code = _exit_status(list(args))
    return subprocess.CompletedProcess(["runbook", *args], code, _text(stdout), _text(stderr))


def _exit_status(argv: list[str]) -> int:
    """`main`'s return, or the status a `SystemExit` (argparse's usage error, `--help`) would end the process with."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1


def _text(stream: io.TextIOWrapper) -> str:
    """What `subprocess.run(text=True)` reads from the pipe: the bytes in the locale's encoding (UTF-8 here),
    universal newlines (a CR becomes a line break there as well)."""
    stream.flush()
    data = stream.buffer.getvalue()  # type: ignore[attr-defined]
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()


@contextlib.contextmanager
def _process_state(env: Mapping[str, str], cwd: Path | None, unset: Sequence[str] = ()) -> Iterator[None]:
    """The environment with `env` laid over it (and without `unset`) and `cwd` for the block; the process's state
    put back after."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_umask = os.umask(0o022)
    os.umask(saved_umask)
    os.environ.update(env)
    for name in unset:
        os.environ.pop(name, None)
    cli.err.cache_clear()
    cli.out.cache_clear()
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.umask(saved_umask)
        os.environ.clear()
        os.environ.update(saved_env)
        cli.err.cache_clear()
        cli.out.cache_clear()


@contextlib.contextmanager
def _streams(stdout: io.TextIOWrapper, stderr: io.TextIOWrapper) -> Iterator[None]:
    """sys.stdout/stderr to the given streams, stdin empty, for the block."""
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    sys.stdout, sys.stderr = stdout, stderr
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
