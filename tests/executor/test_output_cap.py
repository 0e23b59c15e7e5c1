"""Output past the memory cap keeps its head and its tail: a step that printed 40 MB of progress and
then its error shows the error, in the gates' `stdout`, the failure message and the audit record."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.render import render_command
from executor.transport import Transport
from executor.transport import base as transport_base
from executor.transport.base import DROPPED_NOTE, Captured, CommandResult
from tests.clirun import runbook_cli
from tests.executor.test_transport import run, runner, transport

__all__ = ["run", "runner", "transport"]  # fixtures of the transport suite, used here too


def expected(data: bytes, head: int, tail: int) -> bytes:
    if len(data) <= head + tail:
        return data
    kept_tail = data[len(data) - tail :] if tail else b""
    return data[:head] + DROPPED_NOTE % (len(data) - head - tail, head, tail, len(data)) + kept_tail


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=600),
    head=st.integers(0, 80),
    tail=st.integers(0, 80),
    cuts=st.lists(st.integers(0, 600), max_size=30),
)
def test_head_and_tail_are_kept_over_any_chunking(data: bytes, head: int, tail: int, cuts: list[int]) -> None:
    captured = Captured(head_limit=head, tail_limit=tail)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    biggest = 0
    for start, end in itertools.pairwise(bounds):
        captured.feed(data[start:end])
        biggest = max(biggest, end - start)
        assert captured._tail_size <= tail + biggest  # memory: the two limits and a chunk
    assert captured.data == expected(data, head, tail)
    assert captured.total == len(data)
    assert captured.sha256 == hashlib.sha256(data).hexdigest()
    plain = data if len(data) <= head + tail else data[:head] + data[len(data) - tail :]
    assert captured.end(50) == plain[-50:]  # the end of what is kept, without the note
    assert captured.dropped == max(0, len(data) - head - tail)


def test_the_default_split_is_half_and_half() -> None:
    captured = Captured()
    assert captured.head_limit + captured.tail_limit == transport_base.OUTPUT_KEEP_BYTES
    assert captured.head_limit == captured.tail_limit


def test_every_transport_keeps_the_end_past_the_cap(
    run: Callable[..., CommandResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_base, "OUTPUT_KEEP_BYTES", 64 * 1024)
    size = 1024 * 1024
    script = f"head -c {size} /dev/zero | tr '\\0' 'p'; echo; echo 'ERROR: disk quota exceeded'; echo late >&2; exit 1"
    result = run(script)
    assert result.exit_code == 1
    full = b"p" * size + b"\nERROR: disk quota exceeded\n"
    assert result.stdout_total == len(full) and result.stdout_sha256 == hashlib.sha256(full).hexdigest()
    assert result.stdout == expected(full, 32 * 1024, 32 * 1024)
    assert result.stdout.endswith(b"\nERROR: disk quota exceeded\n")
    assert result.stderr == b"late\n"


def test_concurrent_commands_keep_their_own_tails(
    transport: Transport, runner: asyncio.Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_base, "OUTPUT_KEEP_BYTES", 8 * 1024)

    async def many() -> list[CommandResult]:
        return await asyncio.gather(
            *(transport.run(render_command(f"seq 1 {20000 + i}; echo end-{i}", {}), 60) for i in range(4))
        )

    for i, result in enumerate(runner.run(many())):
        assert result.stdout.endswith(f"\n{20000 + i}\nend-{i}\n".encode())
        assert result.stdout.startswith(b"1\n2\n3\n")


def test_the_cli_shows_the_error_printed_after_40_mb(write_runbook, tmp_path: Path) -> None:
    """The real cap (32 MiB): 40 MB of progress, then the error. The gate sees it in `stdout`, the
    console's failure message shows it in the output tail, the audit record keeps it."""
    path = write_runbook("""\
        name: t
        __HOSTS__
        steps:
          - id: download
            kind: shell
            timeout: 2m
            retry: {attempts: 1}
            gates:
              - that: "'ERROR' not in stdout"
                message: the download printed an error
            script: |
              yes 'progress: 42% of shard 7' | head -c 40000000
              echo 'ERROR: disk quota exceeded'
        """)
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 1, done.stderr
    said = done.stdout + done.stderr
    assert "the download printed an error" in said
    assert "ERROR: disk quota exceeded" in said
    (run_dir,) = (tmp_path / "logs").iterdir()
    records = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["event"] == "command"]
    assert record["stdout"].endswith("ERROR: disk quota exceeded\n")
    assert record["stdout_truncated"] is True
    assert record["stdout_bytes"] == 40_000_000 + len("ERROR: disk quota exceeded\n")
