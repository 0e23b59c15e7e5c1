"""The rich consoles that stderr's messages and stdout's tables go through, apart from the reporters.

A module of its own so that the CLI can make its console at start-up without importing the reporters
(executor.run.events: pydantic's event models, rich's live display), which only `runbook run` needs.
"""

from __future__ import annotations

from rich.console import Console


class UnattendedConsole(Console):
    """A rich console that goes quiet when its reader goes away (`runbook run ... 2>&1 | head`).

    rich's default exits the process on a broken pipe, which would stop a deployment half-way
    because nobody is reading its progress; the run goes on, its state and audit log complete.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True


class PipedConsole(Console):
    """stdout's console: a reader that went away (`runbook status | head`) ends the command quietly
    (`main` exits 141), instead of rich's own exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError
