"""TEST DOUBLE of `python -m sglang.benchmark.serving` and `-m sglang.bench_serving` (SGLang 0.5.23,
benchmark/serving.py; bench_serving.py re-exports it).

Run as the deprecated `sglang.bench_serving`, it first warns as that module of the release in place does: the
module-level `warnings.warn(...)` of the real bench_serving.py (0.5.23: a FutureWarning, "deprecated and will be
removed"), its text, category, file and line read from that file (`deprecation`), so stderr is byte for byte the
real one's; a build whose bench_serving.py warns of nothing (a release from before the move) prints nothing.

It accepts the real client's flags (its own declarations read from the real implementation file (`implementation`:
benchmark/serving.py, or an older release's bench_serving.py); the
ones below are used, the rest accepted and ignored), really sends the requests to the server
(`--backend sglang`: streamed POST /generate; `--backend sglang-oai-chat`: POST /v1/chat/completions, the
prompt as one user message with `--extra-request-body` merged over the payload, e.g. `chat_template_kwargs`;
other backends are refused), computes the metrics as the real `calculate_metrics` does (numpy's linear
percentiles, population std, TTFT, TPOT, ITL per streamed chunk, for the chat of a speculative server spread
over the chunk's retokenized tokens, e2e, concurrency = sum of latencies / duration, 1-s buckets for the peaks), reads
`accept_length` from /server_info `internal_states[0].avg_spec_accept_length`, prints the same
summary table and APPENDS one JSON line with the real result field names to `--output-file`. `--goodput KEY:VALUE`
(where the release declares it) is parsed and refused as the release's `_goodput_slo` does, with the keys of its
benchmark/goodput.py, and counted as its `calculate_goodput` counts (a request is good when it succeeded and meets
every SLO), its fields written into the line and its section printed.

One difference, only where the server is the stand-in with its `modelled_clock` switch (faults.py): every
output then tells its time on the simulation's clock, and the run is timed on it (`_on_model_clock`): each
request's TTFT, inter-token gaps and latency are the model's, and it starts when the model frees its slot of
`--max-concurrency`, so the numbers are the simulated engine's, not the CPU a loaded machine left to the two
processes. A real server sends no such field: then, as the real client, the wall clock.

As the real client: `--seed` alone decides the prompts (the same seed draws the same lengths and
token ids, as `np.random.seed(args.seed)` before sample_random_requests), the warmup re-sends the
first prompt (at most 32 output tokens), and `--flush-cache` flushes after the warmup with
`POST /flush_cache?timeout=--flush-cache-timeout` and raise_for_status: a 400 fails the client.

Datasets: `random-ids` (token ids need no download), and `speed-bench`, `custom` and `sharegpt` from a local
`--dataset-path` (bench_datasets.py: read, sampled and refused as the real loaders do, the chat template applied
as they apply it). `random`, and `sharegpt` without a path, download ShareGPT from the Hub and fail here as the
real client fails without network; the others are refused. The stand-in's tokenizer is one word per token
(simulation.count_tokens). Stdlib only.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import heapq
import http.client
import itertools
import json
import math
import random
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import bench_datasets, hook, launch_args, simulation

#: entry module -> its file in the package folder (hook.ENTRY_POINTS says which run this client)
MODULE_FILES = {"sglang.benchmark.serving": "benchmark/serving.py", "sglang.bench_serving": "bench_serving.py"}
OFFLINE_ERROR = (
    "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the "
    "Hub and we cannot find the requested files in the local cache. Please check your connection and try again "
    "or make sure your Internet connection is on."
)
DOWNLOADING = ("random", "sharegpt")
#: the backends the stand-in serves -> the path each posts to (0.5.23 `_BACKEND_API_PATHS`)
API_PATHS = {"sglang": "/generate", "sglang-oai-chat": "/v1/chat/completions"}
OAI_BACKENDS = ("sglang-oai", "sglang-oai-chat")  # the real calculate_metrics retokenizes their ITLs
VOCAB = 150_000


@dataclass
class Output:
    """RequestFuncOutput: what one request measured."""

    prompt_len: int
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_len: int = 0
    error: str = ""
    start_time: float = 0.0
    text_chunks: list[str] = field(default_factory=list)  # the chat's decode-phase deltas, one per ITL entry
    modelled: bool = False  # its times are the stand-in's simulated ones (`_on_model_clock`)


def implementation(sglang_dir: Path, module: str = "sglang.benchmark.serving") -> Path:
    """The file that implements `module` in the release: its own, or, where it only re-exports another entry
    module's `cli_main` (0.5.23's bench_serving.py: `from sglang.benchmark.serving import cli_main`), that one's."""
    path = sglang_dir / MODULE_FILES[module]
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ImportFrom) or node.module == module or node.module not in MODULE_FILES:
            continue
        if any(alias.name == "cli_main" for alias in node.names):
            return implementation(sglang_dir, node.module)
    return path


