"""A transport that answers from a script, in memory: test a runbook's logic without a host.

As httpx's `MockTransport` does for HTTP clients, `ScriptedTransport` stands where `SSHTransport` and
`LocalTransport` stand (the `Transport` interface of executor/transport/base.py; the Engine takes it through
its `transport_factory`), so that a runbook's order, gates, retries, fallbacks, `when`, cells and resumes run
offline, in a fraction of a second per run, exactly as the engine runs them against a real host.

It answers each command by the first rule, newest first, whose matcher fits it (`on`): a regex searched in
the step's script, or a callable given the `ScriptedCommand`. A rule gives an exit code, stdout and stderr,
optionally after a delay or never (`hang`: the command's timeout then ends it, `timed_out`), or fails as a
lost connection would (`TransportError` with the partial output). A rule with several answers gives them in
turn, the last one again after that (a step that fails twice, then passes). A command no rule fits fails
with `UnscriptedCommand`, a `TransportError` naming the host and the command: the step fails at once (no
retry, no fallback), saying so, and nothing waits; a matcher or responder that raises does the same.

Host programs (hostprograms/*.py, shipped by executor.hostprogram) are answered by name with the document
they print (`program("probe", document)`): the transport writes it as the program's last line of stdout,
so a test never spells the wire format. Every command it received is kept (`commands`), with the host
program it shipped and that program's config; `put`/`get` move bytes into and out of `files`.

Output passes through the same `Collector` as a real transport's: the run's secrets are masked as it
arrives, the live sink sees it, and the same head and tail limits apply.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sysconfig
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from executor.errors import TransportError
from executor.hostprogram import PROGRAM_LINE, PROGRESS_PREFIX
from executor.render import KILLED_NOTE, RenderedCommand
from executor.transport.base import (
    Collector,
    CommandResult,
    Digest,
    OutputSink,
    Transfer,
    Transport,
    open_regular,
    supervise,
)

#: What a stopped command exits with: the step's bash ended by TERM, as the wrapper reports it.
STOPPED_EXIT = 143
#: Output is fed to the collector in pieces of this size, as a real stream arrives.
_PIECE = 65536
_CONFIG = re.compile(r"""<<'RUNBOOK_CONFIG'\n(.*?)\nRUNBOOK_CONFIG\n""", re.DOTALL)
_SHOWN_SCRIPT = 300  # characters of a script an unscripted command's message quotes


class UnscriptedCommand(TransportError):
    """A command that no rule of the ScriptedTransport answers: the test must say what the host does. Its step
    fails on the host at once: neither waiting for a retry nor a fallback's answer may hide the omission."""

    refuses_host = True


@dataclass(frozen=True)
class HostProgramCall:
    """A host program a command ships: its name (hostprograms/NAME.py) and the config it is given."""

    name: str
    config: Mapping[str, Any]


@dataclass(frozen=True)
class ScriptedCommand:
    """One command as the transport received it."""

    host: str
    script: str  # the step's script, as the host would run it
    display: str  # the whole command as the audit log records it (secrets masked)
    env: Mapping[str, str] = field(repr=False)  # the step's vars and secrets (never in a repr)
    programs: tuple[HostProgramCall, ...] = ()
    timeout: float = 0.0

    @property
    def program(self) -> HostProgramCall | None:
        """The (first) host program the command ships, if any."""
        return self.programs[0] if self.programs else None


@dataclass(frozen=True)
class Answer:
    """What a scripted host does with a command: prints `stdout` and `stderr` at once, then exits with
    `exit_code` after `delay` seconds; with `hang`, never exits by itself (its timeout or a cancellation
    stops it, as the real wrapper does, and the kill is confirmed); with `error`, the connection breaks
    after the output: `error_type` (a TransportError) is raised with the partial output."""

    exit_code: int = 0
    stdout: bytes | str = b""
    stderr: bytes | str = b""
    delay: float = 0.0
    hang: bool = False
    error: str | None = None
    error_type: type[TransportError] = TransportError

    def __post_init__(self) -> None:
        if not 0 <= self.delay < math.inf:  # NaN too: a host that waits "NaN seconds" hangs unasked
            raise ValueError(
                f"Answer(delay={self.delay}): give a finite number of seconds >= 0 (never ends: hang=True)"
            )


