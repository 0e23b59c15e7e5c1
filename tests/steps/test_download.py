"""The `download` kind: its pure parts (margins, disk refusal, progress), then whole runs through the test
host's real sshd, with the real huggingface_hub client (`hf` and snapshot_download) downloading from the local
Hub test double, its fault switches included (the host program alone: tests/hostprograms/test_download.py)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from executor.errors import FactsError
from executor.faces.cli import main
from executor.stepkind import host_document
from executor.transport.base import Collector, CommandResult
from sandbox.hub import HubServer
from sandbox.prepare import VENV
from sandbox.repos import DRAFTER_ID, SPEED_BENCH_ID, TARGET_ID
from steps.download import (
    DownloadStep,
    HostReport,
    ProgressMeter,
    human_bytes,
    incomplete_summary,
    method_end,
    parse_margin,
    resumed_bytes,
)
from tests.hostprograms.test_download import tree

SHARD = "model-00002-of-00004.safetensors"

# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        *[(0.05, 0.05), ("5%", 0.05), ("12.5 %", 0.125), (0, 0), (10_000, 10_000), ("20GB", 20 * 10**9)],
        *[("10 GiB", 10 * 2**30), ("1.5TB", 1_500_000_000_000), ("500MB", 500 * 10**6), ("1000", 1000)],
    ],
)
def test_margin_is_a_ratio_or_bytes(value: Any, expected: float) -> None:
    parsed = parse_margin(value)
    assert parsed == pytest.approx(expected) and isinstance(parsed, type(expected))


@pytest.mark.parametrize("value", [-1, 1.5, "150%", "lots", True, "5 parsecs"])
def test_margin_rejects_what_it_cannot_mean(value: Any) -> None:
    with pytest.raises(ValueError, match=r"margin|ratio|size"):
        parse_margin(value)


def step(**params: Any) -> DownloadStep:
    return DownloadStep.model_validate(
        {"id": "dl", "kind": "download", "repo": "org/model", "local_dir": "/m"} | params
    )


def test_parameters_are_checked() -> None:
    assert step(include="*.json").include == ["*.json"]
    assert step(local_dir="$models_dir/x/").local_dir == "$models_dir/x" and step(local_dir="~/m").local_dir == "~/m"
    for bad in ({"local_dir": "models/x"}, {"methods": ["http", "http"]}, {"methods": []}, {"methods": ["wget"]}):
        with pytest.raises(ValidationError):
            step(**bad)
    with pytest.raises(ValidationError, match="hf_token"):
        step(hf_token="x")  # the token is a secret, never a parameter


def precheck(total: int, complete: int, free: int) -> dict[str, Any]:
    return {"bytes": total, "complete_bytes": complete, "disk": {"path": "/models", "free_bytes": free}}


def test_disk_refusal_gives_the_numbers() -> None:
    disk = step().disk_check(precheck(612_300_000_000, 0, 540_100_000_000))
    assert disk.shortfall == "need 612.3 GB + 5% margin = 642.9 GB, 540.1 GB free on /models"
    assert disk.need_bytes == 612_300_000_000 and disk.margin_bytes == 30_615_000_000
    disk = step(min_free_margin="20GB").disk_check(precheck(612_300_000_000, 100_000_000_000, 520_000_000_000))
    assert disk.shortfall == "need 512.3 GB + 20.0 GB margin = 532.3 GB, 520.0 GB free on /models"


def test_disk_check_counts_only_what_is_still_to_fetch() -> None:
    assert step().disk_check(precheck(612_300_000_000, 100_000_000_000, 540_100_000_000)).shortfall is None
    assert step().disk_check(precheck(10**12, 10**12, 0)).shortfall is None  # complete: nothing to fetch


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 999, 1000, 4_364_074, 612_345_678_901, 2.5e12)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "4.4 MB",
        "612.3 GB",
        "2.5 TB",
    ]


class FakeContext:
    """Collects `progress` calls; the meter needs nothing else of a StepContext."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def progress(self, message: str, /, **fields: Any) -> None:
        self.calls.append((message, fields))


def meter_calls(chunks: list[tuple[str, bytes]]) -> list[tuple[str, dict[str, Any]]]:
    ctx, clock = FakeContext(), iter(float(t) for t in range(0, 1000, 2))
    meter = ProgressMeter(ctx, "org/model", "hf_cli", 1_000_000, 100_000, clock=lambda: next(clock))
    for stream, chunk in chunks:
        meter.feed(stream, chunk)
    return ctx.calls