def deprecation(path: Path) -> tuple[str, str, int] | None:
    """(text, category, line) of the module-level `warnings.warn(TEXT, CATEGORY, ...)` of an entry module's file."""
    for node in ast.parse(path.read_text()).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "warnings.warn" and len(call.args) >= 1):
            continue
        text = call.args[0]
        category = call.args[1] if len(call.args) > 1 else None
        category = category or next((k.value for k in call.keywords if k.arg == "category"), None)
        if isinstance(text, ast.Constant) and isinstance(text.value, str):
            name = ast.unparse(category) if category is not None else "UserWarning"
            return text.value, name, node.lineno
    return None


def _warn_as(path: Path) -> None:
    """Print the warning the real module prints when run (with its file and line), if it has one."""
    found = deprecation(path)
    if found is not None:
        text, category, line = found
        kind = getattr(builtins, category, UserWarning)
        warnings.warn_explicit(text, kind if isinstance(kind, type) else UserWarning, str(path), line)


def build_parser(sglang_dir: Path, module: str = "sglang.benchmark.serving") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    parser.add_argument("--backend", type=str, default="sglang")
    parser.add_argument("--base-url", type=str, default=None)
    parser.add_argument("--host", type=str, default="0.0.0.0")
    parser.add_argument("--port", type=int)
    parser.add_argument("--ready-check-timeout-sec", type=int, default=60)
    parser.add_argument("--dataset-name", type=str, default="sharegpt")
    parser.add_argument("--dataset-path", type=str, default="")
    parser.add_argument(
        "--speed-bench-category", type=str, default=None, choices=["low_entropy", "mixed", "high_entropy"]
    )
    parser.add_argument("--speed-bench-output-len", type=int, default=512)
    parser.add_argument("--sharegpt-context-len", type=int, default=None)
    parser.add_argument("--prompt-suffix", type=str, default="")
    parser.add_argument("--apply-chat-template", action="store_true")
    parser.add_argument("--model", type=str)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--sharegpt-output-len", type=int, default=None)
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=1024)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--output-file", type=str)
    parser.add_argument("--output-details", action="store_true")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument("--disable-stream", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--disable-ignore-eos", action="store_true")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--extra-request-body", type=str)
    parser.add_argument("--flush-cache", action="store_true")
    parser.add_argument("--flush-cache-timeout", type=float, default=60.0)  # _DEFAULT_SGLANG_FLUSH_CACHE_TIMEOUT
    parser.add_argument("--warmup-requests", type=int, default=1)
    parser.add_argument("--tokenize-prompt", action="store_true")
    parser.add_argument("--tag", type=str, default=None)
    declared = launch_args.plain_flags(implementation(sglang_dir, module).read_text())
    metrics = goodput_metrics(sglang_dir)
    if "--goodput" in declared and metrics:  # the release's own syntax and refusals (0.5.23 `_goodput_slo`)
        parser.add_argument(
            "--goodput", nargs="+", type=functools.partial(_goodput_slo, metrics), default=None, metavar="KEY:VALUE"
        )
    own = {a for action in parser._actions for a in action.option_strings}
    for flag, options in declared.items():
        if flag not in own:
            parser.add_argument(flag, **options)
    return parser


# ---------------------------------------------------------------- goodput (0.5.23 benchmark/goodput.py)

GOODPUT_FILE = "benchmark/goodput.py"


