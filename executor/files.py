"""Opening the files the controller reads (a runbook, a run folder's files, a file to upload) safely.

Apart from executor.transport.base, which uses it too, so that reading a run folder (`runbook status`,
`runbook runs`) or a runbook imports no transport: asyncio, the diagnostics' structlog.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path


def open_regular(path: Path) -> io.BufferedReader:
    """`path` opened for reading, refused unless it is a regular file: opening a FIFO waits for a writer
    (forever, and in the event loop's thread), and a device such as /dev/zero never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once this way
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or folder is never read)", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
