"""File transfers over SFTP that arrive whole, or fail.

A file moves in TRANSFER_CHUNK pieces (asyncssh runs each piece as parallel SFTP requests), hashed
on the controller as it passes, so memory stays bounded whatever the file's size. All-zero pieces
are not sent: the destination gets a hole there, and its size is set to the source's at the end, so
a sparse file (a trailing hole included) arrives with its full size, and stays sparse. Then the
host itself reports the size and sha256 of the file that arrived (`check_command`, run over the
same connection) and `base.check_arrived` compares them with the source's: any difference fails
the transfer with `TransportError`.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from executor.errors import TransportError
from executor.render import RenderedCommand, render_command
from executor.transport import base
from executor.transport.base import CommandResult, Digest, is_hole, read_hashed, write_piece

#: How long the host may take to hash a file that arrived (bounded by the step's timeout besides).
CHECK_TIMEOUT_S = 3600.0
_CHECK_SCRIPT = r"""f=$RUNBOOK_TRANSFER_FILE
if command -v sha256sum > /dev/null 2>&1 && size=$(stat -L -c %s -- "$f" 2> /dev/null); then
  sum=$(sha256sum < "$f") || exit 3
  printf 'runbook-transfer %s %s\n' "$size" "${sum%% *}"
else
  exec python3 -c '
import hashlib, sys
digest, size = hashlib.sha256(), 0
with open(sys.argv[1], "rb") as handle:
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
        size += len(block)
print("runbook-transfer", size, digest.hexdigest())
' "$f"
fi
"""
_CHECK_LINE = re.compile(rb"^runbook-transfer (\d+) ([0-9a-f]{64})$", re.MULTILINE)


def check_command(path: str) -> RenderedCommand:
    """The command that makes the host report the size and sha256 of the file at `path`."""
    return render_command(_CHECK_SCRIPT, {"RUNBOOK_TRANSFER_FILE": path})


def parse_check(result: CommandResult, what: str) -> tuple[int, str]:
    """The size and sha256 the host reported (the last such line: a login shell may print first)."""
    found = _CHECK_LINE.findall(result.stdout)
    if result.exit_code != 0 or not found:
        said = (result.stderr_text or result.stdout_text).strip()[-300:]
        how = result.ended
        raise TransportError(f"{what}: the host could not check what arrived ({how}: {said or 'no output'})")
    size, sha256 = found[-1]
    return int(size), sha256.decode()


async def sftp_upload(sftp: Any, local: Path, remote: str) -> tuple[Digest, str]:
    """Send `local` to `remote`; what was sent, and the file's absolute path on the host."""
    sent = Digest()
    with base.open_regular(local) as source:
        async with sftp.open(remote, "wb") as target:
            offset = 0
            while chunk := await asyncio.to_thread(read_hashed, source, sent):
                if not is_hole(chunk):
                    await target.write(chunk, offset)
                offset += len(chunk)
            await target.truncate(offset)  # a trailing hole: the file has the source's size
    return sent, str(await sftp.realpath(remote))


async def sftp_download(sftp: Any, remote: str, local: Path) -> tuple[Digest, str]:
    """Fetch `remote` into `local`; what was received, and the file's absolute path on the host."""
    path = str(await sftp.realpath(remote))
    received = Digest()
    with local.open("wb") as target:
        async with sftp.open(path, "rb") as source:
            while chunk := await source.read(base.TRANSFER_CHUNK, received.size):
                received.update(chunk)
                await asyncio.to_thread(write_piece, target, chunk)
        target.truncate(received.size)
    return received, path