def goodput_metrics(sglang_dir: Path) -> tuple[str, ...]:
    """The release's GOODPUT_SLO_METRICS (the --goodput keys), read from its goodput.py; () where it has none."""
    path = sglang_dir / GOODPUT_FILE
    if not path.is_file():
        return ()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "GOODPUT_SLO_METRICS" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


def _finite_positive_float(value: str) -> float:
    """0.5.23 serving.py `_finite_positive_float`, its messages."""
    try:
        parsed = float(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"expected a finite float > 0, got {value!r}") from exc
    if not math.isfinite(parsed) or parsed <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite float > 0, got {value!r}")
    return parsed


def _goodput_slo(metrics: Sequence[str], pair: str) -> tuple[str, float]:
    """0.5.23 serving.py `_goodput_slo`: one --goodput KEY:VALUE, VALUE in ms, KEY one of the release's."""
    name, _, value = pair.partition(":")
    if name not in metrics:
        raise argparse.ArgumentTypeError(f"expected KEY:VALUE with KEY in {', '.join(metrics)}, got {pair!r}")
    return name, _finite_positive_float(value)


def calculate_goodput(outputs: Sequence[Output], slos: dict[str, float], duration: float) -> dict[str, Any]:
    """0.5.23 goodput.py `calculate_goodput`, its fields: a request is good when it succeeded and its TTFT, TPOT
    ((latency - ttft) / (output_len - 1), 0 for one token) and latency (ms) are each at most the SLOs given."""
    good, met = 0, dict.fromkeys(slos, 0)
    for o in outputs:
        if not o.success:
            continue
        tpot = (o.latency - o.ttft) / (o.output_len - 1) if o.output_len > 1 else 0.0
        observed = {"ttft": o.ttft * 1000, "tpot": tpot * 1000, "e2el": o.latency * 1000}
        passed = [name for name, slo in slos.items() if observed[name] <= slo]
        for name in passed:
            met[name] += 1
        good += len(passed) == len(slos)
    return {
        "goodput_slos_ms": slos,
        "request_goodput": good / duration,
        "slo_attainment": good / len(outputs),
        "slo_attainment_by_metric": {name: count / len(outputs) for name, count in met.items()},
    }


def _print_goodput(goodput: dict[str, Any]) -> None:
    """0.5.23 goodput.py `print_goodput`."""
    slos = " ".join(f"{name}:{slo:g}" for name, slo in goodput["goodput_slos_ms"].items())
    print("{s:{c}^{n}}".format(s="Goodput", n=50, c="-"))
    print("{:<40} {:<10}".format("SLOs (ms):", slos))
    print("{:<40} {:<10.2f}".format("Request goodput (req/s):", goodput["request_goodput"]))
    print("{:<40} {:<10.2f}".format("SLO attainment (%):", goodput["slo_attainment"] * 100))
    for name, share in goodput["slo_attainment_by_metric"].items():
        print("{:<40} {:<10.2f}".format(f"{name.upper()} SLO attainment (%):", share * 100))


# ---------------------------------------------------------------- statistics (numpy's defaults)


def percentile(ordered: Sequence[float], q: float) -> float:
    """numpy.percentile (linear interpolation) of values sorted already."""
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _std(values: Sequence[float]) -> float:
    """numpy.std: the population standard deviation in floats (statistics.pstdev computes it in exact
    fractions, seconds for the 65 000 inter-token latencies of a run at concurrency 32)."""
    mean = statistics.fmean(values)
    return math.sqrt(statistics.fmean([(x - mean) ** 2 for x in values]))


def _series(values: Sequence[float], name: str, extra: Sequence[str] = ()) -> dict[str, float]:
    """mean/median/std/p90/p95/p99 (+ max) in ms, `np.x(values or 0)` when empty, as the real one."""
    data = sorted(values) or [0.0]
    out = {
        f"mean_{name}_ms": statistics.fmean(data) * 1000,
        f"median_{name}_ms": percentile(data, 50) * 1000,
        f"std_{name}_ms": _std(data) * 1000,
        f"p90_{name}_ms": percentile(data, 90) * 1000,
        f"p95_{name}_ms": percentile(data, 95) * 1000,
        f"p99_{name}_ms": percentile(data, 99) * 1000,
    }
    if "max" in extra:
        out[f"max_{name}_ms"] = data[-1] * 1000
    return out


