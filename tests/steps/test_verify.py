"""The `verify` kind: the host program's checks on local trees, then whole runs through the real
sshd against the local Hub test double, downloaded by the real huggingface_hub client."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.cli import main
from executor.stepkind import PROGRESS_PREFIX
from hostprograms.verify import Entry, header_problem, safetensors_problem, verify
from sandbox.hub import HubServer
from sandbox.repos import DRAFTER_ID, TARGET_ID, Repo, build_repo, safetensors_bytes, target_repo
from steps.verify import VerifyStep, progress_sink
from tests.conftest import SandboxHost

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


# ----------------------------------------------------------------------------- runs through sshd and the Hub


def hf_download(hub: HubServer, host: SandboxHost, repo_id: str, local_dir: Path, hf_home: Path) -> None:
    """Download with the real client of the test host (its SGLang virtualenv), as the download step does."""
    code = "import sys, huggingface_hub as h; h.snapshot_download(sys.argv[1], local_dir=sys.argv[2])"
    env = {**os.environ, **hub.client_env(hf_home)}
    subprocess.run([str(host.python), "-c", code, repo_id, str(local_dir)], check=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def pristine(testhost: Callable[..., SandboxHost], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each repo downloaded once; tests verify copies. The repos are deterministic, so this Hub test
    double serves the same bytes (and commit) as each test's own `hub`."""
    root = tmp_path_factory.mktemp("pristine")
    trees = {}
    with HubServer() as server:
        for repo_id in (DRAFTER_ID, TARGET_ID):
            trees[repo_id] = root / repo_id.replace("/", "--")
            hf_download(server, testhost("h200"), repo_id, trees[repo_id], root / "hf-home")
    return trees


@pytest.fixture
def tree(pristine: dict[str, Path], tmp_path: Path) -> Path:
    target = tmp_path / "models" / "Kimi-K2.6"
    shutil.copytree(pristine[TARGET_ID], target)
    backdate(target)
    return target


Run = Callable[..., tuple[int, str, dict[str, Any] | None]]