def program_output(document: Any, progress: Sequence[Mapping[str, Any]] = ()) -> tuple[bytes, bytes]:
    """(stdout, stderr) of a host program that printed `document` (a dict, a list or a pydantic model) as its
    result and `progress` as its progress lines: the wire format of hostprograms/kit.py."""
    if isinstance(document, BaseModel):
        document = document.model_dump(mode="json")
    stdout = (json.dumps(document, allow_nan=False) + "\n").encode()
    stderr = b"".join(PROGRESS_PREFIX + json.dumps(dict(line)).encode() + b"\n" for line in progress)
    return stdout, stderr


#: What a rule is given: an Answer, or a callable that makes one from the command.
Responder = Answer | Callable[[ScriptedCommand], Answer]
#: What picks a rule's commands: a regex (text or compiled) searched in the script, or a predicate.
Matcher = str | re.Pattern[str] | Callable[[ScriptedCommand], bool]


@dataclass
class _Rule:
    matches: Callable[[ScriptedCommand], bool]
    answers: list[Responder]
    used: int = 0

    def next(self, command: ScriptedCommand) -> Answer:
        responder = self.answers[min(self.used, len(self.answers) - 1)]
        self.used += 1
        return responder(command) if callable(responder) else responder


def _matcher(matcher: Matcher) -> Callable[[ScriptedCommand], bool]:
    if callable(matcher) and not isinstance(matcher, re.Pattern):
        return matcher
    pattern = re.compile(matcher) if isinstance(matcher, str) else matcher
    return lambda command: pattern.search(command.script) is not None


def shipped_calls(script: str) -> tuple[HostProgramCall, ...]:
    """The host programs a rendered script ships, each with its config (executor.hostprogram's heredocs)."""
    names = PROGRAM_LINE.findall(script)
    configs = [json.loads(text) for text in _CONFIG.findall(script)]
    return tuple(
        HostProgramCall(name, configs[i] if i < len(configs) else {}) for i, (name, _digest) in enumerate(names)
    )


def _bytes(text: bytes | str) -> bytes:
    return text.encode() if isinstance(text, str) else text