#: the e2e latency's fields, NaN without a completed request (the real client's np.x([]) of an empty list)
E2E_KEYS = tuple(f"{stat}_e2e_latency_ms" for stat in ("mean", "median", "std", "p90", "p95", "p99"))


def _itls(ok: Sequence[Output], retokenized: bool) -> list[float]:
    """The ITL series: each chunk's gap as measured, or (the real client's `use_retokenized_itl`: an OpenAI
    backend of a speculative server) spread over the tokens its text retokenizes to, one gap per token."""
    if not retokenized:
        return [gap for o in ok for gap in o.itl]
    spread = []
    for o in ok:
        for gap, text in zip(o.itl, o.text_chunks, strict=False):
            tokens = simulation.count_tokens(text)
            spread.extend([gap / tokens] * tokens)
    return spread


def calculate_metrics(
    outputs: list[Output], duration: float, backend: str = "sglang", accept: float | None = None
) -> dict[str, Any]:
    ok = [o for o in outputs if o.success]
    output_lens = [o.output_len if o.success else 0 for o in outputs]
    total_input = sum(o.prompt_len for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    e2e = [o.latency for o in ok]
    peak_tokens, peak_requests = 0.0, 0
    if ok:
        first = min(o.start_time for o in ok)
        seconds = math.ceil(max(o.start_time + o.latency for o in ok) - first) + 1
        tokens, running = [0] * seconds, [0] * seconds
        for o in ok:
            at = o.start_time + o.ttft
            times = [at]
            for gap in o.itl:
                at += gap
                times.append(at)
            for t in times:
                if 0 <= int(t - first) < seconds:
                    tokens[int(t - first)] += 1
            for second in range(int(o.start_time - first), min(int(o.start_time + o.latency - first) + 1, seconds)):
                running[second] += 1
        peak_tokens, peak_requests = float(max(tokens)), max(running)
    retokenized = sum(simulation.count_tokens(o.generated_text) if o.generated_text else 0 for o in ok)
    metrics: dict[str, Any] = {
        "completed": len(ok),
        "total_input_tokens": total_input,
        "total_input_text_tokens": total_input,
        "total_input_vision_tokens": 0,
        "total_output_tokens": sum(output_lens),
        "total_output_tokens_retokenized": retokenized,
        "request_throughput": len(ok) / duration,
        "input_throughput": total_input / duration,
        "output_throughput": sum(output_lens) / duration,
        "total_throughput": (total_input + sum(output_lens)) / duration,
        **(_series(e2e, "e2e_latency") if e2e else dict.fromkeys(E2E_KEYS, float("nan"))),
        **_series([o.ttft for o in ok], "ttft"),
        **_series(tpots, "tpot"),
        **_series(_itls(ok, bool(accept) and backend in OAI_BACKENDS), "itl", extra=("max",)),
        "concurrency": sum(e2e) / duration,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    metrics["_output_lens"] = output_lens
    return metrics


# ---------------------------------------------------------------- HTTP


def _connection(base_url: str, timeout: float | None = None) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout), parts.path.rstrip("/")


def get_json(base_url: str, path: str, timeout: float = 30) -> tuple[int, Any]:
    conn, prefix = _connection(base_url, timeout)
    try:
        conn.request("GET", prefix + path)
        response = conn.getresponse()
        body = response.read()
        return response.status, (json.loads(body) if body and response.status == 200 else None)
    finally:
        conn.close()


def _streamed(response: Any, start: float) -> Iterator[tuple[float, dict[str, Any] | None]]:
    """Each line of a streamed answer as the release's clients read it: blank lines skipped, a `data: ` prefix
    dropped, the time since `start` it arrived, and its JSON (None for `[DONE]`, which is timed, not read)."""
    for raw in response:
        chunk = raw.strip()
        if chunk:
            data = chunk[6:] if chunk.startswith(b"data: ") else chunk
            yield time.perf_counter() - start, None if data == b"[DONE]" else json.loads(data)


def request_generate(base_url: str, payload: dict[str, Any], prompt_len: int) -> Output:
    """async_request_sglang_generate: one streamed /generate, timed per chunk."""
    output = Output(prompt_len=prompt_len)
    conn, prefix = _connection(base_url)
    start = time.perf_counter()
    output.start_time = start
    recent, last_len, ttft = start, 0, 0.0
    ticks: list[tuple[float | None, int]] = []  # each output's time on the stand-in's model clock, and its length
    try:
        conn.request(
            "POST", prefix + "/generate", body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        if response.status != 200:
            output.error = (response.reason or "") + ": " + response.read().decode(errors="replace")
            return output
        text, length, latency = "", payload["sampling_params"]["max_new_tokens"], 0.0
        for arrived, out in _streamed(response, start):
            latency = arrived  # the stream's end, [DONE] included
            if out is None:
                continue
            if out.get("text"):
                now = time.perf_counter()
                text, length = out["text"], out["meta_info"]["completion_tokens"]
                ticks.append((out["meta_info"].get(simulation.MODEL_CLOCK_KEY), length))
                if ttft == 0.0:
                    ttft = now - start
                    output.ttft = ttft
                else:
                    new = length - last_len
                    if new == 0:
                        continue
                    output.itl.extend([(now - recent) / new] * new)
                recent, last_len = now, length
        output.generated_text, output.success, output.latency, output.output_len = text, True, latency, length
        _model_times(output, ticks)
    except Exception as exc:  # the real client records any failure as the request's error
        output.error = f"{type(exc).__name__}: {exc}"
        print(f"output.error={output.error!r}")
    finally:
        conn.close()
    return output


def request_chat(base_url: str, payload: dict[str, Any], prompt_len: int) -> Output:
    """async_request_openai_chat_completions (streamed unless `--disable-stream`): TTFT at the first delta with
    text (`_combined`), one ITL entry per later delta (its text kept for the retokenized ITL), the output length
    from a `usage` chunk, else the requested `max_completion_tokens`."""
    output = Output(prompt_len=prompt_len)
    conn, prefix = _connection(base_url)
    start = time.perf_counter()
    output.start_time = recent = start
    text, length, latency = "", payload["max_completion_tokens"], 0.0
    try:
        body = json.dumps(payload)
        conn.request("POST", prefix + "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            output.error = (response.reason or "") + ": " + response.read().decode(errors="replace")
            return output
        if not payload["stream"]:  # the whole answer at once: TTFT = latency
            answer = json.loads(response.read())
            output.generated_text = _combined(answer["choices"][0]["message"])
            output.latency = output.ttft = time.perf_counter() - start
            output.output_len = (answer.get("usage") or {}).get("completion_tokens", length)
            output.success = True
            return output
        for arrived, out in _streamed(response, start):
            latency = arrived  # the stream's end, [DONE] included
            if out is None:
                continue
            length = (out.get("usage") or {}).get("completion_tokens", length)
            delta = ((out.get("choices") or [{}])[0] or {}).get("delta") or {}
            content = _combined(delta)
            if not content:
                continue
            now = time.perf_counter()
            if output.ttft == 0.0:
                output.ttft = now - start
            else:
                output.text_chunks.append(content)
                output.itl.append(now - recent)
            recent, text = now, text + content
        output.generated_text, output.success, output.latency, output.output_len = text, True, latency, length
    except Exception as exc:  # the real client records any failure as the request's error
        output.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return output


def _combined(message: dict[str, Any]) -> str:
    """0.5.23 `_combine_openai_chat_content`: the reasoning (`reasoning_content`, else `reasoning`), then content."""
    return (message.get("reasoning_content") or message.get("reasoning") or "") + (message.get("content") or "")


#: each served backend's request function (0.5.23 `ASYNC_REQUEST_FUNCS`)
REQUEST_FUNCS: dict[str, Callable[[str, dict[str, Any], int], Output]] = {
    "sglang": request_generate,
    "sglang-oai-chat": request_chat,
}


def _model_times(output: Output, ticks: Sequence[tuple[float | None, int]]) -> None:
    """TTFT, inter-token gaps and latency on the stand-in's model clock, where every output told it."""
    if not ticks or any(clock is None for clock, _ in ticks):
        return
    times = [(float(clock or 0.0), length) for clock, length in ticks]
    output.ttft, output.latency, output.itl, output.modelled = times[0][0], times[-1][0], [], True
    for (before, had), (now, length) in itertools.pairwise(times):
        if length > had:
            output.itl.extend([(now - before) / (length - had)] * (length - had))


def _on_model_clock(outputs: Sequence[Output], concurrency: int | None) -> float | None:
    """The run's duration on the stand-in's model clock, each request started when the model frees its slot of
    `concurrency` (in the order sent, as the semaphore lets them in); None unless every request was timed on it."""
    if not outputs or not all(o.modelled for o in outputs):
        return None
    slots = [0.0] * min(concurrency or len(outputs), len(outputs))
    for o in outputs:
        o.start_time = heapq.heappop(slots)
        heapq.heappush(slots, o.start_time + o.latency)
    return max(o.start_time + o.latency for o in outputs)


class HTTPError(Exception):
    """What requests' raise_for_status raises; its message is the real one's."""


def flush_server_cache(base_url: str, timeout: float) -> None:
    """flush_server_cache after the warmup: POST /flush_cache?timeout=S, raise_for_status (a 400 fails the client)."""
    conn, prefix = _connection(base_url, timeout + 30)
    path = f"{prefix}/flush_cache?timeout={timeout}"
    try:
        conn.request("POST", path)
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    if response.status >= 400:
        kind = "Client" if response.status < 500 else "Server"
        url = f"{base_url.rstrip('/')}/flush_cache?timeout={timeout}"
        raise HTTPError(f"{response.status} {kind} Error: {response.reason} for url: {url}")


# ---------------------------------------------------------------- the run


def sample_requests(args: argparse.Namespace, rng: random.Random) -> list[tuple[Any, int, int]]:
    """random-ids: (prompt, prompt_len, output_len); lengths uniform in [len*ratio, len] like the real one."""

    def lens(full: int) -> list[int]:
        if full <= 0:
            return [0] * args.num_prompts
        return [rng.randint(max(int(full * args.random_range_ratio), 1), full) for _ in range(args.num_prompts)]

    inputs, outputs = lens(args.random_input_len), lens(args.random_output_len)
    rows = []
    for i in range(args.num_prompts):
        offset = rng.randrange(VOCAB)
        ids = [(offset + i + j) % VOCAB for j in range(inputs[i])]
        prompt: Any = ids if args.tokenize_prompt else " ".join(f"t{t}" for t in ids)
        rows.append((prompt, inputs[i], outputs[i]))
    print(f"#Input tokens: {sum(inputs)}")
    print(f"#Output tokens: {sum(outputs)}")
    return rows


def _payload(args: argparse.Namespace, prompt: Any, output_len: int) -> dict[str, Any]:
    """The request body of `--backend`: /generate's, or the chat's (`_chat_payload`)."""
    if args.backend == "sglang-oai-chat":
        return _chat_payload(args, prompt, output_len)
    sampling: dict[str, Any] = {
        "temperature": args.temperature,
        "max_new_tokens": output_len,
        "ignore_eos": not args.disable_ignore_eos,
    }
    return {
        ("text" if isinstance(prompt, str) else "input_ids"): prompt,
        "sampling_params": sampling,
        "stream": not args.disable_stream,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": False,
        "logprob_start_len": -1,
        **(json.loads(args.extra_request_body) if args.extra_request_body else {}),
    }


def _chat_payload(args: argparse.Namespace, prompt: Any, output_len: int) -> dict[str, Any]:
    """async_request_openai_chat_completions' payload: the prompt as one user message (a list: the messages),
    temperature 0 and ignore_eos unless the extra request body sets them, then that body merged over it."""
    extra = json.loads(args.extra_request_body) if args.extra_request_body else {}
    payload: dict[str, Any] = {
        "model": args.model,
        "messages": prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}],
        "max_completion_tokens": output_len,
        "stream": not args.disable_stream,
    }
    if "temperature" not in extra:
        payload["temperature"] = 0.0
    if "ignore_eos" not in extra:
        payload["ignore_eos"] = not args.disable_ignore_eos
    return payload | extra


def _run_all(
    jobs: list[Callable[[], Output]], concurrency: int | None, rate: float, rng: random.Random
) -> list[Output]:
    """Start each job at the request rate (Poisson; inf: all at once), at most `concurrency` at a time."""
    slots = threading.Semaphore(concurrency) if concurrency else None

    def limited(job: Callable[[], Output]) -> Output:
        if slots is None:
            return job()
        with slots:
            return job()

    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
        futures = []
        for job in jobs:
            futures.append(pool.submit(limited, job))
            if rate != float("inf"):
                time.sleep(rng.expovariate(rate))
        return [f.result() for f in futures]


def _print_summary(
    args: argparse.Namespace, m: dict[str, Any], duration: float, accept: float | None, goodput: dict[str, Any] | None
) -> None:
    row = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(row("Backend:", args.backend))
    print(row("Traffic request rate:", args.request_rate))
    print(row("Max request concurrency:", args.max_concurrency if args.max_concurrency else "not set"))
    print(row("Successful requests:", m["completed"]))
    print(num("Benchmark duration (s):", duration))
    print(row("Total input tokens:", m["total_input_tokens"]))
    print(row("Total input text tokens:", m["total_input_text_tokens"]))
    print(row("Total generated tokens:", m["total_output_tokens"]))
    print(row("Total generated tokens (retokenized):", m["total_output_tokens_retokenized"]))
    print(num("Request throughput (req/s):", m["request_throughput"]))
    print(num("Input token throughput (tok/s):", m["input_throughput"]))
    print(num("Output token throughput (tok/s):", m["output_throughput"]))
    print(num("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"]))
    print(row("Peak concurrent requests:", m["max_concurrent_requests"]))
    print(num("Total token throughput (tok/s):", m["total_throughput"]))
    print(num("Concurrency:", m["concurrency"]))
    if accept:
        print(num("Accept length:", accept))
    if goodput:
        _print_goodput(goodput)
    sections = (
        ("End-to-End Latency", "e2e_latency", "E2E Latency"),
        ("Time to First Token", "ttft", "TTFT"),
        ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
        ("Inter-Token Latency", "itl", "ITL"),
    )
    for title, key, label in sections:
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for stat in ("Mean", "Median", "P90", "P95", "P99") + (("Max",) if key == "itl" else ()):
            print(num(f"{stat} {label} (ms):", m[f"{stat.lower()}_{key}_ms"]))
    print("=" * 50)


