"""What both faces, the CLI and the MCP server, take in before they validate, plan or start a run: the runbook
loaded with its var overrides checked (`load_checked`), and compare's threshold.

A module of its own so that the MCP server and the CLI check a runbook alike without either importing the
other (the CLI starts the MCP server: `runbook mcp`). Its imports are made by `load_checked`, for the same
reason as the CLI's: `runbook status` must not pay for the loader at start-up (bench/startup.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executor.runbook.loader import Runbook

#: `runbook compare --threshold`'s default (the MCP `compare`'s `threshold`): a regression is worse by more than this
#: many percent, beyond noise (executor/faces/compare.py); the largest threshold taken.
COMPARE_THRESHOLD_PCT = 5.0
COMPARE_THRESHOLD_MAX_PCT = 1000.0


def load_checked(
    file: Path,
    inventory: Path | None,
    var_pairs: Sequence[str],
    environ: Mapping[str, str] | None = None,
    lay_under: Callable[[Runbook], Sequence[str]] | None = None,
) -> tuple[Runbook, dict[str, Any]]:
    """The runbook with its var overrides, every step renderable with them (or InvalidRunbook), for
    `validate` and `plan` (a run is checked so by the Engine). With `environ`, the secrets' values are
    read from it and masked in every problem's message. `lay_under` gives, from the loaded runbook, var pairs
    that `var_pairs` override (a campaign's band: `--from-campaign`)."""
    from executor.redact import NO_SECRETS
    from executor.run.resume import checked_vars
    from executor.runbook.loader import load_runbook
    from executor.runbook.planner import secrets_redactor

    runbook = load_runbook(file, inventory)
    redactor = NO_SECRETS if environ is None else secrets_redactor(runbook, environ)
    under = [] if lay_under is None else list(lay_under(runbook))
    return runbook, checked_vars(runbook, [*under, *var_pairs], {}, redactor)
