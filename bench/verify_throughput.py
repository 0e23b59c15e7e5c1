"""Benchmark 4: the verify step's parallel sha256 against one sequential `sha256sum`.

After a download of hundreds of GiB the verify step reads every byte once; whether that takes
minutes or an hour is its throughput. The measured code is the verify host program's own hashing
(`hostprograms.verify.hash_files`, imported, not copied) called as `verify()` calls it: one job per
file, one worker thread per core, BLOCK-sized reads. It is the part the step times for its
`throughput_bytes_per_s` fact. The baseline is what a person would type: `sha256sum` over the same
files, one after the other.

The folder is synthetic: random bytes in shards of equal size, created once under a cache folder
(name by size and shard count; built in a temporary folder and renamed, so a half-written one is
never reused) with its digests in `SHA256SUMS`, so that every timed run also proves it computed
the right digests. Before timing, every file is read once, so all cases hash from the page cache,
as the step does right after a download; this measures hashing, not the disk.

The target is "at least 0.7x of (cores x one-core sha256 rate)": the one-core rate is measured in
the same run, interleaved with the other cases, by hashing an in-memory buffer on one thread with
the same hashlib (no reads at all, so the target is as strict as it can be). The same hashing on
every core at once is measured too: what the CPU allows when all cores hash, which cores x
one-core overstates where "cores" share execution units, caches or clocks (a 16-vCPU H200 host:
1.1 GB/s on one thread, 13 GB/s on 16, 11.7x). That row tells a slow verify from a CPU that cannot
go faster.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import (
    REPO,
    Section,
    Stopwatch,
    Table,
    Target,
    ToolFailed,
    fmt_ratio,
    fmt_seconds,
    interleave,
    ratio,
)
from hostprograms.verify import BLOCK, Entry, hash_files

MIB = 1 << 20
GIB = 1 << 30
CACHE = REPO / ".cache" / "bench"
SUMS = "SHA256SUMS"
TARGET_FRACTION = 0.7
#: Bytes each thread hashes in memory: long enough to dwarf timer, thread and call overhead.
MEMORY_BYTES = 512 * MIB


@dataclass(frozen=True)
class Folder:
    """A synthetic model folder: its shards (sorted) and their sha256 digests by relative path."""

    root: Path
    shards: list[Path]
    digests: dict[str, str]

    @property
    def total_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.shards)


def model_folder(cache: Path, total_bytes: int, shards: int) -> Folder:
    """The synthetic folder of `total_bytes` in `shards` files under `cache`; created on first use."""
    shard_bytes = total_bytes // shards
    root = cache / f"model-{total_bytes}B-{shards}shards"
    if not (root / SUMS).is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=cache))
        try:
            names = [f"model-{i + 1:05d}-of-{shards:05d}.bin" for i in range(shards)]
            (tmp / SUMS).write_text("".join(f"{_write_random(tmp / name, shard_bytes)}  {name}\n" for name in names))
            shutil.rmtree(root, ignore_errors=True)  # a folder without SHA256SUMS is a leftover
            tmp.rename(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    digests = _parse_sums((root / SUMS).read_text())
    return Folder(root, [root / name for name in sorted(digests)], digests)


def _parse_sums(text: str) -> dict[str, str]:
    """`sha256sum`'s output format (`DIGEST  PATH` lines) as {file name: digest}."""
    pairs = (line.split("  ", 1) for line in text.splitlines())
    return {Path(path).name: digest for digest, path in pairs}


def _write_random(path: Path, size: int) -> str:
    """Fill `path` with `size` random bytes; their sha256."""
    h = hashlib.sha256()
    with path.open("wb") as out:
        for offset in range(0, size, BLOCK):
            chunk = os.urandom(min(BLOCK, size - offset))
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


def warm(folder: Folder) -> None:
    """Read every shard once, so that every timed case finds them in the page cache."""
    buf = bytearray(BLOCK)
    for path in folder.shards:
        with path.open("rb", buffering=0) as stream:
            while stream.readinto(buf):
                pass


def verify_case(folder: Folder, workers: int) -> Callable[[], float]:
    """The verify host program's hashing with `workers` threads; fails on a wrong digest."""
    jobs = [(Entry(rel, None, "sha256", digest), (folder.root / rel).stat()) for rel, digest in folder.digests.items()]

    def case() -> float:
        with Stopwatch() as watch:
            digests, _ = hash_files(folder.root, jobs, workers, lambda _fields: None)
        if digests != folder.digests:
            raise ToolFailed(f"hostprograms.verify.hash_files gave wrong digests: {digests}")
        return watch.seconds

    return case