def _requests(args: argparse.Namespace, rng: random.Random) -> list[tuple[Any, int, int]] | None:
    """The run's requests (prompt, prompt_len, output_len) of `--dataset-name`; None where the real client would
    download (no network here) or the stand-in has no such dataset, having said why."""
    if args.dataset_name in DOWNLOADING and not args.dataset_path:
        print("Traceback (most recent call last):", file=sys.stderr)
        print(OFFLINE_ERROR, file=sys.stderr)
        return None
    if args.dataset_name == "random-ids":
        return sample_requests(args, rng)
    if args.dataset_name not in bench_datasets.LOCAL:
        print(
            "the SGLang stand-in's benchmark client (a test double) generates only random-ids and reads only "
            f"{', '.join(bench_datasets.LOCAL)} from --dataset-path, not {args.dataset_name}"
        )
        return None
    rows = bench_datasets.load(args, rng)
    if not rows:  # the real benchmark() reads input_requests[0] first
        raise IndexError("list index out of range")
    return rows


def _served(args: argparse.Namespace) -> bool:
    """Whether the stand-in serves `--backend` (saying why not); `--tokenize-prompt` off /generate fails as the
    real client's assertion."""
    if args.backend not in API_PATHS:
        served = " and ".join(f"--backend {name}" for name in API_PATHS)
        print(f"the SGLang stand-in's benchmark client (a test double) runs only {served}, not {args.backend}")
        return False
    if args.tokenize_prompt and args.backend != "sglang":
        raise AssertionError("`--tokenize-prompt` only compatible with `--backend sglang` currently")
    return True


