"""The `verify` kind: whole runs through the real sshd against the local Hub test double, downloaded by the
real huggingface_hub client (the host program's checks on local trees: tests/hostprograms/test_verify.py)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main
from executor.hostprogram import PROGRESS_PREFIX
from sandbox.datasets import SPEED_BENCH_FILENAME
from sandbox.hub import HubServer
from sandbox.repos import DRAFTER_ID, SPEED_BENCH_ID, TARGET_ID
from steps.verify import VerifyStep, progress_sink
from tests.conftest import SandboxHost
from tests.hostprograms.test_verify import SHARD, backdate, flip_byte

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
        def progress(self, message: str, /, **fields: Any) -> None:
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


def test_a_dataset_repository_verifies_against_the_hubs_dataset_manifest(
    run_verify: Run, hub: HubServer, testhost: Callable[..., SandboxHost], tmp_path: Path
) -> None:
    """`repo_type: dataset`: the manifest is the Hub's dataset info (sha256 of its LFS files), a byte changed in
    the SPEED-Bench file is named, and `repair` fetches it again from the dataset's paths."""
    local = tmp_path / "speed-bench"
    fetch = (
        "import sys, huggingface_hub as h; h.snapshot_download(sys.argv[1], repo_type='dataset', local_dir=sys.argv[2])"
    )
    env = {**os.environ, **hub.client_env(tmp_path / "hf-home")}
    subprocess.run([str(testhost("h200").python), "-c", fetch, SPEED_BENCH_ID, str(local)], check=True, env=env)
    dataset = hub.repos[SPEED_BENCH_ID]
    code, err, facts = run_verify(local, repo=SPEED_BENCH_ID, repo_type="dataset")
    assert code == 0, err
    assert facts is not None and facts["commit"] == dataset.sha and facts["files_checked"] == len(dataset.files)
    data = local / SPEED_BENCH_FILENAME
    flip_byte(data, 3)
    code, err, _ = run_verify(local, repo=SPEED_BENCH_ID, repo_type="dataset")
    assert code == 1 and f"sha256 mismatch: {SPEED_BENCH_FILENAME}" in err
    code, err, facts = run_verify(local, repo=SPEED_BENCH_ID, repo_type="dataset", repair=True)
    assert code == 0, err
    assert facts is not None and facts["repaired"] == [SPEED_BENCH_FILENAME]
    assert data.read_bytes() == dataset.files[SPEED_BENCH_FILENAME].content


def test_render_ships_the_program_with_every_parameter_as_data() -> None:
    step = VerifyStep(id="v", repo="a/b", local_dir="/models/it's here", python="/opt/venv/bin/python", workers=4)
    script = step.render(None)  # type: ignore[arg-type]  # render reads no context
    assert script.startswith("# hostprograms/verify.py with the kit, zip sha256:")
    assert '"local_dir": "/models/it\'s here"' in script and '"workers": 4' in script
    assert script.endswith('/opt/venv/bin/python "$prog/program.pyz" "$prog/config.json"\n')
