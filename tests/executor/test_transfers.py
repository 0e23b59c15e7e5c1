"""Transfers arrive whole: `upload:` and `fetch:` stream files in pieces, hashing as they go, keep holes
(a sparse file arrives with its full size), and check size and sha256 on both ends; a difference
fails the attempt. Memory stays flat whatever the size (bench/transfer_memory.py measures 1 GiB).

Every transport against the real sshd of conftest, which runs on this machine as this user, so the
"remote" files are local files a test can read.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.transfer_memory import measure
from executor.errors import TransportError
from executor.runbook.model import Host
from executor.transport import SSHTransport, Transport
from executor.transport import base as transport_base
from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli
from tests.executor.test_transport import runner, transport

__all__ = ["runner", "transport"]  # fixtures of the transport suite, used here too

MIB = 1024 * 1024


def sparse_file(path: Path, layout: list[tuple[str, int]]) -> bytes:
    """A file of data and holes (("data", n) or ("hole", n), in order); its full content."""
    content = bytearray()
    with path.open("wb") as handle:
        for kind, size in layout:
            if kind == "data":
                piece = os.urandom(size).replace(b"\0", b"\1")
                handle.write(piece)
                content += piece
            else:
                handle.seek(size, os.SEEK_CUR)
                content += bytes(size)
        handle.truncate(len(content))
    assert path.stat().st_size == len(content)
    return bytes(content)


LAYOUTS = {
    "trailing-hole": [("data", MIB), ("hole", 4 * MIB)],  # the 5 MB file that arrived as 1 MB
    "all-hole": [("hole", 3 * MIB)],  # arrived as 0 bytes
    "leading-and-middle-holes": [("hole", 5 * MIB), ("data", 1000), ("hole", 9 * MIB), ("data", 7)],
    "short-trailing-hole": [("data", 10), ("hole", 10)],
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_a_sparse_file_arrives_whole_both_ways(
    transport: Transport, runner: asyncio.Runner, tmp_path: Path, layout: list[tuple[str, int]]
) -> None:
    local, remote, back = tmp_path / "local.bin", tmp_path / "remote.bin", tmp_path / "back.bin"
    content = sparse_file(local, layout)
    digest = hashlib.sha256(content).hexdigest()
    put = runner.run(transport.put(local, str(remote)))
    assert (put.size, put.sha256) == (len(content), digest)
    assert remote.stat().st_size == len(content)
    assert remote.read_bytes() == content
    got = runner.run(transport.get(str(remote), back))
    assert (got.size, got.sha256) == (len(content), digest)
    assert back.read_bytes() == content


def test_holes_stay_holes(transport: Transport, runner: asyncio.Runner, tmp_path: Path) -> None:
    """A 64 MiB file with 4 KiB of data takes no 64 MiB of disk at the other end."""
    local, remote = tmp_path / "local.bin", tmp_path / "remote.bin"
    sparse_file(local, [("data", 4096), ("hole", 64 * MIB)])
    runner.run(transport.put(local, str(remote)))
    assert remote.stat().st_size == 64 * MIB + 4096
    assert remote.stat().st_blocks * 512 < 16 * MIB


SEGMENTS = st.lists(st.tuples(st.sampled_from(["data", "hole"]), st.integers(1, 20_000)), max_size=8)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=SEGMENTS)
def test_any_layout_of_data_and_holes_round_trips(
    transport: Transport, runner: asyncio.Runner, tmp_path: Path, layout: list[tuple[str, int]]
) -> None:
    """With 4 KiB pieces (not 4 MiB), so that holes and data meet inside and across pieces."""
    original = transport_base.TRANSFER_CHUNK
    transport_base.TRANSFER_CHUNK = 4096
    try:
        local, remote, back = tmp_path / "local.bin", tmp_path / "remote.bin", tmp_path / "back.bin"
        content = sparse_file(local, layout)
        put = runner.run(transport.put(local, str(remote)))
        got = runner.run(transport.get(str(remote), back))
    finally:
        transport_base.TRANSFER_CHUNK = original
    assert remote.read_bytes() == content == back.read_bytes()
    assert put.size == got.size == len(content)
    assert put.sha256 == got.sha256 == hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("runner_kind", ["persistent", "exec"])
def test_a_fetch_that_differs_from_the_host_s_file_fails(
    sshd: SSHServer, runner: asyncio.Runner, tmp_path: Path, runner_kind: str
) -> None:
    """/proc/uptime: the host's own check (stat: 0 bytes; its content changes) never matches what
    was streamed, so the transfer fails, naming both sides."""
    transport = SSHTransport("box", Host(**sshd.host_dict(), runner=runner_kind))
    try:
        with pytest.raises(TransportError, match="did not arrive whole") as caught:
            runner.run(transport.get("/proc/uptime", tmp_path / "uptime"))
    finally:
        runner.run(transport.close())
    assert "what arrived is 0 bytes" in str(caught.value)


def test_an_upload_whose_destination_keeps_nothing_fails(
    sshd: SSHServer, runner: asyncio.Runner, tmp_path: Path
) -> None:
    """A destination that is a link to /dev/null on the host: the upload "succeeds" at SFTP level, but
    the host's file is empty, so it fails."""
    (tmp_path / "sink").symlink_to(os.devnull)
    local = tmp_path / "local.bin"
    local.write_bytes(b"payload " * 1000)
    transport = SSHTransport("box", Host(**sshd.host_dict()))
    try:
        with pytest.raises(TransportError) as caught:
            runner.run(transport.put(local, str(tmp_path / "sink")))
    finally:
        runner.run(transport.close())
    assert f"upload of {local}" in str(caught.value)


