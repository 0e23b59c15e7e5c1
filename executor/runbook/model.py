"""The runbook model: what a YAML runbook may say, as pydantic models.

The step list is typed by `StepSpec` (executor.stepkind); the loader validates each step
against the model of its `kind`, found in the step-kind registry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from executor.errors import FAILURE_CLASSES, NON_RETRYABLE_DEFAULT
from executor.render import BASH_OWNED_NAMES
from executor.runbook.durations import Delay, Duration

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PlacedError(ValueError):
    """A model validator's error about one place below the model (`loc`, a key path such as
    `("pools", "nodes", 1)`): the loader reports it at that place's line, not at the model's first."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class Model(BaseModel):
    """Base of every runbook model: unknown keys are errors, values are immutable.

    Each model's validator is built when first used (`defer_build`), not when its module is imported: a
    model is then built once, with the models it holds, rather than once alone and again inside each
    model that holds it (`runbook validate` and `plan` import every step kind, of which a runbook uses some).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class DataModel(BaseModel):
    """Base of the models of what a run produces: a kind's typed facts, the documents host programs print,
    the reports. Plain pydantic models otherwise (unknown keys ignored, mutable), each validator built when
    first used (`defer_build`): `runbook validate` imports every step kind, with its facts and report
    models, and validates none of them.
    """

    model_config = ConfigDict(defer_build=True)


#: A host's name: it names a folder of the run (`hosts/NAME/`), so it can never leave it.
HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def env_text_problem(text: str) -> str | None:
    """Why `text` cannot be an environment variable's value, or None: a NUL ends a C string (no
    environment can carry one), and a value that is no UTF-8 text (an argument of undecodable bytes)
    cannot be sent."""
    if "\x00" in text:
        return "contains a NUL byte, which no environment can carry"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text"
    return None


def _env_texts(values: dict[str, Any]) -> dict[str, Any]:
    """Refuse, at load time, a var value no environment can carry (`env_text_problem`)."""
    for name, item in values.items():
        problem = env_text_problem(str(item))
        if problem:
            raise ValueError(f"var {name!r} {problem}")
    return values


def _host_names(hosts: dict[str, Any]) -> dict[str, Any]:
    for name in hosts:
        if not HOST_NAME.fullmatch(name):
            raise ValueError(
                f"host name {name!r} must be letters, digits, '_', '.' or '-', not starting with '.' or '-'"
                " (it names a folder of the run)"
            )
    return hosts


VarValue = str | int | float | bool


def _pool_names(pools: dict[str, list[str]]) -> dict[str, list[str]]:
    for name, members in pools.items():
        if not HOST_NAME.fullmatch(name) or name == "all":
            raise ValueError(f"pool name {name!r} must be letters, digits, '_', '.' or '-' (and not `all`)")
        if not members:
            raise ValueError(f"pool '{name}' lists no host")
        if len(set(members)) != len(members):
            raise ValueError(f"pool '{name}' lists a host twice")
    return pools


class Host(Model):
    """Where steps run: an SSH destination, or `address: local` for this machine."""

    address: str  # a host name or IP, an alias of ~/.ssh/config, or `local` (this machine, no SSH)
    port: int | None = Field(default=None, ge=1, le=65535)  # SSH port (default: the ssh config's, else 22)
    user: str | None = None  # the login (default: the ssh config's, else the controller's user)
    identity_file: str | None = None  # the private key to log in with (`~` expands)
    known_hosts: str | None = None  # the file the host key is checked against (default: ~/.ssh/known_hosts)
    verify_host_key: bool = True  # false: accept any host key (named on the console, in run.json and the audit log)
    connect_timeout: Duration = 10.0  # for each connection attempt
    keepalive: Duration = 15.0  # interval of SSH keepalives: a dead connection is noticed within a few
    proxy_jump: str | None = None  # jump host(s), as ssh's ProxyJump (`user@bastion:22`); their keys are checked too
    ssh_config: str | None = None  # an ssh config file to read instead of ~/.ssh/config
    #: How commands reach an SSH host. `persistent`: one runner process per connection, started once
    #: through the login shell (its ~/.bashrc runs once, and what it prints never reaches a step);
    #: hosts without python3 fall back to `exec`. `exec`: one SSH exec channel per command, each
    #: through the login shell. Steps run alike either way; `address: local` ignores it.
    runner: Literal["persistent", "exec"] = "persistent"
    #: This host's values of vars the runbook declares (the loader refuses other names): a pool's hosts
    #: differ in ports, model folders or interpreters, and each host's steps get its own values.
    vars: dict[str, VarValue] = Field(default_factory=dict)

    _vars = field_validator("vars")(_env_texts)

    @property
    def is_local(self) -> bool:
        return self.address == "local"


def _failure_class(name: str) -> str:
    if name not in FAILURE_CLASSES:
        raise ValueError(f"{name!r} is no failure class; the classes are {', '.join(FAILURE_CLASSES)}")
    return name


#: A failure class's name (executor.errors, FAILURE_CLASSES; README, "Retries"), checked at `validate`.
FailureClass = Annotated[
    str, AfterValidator(_failure_class), WithJsonSchema({"type": "string", "enum": list(FAILURE_CLASSES)})
]


class RetryPolicy(Model):
    """How often an attempt is repeated before fallbacks are tried."""

    attempts: int = Field(default=1, ge=1, le=100)  # attempts of the step in all (1: no retry)
    delay: Delay = 2.0  # the pause before the first retry
    backoff: float = Field(default=2.0, ge=1.0, le=100.0)  # each later pause is the one before times this
    max_delay: Delay = 60.0  # the longest pause between attempts
    #: The failure classes that end the step's attempts at once (its fallbacks are still tried): asking
    #: again cannot fix them. The whole list: `[]` retries every failure, adding a class widens it.
    non_retryable: tuple[FailureClass, ...] = NON_RETRYABLE_DEFAULT

    def retries(self, failure: BaseException) -> bool:
        """Whether an attempt that failed with `failure` is worth another (attempts left aside)."""
        return type(failure).__name__ not in self.non_retryable


class RetryOverride(Model):
    """A step's partial retry policy; unset fields come from `defaults.retry`."""

    attempts: int | None = Field(default=None, ge=1, le=100)  # attempts of the step in all (1: no retry)
    delay: Delay | None = None  # the pause before the first retry
    backoff: float | None = Field(default=None, ge=1.0, le=100.0)  # each later pause is the one before times this
    max_delay: Delay | None = None  # the longest pause between attempts
    #: The failure classes not retried, in place of `defaults.retry.non_retryable` (`[]`: retry every failure).
    non_retryable: tuple[FailureClass, ...] | None = None

    def over(self, base: RetryPolicy) -> RetryPolicy:
        return base.model_copy(update=self.model_dump(exclude_none=True))


