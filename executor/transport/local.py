"""`address: local`: the same rendered command, run by a local subprocess.

The subprocess gets a declared environment, as a step on an SSH host gets its login's: PATH, HOME and LANG
of the controller's (`LOCAL_ENV_NAMES`), then, from the wrapper's payload, the vars and secrets the step
gets. Never the controller's whole environment: the MCP server's or a CI job's HF_TOKEN, AWS keys or
PYTHONPATH would otherwise reach every local step (and `status` or `tail` could show what one printed)
without the runbook naming them. A step that needs another variable declares it: a var, or a secret read
from the controller's environment (and then masked).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from executor.render import RenderedCommand
from executor.transport.base import (
    KILL_GRACE_S,
    Collector,
    CommandResult,
    OutputSink,
    Transfer,
    Transport,
    check_arrived,
    copy_file,
    file_digest,
    supervise,
)

#: The controller's variables a local step's bash starts with (each where the controller has it; PATH the
#: system's default where it has none).
LOCAL_ENV_NAMES = ("PATH", "HOME", "LANG")


def declared_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a local step's wrapper starts with: LOCAL_ENV_NAMES of `environ` (the controller's), nothing
    else; the step's vars and secrets follow in the payload, as for an SSH host."""
    env = {name: environ[name] for name in LOCAL_ENV_NAMES if name in environ}
    env.setdefault("PATH", os.defpath)
    return env


class LocalTransport(Transport):
    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        collect = Collector(on_output, self.redactor)
        proc = await asyncio.create_subprocess_exec(
            *command.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=declared_environment(os.environ),
        )
        assert proc.stdin and proc.stdout and proc.stderr
        stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

        async def feed() -> None:
            # the wrapper reports a payload that did not arrive whole (exit 125); a broken pipe is no crash
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(command.stdin)
                await stdin.drain()

        async def finish() -> int:
            fed = asyncio.ensure_future(feed())
            if not await collect.read_until_exit(stdout, stderr, lambda: proc.returncode is not None):
                # a process the script left running holds the pipes: stop reading them; asyncio offers
                # no public way to close a subprocess's pipes without the process
                getattr(proc, "_transport").close()  # noqa: B009
            await fed
            return await proc.wait()

        try:
            return await supervise(collect, finish(), timeout, lambda task: self._stop(proc, task))
        finally:
            proc.stdin.close()

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process, task: asyncio.Future[int | None]) -> int | None:
        """Close stdin (the wrapper then kills the step's session) and wait for the exit; None when the
        wrapper did not finish within the grace (it is killed: what it should have killed is unconfirmed)."""
        assert proc.stdin
        proc.stdin.close()
        try:
            return await asyncio.wait_for(asyncio.shield(task), KILL_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return None

    async def put(self, local: Path, remote: str) -> Transfer:
        return await self._copy("put", local, Path(remote).expanduser(), str(local), remote)

    async def get(self, remote: str, local: Path) -> Transfer:
        return await self._copy("get", Path(remote).expanduser(), local, str(local), remote)

    @staticmethod
    async def _copy(direction: str, source: Path, target: Path, local: str, remote: str) -> Transfer:
        """Stream `source` to `target`, hashing as it goes, then hash the file that arrived."""
        sent = await asyncio.to_thread(copy_file, source, target)
        arrived = await asyncio.to_thread(file_digest, target)
        check_arrived(
            f"{'upload' if direction == 'put' else 'download'} {source} -> {target}", sent, arrived.size, arrived.sha256
        )
        return Transfer(direction, local, remote, sent.size, sent.sha256)
