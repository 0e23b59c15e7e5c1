"""Transports: how a rendered command reaches a host (SSH, or this machine)."""

from executor.diagnostics import NO_LOG, Log
from executor.model import Host
from executor.redact import NO_SECRETS, Redactor
from executor.transport.base import CommandResult, Transfer, Transport
from executor.transport.local import LocalTransport
from executor.transport.ssh import SSHTransport


def transport_for(name: str, host: Host, redactor: Redactor = NO_SECRETS, log: Log = NO_LOG) -> Transport:
    """The transport a host definition asks for, masking `redactor`'s secrets in every command's output and
    writing its diagnostics to `log` (the run's), with the host bound."""
    transport: Transport = LocalTransport(name) if host.is_local else SSHTransport(name, host)
    transport.redactor = redactor
    transport.log = log.bind(host=name)
    return transport


__all__ = ["CommandResult", "LocalTransport", "SSHTransport", "Transfer", "Transport", "transport_for"]
