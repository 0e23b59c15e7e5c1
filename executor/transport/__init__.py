"""Transports: how a rendered command reaches a host (SSH, or this machine)."""

from executor.model import Host
from executor.transport.base import CommandResult, Transfer, Transport
from executor.transport.local import LocalTransport
from executor.transport.ssh import SSHTransport


def transport_for(name: str, host: Host) -> Transport:
    """The transport a host definition asks for."""
    return LocalTransport(name) if host.is_local else SSHTransport(name, host)


__all__ = ["CommandResult", "LocalTransport", "SSHTransport", "Transfer", "Transport", "transport_for"]
