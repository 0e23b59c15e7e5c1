"""Host side of the `verify` step: check a downloaded Hub repo against the Hub's manifest.

The Hugging Face client checks sizes only; a shard cut short by a dropped connection, or bytes
that changed on the way, pass it silently. This program checks, for every file of the
manifest (after the include/exclude patterns): present, right size, no `*.incomplete`
leftover, sha256 equal to the Hub's for LFS files (git blob sha1 for small files), and for
`.safetensors` files a header check that catches truncation from the first bytes alone.

Hashing runs in a thread pool, one worker per core: hashlib releases the GIL while it hashes
a large buffer, so threads with 8 MiB reads scale like processes (measured on a 16-core H200
host over 8 GiB of cached shards: 1 thread 0.84 GiB/s, 16 threads 8.7 GiB/s, 16 processes
9.0 GiB/s) without pickling or re-importing this program from its zip in each process.
Digests are cached in `LOCAL_DIR/.cache/runbook-verify.json` by (path, size, mtime_ns), so an
unchanged tree re-verifies without reading it. As in git's "racy" rule, a file modified less than
RACY_NS before its hash began is not cached: a change within the same timestamp tick would keep
its mtime, so only an mtime older than the hash proves the digest is of the current content.

Stdlib only, plus huggingface_hub for the manifest (`HfApi().repo_info`) and for `repair`
(`hf_hub_download`); HF_ENDPOINT and HF_TOKEN come from the environment. Shipped with the kit
(hostprograms/kit.py: config file in, one result document out); its config is the step's `repo`, `repo_type`,
`revision`, `include`, `exclude`, `workers`, `repair` and `local_dir` (`~` and `$var` expand here).
Progress lines and a plain summary of problems go to stderr.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import os
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hostprograms import kit

MIN_PYTHON = (3, 9)  # huggingface_hub's own floor
BLOCK = 8 << 20  # read size: large enough that hashlib drops the GIL for nearly all the time
CACHE_FILE = ".cache/runbook-verify.json"
CACHE_VERSION = 1
RACY_NS = 2_000_000_000  # coarser than any file system's mtime granularity we may meet (FAT: 2 s)
PROGRESS_EVERY_S = 1.0
#: The safetensors library refuses headers above 100 MB (MAX_HEADER_SIZE in its Rust code).
MAX_HEADER_BYTES = 100_000_000
#: Bits per element of each safetensors dtype.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip

Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Entry:
    """One file of the Hub's manifest: `algo` names the digest the Hub gives for it."""

    path: str
    size: int | None
    algo: str | None  # "sha256" (LFS), "git-sha1" (small files, git blob id) or None
    digest: str | None


# ----------------------------------------------------------------------------- manifest


def read_manifest(repo: str, revision: str, repo_type: str = "model") -> tuple[str, list[Entry]]:
    """The commit sha and the files of `repo` (a model, or a dataset: `repo_type`) at `revision`, as the Hub
    reports them."""
    from huggingface_hub import HfApi

    info = HfApi().repo_info(repo, repo_type=repo_type, revision=revision, files_metadata=True)
    entries = []
    for sib in info.siblings or []:
        if sib.lfs is not None:
            entries.append(Entry(sib.rfilename, sib.lfs.size, "sha256", sib.lfs.sha256))
        elif sib.blob_id:
            entries.append(Entry(sib.rfilename, sib.size, "git-sha1", sib.blob_id))
        else:
            entries.append(Entry(sib.rfilename, sib.size, None, None))
    return str(info.sha), entries


def select(entries: list[Entry], include: list[str], exclude: list[str]) -> list[Entry]:
    """The entries the download step fetched: huggingface_hub's own allow/ignore matching."""
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]  # public, not in __all__

    return list(
        filter_repo_objects(
            entries, allow_patterns=include or None, ignore_patterns=exclude or None, key=lambda e: e.path
        )
    )


# ----------------------------------------------------------------------------- safetensors