def test_memory_stays_flat_for_a_large_transfer(sshd: SSHServer, tmp_path: Path) -> None:
    """Peak RSS of a process that uploads and fetches 256 MiB grows by no more than for 16 MiB plus a
    margin (the old way read the whole file into memory: +256 MiB). 1 GiB: `python -m
    bench.transfer_memory` (bench/RESULTS.md)."""
    small = measure(sshd.host_dict(), 16 * MIB, folder=tmp_path)
    large = measure(sshd.host_dict(), 256 * MIB, folder=tmp_path)
    for way in ("put_growth_mib", "get_growth_mib"):
        assert large[way] < small[way] + 32, (small, large)
        assert large[way] < 96, (small, large)


# --- through the CLI ------------------------------------------------------------------------


def test_the_cli_uploads_a_sparse_file_whole(write_runbook, tmp_path: Path) -> None:
    content = sparse_file(tmp_path / "model.bin", LAYOUTS["trailing-hole"])
    sparse_file(tmp_path / "empty-shard.bin", LAYOUTS["all-hole"])
    remote = tmp_path / "remote"
    remote.mkdir()
    path = write_runbook(f"""\
        name: t
        __HOSTS__
        steps:
          - id: ship
            kind: shell
            upload:
              - {{src: model.bin, dest: {remote}/model.bin}}
              - {{src: empty-shard.bin, dest: {remote}/empty-shard.bin}}
            script: stat -c %s {remote}/model.bin {remote}/empty-shard.bin
            gates:
              - that: "stdout.split() == ['{len(content)}', '{3 * MIB}']"
        """)
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    records = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    transfers = [(r["size"], r["sha256"]) for r in records if r["event"] == "transfer"]
    assert transfers == [
        (len(content), hashlib.sha256(content).hexdigest()),
        (3 * MIB, hashlib.sha256(bytes(3 * MIB)).hexdigest()),
    ]


def test_the_cli_fails_a_fetch_that_did_not_arrive_whole(write_runbook, tmp_path: Path) -> None:
    path = write_runbook("""\
        name: t
        __HOSTS__
        steps:
          - id: collect
            kind: shell
            retry: {attempts: 1}
            script: "true"
            fetch: [{src: /proc/uptime, dest: uptime.txt}]
        """)
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 1
    assert "did not arrive whole" in done.stdout + done.stderr


@pytest.mark.parametrize("source", ["fifo", "dev-zero"])
def test_an_upload_of_no_regular_file_fails_at_once(write_runbook, tmp_path: Path, source: str) -> None:
    """A FIFO's open waits for a writer and /dev/zero never ends: neither may hang the run (nor its
    fingerprint, which hashes what an upload reads), whatever the step's timeout."""
    src = tmp_path / "src"
    if source == "fifo":
        os.mkfifo(src)
    else:
        src.symlink_to("/dev/zero")
    book = write_runbook(f"""\
        name: t
        __HOSTS__
        steps:
          - id: up
            kind: shell
            timeout: 10m
            upload: [{{src: {src}, dest: {tmp_path / "dest"}}}]
            script: "true"
        """)
    done = runbook_cli("run", str(book), "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 1, done.stderr
    assert "not a regular file" in done.stderr
