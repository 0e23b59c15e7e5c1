"""The `benchmark` kind: reading bench_serving's JSONL line, failing short runs, refusing unlike
comparisons, and (through the real sshd and the SGLang stand-in) the whole step with its report."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from executor.faces.cli import main
from executor.redact import Redactor
from executor.runbook.planner import PlanContext
from executor.transport.base import Collector, CommandResult
from hostprograms.probe import BENCH_ENTRY_POINTS
from sandbox.model_configs import drafter_config, target_config
from sandbox.sglang_standin import simulation
from steps.bench_entry import ENTRY_MARKER, ENTRY_POINTS, choose_lines, ran_entry_point
from steps.benchmark import BenchmarkStep, error_line
from steps.benchmark_report import md_text
from steps.benchmark_results import (
    FLOAT_FIELDS,
    INT_FIELDS,
    JSONL_MARKER,
    MEASURED_MAX,
    NO_ACCEPT_LENGTH,
    RunInfo,
    jsonl_lines,
    parse_run,
    points,
)
from steps.request_records import DETAILS_MAX_TOKENS, TEXT_MAX_CHARS, RecordsFile, bench_records, file_name
from tests.clirun import runbook_cli


def real_line(**changes: Any) -> dict[str, Any]:
    """A line as sglang 0.5.23's benchmark/serving.py writes it (every key of its `result`)."""
    line: dict[str, Any] = {
        "tag": None,
        "backend": "sglang",
        "dataset_name": "random-ids",
        "request_rate": float("inf"),
        "max_concurrency": 4,
        "sharegpt_output_len": None,
        "random_input_len": 256,
        "random_output_len": 64,
        "random_range_ratio": 1.0,
        "server_info": {"version": "0.5.23", "internal_states": [{"avg_spec_accept_length": 4.2}]},
        "duration": 2.5,
        "completed": 16,
        "total_input_tokens": 4096,
        "total_input_text_tokens": 4096,
        "total_input_vision_tokens": 0,
        "total_output_tokens": 1024,
        "total_output_tokens_retokenized": 1024,
        "request_throughput": 6.4,
        "input_throughput": 1638.4,
        "output_throughput": 409.6,
        "total_throughput": 2048.0,
        "max_output_tokens_per_s": 512.0,
        "max_concurrent_requests": 4,
        "concurrency": 3.9,
        "accept_length": 4.2,
    }
    for metric in ("e2e_latency", "ttft", "tpot", "itl"):
        for number, stat in enumerate(("mean", "median", "std", "p90", "p95", "p99")):
            line[f"{stat}_{metric}_ms"] = 10.0 * (number + 1)
    line.update(changes)
    return line


def asked(concurrency: int, prompts: int, repeat: int = 1, seed: int = 1) -> RunInfo:
    """A run's RunInfo, as the step fills it in."""
    when = "2026-12-01T12:00:00.000+00:00"
    command = f"python3 -m sglang.bench_serving --max-concurrency {concurrency} --seed {seed}"
    return RunInfo(
        max_concurrency=concurrency,
        num_prompts=prompts,
        repeat=repeat,
        seed=seed,
        started_at=when,
        finished_at=when,
        command=command,
    )


def finished(stdout: str, exit_code: int = 0, stderr: str = "") -> CommandResult:
    collect = Collector()
    collect.stdout.feed(stdout.encode())
    collect.stderr.feed(stderr.encode())
    return collect.result(exit_code)


def printed(*lines: dict[str, Any], summary: str = "Successful requests: 16\n") -> str:
    """What the step's script prints: bench_serving's summary, the marker, then the JSONL file."""
    return summary + JSONL_MARKER + "\n" + "".join(json.dumps(line) + "\n" for line in lines)


WARNING = (  # what `python -m sglang.bench_serving` of 0.5.23 prints to stderr first
    "/venv/lib/python3.11/site-packages/sglang/bench_serving.py:13: FutureWarning: `sglang.bench_serving` is "
    "deprecated and will be removed in a future release; use `sglang.benchmark.serving` instead "
    "(e.g. `python -m sglang.benchmark.serving`).\n  warnings.warn(\n"
)
STEP = BenchmarkStep(id="bench", server="deploy", concurrencies=[4], num_prompts=16)


def test_a_real_line_becomes_typed_facts() -> None:
    run = parse_run(json.dumps(real_line()), asked(4, 16))
    assert (run.max_concurrency, run.num_prompts, run.completed) == (4, 16, 16)
    assert run.output_throughput == 409.6 and run.request_throughput == 6.4 and run.total_output_tokens == 1024
    assert (run.mean_ttft_ms, run.median_tpot_ms, run.p99_itl_ms, run.p99_e2e_latency_ms) == (10.0, 20.0, 60.0, 60.0)
    assert run.accept_length == 4.2 and run.concurrency == 3.9 and run.unknown == {}
    assert run.shortfall is None


def test_unknown_metrics_are_null_with_a_reason() -> None:
    line = real_line(accept_length=None, mean_tpot_ms=float("nan"))
    del line["p99_itl_ms"]
    run = parse_run(json.dumps(line), asked(4, 16))
    assert run.accept_length is None and run.unknown["accept_length"] == NO_ACCEPT_LENGTH
    assert run.mean_tpot_ms is None and "NaN" in run.unknown["mean_tpot_ms"].replace("nan", "NaN")
    assert run.p99_itl_ms is None and "no 'p99_itl_ms'" in run.unknown["p99_itl_ms"]


@pytest.mark.parametrize(
    ("text", "message"),
    [("not json", "not JSON"), ("[1, 2]", "not a JSON object"), (json.dumps(real_line(completed=None)), "completed")],
)
def test_a_line_without_a_request_count_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_run(text, asked(1, 1))


