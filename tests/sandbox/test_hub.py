"""The local Hub test double, driven by the REAL huggingface_hub client (subprocesses, as on a host), its `hf`
CLI, and plain urllib for Range and fault details."""

from __future__ import annotations

import hashlib
import http.client
import itertools
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.datasets import CUSTOM_FILENAME, SPEED_BENCH_FILENAME
from sandbox.hub import HubServer
from sandbox.model_configs import drafter_config, target_config
from sandbox.repos import DRAFTER_ID, SHARDS, SPEED_BENCH_ID, TARGET_ID, Repo, default_repos, target_repo

SHARD = f"model-00002-of-{SHARDS:05d}.safetensors"


def client_env(hub: HubServer, tmp_path: Path, token: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a client on the test host: no HF_* of the developer's, only the test Hub."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**base, **hub.client_env(tmp_path / "hf-home", token=token), **extra}


def python_client(
    hub: HubServer, tmp_path: Path, code: str, token: bool = False, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = client_env(hub, tmp_path, token, **extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def hf_cli(hub: HubServer, tmp_path: Path, *args: str, token: bool = False) -> subprocess.CompletedProcess[str]:
    env = client_env(hub, tmp_path, token)
    return subprocess.run(["hf", *args], env=env, capture_output=True, text=True, timeout=60)


def downloaded(root: Path) -> dict[str, bytes]:
    """Files under a --local-dir download, without the client's own `.cache/huggingface` bookkeeping."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] != ".cache"
    }


def git_blob_id(data: bytes) -> str:
    return (
        subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
        .stdout.decode()
        .strip()
    )


def safetensors_header(data: bytes) -> dict[str, dict[str, object]]:
    """Parse a safetensors header and check that its tensors tile the data exactly (independent reader)."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header.pop("__metadata__", None)
    spans = sorted(tuple(t["data_offsets"]) for t in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert spans[-1][1] == len(data) - 8 - length
    return dict(header)


def resolve_url(hub: HubServer, repo_id: str, path: str, rev: str = "main") -> str:
    prefix = "datasets/" if hub.repos[repo_id].repo_type == "dataset" else ""
    return f"{hub.endpoint}/{prefix}{repo_id}/resolve/{rev}/{path}"


# --- the repos ---------------------------------------------------------------------------------------------


def test_repos_are_small_valid_and_shaped_like_the_real_ones() -> None:
    repos = default_repos()
    assert sum(r.total_size for r in repos.values()) < 20 * 1024 * 1024
    drafter, target = repos[DRAFTER_ID], repos[TARGET_ID]
    assert {"config.json", "dflash.py", "README.md", "model.safetensors"} <= drafter.files.keys()
    shards = sorted(p for p in target.files if p.endswith(".safetensors"))
    assert shards == [f"model-{i:05d}-of-{SHARDS:05d}.safetensors" for i in range(1, SHARDS + 1)]
    index = json.loads(target.files["model.safetensors.index.json"].content)
    weight_map: dict[str, str] = {}
    total = 0
    for repo, path in [(drafter, "model.safetensors"), *((target, s) for s in shards)]:
        header = safetensors_header(repo.files[path].content)
        if repo is target:
            weight_map |= dict.fromkeys(header, path)
            total += len(repo.files[path].content) - 8 - struct.unpack("<Q", repo.files[path].content[:8])[0]
    assert index["weight_map"] == weight_map and index["metadata"]["total_size"] == total
    lfs = {f.path for r in repos.values() for f in r.lfs_files}
    assert lfs == {"model.safetensors", *shards, "tiktoken.model", SPEED_BENCH_FILENAME, CUSTOM_FILENAME}
    assert all(re.fullmatch(r"[0-9a-f]{40}", r.sha) for r in repos.values())
    assert target_repo.__wrapped__().sha == target.sha  # built again: the same commit, byte for byte
    assert json.loads(drafter.files["config.json"].content) == drafter_config()
    assert json.loads(target.files["config.json"].content) == target_config()


# --- the real client against it ----------------------------------------------------------------------------


def test_snapshot_download_gives_both_repos_byte_for_byte(hub: HubServer, tmp_path: Path) -> None:
    result = python_client(
        hub,
        tmp_path,
        f"""
from huggingface_hub import snapshot_download
for repo, out in [({DRAFTER_ID!r}, 'drafter'), ({TARGET_ID!r}, 'target')]:
    snapshot_download(repo, local_dir={str(tmp_path)!r} + '/' + out)
""",
    )
    assert result.returncode == 0, result.stderr
    assert downloaded(tmp_path / "drafter") == hub.repos[DRAFTER_ID].contents
    assert downloaded(tmp_path / "target") == hub.repos[TARGET_ID].contents
    lfs_count = sum(len(hub.repos[r].lfs_files) for r in (DRAFTER_ID, TARGET_ID))  # the two downloaded
    assert hub.requests.count(kind="cdn", method="GET") == lfs_count  # LFS bytes come from the "CDN" origin


def test_snapshot_download_filters_and_pins_a_commit(hub: HubServer, tmp_path: Path) -> None:
    target = hub.repos[TARGET_ID]
    result = python_client(
        hub,
        tmp_path,
        f"""
from huggingface_hub import snapshot_download
snapshot_download({TARGET_ID!r}, revision={target.sha!r}, local_dir={str(tmp_path / "out")!r},
                  allow_patterns=['*.json', 'figures/*'], ignore_patterns=['generation_config.json'],
                  token={hub.token!r})
""",
    )
    assert result.returncode == 0, result.stderr
    wanted = {"config.json", "model.safetensors.index.json", "tokenizer_config.json", "figures/kimi-logo.png"}
    assert downloaded(tmp_path / "out") == {p: target.files[p].content for p in wanted}
    assert all(r.authorized for r in hub.requests.entries(TARGET_ID))


def test_hf_cli_downloads_with_include_and_revision(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "drafter"
    args = ["download", DRAFTER_ID, "--local-dir", str(out), "--include", "*.safetensors", "--include", "*.json"]
    result = hf_cli(hub, tmp_path, *args, "--revision", "main")
    assert result.returncode == 0, result.stderr
    drafter = hub.repos[DRAFTER_ID]
    assert downloaded(out) == {p: drafter.files[p].content for p in ("config.json", "model.safetensors")}


def test_model_info_reports_sizes_blob_ids_and_lfs_sha256(hub: HubServer) -> None:
    api = HfApi(endpoint=hub.endpoint, token=False)
    for repo in hub.repos.values():
        info = api.repo_info(repo.repo_id, repo_type=repo.repo_type, revision="main", files_metadata=True)
        assert info.sha == repo.sha and info.gated is False
        assert info.siblings is not None
        siblings = {s.rfilename: s for s in info.siblings}
        assert siblings.keys() == repo.files.keys()
        for path, data in repo.contents.items():
            sibling = siblings[path]
            assert sibling.size == len(data)
            if sibling.lfs is None:
                assert sibling.blob_id == git_blob_id(data)
            else:
                assert sibling.lfs.sha256 == hashlib.sha256(data).hexdigest() and sibling.lfs.size == len(data)
    plain = api.model_info(TARGET_ID, revision=hub.repos[TARGET_ID].sha)
    assert plain.siblings and all(s.size is None for s in plain.siblings)
    assert api.model_info(TARGET_ID, expand=["usedStorage"]).used_storage == hub.repos[TARGET_ID].total_size


def test_list_repo_tree_follows_pagination(hub: HubServer) -> None:
    hub.page_size = 3
    target = hub.repos[TARGET_ID]
    api = HfApi(endpoint=hub.endpoint, token=False)
    entries = {e.path: e for e in api.list_repo_tree(TARGET_ID, recursive=True)}
    assert entries.keys() == {*target.files, "figures"}
    assert hub.requests.count(TARGET_ID, kind="api") == -(-len(entries) // 3)
    shard, folder = entries[SHARD], entries["figures"]
    assert isinstance(shard, RepoFile) and shard.lfs is not None and shard.lfs.sha256 == target.files[SHARD].sha256
    assert isinstance(folder, RepoFolder)
    top = {e.path for e in api.list_repo_tree(TARGET_ID)}
    assert "figures" in top and "figures/kimi-logo.png" not in top


def test_resolve_headers_are_the_hubs(hub: HubServer) -> None:
    """HEAD without following redirects: what the client reads its metadata from."""
    target = hub.repos[TARGET_ID]
    connection = http.client.HTTPConnection("127.0.0.1", int(hub.endpoint.rsplit(":", 1)[1]), timeout=10)
    for path in ("config.json", SHARD):
        connection.request("HEAD", f"/{TARGET_ID}/resolve/main/{path}")
        answer = connection.getresponse()
        answer.read()
        f = target.files[path]
        assert answer.headers["X-Repo-Commit"] == target.sha
        assert not [h for h in answer.headers if h.lower().startswith("x-xet")]
        if f.lfs:
            assert answer.status == 302 and answer.headers["Location"].startswith(hub.cdn_endpoint + "/")
            assert answer.headers["X-Linked-Etag"] == f'"{hashlib.sha256(f.content).hexdigest()}"'
            assert answer.headers["X-Linked-Size"] == str(len(f.content))
        else:
            assert answer.status == 200 and answer.headers["ETag"] == f'"{git_blob_id(f.content)}"'
            assert answer.headers["Content-Length"] == str(len(f.content))
    connection.close()


def test_errors_map_to_the_clients_exceptions(hub: HubServer, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("nobody/nothing")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(TARGET_ID, revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(TARGET_ID, "missing.bin", endpoint=hub.endpoint, token=False, cache_dir=tmp_path)
    with pytest.raises(HfHubHTTPError, match="Invalid credentials"):
        HfApi(endpoint=hub.endpoint, token="hf_" + "x" * 34).model_info(TARGET_ID)


def test_a_dataset_repo_is_served_under_the_dataset_paths_only(hub: HubServer, tmp_path: Path) -> None:
    """The real `hf download --repo-type dataset` fetches the SPEED-Bench stand-in byte for byte, its LFS files
    through the CDN; asked for as a model (the paths without `datasets/`), the Hub has no such repo."""
    dataset = hub.repos[SPEED_BENCH_ID]
    out = tmp_path / "speed-bench"
    result = hf_cli(hub, tmp_path, "download", SPEED_BENCH_ID, "--repo-type", "dataset", "--local-dir", str(out))
    assert result.returncode == 0, result.stderr
    assert downloaded(out) == dataset.contents
    assert hub.requests.count(SPEED_BENCH_ID, kind="cdn", method="GET") == len(dataset.lfs_files) == 2
    api = HfApi(endpoint=hub.endpoint, token=False)
    assert api.dataset_info(SPEED_BENCH_ID, files_metadata=True).sha == dataset.sha
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(SPEED_BENCH_ID)
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info(TARGET_ID)


# --- Range requests ----------------------------------------------------------------------------------------

_REPOS: dict[str, Repo] = default_repos()
_FILES = [(repo_id, path) for repo_id, repo in _REPOS.items() for path in repo.files]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    file=st.sampled_from(_FILES),
    first=st.integers(0, 2_000_000) | st.none(),
    length=st.integers(0, 2_000_000) | st.none(),
)
def test_range_requests_answer_206_with_the_slice(
    hub: HubServer, file: tuple[str, str], first: int | None, length: int | None
) -> None:
    """bytes=a-b, bytes=a- and bytes=-n on small files (served by the Hub) and LFS ones (through the CDN)."""
    content = hub.repos[file[0]].files[file[1]].content
    size = len(content)
    if first is None:
        spec, want = f"bytes=-{length or 0}", content[-length:] if length else b""
        start = size - len(want)
    else:
        last = None if length is None else first + length
        spec = f"bytes={first}-{'' if last is None else last}"
        want, start = content[first : None if last is None else last + 1], first
    request = urllib.request.Request(resolve_url(hub, *file), headers={"Range": spec})
    if not want:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 416 and refused.value.headers["Content-Range"] == f"bytes */{size}"
        return
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 206 and answer.read() == want
        assert answer.headers["Content-Range"] == f"bytes {start}-{start + len(want) - 1}/{size}"


def test_plain_http_resumes_a_truncated_transfer_with_range(hub: HubServer) -> None:
    content = hub.repos[TARGET_ID].files[SHARD].content
    hub.faults.truncate(TARGET_ID, SHARD, after_bytes=1000)
    with (
        pytest.raises(http.client.IncompleteRead) as cut,
        urllib.request.urlopen(resolve_url(hub, TARGET_ID, SHARD), timeout=10) as answer,
    ):
        assert answer.headers["Content-Length"] == str(len(content))
        answer.read()
    partial = cut.value.partial
    assert partial == content[:1000]
    request = urllib.request.Request(resolve_url(hub, TARGET_ID, SHARD), headers={"Range": f"bytes={len(partial)}-"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 206 and partial + answer.read() == content


# --- fault switches, seen by the real client ---------------------------------------------------------------


def test_5xx_on_the_metadata_call_is_retried_by_the_client(hub: HubServer, tmp_path: Path) -> None:
    hub.faults.fail(TARGET_ID, "config.json", status=503, times=2)
    result = python_client(
        hub,
        tmp_path,
        f"""
from huggingface_hub import hf_hub_download
hf_hub_download({TARGET_ID!r}, 'config.json', local_dir={str(tmp_path / "out")!r})
""",
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out/config.json").read_bytes() == hub.repos[TARGET_ID].files["config.json"].content
    heads = [r.status for r in hub.requests.entries(TARGET_ID, "config.json", method="HEAD")]
    assert heads == [503, 503, 200]


def test_5xx_on_the_transfer_fails_the_attempt_and_the_next_succeeds(hub: HubServer, tmp_path: Path) -> None:
    hub.faults.fail(DRAFTER_ID, "model.safetensors", status=502, method="GET")
    args = ["download", DRAFTER_ID, "model.safetensors", "--local-dir", str(tmp_path / "out")]
    failed = hf_cli(hub, tmp_path, *args)
    assert failed.returncode != 0 and "502" in failed.stdout + failed.stderr
    assert hf_cli(hub, tmp_path, *args).returncode == 0
    content = hub.repos[DRAFTER_ID].files["model.safetensors"].content
    assert (tmp_path / "out/model.safetensors").read_bytes() == content


def test_truncated_body_is_resumed_by_the_client_with_range(hub: HubServer, tmp_path: Path) -> None:
    hub.faults.truncate(TARGET_ID, SHARD)
    result = python_client(
        hub,
        tmp_path,
        f"""
from huggingface_hub import hf_hub_download
hf_hub_download({TARGET_ID!r}, {SHARD!r}, local_dir={str(tmp_path / "out")!r})
""",
    )
    assert result.returncode == 0, result.stderr
    content = hub.repos[TARGET_ID].files[SHARD].content
    assert (tmp_path / "out" / SHARD).read_bytes() == content
    assert "Trying to resume download" in result.stderr
    # the client resumes from the whole 10 MiB chunks it wrote: none yet for a file this small, so no Range
    gets = [(r.range, r.status) for r in hub.requests.entries(TARGET_ID, SHARD, method="GET", kind="cdn")]
    assert gets == [(None, 200), (None, 200)]


def test_wrong_bytes_pass_the_clients_size_check_but_not_sha256(hub: HubServer, tmp_path: Path) -> None:
    manifest = hub.repos[DRAFTER_ID].files["model.safetensors"]
    hub.faults.corrupt(DRAFTER_ID, "model.safetensors")
    result = python_client(
        hub,
        tmp_path,
        f"""
from huggingface_hub import snapshot_download
snapshot_download({DRAFTER_ID!r}, local_dir={str(tmp_path / "out")!r})
""",
    )
    assert result.returncode == 0, result.stderr  # the client only checks sizes
    data = (tmp_path / "out/model.safetensors").read_bytes()
    assert len(data) == manifest.size and hashlib.sha256(data).hexdigest() != manifest.sha256
    assert safetensors_header(data) == safetensors_header(manifest.content)  # a header check cannot see it
    with urllib.request.urlopen(resolve_url(hub, DRAFTER_ID, "model.safetensors"), timeout=10) as answer:
        assert hashlib.sha256(answer.read()).hexdigest() == manifest.sha256  # used up: the next fetch is right


def test_gated_repo_needs_the_token(hub: HubServer, tmp_path: Path) -> None:
    hub.faults.gate(TARGET_ID)
    api = HfApi(endpoint=hub.endpoint, token=False)
    assert api.model_info(TARGET_ID).gated == "manual"  # like the Hub: metadata stays public
    with pytest.raises(GatedRepoError):
        hf_hub_download(TARGET_ID, "config.json", endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
    args = ["download", TARGET_ID, "config.json", "--local-dir", str(tmp_path / "out")]
    refused = hf_cli(hub, tmp_path, *args)
    assert refused.returncode != 0 and "requires approval" in refused.stdout + refused.stderr
    assert not (tmp_path / "out/config.json").exists()
    assert hf_cli(hub, tmp_path, *args, token=True).returncode == 0
    assert (tmp_path / "out/config.json").read_bytes() == hub.repos[TARGET_ID].files["config.json"].content


def test_stalled_transfer_is_cut_by_the_client_timeout_and_resumed(hub: HubServer, tmp_path: Path) -> None:
    hub.faults.stall(DRAFTER_ID, "model.safetensors", hold_s=30)
    started = time.monotonic()
    result = python_client(
        hub,
        tmp_path,
        f"""
from huggingface_hub import hf_hub_download
hf_hub_download({DRAFTER_ID!r}, 'model.safetensors', local_dir={str(tmp_path / "out")!r})
""",
        HF_HUB_DOWNLOAD_TIMEOUT="2",
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 2
    assert "Trying to resume download" in result.stderr
    content = hub.repos[DRAFTER_ID].files["model.safetensors"].content
    assert (tmp_path / "out/model.safetensors").read_bytes() == content
    assert hub.requests.count(DRAFTER_ID, "model.safetensors", method="GET") == 2


def test_a_stall_ends_by_itself_and_at_shutdown(tmp_path: Path) -> None:
    with HubServer() as hub:
        hub.faults.stall(DRAFTER_ID, "config.json", hold_s=0.3)
        started = time.monotonic()
        with (
            pytest.raises(http.client.IncompleteRead),
            urllib.request.urlopen(resolve_url(hub, DRAFTER_ID, "config.json"), timeout=10) as answer,
        ):
            answer.read()
        assert 0.3 <= time.monotonic() - started < 5
        hub.faults.stall(DRAFTER_ID, "config.json", hold_s=60)
        errors: list[BaseException] = []

        def read() -> None:
            try:
                with urllib.request.urlopen(resolve_url(hub, DRAFTER_ID, "config.json"), timeout=30) as answer:
                    answer.read()
            except (http.client.IncompleteRead, OSError) as exc:
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 10
        while hub.requests.count(DRAFTER_ID, "config.json", method="GET") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    reader.join(timeout=5)
    assert not reader.is_alive() and len(errors) == 1
