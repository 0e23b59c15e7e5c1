"""Opening the files the controller reads (a runbook, a run folder's files, a file to upload) safely.

Apart from executor.transport.base, which uses it too, so that reading a run folder (`runbook status`,
`runbook runs`) or a runbook imports no transport: asyncio, the diagnostics' structlog.
"""

from __future__ import annotations

import errno
import io
import itertools
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: The folder run folders go into unless `--log-dir` (a tool's `log_dir`, RunOptions.log_dir) says another.
LOG_DIR = Path("logs")


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


#: How deep json_data reads a document whose reader states no bound: well within the parser's recursion (about
#: 1000 frames less the caller's), past which json.loads raises a RecursionError (`json_data`)
PARSE_MAX_DEPTH = 256
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash and what it escapes
_STRING = re.compile(rb'"[^"]*"')  # a string, its escapes out
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nests_deeper(raw: bytes, limit: int) -> bool:
    """Whether JSON text nests deeper than `limit`, read without parsing it and in linear time whatever it holds
    (a string of a million escaped quotes, never closed): its escapes out, so that no quote is left inside a
    string, then its strings, then the running count of its brackets."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", raw)).translate(None, _NOT_BRACKET)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def json_data(text: str | bytes, max_depth: int | None = None, loads: Callable[[str], Any] = json.loads) -> Any:
    """`json.loads(text)`, where a document nested deeper than `max_depth` (a run file's own bound: deeper was not
    written by runbook; PARSE_MAX_DEPTH where none is stated) is a ValueError as any other JSON it cannot read.
    The depth is counted before the parser sees it: past its recursion json.loads raises a RecursionError that,
    even caught, has left CPython 3.11's compiler broken for the rest of the process (a SystemError in a later
    `compile` or `ast.parse`: a long-lived MCP server's gates), and a recursive walk of the value (json.dumps with
    `indent`) would exhaust the stack. `loads`: the parser (hostprograms.kit's refuses NaN as the controller reads
    a host's document)."""
    limit = PARSE_MAX_DEPTH if max_depth is None else max_depth
    if nests_deeper(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text, limit):
        raise ValueError(f"nested deeper than {limit} levels")
    # bytes as UTF-8 only, as runbook writes them: json.loads would also take UTF-16 or 32, whose escaped quotes
    # the scan above does not read as escapes (a UnicodeDecodeError is a ValueError)
    return loads(text if isinstance(text, str) else text.decode("utf-8"))