#: What a bench_serving line may hold where a number belongs: NaN, infinities, 1e308, negatives, integers of 400
#: digits, text, a list, a mapping
numbers = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.sampled_from([0, -1, 1e308, -1e308, 10**400, -(10**400), 1e12, 10**12 - 1]),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@given(
    values=st.fixed_dictionaries({name: numbers for name in (*FLOAT_FIELDS, *INT_FIELDS, "accept_length")}),
    completed=st.integers(0, 10**6),
)
def test_any_numbers_are_kept_when_usable_and_explained_when_not(values: dict[str, Any], completed: int) -> None:
    """A usable number (finite, not negative, below MEASURED_MAX) is kept; anything else is null with the field's
    name and why in `unknown`, never an OverflowError or a median of 1e308 that overflows to infinity."""
    run = parse_run(json.dumps(real_line(completed=completed, **values)), asked(2, 100))
    for name, value in values.items():
        kept = getattr(run, name)
        usable = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < MEASURED_MAX
        if usable and (isinstance(value, int) or math.isfinite(value)):
            assert kept == (int(value) if name in INT_FIELDS else float(value)) and name not in run.unknown
        else:
            assert kept is None and name in run.unknown[name]
    json.dumps(run.model_dump(mode="json"), allow_nan=False)  # facts never carry NaN
    assert (run.shortfall is None) == (completed >= 100)
    summed = points([run, run.model_copy(update={"repeat": 2})], 0.05)  # the median of two, summed as the report does
    json.dumps([p.model_dump(mode="json") for p in summed], allow_nan=False)


@pytest.mark.parametrize("completed", [-1, 10**400, 1e308, "16", True])
def test_a_request_count_that_is_no_count_is_refused_naming_it(completed: Any) -> None:
    with pytest.raises(ValueError, match="'completed' is"):
        parse_run(json.dumps(real_line(completed=completed)), asked(1, 1))


def test_the_last_marker_starts_the_jsonl() -> None:
    assert jsonl_lines("noise\n") is None
    assert jsonl_lines(f"{JSONL_MARKER}\nold\n{JSONL_MARKER}\n\n{{}}\n") == ["{}"]


def test_a_run_that_completed_fewer_requests_fails_naming_the_concurrency_and_repeat() -> None:
    run, failure = STEP.read_run(finished(printed(real_line(completed=11))), asked(4, 16, repeat=2, seed=7))
    assert run is not None and run.completed == 11 and (run.repeat, run.seed) == (2, 7)
    assert failure == "concurrency 4, repeat 2/3: only 11 of 16 requests completed"


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (finished("", 1, "Traceback ...\nConnectionRefusedError: [Errno 111]"), "exited 1: ConnectionRefusedError"),
        (finished("Server at u is not ready. Exiting.\n", 1, WARNING), "exited 1: Server at u is not ready. Exiting."),
        (finished("Starting warmup\n", 1, WARNING + "ValueError: Initial test run failed\n"), "1: ValueError: Initial"),
        (finished(printed()), "exited 0 but wrote no JSONL line"),
        (finished("Successful requests: 16\n"), "exited 0 but wrote no JSONL line"),
        (finished(JSONL_MARKER + "\n{oops\n"), "not JSON"),
    ],
)
def test_a_broken_run_fails_with_the_reason(result: CommandResult, message: str) -> None:
    run, failure = STEP.read_run(result, asked(4, 16))
    assert run is None and failure is not None and failure.startswith("concurrency 4, repeat 1/3: ")
    assert message in failure


def test_the_command_is_the_real_bench_serving_command() -> None:
    step = BenchmarkStep(id="b", server="d", python="~/venv/bin/python", input_len=256, output_len=64, num_prompts=20)
    script = step.script("http://127.0.0.1:30000", 16, 1, 1)
    warmup, command = [line for line in script.splitlines() if '-m "$entry"' in line]
    assert command.startswith('"${HOME:?is not set}"/venv/bin/python -m "$entry" --backend sglang ')
    choose = script.index('entry=$("${HOME:?is not set}"/venv/bin/python -c ')
    assert choose < script.index(shlex.quote(ENTRY_MARKER)) < script.index(warmup)  # chosen with its python, shown
    for flags in (
        "--base-url http://127.0.0.1:30000 --dataset-name random-ids",
        "--random-input-len 256 --random-output-len 64 --random-range-ratio 1.0 --num-prompts 20",
        "--max-concurrency 16 --warmup-requests 0 --disable-tqdm --seed 1 --flush-cache",
        '--output-file "$out/bench.jsonl"',
    ):
        assert flags in command
    # the client's warm-up (1 request by default) is a run of its own before the /metrics window, never flushed by
    # it; the measured run sends none (bench_serving's would fall inside the window: steps/benchmark.py `metered`)
    assert "--num-prompts 1 --max-concurrency 16 --warmup-requests 0 --disable-tqdm --seed 1 --output-file" in warmup
    assert "--flush-cache" not in warmup
    # of at most 32 output tokens, as the client's own warm-up (benchmark/serving.py: min(output_len, 32))
    assert "--random-input-len 256 --random-output-len 32 " in warmup
    assert script.index(warmup) < script.index("metrics.before") < script.index(command)
    assert script.index(command) < script.index("metrics.after")


def release_like(root: Path, *files: str) -> Path:
    """A folder holding a package `sglang` with these files (empty) beside its __init__.py."""
    for name in ("__init__.py", *files):
        (root / "sglang" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "sglang" / name).write_text("")
    return root


