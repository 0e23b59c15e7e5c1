"""hostprograms/verify.py on a local tree: safetensors headers (malformed, truncated), digests and their cache,
missing, extra and incomplete files, the hashing pool."""

from __future__ import annotations

import io
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostprograms.verify import Entry, header_problem, safetensors_problem, verify
from sandbox.repos import Repo, build_repo, safetensors_bytes, target_repo

SHARD = "model-00002-of-00004.safetensors"


def manifest_of(repo: Repo) -> list[Entry]:
    """What read_manifest makes of the Hub's answer for `repo`."""
    return [
        Entry(f.path, f.size, "sha256", f.sha256) if f.lfs else Entry(f.path, f.size, "git-sha1", f.blob_id)
        for f in repo.files.values()
    ]


def backdate(root: Path, seconds: int = 60) -> None:
    """Files written a while ago, as a finished download's are: the cache trusts only such mtimes."""
    then = time.time_ns() - seconds * 1_000_000_000
    for path in root.rglob("*"):
        os.utime(path, ns=(then, then))


def write_tree(root: Path, repo: Repo) -> None:
    for path, content in repo.contents.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    backdate(root)


def check(root: Path, repo: Repo, workers: int = 2) -> dict[str, Any]:
    manifest = manifest_of(repo)
    return verify(root, manifest, manifest, workers, lambda fields: None)


def paths(items: list[dict[str, Any]]) -> list[str]:
    return [item["path"] for item in items]


def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- safetensors header


def test_valid_safetensors_pass_the_header_check(tmp_path: Path) -> None:
    write_tree(tmp_path, target_repo())
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) == 4
    assert [header_problem(p) for p in shards] == [None] * 4


def test_truncation_is_caught_by_the_header_alone(tmp_path: Path) -> None:
    """A shard cut short: the header check sees it without the manifest; verify also names the size."""
    write_tree(tmp_path, target_repo())
    shard = tmp_path / SHARD
    size = shard.stat().st_size
    os.truncate(shard, size - 1000)
    problem = header_problem(shard)
    assert problem is not None and f"the file has {size - 1000}" in problem
    report = check(tmp_path, target_repo())
    assert report["size_mismatch"] == [{"path": SHARD, "expected": size, "actual": size - 1000}]
    assert paths(report["bad_headers"]) == [SHARD]
    assert report["sha_mismatch"] == []  # a file of the wrong size is not worth hashing


