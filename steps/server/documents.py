"""What the deploy host program (hostprograms/deploy.py) prints, and the facts `deploy` and `stop_server` make of
it: the documents of `start`, `launch` and `stop`, and each choice of the launch command with its source."""

from __future__ import annotations

from typing import Literal

from executor.runbook.model import DataModel, Model

ChoiceValue = str | int | float | bool | list[str] | None


class Choice(Model):
    """One decision of the launch command: its value (None: the flag is left out) and where it came from."""

    value: ChoiceValue
    source: str


class HttpAnswer(DataModel):
    status: int | None  # None: no answer (the body says why: connection refused, timed out)
    body: str


class PreviousServer(DataModel):
    """The server recorded on the port before this step: stopped (arguments differ) or forgotten (dead)."""

    pid: int
    action: Literal["stopped", "forgotten"]
    reason: str
    argv: list[str] | None = None
    pids: list[int] = []
    killed: bool = False
    left: list[int] = []
    gpu_freed: bool | None = None


class Stopped(DataModel):
    pids: list[int]
    killed: bool  # SIGTERM was not enough
    left: list[int]
    gpu_freed: bool  # no process of the server's group is left to hold GPU memory


class StartReport(DataModel):
    """The document hostprograms/deploy.py prints for `start`, and for `launch` (a node group's rank: started
    or adopted, not waited for: `ready` false, `health` and `generate` null)."""

    action: Literal["start", "launch"]
    port: int
    bind: str
    base_url: str  # what a client ON THE HOST uses
    argv: list[str]  # as the host expanded it
    state_file: str
    pid: int | None
    log_file: str | None
    reused: bool  # a server with these arguments was running already
    previous: PreviousServer | None
    ready: bool
    ready_s: float | None  # seconds until /health and /generate answered (for a reused one: the check)
    exit_code: int | None  # the server's, when it exited during start-up
    health: HttpAnswer | None
    generate: HttpAnswer | None
    error_line: str | None  # the line of its log that says what went wrong
    log_tail: list[str]
    failure: str | None
    #: The failure's class when retrying cannot fix it (executor/errors.py): only those deploy recognises, so that
    #: a host naming another (GateFalse, a typo) prints a document of an unexpected shape, not an unretried class
    failure_class: Literal["ConfigRefused", "OutOfMemory", "PortInUse"] | None = None
    port_holder: str | None = None  # who holds the port, when it is not our server
    server_version: str | None = None  # what /server_info says once the server is ready (provenance)
    server_version_unknown: str | None = None  # why server_version is None
    stopped: Stopped | None = None  # the server stopped after a failed start-up


class StopFacts(DataModel):
    """The document hostprograms/deploy.py prints for `stop` (the facts of `stop_server`)."""

    action: Literal["stop"]
    port: int
    state_file: str
    stopped: bool  # a running server was stopped
    pid: int | None
    argv: list[str] | None
    log_file: str | None
    pids: list[int]
    killed: bool
    gpu_freed: bool | None  # None: there was no server
    note: str | None  # why nothing was stopped
    failure: str | None


class DeployFacts(StartReport):
    speculative_algorithm: str | None  # None: a baseline, no speculative decoding
    model_path: str
    draft_model_path: str | None
    env: dict[str, str]
    choices: dict[str, Choice]
