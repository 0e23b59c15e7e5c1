"""The SGLang stand-in (sandbox/sglang_standin/), used as a user would: started with
`python -m sglang.launch_server` in a real SSH session on the test host, asked over HTTP from here
(loopback), benchmarked with `python -m sglang.bench_serving`; checked against the real SGLang
0.5.23 files of the test venv where the real release says what the answer must be."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.prepare import VENV
from sandbox.repos import target_repo
from sandbox.sglang_standin import bench_client, faults, hook, launch, launch_args, simulation
from sandbox.sglang_standin.server import FLUSH_FAILED, FLUSHED, READY_LINE, Pacer, sse_lines
from sandbox.sshd import free_port
from steps.benchmark import error_line
from tests.conftest import SandboxHost
from tests.release.test_release_facts import writer_fields
from tests.sandbox.test_testhost import ssh

SGLANG = next(VENV.glob("lib/python*/site-packages")) / "sglang"
FAST = {"startup_s": 0.3, "decode_tokens_per_s": 2000.0}
MATH = "Natalia sold 48 clips in April and half as many in May. How many clips did she sell in total?"
CHAT = "Tell me something nice about the sea in the morning."


@dataclass
class Models:
    target: Path
    draft: Path


@pytest.fixture
def models(testhost: Callable[[str], SandboxHost]) -> Iterator[Models]:
    """A target and a DFlash drafter (config.json only: the stand-in loads no weights) in the host's HOME."""
    root = testhost("h200").home / "models"
    (root / "target").mkdir(parents=True, exist_ok=True)
    (root / "draft").mkdir(parents=True, exist_ok=True)
    (root / "target" / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"]}))
    (root / "draft" / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "dflash_config": {"block_size": 8}})
    )
    yield Models(root / "target", root / "draft")
    for path in sorted(root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    root.rmdir()


@dataclass
class Server:
    host: SandboxHost
    pid: int
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> float:
        """SIGTERM; seconds until the port is free again."""
        start = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        while time.monotonic() - start < 10:
            if not _alive(self.pid) and _port_free(self.port):
                return time.monotonic() - start
            time.sleep(0.05)
        raise AssertionError(f"the stand-in {self.pid} still runs 10 s after SIGTERM")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _port_free(port: int) -> bool:
    """Whether a new server can listen there (with SO_REUSEADDR, as uvicorn and the stand-in bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def launch_flags(models: Models, port: int, *extra: str, draft: bool = True) -> list[str]:
    flags = ["--model-path", str(models.target), "--tp-size", "1", "--host", "127.0.0.1", "--port", str(port)]
    if draft:
        flags += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(models.draft)]
    return [*flags, "--trust-remote-code", *extra]


def start(host: SandboxHost, flags: list[str], name: str = "sglang") -> Server:
    """Start the server detached from the SSH session, as the deploy step does; the session ends at once."""
    log = host.home / f"{name}.log"
    command = (
        f"setsid python -m sglang.launch_server {shlex.join(flags)} > {shlex.quote(str(log))} 2>&1 < /dev/null & "
        "echo $!"
    )
    done = ssh(host, command)
    assert done.returncode == 0, done.stderr
    return Server(host, int(done.stdout.strip()), int(flags[flags.index("--port") + 1]), log)


def start_pair(host: SandboxHost, models: Models, servers: list[Server]) -> tuple[Server, Server]:
    """A baseline and a DFLASH server of the same model, healthy, at a speed the tests can compare."""
    with host.standin(startup_s=0.3, decode_tokens_per_s=400.0):
        servers.append(baseline := start(host, launch_flags(models, free_port(), draft=False), "baseline"))
        servers.append(dflash := start(host, launch_flags(models, free_port()), "dflash"))
        wait_healthy(baseline)
        wait_healthy(dflash)
    return baseline, dflash


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.stop()
        server.log.unlink(missing_ok=True)


def http(url: str, body: dict[str, Any] | None = None, method: str | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (ConnectionError, urllib.error.URLError):
        return 0, b""


def wait_healthy(server: Server, timeout: float = 10) -> list[int]:
    """The /health answers seen until the first 200."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(http(server.url + "/health")[0])
        if seen[-1] == 200:
            return seen
        assert _alive(server.pid), server.log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"not healthy after {timeout}s: {seen[-5:]}\n{server.log.read_text()}")


def generate(server: Server, text: str, max_new_tokens: int = 64, **extra: Any) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, **extra}
    status, raw = http(server.url + "/generate", body)
    assert status == 200, raw
    result: dict[str, Any] = json.loads(raw)
    return result


def foreground(host: SandboxHost, command: str) -> tuple[int, str]:
    """Run a command to its end in an SSH session; (exit status, stdout + stderr)."""
    done = ssh(host, f"{command} 2>&1; echo rc=$?")
    output, _, status = done.stdout.rpartition("rc=")
    return int(status), output