class ScriptedTransport(Transport):
    """One scripted host: answers by rule, keeps files in memory, records every command it received."""

    def __init__(self, name: str = "host") -> None:
        self.name = name
        self.commands: list[ScriptedCommand] = []
        self.files: dict[str, bytes] = {}
        self.transfers: list[Transfer] = []
        self.closed = False
        self._rules: list[_Rule] = []
        self._notes: list[str] = []

    # ---- scripting ---------------------------------------------------------------------------

    def on(self, matcher: Matcher, *answers: Responder, **answer: Any) -> ScriptedTransport:
        """Answer the commands `matcher` picks with `answers` in turn (the last one again after that), or
        with one `Answer(**answer)`. The rule added last is tried first: a test overrides a default."""
        made = list(answers) or [Answer(**answer)]
        self._rules.insert(0, _Rule(_matcher(matcher), made))
        return self

    def program(
        self,
        name: str,
        *documents: Any,
        exit_code: int = 0,
        progress: Sequence[Mapping[str, Any]] = (),
        when: Callable[[HostProgramCall], bool] | None = None,
    ) -> ScriptedTransport:
        """Answer host program `name` with the documents it prints, in turn (a dict, a pydantic model, or a
        callable given the `HostProgramCall` that returns one); `when` narrows it to some configs
        (`when=lambda call: call.config["command"] == "fetch"`)."""

        def picks(command: ScriptedCommand) -> bool:
            call = next((c for c in command.programs if c.name == name), None)
            return call is not None and (when is None or when(call))

        def responder(document: Any) -> Responder:
            if not callable(document):
                _printed(name, document, progress)  # refused here, at the test's line, not as the step's crash

            def answer(command: ScriptedCommand) -> Answer:
                call = next(c for c in command.programs if c.name == name)
                stdout, stderr = _printed(name, document(call) if callable(document) else document, progress)
                return Answer(exit_code=exit_code, stdout=stdout, stderr=stderr)

            return answer

        return self.on(picks, *(responder(document) for document in documents))

    def note(self, message: str) -> None:
        """Something the user should hear about this host once (what SSH says of a fallback to exec)."""
        self._notes.append(message)

    # ---- what the tests read -----------------------------------------------------------------

    def scripts(self) -> list[str]:
        return [command.script for command in self.commands]

    def programs_run(self) -> list[str]:
        """The host programs run, in order (one name per command that shipped one)."""
        return [command.program.name for command in self.commands if command.program is not None]

    # ---- the Transport interface -------------------------------------------------------------

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        script = command.script.decode("utf-8", "replace")
        display = self.redactor.text(command.display)  # as the audit log records it
        received = ScriptedCommand(self.name, script, display, command.env, shipped_calls(script), timeout)
        self.commands.append(received)
        answer = self._answer(received)
        collect = Collector(on_output, self.redactor)
        for data, into in ((_bytes(answer.stdout), collect.stdout), (_bytes(answer.stderr), collect.stderr)):
            for start in range(0, len(data), _PIECE):
                into.feed(data[start : start + _PIECE])
        if answer.error is not None:
            raise answer.error_type(answer.error, bytes(collect.stdout.data), bytes(collect.stderr.data))

        async def finish() -> int:
            if answer.hang:
                await asyncio.Event().wait()  # only a stop ends it
            await asyncio.sleep(answer.delay)
            return answer.exit_code

        async def stop(task: asyncio.Future[int | None]) -> int:
            task.cancel()
            collect.stderr.feed(f"\n{KILLED_NOTE}\n".encode())  # what the wrapper says once the session is empty
            return STOPPED_EXIT

        return await supervise(collect, finish(), timeout, stop)

    def _answer(self, received: ScriptedCommand) -> Answer:
        """The answer of the first rule that fits; a matcher or responder of the test's that raises is named, with
        where it raised, as an unscripted command is (not as a crash of the step kind, retried)."""
        try:
            rule = next((rule for rule in self._rules if rule.matches(received)), None)
            if rule is not None:
                return rule.next(received)
        except Exception as exc:
            where = _where(exc)
            raise UnscriptedCommand(
                f"a scripted rule of {self.name} raised {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"
                f" for the command: {_shown(received.script)}"
            ) from None
        raise UnscriptedCommand(f"no scripted answer on {self.name} for the command: {_shown(received.script)}")

    async def put(self, local: Path, remote: str) -> Transfer:
        with open_regular(local) as source:
            data = source.read()
        self.files[remote] = data
        return self._moved(Transfer("put", str(local), remote, *_digest(data)))

    async def get(self, remote: str, local: Path) -> Transfer:
        if remote not in self.files:
            raise TransportError(f"download of {self.name}:{remote} failed: no such file")
        data = self.files[remote]
        local.write_bytes(data)
        return self._moved(Transfer("get", str(local), remote, *_digest(data)))

    def _moved(self, transfer: Transfer) -> Transfer:
        self.transfers.append(transfer)
        return transfer

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    async def close(self) -> None:
        self.closed = True


def _digest(data: bytes) -> tuple[int, str]:
    digest = Digest()
    digest.update(data)
    return digest.size, digest.sha256


def _printed(name: str, document: Any, progress: Sequence[Mapping[str, Any]]) -> tuple[bytes, bytes]:
    """`program_output`, refusing a document that host program `name` could not print (hostprograms/kit.py:
    NaN, an infinity, a value JSON has no form for)."""
    try:
        return program_output(document, progress)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"host program {name!r} could not print this document: {exc}") from None


def _where(exc: Exception) -> traceback.FrameSummary:
    """Where a test's matcher or responder raised: the innermost frame of the test's own code (neither this
    module nor the standard library), else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    stdlib = sysconfig.get_paths()["stdlib"]
    own = [f for f in frames if f.filename != __file__ and not f.filename.startswith(stdlib)]
    return (own or frames)[-1]


def _shown(script: str) -> str:
    """A script as a message quotes it: its host program's name, or its start on one line."""
    calls = shipped_calls(script)
    if calls:
        return f"host program {calls[0].name!r} (config {json.dumps(dict(calls[0].config))[:_SHOWN_SCRIPT]})"
    flat = " ".join(script.split())
    return repr(flat if len(flat) <= _SHOWN_SCRIPT else flat[:_SHOWN_SCRIPT] + " ...")