class Defaults(Model):
    """What a step that says nothing else gets."""

    timeout: Duration = 600.0  # of each command of a step without its own `timeout`
    retry: RetryPolicy = RetryPolicy()  # the retry policy of every step; a step's `retry` overrides its fields
    max_parallel: int = Field(default=16, ge=1)  # hosts a step runs on at once


class SecretRef(Model):
    """Where a secret's value comes from; the value itself never enters a file."""

    env: str  # the controller's environment variable holding the value
    required: bool = True  # false: the secret may be unset (then it is absent, not empty)

    @field_validator("env")
    @classmethod
    def _env_is_a_name(cls, value: str) -> str:
        if not IDENTIFIER.fullmatch(value):  # whole: "HF_TOKEN\n" names no variable
            raise ValueError(f"{value!r} is not a valid environment variable name")
        return value


def _gate_from_str(value: Any) -> Any:
    return {"that": value} if isinstance(value, str) else value


class Gate(Model):
    """A Jinja2 expression that must be true for a step to pass."""

    that: str  # the Jinja2 expression (sees stdout, stderr, exit_code, facts, steps, vars)
    message: str | None = None  # what a failure says besides the expression and the values it read


#: A gate as written: its expression alone, or a mapping with `that` (and `message`).
GateSpec = Annotated[Gate, BeforeValidator(_gate_from_str, json_schema_input_type=str | Gate)]


