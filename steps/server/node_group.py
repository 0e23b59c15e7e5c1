"""A node group: one SGLang server across several hosts (`deploy` and `stop_server` with `nodes:`), the
topology `NodeGroup`.

SGLang is the distributed engine: every node runs the same launch with `--nnodes N --node-rank r
--dist-init-addr ADDR:PORT` and the interface variables, rank 0 serves HTTP once every rank joined
(../shared/reference/sglang-dflash.md, "Several nodes"). What `runbook` adds is the care around it, since
this is where deployments fail quietly (a hang at "Init nccl begin", a node still loading weights):

1. preflight from facts, no command: every node's probe gives the same SGLang version, GPU model and GPU
   count (tp_size auto is their sum); every `verified` step passed on every node with the same commit;
2. preflight on the nodes (hostprograms/node_preflight.py), in parallel: each node's interface toward rank
   0 and its source address (`inspect`); rank 0's dist-init port free there and reachable from every other
   node (`listen` on rank 0 while the others `connect`);
3. every rank launched at once (hostprograms/deploy.py `launch`); a group running with the same arguments
   on every node is adopted, never a part of one: if only some ranks were adopted, all are stopped and
   launched again;
4. the readiness barrier: every `watch_interval`, every rank is watched (`watch`); ready once rank 0's
   /health is 200 and a real generation answered; a dead rank or an error line on any rank fails at once
   with that node's line, a rank whose log is silent for `stall_timeout` is named, `ready_timeout` bounds
   the whole; on any failure every rank is stopped (GPUs freed) before the step fails.

A failure names the node and the check. Facts are rank 0's deploy facts (eval_acceptance and benchmark
talk to its port as to any server) plus `group`: the nodes, GPU model and GPUs per node, tp size, dist-init
address and each rank's interface, source address, pid, log file and whether it was adopted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel

from executor.errors import AttemptFailed
from executor.hostprogram import host_program
from executor.runbook.durations import format_duration
from executor.runbook.model import DataModel
from executor.stepkind import (
    VAR_REF,
    FactsError,
    Outcome,
    RenderContext,
    RunTime,
    StepContext,
    host_document,
    resolve_var,
)
from steps.server.base import (
    GROUP_ENV,
    INTERFACE_NAME,
    Deployment,
    Launch,
    Server,
    command_line,
    deploy_facts,
    literal,
)
from steps.server.documents import Choice, DeployFacts, HttpAnswer, StartReport, StopFacts

if TYPE_CHECKING:
    from executor.transport.base import CommandResult

#: How long the barrier waits, once a look finds a rank failed, before the look that names the cause.
FAILURE_SETTLE_S = 2.0
#: How long rank 0 listens for the other nodes, and they try to reach it, in the preflight.
REACH_TIMEOUT_S = 20.0
#: How long one look at a rank (`watch`) may take: it reads a log tail and asks /health once.
WATCH_COMMAND_S = 60.0
#: What NCCL and torch print on a rank whose PEER went away (ncclRemoteError, a socket closed by the remote
#: peer): a consequence of another rank's failure, never its cause (sglang issues #3460, #3784).
REMOTE = ("ncclRemoteError", "remote process exit", "Connection closed by remote peer")


class InspectReport(DataModel):
    """hostprograms/node_preflight.py `inspect`: how a node reaches rank 0."""

    action: Literal["inspect"]
    source_address: str | None  # the local IPv4 a packet to rank 0 leaves from
    interface: str | None  # the named one, else the interface holding source_address
    interface_exists: bool
    interfaces: list[str]
    peer_resolved: str | None  # rank 0's address as this node resolves it
    failure: str | None


class ListenReport(DataModel):
    """hostprograms/node_preflight.py `listen` on rank 0: which nodes reached its dist-init port."""

    action: Literal["listen"]
    port: int
    port_free: bool
    joined: list[str]
    missing: list[str]
    failure: str | None


class ConnectReport(DataModel):
    """hostprograms/node_preflight.py `connect` on a node other than rank 0."""

    action: Literal["connect"]
    address: str
    port: int
    reachable: bool
    error: str | None
    seconds: float | None = None


class WatchReport(DataModel):
    """hostprograms/deploy.py `watch`: one look at a rank's process and log (and rank 0's HTTP)."""

    action: Literal["watch"]
    port: int
    pid: int | None = None
    alive: bool
    exit_code: int | None = None
    log_file: str | None = None
    error_line: str | None = None
    last_line: str | None = None
    idle_s: float | None = None  # since its log last grew
    log_tail: list[str] = []
    health: HttpAnswer | None = None
    generate: HttpAnswer | None = None
    server_version: str | None = None  # what /server_info said, on the look that found rank 0 serving
    server_version_unknown: str | None = None
    failure: str | None = None


class NodeFacts(DataModel):
    """One rank of the group as it was launched."""

    rank: int
    host: str
    interface: str
    source_address: str
    pid: int | None
    log_file: str | None
    reused: bool  # adopted: it ran already with the same arguments


class GroupFacts(DataModel):
    nodes: list[str]  # rank order
    gpus_per_node: int
    gpu_model: str  # every node's (the preflight checked them the same); names joined with ", " on a mixed node
    tp_size: int
    dist_init_addr: str  # ADDR:PORT, as every rank got it
    per_node: dict[str, NodeFacts]


class GroupDeployFacts(DeployFacts):
    """Rank 0's deploy facts (its port serves the group) and the group."""

    group: GroupFacts