def run(args: argparse.Namespace) -> int:
    print(f"benchmark_args={args}")
    if not _served(args):
        return 1
    send = REQUEST_FUNCS[args.backend]
    base_url = args.base_url or f"http://{args.host}:{args.port or 30000}"
    deadline = time.monotonic() + args.ready_check_timeout_sec
    while args.ready_check_timeout_sec > 0:
        try:
            if get_json(base_url, "/v1/models", timeout=5)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            print(f"Server at {base_url}/v1/models is not ready. Exiting.")
            return 1
        time.sleep(1)
    if args.model is None:
        status, models = get_json(base_url, "/v1/models")
        data = (models or {}).get("data") or []
        args.model = data[0]["id"] if data else None
    if args.model is None:
        print("No model specified or found. Please provide a model using `--model`.")
        return 1
    print(f"{args}\n")
    rng = random.Random(args.seed)
    rows = _requests(args, rng)
    if rows is None:
        return 1

    print(f"Starting warmup with {args.warmup_requests} sequences...")
    if rows and args.warmup_requests > 0:
        prompt, prompt_len, output_len = rows[0]
        warm = _payload(args, prompt, min(output_len, 32))
        warmups = _run_all(
            [lambda: send(base_url, warm, prompt_len)] * args.warmup_requests,
            args.max_concurrency,
            float("inf"),
            rng,
        )
        if not any(o.success for o in warmups):
            raise ValueError(
                "Warmup failed - Please make sure benchmark arguments "
                f"are correctly specified. Error: {warmups[0].error}"
            )
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main benchmark run...")
    if args.flush_cache:
        flush_server_cache(base_url, args.flush_cache_timeout)

    start = time.perf_counter()
    jobs: list[Callable[[], Output]] = [
        functools.partial(send, base_url, _payload(args, prompt, olen), plen) for prompt, plen, olen in rows
    ]
    outputs = _run_all(jobs, args.max_concurrency, args.request_rate, rng)
    status, info = get_json(base_url, "/server_info")
    states = (info or {}).get("internal_states") or []
    accept = states[0].get("avg_spec_accept_length") if status == 200 and states else None
    duration = time.perf_counter() - start
    if args.request_rate == float("inf"):  # every request sent at once, as many in flight as the concurrency allows
        duration = _on_model_clock(outputs, args.max_concurrency) or duration
    metrics = calculate_metrics(outputs, duration, args.backend, accept)
    output_lens = metrics.pop("_output_lens")
    goodput = calculate_goodput(outputs, dict(args.goodput), duration) if getattr(args, "goodput", None) else None
    _print_summary(args, metrics, duration, accept, goodput)
    status, server_info = get_json(base_url, "/server_info")
    result = {
        "tag": args.tag,
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "server_info": server_info if status == 200 else None,
        "duration": duration,
        **{k: metrics[k] for k in RESULT_ORDER},
        "accept_length": accept,
        "max_output_tokens_per_s": metrics["max_output_tokens_per_s"],
        "max_concurrent_requests": metrics["max_concurrent_requests"],
        **(goodput or {}),
    }
    if args.output_details:
        result |= {
            "input_lens": [o.prompt_len for o in outputs],
            "output_lens": output_lens,
            "ttfts": [o.ttft for o in outputs],
            "itls": [o.itl for o in outputs],
            "generated_texts": [o.generated_text for o in outputs],
            "errors": [o.error for o in outputs],
        }
    lengths = f"{args.num_prompts}_{args.random_input_len}_{args.random_output_len}"
    if not args.dataset_name.startswith("random"):
        lengths = f"{args.num_prompts}_{args.dataset_name}"
    name = args.output_file or f"{args.backend}_{time.strftime('%m%d')}_{lengths}.jsonl"
    with open(name, "a") as file:
        file.write(json.dumps(result) + "\n")
    return 0


#: the result fields between `duration` and `accept_length`, in the real client's order
RESULT_ORDER = (
    "completed", "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
    "total_output_tokens", "total_output_tokens_retokenized", "request_throughput", "input_throughput",
    "output_throughput", "total_throughput",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms",
    "p90_e2e_latency_ms", "p95_e2e_latency_ms", "p99_e2e_latency_ms",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms",
    "concurrency",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    module = hook.module_run(sys.orig_argv)
    module = module if module in MODULE_FILES else "sglang.benchmark.serving"
    sglang_dir = launch_args.sglang_dir()
    _warn_as(sglang_dir / MODULE_FILES[module])
    args = build_parser(sglang_dir, module).parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)
