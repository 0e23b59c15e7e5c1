"""The exception tree of `runbook`, documented in one place, and the one mapping of asyncssh and OS errors
to transport errors (`transport_error`).

    RunbookError                 base of everything this package raises on purpose      .exit_code 1
    ├── InvalidRunbook           bad input: YAML, schema, references; a secret's value that is unset,   2
    │                            empty or too short to redact, at its declaration
    │     .problems: list[Problem]  each with file, line, column, message
    ├── RunLocked                another `runbook` process holds the run                                3
    ├── ResumeError              nothing to resume, or a needed step never passed                       2
    │     └── StateError         a run folder cannot be read (state.db, run.json) or written            2
    │           .reason: str     why, in a few words (for a table row)
    ├── AuditKeyError            the audit key is missing, unusable or already there                    2
    ├── ArgumentRefused          an MCP tool's argument: a path outside the server's roots, a file      2
    │                            that is no runbook (said in one line quoting none of it)
    ├── DurableWriteError        a write to the run folder failed: audit log, state, run.json, report   4
    │     .folder .what .errno .free_bytes   (disk full, I/O error, read-only, quota)
    ├── StepKindPluginError      an installed step kind cannot be used: its entry point fails to import,  2
    │                            names no such kind, or takes another distribution's kind name
    └── TransportError           the host could not be reached or the channel broke                     1
          ├── HostKeyError       unknown or changed host key: never retried                             1
          └── IdentityFileError  the host's identity_file is no file on this machine: never retried     1

`exit_code` is a class attribute: the status `runbook` exits with when the error reaches the CLI, which maps
every RunbookError by it in one place (executor/faces/cli.py, `failed`); README, "Commands", lists them. Besides
those, the CLI exits 0 (success), 1 (a step failed: a failed step is not an exception, the engine records it),
130 (interrupted) and 141 (stdout's reader went away).

The engine's own signals are no RunbookError and carry no exit code: each ends an attempt, a step or a
transport's choice of path, is recorded there, and never leaves `Engine.run` (one that did would be a bug,
shown as its traceback, not an error of the user's):

    AttemptFailed                one attempt did not pass: retried, unless its class is one of the step's
    │                            `retry.non_retryable` (README, "Retries"); each failure is one class:
    ├── CommandTimedOut          a command or a file transfer ran past its timeout             retried
    ├── TransportFailed          the connection broke, a file transfer failed                   retried
    ├── FactsUnreadable          the output could not become facts; no gate worker started      retried
    ├── StepKindCrashed          the step kind raised unexpectedly (a bug in it)                retried
    ├── GateUndecided            a gate could not be evaluated (a missing fact, an error)       retried
    ├── CommandFailed            a gate on the command's exit code or output was false          retried
    ├── StepFailed               the kind reported an error not known to last (a network error) retried
    ├── ConfigRefused            SGLang's argument parser refused the launch command        not retried
    ├── AccessDenied             the Hub refused the token: 401, 403, a gated repo          not retried
    ├── OutOfMemory              the server ran out of (GPU) memory while starting          not retried
    ├── PortInUse                the server's port is held by a process the run did not start   not retried
    └── GateFalse                a gate on facts, vars or earlier steps read a definite value   not retried
                                 and it was false (asking again reads the same value)
    HostRefused                  the host cannot be used at all (its host key, a TransportError whose
                                 `refuses_host` is set): the step fails at once
    FactsError                   a step kind's output could not become facts: the attempt fails
    GateWorkerUnavailable        no gate worker process could be started: the attempt fails
    RunnerUnavailable            the persistent runner cannot start on a host: the exec path serves it
    RunnerLost                   the runner or its channel ended: the command in flight is a TransportError

    asyncio.CancelledError
    └── CommandInterrupted       an interrupted command's cancellation, carrying its partial result

CommandInterrupted stays a CancelledError, outside the tree, on purpose: a Ctrl-C must pass every
`except Exception` (a step kind's, tenacity's) and be seen by asyncio as cancellation (`Task.cancelling`,
`gather`); the run then exits 130 as for any interrupt, and the audit log keeps the partial result. It is
defined on first use (`executor.errors.CommandInterrupted`, as any name): this module imports no asyncio,
nor asyncssh, so that the commands which need neither start fast (bench/startup.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from executor.terminal import shown

if TYPE_CHECKING:
    import asyncio

    from executor.command_result import CommandResult

#: The exit statuses of the CLI that no RunbookError carries (README, "Commands").
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


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

    #: The CLI's exit status when this error reaches it: a run that could not do its work.
    exit_code = EXIT_FAILED


class InvalidRunbook(RunbookError):
    """The runbook (or a command-line value) is not valid; carries every problem found."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class RunLocked(RunbookError):
    """Another live `runbook` process holds the lock of this run."""

    exit_code = 3


class ResumeError(RunbookError):
    """The requested resume, --from or --only cannot be honoured."""

    exit_code = 2


