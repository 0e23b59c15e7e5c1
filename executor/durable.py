"""Durable writes to a run folder, and the one error a failed one raises (`DurableWriteError`).

A run folder holds what a run can be trusted by: its audit log, its state store, `run.json` and
the reports steps write. A write to it that fails (a full disk, an I/O error, a file system gone
read-only, a quota) stops the run: retrying cannot help, and a step must never be recorded as
failed, or the run as passed, because the controller's disk failed. Every such write goes through
here (or, for SQLite, `from_sqlite`), so each failure carries the folder, the errno and the space
left. `write_all` and `replace_file` are the only places bytes reach a run folder's files, but for
fetched files, which their transport writes (the engine maps their OSError to the same error).
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
import sqlite3
from pathlib import Path

from executor.errors import DurableWriteError

#: SQLite's primary result codes that mean the disk, not the database, failed, as the errno they stand for
_SQLITE_ERRNO = {13: errno_mod.ENOSPC, 10: errno_mod.EIO, 8: errno_mod.EROFS}


def free_bytes(folder: Path) -> int | None:
    """The bytes this user may still write on `folder`'s file system (None when it cannot be read)."""
    for candidate in (folder, *folder.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def failed(exc: OSError, folder: Path, what: str) -> DurableWriteError:
    """The error for a write to `what` in `folder` that raised `exc`."""
    code = exc.errno
    name = errno_mod.errorcode.get(code, str(code)) if code is not None else None
    reason = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    return DurableWriteError(str(folder), what, reason, code, free_bytes(folder))


def from_sqlite(exc: sqlite3.Error, folder: Path, what: str = "the state store (state.db)") -> DurableWriteError:
    """The error for a write to a run's SQLite store that raised `exc` ("database or disk is full", ...)."""
    primary = getattr(exc, "sqlite_errorcode", None)
    code = _SQLITE_ERRNO.get(primary & 0xFF) if isinstance(primary, int) else None
    labels = [str(getattr(exc, "sqlite_errorname", "") or ""), errno_mod.errorcode.get(code or 0, "")]
    shown = ", ".join(label for label in labels if label)
    reason = f"{exc}" + (f" ({shown})" if shown else "")
    return DurableWriteError(str(folder), what, reason, code, free_bytes(folder))


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (a short write is continued; an error raises OSError)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_file(path: Path, data: bytes, what: str, mode: int = 0o600, sync: bool = True) -> None:
    """Atomically replace `path` with `data` (written whole, fsynced unless `sync` is false, then
    renamed over it). A failure leaves the old file as it was, removes the partial one and raises
    DurableWriteError."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise failed(exc, path.parent, what) from None


#: The errnos that say the disk (not the input) failed: a run folder could not be made at all
DISK_ERRNOS = frozenset({errno_mod.ENOSPC, errno_mod.EDQUOT, errno_mod.EIO, errno_mod.EROFS})
