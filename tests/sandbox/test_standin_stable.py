"""The demo's numbers are stable: with the demo's switches (sandbox/demo.py: a modelled clock, an output every 16
tokens) the SGLang stand-in's bench_serving gives three repeats that agree, so that a demo-sized campaign report
marks at most a minority of its points "(noisy)"; before, on the wall clock of a loaded machine, every point was.
In-process: the stand-in server on a thread, its bench_serving called as a function, the demo's concurrencies,
repeats and prompt counts (shorter prompts and outputs, as the clock is the model's)."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from sandbox import prepare
from sandbox.demo import SWEEP_STANDIN
from sandbox.sglang_standin import bench_client, launch_args
from sandbox.sglang_standin.faults import parse
from sandbox.sglang_standin.launch import resolve
from sandbox.sglang_standin.server import Engine, StandinHTTPServer
from sandbox.sshd import free_port
from steps.benchmark import BenchmarkStep
from steps.benchmark_results import BenchRun, RunInfo, parse_run, points

CONCURRENCIES, REPEATS = (1, 4, 16, 32), 3  # the sweep's (runbooks/k26_dflash_sweep.yaml)
SGLANG = next((prepare.VENV / "lib").glob("python3*/site-packages/sglang"), None)


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"]}))
    (draft / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "dflash_config": {"block_size": 8}})
    )
    return {"target": target, "draft": draft}


@contextlib.contextmanager
def standin(argv: list[str], switches: Mapping[str, object]) -> Iterator[str]:
    """The stand-in server with these launch flags and switches, served on a thread; its base URL."""
    assert SGLANG is not None, "run python -m sandbox.prepare"
    launch = resolve(launch_args.build_parser(SGLANG).parse_args(argv), argv)
    engine = Engine(launch, parse(dict(switches)))
    engine.ready = True
    httpd = StandinHTTPServer(engine)
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{launch.port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def benchmark(url: str, out: Path) -> list[BenchRun]:
    """The sweep's benchmark step's runs (its prompt counts and seeds), 64 tokens in and out."""
    assert SGLANG is not None
    runs, seed = [], 1
    for concurrency in CONCURRENCIES:
        prompts = BenchmarkStep.model_validate({"id": "b", "kind": "benchmark", "server": "d"}).prompts_at(concurrency)
        for repeat in range(1, REPEATS + 1):
            argv = [
                *("--backend", "sglang", "--base-url", url, "--dataset-name", "random-ids"),
                *("--random-input-len", "64", "--random-output-len", "64", "--random-range-ratio", "1.0"),
                *("--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--output-file", str(out)),
                *("--disable-tqdm", "--seed", str(seed), "--warmup-requests", "1", "--flush-cache"),
            ]
            with contextlib.redirect_stdout(io.StringIO()):
                assert bench_client.run(bench_client.build_parser(SGLANG).parse_args(argv)) == 0
            line = out.read_text().splitlines()[-1]
            info = RunInfo(
                max_concurrency=concurrency, num_prompts=prompts, repeat=repeat, seed=seed,
                started_at="", finished_at="", command="",
            )  # fmt: skip
            runs.append(parse_run(line, info))
            seed += 1
    return runs


@pytest.mark.xdist_group("timing")  # measures speeds: not beside another benchmark
def test_with_the_demos_switches_at_most_a_minority_of_a_campaigns_points_are_noisy(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch_args, "sglang_dir", lambda: SGLANG)  # the venv's files, from this interpreter
    base = ["--model-path", str(models["target"]), "--tp-size", "8", "--trust-remote-code"]
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(models["draft"])]
    noisy, total = 0, 0
    for n, extra in enumerate(([], dflash)):
        argv = [*base, *extra, "--host", "127.0.0.1", "--port", str(free_port())]
        with standin(argv, SWEEP_STANDIN) as url:
            runs = benchmark(url, tmp_path / f"bench{n}.jsonl")
        measured = points(runs, BenchmarkStep.model_fields["spread_threshold"].default)
        assert all(p.output_throughput is not None for p in measured)
        noisy += sum(p.noisy for p in measured)
        total += len(measured)
    assert total == 2 * len(CONCURRENCIES) and 2 * noisy < total, f"{noisy} of {total} points noisy"


def test_the_model_clock_times_each_request_and_queues_them_in_the_concurrencys_slots() -> None:
    """The run's timing on the stand-in's model clock: TTFT the first output's time, the gaps spread over the
    tokens of each output, and the requests started as the model frees a slot (two slots here)."""
    outputs = []
    for ticks in ([(0.1, 1), (0.3, 3), (0.5, 5)], [(0.2, 1), (0.4, 5)], [(0.1, 1), (0.2, 2)]):
        output = bench_client.Output(prompt_len=4)
        bench_client._model_times(output, ticks)
        outputs.append(output)
    assert (outputs[0].ttft, outputs[0].latency) == (0.1, 0.5) and outputs[0].itl == pytest.approx([0.1] * 4)
    assert bench_client._on_model_clock(outputs, 2) == pytest.approx(0.6)  # the third waits for the second (0.4)
    assert [o.start_time for o in outputs] == [0.0, 0.0, 0.4]
    wall = bench_client.Output(prompt_len=4)
    bench_client._model_times(wall, [(None, 1), (None, 2)])  # a real server: no model clock, the wall's times
    assert not wall.modelled and bench_client._on_model_clock([*outputs, wall], 2) is None
