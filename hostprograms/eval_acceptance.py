"""Host side of the `eval_acceptance` step: measure a speculative-decoding server's acceptance length.

Runs on the GPU host (stdlib only, MIN_PYTHON), where the server listens on loopback. It
flushes the server's cache first, so no prompt is answered from a prefix cached by an earlier
run, then sends every prompt at temperature 0, one at a time, and records what `meta_info` says
about each request and the output's token ids (for the step's lossless check). The statistics
are computed by the step, not here: this program only reports what the server answered.

Two ways in (config `api`), because acceptance depends on the text the drafter sees:
- `chat`: `POST /v1/chat/completions` as SGLang 0.5.23 takes it (protocol.py's
  ChatCompletionRequest): the served model's name from `GET /v1/models`, one user message,
  `chat_template_kwargs: {THINKING_KWARG: bool}` (Kimi K2's template reads `thinking`),
  `return_meta_info` and `return_token_ids`; it reads `choices[0].meta_info` and
  `choices[0].response_token_ids` (serving_chat.py). The model is evaluated as it is served;
- `generate`: the raw text to `POST /generate`, reading `meta_info` and `output_ids`.

Flushing is checked by its answer body. SGLang 0.5.23 answers 200 with "Cache flushed." when it
flushed and 400 with a reason when it refused (requests in flight, another flush pending); older
releases answered 200 either way. Only a 200 whose body starts with "Cache flushed" counts; a
refusal is retried a few times (the requests in flight may finish), then the run stops with the
server's words: an acceptance length measured on a warm cache is not the one asked for.

Exact acceptance: the server's Prometheus `/metrics` is scraped before the flush and after the last prompt
(kit.scrape_metrics: only the lines of config `metric_families`), and `/server_info` read after it (its running
average since the flush, `internal_states[0].avg_spec_accept_length`); the step computes and compares
(steps/server_metrics.py). A server without metrics answers 404: recorded, not a failure.

Shipped with the kit (hostprograms/kit.py). Its config: base_url (`$vars` expand here, as in a path),
api ("chat" | "generate"), thinking (bool, chat only) and thinking_kwarg, max_new_tokens,
request_timeout_s, flush_attempts, flush_delay_s, api_key_var (the NAME of an environment variable
holding the server's API key, or null), metric_families and sets ({name: [{id, text}]}). One result document; one
progress line per prompt (without the token ids).
Exit status 1 when the run stopped early (`error` in the document says why), else 0.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from hostprograms import kit

MIN_PYTHON = (3, 7)
FLUSHED = "Cache flushed"  # how SGLang's /flush_cache body starts when it really flushed
BODY_CHARS = 300  # of an error body kept in the document
#: meta_info fields kept per request, as SGLang names them (tokenizer_manager.py)
META_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "e2e_latency",
)


class Unreachable(Exception):
    """The server did not answer at all (refused connection, reset, timeout)."""


def send(
    url: str, payload: dict[str, Any] | None, timeout: float, api_key: str | None, method: str = "POST"
) -> tuple[int, str]:
    """(status, body) of a request whose whole answer comes within `timeout` (request_timeout); an HTTP error
    status is an answer too. Unreachable otherwise, naming the server."""
    data = json.dumps(payload).encode() if payload is not None else (b"" if method == "POST" else None)
    headers = {"Content-Type": "application/json"}
    try:
        status, body = kit.exchange(url, timeout, token=api_key, method=method, headers=headers, data=data)
    except kit.NoAnswer as exc:
        raise Unreachable(f"{exc} (request_timeout)" if exc.late else str(exc)) from None
    return status, body.decode("utf-8", "replace")


def flush_cache(config: dict[str, Any], api_key: str | None) -> dict[str, Any]:
    """Flush the server's cache, retrying a refusal; what the last answer was and whether it flushed."""
    url = config["base_url"].rstrip("/") + "/flush_cache"
    attempts = max(1, int(config["flush_attempts"]))
    answer: dict[str, Any] = {"flushed": False, "attempts": 0, "status": None, "body": None}
    for attempt in range(1, attempts + 1):
        answer["attempts"] = attempt
        try:
            status, body = send(url, None, config["request_timeout_s"], api_key)
        except Unreachable as exc:
            answer["status"], answer["body"] = None, str(exc)
        else:
            answer["status"], answer["body"] = status, body.strip()[:BODY_CHARS]
            if status == 200 and body.lstrip().startswith(FLUSHED):
                answer["flushed"] = True
                return answer
        if attempt < attempts:
            time.sleep(float(config["flush_delay_s"]))
    return answer


def served_model(config: dict[str, Any], api_key: str | None) -> str:
    """The name the server serves its model under (`GET /v1/models`, the first card's id)."""
    url = config["base_url"].rstrip("/") + "/v1/models"
    status, body = send(url, None, config["request_timeout_s"], api_key, method="GET")
    try:
        if status != 200:
            raise ValueError(f"HTTP {status}")
        name = kit.loads(body)["data"][0]["id"]
        if not isinstance(name, str):
            raise TypeError("the model's id is not a string")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Unreachable(f"{url} named no served model ({exc}): {body.strip()[:BODY_CHARS]}") from None
    return name


