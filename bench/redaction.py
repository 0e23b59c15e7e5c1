"""Benchmark 7: what redacting output in the stream costs, against capturing it with no secret.

Every command's output now passes a `StreamRedactor` before it is kept, counted, hashed or shown
(executor.transport.base.Captured); before, output was captured as it came and redacted whole
afterwards. Measured in one run, interleaved, on the same bytes: a command's output (log lines of
a model download, the shape a long step prints) fed to `Captured` in the transport's 64 KiB reads,
with no secret (nothing to redact: the redactor passes chunks through), with the flagship's one
secret (a Hugging Face token), and with a 20-line SSH private key as secret (its lines, stripped
and escaped, are ~100 forms). The output never holds a secret, the common case, so each case does
the whole search and no masking.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable

from bench.harness import Section, Table, fmt_ratio, fmt_seconds, interleave, ratio
from executor.redact import NO_SECRETS, Redactor
from executor.transport.base import Captured

MIB = 1 << 20
#: Output per case: one step's worth of chatty output (the cap keeps 32 MiB of any more).
OUTPUT_BYTES = 16 * MIB
READ_BYTES = 64 * 1024


def output(size: int) -> bytes:
    """`size` bytes of download-progress log lines, each line different."""
    lines, total, n = [], 0, 0
    while total < size:
        line = f"Fetching model-{n % 64:05d}-of-00064.safetensors: {n * 7 % 100:3d}% {n * 131:>12,} bytes\n".encode()
        lines.append(line)
        total += len(line)
        n += 1
    return b"".join(lines)[:size]


def ssh_key() -> str:
    """A private key's shape: armour, 20 lines of 70 base64 characters, armour, trailing newline."""
    body = base64.b64encode(os.urandom(20 * 52)).decode()
    lines = [body[i : i + 70] for i in range(0, 20 * 70, 70)]
    return "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----\n"


def _capture(data: bytes, redactor: Redactor) -> Callable[[], float]:
    def case() -> float:
        started = time.perf_counter()
        captured = Captured("stdout", redactor=redactor)
        for start in range(0, len(data), READ_BYTES):
            captured.feed(data[start : start + READ_BYTES])
        assert captured.total == len(data)  # nothing was masked: the same bytes, all of them counted
        return time.perf_counter() - started

    return case


def section(reps: int, log: Callable[[str], None], size: int = OUTPUT_BYTES) -> Section:
    data = output(size)
    cases = {
        "no secret": NO_SECRETS,
        "one token": Redactor(["hf_" + base64.b32encode(os.urandom(20)).decode().lower()]),
        "a 20-line SSH key": Redactor([ssh_key()]),
    }
    results = interleave(reps, {name: _capture(data, redactor) for name, redactor in cases.items()}, log)
    base = results["no secret"].median
    rows = []
    for name, series in results.items():
        per_mib = None if series.median is None else series.median / (size / MIB)
        rows.append([name, fmt_seconds(series.median), fmt_seconds(per_mib), fmt_ratio(ratio(series.median, base))])
    return Section(
        title="7. Redaction in the stream",
        method=(
            f"{size // MIB} MiB of a download's log lines fed to `Captured` in {READ_BYTES // 1024} KiB reads, "
            "as the transport reads a command's output: with no secret, with one token, and with a 20-line SSH "
            f"private key as the run's secrets (no secret in the output: the whole search, no masking), "
            f"interleaved, medians of {reps} repetitions."
        ),
        tables=[Table(["secrets", "capture", "per MiB", "vs no secret"], rows)],
    )
