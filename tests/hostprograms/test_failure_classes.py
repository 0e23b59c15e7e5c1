"""The host programs name a failure that retrying cannot fix by its class (executor/errors.py), and the kinds
carry it to the engine: deploy's start-up refusals (ConfigRefused, OutOfMemory, PortInUse), the Hub refusing a
token to download and verify (AccessDenied). The engine's side: tests/executor/test_retry_classes.py.

deploy runs as the host runs it (its bundle under `python -I -S`), its server the test double fake_rank.py, whose
argparse refuses an unknown flag as SGLang's does.
"""

from __future__ import annotations

import email.message
import io
import socket
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from executor.errors import AccessDenied, CommandFailed, GateFalse, GateUndecided, OutOfMemory, PortInUse, StepFailed
from hostprograms import download as download_host
from hostprograms import verify as verify_host
from steps.download import HostReport as DownloadHostReport
from steps.eval_acceptance import EvalAcceptanceStep
from steps.server.documents import StartReport
from steps.shell import ShellStep
from steps.verify import VerifyFacts, VerifyStep
from tests.hostprograms.conftest import ProgramRun
from tests.hostprograms.test_deploy_ranks import FAKE_RANK


def start(run_program: ProgramRun, tmp_path: Path, port: int, *fake_args: str) -> dict[str, Any]:
    """deploy's `start` of fake_rank.py with `fake_args` on `port`: its document."""
    launch = [[sys.executable, False], [FAKE_RANK, False], *([arg, False] for arg in fake_args)]
    config = {"action": "start", "port": port, "bind": "127.0.0.1", "env": {}, "ready_timeout": 60,
              "stop_timeout": 5, "state_dir": str(tmp_path / "state"), "launch": launch}  # fmt: skip
    return run_program("deploy", config)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("fake_args", "expected"),
    [
        (["--no-such-flag"], "ConfigRefused"),  # argparse: `fake_rank.py: error: unrecognized arguments`, exit 2
        (
            ["--say", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.00 GiB", "--exit", "1"],
            "OutOfMemory",
        ),
        (
            ["--say", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "--exit", "1"],
            "OutOfMemory",
        ),
        (["--say", "RuntimeError: NCCL connection reset by peer", "--exit", "1"], None),  # may pass next time
        (
            [
                "--say",
                "warning: lower --mem-fraction-static if out of memory",
                "--say",
                "ValueError: bad",
                "--exit",
                "1",
            ],
            None,
        ),
        (["--say", "prog: error: this is no argparse exit", "--exit", "1"], None),  # argparse exits 2
    ],
)
def test_a_server_that_exits_during_start_up_is_classed_by_its_log(
    fake_args: list[str], expected: str | None, run_program: ProgramRun, tmp_path: Path
) -> None:
    report = start(run_program, tmp_path, free_port(), *fake_args)
    assert not report["ready"] and report["failure"].startswith("the server exited")
    assert report["failure_class"] == expected


def test_a_server_is_classed_by_its_own_log_not_an_earlier_server_s(run_program: ProgramRun, tmp_path: Path) -> None:
    """A start in the second of an earlier start on the port (a retry, a fallback) had appended to the earlier
    server's log, whose out-of-memory line then named this server's failure OutOfMemory (and ended its retries)."""
    port, state = free_port(), tmp_path / "state"
    state.mkdir()
    earlier = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.00 GiB\n"
    now = time.time()
    for second in range(-1, 30):  # the names this start may take while the test runs
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now + second))
        (state / f"{port}-{stamp}.log").write_text(earlier)
    report = start(run_program, tmp_path, port, "--say", "shutting down", "--exit", "1")
    assert report["failure"].startswith("the server exited") and report["failure_class"] is None
    assert "OutOfMemory" not in report["failure"] and report["log_tail"] == ["shutting down"]


