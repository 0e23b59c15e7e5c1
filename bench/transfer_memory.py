"""Peak memory of a file transfer: `upload:` and `fetch:` stream a file in pieces, so the controller's
memory stays flat whatever the file's size.

    python -m bench.transfer_memory [--sizes-mib 16,256,1024] [--runner persistent|exec|local]

For each size, a fresh process (nothing else in it) connects to a real sshd on 127.0.0.1 (the
sandbox's, started here), runs one command, records its peak RSS (`ru_maxrss`), then uploads a file of
that size (non-zero bytes: nothing to skip as a hole), fetches it back, and records its peak RSS
after each. The table shows the growth over the peak before the transfer; flat means bounded.
Both transfers are checked on both ends (size and sha256), so a run is also a correctness check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def write_file(path: Path, size: int) -> None:
    """`size` bytes that are never all zero in any piece (a random MiB, repeated)."""
    block = os.urandom(MIB)
    with path.open("wb") as handle:
        left = size
        while left > 0:
            handle.write(block[: min(left, MIB)])
            left -= MIB


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def child(host: dict[str, Any], runner: str, local: Path, remote: str, back: Path) -> dict[str, Any]:
    from executor.render import render_command
    from executor.runbook.model import Host
    from executor.transport import LocalTransport, SSHTransport, Transport

    transport: Transport = (
        LocalTransport("here")
        if runner == "local"
        else SSHTransport("box", Host.model_validate({**host, "runner": runner}))
    )
    await transport.connect()
    await transport.run(render_command("true", {}), 30)
    before = peak_rss_mib()
    started = time.monotonic()
    put = await transport.put(local, remote)
    after_put = peak_rss_mib()
    put_s = time.monotonic() - started
    started = time.monotonic()
    got = await transport.get(remote, back)
    after_get = peak_rss_mib()
    get_s = time.monotonic() - started
    await transport.close()
    assert (put.size, put.sha256) == (got.size, got.sha256)
    return {
        "size": put.size,
        "before_mib": before,
        "put_growth_mib": after_put - before,
        "get_growth_mib": after_get - before,
        "put_s": put_s,
        "get_s": get_s,
    }


def measure(host: dict[str, Any], size: int, runner: str = "persistent", folder: Path | None = None) -> dict[str, Any]:
    """One transfer each way of `size` bytes in a fresh process; its peak RSS growth."""
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        local, remote, back = Path(tmp) / "local.bin", Path(tmp) / "remote.bin", Path(tmp) / "back.bin"
        write_file(local, size)
        code = "import asyncio, json, sys; from bench.transfer_memory import main_child; main_child()"
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps([host, runner, str(local), str(remote), str(back)])],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"transfer of {size} bytes failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main_child() -> None:
    host, runner, local, remote, back = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(child(host, runner, Path(local), remote, Path(back)))))


def main() -> None:
    from sandbox.sshd import start_sshd

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="16,256,1024")
    parser.add_argument("--runner", default="persistent", choices=["persistent", "exec", "local"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, server = start_sshd(Path(tmp) / "sshd")
        try:
            print(f"| size | peak RSS before | growth: upload | growth: fetch | upload | fetch |  ({args.runner})")
            print("| --- | --- | --- | --- | --- | --- |")
            for mib in (int(x) for x in args.sizes_mib.split(",")):
                row = measure(server.host_dict(), mib * MIB, args.runner, Path(tmp))
                print(
                    f"| {mib} MiB | {row['before_mib']:.0f} MiB | {row['put_growth_mib']:+.1f} MiB "
                    f"| {row['get_growth_mib']:+.1f} MiB | {row['put_s']:.1f} s | {row['get_s']:.1f} s |",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