@pytest.mark.parametrize(
    ("files", "entry", "said"),
    [
        (("benchmark/serving.py", "bench_serving.py"), "sglang.benchmark.serving", ""),
        (("bench_serving.py",), "sglang.bench_serving", ""),
        (("benchmark/serving.py",), "sglang.benchmark.serving", ""),
        ((), None, "has no serving benchmark: neither sglang.benchmark.serving (benchmark/serving.py) nor "
         "sglang.bench_serving (bench_serving.py)"),
        (None, None, "sglang is not installed for "),
    ],
)  # fmt: skip
def test_the_host_runs_the_current_entry_point_where_its_sglang_has_it(
    tmp_path: Path, files: tuple[str, ...] | None, entry: str | None, said: str
) -> None:
    """The script's choice, run by bash with a Python whose `sglang` is a folder of these files (None: none)."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(release_like(tmp_path, *files) if files is not None else "")}
    script = choose_lines(shlex.quote(sys.executable)) + "echo chose-and-went-on\n"
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert ran_entry_point(done.stdout) == entry
    if entry:
        assert done.returncode == 0 and done.stdout.endswith(f"{ENTRY_MARKER}{entry}\nchose-and-went-on\n")
    else:  # the script ends there, with the reason as the last line of stderr (what the step's record shows)
        assert done.returncode == 1 and "chose-and-went-on" not in done.stdout
        assert said in error_line(done.stdout, done.stderr)
        run, failure = STEP.read_run(finished(done.stdout, 1, done.stderr), asked(4, 16))
        assert run is None and failure is not None and "the serving benchmark exited 1: " in failure
        assert failure.endswith(error_line(done.stdout, done.stderr))


def test_a_run_asks_for_per_request_details_only_within_their_cap() -> None:
    """`--output-details` up to DETAILS_MAX_TOKENS output tokens asked (prompts x output_len), checked before the
    run: a larger line would be cut by what the controller keeps of a command's output, and the run fail."""
    fits = DETAILS_MAX_TOKENS // 1000
    step = BenchmarkStep(id="b", server="d", output_len=1000, num_prompts=fits, concurrencies=[1])
    assert "--output-details" in step.command("http://x", 1, 1)
    bigger = step.model_copy(update={"num_prompts": fits + 1})
    assert "--output-details" not in bigger.command("http://x", 1, 1)


@pytest.mark.parametrize(
    "details",
    [
        {},  # no --output-details: nothing to keep
        {
            "input_lens": [1, 2],
            "output_lens": [3],
            "ttfts": [0.1],
            "itls": [[]],
            "generated_texts": [""],
            "errors": [""],
        },
        {"input_lens": 1, "output_lens": 1, "ttfts": 1, "itls": 1, "generated_texts": 1, "errors": 1},
    ],
)
def test_details_that_are_not_one_list_per_field_of_one_length_make_no_records(details: dict[str, Any]) -> None:
    assert bench_records(json.dumps(real_line() | details), {"step": "b"}) is None


def test_a_record_keeps_times_in_ms_and_its_text_cut_to_the_cap() -> None:
    text = "w " * TEXT_MAX_CHARS
    details = {"input_lens": [4], "output_lens": [2], "ttfts": [0.25], "itls": [[0.01, float("nan")]]}
    details |= {"generated_texts": [text], "errors": [""]}
    [record] = bench_records(json.dumps(real_line() | details), {"step": "b"}) or []
    assert record == {
        "step": "b",
        "index": 0,
        "input_len": 4,
        "output_len": 2,
        "ttft_ms": 250.0,
        "itl_ms": [10.0, None],
        "error": None,
        "generated_chars": 2 * TEXT_MAX_CHARS,
        "generated_text": text[:TEXT_MAX_CHARS],
    }


def test_hostile_counts_and_a_secret_in_the_details_leave_strict_json_without_the_secret(tmp_path: Path) -> None:
    """Python's json reads NaN and 1e999 in a client's line; the records file, strict JSON, keeps them as unknown
    (they used to stop the step with a ValueError). A token the server echoes reaches the file redacted."""
    secret = "hf_" + "s3cr3t" * 4
    counts: list[Any] = [float("nan"), float("inf"), -1, "5", True, 7]
    details = {"input_lens": counts, "output_lens": counts[::-1], "ttfts": [0.1] * 6, "itls": [[]] * 6}
    details |= {"generated_texts": [f"echo {secret}"] * 6, "errors": [f"401 for token {secret}"] * 6}
    records = RecordsFile(tmp_path, "bench", Redactor([secret]))
    records.append(bench_records(json.dumps(real_line() | details), {"step": "bench"}) or [])
    text = records.path.read_text()
    assert secret not in text
    read = [
        json.loads(line, parse_constant=lambda word: pytest.fail(f"{word} is no strict JSON"))
        for line in text.splitlines()
    ]
    assert [(r["input_len"], r["output_len"]) for r in read] == [
        (None, 7),
        (None, None),
        (None, None),
        (None, None),
        (None, None),
        (7, None),
    ]


def test_a_lone_surrogate_in_the_details_is_written_as_json_escapes_it(tmp_path: Path) -> None:
    """Before: a host's `"\\ud800"` in a generated text (json.loads gives a lone surrogate) made the UTF-8 write
    raise, and the step failed as a crashed kind."""
    details = {"input_lens": [1], "output_lens": [2], "ttfts": [0.1], "itls": [[]]}
    details |= {"generated_texts": ["half a pair: \ud800"], "errors": [""]}
    records = RecordsFile(tmp_path, "bench", Redactor([]))
    records.append(bench_records(json.dumps(real_line() | details), {"step": "bench"}) or [])
    (line,) = records.path.read_text(encoding="utf-8").splitlines()
    assert "\\ud800" in line and json.loads(line)["generated_text"] == "half a pair: \ud800"