def test_a_port_held_by_a_foreign_process_is_port_in_use(run_program: ProgramRun, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        report = start(run_program, tmp_path, holder.getsockname()[1], "--say", "up")
    assert report["pid"] is None and report["failure_class"] == "PortInUse"
    assert StartReport.model_validate(report).failure_class == "PortInUse"
    for named in ("GateFalse", "AccessDenied", 5):  # a host naming a class deploy never does: no unretried class
        with pytest.raises(ValidationError):
            StartReport.model_validate(report | {"failure_class": named})


def test_download_s_document_names_no_class_but_access_denied() -> None:
    """A host printing another class (GateFalse) or a non-string there prints a document of an unexpected shape
    (FactsUnreadable, retried), not a class that ends the step's attempts or a crash of the kind."""
    said = {"local_dir": "/m", "disk": {"path": "/", "free_bytes": 1}, "hub_error": "HTTP 403"}
    assert DownloadHostReport.model_validate(said | {"failure_class": "AccessDenied"}).failure_class == "AccessDenied"
    for named, error in (("GateFalse", "failure_class"), (5, "failure_class")):
        with pytest.raises(ValidationError, match=error):
            DownloadHostReport.model_validate(said | {"failure_class": named})
    with pytest.raises(ValidationError, match="hub_error"):
        DownloadHostReport.model_validate(said | {"hub_error": 5})


def test_stepkind_maps_a_reported_class_and_an_error_without_one() -> None:
    step = VerifyStep.model_validate({"id": "v", "kind": "verify", "repo": "org/m", "local_dir": "/m"})
    base: dict[str, Any] = {"repo": "org/m", "revision": "main", "local_dir": "/m", "commit": None}
    refused = VerifyFacts(**base, manifest_error="GatedRepoError: 403", failure_class="AccessDenied")
    unreachable = VerifyFacts(**base, manifest_error="ConnectionError: reset")
    assert step.failure_class(refused) is AccessDenied
    assert step.failure_class(unreachable) is StepFailed
    assert step.failure_class(VerifyFacts(**base | {"commit": "abc"}, manifest_error=None)) is None


def test_eval_acceptance_retries_failed_requests_not_a_definite_number() -> None:
    """A request the server failed (HTTP 503 while busy) is no definite value of the model: retried (StepFailed);
    an acceptance length under the bound is (GateFalse)."""
    step = EvalAcceptanceStep.model_construct()
    answered = {"error": None, "failed_requests": 0, "overall": {"mean": 2.1}}
    assert step.gate_failure(answered | {"failed_requests": 2}, "facts.failed_requests == 0", False) is StepFailed
    assert step.gate_failure(answered, "facts.overall.mean >= 3.0", False) is GateFalse
    assert step.gate_failure(answered | {"error": "the server stopped answering"}, "facts.error is none", False) is (
        StepFailed
    )


def test_every_kind_maps_the_class_its_facts_name_then_the_gate_decides() -> None:
    """The rule deploy, download and the others inherit (StepSpec.failure_class, then gate_failure)."""
    shell = ShellStep.model_validate({"id": "s", "kind": "shell", "script": "true"})
    said = {"failure": "port 30000 is taken", "failure_class": "PortInUse"}
    assert shell.gate_failure(said, "facts.failure is none", False) is PortInUse
    assert shell.gate_failure(said | {"failure_class": "OutOfMemory"}, "exit_code == 0", True) is OutOfMemory
    assert shell.gate_failure(said | {"failure_class": "NoSuchClass"}, "facts.failure is none", False) is StepFailed
    assert shell.gate_failure({"failure": "reset"}, "facts.failure is none", False) is StepFailed
    assert shell.gate_failure({"n": 0}, "facts.n > 0", True) is GateUndecided
    assert shell.gate_failure({"n": 0}, "facts.n > 0 and exit_code == 0", False) is CommandFailed
    assert shell.gate_failure({"n": 0}, "vars.n > 0 and steps.a.facts.ok", False) is GateFalse
    assert shell.gate_failure({"n": 0}, "facts.n > 0", False) is CommandFailed  # a shell step's facts: its output
    assert shell.gate_failure(None, "stdout", False) is CommandFailed


#: The Hub's own answer to a refused token (its error headers), and a proxy's or a CDN's (none: a WAF's block).
HUB_SAID = {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model org/m is restricted"}
HUB_SAID_VARIANTS = [HUB_SAID, {"X-Error-Message": "Invalid credentials in Authorization header"}]


@pytest.mark.parametrize(
    ("status", "said", "expected"),
    [
        *((status, said, "AccessDenied") for status in (401, 403) for said in HUB_SAID_VARIANTS),
        (500, HUB_SAID, None),
        (403, {}, None),  # not the Hub's word: a proxy, a CDN or a rate limit in front of it may pass
        (401, {"X-Error-Code": ""}, None),
    ],
)
def test_download_names_a_refused_token_access_denied(status: int, said: dict[str, str], expected: str | None) -> None:
    headers = email.message.Message()
    for name, value in said.items():
        headers[name] = value
    error = urllib.error.HTTPError("https://hub/x", status, "no", headers, io.BytesIO(b""))
    assert download_host.http_error(error, "https://hub/x", None).failure_class == expected


class _Refused(Exception):
    """What huggingface_hub raises for a 401/403 (GatedRepoError, an HfHubHTTPError): its `response`, with the
    status and the headers the Hub answered."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        super().__init__(f"{status} Client Error")
        self.response = type("Response", (), {"status_code": status, "headers": headers})()


@pytest.mark.parametrize(
    ("status", "said", "expected"),
    [(403, HUB_SAID, "AccessDenied"), (401, HUB_SAID, "AccessDenied"), (502, HUB_SAID, None), (403, {}, None)],
)
def test_verify_names_a_refused_manifest_access_denied(
    status: int, said: dict[str, str], expected: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(repo: str, revision: str, repo_type: str = "model") -> Any:
        raise _Refused(status, said)

    monkeypatch.setattr(verify_host, "read_manifest", refuse)
    report = verify_host.run({"repo": "org/m", "revision": "main", "local_dir": str(tmp_path)}, lambda *a, **k: None)
    assert report["manifest_error"] == f"_Refused: {status} Client Error" and report["failure_class"] == expected