# ---------------------------------------------------------------- the server, end to end


def test_dflash_server_starts_serves_survives_the_session_and_stops_on_sigterm(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    host = testhost("h200")
    with host.standin(startup_s=1.0, decode_tokens_per_s=2000.0):
        servers.append(server := start(host, launch_flags(models, free_port())))
        seen = wait_healthy(server)
    assert 503 in seen  # answered while starting, then healthy: the SSH session that started it is gone
    log = server.log.read_text()
    assert READY_LINE in log and "Scheduler hit an exception" not in log
    assert "UserWarning: 'python -m sglang.launch_server' is still supported" in log

    info = json.loads(http(server.url + "/model_info")[1])
    assert info["model_path"] == str(models.target) and info["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert json.loads(http(server.url + "/v1/models")[1])["data"][0]["id"] == str(models.target)

    out = generate(server, MATH, max_new_tokens=64)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 64 and meta["finish_reason"] == {"type": "length", "length": 64}
    assert meta["prompt_tokens"] == simulation.count_tokens(MATH)
    # tokenizer_manager._calculate_spec_decoding_metrics' formulas, block size 8 from the drafter's config
    assert meta["spec_accept_length"] == pytest.approx(64 / meta["spec_verify_ct"])
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * (8 - 1)
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"])
    assert 1 <= meta["spec_accept_length"] <= 8
    assert out["text"].split() and len(out["text"].split()) == 64 == len(out["output_ids"])

    server_info = json.loads(http(server.url + "/server_info")[1])
    assert server_info["version"] == "0.5.23" and server_info["speculative_num_draft_tokens"] == 8
    assert server_info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert server_info["speculative_algorithm"] == "DFLASH" and server_info["port"] == server.port
    assert json.loads(http(server.url + "/get_server_info")[1])["version"] == "0.5.23"

    assert server.stop() < 2  # prompt, and the port is free again
    assert "SIGTERM received." in server.log.read_text()


def test_streaming_is_sglangs_sse(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    host = testhost("h200")
    with host.standin(**FAST):
        servers.append(server := start(host, launch_flags(models, free_port())))
        wait_healthy(server)
    status, raw = http(
        server.url + "/generate", {"text": CHAT, "sampling_params": {"max_new_tokens": 20}, "stream": True}
    )
    events = [line.removeprefix(b"data: ") for line in raw.split(b"\n\n") if line]
    assert status == 200 and all(line.startswith(b"data: ") for line in raw.split(b"\n\n") if line)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    counts = [chunk["meta_info"]["completion_tokens"] for chunk in chunks]
    assert (
        counts == sorted(counts) and counts[0] == 1 and counts[-1] == 20 and len(chunks) < 20
    )  # several tokens a step
    assert all(chunks[i + 1]["text"].startswith(chunks[i]["text"]) for i in range(len(chunks) - 1))  # cumulative
    assert "spec_verify_ct" in chunks[-1]["meta_info"] and "spec_verify_ct" not in chunks[0]["meta_info"]


@given(st.lists(st.lists(st.integers(0, 2**20), max_size=6), max_size=8), st.text(max_size=40))
def test_a_streamed_line_is_json_dumps_of_its_cumulative_output_byte_for_byte(
    steps: list[list[int]], words: str
) -> None:
    """The stream encodes each output id once (sse_lines), and still sends what json.dumps of each output is."""
    outputs, ids, text = [], [], ""
    for n, fresh in enumerate(steps):
        ids, text = ids + fresh, text + words[: n + 1]
        meta = {"id": "r", "finish_reason": None, "completion_tokens": len(ids), "note": words}
        outputs.append({"text": text, "output_ids": list(ids), "meta_info": meta})
    assert list(sse_lines(iter(outputs))) == [b"data: " + json.dumps(out).encode() + b"\n\n" for out in outputs]


def test_a_late_wake_up_is_made_up_by_the_next_step_not_added_to_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sleep wakes 0.4 ms late (a loaded machine); 100 steps of 1 ms still take 100 ms, plus the last
    wake-up's lateness, where a sleep per step took 140 ms."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds + 0.0004))
    pacer = Pacer()
    for _ in range(100):
        pacer.wait(0.001)
    assert clock[0] == pytest.approx(0.1004)


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=60))
def test_the_benchmark_clients_statistics_are_numpys(values: list[float]) -> None:
    """calculate_metrics' mean, median, std and percentiles as the real client's numpy computes them."""
    import numpy as np

    got = bench_client._series(values, "x", extra=("max",))
    wanted = [np.mean(values), np.median(values), np.std(values), *np.percentile(values, [90, 95, 99]), max(values)]
    assert list(got.values()) == pytest.approx([1000 * float(w) for w in wanted], rel=1e-9, abs=1e-9)


@pytest.mark.xdist_group("timing")  # compares measured speeds: not beside a benchmark
def test_dflash_is_faster_than_baseline_and_only_it_reports_acceptance(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    host = testhost("h200")
    baseline, dflash = start_pair(host, models, servers)
    slow, fast = generate(baseline, MATH, 96), generate(dflash, MATH, 96)
    assert slow["meta_info"]["completion_tokens"] == fast["meta_info"]["completion_tokens"] == 96
    assert not any(key.startswith("spec_") for key in slow["meta_info"])  # as SGLang without speculative decoding
    assert fast["meta_info"]["e2e_latency"] * 2 < slow["meta_info"]["e2e_latency"]
    assert "avg_spec_accept_length" not in json.loads(http(baseline.url + "/server_info")[1])["internal_states"][0]

    math = [generate(dflash, f"{MATH} Case {i}.")["meta_info"]["spec_accept_length"] for i in range(4)]
    chat = [generate(dflash, f"{CHAT} Case {i}.")["meta_info"]["spec_accept_length"] for i in range(4)]
    assert min(math) > max(chat)  # a drafter guesses arithmetic better than small talk
    assert generate(dflash, f"{MATH} Case 0.")["meta_info"]["spec_accept_length"] == math[0]


def test_the_configured_acceptance_length_is_the_mean_of_templated_text_with_thinking_on(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    host = testhost("h200")
    with host.standin(accept_length=2.0, **FAST):
        servers.append(server := start(host, launch_flags(models, free_port())))
        wait_healthy(server)
    prompts = [simulation.apply_chat_template([{"content": f"{MATH} #{i}"}], thinking=True) for i in range(12)]
    lengths = [generate(server, prompt, 200)["meta_info"]["spec_accept_length"] for prompt in prompts]
    assert sum(lengths) / len(lengths) == pytest.approx(2.0, abs=0.3)
    assert max(lengths) < 3.0


def chat(server: Server, text: str, thinking: bool | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 48, **extra}
    if thinking is not None:
        body["chat_template_kwargs"] = {"thinking": thinking}
    status, raw = http(server.url + "/v1/chat/completions", body)
    assert status == 200, raw
    result: dict[str, Any] = json.loads(raw)
    return result


def test_chat_completions_apply_the_template_and_return_meta_info_and_token_ids_as_sglang(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    baseline, dflash = start_pair(testhost("h200"), models, servers)
    plain = chat(dflash, MATH)["choices"][0]  # without the flags, as SGLang: no meta_info, no token ids
    assert "meta_info" not in plain and "response_token_ids" not in plain and plain["message"]["content"]
    answer = chat(dflash, MATH, return_meta_info=True, return_token_ids=True)
    choice, usage = answer["choices"][0], answer["usage"]
    meta, ids = choice["meta_info"], choice["response_token_ids"]
    assert choice["finish_reason"] == "length" and meta["finish_reason"] == {"type": "length", "length": 48}
    assert len(ids) == meta["completion_tokens"] == usage["completion_tokens"] == 48
    assert meta["prompt_tokens"] == usage["prompt_tokens"] == len(choice["prompt_token_ids"])
    assert meta["spec_accept_length"] == pytest.approx(48 / meta["spec_verify_ct"])
    # greedy and lossless: the baseline's ids are the same, and it reports no spec_* fields
    same = chat(baseline, MATH, return_meta_info=True, return_token_ids=True)["choices"][0]
    assert same["response_token_ids"] == ids and "spec_verify_ct" not in same["meta_info"]

    def mean_accept(**how: Any) -> float:
        answers = [chat(dflash, f"{MATH} Case {i}.", return_meta_info=True, **how) for i in range(4)]
        return sum(a["choices"][0]["meta_info"]["spec_accept_length"] for a in answers) / 4

    thinking, explicit, off = mean_accept(), mean_accept(thinking=True), mean_accept(thinking=False)
    raw = sum(generate(dflash, f"{MATH} Case {i}.", 48)["meta_info"]["spec_accept_length"] for i in range(4)) / 4
    assert thinking == explicit > off > raw  # thinking on by default, as Kimi-K2.6's template
    assert thinking == pytest.approx(simulation.DEFAULT_ACCEPT["math"], abs=0.6)


def test_flush_cache_answers_with_sglangs_bodies(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    host = testhost("h200")
    with host.standin(startup_s=0.3, decode_tokens_per_s=50.0):
        servers.append(server := start(host, launch_flags(models, free_port())))
        wait_healthy(server)
    for method in ("GET", "POST"):
        assert http(server.url + "/flush_cache", method=method) == (200, FLUSHED.encode())
    # requests in flight: SGLang 0.5.23 refuses with 400 and this body (http_server.flush_cache)
    busy = threading.Thread(target=generate, args=(server, CHAT, 100))
    busy.start()
    time.sleep(0.3)
    assert http(server.url + "/flush_cache", method="POST") == (400, FLUSH_FAILED.encode())
    busy.join()
    assert http(server.url + "/flush_cache", method="POST")[0] == 200
    # the switch is read at each /flush_cache, so it can be turned on while the server runs
    with host.standin(fault="refuse_flush_cache"):
        assert http(server.url + "/flush_cache", method="POST") == (400, FLUSH_FAILED.encode())
    assert http(server.url + "/flush_cache")[0] == 200
    log = server.log.read_text()
    assert "Cache flushed successfully!" in log and "Cache not flushed because there are pending requests." in log


@pytest.mark.xdist_group("timing")  # compares measured speeds: not beside a benchmark
def test_the_prefix_cache_serves_a_repeated_prefix_until_a_flush(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    """As SGLang's radix cache: a finished request's tokens are cached, a later request's cached prefix is not
    prefilled again (it answers sooner) and meta_info.cached_tokens counts it; only a flush empties the cache."""
    host = testhost("h200")
    with host.standin(**FAST):
        servers.append(server := start(host, launch_flags(models, free_port())))
        wait_healthy(server)
    prompt = " ".join(f"w{i}" for i in range(2000))  # 2000 tokens: 55 ms of prefill, 5 ms for the last one
    first = generate(server, prompt, 1)["meta_info"]
    again = [generate(server, prompt, 1)["meta_info"] for _ in range(3)]
    shared = generate(server, " ".join(prompt.split()[:1200] + ["other"] * 800), 1)["meta_info"]
    assert [meta["cached_tokens"] for meta in (first, *again, shared)] == [0, 1999, 1999, 1999, 1200]
    # Only the last token was prefilled again. A request never answers before its paced schedule (the Pacer
    # sleeps until it is due), only later, by how late a loaded machine wakes it: so a repeat that answered
    # sooner than a full prefill's schedule cannot have prefilled it all; the fastest of three leaves 50 ms
    # for a late wake-up.
    full_prefill = simulation.prefill_seconds(2000)
    assert min(a["e2e_latency"] for a in again) < full_prefill <= first["e2e_latency"]
    log = server.log.read_text()
    for new, cached in ((2000, 0), (1, 1999), (800, 1200)):  # metrics_reporter.report_prefill_stats' line
        line = f"Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, token usage: 0.00, "
        assert f" TP0] {line}#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, " in log
    assert http(server.url + "/flush_cache", method="POST")[0] == 200
    assert generate(server, prompt, 1)["meta_info"]["cached_tokens"] == 0


def test_flush_cache_with_a_timeout_waits_for_idle_and_a_refusal_fails_the_benchmark_client(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server], tmp_path: Path
) -> None:
    """`?timeout=S` (what bench_serving's --flush-cache sends) waits up to S seconds for the requests in flight,
    as flush_wrapper.py does; the client raises for a 400 as requests' raise_for_status."""
    host = testhost("h200")
    with host.standin(**FAST):
        servers.append(server := start(host, launch_flags(models, free_port())))
        wait_healthy(server)
    long = " ".join(f"w{i}" for i in range(24000))  # 0.6 s of prefill: a request in flight
    for timeout, answer in (("5", (200, FLUSHED.encode())), ("0.1", (400, b"Timed out waiting for idle state."))):
        busy = threading.Thread(target=generate, args=(server, f"{long} {timeout}", 1))
        busy.start()
        time.sleep(0.2)
        assert http(f"{server.url}/flush_cache?timeout={timeout}", method="POST") == answer
        busy.join()
    assert "Deferred flush_cache timed out while waiting for idle state." in server.log.read_text()
    with host.standin(fault="refuse_flush_cache"):
        status, output = bench(host, server, tmp_path / "x.jsonl", 1, "--flush-cache")
    assert status == 1 and "Warmup completed" in output
    url = f"{server.url}/flush_cache?timeout=60.0"
    assert f"HTTPError: 400 Client Error: Bad Request for url: {url}" in output
    assert not (tmp_path / "x.jsonl").exists()


def test_never_healthy_stays_503_after_uvicorn_started(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    host = testhost("h200")
    with host.standin(fault="never_healthy", startup_s=0.3):
        servers.append(server := start(host, launch_flags(models, free_port())))
        time.sleep(1.5)
    assert http(server.url + "/health")[0] == 503 and http(server.url + "/health_generate")[0] == 503
    assert _alive(server.pid)
    log = server.log.read_text()
    assert "Uvicorn running on" in log and READY_LINE not in log
    assert server.stop() < 2


@pytest.mark.parametrize(
    ("gpu", "backend", "line"),
    [
        ("rtx6000", "trtllm_mla", "Unsupported architecture SM120"),  # the seeds' CT200 host
        ("h200", "trtllm_mla", "Unsupported architecture SM90"),
        ("rtx6000", "fa3", "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90."),
        ("none", "flashinfer", "RuntimeError: Found no NVIDIA driver on your system."),
        ("absent", "flashinfer", "RuntimeError: Found no NVIDIA driver on your system."),
    ],
)
def test_a_backend_the_gpu_cannot_run_kills_the_server_during_start_up(
    testhost: Callable[[str], SandboxHost], models: Models, gpu: str, backend: str, line: str
) -> None:
    host = testhost(gpu)
    flags = launch_flags(models, free_port(), "--attention-backend", backend)
    with host.standin(startup_s=0.2):
        status, output = foreground(host, f"python -m sglang.launch_server {shlex.join(flags)}")
    assert status == 128 + signal.SIGKILL  # kill_process_tree kills the launcher itself
    assert "Scheduler hit an exception: Traceback (most recent call last):" in output and line in output
    assert output.rstrip().endswith("Received sigquit from a child process. It usually means the child failed.")
    assert READY_LINE not in output


def test_the_right_backends_start_on_each_gpu(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server]
) -> None:
    for gpu, backend in (("h200", "fa3"), ("rtx6000", "flashinfer")):
        host = testhost(gpu)
        flags = launch_flags(models, free_port(), "--attention-backend", backend)
        with host.standin(**FAST):
            servers.append(server := start(host, flags, f"ok-{gpu}"))
            wait_healthy(server)


def test_a_taken_port_fails_like_uvicorn(testhost: Callable[[str], SandboxHost], models: Models) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, output = foreground(
            testhost("h200"), f"python -m sglang.launch_server {shlex.join(launch_flags(models, port))}"
        )
    assert status == 1
    assert f"error while attempting to bind on address ('127.0.0.1', {port}): address already in use" in output


def test_crash_at_startup_switch(testhost: Callable[[str], SandboxHost], models: Models) -> None:
    host = testhost("h200")
    with host.standin(fault="crash_at_startup", startup_s=0.2):
        status, output = foreground(host, f"python -m sglang.launch_server {shlex.join(launch_flags(models, 1))}")
    assert status == 137 and "torch.OutOfMemoryError: CUDA out of memory." in output and READY_LINE not in output


@pytest.mark.parametrize(
    ("extra", "code", "line"),
    [
        (["--no-such-flag", "1"], 2, "launch_server.py: error: unrecognized arguments: --no-such-flag 1"),
        (["--attention-backend", "cutlass_mla"], 2, "argument --attention-backend: invalid choice: 'cutlass_mla'"),
        (
            ["--speculative-num-draft-tokens", "8", "--speculative-dflash-block-size", "16"],
            1,
            "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set",
        ),
    ],
)
def test_launch_arguments_are_checked_like_sglang(
    testhost: Callable[[str], SandboxHost], models: Models, extra: list[str], code: int, line: str
) -> None:
    status, output = foreground(
        testhost("h200"), f"python -m sglang.launch_server {shlex.join(launch_flags(models, 1, *extra))}"
    )
    assert status == code and line in output


def test_dflash_without_a_drafter_and_a_model_without_config_are_refused(
    testhost: Callable[[str], SandboxHost], models: Models
) -> None:
    host = testhost("h200")
    status, output = foreground(
        host, f"python -m sglang.launch_server --model-path {models.target} --speculative-algorithm DFLASH"
    )
    assert status == 1
    assert "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path." in output
    status, output = foreground(host, f"python -m sglang.launch_server --model-path {host.home}")
    assert status == 1 and "does not appear to have a file named config.json" in output


# ---------------------------------------------------------------- the benchmark client


def real_result_fields() -> list[str]:
    """The keys of the `result = {...}` dict the real benchmark/serving.py writes as its JSONL line."""
    return writer_fields(SGLANG / "benchmark" / "serving.py")


def bench(host: SandboxHost, server: Server, output: Path, concurrency: int, *extra: str) -> tuple[int, str]:
    flags = [
        *("--backend", "sglang", "--base-url", server.url, "--dataset-name", "random-ids"),
        *("--random-input-len", "32", "--random-output-len", "48", "--random-range-ratio", "1.0"),
        *("--num-prompts", "8", "--max-concurrency", str(concurrency), "--output-file", str(output)),
        *("--disable-tqdm", "--seed", "1", "--warmup-requests", "1", *extra),
    ]
    return foreground(host, f"python -m sglang.bench_serving {shlex.join(flags)}")


@pytest.mark.xdist_group("timing")  # compares measured speeds: not beside a benchmark
def test_bench_serving_appends_the_real_jsonl_fields_and_shows_the_speedup(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server], tmp_path: Path
) -> None:
    host = testhost("h200")
    baseline, dflash = start_pair(host, models, servers)
    out = tmp_path / "bench.jsonl"
    # baseline and DFLASH in turns: each pair runs in the same conditions (the load of the other xdist worker)
    for server, concurrency in ((baseline, 1), (dflash, 1), (baseline, 4), (dflash, 4)):
        status, output = bench(host, server, out, concurrency)
        assert status == 0, output
        assert "============ Serving Benchmark Result ============" in output
        assert f"{'Successful requests:':<40} {8:<10}" in output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4  # appended, one line per run
    assert all(list(line) == real_result_fields() for line in lines)
    base1, spec1, base4, spec4 = lines
    assert all(line["completed"] == 8 and line["total_output_tokens"] == 8 * 48 for line in lines)
    assert all(line["total_input_tokens"] == 8 * 32 and line["dataset_name"] == "random-ids" for line in lines)
    assert base1["accept_length"] is None and spec1["accept_length"] > 1
    assert spec1["server_info"]["speculative_algorithm"] == "DFLASH" and base1["server_info"]["version"] == "0.5.23"
    # The model's speedup here is 2.22 / 1.3 = 1.7 (raw-text acceptance over a verify step's cost). It is
    # asserted on the median time per output token: the decode steps, paced on a schedule (a late wake-up
    # is made up by the next step), so a loaded machine barely moves it. Throughput adds each request's
    # HTTP and scheduling overhead, which on a loaded 2-core machine pulls the ratio towards 1 (below 1.25
    # under a load of 20): it only has to show DFLASH faster.
    speedup1 = base1["median_tpot_ms"] / spec1["median_tpot_ms"]
    assert speedup1 > 1.25 and spec1["mean_tpot_ms"] < base1["mean_tpot_ms"]
    assert spec1["output_throughput"] > base1["output_throughput"]
    assert base4["output_throughput"] > 2 * base1["output_throughput"]  # batching pays off
    assert base4["median_tpot_ms"] / spec4["median_tpot_ms"] < speedup1  # speculation pays less in a batch
    assert base1["p99_ttft_ms"] >= base1["median_ttft_ms"] > 0 and base1["max_concurrency"] == 1


def test_bench_serving_details_and_offline_datasets(
    testhost: Callable[[str], SandboxHost], models: Models, servers: list[Server], tmp_path: Path
) -> None:
    host = testhost("h200")
    with host.standin(**FAST):
        servers.append(server := start(host, launch_flags(models, free_port())))
        wait_healthy(server)
    out = tmp_path / "details.jsonl"
    status, output = bench(host, server, out, 2, "--output-details", "--tokenize-prompt", "--flush-cache")
    assert status == 0, output
    line = json.loads(out.read_text())
    assert len(line["itls"]) == len(line["ttfts"]) == len(line["errors"]) == 8 and line["output_lens"] == [48] * 8
    status, output = bench(host, server, tmp_path / "x.jsonl", 2, "--dataset-name", "random")
    assert status == 1 and "Please check your connection" in output  # ShareGPT would be downloaded
    status, output = bench(host, server, tmp_path / "x.jsonl", 2, "--no-such-flag")
    assert status == 2 and "unrecognized arguments: --no-such-flag" in output
    assert not (tmp_path / "x.jsonl").exists()


# ---------------------------------------------------------------- the hook and the pure parts


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), other=st.integers(0, 2**32 - 1), ratio=st.sampled_from([0.0, 0.5, 1.0]))
def test_random_ids_prompts_are_decided_by_the_seed(seed: int, other: int, ratio: float) -> None:
    """As the real sample_random_requests after np.random.seed(args.seed): the same seed, the same prompts."""
    args = argparse.Namespace(
        num_prompts=6, random_input_len=64, random_output_len=8, random_range_ratio=ratio, tokenize_prompt=False
    )
    with contextlib.redirect_stdout(io.StringIO()):
        first, again = (bench_client.sample_requests(args, random.Random(seed)) for _ in range(2))
        different = bench_client.sample_requests(args, random.Random(other))
    assert first == again
    if other != seed:
        assert [row[0] for row in first] != [row[0] for row in different]


def test_the_chat_backend_builds_the_releases_payload_and_other_backends_are_refused() -> None:
    """0.5.23 async_request_openai_chat_completions: one user message, max_completion_tokens, temperature 0 and
    ignore_eos unless the extra body sets them, the extra body merged over; its ITLs spread over each delta's
    tokens only for the chat of a speculative server; a backend the stand-in has no route for is refused."""
    parser = bench_client.build_parser(SGLANG)
    args = parser.parse_args(["--backend", "sglang-oai-chat", "--model", "m", "--extra-request-body", '{"a": 1}'])
    payload = bench_client._payload(args, "hi there", 7)
    assert payload == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi there"}],
        "max_completion_tokens": 7,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "a": 1,
    }
    args.extra_request_body = '{"temperature": 0.5, "chat_template_kwargs": {"thinking": false}}'
    payload = bench_client._payload(args, "hi", 3)
    assert payload["temperature"] == 0.5 and payload["chat_template_kwargs"] == {"thinking": False}
    outputs = [bench_client.Output(1, success=True, itl=[0.4], text_chunks=["two words"], output_len=3)]
    assert bench_client.calculate_metrics(outputs, 1.0, "sglang-oai-chat", 3.0)["mean_itl_ms"] == pytest.approx(200)
    assert bench_client.calculate_metrics(outputs, 1.0, "sglang", 3.0)["mean_itl_ms"] == pytest.approx(400)
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert bench_client.run(parser.parse_args(["--backend", "vllm-chat"])) == 1
    assert "runs only --backend sglang and --backend sglang-oai-chat, not vllm-chat" in said.getvalue()
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(AssertionError, match="tokenize-prompt"):
        bench_client.run(parser.parse_args(["--backend", "sglang-oai-chat", "--tokenize-prompt"]))


def test_only_the_two_entry_points_see_the_stand_in(testhost: Callable[[str], SandboxHost]) -> None:
    """The probe's way of reading SGLang (find_spec without importing) meets the real files."""
    program = (
        "import importlib.util, sys; s = importlib.util.find_spec('sglang'); "
        "print(type(s.loader).__name__, s.origin, any('Standin' in type(f).__name__ for f in sys.meta_path))"
    )
    status, output = foreground(testhost("h200"), f"python -c {shlex.quote(program)}")
    assert status == 0 and output.split() == ["SourceFileLoader", str(SGLANG / "__init__.py"), "False"]
    status, output = foreground(testhost("h200"), "python -c 'import sglang'")
    assert status == 1 and "ModuleNotFoundError" in output  # the real release needs numpy, torch, ...


def real_warning(tmp_path: Path) -> str:
    """What the real release's bench_serving.py prints to stderr when run as `python -m sglang.bench_serving`: the
    real file, run by this interpreter beside a `sglang.benchmark.serving` of one line (its own imports torch)."""
    package = tmp_path / "real" / "sglang"
    (package / "benchmark").mkdir(parents=True)
    for name, text in (
        ("__init__.py", ""),
        ("benchmark/__init__.py", ""),
        ("benchmark/serving.py", "def cli_main(): pass\n"),
    ):
        (package / name).write_text(text)
    (package / "bench_serving.py").write_text((SGLANG / "bench_serving.py").read_text())
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(package.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "sglang.bench_serving"], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stderr.replace(str(package), str(SGLANG))


def test_the_old_entry_point_warns_as_the_real_one_and_the_step_reads_past_it(
    testhost: Callable[..., SandboxHost], tmp_path: Path
) -> None:
    """`-m sglang.bench_serving` prints the real FutureWarning, byte for byte; `-m sglang.benchmark.serving` and the
    old module of a release from before the move (no warning in its file) print none; the step's error line is the
    client's own reason either way."""
    dead = f"--base-url http://127.0.0.1:{free_port()} --ready-check-timeout-sec 1"
    warning = real_warning(tmp_path)
    assert "FutureWarning: `sglang.bench_serving` is deprecated and will be removed" in warning
    for build, module, warned in (
        ("release", "sglang.bench_serving", warning),
        ("release", "sglang.benchmark.serving", ""),
        ("old-client", "sglang.bench_serving", ""),
    ):
        err = tmp_path / f"{build}-{module}.err"
        status, output = foreground(testhost("h200", sglang=build), f"(python -m {module} {dead} 2> {err})")
        assert status == 1 and output.endswith("is not ready. Exiting.\n"), output
        assert err.read_text() == warned
        assert error_line(output, err.read_text()).endswith("is not ready. Exiting.")
    status, output = foreground(testhost("h200", sglang="old-client"), f"python -m sglang.benchmark.serving {dead}")
    assert status == 1 and "No module named sglang.benchmark.serving" in output  # as a real release of then


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["python", "-m", "sglang.launch_server", "--port", "1"], "sglang.launch_server"),
        (["python", "-u", "-X", "dev", "-msglang.bench_serving"], "sglang.bench_serving"),
        (["python", "-m", "sglang.benchmark.serving", "--seed", "1"], "sglang.benchmark.serving"),
        (["python", "-W", "ignore", "-m", "json.tool"], "json.tool"),
        (["python", "prog.py", "-m", "sglang.launch_server"], None),
        (["python", "-c", "pass", "-m", "sglang.launch_server"], None),
    ],
)
def test_the_hook_reads_the_module_from_the_command_line(argv: list[str], module: str | None) -> None:
    assert hook.module_run(argv) == module


