"""The exception tree of `runbook`, documented in one place.

    RunbookError                 base of everything this package raises on purpose
    ├── InvalidRunbook           bad input: YAML, schema, references; a secret's value that is unset,
    │                            empty or too short to redact, at its declaration (CLI exit 2)
    │     .problems: list[Problem]  each with file, line, column, message
    ├── RunLocked                another `runbook` process holds the run (CLI exit 3)
    ├── ResumeError              nothing to resume, or a needed step never passed (CLI exit 2)
    │     └── StateError         a run folder cannot be read (state.db, run.json) or written
    │           .reason: str     why, in a few words (for a table row)
    ├── AuditKeyError            the audit key is missing, unusable or already there (CLI exit 2)
    ├── DurableWriteError        a write to the run folder failed: audit log, state, run.json, report
    │     .folder .what .errno .free_bytes   (disk full, I/O error, read-only, quota; CLI exit 4)
    └── TransportError           the host could not be reached or the channel broke
          └── HostKeyError       unknown or changed host key: never retried

A failed step is not an exception: the engine records it and the CLI exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.terminal import shown


@dataclass(frozen=True)
class Problem:
    """One problem in an input file, printed as ``FILE:LINE:COL: message``."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        # one line per problem, whatever the input held: a newline, and what would drive or lie to a
        # terminal, is escaped as everything shown is (executor.terminal); a tab is kept
        return shown(f"{self.file}:{self.line}:{self.column}: {self.message}", keep="\t")


class RunbookError(Exception):
    """Base class of the errors `runbook` raises on purpose."""


class InvalidRunbook(RunbookError):
    """The runbook (or a command-line value) is not valid; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class RunLocked(RunbookError):
    """Another live `runbook` process holds the lock of this run."""


class ResumeError(RunbookError):
    """The requested resume, --from or --only cannot be honoured."""


class StateError(ResumeError):
    """A run folder cannot be read (its `state.db` or `run.json` is missing or damaged) or written.

    A ResumeError, since what it holds can be neither shown nor resumed (CLI exit 2).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AuditKeyError(RunbookError):
    """The audit key (executor/seal.py) cannot be used: missing, no regular file, open to other users,
    malformed, or (for `runbook audit key`) already there."""


class DurableWriteError(RunbookError):
    """A durable write to the run folder failed (ENOSPC, EIO, EROFS, EDQUOT, ...): the run stops at once.

    Never a step failure and never retried: no new command starts, and the run is never passed.
    `what` names the write (the audit log, the state store, run.json, report.json); `errno` is None
    when the failure came from SQLite without one; `free_bytes` is what `os.statvfs` said was left
    for this user on that filesystem (None when it could not be read).
    """

    def __init__(self, folder: str, what: str, reason: str, errno: int | None, free_bytes: int | None) -> None:
        self.folder, self.what, self.reason, self.errno, self.free_bytes = folder, what, reason, errno, free_bytes
        free = "free space unknown" if free_bytes is None else f"{_size(free_bytes)} free there"
        super().__init__(f"cannot write {what} in {folder}: {reason} ({free})")


def _size(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class TransportError(RunbookError):
    """The host could not be reached, or the connection broke during a command.

    ``partial`` keeps whatever output arrived before the failure (as asyncssh does).
    """

    def __init__(self, message: str, partial_stdout: bytes = b"", partial_stderr: bytes = b"") -> None:
        super().__init__(message)
        self.partial_stdout = partial_stdout
        self.partial_stderr = partial_stderr


class HostKeyError(TransportError):
    """The host key is unknown or changed; retrying cannot help, so it never is."""
