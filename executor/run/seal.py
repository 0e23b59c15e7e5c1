"""The audit key: an HMAC-SHA256 key, outside every run folder, that seals each run's audit head.

The hash chain alone proves nothing against someone who can write the run folder: they can edit a
record and compute every later hash again. A key they do not hold can: with it, every write of
`audit.head` carries an HMAC over the run id, the head (record count and last hash) and the chain
link (the hash the log starts from and the run it resumes), and `runbook audit verify --key` checks
it. The key is opt-in: `runbook audit key` creates it (`$XDG_CONFIG_HOME/runbook/audit.key`, else
`~/.config/runbook/audit.key`, mode 0600, never overwritten), and every run started while it exists
seals its head. Its bytes never reach a run folder, a log or the console: only its id (a digest)
does. Chosen over `ssh-keygen -Y sign`: the stdlib's `hmac` needs no program on the controller, no
agent and no new dependency, and a signature per head write (one per command) would cost a process
each; the price is that verifying needs the same secret key, not a public one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor import durable
from executor.errors import AuditKeyError

KEY_FILE = "audit.key"
#: the key's length in bytes; the file holds it as hex digits and a newline
KEY_BYTES = 32
#: a key file is a few dozen bytes: one past this is not read whole
_KEY_FILE_MAX = 256
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
#: a key id is this many lowercase hex digits; an HMAC, 64
KEY_ID_LEN = 16


def default_key_path() -> Path:
    """Where `runbook audit key` creates the key and where `run` looks for it (the user's config folder)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "runbook" / KEY_FILE


@dataclass(frozen=True)
class AuditKey:
    """A loaded key; its bytes are never printed (`repr` shows the path and id only)."""

    path: Path
    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        """A name for the key, safe to show and to store in a run folder (a digest, not the key)."""
        return hmac.new(self.secret, b"runbook audit key id", hashlib.sha256).hexdigest()[:KEY_ID_LEN]


def create_key(path: Path) -> AuditKey:
    """A new random key written to `path` (its folder made 0700, the file 0600); never overwrites one.
    A write that fails leaves no key file behind (a partial one would pass for a bad key)."""
    secret = secrets.token_bytes(KEY_BYTES)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise AuditKeyError(
            f"{path}: a key is already there; it is never overwritten (runs sealed with it could no longer be "
            "checked): move it away first to make a new one"
        ) from None
    except OSError as exc:
        raise AuditKeyError(f"{path}: cannot create the key: {exc.strerror or exc}") from None
    try:
        try:
            durable.write_all(fd, (secret.hex() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise AuditKeyError(f"{path}: cannot write the key: {exc.strerror or exc}") from None
    return AuditKey(path, secret)


def load_key(path: Path) -> AuditKey:
    """The key at `path`: AuditKeyError, saying why, when it is missing, no regular file, readable by
    others than its owner, or not 64 hex digits."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO in its place must not hang
    except FileNotFoundError:
        raise AuditKeyError(f"{path}: no audit key there (create one with: runbook audit key)") from None
    except OSError as exc:
        raise AuditKeyError(f"{path}: cannot read the audit key: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AuditKeyError(f"{path}: the audit key must be a regular file")
        if st.st_mode & 0o077:
            raise AuditKeyError(
                f"{path}: the audit key is open to other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"make it private: chmod 600 {path}"
            )
        raw = os.read(fd, _KEY_FILE_MAX + 1)
    finally:
        os.close(fd)
    return AuditKey(path, _parse(path, raw))


def _parse(path: Path, raw: bytes) -> bytes:
    """The key's bytes from the file's text: 64 hex digits, surrounding blanks allowed."""
    text = raw.decode("ascii", "replace").strip()
    if len(text) != KEY_BYTES * 2 or not set(text) <= _HEX_DIGITS:
        raise AuditKeyError(
            f"{path}:1:1: expected {KEY_BYTES * 2} hex digits (as runbook audit key writes), "
            f"got something else ({len(raw)} bytes)"
        )
    return bytes.fromhex(text)


def configured_key() -> AuditKey | None:
    """The key a run seals with: the one at `default_key_path()`, or None when there is none (no sealing).
    A key file that is there but unusable is an AuditKeyError: the run must not go unsealed silently."""
    path = default_key_path()
    if not os.path.lexists(path):
        return None
    return load_key(path)


def is_key_id(value: Any) -> bool:
    """Whether a value read from a run folder is a key id (it is shown: nothing else may be)."""
    return _is_hex(value, KEY_ID_LEN)


def _is_hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and set(value) <= frozenset("0123456789abcdef")


@dataclass(frozen=True)
class HeadSeal:
    """Seals the heads of one run's log: what the HMAC covers besides the head itself."""

    key: AuditKey
    run_id: str
    start_hash: str  # the hash the log's first record links to (its predecessor's tail, or GENESIS)
    resumed_from: str | None

    def mac(self, count: int, head_hash: str) -> str:
        body = {
            "run_id": self.run_id,
            "count": count,
            "hash": head_hash,
            "start_hash": self.start_hash,
            "resumed_from": self.resumed_from,
        }
        message = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self.key.secret, message, hashlib.sha256).hexdigest()

    def seal(self, count: int, head_hash: str) -> dict[str, str]:
        """The `seal` field of the head `{count, hash}`."""
        return {"key_id": self.key.key_id, "hmac": self.mac(count, head_hash)}

    def problem(self, count: int, head_hash: str, seal: Any) -> str | None:
        """Why `seal` does not prove the head `{count, hash}` (None when it does)."""
        if seal is None:
            return "its head carries no seal (the run had no audit key, or the seal was removed)"
        if not isinstance(seal, dict) or not is_key_id(seal.get("key_id")) or not _is_hex(seal.get("hmac"), 64):
            return "its head's seal is malformed (edited)"
        if seal["key_id"] != self.key.key_id:
            return (
                f"it was sealed with another key (key id {seal['key_id']}), not {self.key.path} "
                f"(key id {self.key.key_id}): the wrong key was given, or the seal was replaced"
            )
        if not hmac.compare_digest(seal["hmac"], self.mac(count, head_hash)):
            return "its seal does not match its head: the log, its head or its link to the run it resumes was rewritten"
        return None