OUTPUT = (
    b"\x1b[33mWarning: noise\x1b[0m\n"
    b'runbook-progress {"disk_bytes": 4096}\n'
    b"Fetching 3 files\n"
    b'runbook-progress {"disk_bytes": 204096}\n'
    b'runbook-progress {"disk_bytes": }\n'  # du failed: no number, no update
    b'runbook-progress {"disk_bytes": 404096}\n'
)


def test_progress_lines_become_bytes_rate_and_eta() -> None:
    calls = meter_calls([("stderr", OUTPUT)])
    assert [fields["bytes_done"] for _, fields in calls] == [100_000, 300_000, 500_000]
    assert meter_calls([("stdout", OUTPUT)]) == []  # the script prints sizes on stderr, as every program does
    assert calls[0][0] == "org/model via hf_cli: 100.0 kB of 1.0 MB (10%)"
    assert calls[2][0] == "org/model via hf_cli: 500.0 kB of 1.0 MB (50%), 100.0 kB/s, ETA 5.0s"
    assert calls[2][1] == {
        "method": "hf_cli",
        "bytes_done": 500_000,
        "bytes_total": 1_000_000,
        "rate_bytes_per_s": 100_000.0,
        "eta_s": 5.0,
    }


def result(exit_code: int | None, stderr: bytes = b"", stdout: bytes = b"", timed_out: bool = False) -> CommandResult:
    collect = Collector()
    collect.stdout.feed(stdout)
    collect.stderr.feed(stderr)
    return collect.result(exit_code, timed_out=timed_out)


def test_how_a_method_ended_in_brief_and_in_full() -> None:
    assert method_end(result(0, stdout=b'runbook-progress {"disk_bytes": 1}\n'), None) == ("exited 0", "exited 0")
    crashed = result(
        1, stderr=b"Traceback...\n  raise X\n\x1b[31mhuggingface_hub.errors.GatedRepoError: 401 Client\x1b[0m\n\n"
    )
    assert method_end(crashed, None) == (
        "exit 1 (GatedRepoError)",
        "exit 1 (huggingface_hub.errors.GatedRepoError: 401 Client)",
    )
    missing = result(127, stderr=b"/tmp/runbook.x/script: line 9: /nonexistent/hf: No such file or directory\n")
    assert method_end(missing, None)[0] == "exit 127 (No such file or directory)"
    cli = result(1, stderr=b"\x1b[1mError: Local entry not found. Response from http://127.0.0.1:1/x is missing\n")
    assert method_end(cli, None)[0] == "exit 1 (Local entry not found. Response from ...)"
    assert method_end(result(None, timed_out=True), 90) == ("timed out after 1m30s", "timed out after 1m30s")
    after = {"files": 5, "incomplete": [{"path": f"f{i}", "state": "missing", "have": 0, "size": 1} for i in range(4)]}
    assert incomplete_summary(after) == "4 of 5 files incomplete: f0 missing, f1 missing, f2 missing, ..."


#: huggingface_hub 2.4's `hf` on a repo it cannot find, as its code writes it (cli/hf.py `main`: `out.error` of
#: cli/_errors.py `_format_repo_not_found`'s three lines in bold red, then `out.hint` in grey): the last line is the
#: hint, whatever the error.
REPO_NOT_FOUND_2X = (
    b"\x1b[1m\x1b[31mError: Model 'org/none' not found.\n"
    b"If the repo is private, make sure you are authenticated and your token has the required permissions.\n"
    b"If the repo does not exist, create it with: hf repos create org/none\x1b[0m\n"
    b"\x1b[90mHint: set HF_DEBUG=1 as environment variable for full traceback.\x1b[0m\n"
)


def test_a_failed_hf_cli_is_read_by_its_error_line_not_the_hint() -> None:
    assert method_end(result(1, stderr=REPO_NOT_FOUND_2X), None) == (
        "exit 1 (Model 'org/none' not found.)",
        "exit 1 (Error: Model 'org/none' not found.)",
    )


#: The real `hf` CLIs at hand: the test host's (huggingface_hub 1.33) and this environment's (2.4 in CI's main pass).
HF_CLIS = [VENV / "bin" / "hf", Path(sys.executable).parent / "hf"]


