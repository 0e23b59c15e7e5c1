"""A test hook, used only by tests: in-process fault injection on the run folder's write path.

    RUNBOOK_FAULT_AT=N RUNBOOK_FAULT_ERRNO=EIO [RUNBOOK_FAULT_SPAN=once|rest] [RUNBOOK_FAULT_TORN=1] \\
        RUNBOOK_FAULT_JOURNAL=FILE python -m tests.executor.faultpoints run BOOK --log-dir DIR

For the errno classes a test cannot produce for real here (EIO, EROFS, EDQUOT; ENOSPC is produced for
real on a small tmpfs by tests/executor/test_full_disk.py), the N-th durable write fails as the kernel
or SQLite would report it. The writes are counted at the lowest level the engine uses, 1-based:
each `durable.write_all` (an audit line, the audit head, run.json, a report) and each SQLite INSERT
(a step record, a run key). A failing `write_all` raises OSError(errno) (with RUNBOOK_FAULT_TORN, after
writing half its bytes, as a short write on a full disk does); a failing INSERT raises SQLite's own
error for that errno (SQLITE_FULL, SQLITE_IOERR, SQLITE_READONLY) with its result code. SPAN `once`
(the default): only write N fails, a moment of trouble; `rest`: write N and every write after it.
Every write appends its point name to the journal file, before it happens. The engine is not modified.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from executor import durable
from executor.faces import cli

_count = 0
_SQLITE = {  # errno -> (message, primary result code, name), as sqlite3 reports them
    errno.ENOSPC: ("database or disk is full", 13, "SQLITE_FULL"),
    errno.EDQUOT: ("database or disk is full", 13, "SQLITE_FULL"),
    errno.EIO: ("disk I/O error", 10, "SQLITE_IOERR"),
    errno.EROFS: ("attempt to write a readonly database", 8, "SQLITE_READONLY"),
}


def _fails(point: str) -> bool:
    """Count one write and journal it; whether it is to fail."""
    global _count
    _count += 1
    journal = os.environ.get("RUNBOOK_FAULT_JOURNAL")
    if journal:
        with open(journal, "a", encoding="utf-8") as handle:
            handle.write(point + "\n")
    target = os.environ.get("RUNBOOK_FAULT_AT")
    if target is None:
        return False
    span = os.environ.get("RUNBOOK_FAULT_SPAN", "once")
    return _count == int(target) or (span == "rest" and _count > int(target))


def _errno() -> int:
    return int(getattr(errno, os.environ.get("RUNBOOK_FAULT_ERRNO", "EIO")))


_write_all = durable.write_all


def write_all(fd: int, data: bytes) -> None:
    name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
    if _fails(f"write:{name}"):
        code = _errno()
        if os.environ.get("RUNBOOK_FAULT_TORN"):
            os.write(fd, data[: len(data) // 2])
        raise OSError(code, os.strerror(code))
    _write_all(fd, data)


class FaultyConnection(sqlite3.Connection):
    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if sql.lstrip().upper().startswith("INSERT"):
            table = sql.split("INTO", 1)[1].split()[0]
            if _fails(f"sqlite:{table}"):
                message, code, name = _SQLITE[_errno()]
                exc = sqlite3.OperationalError(message)
                exc.sqlite_errorcode, exc.sqlite_errorname = code, name  # as sqlite3 sets them
                raise exc
        return super().execute(sql, parameters)


_connect = sqlite3.connect


def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    kwargs.setdefault("factory", FaultyConnection)
    connection: sqlite3.Connection = _connect(*args, **kwargs)
    return connection


def install() -> None:
    durable.write_all = write_all
    sqlite3.connect = connect  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    install()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