class RunbookHeader(Model):
    """Everything of a runbook except its steps (validated per kind by the loader)."""

    name: str  # the runbook's name (run ids, `runbook runs`)
    description: str | None = None  # what the runbook is for
    hosts: dict[str, Host] = Field(default_factory=dict)  # where steps run, by name (none: this machine, `local`)
    #: Exported to the steps that name them (`$name`), their gates' `vars`; an inventory, a host's `vars` and
    #: `--var` override the values, never add names.
    vars: dict[str, VarValue] = Field(default_factory=dict)
    #: Like vars, their values read from the controller's environment and masked in everything a run shows.
    secrets: dict[str, SecretRef] = Field(default_factory=dict)
    #: Named lists of hosts (`gpus: [gpu1, gpu2]`): a step's `hosts: gpus`, a matrix's pool. An inventory
    #: may give a pool other hosts, so the runbook names the pool and each site says what is in it.
    pools: dict[str, list[str]] = Field(default_factory=dict)
    defaults: Defaults = Defaults()  # a step's timeout, retry policy and parallelism when it gives none
    steps: list[Any] = Field(min_length=1)  # run in order: steps, and `group:`s of steps over a matrix

    _hosts = field_validator("hosts")(_host_names)
    _pools = field_validator("pools")(_pool_names)

    @field_validator("vars", "secrets")
    @classmethod
    def _names_are_identifiers(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not IDENTIFIER.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in BASH_OWNED_NAMES:
                raise ValueError(f"bash sets {name} itself: a step's var or secret cannot have that name")
        return value

    _vars = field_validator("vars")(_env_texts)

    @model_validator(mode="after")
    def _pools_of_hosts(self) -> RunbookHeader:
        hosts = self.hosts or {"local": Host(address="local")}
        for name, members in self.pools.items():
            if name in hosts:
                text = f"pool '{name}' has the name of a host: a step's `hosts: {name}` would be ambiguous"
                raise PlacedError(("pools", name), text)
            for index, member in enumerate(members):
                if member not in hosts:
                    text = f"pool '{name}' lists '{member}', not a host of the runbook"
                    raise PlacedError(("pools", name, index), text)
        return self

    @model_validator(mode="after")
    def _vars_and_secrets_distinct(self) -> RunbookHeader:
        clash = sorted(set(self.vars) & set(self.secrets))
        if clash:
            raise PlacedError(("secrets", clash[0]), f"names used both as var and as secret: {', '.join(clash)}")
        return self


class InventoryHost(Host):
    """A host as an inventory writes it: each field it gives is laid over the runbook's host of that name, field
    by field (its `vars` name by name), so a site file of `{address, user}` keeps the runbook's `identity_file`,
    `known_hosts` and `connect_timeout`; `null` drops a runbook's value."""

    #: The host's address; needed only for a host the runbook does not have (one the inventory's pools add).
    address: str | None = None  # type: ignore[assignment]  # optional here: the runbook's address stays


class Inventory(Model):
    """Hosts and vars of one site laid over a runbook (`--inventory`): the runbook stays as written."""

    hosts: dict[str, InventoryHost] = Field(default_factory=dict)  # this site's hosts (the runbook's, or new in a pool)
    vars: dict[str, VarValue] = Field(default_factory=dict)  # this site's values of vars the runbook declares
    pools: dict[str, list[str]] = Field(default_factory=dict)  # a pool's hosts at this site, in place of the runbook's

    _hosts = field_validator("hosts")(_host_names)
    _vars = field_validator("vars")(_env_texts)
    _pools = field_validator("pools")(_pool_names)


def host_variables(
    declared: Mapping[str, VarValue], host: Host, overrides: Mapping[str, VarValue]
) -> dict[str, VarValue]:
    """The vars of a step on `host`: the runbook's (with the inventory's), the host's own `vars` over
    them, and the command line's `--var` over all (what is typed last wins)."""
    return {**declared, **host.vars, **overrides}


def var_text(value: VarValue) -> str:
    """How a var value reaches a script's environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


#: A number as `var_text` writes it back: no sign but `-`, no leading zeros, no exponent, no `_`
_PLAIN_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", re.ASCII)


def override_value(name: str, text: str, declared: VarValue) -> VarValue:
    """The value of `--var NAME=TEXT`: TEXT exactly, never re-read as YAML. Where the runbook's (or the
    inventory's) value is a number or a boolean, TEXT must be one too, in the one form that reaches the
    steps as TEXT itself (`8000`, `2.5`, `true`), and is typed like it: a gate compares `vars.port > 8000`
    as a number whether the port came from the file or the command line, and the script's environment,
    the gate and the resume fingerprint all see TEXT. Anything else raises ValueError saying why."""
    problem = env_text_problem(text)
    if problem:
        raise ValueError(f"{name}: the value {problem}")
    if isinstance(declared, bool):
        if text not in ("true", "false"):
            raise ValueError(f"{name}={text}: {name} is a boolean in the runbook; give true or false")
        return text == "true"
    if isinstance(declared, int | float):
        number = _plain_number(text)
        if number is None:
            raise ValueError(
                f"{name}={text}: {name} is a number in the runbook ({var_text(declared)}); give one as the "
                "steps get it back: digits, an optional leading '-' and '.' (8000, -3, 2.5: no leading or trailing "
                "zeros, '+', '_' or exponent); quote the runbook's value to make it text"
            )
        return number
    return text


def _plain_number(text: str) -> int | float | None:
    """`text` as an int or a float where that is written back as `text` itself, else None."""
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    try:
        number = float(text) if "." in text else int(text)
    except ValueError:  # more digits than int() reads (4300)
        return None
    return number if var_text(number) == text else None


#: A step's hosts: a list of host names, `all`, or the name of a pool.
HostsSelector = list[str] | str