def safetensors_problem(stream: IO[bytes], file_size: int) -> str | None:
    """Why a safetensors file is malformed or cut short, or None; reads only its header.

    Layout: 8-byte little-endian header length N, N bytes of JSON, then the data, whose
    tensors' `data_offsets` must tile it exactly: so 8 + N + the last offset == file size.
    """
    prefix = stream.read(8)
    if file_size < 8 or len(prefix) < 8:
        return f"file is {file_size} bytes, shorter than the 8-byte header length"
    (length,) = struct.unpack("<Q", prefix)
    if length < 2 or length > MAX_HEADER_BYTES:
        return f"header length {length} is not plausible (2..{MAX_HEADER_BYTES})"
    if 8 + length > file_size:
        return f"header length {length} runs past the end of the file ({file_size} bytes)"
    raw = stream.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return f"header is not valid JSON: {exc}"
    if not isinstance(header, dict):
        return f"header is a JSON {type(header).__name__}, not an object"
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                return "__metadata__ is not a map of strings"
            continue
        span = _tensor_span(name, info)
        if isinstance(span, str):
            return span
        spans.append((span[0], span[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            return f"tensor {name!r} starts at {begin}, expected {end} (hole or overlap in data_offsets)"
        end = stop
    if 8 + length + end != file_size:
        return f"8 + header {length} + data {end} = {8 + length + end} bytes, but the file has {file_size}"
    return None


def _tensor_span(name: str, info: Any) -> tuple[int, int] | str:
    """(begin, end) of one tensor's data, or why its header entry is malformed."""
    if not isinstance(info, dict):
        return f"tensor {name!r}: entry is not an object"
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers"
    if (
        not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets))
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end"
    if not isinstance(dtype, str):
        return f"tensor {name!r}: dtype {dtype!r} is not a string"
    bits = DTYPE_BITS.get(dtype)
    nbytes = offsets[1] - offsets[0]
    need = math.prod(shape) * bits if bits is not None else nbytes * 8
    if need != nbytes * 8:
        # a corrupt shape can multiply past a float's range (1e400 bytes): then its size in bits, as an int
        shown = f"{need / 8:g} bytes" if need.bit_length() < 1000 else f"2**{need.bit_length() - 1} bits or more"
        return f"tensor {name!r}: {dtype}{shape} needs {shown}, data_offsets give {nbytes}"
    return offsets[0], offsets[1]


def header_problem(path: Path) -> str | None:
    """`safetensors_problem` of a file on disk (an unreadable file is a problem too)."""
    try:
        with path.open("rb") as stream:
            return safetensors_problem(stream, os.fstat(stream.fileno()).st_size)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"


# ----------------------------------------------------------------------------- hashing


def file_digest(path: Path, algo: str, size: int, count: Callable[[int], None]) -> str:
    """The digest of a file, reading it in BLOCK-sized pieces; `count` sees each piece's length.

    `git-sha1` is the git blob id the Hub lists for small files: sha1 of `blob SIZE\\0` + content.
    """
    h = hashlib.sha256() if algo == "sha256" else hashlib.sha1(f"blob {size}\0".encode())
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as stream:
        while n := stream.readinto(buf):
            h.update(view[:n])
            count(n)
    return h.hexdigest()


class DigestCache:
    """Digests by relative path, valid while (size, mtime_ns) is unchanged; saved atomically."""

    def __init__(self, root: Path) -> None:
        self.path = root / CACHE_FILE
        self.entries: dict[str, dict[str, Any]] = {}
        self.changed = False
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") == CACHE_VERSION and isinstance(data.get("files"), dict):
                self.entries = data["files"]
        except (OSError, ValueError, AttributeError):
            pass  # no cache, or an unreadable one: everything gets hashed

    def get(self, rel: str, algo: str, st: os.stat_result) -> str | None:
        hit = self.entries.get(rel)
        if (
            isinstance(hit, dict)
            and hit.get("algo") == algo
            and hit.get("size") == st.st_size
            and hit.get("mtime_ns") == st.st_mtime_ns
        ):
            digest = hit.get("digest")
            return digest if isinstance(digest, str) else None
        return None

    def put(self, rel: str, algo: str, st: os.stat_result, digest: str, hashed_at_ns: int) -> None:
        """Remember a digest, unless the file changed too shortly before `hashed_at_ns` to trust its mtime."""
        if st.st_mtime_ns >= hashed_at_ns - RACY_NS:
            self.entries.pop(rel, None)
        else:
            self.entries[rel] = {"algo": algo, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": digest}
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".runbook-verify.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump({"version": CACHE_VERSION, "files": self.entries}, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.changed = False


def hash_files(
    root: Path, jobs: list[tuple[Entry, os.stat_result]], workers: int, progress: Progress
) -> tuple[dict[str, str], set[str]]:
    """Digests of the jobs' files, computed in parallel; also the names of the workers that hashed."""
    total = sum(st.st_size for _, st in jobs)
    done = [0] * len(jobs)
    used: set[str] = set()

    def work(index: int, entry: Entry, st: os.stat_result) -> str:
        used.add(threading.current_thread().name)

        def count(n: int) -> None:
            done[index] += n

        assert entry.algo is not None
        return file_digest(root / entry.path, entry.algo, st.st_size, count)

    digests: dict[str, str] = {}
    t0 = last = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hash") as pool:
        futures = {pool.submit(work, i, e, st): e.path for i, (e, st) in enumerate(jobs)}
        pending = set(futures)
        while pending:
            finished, pending = concurrent.futures.wait(
                pending, timeout=PROGRESS_EVERY_S, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in finished:
                digests[futures[future]] = future.result()
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S or not pending:
                last = now
                progress(
                    {
                        "files_done": len(digests),
                        "files_total": len(jobs),
                        "bytes_done": sum(done),
                        "bytes_total": total,
                        "bytes_per_s": round(sum(done) / max(now - t0, 1e-9)),
                    }
                )
    return digests, used


# ----------------------------------------------------------------------------- verify


def local_files(root: Path) -> tuple[list[str], list[str]]:
    """(files outside `.cache/`, `*.incomplete` leftovers anywhere), as sorted relative paths."""
    files, incomplete = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if name.endswith(".incomplete"):
                incomplete.append(rel)
            elif not rel.startswith(".cache/"):
                files.append(rel)
    return sorted(files), sorted(incomplete)


def verify(
    root: Path, manifest: list[Entry], selected: list[Entry], workers: int, progress: Progress
) -> dict[str, Any]:
    """Check `selected` entries of the manifest against the files under `root`."""
    on_disk, incomplete = local_files(root)
    listed = {e.path for e in manifest}
    report: dict[str, Any] = {
        "files_expected": len(selected),
        "bytes_expected": sum(e.size or 0 for e in selected),
        "missing": [],
        "extra": [p for p in on_disk if p not in listed],
        "size_mismatch": [],
        "sha_mismatch": [],
        "bad_headers": [],
        "incomplete": incomplete,
        "digest_unknown": [],
    }
    cache = DigestCache(root)
    jobs: list[tuple[Entry, os.stat_result]] = []
    known: dict[str, str] = {}
    present = set(on_disk)
    for entry in selected:
        path = root / entry.path
        if entry.path not in present:
            report["missing"].append(entry.path)
            continue
        st = path.stat()
        if entry.path.endswith(".safetensors") and (why := header_problem(path)):
            report["bad_headers"].append({"path": entry.path, "reason": why})
        if entry.size is not None and st.st_size != entry.size:
            report["size_mismatch"].append({"path": entry.path, "expected": entry.size, "actual": st.st_size})
        elif entry.algo is None:
            report["digest_unknown"].append(entry.path)
        elif (hit := cache.get(entry.path, entry.algo, st)) is not None:
            known[entry.path] = hit
        else:
            jobs.append((entry, st))
    t0, started_ns = time.monotonic(), time.time_ns()
    digests, used = hash_files(root, jobs, workers, progress) if jobs else ({}, set())
    seconds = time.monotonic() - t0
    for entry, st in jobs:
        cache.put(entry.path, str(entry.algo), st, digests[entry.path], started_ns)
    cache.save()
    for entry in selected:
        actual = known.get(entry.path) or digests.get(entry.path)
        if actual is not None and actual != entry.digest:
            report["sha_mismatch"].append(
                {"path": entry.path, "algo": entry.algo, "expected": entry.digest, "actual": actual}
            )
    bytes_hashed = sum(st.st_size for _, st in jobs)
    report.update(
        files_checked=len(selected) - len(report["missing"]),
        hashed=len(jobs),
        cached=len(known),
        bytes_hashed=bytes_hashed,
        hash_seconds=round(seconds, 3),
        throughput_bytes_per_s=round(bytes_hashed / seconds) if jobs and seconds > 0 else None,
        workers=workers,
        workers_used=len(used),
    )
    return report


def bad_paths(report: dict[str, Any]) -> list[str]:
    """Files a repair must fetch again: missing, wrong size, wrong digest, bad header."""
    paths = set(report["missing"])
    for key in ("size_mismatch", "sha_mismatch", "bad_headers"):
        paths.update(item["path"] for item in report[key])
    return sorted(paths)


def repair(
    root: Path, repo: str, commit: str, report: dict[str, Any], repo_type: str = "model"
) -> tuple[list[str], dict[str, str]]:
    """Delete the bad files and every `*.incomplete` leftover; fetch the bad files again.

    Downloads pin the manifest's commit, so the repaired tree matches what was checked.
    """
    from huggingface_hub import hf_hub_download

    for rel in report["incomplete"]:
        (root / rel).unlink(missing_ok=True)
    repaired, errors = [], {}
    for rel in bad_paths(report):
        (root / rel).unlink(missing_ok=True)
        try:
            hf_hub_download(repo, rel, repo_type=repo_type, revision=commit, local_dir=root, force_download=True)
            repaired.append(rel)
        except Exception as exc:
            errors[rel] = f"{type(exc).__name__}: {exc}"
    return repaired, errors


def summary(report: dict[str, Any]) -> Iterable[str]:
    """One plain line per problem, for the output tail a failed gate shows."""
    for rel in report.get("missing", []):
        yield f"missing: {rel}"
    for item in report.get("size_mismatch", []):
        yield f"size mismatch: {item['path']} has {item['actual']} bytes, the Hub has {item['expected']}"
    for item in report.get("sha_mismatch", []):
        yield f"{item['algo']} mismatch: {item['path']} is {item['actual']}, the Hub has {item['expected']}"
    for item in report.get("bad_headers", []):
        yield f"bad safetensors header: {item['path']}: {item['reason']}"
    for rel in report.get("incomplete", []):
        yield f"incomplete download left over: {rel}"
    for rel, why in report.get("repair_errors", {}).items():
        yield f"repair failed: {rel}: {why}"


def run(config: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The whole check (and repair) for one config; the JSON document this program prints."""
    root = Path(config["local_dir"])
    workers = config.get("workers") or os.cpu_count() or 1
    out: dict[str, Any] = {"repo": config["repo"], "revision": config["revision"], "local_dir": str(root)}
    try:
        commit, manifest = read_manifest(config["repo"], config["revision"], config.get("repo_type") or "model")
    except Exception as exc:  # gated, not found, no network, no huggingface_hub: a fact, not a crash
        response = getattr(exc, "response", None)  # huggingface_hub's HfHubHTTPError has the Hub's answer
        refused = kit.hub_refused(getattr(response, "status_code", None), getattr(response, "headers", None))
        said = {"manifest_error": f"{type(exc).__name__}: {exc}", "failure_class": "AccessDenied" if refused else None}
        return {**out, "commit": None, **said}
    selected = select(manifest, config.get("include") or [], config.get("exclude") or [])
    report = verify(root, manifest, selected, workers, progress)
    if config.get("repair") and (bad_paths(report) or report["incomplete"]):
        repaired, errors = repair(root, config["repo"], commit, report, config.get("repo_type") or "model")
        report = verify(root, manifest, selected, workers, progress)
        report.update(repaired=repaired, repair_errors=errors)
    return {**out, "commit": commit, "manifest_error": None, **report}


def report(config: dict[str, Any]) -> dict[str, Any]:
    """The check of the shipped config, its problems summed up on stderr."""
    config["local_dir"] = os.path.abspath(kit.expand_path(config["local_dir"]))
    result = run(config, kit.progress)
    for line in summary(result):
        print(line, file=sys.stderr)
    return result


def main() -> int:
    return kit.main(report)
