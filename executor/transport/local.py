"""`address: local`: the same rendered command, run by a local subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

from executor.render import RenderedCommand
from executor.transport.base import (
    KILL_GRACE_S,
    Collector,
    CommandResult,
    OutputSink,
    Transfer,
    Transport,
    file_sha256,
    supervise,
)


class LocalTransport(Transport):
    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        collect = Collector(on_output)
        proc = await asyncio.create_subprocess_exec(
            *command.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
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
        """Close stdin (the wrapper then kills the step's group) and wait for the exit."""
        assert proc.stdin
        proc.stdin.close()
        try:
            return await asyncio.wait_for(asyncio.shield(task), KILL_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()

    async def put(self, local: Path, remote: str) -> Transfer:
        target = Path(remote).expanduser()
        await asyncio.to_thread(shutil.copyfile, local, target)
        return Transfer("put", str(local), remote, target.stat().st_size, file_sha256(target))

    async def get(self, remote: str, local: Path) -> Transfer:
        source = Path(remote).expanduser()
        await asyncio.to_thread(shutil.copyfile, source, local)
        return Transfer("get", str(local), remote, local.stat().st_size, file_sha256(local))
