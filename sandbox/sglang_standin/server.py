"""TEST DOUBLE of `python -m sglang.launch_server` (SGLang 0.5.23) on the test host.

Accepts the real launch flags (launch_args.py), checks them as SGLang does (launch.py), logs
like SGLang (`[YYYY-mm-dd HH:MM:SS] ...`, scheduler lines with ` TP0`, uvicorn's `INFO:     `
lines) and ends a good start-up with SGLang's ready line:

    [2026-05-01 12:00:03] The server is fired up and ready to roll!

While starting (`startup_s`) every endpoint answers 503. A scheduler failure (no GPU driver, an
attention backend the GPU cannot run, the `crash_at_startup` switch) logs
`[... TP0] Scheduler hit an exception: Traceback ...` ending in the exception line, then
`Received sigquit from a child process. It usually means the child failed.`, and the process
kills itself with SIGKILL, as SGLang's kill_process_tree does. SIGTERM logs SGLang's
`SIGTERM received. ...` line, closes the port and exits 0 at once.

Endpoints (http_server.py of 0.5.23): GET /health, /health_generate, /ready, /model_info
(+ /get_model_info), /server_info (+ /get_server_info), POST|PUT /generate (text or input_ids,
one or a batch, `stream` as SSE `data: {...}` lines ending `data: [DONE]`), GET|POST
/flush_cache (200 "Cache flushed..." or 400 "Flush cache failed." when requests are in flight
or the `refuse_flush_cache` switch is on; `?timeout=S` first waits up to S seconds for the server
to become idle, else 400 "Timed out waiting for idle state.", as flush_wrapper.py), GET /v1/models,
POST /v1/completions (not streamed) and /v1/chat/completions (streamed or not; chat applies a Kimi-K2-shaped chat
template with the `thinking` kwarg and honours return_meta_info and return_token_ids), GET /metrics
(Prometheus text, only with `--enable-metrics`, else 404 as the real server: metrics.py).
Switches: faults.py.

Several nodes (`--nnodes N --node-rank R --dist-init-addr HOST:PORT --dist-timeout S`, distributed.py):
every node starts up only after all of them joined node 0 on the dist-init address and loaded their
weights; node 0 serves HTTP as above (server_info: tp_size, nnodes, node_rank), the others serve none
and live until node 0 stops them; a node gone is NCCL's error line on the others.

A prefix cache (prefix_cache.py, like SGLang's radix cache) keeps finished requests' tokens: a
request's cached prefix is not prefilled again (its TTFT drops), `meta_info.cached_tokens` counts
it, and each prefill logs the scheduler's real `Prefill batch, #new-seq: 1, #new-token: N,
#cached-token: M, ...` line (metrics_reporter.py). Only a flush empties the cache, and only a flush
restarts the acceptance average of /server_info.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import sys
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

from . import distributed, faults, launch_args, memory, simulation
from .launch import Launch, query_gpus, resolve, scheduler_error
from .metrics import Metrics
from .prefix_cache import PrefixCache

READY_LINE = "The server is fired up and ready to roll!"
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
FLUSH_FAILED = "Flush cache failed.\n"
VERSION = "0.5.23"
DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams.max_new_tokens
THROUGHPUT_WINDOW_S = 2.0
MAX_TOTAL_NUM_TOKENS = 1048576  # the KV cache size the start-up log reports
FLUSH_TIMED_OUT = "Timed out waiting for idle state."
_LOG_LOCK = threading.Lock()
_TP_RANK = [0]  # this node's first global TP rank: node_rank * tp_size / nnodes (set once by main)


def log(message: str, tp: bool = False) -> None:
    """One SGLang log line on stderr (configure_logger's format; scheduler lines carry ` TPn`, n the
    node's first TP rank: ` TP0` on one node, ` TP8` on the second of two nodes of TP16)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with _LOG_LOCK:
        sys.stderr.write(f"[{stamp}{f' TP{_TP_RANK[0]}' if tp else ''}] {message}\n")
        sys.stderr.flush()


def scheduler_log(message: str) -> None:
    log(message, tp=True)


def uvicorn_log(message: str) -> None:
    with _LOG_LOCK:
        sys.stderr.write(f"INFO:     {message}\n")
        sys.stderr.flush()


class Pacer:
    """One request's clock: each prefill or decode step adds the model's time to a due time, and only what
    is left of it is slept. A sleep per step overshoots (the OS wakes the thread late: 0.1-0.4 ms on a
    loaded 2-core machine, as long as a whole step at 1500 tokens/s) and the overshoots added up, so a
    request took up to twice the model's time; on a schedule, a late wake-up is made up by the next step."""

    def __init__(self) -> None:
        self.due = time.perf_counter()

    def wait(self, seconds: float, sleep: bool = True) -> None:
        """Add a step's time; sleep until it is due unless told not to yet (a step whose output is not streamed:
        the next one streamed sleeps for both)."""
        self.due += seconds
        left = self.due - time.perf_counter()
        if sleep and left > 0:
            time.sleep(left)


class Engine:
    """The simulated scheduler: requests in flight, acceptance counters, throughput."""

    def __init__(self, launch: Launch, switches: faults.Switches) -> None:
        self.launch = launch
        self.switches = switches
        #: the configuration's acceptance and cost on the switches' landscape (faults.py)
        speculation = launch.speculation
        self.speculation = None if speculation is None else dataclasses.replace(speculation, physics=switches.physics)
        self.ready = False
        self.stopping = False
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._in_flight: dict[str, float] = {}
        self._accepted = 0  # spec_total_num_accept_tokens since start or the last flush
        self._forward_ct = 0  # spec_total_num_forward_ct
        self._generated: deque[tuple[float, int]] = deque()
        self._ids = itertools.count()
        self.cache = PrefixCache()
        self.metrics = Metrics(launch.served_model_name, launch.speculative)  # never reset: not by a flush

    # -- requests in flight
    def begin(self) -> str:
        rid = uuid.uuid4().hex
        with self._lock:
            self._in_flight[rid] = time.time()
        return rid

    def end(self, rid: str) -> None:
        with self._lock:
            self._in_flight.pop(rid, None)

    @property
    def broken_drafter(self) -> bool:
        """Whether this server's speculative outputs leave the greedy ones (the `broken_drafter` switch)."""
        return self.launch.speculative and self.switches.broken_drafter

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def record(self, tokens: int, verify: bool) -> None:
        with self._lock:
            now = time.time()
            self._generated.append((now, tokens))
            if verify:
                self._accepted += tokens
                self._forward_ct += 1

    def flush(self, timeout_s: float = 0.0) -> bool | None:
        """Flush as the scheduler does: only when idle; the cache empties and the metrics restart.

        With `timeout_s`, wait up to that long for the server to become idle first (flush_wrapper.py):
        None when it never did."""
        deadline = time.monotonic() + timeout_s
        while timeout_s > 0 and self.in_flight():
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        with self._lock:
            if self._in_flight:
                return False
            self._accepted = self._forward_ct = 0
            self._generated.clear()
            self.cache.clear()
            return True

    def prefill(self, prompt: str, prompt_tokens: int, pacer: Pacer) -> int:
        """Prefill a prompt: take the time of its uncached tokens, log SGLang's prefill line; the cached count."""
        # the last prompt token is always computed, for its logits (SGLang matches at most len - 1 tokens)
        cached = min(self.cache.match(prompt.split()), max(prompt_tokens - 1, 0))
        new = prompt_tokens - cached
        seconds = simulation.prefill_seconds(new)
        pacer.wait(seconds)
        usage = self.cache.size() / MAX_TOTAL_NUM_TOKENS
        log(
            f"Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, token usage: {usage:.2f}, "
            f"#running-req: {self.in_flight() - 1}, #queue-req: 0, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {new / seconds:.2f}",
            tp=True,
        )
        return cached

    def internal_state(self) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            while self._generated and self._generated[0][0] < now - THROUGHPUT_WINDOW_S:
                self._generated.popleft()
            state: dict[str, Any] = {
                "world_size": int(self.launch.args.tp_size or 1),
                "startup_time": self.started_at,
                "effective_max_running_requests_per_dp": 256,
                "last_gen_throughput": sum(n for _, n in self._generated) / THROUGHPUT_WINDOW_S,
            }
            if self.launch.speculative and self._forward_ct > 0:
                state["avg_spec_accept_length"] = self._accepted / self._forward_ct
            return state

    # -- generation
    def generate(
        self, prompt: str, prompt_tokens: int, params: dict[str, Any], stream: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Yield SGLang's cumulative outputs for one request, one per decode/verify step (`stream`: the
        request's, a label of its counters)."""
        rid = self.begin()
        try:
            pacer = Pacer()
            start = pacer.due
            max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
            max_new = DEFAULT_MAX_NEW_TOKENS if max_new is None else int(max_new)
            accept = 1.0
            speculation = self.speculation
            if speculation is not None:
                accept = speculation.accept_length(prompt, self.switches.accept_length)
            chunks = simulation.steps(max_new, accept)
            cached = self.prefill(prompt, prompt_tokens, pacer)
            text, ids, done, streamed = "", [], 0, 0
            for step, size in enumerate(chunks):
                finished = step == len(chunks) - 1
                # as SGLang's --stream-interval: the first token, then every `stream_interval` tokens, and the last
                shown = step == 0 or finished or done + size - streamed >= self.switches.stream_interval
                if step > 0:
                    speed = self.switches.decode_tokens_per_s
                    pacer.wait(simulation.step_seconds(speed, speculation, self.in_flight()), sleep=shown)
                if self.stopping:
                    return
                for i in range(done, done + size):
                    token, word = simulation.output_token(prompt, i, self.broken_drafter)
                    text += word
                    ids.append(token)
                done += size
                self.record(size, verify=step > 0 and self.launch.speculative)
                if not shown:
                    continue
                streamed = done
                meta: dict[str, Any] = {
                    "id": rid,
                    "finish_reason": {"type": "length", "length": max_new} if finished else None,
                    "prompt_tokens": prompt_tokens,
                    "weight_version": "default",
                    "num_retractions": 0,
                    "reasoning_tokens": 0,
                    "completion_tokens": done,
                    "cached_tokens": cached,
                }
                if self.switches.modelled_clock:
                    meta[simulation.MODEL_CLOCK_KEY] = pacer.due - start
                if finished:
                    meta["e2e_latency"] = time.perf_counter() - start
                    self.cache.insert(prompt.split() + text.split())
                    counts = simulation.spec_counts(chunks, self.launch.draft_tokens or 0)
                    if self.launch.speculative and counts is not None:
                        meta.update(counts.meta_info(done))
                    verify_ct = counts.verify_ct if self.launch.speculative and counts is not None else 0
                    verify_ct *= 2 if self.switches.fault == "miscount_metrics" else 1  # a planted disagreement
                    self.metrics.finished(prompt_tokens, done, verify_ct, stream, meta["e2e_latency"])
                yield {"text": text, "output_ids": list(ids), "meta_info": meta}
            if not chunks:  # max_new_tokens 0
                finish = {"type": "length", "length": 0}
                meta = {"id": rid, "finish_reason": finish, "prompt_tokens": prompt_tokens, "completion_tokens": 0}
                yield {"text": "", "output_ids": [], "meta_info": meta | {"e2e_latency": time.perf_counter() - start}}
        finally:
            self.end(rid)


def sse_lines(outputs: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """`data: {json.dumps(output)}` of each cumulative output of one request, byte for byte, with each output
    id encoded once: every output repeats all earlier ids, and encoding them all again at every step made a
    benchmark's 512-token requests quadratic (half the stand-in's CPU at concurrency 32 went to json.dumps)."""
    ids_text, encoded = "", 0
    for out in outputs:
        text, ids, meta = out["text"], out["output_ids"], out["meta_info"]
        if len(ids) > encoded:
            fresh = ", ".join(map(str, ids[encoded:]))
            ids_text, encoded = (f"{ids_text}, {fresh}" if ids_text else fresh), len(ids)
        body = f'{{"text": {json.dumps(text)}, "output_ids": [{ids_text}], "meta_info": {json.dumps(meta)}}}'
        yield b"data: " + body.encode() + b"\n\n"


class Handler(BaseHTTPRequestHandler):
    server: StandinHTTPServer
    server_version = "uvicorn"
    sys_version = ""

    # -- plumbing
    def log_message(self, format: str, *args: Any) -> None:  # uvicorn's access log instead
        pass

    def _access(self, status: int) -> None:
        host, port = self.client_address[:2]
        uvicorn_log(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {status} {HTTPStatus(status).phrase}')

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self._access(status)

    def _json(self, data: Any, status: int = 200) -> None:
        self._send(status, json.dumps(data).encode())

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def _route(self, method: str) -> None:
        engine = self.server.engine
        path = urlsplit(self.path).path
        if not engine.ready:
            self._send(503)
            return
        routes = ROUTES.get(path)
        if routes is None:
            self._json({"detail": "Not Found"}, 404)
            return
        handler = routes.get(method)
        if handler is None:
            self._json({"detail": "Method Not Allowed"}, 405)
            return
        try:
            handler(self)
        except (ValueError, TypeError, KeyError) as exc:  # a bad request body
            self._json({"error": {"message": str(exc)}}, 400)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    # -- endpoints
    def health(self) -> None:
        self._send(200)

    def model_info(self) -> None:
        if urlsplit(self.path).path == "/get_model_info":
            log(
                "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                "Please use '/model_info' instead."
            )
        launch = self.server.engine.launch
        self._json(
            {
                "model_path": launch.args.model_path,
                "served_model_name": launch.served_model_name,
                "tokenizer_path": launch.args.tokenizer_path or launch.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": launch.args.load_format or "auto",
                "reasoning_parser": launch.args.reasoning_parser,
                "tool_call_parser": launch.args.tool_call_parser,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": None,
                "architectures": launch.architectures,
            }
        )

    def server_info(self) -> None:
        if urlsplit(self.path).path == "/get_server_info":
            log(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead."
            )
        engine = self.server.engine
        info = engine.launch.server_args()
        info["launch_command"] = " ".join(["python3", "-m", "sglang.launch_server", *engine.launch.argv])
        info.update(
            startup_time=engine.started_at,
            internal_states=[engine.internal_state()],
            version=VERSION,
            frontend="python",
        )
        self._json(info)

    def generate(self) -> None:
        body = self._body()
        params = body.get("sampling_params") or {}
        if isinstance(params, list):
            params = params[0] if params else {}
        prompts: list[tuple[str, int]]
        if body.get("text") is not None:
            texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
            prompts = [(str(t), simulation.count_tokens(str(t))) for t in texts]
        elif body.get("input_ids") is not None:
            ids = body["input_ids"]
            batch = ids if ids and isinstance(ids[0], list) else [ids]
            prompts = [(" ".join(map(str, one)), len(one)) for one in batch]
        else:
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        batched = isinstance(body.get("text"), list) or (
            isinstance(body.get("input_ids"), list)
            and bool(body["input_ids"])
            and isinstance(body["input_ids"][0], list)
        )
        engine = self.server.engine
        if body.get("stream"):
            if batched:
                raise ValueError("the SGLang stand-in streams one prompt per request")
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for line in sse_lines(engine.generate(prompts[0][0], prompts[0][1], params, stream=True)):
                self.wfile.write(line)
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self._access(200)
            return
        results = []
        threads = []
        for prompt, count in prompts:
            slot: list[dict[str, Any]] = []
            results.append(slot)
            thread = threading.Thread(target=lambda p=prompt, c=count, s=slot: s.extend(engine.generate(p, c, params)))
            threads.append(thread)
            thread.start()
        for thread in threads:
            thread.join()
        finals = [slot[-1] for slot in results if slot]
        self._json(finals if batched else finals[0])

    def flush_cache(self) -> None:
        engine = self.server.engine
        timeout = float(parse_qs(urlsplit(self.path).query).get("timeout", ["0"])[0])
        if not timeout >= 0:
            raise ValueError(f"timeout: Input should be greater than or equal to 0, got {timeout}")
        refused = faults.load().fault == "refuse_flush_cache"
        flushed = False if refused else engine.flush(timeout)
        running = engine.in_flight()
        if flushed is None:
            log("Deferred flush_cache timed out while waiting for idle state.", tp=True)
            self._send(400, FLUSH_TIMED_OUT.encode(), "text/plain; charset=utf-8")
            return
        if not flushed:
            log(
                f"Cache not flushed because there are pending requests. #queue-req: 0, #running-req: {max(running, 1)}",
                tp=True,
            )
            self._send(400, FLUSH_FAILED.encode(), "text/plain; charset=utf-8")
            return
        log("Cache flushed successfully!", tp=True)
        self._send(200, FLUSHED.encode(), "text/plain; charset=utf-8")

    def metrics(self) -> None:
        """Prometheus text, only with --enable-metrics (the real server mounts /metrics only then)."""
        engine = self.server.engine
        if not engine.launch.args.enable_metrics:
            self._json({"detail": "Not Found"}, 404)
            return
        body = engine.metrics.exposition(engine.in_flight()).encode()
        self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")

    def models(self) -> None:
        launch = self.server.engine.launch
        card = {
            "id": launch.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": launch.served_model_name,
            "parent": None,
            "max_model_len": 262144,
        }
        self._json({"object": "list", "data": [card]})

    def completions(self) -> None:
        self._openai(chat=False)

    def chat_completions(self) -> None:
        self._openai(chat=True)

    def _openai(self, chat: bool) -> None:
        """/v1/completions (not streamed) and /v1/chat/completions (streamed: `_stream_chat`). Chat applies the
        stand-in's chat template (simulation.apply_chat_template) with `chat_template_kwargs.thinking` (default on, as
        Kimi-K2.6's template; other kwargs are ignored as a template ignores names it does not read).
        `return_meta_info` and `return_token_ids` add `choices[0].meta_info`, `prompt_token_ids` and
        `response_token_ids` as serving_chat.py does (a completion: `token_ids`, and no meta_info).
        With a reasoning parser and thinking on, the output (all inside the think block) is
        `reasoning_content`."""
        body = self._body()
        if body.get("stream") and not chat:
            raise ValueError("the SGLang stand-in streams OpenAI chat completions only")
        thinking = True
        if chat:
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = bool(kwargs.get("thinking", True))
            prompt = simulation.apply_chat_template(list(body.get("messages") or []), thinking)
        else:
            prompt = str(body.get("prompt", ""))
        params = {
            "max_new_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_NEW_TOKENS
        }
        engine = self.server.engine
        reasoning = chat and thinking and engine.launch.args.reasoning_parser is not None
        if body.get("stream"):
            self._stream_chat(prompt, params, str(body.get("model") or engine.launch.served_model_name), reasoning)
            return
        out = list(engine.generate(prompt, simulation.count_tokens(prompt), params))[-1]
        meta = out["meta_info"]
        usage = {
            "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        }
        finish = meta["finish_reason"]
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish["type"] if finish else None, "logprobs": None}
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": "" if reasoning else out["text"],
                "reasoning_content": out["text"] if reasoning else None,
                "tool_calls": None,
            }
        else:
            choice["text"] = out["text"]
        if body.get("return_token_ids"):  # protocol.py: the chat's response_token_ids, a completion's token_ids
            choice["prompt_token_ids"] = simulation.prompt_token_ids(prompt)
            choice["response_token_ids" if chat else "token_ids"] = out["output_ids"]
        if chat and body.get("return_meta_info"):  # a chat request's field only
            choice["meta_info"] = meta
        self._json(
            {
                "id": meta["id"],
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or engine.launch.served_model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    def _stream_chat(self, prompt: str, params: dict[str, Any], model: str, reasoning: bool) -> None:
        """A streamed chat completion as serving_chat.py `_generate_chat_stream` with sse_utils.build_sse_content
        (compact JSON): a first chunk with the role and empty content, one delta per streamed output (the text new
        since the last; `reasoning_content` when a reasoning parser reads thinking output), a chunk with the
        finish reason, `data: [DONE]`. No usage chunk: the server's default without `stream_options`."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        created, shown, finish, rid = int(time.time()), "", None, ""
        key = "reasoning_content" if reasoning else "content"
        outputs = self.server.engine.generate(prompt, simulation.count_tokens(prompt), params, stream=True)
        for step, out in enumerate(outputs):
            meta = out["meta_info"]
            rid, finish = meta["id"], meta["finish_reason"]
            if step == 0:
                self._chunk(rid, created, model, {"reasoning_content": None, "role": "assistant", "content": ""})
            if out["text"] != shown:
                self._chunk(rid, created, model, {"reasoning_content": None, key: out["text"][len(shown) :]})
                shown = out["text"]
        if finish:
            self._chunk(rid, created, model, {"reasoning_content": None}, finish["type"])
        self.wfile.write(b"data: [DONE]\n\n")
        self._access(200)

    def _chunk(self, rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None) -> None:
        """One `data: {chat.completion.chunk}` line, flushed."""
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
        self.wfile.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        self.wfile.flush()


ROUTES: dict[str, dict[str, Any]] = {
    "/health": {"GET": Handler.health},
    "/health_generate": {"GET": Handler.health},
    "/ready": {"GET": Handler.health},
    "/model_info": {"GET": Handler.model_info},
    "/get_model_info": {"GET": Handler.model_info},
    "/server_info": {"GET": Handler.server_info},
    "/get_server_info": {"GET": Handler.server_info},
    "/generate": {"POST": Handler.generate, "PUT": Handler.generate},
    "/flush_cache": {"GET": Handler.flush_cache, "POST": Handler.flush_cache},
    "/v1/models": {"GET": Handler.models},
    "/metrics": {"GET": Handler.metrics},
    "/v1/completions": {"POST": Handler.completions},
    "/v1/chat/completions": {"POST": Handler.chat_completions},
}


class StandinHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the default backlog (5) resets connections when a benchmark opens dozens at once

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        super().__init__((engine.launch.host, engine.launch.port), Handler)


def _die_in_scheduler(error: str) -> NoReturn:
    """Log a scheduler's death the way SGLang does, then kill this process like kill_process_tree."""
    trace = (
        "Traceback (most recent call last):\n"
        '  File "sglang/srt/managers/scheduler.py", line 6362, in run_scheduler_process\n'
        "    scheduler = Scheduler(server_args, port_args)\n"
        "                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"{error}\n"
    )
    log(f"Scheduler hit an exception: {trace}", tp=True)
    log("Received sigquit from a child process. It usually means the child failed.")
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(128 + signal.SIGKILL)  # not reached: SIGKILL ends the process


def _start_up(engine: Engine, stop: threading.Event, group: distributed.Group | None) -> None:
    """The loading phase: the nodes' rendezvous (`group`, several nodes), weights, attention backends, KV
    cache, warmup; runs beside the HTTP server (node 0). A node >= 1 ends ready after its KV cache."""
    launch, switches = engine.launch, engine.switches
    step = switches.startup_s / 4
    gpus = query_gpus()
    error = scheduler_error(launch, gpus)
    if group is not None:  # the device is set before the process groups are made (bootstrap.py)
        if error is not None:
            group.log("Init torch distributed begin.")
            _die_in_scheduler(error)
        if not group.join():
            return
    fraction = launch.args.mem_fraction_static
    verified = launch.speculation.verified_tokens if launch.speculation else 0
    tp = int(launch.args.tp_size or 1)
    fit = memory.fit(launch.weights, tp, gpus[0].memory_mib if gpus else 0, fraction, verified)
    log(f"Load weight begin. avail mem={fit.total / memory.GIB:.2f} GB", tp=True)
    if error is None and (error := memory.load_error(fit)) is not None:
        _die_in_scheduler(error)
    if stop.wait(step):
        return
    model_type = launch.architectures[0] if launch.architectures else "Model"
    target = launch.weights.target / tp / memory.GIB
    avail = fit.total / memory.GIB - target
    log(
        f"Load weight end. elapsed={step:.2f} s, type={model_type}, avail mem={avail:.2f} GB, "
        f"mem usage={target:.2f} GB.",
        tp=True,
    )
    if launch.speculative:
        draft = launch.weights.draft / memory.GIB
        log(
            f"Load weight end. elapsed={step / 4:.2f} s, type=DFlashDraftModel, avail mem={avail - draft:.2f} GB, "
            f"mem usage={draft:.2f} GB.",
            tp=True,
        )
    if error is None:
        error = memory.pool_error(fit, fraction)
    if error is None and switches.fault == "crash_at_startup":
        error = (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.00 GiB. GPU 0 has a total capacity "
            "of 139.81 GiB of which 2.12 GiB is free. Including non-PyTorch memory, this process has 137.67 GiB "
            "memory in use. (sandbox fault switch crash_at_startup)"
        )
    if error is not None:
        _die_in_scheduler(error)
    if group is not None and not group.barrier("loaded"):
        return
    log(f"KV Cache is allocated. #tokens: {fit.kv_tokens}, KV size: {fit.kv / memory.GIB:.2f} GB", tp=True)
    if stop.wait(step):
        return
    follower = group is not None and group.topo.node_rank > 0
    if follower:
        engine.ready = True  # no tokenizer, no HTTP: it serves node 0's requests (set before its last line)
    log(
        f"max_total_num_tokens={fit.kv_tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=256, context_len=262144, "
        f"available_gpu_mem={(fit.total * (1 - (fraction or memory.DEFAULT_MEM_FRACTION))) / memory.GIB:.2f} GB",
        tp=True,
    )
    if follower:
        return
    uvicorn_log(f"Started server process [{os.getpid()}]")
    uvicorn_log("Waiting for application startup.")
    uvicorn_log("Application startup complete.")
    uvicorn_log(f"Uvicorn running on http://{launch.host}:{launch.port} (Press CTRL+C to quit)")
    if switches.fault == "never_healthy" or stop.wait(step * 2):
        return  # stuck in warmup: /health stays 503
    engine.ready = True
    uvicorn_log(f'{launch.host}:{launch.port} - "POST /generate HTTP/1.1" 200 OK')
    log(READY_LINE)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    parser = launch_args.build_parser(launch_args.sglang_dir())
    args = parser.parse_args(argv)
    if not args.model_path:
        parser.error("the following arguments are required: --model-path/--model")
    launch = resolve(args, argv)  # ValueError: traceback and exit 1, as prepare_server_args
    switches = faults.load()
    for line in launch.warnings:
        log(line)
    log(f"server_args={launch.server_args()}")
    stop = threading.Event()
    group = _group(launch, switches, stop)
    engine = Engine(launch, switches)
    if group is not None and group.topo.node_rank > 0:
        return _follow(engine, group)
    try:
        httpd = StandinHTTPServer(engine)
    except OSError as exc:
        sys.stderr.write(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"('{launch.host}', {launch.port}): {exc.strerror.lower() if exc.strerror else exc}\n"
        )
        return 1

    def on_sigterm(signum: int, frame: object) -> None:
        log(f"SIGTERM received. signum={signum} frame={frame}. Draining requests and shutting down...")
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    serving.start()
    threading.Thread(target=_start_up, args=(engine, stop, group), daemon=True).start()
    while not stop.wait(0.2):
        pass
    engine.stopping = True
    if group is not None:
        group.shutdown()
    remaining = engine.in_flight()
    log(f"Gracefully exiting... Remaining number of requests {remaining}. Remaining requests remaining_rids=[].")
    httpd.shutdown()
    httpd.server_close()
    return 0


def _group(launch: Launch, switches: faults.Switches, stop: threading.Event) -> distributed.Group | None:
    """This node's side of a multi-node launch (None on one node); an address or timeout the scheduler
    refuses kills it as the scheduler would."""
    try:
        topo = distributed.topology(launch.args)
    except (ValueError, AssertionError) as exc:
        scheduler_log("Init torch distributed begin.")
        _die_in_scheduler(f"{type(exc).__name__}: {exc}")
    if topo is None:
        return None
    _TP_RANK[0] = topo.rank
    return distributed.Group(topo, switches.fault, scheduler_log, _die_in_scheduler, stop)


def _follow(engine: Engine, group: distributed.Group) -> int:
    """A node >= 1: no tokenizer, no HTTP; its scheduler starts up with the others (`_start_up`), then
    serves node 0 until node 0 says shutdown (exit 0) or goes away (NCCL's error, `Group`). SIGTERM ends
    it until it is ready; after that SGLang only logs it and waits for node 0's ShutdownReq."""
    rank = group.topo.node_rank

    def on_sigterm(signum: int, frame: object) -> None:
        if not engine.ready:  # still starting up: SIGTERM kills it, as with no handler at all
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        log(
            f"SIGTERM received on node_rank {rank}; waiting for the rank-0 ShutdownReq broadcast to stop the "
            "schedulers."
        )

    # Installed before start-up, deciding by `engine.ready` when the signal comes: installing it only once
    # ready left a window in which a SIGTERM sent just after the last start-up line killed a ready node.
    signal.signal(signal.SIGTERM, on_sigterm)
    threading.Thread(target=_start_up, args=(engine, group.stop, group), daemon=True).start()
    while not group.finished.wait(0.2):
        pass
    return 0