@pytest.mark.parametrize(
    ("step", "name"),
    [("bench", "bench.jsonl"), ("bench[drafter=a/b,tokens=4]", "bench_drafter=a_b,tokens=4_-")],
)
def test_a_records_file_is_named_by_its_step_safely(step: str, name: str) -> None:
    assert file_name(step).startswith(name) and "/" not in file_name(step) and file_name(step).endswith(".jsonl")
    assert file_name("x" * 300) != file_name("x" * 301) and len(file_name("x" * 300)) < 120


def test_plan_shows_one_command_per_run_with_the_server_known_at_run_time() -> None:
    """Three clean runs per concurrency by default, each with its own seed and a flush after the warmup."""
    planned = BenchmarkStep(id="b", server="d").plan(PlanContext("box", {}))
    labels = [f"concurrency {c}, repeat {r}/3" for c in (1, 4, 16) for r in (1, 2, 3)]
    assert [label for label, _ in planned] == labels
    assert all("--base-url '<known at run time: steps.d.facts.base_url>'" in script for _, script in planned)
    assert [f"--seed {seed} --flush-cache" in script for seed, (_, script) in enumerate(planned, start=1)] == [True] * 9
    once = BenchmarkStep(id="b", server="d", concurrencies=[2, 8], repeats=1, seed=40).plan(PlanContext("box", {}))
    assert [label for label, _ in once] == ["concurrency 2", "concurrency 8"]
    assert ["--seed 40 " in once[0][1], "--seed 41 " in once[1][1]] == [True, True]


def test_plan_says_which_client_runs_and_the_warm_up_its_command_leaves_out() -> None:
    """The plan's command names the newest entry point; the summary says the host may run the old one instead."""
    (line,) = BenchmarkStep(id="b", server="d").summary(PlanContext("box", {}))
    assert line.startswith("sglang.benchmark.serving (where the host's SGLang lacks it: the deprecated sglang.bench")
    assert "each after a warm-up run of 1 request(s), outside its /metrics window" in line
    (cold,) = BenchmarkStep(id="b", server="d", warmup_requests=0).summary(PlanContext("box", {}))
    assert "; no warm-up;" in cold


def test_the_probe_reads_the_entry_points_the_step_chooses_from() -> None:
    assert BENCH_ENTRY_POINTS == ENTRY_POINTS  # the host program cannot import steps/: one table, checked