def request_for(config: dict[str, Any], model: str | None, text: str) -> tuple[str, dict[str, Any]]:
    """The endpoint and greedy request body of one prompt, for the config's api."""
    max_new = config["max_new_tokens"]
    if config["api"] == "generate":
        return "/generate", {"text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}
    return "/v1/chat/completions", {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_new,
        "temperature": 0,
        "stream": False,
        "chat_template_kwargs": {config["thinking_kwarg"]: bool(config["thinking"])},
        "return_meta_info": True,
        "return_token_ids": True,
    }


def meta_and_ids(config: dict[str, Any], answer: Any) -> tuple[dict[str, Any], Any]:
    """meta_info and the output token ids of an answer: /generate's top level, or the chat's first choice."""
    if config["api"] == "generate":
        return answer["meta_info"], answer.get("output_ids")
    choice = answer["choices"][0]
    return choice["meta_info"], choice.get("response_token_ids")


def ask(config: dict[str, Any], model: str | None, text: str, api_key: str | None) -> dict[str, Any]:
    """One greedy request: the meta_info fields SGLang reports, the output ids, wall seconds, or an error."""
    path, payload = request_for(config, model, text)
    started = time.monotonic()
    status, body = send(config["base_url"].rstrip("/") + path, payload, config["request_timeout_s"], api_key)
    record: dict[str, Any] = {"seconds": round(time.monotonic() - started, 6), "error": None}
    if status != 200:
        record["error"] = f"HTTP {status}: {body.strip()[:BODY_CHARS]}"
        return record
    try:
        meta, ids = meta_and_ids(config, kit.loads(body))
        if not isinstance(meta, dict):
            raise TypeError("meta_info is not an object")
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:  # nested past the parser's depth
        record["error"] = f"unexpected answer ({exc}): {body.strip()[:BODY_CHARS]}"
        return record
    record.update({name: meta[name] for name in META_FIELDS if name in meta})
    finish = meta.get("finish_reason")
    record["finish_reason"] = finish.get("type") if isinstance(finish, dict) else finish
    record["output_ids"] = ids
    return record


def running_average(config: dict[str, Any], api_key: str | None) -> Any:
    """/server_info's `internal_states[0].avg_spec_accept_length` (None when absent or unreadable): the server's
    running average since the last flush, which the step shows next to the exact value."""
    url = config["base_url"].rstrip("/") + "/server_info"
    try:
        status, body = send(url, None, config["request_timeout_s"], api_key, method="GET")
        states = kit.loads(body).get("internal_states") if status == 200 else None
        return states[0].get("avg_spec_accept_length") if isinstance(states, list) and states else None
    except (Unreachable, ValueError, AttributeError, RecursionError):
        return None


def scrape(config: dict[str, Any], api_key: str | None) -> dict[str, Any]:
    """One scrape of the server's /metrics (the config's metric families only)."""
    return kit.scrape_metrics(config["base_url"], config["metric_families"], config["request_timeout_s"], api_key)


def evaluate(config: dict[str, Any]) -> dict[str, Any]:
    """Flush, then every prompt of every set in order; stops early only when the server is gone. /metrics is
    scraped before and after (counters survive the flush), /server_info's running average read after."""
    api_key = os.environ.get(config["api_key_var"]) if config.get("api_key_var") else None
    config = config | {"base_url": kit.expand_path(config["base_url"])}  # `$vars` in it expand, as in a path
    document: dict[str, Any] = {"base_url": config["base_url"], "error": None, "sets": {}}
    document["planned"] = {name: len(prompts) for name, prompts in config["sets"].items()}
    document["metrics_before"] = scrape(config, api_key)
    prompted = prompt_sets(config, api_key, document)
    if prompted:
        document["metrics_after"] = scrape(config, api_key)
        document["running_average"] = running_average(config, api_key)
    return document


def prompt_sets(config: dict[str, Any], api_key: str | None, document: dict[str, Any]) -> bool:
    """Flush, then send every prompt into `document`; False when it stopped early (`error` says why)."""
    document["flush"] = flush = flush_cache(config, api_key)
    if not flush["flushed"]:
        said = f"HTTP {flush['status']}: {flush['body']}" if flush["status"] is not None else flush["body"]
        document["error"] = (
            f"the server did not flush its cache after {flush['attempts']} attempt(s); it answered {said}"
        )
        return False
    try:
        model = served_model(config, api_key) if config["api"] == "chat" else None
    except Unreachable as exc:
        document["error"] = str(exc)
        return False
    for name, prompts in config["sets"].items():
        records: list[dict[str, Any]] = document["sets"].setdefault(name, [])
        for number, prompt in enumerate(prompts, start=1):
            try:
                record = ask(config, model, prompt["text"], api_key)
            except Unreachable as exc:
                document["error"] = f"the server stopped answering during set {name!r}, prompt {number}: {exc}"
                return False
            records.append({"id": prompt["id"], **record})
            shown = {key: value for key, value in record.items() if key != "output_ids"}
            kit.progress({"set": name, "id": prompt["id"], "done": number, "total": len(prompts), **shown})
    return True


def main() -> int:
    return kit.main(evaluate, failed=lambda document: bool(document["error"]))