def framed(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors-like file: 8-byte LE length (of `header`, unless given), header, data."""
    return struct.pack("<Q", len(header) if length is None else length) + header + data


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x00", "shorter than the 8-byte header length"),
        (framed(b"{}", length=1 << 40), "not plausible"),
        (framed(b"{}", length=64), "runs past the end"),
        (framed(b"{x}]"), "not valid JSON"),
        (framed(b"[" * 200_000), "not valid JSON"),
        (framed(b"[]"), "not an object"),
        (framed(b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', bytes(4)), "needs 8 bytes"),
        (framed(b'{"t":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', bytes(3)), "hole or overlap"),
        (framed(b'{"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}'), "non-negative"),
        (framed(b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}}'), "0 <= begin <= end"),
        (framed(b'{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', bytes(3)), "but the file has"),
        (framed(b'{"__metadata__":{"a":1}}'), "__metadata__"),
    ],
)
def test_malformed_headers_are_named(data: bytes, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    problem = header_problem(path)
    assert problem is not None and reason in problem


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
tensor_entries = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from(["F32", "BF16", "I32", "F4", "NOPE", 7]),
        "shape": st.lists(st.integers(-2, 6), max_size=3) | json_values,
        "data_offsets": st.lists(st.integers(-2, 200), min_size=0, max_size=3) | json_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=st.dictionaries(st.text(max_size=6), tensor_entries | json_values, max_size=4) | json_values,
    declared=st.none() | st.integers(0, 2**64 - 1),
    tail=st.binary(max_size=64),
    cut=st.integers(0, 400),
)
def test_header_checker_never_crashes(header: Any, declared: int | None, tail: bytes, cut: int) -> None:
    """Arbitrary headers, lengths and truncations: a reason or None, never an exception."""
    text = json.dumps(header).encode()
    data = (struct.pack("<Q", len(text) if declared is None else declared) + text + tail)[:cut]
    result = safetensors_problem(io.BytesIO(data), len(data))
    assert result is None or isinstance(result, str)


dtypes = st.sampled_from(["BF16", "F16", "F32", "I32", "U8"])
tensors = st.dictionaries(
    st.text("abcdefgh.", min_size=1, max_size=8).filter(lambda s: s != "__metadata__"),
    st.tuples(dtypes, st.lists(st.integers(0, 5), max_size=3)),
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(tensors=tensors, cut=st.integers(1, 10_000))
def test_valid_files_pass_and_every_truncation_fails(tensors: dict[str, tuple[str, list[int]]], cut: int) -> None:
    data = safetensors_bytes(tensors, "seed")
    assert safetensors_problem(io.BytesIO(data), len(data)) is None
    short = data[: max(len(data) - cut, 0)]
    assert safetensors_problem(io.BytesIO(short), len(short)) is not None


# ----------------------------------------------------------------------------- verify on a local tree


def test_clean_tree_then_cached_then_touched_file_rehashed(tmp_path: Path) -> None:
    repo = target_repo()
    write_tree(tmp_path, repo)
    first = check(tmp_path, repo)
    problems = ("missing", "size_mismatch", "sha_mismatch", "bad_headers", "incomplete", "extra", "digest_unknown")
    assert [key for key in problems if first[key]] == []
    assert (first["hashed"], first["cached"]) == (len(repo.files), 0)
    assert first["bytes_hashed"] == repo.total_size
    assert (tmp_path / ".cache" / "runbook-verify.json").is_file()

    second = check(tmp_path, repo)
    assert (second["hashed"], second["cached"], second["bytes_hashed"]) == (0, len(repo.files), 0)
    assert second["throughput_bytes_per_s"] is None

    st_ = (tmp_path / SHARD).stat()
    os.utime(tmp_path / SHARD, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000))  # `touch`: same bytes
    third = check(tmp_path, repo)
    assert (third["hashed"], third["cached"]) == (1, len(repo.files) - 1)
    assert third["bytes_hashed"] == st_.st_size and third["sha_mismatch"] == []
    assert check(tmp_path, repo)["cached"] == len(repo.files)


def test_a_file_written_just_before_hashing_is_not_trusted_from_the_cache(tmp_path: Path) -> None:
    """Racy mtimes: a change within the same timestamp tick would keep size and mtime."""
    repo = target_repo()
    write_tree(tmp_path, repo)
    (tmp_path / SHARD).write_bytes(repo.files[SHARD].content)  # mtime: now
    check(tmp_path, repo)
    report = check(tmp_path, repo)
    assert (report["hashed"], report["cached"]) == (1, len(repo.files) - 1)


def test_cache_is_of_digests_so_a_changed_file_is_caught(tmp_path: Path) -> None:
    repo = target_repo()
    write_tree(tmp_path, repo)
    check(tmp_path, repo)
    flip_byte(tmp_path / SHARD)  # same size, new mtime: the cached digest no longer applies
    flip_byte(tmp_path / "config.json", 3)  # small files are checked by their git blob id
    report = check(tmp_path, repo)
    assert paths(report["sha_mismatch"]) == ["config.json", SHARD]
    assert {m["algo"] for m in report["sha_mismatch"]} == {"sha256", "git-sha1"}
    assert report["bad_headers"] == []  # same size, valid header: only hashing notices


def test_missing_extra_and_incomplete(tmp_path: Path) -> None:
    repo = target_repo()
    write_tree(tmp_path, repo)
    (tmp_path / "tiktoken.model").unlink()
    (tmp_path / "notes.txt").write_text("mine")
    download_cache = tmp_path / ".cache" / "huggingface" / "download"
    download_cache.mkdir(parents=True)
    (download_cache / "abc.incomplete").write_bytes(b"partial")
    (tmp_path / "x.incomplete").write_bytes(b"partial")
    report = check(tmp_path, repo)
    assert report["missing"] == ["tiktoken.model"]
    assert report["extra"] == ["notes.txt"]
    assert report["incomplete"] == [".cache/huggingface/download/abc.incomplete", "x.incomplete"]
    assert report["files_checked"] == len(repo.files) - 1


def test_hashing_runs_on_several_workers(tmp_path: Path) -> None:
    repo = build_repo("t/big", {f"shard-{i}.bin": os.urandom(16 << 20) for i in range(4)})
    write_tree(tmp_path, repo)
    report = check(tmp_path, repo, workers=3)
    assert report["workers"] == 3 and report["workers_used"] >= 2
    assert report["sha_mismatch"] == [] and report["hashed"] == len(repo.files)


def test_a_shape_too_large_for_a_float_is_a_problem_not_a_traceback() -> None:
    """A corrupt header's shape can multiply past a float's range: the message must still be written."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [10**200, 10**200], "data_offsets": [0, 0]}}).encode()
    data = struct.pack("<Q", len(header)) + header
    problem = safetensors_problem(io.BytesIO(data), len(data))
    assert problem is not None and problem.startswith("tensor 'w': F32[") and problem.endswith("data_offsets give 0")
