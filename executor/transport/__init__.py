"""Transports: how a rendered command reaches a host (SSH, or this machine; in tests, a script of answers).

The transports are imported when first used (PEP 562): a step kind that needs only
`executor.transport.base` (a CommandResult) must not import asyncssh with this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from executor.diagnostics import NO_LOG, Log
from executor.redact import NO_SECRETS, Redactor
from executor.transport.base import CommandResult, Transfer, Transport

if TYPE_CHECKING:
    from executor.runbook.model import Host
    from executor.transport.local import LocalTransport
    from executor.transport.scripted import ScriptedTransport
    from executor.transport.ssh import SSHTransport


def transport_for(name: str, host: Host, redactor: Redactor = NO_SECRETS, log: Log = NO_LOG) -> Transport:
    """The transport a host definition asks for, masking `redactor`'s secrets in every command's output and
    writing its diagnostics to `log` (the run's), with the host bound."""
    if host.is_local:
        from executor.transport.local import LocalTransport

        transport: Transport = LocalTransport(name)
    else:
        from executor.transport.ssh import SSHTransport

        transport = SSHTransport(name, host)
    transport.redactor = redactor
    transport.log = log.bind(host=name)
    return transport


def __getattr__(name: str) -> Any:
    """LocalTransport, SSHTransport and ScriptedTransport, imported on first use (and kept here)."""
    homes = {
        "LocalTransport": "executor.transport.local",
        "SSHTransport": "executor.transport.ssh",
        "ScriptedTransport": "executor.transport.scripted",
    }
    if name not in homes:
        raise AttributeError(f"module 'executor.transport' has no attribute {name!r}")
    value = getattr(importlib.import_module(homes[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "CommandResult",
    "LocalTransport",
    "SSHTransport",
    "ScriptedTransport",
    "Transfer",
    "Transport",
    "transport_for",
]