@pytest.mark.parametrize("cli", HF_CLIS, ids=["test-host", "controller"])
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ([], "Access denied. "),  # 1.33: "This repository requires approval."; 2.4: "Model '...' requires approval."
        (["--revision", "no-such-branch"], f"Revision not found in model '{DRAFTER_ID}'."),
    ],
    ids=["gated", "missing-revision"],
)
def test_the_real_hf_cli_failing_against_the_hub_is_read_by_its_error_line(
    hub: HubServer, tmp_path: Path, cli: Path, args: list[str], error: str
) -> None:
    """What the real CLI prints on a gated repo (401 GatedRepo, no token) and on a revision the Hub does not
    have: the step's `ended` quotes the `Error:` line, never the HF_DEBUG hint printed after it."""
    if not cli.exists():
        pytest.skip(f"no hf CLI at {cli}")
    hub.faults.gate(DRAFTER_ID)
    env = {"PATH": "/usr/bin:/bin", **hub.client_env(tmp_path / "hf-home")}
    done = subprocess.run(
        [str(cli), "download", DRAFTER_ID, "--local-dir", str(tmp_path / "d"), *args],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1 and b"Hint: set HF_DEBUG=1" in done.stderr.splitlines()[-1]
    brief, full = method_end(result(1, stderr=done.stderr), None)
    assert full.startswith(f"exit 1 (Error: {error}") and "HF_DEBUG" not in brief + full, full


def test_the_http_method_report_is_the_last_line_of_its_stdout() -> None:
    report = b'{"fetched": [{"path": "a", "resumed_from": 7}, {"path": "b", "resumed_from": 0}], "failed": []}\n'
    progress = b'runbook-progress {"disk_bytes": 1}\n'
    assert resumed_bytes(result(0, stdout=b"a line of the method's\n" + report, stderr=progress)) == 7
    assert resumed_bytes(result(1, stdout=report + b"not json\n")) == 0
    assert resumed_bytes(result(1, stderr=progress)) == 0


PRECHECK = {
    "local_dir": "/m",
    "files": 1,
    "bytes": 5,
    "complete_bytes": 0,
    "partial_bytes": 0,
    "incomplete": [{"path": "a", "state": "missing", "have": 0, "size": 5}],
    "disk": {"path": "/m", "free_bytes": 10, "total_bytes": 20},
    "commit": "a" * 40,
}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"bytes": 10**400}, "bytes: Input should be less than"),  # a Hub's size: human_bytes overflowed
        ({"bytes": 1e308}, "bytes: Input should be a valid integer"),
        ({"complete_bytes": -1}, "complete_bytes: Input should be greater than or equal to 0"),
        ({"disk": {"path": "/m", "free_bytes": 10**400}}, "disk.free_bytes: Input should be less than"),
        ({"incomplete": [{"path": "a", "state": "short", "have": "5", "size": 5}]}, "incomplete.0.have"),
        ({"partial_bytes": None}, "come together or not at all"),  # was a KeyError or TypeError later
    ],
)
def test_a_count_of_the_download_program_that_is_no_count_fails_naming_it(change: dict[str, Any], named: str) -> None:
    """Counts from the host and the Hub are checked where the document is read: the step fails naming the field,
    never with an OverflowError from `human_bytes(10**400)` or a TypeError in the disk check."""
    stdout = json.dumps(PRECHECK | change).encode()
    with pytest.raises(FactsError, match=f"the precheck printed a document of an unexpected shape: .*{named}"):
        host_document(result(0, stdout=stdout), HostReport, "the precheck")


COUNT = st.integers(min_value=0, max_value=2**63 - 1)


@given(total=COUNT, complete=COUNT, free=COUNT, margin=st.sampled_from(["5%", "20GB", 0.5, 0]))
def test_any_counts_the_document_allows_give_a_disk_check(total: int, complete: int, free: int, margin: Any) -> None:
    """Within the bounds the document allows, the disk check and its message never raise."""
    stdout = json.dumps(PRECHECK | precheck(total, complete, free)).encode()
    pre = host_document(result(0, stdout=stdout), HostReport, "the precheck").model_dump(exclude_none=True)
    disk = step(min_free_margin=margin).disk_check(pre)
    assert disk.shortfall is None or disk.shortfall.startswith("need ")


# ----------------------------------------------------------------------------- through the test host

HF_VARS = {
    "HF_HUB_DISABLE_XET": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "HF_HUB_DOWNLOAD_TIMEOUT": "5",
}


