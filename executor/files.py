"""Opening the files the controller reads (a runbook, a run folder's files, a file to upload) safely.

Apart from executor.transport.base, which uses it too, so that reading a run folder (`runbook status`,
`runbook runs`) or a runbook imports no transport: asyncio, the diagnostics' structlog.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from executor import strict_json


def open_regular(path: Path, follow: bool = True) -> io.BufferedReader:
    """`path` opened for reading, refused unless it is a regular file: opening a FIFO waits for a writer
    (forever, and in the event loop's thread), and a device such as /dev/zero never ends. With `follow`
    false a symlink is refused too (ELOOP): see `open_run_file`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)  # a FIFO opens at once this way
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or folder is never read)", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_run_file(path: Path) -> io.BufferedReader:
    """A run folder's file (its lock, run.json, events, audit log and head, report) opened for reading: a
    regular file and not a symlink, whose target (another run's file, a secret outside) a reader of the
    folder would otherwise show as this run's. The one way every run-folder reader opens one."""
    return open_regular(path, follow=False)


def odd_file(path: Path) -> str | None:
    """Why `path` is no regular file of its own (a symlink, a FIFO, a socket, a device, a folder), without
    opening it; None when it is one or is missing. For the files a library opens itself (SQLite's state.db)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = {stat.S_ISLNK: "a symlink", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder"}
    kind = next((name for test, name in kinds.items() if test(mode)), "a device")
    return f"not a regular file: {kind} (never followed or read)"


def refusal(exc: OSError) -> str:
    """An OSError from opening a run file, in words: what the file is when it is no regular file (O_NOFOLLOW's
    ELOOP is a symlink, a socket's ENXIO), else the system's reason."""
    return (odd_file(Path(exc.filename)) if isinstance(exc.filename, str) else None) or str(exc.strerror or exc)


def lines_within(handle: io.BufferedReader, limit: int) -> Iterator[tuple[bytes, bool]]:
    """Each line of `handle` (the last one without its newline if it has none yet), and whether it was longer
    than `limit` bytes: such a line is read past a piece at a time, so that memory stays bounded whatever the
    file holds (a 1 GiB line of zeros), and stands as its first `limit` bytes and a newline."""
    while line := handle.readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, False
            continue
        while (piece := handle.readline(limit)) and not piece.endswith(b"\n"):
            pass
        yield line[:limit] + b"\n", True


def json_data(text: str | bytes, max_depth: int | None = None) -> Any:
    """`json.loads(text)`, where a document nested deeper than the parser goes (30 000 lists in a run.json), or
    than `max_depth` (a run file's own bound: deeper was not written by runbook, and a recursive walk of it,
    json.dumps with `indent`, would exhaust the stack), is a ValueError as any other JSON it cannot read, not
    a RecursionError, which no reader of run data expects."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deep to read (no run file is)") from None
    if max_depth is not None and strict_json.nested_deeper(value, max_depth):
        raise ValueError(f"nests deeper than {max_depth} levels")
    return value
