"""runbook's engine: load a runbook, run it, and what a step kind builds on.

The CLI (executor.cli) is one user of this API; tests and bench/ are others.
"""

from executor.engine import Engine, RunOptions
from executor.errors import (
    HostKeyError,
    InvalidRunbook,
    Problem,
    ResumeError,
    RunbookError,
    RunLocked,
    SecretMissing,
    TransportError,
)
from executor.loader import Runbook, load_runbook
from executor.model import Gate, Host
from executor.render import heredoc, host_word, render_command
from executor.stepkind import (
    FactsError,
    Outcome,
    RenderContext,
    StepContext,
    StepSpec,
    host_document,
    step_kinds,
)
from executor.transport import CommandResult, Transport

__all__ = [
    "CommandResult",
    "Engine",
    "FactsError",
    "Gate",
    "Host",
    "HostKeyError",
    "InvalidRunbook",
    "Outcome",
    "Problem",
    "RenderContext",
    "ResumeError",
    "RunLocked",
    "RunOptions",
    "Runbook",
    "RunbookError",
    "SecretMissing",
    "StepContext",
    "StepSpec",
    "Transport",
    "TransportError",
    "heredoc",
    "host_document",
    "host_word",
    "load_runbook",
    "render_command",
    "step_kinds",
]
