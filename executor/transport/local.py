"""`address: local`: the same rendered command, run by a local subprocess."""

from __future__ import annotations

import asyncio
import contextlib
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
