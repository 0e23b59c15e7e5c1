"""A test hook, used only by tests: run the `runbook` CLI and SIGKILL it at a chosen durable write.

    RUNBOOK_KILL_AT=N [RUNBOOK_KILL_MODE=after|torn] RUNBOOK_KILL_JOURNAL=FILE \\
        python -m tests.executor.killpoints run BOOK --log-dir DIR

The engine's durable writes are counted across all kinds, 1-based: a step-records transaction
(`state.save`), a run key (`state.set:<key>`), an audit line (`audit.line`) and the audit head
(`audit.head`). Mode `after` (the default) kills the process right after the N-th write completes;
mode `torn` kills it halfway through the N-th write when that is an audit line (half its bytes on
disk, fsynced), and behaves as `after` otherwise. Every write appends its point name to the journal
file, before it happens. Without RUNBOOK_KILL_AT the CLI just runs. The engine is not modified:
the writes are wrapped here, where the engine looks them up. Tests start it with `run_book`.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from executor.faces import cli
from executor.run import audit, state

_count = 0


def _journal(point: str) -> None:
    path = os.environ.get("RUNBOOK_KILL_JOURNAL")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(point + "\n")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _is_target() -> bool:
    """Count one write; whether it is the one to kill at."""
    global _count
    _count += 1
    target = os.environ.get("RUNBOOK_KILL_AT")
    return target is not None and _count == int(target)


def _hook(name: Callable[..., str], write: Callable[..., None]) -> Callable[..., None]:
    """Wrap `write` (any durable write but an audit line): journal it, do it, maybe die after."""

    @functools.wraps(write)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        _journal(name(*args, **kwargs))
        target = _is_target()
        write(*args, **kwargs)
        if target:
            _die()

    return wrapped


def _audit_line(write: Callable[[audit._DurableFile, str], None]) -> Callable[[audit._DurableFile, str], None]:
    """Wrap `_DurableFile.append`: as `_hook`, and in torn mode leave half the line on disk."""

    @functools.wraps(write)
    def wrapped(self: audit._DurableFile, message: str) -> None:
        _journal("audit.line")
        target = _is_target()
        if target and os.environ.get("RUNBOOK_KILL_MODE") == "torn":
            data = (message + "\n").encode("utf-8")
            os.write(self._fd, data[: len(data) // 2])  # the engine's unbuffered descriptor
            os.fsync(self._fd)
            _die()
        write(self, message)
        if target:
            _die()

    return wrapped


def install() -> None:
    """Wrap the engine's durable writes where they are looked up."""
    state.RunState.save = _hook(lambda *_a, **_k: "state.save", state.RunState.save)  # type: ignore[method-assign]
    state.RunState.set = _hook(  # type: ignore[method-assign]
        lambda _self, key, *_a, **_k: f"state.set:{key}", state.RunState.set
    )
    audit._DurableFile.append = _audit_line(audit._DurableFile.append)  # type: ignore[method-assign]
    # AuditLog calls `write_private` through the module's globals, so patching the module is enough
    audit.write_private = _hook(lambda *_a, **_k: "audit.head", audit.write_private)


REPO = Path(__file__).resolve().parents[2]


def run_book(
    book: Path,
    logs: Path,
    journal: Path,
    kill_at: int | None = None,
    mode: str = "after",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `runbook run BOOK --log-dir LOGS` through this hook, killed at write `kill_at` (never when None);
    `env` is laid over the environment."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_KILL_")} | (env or {})
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    environ |= {"RUNBOOK_KILL_JOURNAL": str(journal), "RUNBOOK_KILL_MODE": mode}
    if kill_at is not None:
        environ["RUNBOOK_KILL_AT"] = str(kill_at)
    return subprocess.run(
        [sys.executable, "-m", "tests.executor.killpoints", "run", str(book), "--log-dir", str(logs)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        stdin=subprocess.DEVNULL,
    )


def main(argv: list[str]) -> int:
    install()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
