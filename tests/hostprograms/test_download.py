"""hostprograms/download.py on its own: huggingface_hub's include/exclude matching, what a folder holds of a
manifest, and the HTTP method resuming a file cut short (against the local Hub)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from huggingface_hub.utils import filter_repo_objects
from hypothesis import given
from hypothesis import strategies as st

from hostprograms import download
from hostprograms.download import compare, fetch, selected
from sandbox.hub import HubServer
from sandbox.repos import TARGET_ID

SHARD = "model-00002-of-00004.safetensors"


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    }


@given(
    st.text(alphabet="ab/.*?[]!\\", max_size=8),
    st.lists(st.text(alphabet="ab/.*?[]!\\", max_size=6), max_size=3),
    st.lists(st.text(alphabet="ab/.*?[]!\\", max_size=6), max_size=3),
)
def test_patterns_select_what_huggingface_hub_selects(path: str, include: list[str], exclude: list[str]) -> None:
    """The HTTP method and the checks must agree with `hf download --include/--exclude` on every file."""
    expected = bool(list(filter_repo_objects([path], allow_patterns=include or None, ignore_patterns=exclude or None)))
    assert selected(path, include, exclude) == expected


def test_compare_tells_each_file_state_and_removes_leftovers_only_when_complete(tmp_path: Path) -> None:
    manifest = [{"path": name, "size": 4} for name in ("a", "d/b", "c", "e", "f")]
    (tmp_path / "d").mkdir()
    (tmp_path / "a").write_bytes(b"1234")
    (tmp_path / "d" / "b").write_bytes(b"12")
    (tmp_path / "c.incomplete").write_bytes(b"1")
    (tmp_path / "f").write_bytes(b"123456")
    stale = tmp_path / ".cache" / "huggingface" / "download" / "Xy.0123abcd.1a2b3c4d.incomplete"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half a shard")
    report = compare(tmp_path, manifest)
    assert [(f["path"], f["state"], f["have"]) for f in report["incomplete"]] == [
        ("d/b", "short", 2),
        ("c", "partial", 1),
        ("e", "missing", 0),
        ("f", "long", 6),
    ]
    assert (report["complete_files"], report["complete_bytes"], report["partial_bytes"]) == (1, 4, 2 + 1 + 4)
    assert report["leftovers"] == [str(stale.relative_to(tmp_path))] and report["removed"] == []
    assert stale.exists()

    for name in ("d/b", "c", "e", "f"):
        (tmp_path / name).write_bytes(b"1234")
    report = compare(tmp_path, manifest)
    assert report["incomplete"] == [] and report["leftovers"] == []
    assert report["removed"] == sorted([str(stale.relative_to(tmp_path)), "c.incomplete"])
    assert not stale.exists() and not (tmp_path / "c.incomplete").exists()


def test_http_fetch_continues_a_file_cut_short_and_replaces_one_too_long(
    tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repo = hub.repos[TARGET_ID]
    known = {"repo": TARGET_ID, "commit": repo.sha, "gated": False}
    known["manifest"] = [{"path": f.path, "size": f.size} for f in repo.files.values()]
    target = tmp_path / "target"
    target.mkdir()
    (target / SHARD).write_bytes(repo.files[SHARD].content[:1000])  # a copy that broke off
    (target / "config.json").write_bytes(repo.files["config.json"].content + b"garbage")
    report = fetch({"command": "fetch", "local_dir": str(target)}, known)
    assert report["failed"] == []
    assert {f["path"]: f["resumed_from"] for f in report["fetched"]}[SHARD] == 1000
    assert [r.range for r in hub.requests.entries(TARGET_ID, SHARD, kind="cdn")] == ["bytes=1000-"]
    assert tree(target) == repo.contents


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"type": "file", "path": "../outside", "size": 4}, "'../outside' is not a path inside the repo"),
        ({"type": "file", "path": "/etc/cron.d/x", "size": 4}, "'/etc/cron.d/x' is not a path inside the repo"),
        ({"type": "file", "path": "a/./../../b", "size": 4}, "'a/./../../b' is not a path inside the repo"),
        ({"type": "file", "path": "a//b", "size": 4}, "'a//b' is not a path inside the repo"),
        ({"type": "file", "path": 7, "size": 4}, "7 is not a path inside the repo"),
        ({"type": "file", "path": "a", "size": "big"}, "'a' has no size in bytes"),
        ({"type": "file", "path": "a", "size": 1e999}, "'a' has no size in bytes"),
        ({"type": "file", "path": "a", "size": -1}, "'a' has no size in bytes"),
        ("not an entry", "'not an entry' is not a file entry"),
    ],
)
def test_a_tree_entry_outside_the_repo_or_without_a_size_is_the_hubs_error(
    entry: object, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HTTP method writes `local_dir / path`: a Hub (or mirror) listing `../x` or `/etc/x` must not make it
    write outside local_dir, and an entry of another shape must not end the program in a traceback."""
    answers = iter([({"sha": "a" * 40}, {}), ([{"type": "file", "path": "ok", "size": 1}, entry], {})])
    monkeypatch.setattr(download, "api_json", lambda *_: next(answers))
    with pytest.raises(download.HubError, match=re.escape(f"the Hub's file list of r@main: {problem}")):
        download.read_manifest({"repo": "r", "revision": "main", "include": [], "exclude": []}, None, None)