def sha256sum_case(folder: Folder) -> Callable[[], float]:
    """One `sha256sum` process over all shards, one after the other; fails on a wrong digest."""
    argv = ["sha256sum", "--", *(str(p) for p in folder.shards)]

    def case() -> float:
        with Stopwatch() as watch:
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ToolFailed(f"sha256sum exited {done.returncode}: {done.stderr.strip()}")
        got = _parse_sums(done.stdout)
        if got != folder.digests:
            raise ToolFailed(f"sha256sum gave other digests than SHA256SUMS: {got}")
        return watch.seconds

    return case


def memory_case(nbytes: int, threads: int) -> Callable[[], float]:
    """hashlib sha256 over `nbytes` of memory on each of `threads` threads at once, in BLOCK-sized
    updates: no reads at all, so it is the rate the CPU itself allows."""
    buf = memoryview(os.urandom(BLOCK))
    pieces = max(1, nbytes // BLOCK)

    def hash_memory() -> None:
        h = hashlib.sha256()
        for _ in range(pieces):
            h.update(buf)

    def case() -> float:
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool, Stopwatch() as watch:
            for future in [pool.submit(hash_memory) for _ in range(threads)]:
                future.result()
        return watch.seconds

    return case


@dataclass(frozen=True)
class Case:
    """One row of the table: its name, the bytes it hashes per run, and the callable that runs it."""

    name: str
    nbytes: int
    run: Callable[[], float]


def section(
    total_bytes: int = 2 * GIB,
    shards: int = 8,
    reps: int = 5,
    cache: Path = CACHE,
    log: Callable[[str], None] | None = None,
) -> Section:
    """Run benchmark 4 and describe it: a table of cases and the 0.7x-of-cores target."""
    folder = model_folder(cache, total_bytes, shards)
    size = folder.total_bytes
    cores = os.cpu_count() or 1
    per_thread = max(BLOCK, min(MEMORY_BYTES, size))
    warm(folder)
    verify, baseline, one_core, all_cores = (
        Case(f"verify step hashing ({cores} workers)", size, verify_case(folder, cores)),
        Case("sha256sum, sequential", size, sha256sum_case(folder)),
        Case("hashlib sha256 in memory, 1 thread", per_thread, memory_case(per_thread, 1)),
        Case(f"hashlib sha256 in memory, {cores} threads", cores * per_thread, memory_case(per_thread, cores)),
    )
    rows = [verify, Case("verify step hashing (1 worker)", size, verify_case(folder, 1)), baseline, one_core, all_cores]
    series = interleave(reps, {case.name: case.run for case in rows}, log)

    def rate(case: Case) -> float | None:
        median = series[case.name].median
        return case.nbytes / median if median else None

    table = Table(["case", "bytes", "median time", "GB/s", "rate vs sha256sum"])
    for case in rows:
        speed = rate(case)
        table.rows.append(
            [
                case.name,
                f"{case.nbytes / MIB:.0f} MiB",
                fmt_seconds(series[case.name].median),
                "—" if speed is None else f"{speed / 1e9:.2f}",
                fmt_ratio(ratio(speed, rate(baseline))),
            ]
        )
    return Section(
        title="4. Verify throughput",
        method=(
            f"The verify step's parallel sha256 (`hostprograms.verify.hash_files`, the host program's own code) "
            f"against one sequential `sha256sum` over a synthetic model folder of {size / GIB:.2f} GiB in "
            f"{len(folder.shards)} shards, from the page cache; {reps} interleaved repetitions, medians. "
            "GB/s are 10^9 bytes per second. The in-memory rows hash a buffer with the same hashlib and no "
            f"reads: on 1 thread they give the one-core rate of the target, on {cores} threads what this CPU "
            "allows when every core hashes (cores that share execution units or clocks show here)."
        ),
        tables=[table],
        notes=[f"{name}: failed: {s.failure}" for name, s in series.items() if s.failure],
        targets=[target(rate(verify), rate(one_core), rate(all_cores), cores)],
    )


def target(verify: float | None, one_core: float | None, all_cores: float | None, cores: int) -> Target:
    """The issue's target, decided on the medians; the all-cores rate says how much of it the CPU allows."""
    text = f"verify at least {TARGET_FRACTION}x of (cores x one-core sha256 rate)"
    if verify is None or one_core is None or all_cores is None:
        return Target(text, None, "a case failed")
    limit = cores * one_core
    return Target(
        text,
        verify >= TARGET_FRACTION * limit,
        f"{verify / 1e9:.2f} GB/s = {verify / limit:.2f}x of {cores} cores x {one_core / 1e9:.2f} GB/s; "
        f"this CPU hashing on all {cores} cores with no reads at all reaches {all_cores / 1e9:.2f} GB/s "
        f"({all_cores / one_core:.2f}x one core), and verify {verify / all_cores:.2f}x of that",
    )