@pytest.fixture
def run_verify(
    write_runbook: Any,
    hub: HubServer,
    testhost: Callable[..., SandboxHost],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Run:
    """Run a one-step verify runbook on the test host through the CLI: (exit code, stderr, facts if it passed).

    The step names no interpreter: `python3` on the test host's PATH is its SGLang virtualenv's.
    """
    host = testhost("h200")
    monkeypatch.setenv("VERIFY_TEST_HF_TOKEN", hub.token)
    runs = itertools.count()

    def run(local_dir: Path, repo: str = TARGET_ID, **params: Any) -> tuple[int, str, dict[str, Any] | None]:
        step = {"id": "verify", "kind": "verify", "repo": repo, "local_dir": str(local_dir), **params}
        body = (
            "name: verify\n__HOSTS__\n"
            f"vars: {json.dumps(hub.client_env(tmp_path / 'hf-home'))}\n"
            "secrets:\n  HF_TOKEN: {env: VERIFY_TEST_HF_TOKEN}\n"
            f"steps:\n  - {json.dumps(step)}\n"
        )
        path = write_runbook(body, hosts=host.host_yaml())
        log_dir = tmp_path / f"logs-{next(runs)}"
        code = main(["run", str(path), "--log-dir", str(log_dir)])
        err = capsys.readouterr().err
        assert main(["status", "--log-dir", str(log_dir), "--json"]) == 0
        (record,) = json.loads(capsys.readouterr().out)["steps"]
        return code, err, record["facts"]

    return run


def test_downloaded_tree_verifies_clean_then_from_cache(run_verify: Run, hub: HubServer, tree: Path) -> None:
    repo = hub.repos[TARGET_ID]
    code, err, facts = run_verify(tree)
    assert code == 0, err
    assert facts is not None
    assert facts["commit"] == repo.sha and facts["local_dir"] == str(tree)
    assert (facts["files_expected"], facts["files_checked"], facts["hashed"]) == (len(repo.files),) * 3
    assert facts["bytes_hashed"] == repo.total_size and facts["throughput_bytes_per_s"] > 0
    assert facts["workers"] == os.cpu_count() and facts["extra"] == []

    code, err, facts = run_verify(tree)
    assert code == 0, err
    assert facts is not None and (facts["hashed"], facts["cached"]) == (0, len(repo.files))


def test_corrupt_byte_fails_naming_the_file(run_verify: Run, hub: HubServer, tree: Path) -> None:
    flip_byte(tree / SHARD, -100)  # in the data: the header stays valid
    code, err, _ = run_verify(tree)
    assert code == 1
    assert "file contents differ from the Hub's (digest mismatch)" in err
    assert f"sha256 mismatch: {SHARD}" in err


def test_truncated_shard_fails_with_size_and_header(run_verify: Run, hub: HubServer, tree: Path) -> None:
    os.truncate(tree / SHARD, (tree / SHARD).stat().st_size // 2)
    code, err, _ = run_verify(tree)
    assert code == 1
    assert "files differ in size from the Hub's manifest" in err
    assert f"size mismatch: {SHARD}" in err and f"bad safetensors header: {SHARD}" in err


def test_incomplete_leftover_and_missing_file_fail_extra_does_not(run_verify: Run, hub: HubServer, tree: Path) -> None:
    (tree / "notes.txt").write_text("an extra file is reported, not a failure")
    code, err, facts = run_verify(tree)
    assert code == 0, err
    assert facts is not None and facts["extra"] == ["notes.txt"]

    (tree / "x.incomplete").write_bytes(b"partial")
    code, err, _ = run_verify(tree)
    assert code == 1 and "*.incomplete leftovers" in err and "incomplete download left over: x.incomplete" in err

    (tree / "x.incomplete").unlink()
    (tree / "tiktoken.model").unlink()
    code, err, _ = run_verify(tree)
    assert code == 1 and "missing from local_dir" in err and "missing: tiktoken.model" in err


def test_include_exclude_select_like_the_download(run_verify: Run, hub: HubServer, tree: Path) -> None:
    (tree / "tiktoken.model").unlink()
    params = {"include": ["*.safetensors", "*.json"], "exclude": ["model-00004*"]}
    code, err, facts = run_verify(tree, **params)
    assert code == 0, err
    assert facts is not None and facts["files_expected"] == 3 + 4  # three shards; config, generation, index, tokenizer

    code, err, _ = run_verify(tree, include=["*.gguf"])
    assert code == 1 and "nothing was verified" in err


def test_progress_lines_become_progress_events() -> None:
    """The host program's progress on stderr, however the stream splits it, reaches ctx.progress."""
    seen: list[tuple[str, dict[str, Any]]] = []

    class Ctx:
        def progress(self, message: str, **fields: Any) -> None:
            seen.append((message, fields))

    sink = progress_sink(Ctx())  # type: ignore[arg-type]  # only progress() is used
    fields = {"files_done": 1, "files_total": 4, "bytes_done": 3 << 30, "bytes_total": 12 << 30, "bytes_per_s": 1 << 30}
    line = PROGRESS_PREFIX + f"{json.dumps(fields)}\n".encode()
    sink("stdout", line)
    sink("stderr", b"a warning\n" + line[:10])
    sink("stderr", line[10:] + b"runbook-progress {broken\n")
    assert seen == [("hashed 1/4 files, 3.0/12.0 GiB at 1.00 GiB/s", fields)]


def test_repair_fetches_the_bad_file_again(run_verify: Run, hub: HubServer, tree: Path) -> None:
    flip_byte(tree / SHARD, 5000)  # in the header
    (tree / "config.json").unlink()
    code, err, facts = run_verify(tree, repair=True)
    assert code == 0, err
    assert facts is not None and facts["repaired"] == ["config.json", SHARD] and facts["repair_errors"] == {}
    assert (tree / SHARD).read_bytes() == hub.repos[TARGET_ID].files[SHARD].content


def test_wrong_bytes_from_the_hub_are_caught(
    run_verify: Run, hub: HubServer, testhost: Callable[..., SandboxHost], tmp_path: Path
) -> None:
    """The client accepts a file of the right size; verify's sha256 does not."""
    hub.faults.corrupt(DRAFTER_ID, "model.safetensors")
    local = tmp_path / "models" / "drafter"
    hf_download(hub, testhost("h200"), DRAFTER_ID, local, tmp_path / "hf-home")
    code, err, _ = run_verify(local, repo=DRAFTER_ID)
    assert code == 1 and "sha256 mismatch: model.safetensors" in err

    hub.faults.corrupt(DRAFTER_ID, "model.safetensors")  # the Hub still serves bad bytes: repair cannot help
    code, err, _ = run_verify(local, repo=DRAFTER_ID, repair=True)
    assert code == 1 and "sha256 mismatch: model.safetensors" in err
    assert hub.requests.count(DRAFTER_ID, "model.safetensors", method="GET", kind="cdn") == 2


def test_unreadable_manifest_is_a_named_gate_failure(run_verify: Run, hub: HubServer, tmp_path: Path) -> None:
    code, err, _ = run_verify(tmp_path, repo="nobody/nothing")
    assert code == 1
    assert "could not read the Hub's manifest" in err and "RepositoryNotFoundError" in err
    assert hub.token not in err


def test_render_ships_the_program_with_every_parameter_as_data() -> None:
    step = VerifyStep(id="v", repo="a/b", local_dir="/models/it's here", python="/opt/venv/bin/python", workers=4)
    script = step.render(None)  # type: ignore[arg-type]  # render reads no context
    assert script.startswith("# hostprograms/verify.py with the kit, zip sha256:")
    assert '"local_dir": "/models/it\'s here"' in script and '"workers": 4' in script
    assert script.endswith('/opt/venv/bin/python "$prog/program.pyz" "$prog/config.json"\n')