class StateError(ResumeError):
    """A run folder cannot be read (its `state.db` or `run.json` is missing or damaged) or written.

    A ResumeError, since what it holds can be neither shown nor resumed (CLI exit 2).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AuditKeyError(RunbookError):
    """The audit key (executor/run/seal.py) cannot be used: missing, no regular file, open to other users,
    malformed, or (for `runbook audit key`) already there."""

    exit_code = 2


class ArgumentRefused(RunbookError):
    """An MCP tool's argument the server will not act on (executor/faces/mcp_server.py): a path that resolves outside
    its roots, or a file given as a runbook or an inventory that is none at all."""

    exit_code = 2


class DurableWriteError(RunbookError):
    """A durable write to the run folder failed (ENOSPC, EIO, EROFS, EDQUOT, ...): the run stops at once.

    Never a step failure and never retried: no new command starts, and the run is never passed.
    `what` names the write (the audit log, the state store, run.json, report.json); `errno` is None
    when the failure came from SQLite without one; `free_bytes` is what `os.statvfs` said was left
    for this user on that filesystem (None when it could not be read).
    """

    exit_code = 4

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


class StepKindPluginError(RunbookError):
    """A step kind of the entry-point group `runbook.step_kinds` cannot be used (executor/stepkind.py): the
    message names the kind, its distribution and its entry point. Nothing has run: the CLI exits 2."""

    exit_code = 2


class TransportError(RunbookError):
    """The host could not be reached, or the connection broke during a command.

    ``partial`` keeps whatever output arrived before the failure (as asyncssh does). ``check`` says, for a
    connection that could not be made, what to check (the address and port it tried, sshd, DNS, a firewall, the
    key): said once with the step's failure, not with each attempt's.
    """

    #: True for an error that neither a retry nor a fallback can mend (an untrusted host key, a command a test's
    #: scripted host has no answer for): the step fails on the host at once, as HostRefused.
    refuses_host: ClassVar[bool] = False

    def __init__(
        self, message: str, partial_stdout: bytes = b"", partial_stderr: bytes = b"", *, check: str | None = None
    ) -> None:
        super().__init__(message)
        self.partial_stdout = partial_stdout
        self.partial_stderr = partial_stderr
        self.check = check


class HostKeyError(TransportError):
    """The host key is unknown or changed; retrying cannot help, so it never is."""

    refuses_host = True


class IdentityFileError(TransportError):
    """The host's `identity_file` is no file on this machine: asyncssh's `[Errno 2] No such file` was retried
    and then blamed on the address, sshd, DNS and firewalls; no retry can make the file, so none is made."""

    refuses_host = True


# ---- the one mapping of asyncssh and OS errors ---------------------------------------------------


def failure_text(exc: BaseException) -> str:
    """What an asyncssh or OS error says, for a message: its own text (asyncssh's reason, `[Errno 111]
    Connection refused`), or, where it says nothing, its type: a message never ends in an empty reason."""
    return str(exc) or type(exc).__name__


def is_host_key_failure(exc: BaseException) -> bool:
    """asyncssh could not verify the server's host key (unknown, changed, revoked), by its class or by
    the disconnect code a peer sent: retrying cannot help."""
    import asyncssh  # here: only a transport's errors come here, and the CLI's other commands never import it

    return isinstance(exc, asyncssh.HostKeyNotVerifiable) or (
        isinstance(exc, asyncssh.DisconnectError) and exc.code == asyncssh.DISC_HOST_KEY_NOT_VERIFIABLE
    )


def transport_error(
    exc: BaseException,
    what: str,
    *,
    timeout: float | None = None,
    partial: tuple[bytes, bytes] = (b"", b""),
    untrusted_key: tuple[str, str] | None = None,
    check: str | None = None,
) -> TransportError:
    """The TransportError that `exc` (an asyncssh.Error, an OSError, a TimeoutError) raised while doing
    `what` becomes: `{what}: {failure_text(exc)}`, or `{what} within {timeout}s` for a timeout that says
    nothing else (asyncio's), with `partial` (stdout, stderr) as the output that had arrived. A host key
    failure is a HostKeyError, never retried: `untrusted_key` (what to call it, the hint that says how to
    trust the key) words it `{called}: {reason}; {hint}`. `check`: what to check, for a connection not made."""
    if is_host_key_failure(exc):
        if untrusted_key is None:
            return HostKeyError(f"{what}: {failure_text(exc)}", *partial)
        called, hint = untrusted_key
        return HostKeyError(f"{called}: {failure_text(exc)}; {hint}", *partial)
    if isinstance(exc, TimeoutError) and not str(exc) and timeout is not None:
        return TransportError(f"{what} within {timeout:g}s", *partial, check=check)
    return TransportError(f"{what}: {failure_text(exc)}", *partial, check=check)


# ---- the engine's own signals (never leave Engine.run; see the tree above) ----------------------


class AttemptFailed(Exception):
    """One attempt did not pass; the message says why (gate, timeout, transport, facts).

    `facts` keeps what the attempt found, so that a failed step's record shows it too; `gate` is
    the expression of the gate that failed (None when the attempt failed before its gates);
    `exit_code` is the exit code of the attempt's command (not a CLI status: this is no RunbookError).
    `cause` is the runbook var whose value caused it, where the step kind knows (`StepSpec.failure_var`: a port
    held by another process is caused by the var the runbook gave as the port): `{var, value, param}`, the
    value as the run stores it (masked), `param` the step's parameter that holds it ("" when the facts name it).
    """

    cause: dict[str, str] | None = None

    #: Whether a failure of this class is retried when the runbook's `non_retryable:` does not name it: False for
    #: a failure that asking again cannot fix (the same config, token, GPU memory, port holder or value).
    retried_by_default: ClassVar[bool] = True

    def __init__(self, message: str, facts: Any = None, gate: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.facts = facts
        self.gate = gate
        self.exit_code = exit_code

    def not_retried(self) -> None:
        """Mark this failure as the one that ended the step's attempts while some were left: its message (what the
        step's record, its `step_finished` event and the terminal show) starts `not retried: CLASS`."""
        self.args = (f"not retried: {type(self).__name__}: {self.args[0]}", *self.args[1:])


class CommandTimedOut(AttemptFailed):
    """A command or a file transfer ran past its timeout."""


class TransportFailed(AttemptFailed):
    """The connection broke during a command, or a file transfer failed."""

    #: What to check where the connection could not be made (TransportError.check): the step's failure says it
    #: once, after its attempts, not each attempt.
    check: str | None = None


class FactsUnreadable(AttemptFailed):
    """The output could not become facts (a FactsError, nesting too deep), or no gate worker could start."""


class StepKindCrashed(AttemptFailed):
    """The step kind raised an unexpected exception (a bug in the kind)."""


class GateUndecided(AttemptFailed):
    """A gate could not be evaluated: it read a fact that is not there, or raised."""


class CommandFailed(AttemptFailed):
    """A gate that reads the command's exit code or output (`exit_code == 0`) was false."""


class StepFailed(AttemptFailed):
    """The kind reported an error of its own whose cause may pass (a network error, a server that died)."""


class ConfigRefused(AttemptFailed):
    """SGLang's argument parser refused the launch command (exit 2, `error: unrecognized arguments`)."""

    retried_by_default = False


class AccessDenied(AttemptFailed):
    """The Hub refused the token: HTTP 401 or 403, or a gated repo whose terms the token's user did not accept, in
    the Hub's own answer (hostprograms/kit.py, `hub_refused`: a bare 403 of a proxy or CDN may pass)."""

    retried_by_default = False


class OutOfMemory(AttemptFailed):
    """The server ran out of (GPU) memory while starting: the same model on the same GPUs does so again."""

    retried_by_default = False


class PortInUse(AttemptFailed):
    """The server's port is held by a process this runbook did not start."""

    retried_by_default = False


class GateFalse(AttemptFailed):
    """A gate that reads facts, vars or earlier steps (not the command's raw output) read a definite value and
    it was false: asking again reads the same value."""

    retried_by_default = False


#: Every failure class by name: what `retry.non_retryable` may name (README, "Retries").
FAILURE_CLASSES: dict[str, type[AttemptFailed]] = {
    cls.__name__: cls
    for cls in (
        CommandTimedOut,
        TransportFailed,
        FactsUnreadable,
        StepKindCrashed,
        GateUndecided,
        CommandFailed,
        StepFailed,
        ConfigRefused,
        AccessDenied,
        OutOfMemory,
        PortInUse,
        GateFalse,
    )
}
#: The failure classes not retried when a runbook's `non_retryable:` is not given.
NON_RETRYABLE_DEFAULT = tuple(name for name, cls in FAILURE_CLASSES.items() if not cls.retried_by_default)


class HostRefused(Exception):
    """The host cannot be used at all (unknown host key): no retry, no fallback."""


class FactsError(Exception):
    """The output could not be turned into facts; the attempt fails with this message."""


class GateWorkerUnavailable(Exception):
    """No worker process could be started (EMFILE, EAGAIN): the attempt's gates cannot be evaluated."""


class RunnerUnavailable(Exception):
    """The runner could not start on this host (no python3, say); the exec path serves it instead."""


class RunnerLost(Exception):
    """The runner or its channel ended while a command was in flight."""


def _command_interrupted() -> type[asyncio.CancelledError]:
    """CommandInterrupted, defined on first use: it is asyncio's CancelledError, and importing asyncio
    (~40 ms) is a cost that the commands which read a run folder (`runbook status`) must not pay."""
    import asyncio

    class CommandInterrupted(asyncio.CancelledError):
        """Cancellation that carries the interrupted command's partial result, for the audit log."""

        __qualname__ = "CommandInterrupted"  # found by its name here (pickle, reprs), as a class of the module

        def __init__(self, result: CommandResult) -> None:
            super().__init__("interrupted")
            self.result = result

    return CommandInterrupted


if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` defines it on first use

    class CommandInterrupted(asyncio.CancelledError):
        result: CommandResult

        def __init__(self, result: CommandResult) -> None: ...

else:

    def __getattr__(name: str) -> type:
        if name != "CommandInterrupted":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = defined = _command_interrupted()
        return defined