def test_default_prompts_grow_with_concurrency() -> None:
    step = BenchmarkStep(id="b", server="d")
    assert [step.prompts_at(c) for c in (1, 4, 16)] == [8, 16, 64]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"concurrencies": [1, 4, 1]}, "each concurrency may appear once"),
        ({"concurrencies": []}, "at least 1"),
        ({"concurrencies": [0]}, "greater than 0"),
        ({"compare_to": "b"}, "compare_to names this step itself"),
        ({"acceptance": "eval"}, "needs compare_to"),
        ({"repeats": 0}, "greater than 0"),
        ({"seed": -1}, "greater than or equal to 0"),
        ({"seed": 2**32 - 8, "repeats": 3}, "the last run's seed would be 4294967296"),
        # counted, not listed: a schedule of 3 * 2**31 runs made first would take minutes and all the memory
        ({"repeats": 2**31}, "6,442,450,944 runs .* at most 1,000"),
        ({"repeats": 334}, "1,002 runs"),
        ({"spread_threshold": -0.1}, "greater than or equal to 0"),
    ],
)
def test_parameters_are_checked(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BenchmarkStep(id="b", server="d", **params)


def test_repeats_from_a_var_are_the_sites_and_a_value_that_does_not_fit_stops_the_plan_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`repeats: $bench_repeats` (the flagship's): the site's value decides the runs; one that is no count above 0,
    or makes more runs than MAX_RUNS, is refused before anything runs, at the step's line, naming the var."""
    step = BenchmarkStep(id="b", server="d", concurrencies=[2, 8], repeats="$bench_repeats")
    labels = [label for label, _ in step.plan(PlanContext("box", {"bench_repeats": "2"}))]
    assert labels == [f"concurrency {c}, repeat {r}/2" for c in (2, 8) for r in (1, 2)]
    (line,) = step.summary(PlanContext("box", {"bench_repeats": "1"}))
    assert "concurrency 2, 8 x 1 repeat, " in line and "run 1 of 2 " in line
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: t\nhosts: {box: {address: 127.0.0.1}}\nvars: {bench_repeats: 3}\nsteps:\n"
        "  - {id: d, kind: shell, script: 'true'}\n"
        "  - {id: b, kind: benchmark, server: d, concurrencies: [1, 4], repeats: $bench_repeats}\n"
    )
    for value, said in (
        ("0", "bench_repeats = '0' does not fit: expected a whole number above 0"),
        ("501", "bench_repeats = '501' does not fit: 1,002 runs (workloads and their categories x concurrencies x "),
    ):
        assert main(["plan", str(book), "--var", f"bench_repeats={value}"]) == 2
        assert f"{book}:6:5: step 'b': repeats: runbook var {said}" in capsys.readouterr().err


def test_it_needs_the_steps_it_reads() -> None:
    step = BenchmarkStep(id="b", server="d", compare_to="base", acceptance="eval")
    assert step.needs() == {"d", "base", "eval"}
    assert [g.that for g in step.effective_gates()] == ["facts.failure is none"]


def test_comparing_unlike_benchmarks_is_refused_before_anything_runs(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The baseline and server facts come from shell steps here: only facts matter to the step."""
    baseline = {"label": "baseline", "input_len": 512, "output_len": 64, "runs": [], "points": [], "failure": None}
    steps = [
        {"id": "deploy", "kind": "shell", "parse": "json", "script": 'echo \'{"base_url": "http://127.0.0.1:9"}\''},
        {"id": "base", "kind": "shell", "parse": "json", "script": f"echo '{json.dumps(baseline)}'"},
        {"id": "dflash", "kind": "benchmark", "server": "deploy", "compare_to": "base", "input_len": 256},
    ]
    path = write_runbook("name: t\n__HOSTS__\nsteps:\n" + "".join(f"  - {json.dumps(s)}\n" for s in steps))
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs")]) == 1
    err = capsys.readouterr().err
    assert "the baseline 'base' ran 512 input / 64 output tokens, this step 256 / 512" in err
    assert "not be comparable" in err
    assert not list((tmp_path / "logs").glob("*/report.json"))


# ----------------------------------------------------------------------------- through sshd, with the stand-in


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def yaml_steps(*steps: dict[str, Any]) -> str:
    return "steps:\n" + "".join(f"  - {json.dumps(step)}\n" for step in steps)


@pytest.fixture
def standin(
    testhost: Any, write_runbook: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    """The test host with a target and a drafter folder, a free port, and a fast-starting stand-in; its SGLang
    build the test's parameter (indirect), else the release.

    Whatever the test leaves running on the port is stopped afterwards by a `deploy` stop step."""
    host = testhost("h200", sglang=getattr(request, "param", "release"))
    target, drafter = tmp_path / "models" / "Kimi-K2.6", tmp_path / "models" / "Kimi-K2.6-DFlash"
    for folder, config in ((target, target_config()), (drafter, drafter_config())):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))
    switches = host.home / "sglang-standin.json"
    switches.write_text(json.dumps({"startup_s": 0.3, "decode_tokens_per_s": 400.0}))
    port = free_port()
    deploy = {"kind": "deploy", "model_path": str(target), "tp_size": 1, "port": port, "ready_timeout": 60}
    deploy |= {"attention_backend": "fa3", "trust_remote_code": True}
    yield {"host": host, "port": port, "deploy": deploy, "drafter": str(drafter)}
    stop = write_runbook(
        "name: stop\n__HOSTS__\n" + yaml_steps({"id": "stop", "kind": "stop_server", "port": port}),
        name="stop.yaml",
        hosts=host.host_yaml(),
    )
    runbook_cli("run", str(stop), "--log-dir", str(tmp_path / "stop-logs"))
    switches.unlink(missing_ok=True)


def test_baseline_then_dflash_with_the_report(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = {"concurrencies": [1, 4], "input_len": 32, "output_len": 24, "num_prompts": 8, "repeats": 1}
    dflash_deploy = standin["deploy"] | {"draft_model_path": standin["drafter"], "speculative_num_draft_tokens": 8}
    dflash_deploy |= {"draft_attention_backend": "fa3"}
    body = "name: bench\n__HOSTS__\n" + yaml_steps(
        {"id": "deploy_baseline", **standin["deploy"]},
        {"id": "benchmark_baseline", "kind": "benchmark", "server": "deploy_baseline", "label": "baseline", **lengths},
        {"id": "deploy_dflash", **dflash_deploy},
        {"id": "eval", "kind": "eval_acceptance", "server": "deploy_dflash", "prompt_sets": ["math"], "limit": 2},
        {
            "id": "benchmark_dflash",
            "kind": "benchmark",
            "server": "deploy_dflash",
            "label": "dflash",
            "compare_to": "benchmark_baseline",
            "acceptance": "eval",
            "gates": [{"that": "facts.failure is none"}, {"that": "facts.speedup.min >= 1.0"}],
            **lengths,
        },
    )
    path = write_runbook(body, hosts=standin["host"].host_yaml())
    log_dir = tmp_path / "logs"
    code = main(["run", str(path), "--log-dir", str(log_dir)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["status", "--log-dir", str(log_dir), "--json"]) == 0
    records = {r["step"]: r for r in json.loads(capsys.readouterr().out)["steps"]}
    baseline, dflash = records["benchmark_baseline"]["facts"], records["benchmark_dflash"]["facts"]

    for facts in (baseline, dflash):
        assert [run["max_concurrency"] for run in facts["runs"]] == [1, 4]
        assert all(run["completed"] == 8 and run["output_throughput"] > 0 for run in facts["runs"])
        assert all(run["total_output_tokens"] == 8 * 24 for run in facts["runs"])
        assert facts["base_url"] == f"http://127.0.0.1:{standin['port']}" and facts["failure"] is None
        # the release has both entry points: the current one ran, and the record says so
        assert {run["entry_point"] for run in facts["runs"]} == {"sglang.benchmark.serving"}
        assert all(" -m sglang.benchmark.serving --backend sglang " in run["command"] for run in facts["runs"])
    assert all(run["accept_length"] is None for run in baseline["runs"])
    assert baseline["runs"][0]["unknown"]["accept_length"].startswith("the server reported no speculative")
    assert all(run["accept_length"] > 1 for run in dflash["runs"])
    assert baseline["speedup"] is None and baseline["report"] is None
    assert set(dflash["speedup"]["by_concurrency"]) == {"1", "4"} and dflash["speedup"]["min"] >= 1.0

    (run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    assert dflash["report"]["json_file"] == str(run_dir / "report.json")
    assert report["tables"][0]["title"] == "Acceptance length per prompt set"
    assert report["tables"][0]["rows"][0][:2] == ["math", "2"]
    assert [f["path"] for f in report["figures"]][:2] == ["speedup.png", "pareto.png"]
    for figure in report["figures"]:
        assert (run_dir / figure["path"]).read_bytes().startswith(b"\x89PNG")
    assert dflash["report"]["pareto_file"] == str(run_dir / "pareto.png")
    # provenance: the servers as they ran; what no step here says (no probe, download or verify) is named
    provenance = report["provenance"]
    deployed = {d["side"]: d for d in provenance["deployments"]}
    assert deployed["baseline"]["argv"] == records["deploy_baseline"]["facts"]["argv"]
    assert deployed["dflash"]["draft_model_path"] == standin["drafter"]
    assert {d["server_version"] for d in deployed.values()} == {"0.5.23"} and deployed["dflash"]["gpus"] == 1
    assert [[r["concurrency"] for r in b["runs"]] for b in provenance["benchmarks"]] == [[1, 4], [1, 4]]
    assert provenance["repos"] == [] and provenance["gpus"] is None
    unknown = provenance["unknown"]
    assert unknown["gpus"] == "no probe step ran on host box: the GPU model, count and driver are not known"
    assert unknown["deployments.dflash.draft_model_path"].endswith(
        f"names {standin['drafter']}: its commit is not known"
    )
    assert "\n## Provenance: not known\n" in (run_dir / "report.md").read_text()
    markdown = (run_dir / "report.md").read_text()
    assert main(["report", str(run_dir)]) == 0
    shown = capsys.readouterr().out
    check_request_records(run_dir, records, provenance, shown)
    assert main(["report", str(run_dir), "--format", "csv"]) == 0  # the real run's tidy rows
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["cell"], r["concurrency"]) for r in rows] == [(s, c) for s in ("baseline", "dflash") for c in "14"]
    assert {(r["client"], r["dataset"], r["sglang_version"], r["gpu_model"]) for r in rows} == {
        ("sglang.benchmark.serving", "random-ids", "0.5.23", "")
    }
    assert [r["requests_file"] for r in rows[::2]] == [records[s]["facts"]["requests_file"] for s in BENCHMARKS]
    exact = [run["acceptance"]["exact"]["value"] for run in dflash["runs"]]  # one repeat a concurrency here
    assert [float(r["accept_length_exact"]) for r in rows[2:]] == exact and {
        r["accept_length_exact"] for r in rows[:2]
    } == {""}
    for table in report["tables"]:
        assert f"## {table['title']}" in markdown and table["title"] in shown
        for row in table["rows"]:
            assert "| " + " | ".join(map(md_text, row)) + " |" in markdown
            assert all(cell in shown for cell in row)


def test_a_server_that_does_not_answer_fails_at_the_first_concurrency(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real client (here the stand-in client) exits 1 when its warm-up request fails."""
    server = {"id": "deploy", "kind": "shell", "parse": "json"}
    server["script"] = f'echo \'{{"base_url": "http://127.0.0.1:{standin["port"]}"}}\''
    bench = {"id": "bench", "kind": "benchmark", "server": "deploy", "concurrencies": [1, 4], "input_len": 8}
    bench |= {"output_len": 8, "num_prompts": 2, "repeats": 1, "extra_args": ["--ready-check-timeout-sec", "1"]}
    path = write_runbook("name: t\n__HOSTS__\n" + yaml_steps(server, bench), hosts=standin["host"].host_yaml())
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs")]) == 1
    err = capsys.readouterr().err
    assert "the benchmark did not complete" in err
    url = f"http://127.0.0.1:{standin['port']}/v1/models"
    said = f"concurrency 1: sglang.benchmark.serving exited 1: Server at {url} is not ready. Exiting."
    assert f'facts.failure = "{said}"' in err
    assert "concurrency 4" not in err.split("facts.failure")[1].splitlines()[0]


@pytest.mark.parametrize("standin", ["old-client"], indirect=True)
def test_a_sglang_with_only_the_old_client_runs_it_and_the_record_says_so(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release from before the move (sandbox/prepare.py OLD_CLIENT_BUILD): no sglang.benchmark.serving, so the
    step runs sglang.bench_serving, and its facts and the report's provenance name it."""
    lengths = {"concurrencies": [2], "input_len": 8, "output_len": 8, "num_prompts": 2, "repeats": 1}
    body = "name: old\n__HOSTS__\n" + yaml_steps(
        {"id": "deploy", **standin["deploy"]},
        {"id": "base", "kind": "benchmark", "server": "deploy", **lengths},
        {"id": "again", "kind": "benchmark", "server": "deploy", "compare_to": "base", **lengths},
    )
    path = write_runbook(body, hosts=standin["host"].host_yaml())
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs")]) == 0, capsys.readouterr().err
    facts = facts_of(tmp_path / "logs", capsys)
    (run,) = facts["base"]["runs"]
    assert run["entry_point"] == "sglang.bench_serving" and run["completed"] == 2
    assert " -m sglang.bench_serving --backend sglang " in run["command"]
    (run_dir,) = [p for p in (tmp_path / "logs").iterdir() if p.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    commands = [r["command"] for b in report["provenance"]["benchmarks"] for r in b["runs"]]
    assert len(commands) == 2 and all(" -m sglang.bench_serving " in command for command in commands)


def dflash_deploy(standin: dict[str, Any]) -> dict[str, Any]:
    deploy = standin["deploy"] | {"draft_model_path": standin["drafter"], "speculative_num_draft_tokens": 8}
    return deploy | {"draft_attention_backend": "fa3"}


def facts_of(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Each step's facts in the latest run, as `runbook status --json` shows them."""
    capsys.readouterr()
    assert main(["status", "--log-dir", str(log_dir), "--json"]) == 0
    return {r["step"]: r["facts"] for r in json.loads(capsys.readouterr().out)["steps"]}


#: A shell step sending math prompts (chat-templated) to the server before the benchmark, as the flagship's eval
#: does: they raise /server_info's running average of the acceptance length.
MATH_FIRST = r"""python3 - <<'EOF'
import json, urllib.request
url = "http://127.0.0.1:PORT"
def post(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)
lengths = []
for i in range(4):
    turn = {"role": "user", "content": f"Solve 12 + {i} * 7 = x. How many apples in total?"}
    prompt = {"messages": [turn], "max_tokens": 200, "temperature": 0, "return_meta_info": True}
    lengths.append(post("/v1/chat/completions", prompt)["choices"][0]["meta_info"]["spec_accept_length"])
average = post("/server_info")["internal_states"][0]["avg_spec_accept_length"]
print(json.dumps({"accept_lengths": lengths, "running_average": average}))
EOF
"""


def test_every_run_is_clean_no_cached_prefix_and_its_own_acceptance(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the cache-modelling stand-in, two concurrencies x 2 repeats: no measured request finds a cached prefix
    (without a flush and a seed per run, the second run re-sends the first one's prompts and each warmup
    re-sends the first prompt), every run pays the full prefill (its TTFT never drops with the run number), and
    the per-run acceptance length is the run's own, not the running average that the math prompts sent before
    the benchmark raised."""
    bench = {"id": "bench", "kind": "benchmark", "server": "deploy", "concurrencies": [1, 2], "repeats": 2}
    bench |= {"input_len": 1024, "output_len": 16, "num_prompts": 4}
    math_first = {"id": "math", "kind": "shell", "parse": "json"}
    math_first["script"] = MATH_FIRST.replace("PORT", str(standin["port"]))
    body = "name: clean\n__HOSTS__\n" + yaml_steps({"id": "deploy", **dflash_deploy(standin)}, math_first, bench)
    path = write_runbook(body, hosts=standin["host"].host_yaml())
    log_dir = tmp_path / "logs"
    assert main(["run", str(path), "--log-dir", str(log_dir)]) == 0, capsys.readouterr().err
    facts = facts_of(log_dir, capsys)
    runs = facts["bench"]["runs"]
    order = [(r["max_concurrency"], r["repeat"], r["seed"]) for r in runs]
    assert order == [(1, 1, 1), (1, 2, 2), (2, 1, 3), (2, 2, 4)]  # a seed per run: no two share prompts

    log = Path(facts["deploy"]["log_file"]).read_text()
    benchmark_part = log.split('"GET /v1/models HTTP/1.1"', 1)[1]  # from bench_serving's first request on
    prefills = re.findall(r"Prefill batch, #new-seq: 1, #new-token: (\d+), #cached-token: (\d+),", benchmark_part)
    assert len(prefills) == 4 * (4 + 1)  # each run: its warmup, then its 4 prompts
    assert {cached for _, cached in prefills} == {"0"} and {new for new, _ in prefills} == {"1024"}
    assert benchmark_part.count("Cache flushed successfully!") == 4  # once per run, after its warmup
    full_prefill_ms = simulation.prefill_seconds(1024) * 1000
    assert all(run["median_ttft_ms"] >= 0.9 * full_prefill_ms for run in runs), [r["median_ttft_ms"] for r in runs]

    before = facts["math"]
    # what random-ids prompts (raw text, no chat template) get at most
    ceiling = simulation.DEFAULT_ACCEPT["chat"] * simulation.TEMPLATE_SCALE["raw"] + simulation.JITTER
    assert min(before["accept_lengths"]) > ceiling and before["running_average"] > ceiling
    assert all(1 < run["accept_length"] <= ceiling for run in runs)


BENCHMARKS = ("benchmark_baseline", "benchmark_dflash")


def check_request_records(run_dir: Path, steps: dict[str, Any], provenance: dict[str, Any], shown: str) -> None:
    """Each benchmark's per-request records (`--output-details`) and the eval's meta_info: JSONL in the run folder,
    a JSON object a line, one per request sent, named by report.json's provenance and by `runbook report`."""
    named = {b["step"]: b["requests"] for b in provenance["benchmarks"]} | {
        "eval": provenance["acceptance"]["requests"]
    }
    assert named == {
        step: f"hosts/box/requests/{step}.jsonl" for step in ("benchmark_baseline", "benchmark_dflash", "eval")
    }
    read = {}
    for step, path in named.items():
        assert (
            steps[step]["facts"]["requests_file"] == path
            and f"per-request records of {step}: {run_dir / path}" in shown
        )
        read[step] = [json.loads(line) for line in (run_dir / path).read_text().splitlines()]
    for step in BENCHMARKS:
        facts = steps[step]["facts"]
        assert len(read[step]) == sum(run["completed"] for run in facts["runs"]) == 16
        for run in facts["runs"]:
            mine = [r for r in read[step] if (r["concurrency"], r["repeat"]) == (run["max_concurrency"], run["repeat"])]
            assert [r["index"] for r in mine] == list(range(8)) and {r["seed"] for r in mine} == {run["seed"]}
            assert sum(r["output_len"] for r in mine) == run["total_output_tokens"]
            assert all(r["input_len"] == 32 and r["ttft_ms"] > 0 and len(r["itl_ms"]) >= 1 for r in mine)
            assert all(r["error"] is None and r["workload"] == "random-ids" and r["step"] == step for r in mine)
            assert "--output-details" in run["command"]
    evaluated = steps["eval"]["facts"]["requests"]
    assert [(r["set"], r["id"], r["verify_ct"]) for r in read["eval"]] == [
        (r["set"], r["id"], r["verify_ct"]) for r in evaluated
    ]
    assert len(read["eval"]) == 2 and all("output_ids" not in r and r["run"] == run_dir.name for r in read["eval"])


def test_repeats_give_points_with_their_spread_and_a_pair_sends_the_same_prompts(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three repeats per concurrency: distinct recorded seeds and times, one point per concurrency with the
    median/min/max/rel MAD of its runs, and the candidate's run (c, r) uses the baseline's seed for (c, r)."""
    lengths = {"concurrencies": [1, 2], "repeats": 3, "input_len": 16, "output_len": 8, "num_prompts": 4}
    body = "name: repeats\n__HOSTS__\n" + yaml_steps(
        {"id": "deploy", **standin["deploy"]},
        {"id": "first", "kind": "benchmark", "server": "deploy", "label": "first", **lengths},
        {"id": "second", "kind": "benchmark", "server": "deploy", "compare_to": "first", **lengths},
    )
    path = write_runbook(body, hosts=standin["host"].host_yaml())
    log_dir = tmp_path / "logs"
    assert main(["run", str(path), "--log-dir", str(log_dir)]) == 0, capsys.readouterr().err
    facts = facts_of(log_dir, capsys)
    first, second = facts["first"], facts["second"]
    for bench in (first, second):
        runs = bench["runs"]
        assert (bench["repeats"], bench["spread_threshold"]) == (3, 0.05)
        assert [(r["max_concurrency"], r["repeat"], r["seed"]) for r in runs] == [
            (c, r, 3 * i + r) for i, c in enumerate((1, 2)) for r in (1, 2, 3)
        ]
        for run in runs:
            assert f"--max-concurrency {run['max_concurrency']} " in run["command"]
            assert f"--seed {run['seed']} --flush-cache" in run["command"]
            assert datetime.fromisoformat(run["started_at"]) < datetime.fromisoformat(run["finished_at"])
        assert [p["max_concurrency"] for p in bench["points"]] == [1, 2]
        for point, own in zip(bench["points"], (runs[:3], runs[3:]), strict=True):
            values = [run["output_throughput"] for run in own]
            spread = point["output_throughput"]
            middle = statistics.median(values)
            assert point["repeats"] == 3 and spread["values"] == values
            assert (spread["median"], spread["min"], spread["max"]) == (middle, min(values), max(values))
            mad = statistics.median(abs(v - middle) for v in values)
            assert spread["rel_mad"] == pytest.approx(mad / middle)
            spread_range = (max(values) - min(values)) / middle
            assert spread["rel_range"] == pytest.approx(spread_range)
            assert point["noisy"] == (spread["rel_mad"] > 0.05 or spread_range > 2 * 0.05)
            assert point["accept_length"] is None and "every repeat" in point["unknown"]["accept_length"]
            assert point["median_ttft_ms"]["values"] == [run["median_ttft_ms"] for run in own]
    # the same prompts at each (concurrency, repeat) of the pair, so the comparison is of like with like
    assert [r["seed"] for r in first["runs"]] == [r["seed"] for r in second["runs"]]
    for c, (base, cand) in zip(("1", "2"), zip(first["points"], second["points"], strict=True), strict=True):
        ratio = cand["output_throughput"]["median"] / base["output_throughput"]["median"]
        assert second["speedup"]["by_concurrency"][c] == pytest.approx(ratio)
    report = json.loads(Path(second["report"]["json_file"]).read_text())
    table = next(t for t in report["tables"] if t["title"] == "Output throughput per concurrency")
    assert table["columns"][4:8] == ["first min-max", "first rel MAD", "second min-max", "second rel MAD"]
    low, high = first["points"][0]["output_throughput"]["min"], first["points"][0]["output_throughput"]["max"]
    assert table["rows"][0][4] == f"{low:,.1f}-{high:,.1f}"
    assert "first: each number is the median of 3 clean run(s) per concurrency." in report["notes"]


def test_a_refused_flush_fails_the_run_naming_it(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench_serving raises for the 400 of a refused /flush_cache: no run is measured on an unflushed cache."""
    switches = standin["host"].home / "sglang-standin.json"
    switches.write_text(json.dumps(json.loads(switches.read_text()) | {"fault": "refuse_flush_cache"}))
    bench = {"id": "bench", "kind": "benchmark", "server": "deploy", "concurrencies": [1], "repeats": 2}
    bench |= {"input_len": 8, "output_len": 8, "num_prompts": 2}
    body = "name: refused\n__HOSTS__\n" + yaml_steps({"id": "deploy", **standin["deploy"]}, bench)
    path = write_runbook(body, hosts=standin["host"].host_yaml())
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs")]) == 1
    failure = capsys.readouterr().err.split("facts.failure = ", 1)[1].splitlines()[0]
    assert failure.startswith('"concurrency 1, repeat 1/2: sglang.benchmark.serving exited 1: ')
    url = f"http://127.0.0.1:{standin['port']}/flush_cache?timeout=60.0"
    assert f"HTTPError: 400 Client Error: Bad Request for url: {url}" in failure
    facts = facts_of(tmp_path / "logs", capsys)["bench"]
    assert facts["runs"] == [] and facts["points"] == []


def test_a_var_in_extra_args_expands_on_the_host_as_in_deploy_never_sent_raw() -> None:
    """Before: `'$models/tok'` quoted whole, so bench_serving got the text `$models/tok`."""
    step = BenchmarkStep(id="b", server="d", extra_args=["--tokenizer", "$models/tok", "--x", "a b"])
    sent = step.command("http://h:1", 4, 1)
    assert "--tokenizer \"${models:?runbook var models is unset or empty}\"/tok --x 'a b' --output-file" in sent
    assert "--tokenizer /m/tok --x 'a b'" in step.command("http://h:1", 4, 1, {"models": "/m"}, "bench.jsonl")
    assert "models" in step.env_names(["models", "other"])
