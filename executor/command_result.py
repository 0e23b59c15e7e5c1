"""What one command attempt produced (`CommandResult`): the value every transport gives back.

A module of its own, below both the transports and executor.errors: an interrupted command's
`CommandInterrupted` (executor.errors) carries one, and the transports (executor.transport.base,
which re-exports it as part of the interface) make them, so neither of those two modules imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CommandResult:
    """What one command attempt produced."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    stdout_sha256: str
    stderr_sha256: str
    started_at: str
    duration_s: float
    timed_out: bool = False
    interrupted: bool = False
    timeout_s: float | None = None  # the limit the command ran under (set by the step context)
    #: True: the command was stopped (timeout, interrupt) and the host confirmed that every process of
    #: its session was killed. False: the host could not confirm that (no answer, a process that would
    #: not die, no /proc), after a stop or for what the script left running. None: not stopped, and
    #: nothing it left survived.
    kill_confirmed: bool | None = None

    @property
    def ended(self) -> str:
        """How the command ended, for a message (`how_it_ended`)."""
        return how_it_ended(self.exit_code, self.timed_out, self.interrupted)

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


def how_it_ended(exit_code: int | None, timed_out: bool = False, interrupted: bool = False) -> str:
    """How a command ended, in words: `exit 3`, `timed out`, `interrupted`, or `no exit status` where none came (its
    connection failed or broke: the transport error says why). Never `exit None`."""
    if timed_out:
        return "timed out"
    if interrupted:
        return "interrupted"
    return "no exit status" if exit_code is None else f"exit {exit_code}"
