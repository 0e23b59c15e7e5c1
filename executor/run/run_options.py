"""How a run is started (`RunOptions`): what the CLI's flags say, and what an API caller gives the Engine alike.

A module of its own: `executor.run.resume` starts a run as these options say, and must not import the engine
that runs it (the engine imports resume).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.files import LOG_DIR


@dataclass
class RunOptions:
    """How a run is started: what the CLI's flags say, and what an API caller gives the Engine alike."""

    log_dir: Path = LOG_DIR
    var_overrides: Mapping[str, Any] = field(default_factory=dict)  # var values, over the `var_args`
    resume: str | None = None  # a run id, or "latest"
    from_step: str | None = None
    only_step: str | None = None
    # how the run was started, recorded in run.json so that `--resume` can start it the same way
    var_args: Sequence[str] = ()  # --var K=V pairs
    unset_vars: Sequence[str] = ()  # --unset-var NAME: a --var of the run a resume continues, not carried over
    inventory: Path | None = None  # the inventory the runbook was loaded with
    verbose: bool = False  # the run's diagnostics (debug.log) on stderr too: `runbook run -v`
