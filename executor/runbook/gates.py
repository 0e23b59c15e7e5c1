"""Gate expressions: Jinja2 expressions in a sandbox (what Ansible users write in `that:`).

Never `eval`. A name that is missing fails the gate with a message naming it, and a failed
gate explains itself with the values of the names it used.

A gate sees what the host printed, so a gate can be made to run forever (a regex that backtracks
catastrophically over 48 bytes, `10 ** 10 ** 8`) or to fill memory (`'a' * 10**10`). No sandbox
rule can refuse every such expression, and neither Python's `re` nor a big power ever lets a signal
in, so the run evaluates gates in worker processes (`GateWorkers`): this file run as a program,
its address space limited to `GATE_MEMORY_BYTES` (a bigger allocation fails as MemoryError there)
and killed when a gate takes longer than `GATE_TIME_S`. The run's event loop only waits on a pipe,
so its timeouts and signals keep working while a gate runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import re
import struct
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.environment import TemplateExpression
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

if __name__ != "__main__":  # the controller's side; the worker (this file as a program) imports no package
    from executor.errors import GateWorkerUnavailable
if TYPE_CHECKING:
    import asyncio

    from executor.diagnostics import Log

#: Wall-clock bound of one gate in a worker (CPU time is at most that); past it the worker is killed.
GATE_TIME_S = 5.0
#: Bound of a worker's start and of handing it an attempt's names (linear work, up to 2 x 64 MiB of output).
LOAD_TIME_S = 30.0
#: Address space of a gate worker: an allocation past it fails as MemoryError inside the worker.
GATE_MEMORY_BYTES = 1024 * 1024 * 1024
_FRAME = struct.Struct(">I")

_ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined)
#: Longest detail of a failed gate: a key or value that the host printed must not carry its whole output.
DETAIL_MAX = 4000
_STEP_REF = re.compile(r"""\bsteps\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*['"]([^'"]+)['"]\s*\])""")
# the two regex tests Ansible users write in `that:` (`stdout is search('H200')`)
_ENV.tests["search"] = lambda value, pattern: re.search(pattern, str(value)) is not None
_ENV.tests["match"] = lambda value, pattern: re.match(pattern, str(value)) is not None


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    expression: str
    message: str | None
    detail: str  # why it failed: the values of the names it used, or the missing name
    #: it could not be evaluated (a missing name, an error, a sandbox refusal, a worker gone or too slow):
    #: a failed gate all the same, but no `false` for `when:`, which must not skip a step on an error
    undecided: bool = False

    def describe(self) -> str:
        head = self.message or "gate failed"
        return f"{head}\n  gate: {self.expression}\n{self.detail}".rstrip()


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str) -> TemplateExpression:
    """Compile once per distinct expression: a runbook evaluates the same gates on every host and attempt."""
    return _ENV.compile_expression(expression, undefined_to_none=False)


class _TextMemo:
    """Results by expression text, kept for at most `limit` characters of texts (then all forgotten at once).
    Every instance of a matrix step, and each fallback, repeats its step's gates: a 200 kB gate parsed per
    instance took 0.3 s each (`validate` of 100 cells: 33 s). A runbook holds at most 4 MiB of text, so one
    load never outgrows the memo, and a long-lived MCP server keeps no more than `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chars = 0
        self.known: dict[str, Any] = {}

    def get(self, text: str, compute: Callable[[str], Any]) -> Any:
        if text in self.known:
            return self.known[text]
        if self.chars + len(text) > self.limit:
            self.known.clear()
            self.chars = 0
        value = self.known[text] = compute(text)
        self.chars += len(text)
        return value


#: Characters of the texts whose syntax check and step references are remembered (twice a runbook's 4 MiB).
MEMO_CHARS = 8 << 20
_syntax_memo = _TextMemo(MEMO_CHARS)
_refs_memo = _TextMemo(MEMO_CHARS)


def step_refs(text: str) -> list[str]:
    """Ids of the steps whose facts a text refers to (`steps.probe...`, `steps['dl-1']...`)."""
    return list(_refs_memo.get(text, _step_refs))


def _step_refs(text: str) -> tuple[str, ...]:
    return tuple(m.group(1) or m.group(2) for m in _STEP_REF.finditer(text))


def parse(expression: str) -> nodes.Expr:
    """The expression's tree, parsed as `compile_expression` parses it (`1) or (1` is an error), but never
    compiled: Jinja's compiler folds constants, so `10 ** (10 ** 9)` would run here, in the controller."""
    parser = Parser(_ENV, expression, state="variable")
    tree = parser.parse_expression()
    if not parser.stream.eos:
        token = parser.stream.current
        raise TemplateSyntaxError(f"unexpected {token.type!r} after the expression", token.lineno)
    return tree


def var_refs(expression: str) -> list[str]:
    """Names of the vars a gate reads (`vars.port`, `vars['port']`), from its parse tree; `*` for any other
    use of `vars` (`vars.get(x)`, `vars[stdout]`, `vars | length`), which may read any of them."""
    return list(_var_refs(expression))


@functools.lru_cache(maxsize=4096)
def _var_refs(expression: str) -> tuple[str, ...]:
    """`var_refs`, parsed once per distinct expression (a run's fingerprints ask for every step and host)."""
    try:
        tree = parse(expression)
    except (TemplateSyntaxError, RecursionError):
        return ("*",)
    names: list[str] = []
    plain: set[int] = set()  # the `vars` Name nodes read as vars.NAME / vars['NAME']
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        assert isinstance(node, nodes.Getattr | nodes.Getitem)
        if isinstance(node.node, nodes.Name) and node.node.name == "vars":
            if isinstance(node, nodes.Getattr) and node.attr not in dir(dict):
                names.append(node.attr)
            elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and type(node.arg.value) is str:
                names.append(node.arg.value)
            else:
                continue
            plain.add(id(node.node))
    if any(n.name == "vars" and id(n) not in plain for n in tree.find_all(nodes.Name)):
        names.append("*")
    return tuple(names)


def syntax_error(expression: str) -> str | None:
    """None if the expression parses, else the parser's complaint (each distinct text parsed once)."""
    problem: str | None = _syntax_memo.get(expression, _syntax_error)
    return problem


def _syntax_error(expression: str) -> str | None:
    try:
        parse(expression)
    except TemplateSyntaxError as exc:
        return exc.message or str(exc)
    except RecursionError:
        return "nested too deeply to parse"
    return None


def _chain_text(node: nodes.Node) -> str | None:
    """`facts.gpus[0]`-style text for a chain of lookups on a name, else None."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Getattr):
        base = _chain_text(node.node)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        base = _chain_text(node.node)
        return f"{base}[{node.arg.value!r}]" if base else None
    return None


def _chain_keys(node: nodes.Node) -> tuple[Any, ...]:
    """The keys of a chain that `_chain_text` names: `facts.gpus[0]` is ("facts", "gpus", 0)."""
    if isinstance(node, nodes.Getattr):
        return (*_chain_keys(node.node), node.attr)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return (*_chain_keys(node.node), node.arg.value)
    return (node.name,) if isinstance(node, nodes.Name) else ()


@functools.lru_cache(maxsize=4096)
def roots(expression: str) -> frozenset[str]:
    """The top-level names an expression reads (`stdout`, `facts`, ...): the only ones its worker needs.
    Parsed once per distinct expression: every attempt of every step asks. A bare name (`stdout`) is the tree
    itself, which `find_all` does not yield."""
    tree = parse(expression)
    return frozenset(node.name for node in [tree, *tree.find_all(nodes.Name)] if isinstance(node, nodes.Name))


def names_used(expression: str) -> list[str]:
    """The longest lookup chains in an expression, in order of appearance, without repeats."""
    return list(lookups_used(expression))


def lookups_used(expression: str) -> dict[str, tuple[Any, ...]]:
    """`names_used`, each with its keys (`facts.gpus[0]`: ("facts", "gpus", 0)): where a failed gate's
    explanation looks for the reason a fact is unknown (executor.run.attempts)."""
    found: dict[str, tuple[Any, ...]] = {}

    def walk(node: nodes.Node) -> Iterator[tuple[str, tuple[Any, ...]]]:
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):  # `facts.hub.values()`:
            node = node.node.node  # the value whose method it calls (`facts.hub`), not the method's repr
        text = _chain_text(node)
        if text is not None:
            yield text, _chain_keys(node)
            return
        for child in node.iter_child_nodes():
            yield from walk(child)

    for text, keys in walk(parse(expression)):
        found.setdefault(text, keys)
    return found


def _show(value: Any, limit: int = 600) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    if isinstance(value, str) and value == "":
        text += "  (empty)"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def evaluate(expression: str, names: Mapping[str, Any], message: str | None = None) -> GateVerdict:
    """Evaluate one gate against the names a gate sees."""
    try:
        value = _compiled(expression)(**names)
        if isinstance(value, StrictUndefined):
            raise UndefinedError(f"{expression} is undefined")
        if isinstance(value, Iterator):  # `selectattr(...)` without `| list`: a generator is always true
            value = list(value)
        if value:
            return GateVerdict(True, expression, message, "")
        why = ""
    except UndefinedError as exc:
        why = f"  names something missing: {exc.message}"
    except SecurityError as exc:
        why = f"  refused by the sandbox: {exc}"
    except MemoryError:
        why = f"  exceeded the memory bound of a gate ({GATE_MEMORY_BYTES // 2**20} MiB)"
    except Exception as exc:  # a gate is user code: any error it raises is a failed gate
        why = f"  raised {type(exc).__name__}: {exc}"
    detail = "\n".join(filter(None, [why, _values(expression, names)]))
    if len(detail) > DETAIL_MAX:
        detail = detail[:DETAIL_MAX] + f"... ({len(detail) - DETAIL_MAX} more chars)"
    return GateVerdict(False, expression, message, detail, undecided=bool(why))


def _values(expression: str, names: Mapping[str, Any]) -> str:
    """`  name = value` for each lookup chain the expression uses: what a reader needs to see why."""
    lines = []
    for name in names_used(expression):
        try:
            shown = _show(_compiled(name)(**names))
        except Exception as exc:
            shown = f"<{exc}>"
        lines.append(f"  {name} = {shown}")
    return "\n".join(lines)


# ---- bounded evaluation: worker processes --------------------------------------------------------


class GateWorker:
    """One worker process: it holds an attempt's names and evaluates that attempt's gates, one by one."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.killed = False
        #: names were handed (`hand`) and their answer not read yet: it comes before the next gate's
        self.loading = False

    @classmethod
    async def start(cls) -> GateWorker:
        import asyncio  # in each coroutine here: checking a gate's syntax (`runbook validate`) needs none

        # this file as a program (not `-m executor.runbook.gates`: the package's __init__ would import the engine);
        # -P keeps the folder of this file off sys.path, so none of its modules can shadow the stdlib
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            __file__,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(proc)

    def _send(self, request: Any) -> None:
        """Queue a request (written while its answer is awaited); a worker whose pipe is gone is killed."""
        assert self.proc.stdin is not None
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(_FRAME.pack(len(data)) + data)
        except OSError:
            self.kill()

    async def _answer(self) -> Any:
        """The answer to the oldest request not answered yet (the worker answers in order)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        await self.proc.stdin.drain()
        (size,) = _FRAME.unpack(await self.proc.stdout.readexactly(_FRAME.size))
        # the answer is JSON, not pickle: the worker runs expressions written against hostile output
        return json.loads(await self.proc.stdout.readexactly(size))

    async def load(self, names: Mapping[str, Any]) -> None:
        """Hand the worker an attempt's names (output up to the transport's cap: linear work, but bounded too)."""
        self.hand(names)
        await self.loaded()

    def hand(self, names: Mapping[str, Any]) -> None:
        """Send an attempt's names without waiting for the worker to take them: the first gate's request
        follows at once and `evaluate` reads both answers, one round trip for the two (each still bounded)."""
        self._send(("names", dict(names)))
        self.loading = True

    async def loaded(self) -> None:
        """Wait (at most LOAD_TIME_S) until the worker took the names handed to it, if it has not said so yet;
        a worker that cannot take them is killed, and its gates then fail as a worker that died."""
        import asyncio

        if not self.loading:
            return
        self.loading = False
        try:
            await asyncio.wait_for(self._answer(), LOAD_TIME_S)
        except (TimeoutError, OSError, EOFError, asyncio.IncompleteReadError, ValueError):
            self.kill()

    async def evaluate(self, expression: str, message: str | None) -> GateVerdict:
        """The verdict; a worker that does not answer within GATE_TIME_S is killed and the gate failed."""
        import asyncio

        if self.alive:
            self._send(("gate", expression))
            await self.loaded()  # the names' answer comes first (bounded as a load), then the gate's
        if not self.alive:
            detail = "  its worker process is gone (it could not take the attempt's output); the gate cannot hold"
            return GateVerdict(False, expression, message, detail, undecided=True)
        try:
            answer = await asyncio.wait_for(self._answer(), GATE_TIME_S)
        except TimeoutError:
            self.kill()
            detail = f"  did not finish within the time bound of a gate ({GATE_TIME_S:g}s); its evaluation was stopped"
            return GateVerdict(False, expression, message, detail, undecided=True)
        except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
            self.kill()
            detail = f"  its worker process died ({type(exc).__name__}); the gate cannot be trusted to hold"
            return GateVerdict(False, expression, message, detail, undecided=True)
        passed, detail, undecided = bool(answer["passed"]), str(answer["detail"]), bool(answer["undecided"])
        return GateVerdict(passed, expression, message, detail, undecided=undecided)

    @property
    def alive(self) -> bool:
        return not self.killed and self.proc.returncode is None

    def kill(self) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    async def close(self) -> None:
        import asyncio

        self.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)


#: The operators of a gate that compares the exit code with numbers (`bounded_by_itself`)
_ORDER = frozenset({"eq", "ne", "lt", "lteq", "gt", "gteq"})


@functools.lru_cache(maxsize=4096)
def bounded_by_itself(expression: str) -> bool:
    """Whether the gate compares `exit_code` with whole numbers written in it, and nothing else
    (`exit_code == 0`, the default gate; `0 <= exit_code < 3` is not: only `exit_code OP NUMBER ...`).
    Its work is a few comparisons of small integers whatever the host printed (the exit code is a
    number the transport made, or None), so it needs no worker's bounds: `GateWorkers.session` evaluates
    it in the run itself, sparing an attempt a round trip to a worker."""
    try:
        tree = parse(expression)
    except (TemplateSyntaxError, RecursionError):
        return False
    return (
        isinstance(tree, nodes.Compare)
        and isinstance(tree.expr, nodes.Name)
        and tree.expr.name == "exit_code"
        and all(
            op.op in _ORDER
            and isinstance(op.expr, nodes.Const)
            and type(op.expr.value) is int
            and abs(op.expr.value) < 1 << 31
            for op in tree.ops
        )
    )


class InlineGates:
    """Evaluates gates that are `bounded_by_itself` in the run's own process (as a worker would)."""

    def __init__(self, names: Mapping[str, Any]) -> None:
        self.names = names

    async def evaluate(self, expression: str, message: str | None) -> GateVerdict:
        return evaluate(expression, self.names, message)


class GateWorkers:
    """Idle workers of a run, reused across attempts; an attempt takes one for all its gates.

    Starting one costs ~0.1 s (a Python with Jinja2), paid once per concurrent attempt and run; a gate
    then costs a round trip over a pipe. A worker killed at a bound, or one whose attempt was cancelled
    (Ctrl-C), is never reused. An attempt whose gates all compare the exit code with numbers (the
    default gate) needs no worker (`bounded_by_itself`).
    """

    def __init__(self) -> None:
        from executor.diagnostics import NO_LOG  # here: checking a gate's syntax (`runbook validate`) needs no log

        self._idle: list[GateWorker] = []
        self._all: set[GateWorker] = set()
        self.log: Log = NO_LOG  # the run's diagnostics, once it has them

    @contextlib.asynccontextmanager
    async def session(
        self, names: Mapping[str, Any], expressions: Iterable[str] = ()
    ) -> AsyncIterator[GateWorker | InlineGates]:
        """A worker holding `names`: only those that `expressions` read, when given (stdout can be 64 MiB);
        the run itself when every one of `expressions` is `bounded_by_itself`."""
        import asyncio

        expressions = list(expressions)
        if expressions and all(bounded_by_itself(e) for e in expressions):
            yield InlineGates(names)
            return
        worker = self._idle.pop() if self._idle else await self._start()
        reusable = False
        if expressions:
            wanted = set().union(*(roots(e) for e in expressions))
            names = {name: value for name, value in names.items() if name in wanted}
        try:
            worker.hand(names)  # taken with the first gate's request (`evaluate`)
            yield worker
            await worker.loaded()  # no gate asked (a step without gates): the names' answer is still to read
            reusable = worker.alive
        except Exception:  # a failed gate ends the attempt with an exception: the worker itself is fine
            reusable = worker.alive and not worker.loading
            raise
        finally:
            if reusable:
                self._idle.append(worker)
            else:
                self._all.discard(worker)
                await asyncio.shield(worker.close())

    async def _start(self) -> GateWorker:
        try:
            worker = await GateWorker.start()
        except OSError as exc:
            raise GateWorkerUnavailable(f"could not start a gate worker: {exc.strerror or exc}") from None
        self._all.add(worker)
        self.log.debug("gate worker started", pid=worker.proc.pid, workers=len(self._all))
        return worker

    async def close(self) -> None:
        import asyncio

        workers, self._all, self._idle = list(self._all), set(), []
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The worker's loop: ("names", mapping) then ("gate", expression) requests, one JSON answer each."""
    names: Mapping[str, Any] = {}
    while header := stdin.read(_FRAME.size):
        request = pickle.loads(stdin.read(_FRAME.unpack(header)[0]))
        if request[0] == "names":
            names, answer = request[1], {}
        else:
            verdict = evaluate(request[1], names)
            answer = {"passed": verdict.passed, "detail": verdict.detail, "undecided": verdict.undecided}
        data = json.dumps(answer).encode()
        stdout.write(_FRAME.pack(len(data)) + data)
        stdout.flush()


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (GATE_MEMORY_BYTES, GATE_MEMORY_BYTES))


def _die_with_parent() -> None:
    """A worker whose run was killed (kill -9) must not spin on: Linux kills it with its parent."""
    import ctypes
    import signal

    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


if __name__ == "__main__":
    _die_with_parent()
    _limit_memory()
    os.nice(5)  # a gate that spins must not starve the run it belongs to
    _serve(sys.stdin.buffer, sys.stdout.buffer)