class GroupFailed(Exception):
    """A check or a rank failed: the message names the node and what went wrong."""


# ---- what each rank runs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Wiring:
    """How one node's rank joins the group, each value with where it came from (a RunTime in `plan`)."""

    dist_init: Choice | RunTime  # ADDR:PORT, the same for every rank
    interface: Choice | RunTime
    source_address: Choice | RunTime


def _value(choice: Choice | RunTime) -> Any:
    return choice if isinstance(choice, RunTime) else choice.value


def dist_port(step: Deployment, ctx: RenderContext) -> int:
    return resolve_var(ctx, step.dist_init_port, "dist_init_port", int)


def dist_target(step: Deployment, ctx: RenderContext) -> str:
    """Rank 0 as the runbook names it for the other nodes: its `address` (auto), or `dist_init_addr`."""
    return ctx.host_address if step.dist_init_addr == "auto" else step.dist_init_addr


def _interface_name(text: str) -> str:
    if text != "auto" and not INTERFACE_NAME.match(text):
        raise ValueError(f"expected `auto` or an interface name such as eth0, got {text!r}")
    return text


def interface_given(step: Deployment, node: RenderContext) -> Choice | None:
    """The interface the runbook names for `node` (a name, or a var of its host's), None for auto (the
    runbook's, or a var's value `auto`)."""
    if step.network_interface == "auto":
        return None
    if not VAR_REF.match(step.network_interface):
        return Choice(value=step.network_interface, source="runbook")
    name = resolve_var(node, step.network_interface, "network_interface", _interface_name)
    if name == "auto":  # a site's var may leave the choice to the preflight, as the runbook's `auto` does
        return None
    return Choice(value=name, source=f"runbook var {step.network_interface} on {node.host_name} = {name}")


def inspect_script(step: Deployment, target: str, interface: Choice | None) -> str:
    config = {"action": "inspect", "peer": target, "interface": None if interface is None else interface.value}
    return f"# how this node reaches {target}: interface, source address\n" + host_program(
        "node_preflight", config, step.python
    )


def connect_script(step: Deployment, node: str, address: str, port: int) -> str:
    config = {"action": "connect", "address": address, "port": port, "name": node, "timeout": REACH_TIMEOUT_S}
    return f"# reach rank 0's dist-init port {address}:{port} from here\n" + host_program(
        "node_preflight", config, step.python
    )


def watch_script(step: Deployment, ctx: RenderContext, probe_http: bool) -> str:
    config = {"action": "watch", "port": step.port_number(ctx), "bind": step.bind, "probe_http": probe_http}
    return "# one look at this rank: its process, its log and (rank 0) /health and /generate\n" + step.deploy_program(
        config, []
    )


def stop_script(step: Server, ctx: RenderContext) -> str:
    port = step.port_number(ctx)
    config = {"action": "stop", "port": port, "stop_timeout": step.stop_timeout}
    return f"# stop this node's rank of the server on port {port}\n" + step.deploy_program(config, [])


# ---- running -----------------------------------------------------------------------------------------

DocumentT = TypeVar("DocumentT", bound=BaseModel)
ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


async def each(items: Sequence[ItemT], work: Callable[[ItemT], Awaitable[ResultT]]) -> list[ResultT]:
    """`work` on every item at once (a node group's nodes), the results in the items' order."""
    import asyncio  # here: validate imports every kind and no asyncio (tests/executor/test_startup.py)

    return list(await asyncio.gather(*(work(item) for item in items)))


