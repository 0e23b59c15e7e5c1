"""The one error tree (executor/errors.py): each RunbookError carries the CLI's exit status, the CLI maps
every error by it in one place, and one function turns asyncssh and OS errors into TransportError."""

from __future__ import annotations

import asyncio
import errno

import asyncssh
import pytest

import executor
from executor import errors, stepkind
from executor.errors import (
    ArgumentRefused,
    AuditKeyError,
    DurableWriteError,
    HostKeyError,
    InvalidRunbook,
    Problem,
    ResumeError,
    RunbookError,
    RunLocked,
    StateError,
    TransportError,
    transport_error,
)
from executor.faces import cli
from executor.run import engine
from executor.runbook import gates
from executor.transport import base, runner

#: README, "Commands": what the CLI exits with when each error reaches it.
EXIT_CODES: list[tuple[RunbookError, int]] = [
    (InvalidRunbook([Problem("f.yaml", 1, 2, "bad")]), 2),
    (RunLocked("held"), 3),
    (ResumeError("nothing to resume"), 2),
    (StateError("unreadable", reason="damaged"), 2),
    (AuditKeyError("open to others"), 2),
    (ArgumentRefused("outside the roots"), 2),
    (DurableWriteError("/logs/run", "the audit log", "No space left on device", errno.ENOSPC, 0), 4),
    (TransportError("broke"), 1),
    (HostKeyError("not trusted"), 1),
]


@pytest.mark.parametrize(
    ("error", "code"), EXIT_CODES, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else ""
)
def test_each_error_carries_its_exit_code_and_the_cli_exits_with_it(
    error: RunbookError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert error.exit_code == code

    def command(_args: object) -> int:
        raise error

    monkeypatch.setitem(cli.COMMANDS, "runs", command)
    assert cli.main(["runs"]) == code
    said = capsys.readouterr()
    assert said.out == "" and "Traceback" not in said.err
    assert (str(error.problems[0]) if isinstance(error, InvalidRunbook) else str(error)) in said.err


def test_the_cli_maps_by_the_attribute_not_by_type(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new error with its own exit code needs no branch in the CLI (before: every unknown one exited 1)."""

    class Unplugged(RunbookError):
        exit_code = 7

    def command(_args: object) -> int:
        raise Unplugged("the \x1b[2J host is unplugged")

    monkeypatch.setitem(cli.COMMANDS, "runs", command)
    assert cli.main(["runs"]) == 7
    assert capsys.readouterr().err == "runbook: the \\x1b[2J host is unplugged\n"  # shown, as every error is


def test_the_engine_s_signals_live_in_errors_and_stay_where_the_api_exposes_them() -> None:
    assert executor.FactsError is stepkind.FactsError is errors.FactsError
    assert base.CommandInterrupted is errors.CommandInterrupted
    for module in (engine, stepkind, gates, runner, base):
        own = [
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__
        ]
        assert own == [], f"{module.__name__} defines {own}: the engine's exceptions live in executor.errors"
    # a Ctrl-C passes every `except Exception`, and asyncio sees it as cancellation
    assert issubclass(errors.CommandInterrupted, asyncio.CancelledError)
    assert not issubclass(errors.CommandInterrupted, Exception)
    for signal in (errors.AttemptFailed, errors.HostRefused, errors.FactsError, errors.RunnerLost):
        assert not issubclass(signal, RunbookError)  # never reaches the CLI: no exit code of its own


# ---- transport_error: the one mapping of asyncssh and OS errors --------------------------------------

WHAT = "cannot connect to box (127.0.0.1)"
MAPPED: list[tuple[BaseException, str]] = [
    (asyncssh.DisconnectError(asyncssh.DISC_BY_APPLICATION, "bye"), f"{WHAT}: bye"),
    (asyncssh.ProtocolError("Invalid packet"), f"{WHAT}: Invalid packet"),
    (asyncssh.KeyExchangeFailed("No matching kex"), f"{WHAT}: No matching kex"),
    (asyncssh.ServiceNotAvailable("no ssh-userauth"), f"{WHAT}: no ssh-userauth"),
    (asyncssh.PermissionDenied("Permission denied for user root"), f"{WHAT}: Permission denied for user root"),
    (asyncssh.ConnectionLost("Connection lost"), f"{WHAT}: Connection lost"),
    (asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "open failed"), f"{WHAT}: open failed"),
    (asyncssh.SFTPError(asyncssh.FX_FAILURE, "disk quota"), f"{WHAT}: disk quota"),
    (
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        f"{WHAT}: [Errno {errno.ECONNREFUSED}] Connection refused",
    ),
    (OSError(errno.EHOSTUNREACH, "No route to host"), f"{WHAT}: [Errno {errno.EHOSTUNREACH}] No route to host"),
    (ConnectionResetError(), f"{WHAT}: ConnectionResetError"),  # never an empty reason
    (TimeoutError(), f"{WHAT} within 2.5s"),  # asyncio's, which says nothing: how long it waited
    (TimeoutError("Connection timed out"), f"{WHAT}: Connection timed out"),
]


@pytest.mark.parametrize(
    ("exc", "message"), MAPPED, ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else ""
)
def test_asyncssh_and_os_errors_become_transport_errors(exc: BaseException, message: str) -> None:
    mapped = transport_error(exc, WHAT, timeout=2.5, partial=(b"out", b"err"))
    assert type(mapped) is TransportError  # retried per the step's policy
    assert str(mapped) == message
    assert (mapped.partial_stdout, mapped.partial_stderr) == (b"out", b"err")


@pytest.mark.parametrize(
    "exc",
    [
        asyncssh.HostKeyNotVerifiable("Host key is not trusted for host 127.0.0.1"),
        # what a peer's disconnect with code 9 (or a wrapper's) carries: a host key failure too
        asyncssh.DisconnectError(asyncssh.DISC_HOST_KEY_NOT_VERIFIABLE, "Host key is not trusted for host 127.0.0.1"),
    ],
)
def test_a_host_key_failure_is_a_host_key_error_with_the_hint(exc: BaseException) -> None:
    hint = "to trust it, ... ssh-keyscan 127.0.0.1 >> ~/.ssh/known_hosts"
    mapped = transport_error(exc, WHAT, untrusted_key=("host key of box (127.0.0.1) not trusted", hint))
    assert isinstance(mapped, HostKeyError)  # never retried
    assert str(mapped) == f"host key of box (127.0.0.1) not trusted: Host key is not trusted for host 127.0.0.1; {hint}"
    plain = transport_error(exc, WHAT)
    assert isinstance(plain, HostKeyError) and str(plain) == f"{WHAT}: Host key is not trusted for host 127.0.0.1"