def test_the_launch_flags_are_the_real_releases() -> None:
    parser = launch_args.build_parser(SGLANG)
    args = parser.parse_args(["--model", "m", "--tp", "8", "--speculative-draft-model", "d", "--trust-remote-code"])
    assert (args.model_path, args.tp_size, args.speculative_draft_model_path, args.trust_remote_code) == (
        "m",
        8,
        "d",
        True,
    )
    args = parser.parse_args(["--model-path", "m", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"])
    assert args.reasoning_parser == "kimi_k2"
    backends = next(a for a in parser._actions if a.dest == "attention_backend").choices
    assert backends is not None and {"trtllm_mla", "flashinfer", "triton", "fa3", "fa4"} <= set(backends)
    assert "cutlass_mla" not in backends  # gone in 0.5.23


@pytest.mark.parametrize("flags", [[], ["--trust-remote-code"], ["--skip-tokenizer-init"]])
def test_a_custom_tokenizer_needs_trust_remote_code_as_in_sglang(tmp_path: Path, flags: list[str]) -> None:
    """The test Hub's Kimi target ships its tokenizer as remote code (tokenizer_config.json's auto_map): SGLang
    0.5.23 stops without --trust-remote-code (srt/utils/hf_transformers/tokenizer.py), and so does the stand-in."""
    files = target_repo().files
    for name in ("config.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes(files[name].content)
    argv = ["--model-path", str(tmp_path), "--tp-size", "8", *flags]
    refused = "Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available"
    if flags:
        assert launch.resolve(launch_args.build_parser(SGLANG).parse_args(argv), argv).draft_tokens is None
    else:
        with pytest.raises(RuntimeError, match=refused):
            launch.resolve(launch_args.build_parser(SGLANG).parse_args(argv), argv)
    real = ast.parse((SGLANG / "srt" / "utils" / "hf_transformers" / "tokenizer.py").read_text())
    texts = [node.value for node in ast.walk(real) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert launch.CUSTOM_TOKENIZER_ERROR in texts  # the real release's words


def test_the_switches_file_is_checked() -> None:
    assert faults.parse({}) == faults.Switches()
    assert faults.parse({"accept_length": 3, "startup_s": 0}).accept_length == 3.0
    assert faults.parse({"broken_drafter": True}).broken_drafter is True
    assert faults.Switches().physics == simulation.DEFAULT_PHYSICS  # the landscape's defaults: the constants
    landscape = faults.parse({"tree_gain": 0, "batch_slowdown": 0.05, "drafter_profiles": {"d": {"chat": 2}}})
    assert landscape.physics == simulation.Physics(0.0, simulation.VERIFY_COST_PER_TOKEN, 0.05, {"d": {"chat": 2}})
    for bad in (
        {"broken_drafter": 1},
        {"tree_gain": -0.1},
        {"verify_cost_per_token": None},
        {"drafter_profiles": {"d": {"poetry": 1.0}}},
        {"drafter_profiles": {"d": {"chat": 0}}},
        {"drafter_profiles": {"d": 1.0}},
        {"drafter_profiles": ["d"]},
        {"fault": "explode"},
        {"acept_length": 3.0},
        {"startup_s": "1"},
        {"decode_tokens_per_s": None},
        [],
    ):
        with pytest.raises(ValueError):
            faults.parse(bad)


@given(
    completion=st.integers(min_value=0, max_value=2000),
    accept=st.floats(min_value=1.0, max_value=16.0),
    draft=st.integers(min_value=2, max_value=16),
)
def test_decode_steps_add_up_and_follow_sglangs_formulas(completion: int, accept: float, draft: int) -> None:
    chunks = simulation.steps(completion, accept)
    assert sum(chunks) == completion and all(size >= 1 for size in chunks)
    assert all(size <= max(1, int(accept) + 1) for size in chunks)
    counts = simulation.spec_counts(chunks, draft)
    if completion <= 1:
        assert counts is None  # no verify step: SGLang reports no spec_* fields
        return
    assert counts is not None
    meta = counts.meta_info(completion)
    assert meta["spec_accept_length"] == completion / counts.verify_ct
    assert 0 <= meta["spec_accept_rate"] <= 1 or accept > draft


@given(prompt=st.text(max_size=200), draft=st.integers(min_value=1, max_value=16))
def test_acceptance_is_deterministic_and_bounded(prompt: str, draft: int) -> None:
    value = simulation.accept_length(prompt, draft, None)
    assert value == simulation.accept_length(prompt, draft, None) and 1.0 <= value <= draft


@settings(max_examples=50, deadline=None)
@given(prompt=st.text(max_size=200), index=st.integers(min_value=0, max_value=300))
def test_a_broken_drafter_leaves_the_greedy_output_from_its_divergence_index_on(prompt: str, index: int) -> None:
    good, broken = simulation.output_token(prompt, index, False), simulation.output_token(prompt, index, True)
    assert (good == broken) == (index < simulation.divergence_index(prompt))
    assert simulation.divergence_index(prompt) in simulation.BROKEN_FROM  # early: within the first 10 tokens