async def ask(
    node: StepContext, script: str, model: type[DocumentT], what: str, timeout: float
) -> tuple[CommandResult, DocumentT]:
    """Run a host program on `node`: its result and document, or GroupFailed naming the node (a transport
    error too: a node that stopped answering is named like any other failure)."""
    try:
        result = await node.run(script, timeout=timeout)
    except AttemptFailed as exc:
        raise GroupFailed(f"node {node.host_name}: {exc}") from None
    if result.timed_out:
        raise GroupFailed(f"node {node.host_name}: {what} did not answer within {format_duration(timeout)}")
    try:
        return result, host_document(result, model, what)
    except FactsError as exc:
        raise GroupFailed(f"node {node.host_name}: {exc}") from None


def check_facts(step: Deployment, views: list[StepContext]) -> tuple[str, int]:
    """Preflight from facts (no command): the nodes' probes agree, the weights are verified on every node with
    the same commits. The GPU model and the GPUs per node, or GroupFailed naming the node and the check."""
    assert step.probe is not None
    probe, rank0 = step.probe, views[0].host_name

    def fact(view: StepContext, step_id: str, path: str) -> Any:
        try:
            return view.fact(step_id, path)
        except (KeyError, IndexError, TypeError):
            raise GroupFailed(
                f"node {view.host_name}: step '{step_id}' did not pass on it (a node group needs it on every node: "
                f"`hosts: [{', '.join(v.host_name for v in views)}]`)"
            ) from None

    def models(view: StepContext) -> list[Any]:
        return sorted({g.get("name") for g in fact(view, probe, "gpu.gpus")})

    checks: list[tuple[str, Callable[[StepContext], Any], str]] = [
        ("SGLang version", lambda v: fact(v, probe, "sglang.version"), "sglang.version"),
        ("GPU model", models, "gpu.gpus[].name"),
        ("GPU count", lambda v: fact(v, probe, "gpu_count"), "gpu_count"),
    ]
    for what, read, path in checks:
        first = read(views[0])
        for view in views[1:]:
            if (value := read(view)) != first:
                raise GroupFailed(
                    f"node {view.host_name}: {what} {_shown(value)} differs from rank 0 {rank0}'s {_shown(first)} "
                    f"(steps.{probe}.facts.{path})"
                )
    count = int(fact(views[0], probe, "gpu_count"))
    if count < 1:
        raise GroupFailed(f"node {rank0}: the probe found no GPUs ({fact(views[0], probe, 'gpu.reason')})")
    for verify in step.verified:
        first = fact(views[0], verify, "commit")
        for view in views:
            commit = fact(view, verify, "commit")
            if commit is None or commit != first:
                raise GroupFailed(
                    f"node {view.host_name}: step '{verify}' verified commit {commit} there, "
                    f"{first} on rank 0 {rank0}: the nodes would load different weights"
                )
    return _shown(models(views[0])), count