class Run:
    """One finished `runbook run`: exit code, JSON events, the step's record, the audited commands."""

    def __init__(self, code: int, out: str, err: str, log_dir: Path, step: dict[str, Any]) -> None:
        self.code, self.out, self.err, self.step = code, out, err, step
        self.events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        (self.run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]

    @property
    def facts(self) -> dict[str, Any]:
        return self.step["facts"]  # type: ignore[no-any-return]

    @property
    def commands(self) -> list[dict[str, Any]]:
        lines = (self.run_dir / "audit.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r.get("event") == "command"]

    @property
    def failure(self) -> str:
        (finished,) = [e for e in self.events if e["event"] == "step_finished"]
        return "\n".join(finished["failures"])

    def progress(self) -> list[dict[str, Any]]:
        return [e["fields"] for e in self.events if e["event"] == "progress"]


@pytest.fixture
def download(
    tmp_path: Path, write_runbook: Any, testhost: Any, hub: HubServer, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """`download(token=False, **params)`: run a runbook of one download step on the test host against the Hub
    test double (the token, when asked for, as the secret HF_TOKEN; a var of `vars` set to None is left out);
    returns the `Run`."""
    host_yaml = testhost("h200").host_yaml()
    runs = itertools.count(1)

    def go(token: bool = False, vars: dict[str, str] | None = None, token_name: str = "HF_TOKEN", **params: Any) -> Run:
        number = next(runs)
        given = {"HF_ENDPOINT": hub.endpoint, **HF_VARS, **(vars or {})}
        doc = {
            "vars": {name: value for name, value in given.items() if value is not None},
            "secrets": {token_name: {"env": "TEST_DL_HF_TOKEN", "required": False}},
            "steps": [{"id": "fetch", "kind": "download", **params}],
        }
        path = write_runbook("name: dl\n__HOSTS__\n" + yaml.safe_dump(doc), name=f"dl{number}.yaml", hosts=host_yaml)
        if token:
            monkeypatch.setenv("TEST_DL_HF_TOKEN", hub.token)
        else:
            monkeypatch.delenv("TEST_DL_HF_TOKEN", raising=False)
        log_dir = tmp_path / f"logs{number}"
        code = main(["run", str(path), "--log-dir", str(log_dir), "--json"])
        out, err = capsys.readouterr()
        assert main(["status", "--log-dir", str(log_dir), "--json"]) == 0
        step = json.loads(capsys.readouterr().out)["steps"][0]
        return Run(code, out, err, log_dir, step)

    return go


def test_downloads_with_the_hf_cli_then_skips_what_is_complete(tmp_path: Path, download: Any, hub: HubServer) -> None:
    target = tmp_path / "models" / "drafter"
    params = {"repo": DRAFTER_ID, "local_dir": "$models_dir/drafter", "vars": {"models_dir": str(target.parent)}}
    first = download(**params)
    assert first.code == 0, first.err
    repo = hub.repos[DRAFTER_ID]
    assert tree(target) == repo.contents
    facts = first.facts
    assert facts["method"] == "hf_cli" and facts["complete"] and not facts["skipped"]
    assert [t["method"] for t in facts["tried"]] == ["hf_cli"] and facts["tried"][0]["reason"] is None
    assert (facts["files"], facts["bytes"], facts["fetched_bytes"]) == (
        len(repo.files),
        repo.total_size,
        repo.total_size,
    )
    assert facts["commit"] == repo.sha and facts["token_source"] is None and facts["local_dir"] == str(target)
    assert len(first.commands) == 3  # precheck, the method, the check after it: one audit record each
    assert "--revision " + repo.sha in first.commands[1]["command"]  # pinned to the commit the precheck saw
    last = first.progress()[-1]
    assert last["bytes_done"] == last["bytes_total"] == repo.total_size

    hub.requests.clear()
    again = download(**params)
    assert again.code == 0, again.err
    assert again.facts["skipped"] and again.facts["method"] is None and again.facts["tried"] == []
    assert len(again.commands) == 1  # the precheck alone: no method ran
    assert hub.requests.count(DRAFTER_ID, kind="resolve") + hub.requests.count(DRAFTER_ID, kind="cdn") == 0


SILENT_HF = """\
#!/bin/sh
# TEST DOUBLE of the `hf` CLI: exits 0 without downloading anything, as the seeds' first method did.
echo "Download complete."
exit 0
"""


def test_a_method_exiting_0_with_files_missing_has_failed_and_the_next_wins(
    tmp_path: Path, download: Any, hub: HubServer
) -> None:
    silent = tmp_path / "silent-hf"
    silent.write_text(SILENT_HF)
    silent.chmod(0o755)
    target = tmp_path / "models" / "drafter"
    run = download(repo=DRAFTER_ID, local_dir=str(target), hf_cli=str(silent))
    assert run.code == 0, run.err
    facts = run.facts
    assert facts["method"] == "snapshot_download"
    hf_try, snapshot_try = facts["tried"]
    assert (hf_try["method"], hf_try["exit_code"], hf_try["complete"]) == ("hf_cli", 0, False)
    assert hf_try["reason"].startswith(f"exited 0; {len(hub.repos[DRAFTER_ID].files)} of ")
    assert snapshot_try["complete"] and snapshot_try["reason"] is None
    assert tree(target) == hub.repos[DRAFTER_ID].contents


def test_when_every_method_fails_the_step_fails_with_each_reason(tmp_path: Path, download: Any, hub: HubServer) -> None:
    hub.faults.fail(DRAFTER_ID, "config.json", status=404, times=50)  # the Hub loses a file it lists
    run = download(repo=DRAFTER_ID, local_dir=str(tmp_path / "d"), hf_cli="/nonexistent/hf")
    assert run.code == 1
    assert run.step["status"] == "failed"
    failure = run.failure
    assert "the download is not complete" in failure
    files = len(hub.repos[DRAFTER_ID].files)
    shown = re.escape(
        'facts.failure = "hf_cli exit 127 (No such file or directory), snapshot_download exit 1 (ERROR), '
        f'http exit 1 (config.json (HTTP 404)); 1 of {files} files incomplete: config.json missing"'
    ).replace("ERROR", r"\w+Error")  # the client's exception for a 404 differs between its versions
    assert re.search(shown, failure), failure


def test_a_5xx_fails_the_attempt_and_the_retry_succeeds(tmp_path: Path, download: Any, hub: HubServer) -> None:
    hub.faults.fail(DRAFTER_ID, None, status=503, times=1)  # the first request about the repo
    run = download(repo=DRAFTER_ID, local_dir=str(tmp_path / "d"), retry={"attempts": 2, "delay": "10ms"})
    assert run.code == 0, run.err
    assert run.step["attempts"] == 2
    failed = [e for e in run.events if e["event"] == "attempt_failed"]
    assert len(failed) == 1 and "HTTP 503" in failed[0]["message"]
    assert run.facts["method"] == "hf_cli"


def test_a_gated_repo_needs_the_token_which_never_shows(tmp_path: Path, download: Any, hub: HubServer) -> None:
    hub.faults.gate(DRAFTER_ID)
    params = {"repo": DRAFTER_ID, "local_dir": str(tmp_path / "d")}
    refused = download(retry={"attempts": 3, "delay": "10ms"}, **params)
    assert refused.code == 1
    assert refused.step["attempts"] == 1 and "not retried: AccessDenied" in refused.failure  # the same token again
    assert "the Hub did not let the host read the repo's files" in refused.failure
    assert (
        'facts.hub_error = "a token is needed and none reached the host (no HF_TOKEN in its environment, no token '
        "file); the Hub answered HTTP 401 GatedRepo: " in refused.failure
    )
    assert hub.requests.count(DRAFTER_ID, method="GET", kind="resolve") == 0  # refused before any method ran

    hub.requests.clear()
    allowed = download(token=True, **params)
    assert allowed.code == 0, allowed.err
    assert allowed.facts["token_source"] == "env HF_TOKEN"
    assert hub.requests.count(DRAFTER_ID, method="GET", kind="resolve") > 0
    assert all(r.authorized for r in hub.requests.entries(DRAFTER_ID, kind="resolve"))  # the token was sent
    for run in (refused, allowed):
        for path in run.run_dir.rglob("*"):
            if path.is_file():
                assert hub.token.encode() not in path.read_bytes(), path
        assert hub.token not in run.out + run.err


def test_the_token_is_found_where_huggingface_hub_finds_it(
    tmp_path: Path, download: Any, hub: HubServer, testhost: Any
) -> None:
    """The legacy HUGGING_FACE_HUB_TOKEN, and a token file at an HF_TOKEN_PATH holding `$HOME`, reach the HTTP
    method as they reach the Hub client and the probe (before, the download's own lookup knew neither)."""
    hub.faults.gate(DRAFTER_ID)
    legacy = download(
        token=True,
        token_name="HUGGING_FACE_HUB_TOKEN",
        repo=DRAFTER_ID,
        local_dir=str(tmp_path / "a"),
        methods=["http"],
    )
    assert legacy.code == 0, legacy.failure
    assert legacy.facts["token_source"] == "env HUGGING_FACE_HUB_TOKEN" and legacy.facts["method"] == "http"
    token_file = testhost("h200").home / ".runbook-test-hf-token"
    token_file.write_text(hub.token + "\n")
    try:
        params = {"repo": DRAFTER_ID, "local_dir": str(tmp_path / "b"), "methods": ["http"]}
        from_file = download(vars={"HF_TOKEN_PATH": "$HOME/.runbook-test-hf-token"}, **params)
    finally:
        token_file.unlink()
    assert from_file.code == 0, from_file.failure
    assert from_file.facts["token_source"] == f"file {token_file}" and from_file.facts["method"] == "http"
    assert all(r.authorized for r in hub.requests.entries(DRAFTER_ID, kind="resolve"))
    for run in (legacy, from_file):
        assert hub.token not in run.out + run.err + (run.run_dir / "audit.jsonl").read_text()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs: a real file system too small for the target repo (needs root, as CI runs)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_too_little_disk_is_refused_before_downloading(small_disk: Path, download: Any, hub: HubServer) -> None:
    run = download(repo=TARGET_ID, local_dir=f"{small_disk}/models/target")
    assert run.code == 1
    need = human_bytes(hub.repos[TARGET_ID].total_size)
    assert "not enough free disk: refused before downloading" in run.failure
    assert f"need {need} + 5% margin" in run.failure and f"1.0 MB free on {small_disk}" in run.failure
    assert hub.requests.count(TARGET_ID, method="GET", kind="resolve") == 0
    assert hub.requests.count(TARGET_ID, kind="cdn") == 0
    assert len(run.commands) == 1


def test_an_interrupted_http_download_resumes_with_range(tmp_path: Path, download: Any, hub: HubServer) -> None:
    target = tmp_path / "models" / "target"
    size = hub.repos[TARGET_ID].files[SHARD].size
    hub.faults.stall(TARGET_ID, SHARD, after_bytes=size // 3, hold_s=30)
    params = {"repo": TARGET_ID, "local_dir": str(target), "methods": ["http"], "method_timeout": "3s"}
    cut = download(**params)
    assert cut.code == 1
    files = hub.repos[TARGET_ID].files
    left = [path for path in sorted(files) if path >= SHARD]  # the method fetches in the list's order
    assert f'"http timed out after 3.0s; {len(left)} of {len(files)} files incomplete: {SHARD} partial' in cut.failure
    assert (target / (SHARD + ".incomplete")).stat().st_size == size // 3
    assert any(e["bytes_done"] > 0 and e["method"] == "http" for e in cut.progress())  # live, while it ran

    hub.requests.clear()
    resumed = download(**params)
    assert resumed.code == 0, resumed.err
    assert [r.range for r in hub.requests.entries(TARGET_ID, SHARD, kind="cdn")] == [f"bytes={size // 3}-"]
    assert resumed.facts["resumed_bytes"] == size // 3
    assert tree(target) == hub.repos[TARGET_ID].contents


def test_the_hub_client_retries_in_process_but_never_reuses_a_killed_process_file(
    tmp_path: Path, download: Any, hub: HubServer
) -> None:
    """What huggingface_hub (the test host's 1.33) does itself: a transfer cut short is retried by the same
    process (with Range only past whole 10 MB chunks it received); a killed process leaves its uniquely named
    staging file, which no later process reuses: the step removes it once the download is complete."""
    target = tmp_path / "models" / "target"
    size = hub.repos[TARGET_ID].files[SHARD].size
    hub.faults.stall(TARGET_ID, SHARD, after_bytes=size // 3, hold_s=30)
    killed = download(repo=TARGET_ID, local_dir=str(target), methods=["hf_cli"], method_timeout="3s")
    assert killed.code == 1 and 'facts.failure = "hf_cli timed out after 3.0s; ' in killed.failure
    (stale,) = list(target.rglob("*.incomplete"))

    hub.requests.clear()
    hub.faults.truncate(TARGET_ID, SHARD, after_bytes=size // 2)
    run = download(repo=TARGET_ID, local_dir=str(target))
    assert run.code == 0, run.err
    assert run.facts["method"] == "hf_cli" and len(run.facts["tried"]) == 1
    assert [r.status for r in hub.requests.entries(TARGET_ID, SHARD, method="GET", kind="cdn")] == [200, 200]
    assert run.facts["removed_leftovers"] == [str(stale.relative_to(target))]
    assert not stale.exists() and tree(target) == hub.repos[TARGET_ID].contents


@pytest.mark.parametrize("method", ["hf_cli", "snapshot_download", "http"])
def test_a_dataset_repository_downloads_by_every_method(
    tmp_path: Path, download: Any, hub: HubServer, method: str
) -> None:
    """`repo_type: dataset` reaches each method: `hf download --repo-type dataset`, snapshot_download's
    repo_type, and the HTTP method's `/api/datasets/` and `/datasets/.../resolve/` paths (a model's paths find
    no such repo on the Hub double, as on the Hub)."""
    target = tmp_path / "datasets" / "speed-bench"
    run = download(repo=SPEED_BENCH_ID, repo_type="dataset", local_dir=str(target), methods=[method])
    assert run.code == 0, run.failure if run.code == 1 else run.err
    dataset = hub.repos[SPEED_BENCH_ID]
    assert run.facts["method"] == method and run.facts["repo_type"] == "dataset" and run.facts["xet"] == "off"
    assert run.facts["commit"] == dataset.sha and tree(target) == dataset.contents
    assert hub.requests.count(SPEED_BENCH_ID, kind="cdn", method="GET") == len(dataset.lfs_files)


def test_xet_off_exports_hf_hub_disable_xet_to_every_method_and_auto_leaves_it_to_the_client(
    tmp_path: Path, write_runbook: Any, download: Any, hub: HubServer, capsys: Any
) -> None:
    """`off` (the default) puts HF_HUB_DISABLE_XET=1 into each method's command as sent, `auto` into none (a
    runbook var HF_HUB_DISABLE_XET, as this test's others have, still reaches the client); the plan says which,
    and the facts record it."""
    line = "export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_XET=1  # xet: off\n"
    for xet, exported in (("off", 3), ("auto", 0)):
        chosen = f"xet: {xet}" if xet != "off" else ""  # off unsaid: the default
        path = write_runbook(
            f"name: x\n__HOSTS__\nsteps:\n  - {{id: d, kind: download, repo: o/r, local_dir: /m, {chosen}}}\n"
        )
        assert main(["plan", "--full", str(path)]) == 0
        out = capsys.readouterr().out
        assert out.count(line) == exported and out.count("# download method ") == 3
        assert main(["plan", str(path)]) == 0
        assert f"; xet: {xet} (" in " ".join(capsys.readouterr().out.split())  # unwrapped
    run = download(
        repo=SPEED_BENCH_ID, repo_type="dataset", local_dir=str(tmp_path / "d"), methods=["http"], xet="auto"
    )
    assert run.code == 0 and run.facts["xet"] == "auto"
    assert "HF_HUB_DISABLE_XET=1  # xet: off" not in run.commands[1]["command"]


def test_with_xet_off_a_stalled_transfer_is_cut_by_the_clients_timeout_and_fetched_again(
    tmp_path: Path, download: Any, hub: HubServer
) -> None:
    """The path `xet: off` (the default) chooses, with no HF_HUB_DISABLE_XET among the runbook's vars: the Hub
    client's HTTP transfer, whose stall watchdog is HF_HUB_DOWNLOAD_TIMEOUT (a read silent that long fails and the
    client tries again in the same process), well before the method's own timeout."""
    target = tmp_path / "drafter"
    drafter = hub.repos[DRAFTER_ID]
    hub.faults.stall(DRAFTER_ID, "model.safetensors", hold_s=60)
    variables = {"HF_HUB_DISABLE_XET": None, "HF_HUB_DOWNLOAD_TIMEOUT": "2"}
    run = download(repo=DRAFTER_ID, local_dir=str(target), methods=["hf_cli"], method_timeout="50s", vars=variables)
    assert run.code == 0, run.failure if run.code == 1 else run.err
    assert run.facts["xet"] == "off" and run.facts["method"] == "hf_cli" and run.facts["tried"][0]["duration_s"] < 40
    assert [r.status for r in hub.requests.entries(DRAFTER_ID, "model.safetensors", method="GET", kind="cdn")] == [
        200,
        200,
    ]  # the stalled one, then the whole file again (under 10 MiB: no Range, see sandbox/hub.py)
    assert tree(target) == drafter.contents


def test_plan_shows_the_command_of_every_method(tmp_path: Path, write_runbook: Any, capsys: Any) -> None:
    path = write_runbook(f"""\
        name: plan
        __HOSTS__
        vars:
          models_dir: /models
        steps:
          - id: fetch
            kind: download
            repo: {TARGET_ID}
            local_dir: $models_dir/Kimi-K2.6
            include: ["*.json", "*.safetensors"]
            python: ~/sglang/bin/python
        """)
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count('local_dir="${models_dir:?runbook var models_dir is unset or empty}"/Kimi-K2.6\n') == 3
    assert out.count('"local_dir": "$models_dir/Kimi-K2.6"') == 3  # precheck, http, check: expanded by the kit
    commit = "'<commit of main, known at run time>'"
    hf = f"hf download {TARGET_ID} --revision {commit} --include '*.json' --include '*.safetensors' --local-dir"
    assert hf + ' "$local_dir"\n' in out
    python = '"${HOME:?is not set}"/sglang/bin/python'
    assert f'{python} - "$local_dir" <<' in out
    assert f"snapshot_download(repo_id='{TARGET_ID}', revision={commit[1:-1]!r}, local_dir=sys.argv[1], " in out
    assert "allow_patterns=['*.json', '*.safetensors'], ignore_patterns=None)" in out
    assert out.count(f'{python} "$prog/program.pyz" "$prog/config.json"\n') == 3
    assert '{"command": "fetch", "local_dir": "$models_dir/Kimi-K2.6", "repo": ' in out
    assert out.index("# method: hf_cli") < out.index("# method: snapshot_download") < out.index("# method: http")
    assert "#   gate: facts.failure is none" in out


DATASET_BY_VARS = """\
name: dataset-by-vars
vars: {data_repo: org/data, data_revision: refs/pr/1, data_file: throughput_1k.jsonl}
steps:
  - {id: probe, kind: probe}
  - id: fetch
    kind: download
    repo: $data_repo
    repo_type: dataset
    revision: $data_revision
    include: [$data_file]
    local_dir: /m
  - {id: check, kind: verify, repo: $data_repo, repo_type: dataset, revision: $data_revision,
     include: [$data_file], local_dir: /m}
"""


def test_a_repo_revision_and_file_given_as_vars_are_resolved_on_the_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The flagship names its dataset repository, revision and file once, as vars (`--var` or an inventory points
    it at a prepared repository): download and verify send the values, the probe asks the Hub for that repository
    and that file (the revision quoted in `fetches`, HfFileSystem's form), and a value that is no repo id fails at
    plan, naming the parameter and the var, before anything runs."""
    path = tmp_path / "rb.yaml"
    path.write_text(DATASET_BY_VARS)
    fetch = DownloadStep.model_validate({"id": "f", "repo": "org/data", "revision": "refs/pr/1", "local_dir": "/m"})
    assert fetch.fetches() == ["hf://org/data@refs%2Fpr%2F1"]
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    hf = "hf download org/data --repo-type dataset --revision '<commit of refs/pr/1, known at run time>'"
    assert f"{hf} --include throughput_1k.jsonl --local-dir" in out
    assert '"repo": "org/data", "repo_type": "dataset", "revision": "refs/pr/1"' in out  # verify's config
    assert '"hub_files": {"datasets/org/data@refs/pr/1": ["throughput_1k.jsonl"]}' in out  # the probe's
    assert main(["plan", str(path), "--var", "data_repo=mine/SPEED-Bench-prepared"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the Hub's files and access of datasets/mine/SPEED-Bench-prepared@refs/pr/1 (throughput_1k.jsonl)" in out
    assert "download the dataset mine/SPEED-Bench-prepared@refs/pr/1 into /m" in out
    assert main(["plan", str(path), "--var", "data_repo=SPEED-Bench"]) == 2
    err = capsys.readouterr().err
    assert "repo: runbook var data_repo = 'SPEED-Bench' does not fit: expected a Hub repo id, `org/name`" in err
