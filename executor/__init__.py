"""runbook's engine: load a runbook, run it, and what a step kind builds on.

The CLI (executor.cli) is one user of this API; tests and bench/ are others.
"""

from executor.engine import Engine, RunOptions
from executor.errors import (
    FactsError,
    HostKeyError,
    InvalidRunbook,
    Problem,
    ResumeError,
    RunbookError,
    RunLocked,
    TransportError,
)
from executor.loader import Runbook, load_runbook
from executor.model import Gate, Host
from executor.planner import plan_text, render_problems
from executor.render import heredoc, host_word, render_command
from executor.stepkind import (
    Outcome,
    ProgressLines,
    RenderContext,
    StepContext,
    StepSpec,
    VarRef,
    host_document,
    progress_messages,
    resolve_var,
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
    "ProgressLines",
    "RenderContext",
    "ResumeError",
    "RunLocked",
    "RunOptions",
    "Runbook",
    "RunbookError",
    "StepContext",
    "StepSpec",
    "Transport",
    "TransportError",
    "VarRef",
    "heredoc",
    "host_document",
    "host_word",
    "load_runbook",
    "plan_text",
    "progress_messages",
    "render_command",
    "render_problems",
    "resolve_var",
    "step_kinds",
]
