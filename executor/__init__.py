"""runbook's engine: load a runbook, run it, and what a step kind builds on.

The CLI (executor.faces.cli) is one user of this API; tests and bench/ are others.

The names are imported when first used (PEP 562), not with the package: every `executor.*` import runs
this file first, and `runbook status` must not pay for the engine, asyncssh and the step kinds it never
uses (bench/startup.py measures it). Type checkers see the imports as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from executor.render import heredoc, host_word, render_command
    from executor.run.engine import Engine
    from executor.run.run_options import RunOptions
    from executor.runbook.loader import Runbook, load_runbook
    from executor.runbook.model import Gate, Host
    from executor.runbook.planner import plan_text, render_problems
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

#: Each public name and the module that defines it.
_HOMES = {
    "executor.run.engine": ("Engine",),
    "executor.errors": (
        "FactsError",
        "HostKeyError",
        "InvalidRunbook",
        "Problem",
        "ResumeError",
        "RunbookError",
        "RunLocked",
        "TransportError",
    ),
    "executor.runbook.loader": ("Runbook", "load_runbook"),
    "executor.runbook.model": ("Gate", "Host"),
    "executor.runbook.planner": ("plan_text", "render_problems"),
    "executor.render": ("heredoc", "host_word", "render_command"),
    "executor.run.run_options": ("RunOptions",),
    "executor.stepkind": (
        "Outcome",
        "ProgressLines",
        "RenderContext",
        "StepContext",
        "StepSpec",
        "VarRef",
        "host_document",
        "progress_messages",
        "resolve_var",
        "step_kinds",
    ),
    "executor.transport": ("CommandResult", "Transport"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (and kept here, so this runs once per name)."""
    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module 'executor' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
