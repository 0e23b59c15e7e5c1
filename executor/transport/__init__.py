"""Transports: how a rendered command reaches a host (SSH, or this machine)."""

from executor.model import Host
from executor.redact import NO_SECRETS, Redactor
from executor.transport.base import CommandResult, Transfer, Transport
from executor.transport.local import LocalTransport
from executor.transport.ssh import SSHTransport


def transport_for(name: str, host: Host, redactor: Redactor = NO_SECRETS) -> Transport:
    """The transport a host definition asks for, masking `redactor`'s secrets in every command's output."""
    transport: Transport = LocalTransport(name) if host.is_local else SSHTransport(name, host)
    transport.redactor = redactor
    return transport


__all__ = ["CommandResult", "LocalTransport", "SSHTransport", "Transfer", "Transport", "transport_for"]