def _shown(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


async def stop_all(step: Server, views: Sequence[StepContext]) -> list[StopFacts | str]:
    """Stop every rank at once (the stop program: process group TERM, wait, KILL; GPUs freed): each node's
    document, or why there is none (a node that did not answer is no reason not to stop the others)."""
    return [answer if isinstance(answer, str) else answer[1] for answer in await stopping(step, views)]


async def stopping(step: Server, views: Sequence[StepContext]) -> list[tuple[CommandResult, StopFacts] | str]:
    """`stop_all` with each command's result."""
    limit = step.timeout or 2 * step.stop_timeout + 60  # the TERM wait, the KILL wait, the program's start-up

    async def stop(view: StepContext) -> tuple[CommandResult, StopFacts] | str:
        try:
            return await ask(view, stop_script(step, view), StopFacts, "the deploy program (stop)", limit)
        except GroupFailed as exc:
            return str(exc)

    return await each(views, stop)


class GroupStopFacts(StopFacts):
    """Rank 0's stop, and every node's (gpu_freed per node); `failure` names the first node that did not stop."""

    per_node: dict[str, StopFacts]


def stopped_text(views: Sequence[StepContext], stops: list[StopFacts | str]) -> str:
    """What stopping every rank did, in a clause: that the GPUs are free, or where they may not be."""
    wrong = [
        f"{stop} (its rank may still run and hold its GPUs)"
        if isinstance(stop, str)
        else f"node {view.host_name}: {stop.failure or 'GPUs not freed'}"
        for view, stop in zip(views, stops, strict=True)
        if isinstance(stop, str) or stop.failure is not None or stop.gpu_freed is False
    ]
    return "; ".join(wrong) if wrong else f"every rank stopped, GPUs freed on {', '.join(v.host_name for v in views)}"


async def barrier(
    step: Deployment, ctx: StepContext, views: list[StepContext]
) -> tuple[WatchReport, CommandResult, float]:
    """Wait until rank 0 serves (its /health 200, a generation answered), watching every rank: rank 0's last
    look, its command's result and the seconds waited; GroupFailed at the first dead, erring or silent rank."""
    import asyncio

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    deadline = t0 + step.ready_limit(ctx)
    results: dict[str, CommandResult] = {}

    async def look(rank: int) -> WatchReport:
        view = views[rank]
        script = watch_script(step, view, rank == 0)
        results[view.host_name], report = await ask(
            view, script, WatchReport, "the deploy program (watch)", WATCH_COMMAND_S
        )
        return report

    while True:
        seen = await each(range(len(views)), look)
        if _failed(views, seen):
            # One look asks every node at once, but each answers from its own moment: a rank looked at just
            # before it died seems alive while a peer, looked at just after, already shows NCCL's line for it
            # gone. Look again once the others' deaths have followed, so that the cause is named first.
            await asyncio.sleep(FAILURE_SETTLE_S)
            try:
                again = await each(range(len(views)), look)
            except GroupFailed:  # a node that stopped answering meanwhile: the first look's failure stands
                again = seen
            raise GroupFailed(_failed(views, [b if _failing(b) else a for a, b in zip(seen, again, strict=True)]))
        rank0 = seen[0]
        if _answered(rank0.health) and _answered(rank0.generate):
            return rank0, results[views[0].host_name], loop.time() - t0
        if stalled := _stalled(step, views, seen):
            raise GroupFailed(stalled)
        if loop.time() >= deadline:
            lines = "; ".join(f"{v.host_name}: {w.last_line!r}" for v, w in zip(views, seen, strict=True))
            raise GroupFailed(
                f"the group was not ready after {format_duration(step.ready_limit(ctx))}: rank 0's /health answered "
                f"{_said(rank0.health)}, /generate {_said(rank0.generate)}; last lines: {lines}"
            )
        ctx.progress(
            "waiting for the group: "
            + ", ".join(f"{v.host_name} {w.last_line or '(no output yet)'}" for v, w in zip(views, seen, strict=True)),
            phase="barrier",
        )
        await asyncio.sleep(min(step.watch_interval, max(deadline - loop.time(), 0)))


def _failed(views: list[StepContext], seen: list[WatchReport]) -> str | None:
    """Why the group failed, or None: a rank that exited or logged an error line. The cause is named first: one
    rank's death brings the others down within moments, each with NCCL's line for a peer gone (`REMOTE`), so a
    rank whose line is not one of those comes first, then the longest silent (its log stopped growing first)."""
    failing = [(view, watch) for view, watch in zip(views, seen, strict=True) if _failing(watch)]
    if not failing:
        return None

    def consequence(watch: WatchReport) -> bool:
        line = watch.error_line or watch.last_line or ""
        return any(sign in line for sign in REMOTE)

    failing.sort(key=lambda pair: (consequence(pair[1]), -(pair[1].idle_s or 0.0)))
    said = []
    for view, watch in failing:
        line = watch.error_line or watch.last_line or watch.failure or "its log is empty"
        code = "" if watch.alive or watch.exit_code is None else f" (exit code {watch.exit_code})"
        how = "" if watch.alive else f"its rank exited{code}: "
        said.append(f"node {view.host_name}: {how}{line} (log: {watch.log_file})")
    return said[0] + "".join(f"; then {text}" for text in said[1:])


def _failing(watch: WatchReport) -> bool:
    return not watch.alive or bool(watch.error_line)


def _stalled(step: Deployment, views: list[StepContext], seen: list[WatchReport]) -> str | None:
    """Why the group stalls, or None: a rank silent past `stall_timeout`. Every rank silent for at least half of
    it is named too, since ranks wait on one another (rank 0 at "Init nccl begin." waits for a rank hung there,
    and printed that line just before it): the one silent longest is not always the one at fault."""
    idle = [watch.idle_s or 0.0 for watch in seen]
    if max(idle) <= step.stall_timeout:
        return None
    named = [
        f"node {view.host_name} has printed nothing since {watch.last_line!r} for {format_duration(silent)} "
        f"(log: {watch.log_file})"
        for view, watch, silent in zip(views, seen, idle, strict=True)
        if silent > step.stall_timeout / 2
    ]
    return "; ".join(named) + f" (stall_timeout {format_duration(step.stall_timeout)})"


def _answered(answer: HttpAnswer | None) -> bool:
    return answer is not None and answer.status == 200


def _said(answer: HttpAnswer | None) -> str:
    if answer is None:
        return "nothing yet"
    return f"{answer.status} {answer.body[:120]!r}" if answer.status is not None else answer.body[:200]


# ---- the topology ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeGroup:
    """The topology of a server across `nodes` (rank order, at least two): rank 0 on nodes[0], where the step
    runs, serves HTTP; every rank is launched, watched and stopped on its node."""

    nodes: list[str]

    @property
    def managed_env(self) -> tuple[str, ...]:
        """The environment each rank's launch sets from `network_interface`: `env` may not set it."""
        return GROUP_ENV

    @property
    def tp_size_note(self) -> str:
        return f" (summed over {', '.join(self.nodes)})"

    def tp_size(self, ctx: RenderContext, probe: str, fact: Callable[[RenderContext, str], Any]) -> Choice:
        """tp_size auto: every node's GPUs (the preflight checks that each has as many)."""
        counts = [fact(ctx.peer(node), "gpu_count") for node in self.nodes]
        added = " + ".join(map(str, counts))
        return Choice(value=sum(counts), source=f"steps.{probe}.facts.gpu_count on {', '.join(self.nodes)} = {added}")

    # ---- what each rank runs -------------------------------------------------------------------------

    def planned_wiring(self, step: Deployment, ctx: RenderContext) -> list[Wiring]:
        """The wiring as `runbook plan` shows it: what the preflight on the nodes decides is marked."""
        port, rank0, target = dist_port(step, ctx), self.nodes[0], dist_target(step, ctx)
        if step.dist_init_addr == "auto":
            address: Choice | RunTime = RunTime(
                f"node_preflight inspect: {rank0}'s address {target} as {self.nodes[1]} resolves it, port {port}",
                what=f"the address of {rank0} as the other nodes reach it, port {port}",
            )
        else:
            address = Choice(value=f"{target}:{port}", source="runbook")
        wiring = []
        for node in self.nodes:
            given = interface_given(step, ctx.peer(node))
            interface = given or RunTime(f"node_preflight inspect on {node}: the interface routing to {target}")
            source = RunTime(f"node_preflight inspect on {node}: the source address toward {target}")
            wiring.append(Wiring(address, interface, source))
        return wiring

    def node_launch(self, step: Deployment, base: Launch, rank: int, wiring: Wiring) -> tuple[Launch, dict[str, str]]:
        """Rank `rank`'s launch (the group's flags after the one-node launch) and its environment."""
        count, seconds = len(self.nodes), round(step.dist_timeout)
        given = "dist_timeout" in step.model_fields_set
        choices: dict[str, Choice | RunTime] = {
            **base.choices,
            "nnodes": Choice(value=count, source=f"nodes: {', '.join(self.nodes)}"),
            "node_rank": Choice(value=rank, source=f"{self.nodes[rank]}'s position in nodes"),
            "dist_init_addr": wiring.dist_init,
            "dist_timeout": Choice(
                value=seconds,
                source="runbook" if given else "default 1h: nodes finish loading weights at different times",
            ),
            "network_interface": wiring.interface,
            "host_ip": wiring.source_address,
        }
        groups = [
            *base.groups,
            [literal("--nnodes"), literal(count)],
            [literal("--node-rank"), literal(rank)],
            [literal("--dist-init-addr"), literal(_value(wiring.dist_init))],
            [literal("--dist-timeout"), literal(seconds)],
        ]
        interface, source = str(_value(wiring.interface)), str(_value(wiring.source_address))
        env = {**step.env, **dict(zip(GROUP_ENV, (interface, interface, source), strict=True))}
        return Launch(groups, choices), env

    def launch_script(
        self, step: Deployment, ctx: RenderContext, rank: int, launch: Launch, env: dict[str, str]
    ) -> str:
        port = step.port_number(ctx)
        # no ready_timeout: launch does not wait (the barrier does, across the ranks)
        config = {"action": "launch", "port": port, "bind": step.bind, "env": env, "serves_http": rank == 0}
        config["stop_timeout"] = step.stop_timeout
        said = f"serves {step.bind}:{port} once every rank joined" if rank == 0 else "serves no HTTP"
        return (
            f"# launch rank {rank} of {len(self.nodes)} on {self.nodes[rank]} ({said}), or adopt it running with "
            "the same arguments; not waited for\n" + launch.comment() + step.deploy_program(config, launch.words())
        )

    def listen_script(self, step: Deployment, port: int) -> str:
        config = {"action": "listen", "port": port, "expect": self.nodes[1:], "timeout": REACH_TIMEOUT_S}
        return f"# is the dist-init port {port} free here, and does every other node reach it?\n" + host_program(
            "node_preflight", config, step.python
        )

    def start_plan(self, step: Deployment, ctx: RenderContext) -> list[tuple[str, str]]:
        """Every command of the group, per node: the preflight, each rank's launch (with each choice's source),
        the watch of the readiness barrier."""
        port, rank0, target = dist_port(step, ctx), self.nodes[0], dist_target(step, ctx)
        wiring = self.planned_wiring(step, ctx)
        base = step.launch(ctx)
        preflight, launches, watches = [], [], []
        for rank, node in enumerate(self.nodes):
            view = ctx.peer(node)
            script = inspect_script(step, target, interface_given(step, view))
            preflight.append((f"preflight on {node}: its interface and source address toward {target}", script))
            if rank > 0:
                preflight.append(
                    (f"preflight on {node}: reach {rank0}'s port {port}", connect_script(step, node, target, port))
                )
            launch, env = self.node_launch(step, base, rank, wiring[rank])
            label = f"rank {rank} on {node}: launch; '{RunTime('...')}' marks values chosen from earlier steps' facts"
            launches.append((label, self.launch_script(step, view, rank, launch, env)))
            every = format_duration(step.watch_interval)
            watch = watch_script(step, view, rank == 0)
            watches.append((f"every {every} until ready: watch rank {rank} on {node}", watch))
        listen = (f"preflight on {rank0}: dist-init port {port} free and reached", self.listen_script(step, port))
        return [*preflight, listen, *launches, *watches]

    def start_summary(self, step: Deployment, ctx: RenderContext, drafter: str) -> str:
        ranks = ", ".join(f"rank {rank} on {node}" for rank, node in enumerate(self.nodes))
        return (
            f"preflight every node (same SGLang, GPUs, verified weights; interfaces; dist-init port), then start "
            f"(or adopt, same arguments on every node) SGLang across {len(self.nodes)} nodes ({drafter}), rank 0 "
            f"serving {step.bind}:{step.port_number(ctx)}, ready within {format_duration(step.ready_limit(ctx))}; "
            f"the launches of {ranks}:"
        )

    def commands(self, step: Deployment, ctx: RenderContext) -> list[str]:
        """Each rank's launch as one would paste it on its node, rank 0 first."""
        base, wiring = step.launch(ctx), self.planned_wiring(step, ctx)
        lines = []
        for rank, node in enumerate(self.nodes):
            launch, env = self.node_launch(step, base, rank, wiring[rank])
            lines.append(command_line(launch, env, ctx.peer(node).vars))
        return lines

    # ---- starting ------------------------------------------------------------------------------------

    async def check_nodes(
        self, step: Deployment, ctx: StepContext, views: list[StepContext]
    ) -> tuple[list[Wiring], str]:
        """Preflight on the nodes: each one's interface and source address toward rank 0, then rank 0's dist-init
        port free and reached from every other node (not checked while the group's rank 0 runs on it: a group
        running already holds it; the launch adopts or replaces it). The wiring and a note on the port."""
        import asyncio

        port, rank0, target = dist_port(step, ctx), views[0].host_name, dist_target(step, ctx)
        given = [interface_given(step, view) for view in views]

        async def inspect(index: int) -> InspectReport:
            script = inspect_script(step, target, given[index])
            return (await ask(views[index], script, InspectReport, "node_preflight (inspect)", WATCH_COMMAND_S))[1]

        watching = ask(
            views[0], watch_script(step, ctx, False), WatchReport, "the deploy program (watch)", WATCH_COMMAND_S
        )
        found, (_, running) = await asyncio.gather(each(range(len(views)), inspect), watching)
        for view, report, named in zip(views, found, given, strict=True):
            node = view.host_name
            if named is not None and not report.interface_exists:
                have = ", ".join(report.interfaces) or "none"
                raise GroupFailed(
                    f"node {node}: network interface '{named.value}' does not exist there (it has: {have})"
                )
            if report.failure is not None or report.source_address is None or report.interface is None:
                raise GroupFailed(f"node {node}: cannot tell how it reaches {target}: {report.failure or 'no route'}")
        resolved = {view.host_name: report.peer_resolved for view, report in zip(views[1:], found[1:], strict=True)}
        if len(set(resolved.values())) != 1 or None in resolved.values():
            said = ", ".join(f"{node}: {address}" for node, address in resolved.items())
            raise GroupFailed(f"the nodes resolve rank 0 {rank0}'s address {target} differently ({said})")
        address = resolved[views[1].host_name] if step.dist_init_addr == "auto" else step.dist_init_addr
        assert address is not None
        if running.alive:
            note = f"held by the group's rank 0 running on {rank0} (pid {running.pid}): not checked again"
        else:
            await self.check_port(step, views, address, port)
            note = f"free on {rank0} and reached from {', '.join(v.host_name for v in views[1:])}"
        if step.dist_init_addr == "auto":
            source = f"{rank0}'s address {target} as {', '.join(resolved)} resolve it (node_preflight inspect)"
        else:
            source = "runbook"
        dist = Choice(value=f"{address}:{port}", source=source)
        wiring = [
            Wiring(
                dist,
                named
                or Choice(
                    value=report.interface, source=f"node_preflight inspect on {view.host_name}: routes to {target}"
                ),
                Choice(
                    value=report.source_address,
                    source=f"node_preflight inspect on {view.host_name}: source toward {target}",
                ),
            )
            for view, report, named in zip(views, found, given, strict=True)
        ]
        return wiring, note

    async def check_port(self, step: Deployment, views: list[StepContext], address: str, port: int) -> None:
        """Rank 0 listens on its dist-init port, on every address as torch's TCPStore does, while every other
        node connects to it at `address`. Not on `address` as rank 0 resolves it: where /etc/hosts maps a host's
        own name to 127.0.1.1 (Debian's default), that would refuse the others although SGLang would work."""
        import asyncio

        rank0 = views[0].host_name
        limit = REACH_TIMEOUT_S + 30  # the program's own wait, and its start-up

        async def connect(view: StepContext) -> ConnectReport:
            script = connect_script(step, view.host_name, address, port)
            return (await ask(view, script, ConnectReport, "node_preflight (connect)", limit))[1]

        listening = ask(views[0], self.listen_script(step, port), ListenReport, "node_preflight (listen)", limit)
        (_, heard), reached = await asyncio.gather(listening, each(views[1:], connect))
        if not heard.port_free:
            raise GroupFailed(
                f"node {rank0}: its dist-init port {address}:{port} is taken: {heard.failure or 'in use'}"
            )
        for view, report in zip(views[1:], reached, strict=True):
            if not report.reachable:
                tried = "" if report.seconds is None else f"for {report.seconds:g}s "
                raise GroupFailed(
                    f"node {view.host_name} cannot reach {rank0}'s dist-init port {address}:{port}: {report.error} "
                    f"({tried}while {rank0} listened on it: a firewall between them, or {address} is not {rank0}'s "
                    "address on the network the nodes share; `dist_init_addr` names another)"
                )
            if view.host_name in heard.missing:
                raise GroupFailed(
                    f"node {view.host_name} reached {address}:{port}, but {rank0} did not hear it there "
                    f"(is {address} another machine's address?)"
                )
        if heard.failure is not None:
            raise GroupFailed(f"node {rank0}: {heard.failure}")

    async def launch_all(
        self, step: Deployment, views: list[StepContext], launches: list[tuple[Launch, dict[str, str]]]
    ) -> list[StartReport]:
        async def launch(rank: int) -> StartReport:
            script = self.launch_script(step, views[rank], rank, *launches[rank])
            limit = step.timeout or 2 * step.stop_timeout + 60  # it may stop a server of other arguments first
            _, report = await ask(views[rank], script, StartReport, "the deploy program (launch)", limit)
            if report.failure is not None:
                raise GroupFailed(f"node {views[rank].host_name}: {report.failure}")
            return report

        return await each(range(len(views)), launch)

    async def launch_whole(
        self,
        step: Deployment,
        ctx: StepContext,
        views: list[StepContext],
        launches: list[tuple[Launch, dict[str, str]]],
    ) -> list[StartReport]:
        """Every rank launched at once: a group running with these arguments on every node is adopted, one
        running only in part is stopped and launched again whole."""
        reports = await self.launch_all(step, views, launches)
        if all(r.reused for r in reports) or not any(r.reused for r in reports):
            return reports
        kept = ", ".join(v.host_name for v, r in zip(views, reports, strict=True) if r.reused)
        ctx.progress(
            f"only part of the group ran with these arguments ({kept}): stopping all, launching all",
            phase="relaunch",
        )
        stopped = await stop_all(step, views)
        if any(isinstance(s, str) or s.failure is not None for s in stopped):
            raise GroupFailed(f"cannot relaunch the whole group: {stopped_text(views, stopped)}")
        reports = await self.launch_all(step, views, launches)
        if any(r.reused for r in reports):
            raise GroupFailed("a rank stopped to relaunch the whole group was adopted again")
        return reports

    async def start(self, step: Deployment, ctx: StepContext) -> Outcome:
        """The group's attempt (see the module's docstring); GroupFailed becomes the attempt's FactsError, after
        every rank launched has been stopped."""
        views = [ctx.peer(node) for node in self.nodes]
        try:
            gpu_model, per_node = check_facts(step, views)
            ctx.progress("preflight on the nodes: interfaces, dist-init port", phase="preflight")
            wiring, port_note = await self.check_nodes(step, ctx, views)
        except GroupFailed as exc:
            raise FactsError(f"preflight: {exc}") from None
        base = step.launch(ctx)
        launches = [self.node_launch(step, base, rank, wiring[rank]) for rank in range(len(views))]
        try:
            ctx.progress(f"launching {len(views)} ranks", phase="launch")
            reports = await self.launch_whole(step, ctx, views, launches)
            rank0, result, waited = await barrier(step, ctx, views)
        except GroupFailed as exc:
            stops = await stop_all(step, views)
            raise FactsError(f"{exc}; {stopped_text(views, stops)}") from None
        group = GroupFacts(
            nodes=list(self.nodes),
            gpus_per_node=per_node,
            gpu_model=gpu_model,
            tp_size=int(_value(launches[0][0].choices["tp_size"])),
            dist_init_addr=str(_value(wiring[0].dist_init)),
            per_node={
                view.host_name: NodeFacts(
                    rank=rank,
                    host=view.host_name,
                    interface=str(_value(wiring[rank].interface)),
                    source_address=str(_value(wiring[rank].source_address)),
                    pid=report.pid,
                    log_file=report.log_file,
                    reused=report.reused,
                )
                for rank, (view, report) in enumerate(zip(views, reports, strict=True))
            },
        )
        first = reports[0]
        ctx.progress(
            f"the group serves after {waited:.1f}s: {first.base_url} (dist-init port {port_note})", phase="ready"
        )
        served: dict[str, Any] = {"ready": True, "ready_s": round(waited, 3), "health": rank0.health}
        served |= {"generate": rank0.generate, "server_version": rank0.server_version}
        served |= {"server_version_unknown": rank0.server_version_unknown, "reused": all(r.reused for r in reports)}
        facts = deploy_facts(GroupDeployFacts, dict(first) | served, step, *launches[0], group=group)
        return Outcome(result, facts)

    # ---- stopping ------------------------------------------------------------------------------------

    def stop_plan(self, step: Server, ctx: RenderContext) -> list[tuple[str, str]]:
        return [
            (f"stop rank {rank} on {node}", stop_script(step, ctx.peer(node))) for rank, node in enumerate(self.nodes)
        ]

    async def stop(self, step: Server, ctx: StepContext) -> Outcome:
        """`stop_server` across the group: every rank stopped at once; a node that did not answer fails the step."""
        views = [ctx.peer(node) for node in self.nodes]
        answers = await stopping(step, views)
        missing = next((answer for answer in answers if isinstance(answer, str)), None)
        if missing is not None:
            raise FactsError(missing)
        done = [answer for answer in answers if not isinstance(answer, str)]
        per_node = {view.host_name: facts for view, (_, facts) in zip(views, done, strict=True)}
        failed = next((f"node {node}: {facts.failure}" for node, facts in per_node.items() if facts.failure), None)
        result, first = done[0]
        return Outcome(result, GroupStopFacts(**(dict(first) | {"failure": failed}), per_node=per_node))
