"""The `eval_acceptance` kind: prompt-set parsing and statistics here, then whole runs through the
real sshd test host against the SGLang stand-in (sandbox/sglang_standin/), the test double of
SGLang's HTTP server."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from executor.faces.cli import main
from executor.redact import Redactor
from executor.stepkind import FactsError, StepContext
from executor.transport.base import Collector
from hostprograms import eval_acceptance as host
from sandbox.model_configs import drafter_config, target_config
from sandbox.sglang_standin import simulation
from steps.eval_acceptance import (
    EvalAcceptanceFacts,
    EvalAcceptanceStep,
    FlushFacts,
    HostDocument,
    Reference,
    RequestFacts,
    compare_outputs,
    facts_from,
    first_divergence,
    histogram,
    lossless_failures,
    parse_prompt_lines,
    request_facts,
    shipped_sets,
    speculated,
    summarize,
)
from steps.server_metrics import FAMILIES
from tests.clirun import runbook_cli
from tests.conftest import SandboxHost

# ------------------------------------------------------------------------------------------ prompt sets

prompt_text = st.text(min_size=1).filter(lambda s: s.strip() != "")
prompt_id = st.one_of(st.none(), st.integers(min_value=-(10**6), max_value=10**6), st.text(min_size=1))


@given(
    items=st.lists(st.tuples(prompt_text, prompt_id, st.sampled_from(["prompt", "text"])), min_size=1, max_size=20),
    blanks=st.lists(st.sampled_from(["", "   ", "\t"]), max_size=5),
    crlf=st.booleans(),
)
def test_jsonl_lines_round_trip_whatever_the_text(
    items: list[tuple[str, Any, str]], blanks: list[str], crlf: bool
) -> None:
    ids = [str(i) for _, i, _ in items if i is not None]
    lines = []
    for number, (text, ident, key) in enumerate(items, start=1):
        line: dict[str, Any] = {key: text}
        if ident is not None:
            line["id"] = ident
        elif str(number) in ids:  # an id given later may equal the default number: give this one its own
            line["id"] = f"default-{number}"
        lines.append(json.dumps(line, ensure_ascii=False))
        if blanks:
            lines.append(blanks[number % len(blanks)])
    source = ("\r\n" if crlf else "\n").join(lines)
    if len(set(ids)) != len(ids):
        with pytest.raises(ValueError, match="appears twice"):
            parse_prompt_lines(source, "mine.jsonl")
        return
    prompts = parse_prompt_lines(source, "mine.jsonl")
    assert [p.text for p in prompts] == [text for text, _, _ in items]
    assert len({p.id for p in prompts}) == len(prompts)
    for prompt, (_, ident, _) in zip(prompts, items, strict=True):
        if ident is not None:
            assert prompt.id == str(ident)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"prompt": "a"}\n{"prompt": "b"\n', "mine.jsonl line 2: not JSON"),
        ('["a"]\n', "mine.jsonl line 1: expected an object"),
        ('{"question": "a"}\n', 'line 1: needs exactly one of "prompt" or "text"'),
        ('{"prompt": "a", "text": "b"}\n', 'line 1: needs exactly one of "prompt" or "text"'),
        ('{"prompt": "a", "answer": "b"}\n', "got keys \\['answer', 'prompt'\\]"),
        ('\n\n{"prompt": "   "}\n', 'line 3: "prompt" must be a non-empty string'),
        ('{"text": 5}\n', 'line 1: "text" must be a non-empty string'),
        ('{"prompt": "a", "id": true}\n', 'line 1: "id" must be a string or an integer'),
        ('{"prompt": "a", "id": 1}\n{"prompt": "b", "id": "1"}\n', "line 2: id '1' appears twice"),
        ("\n  \n", "mine.jsonl: no prompts"),
    ],
)
def test_a_bad_line_is_an_error_naming_the_file_and_line(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_prompt_lines(text, "mine.jsonl")


def test_shipped_sets_are_math_code_and_chat_with_twelve_to_twenty_prompts_each() -> None:
    assert shipped_sets() == ["chat", "code", "math"]
    for name in shipped_sets():
        step = EvalAcceptanceStep(id="e", base_url="http://h", prompt_sets=[name])
        (prompts,) = step._sets(None).values()
        assert isinstance(prompts, list) and 12 <= len(prompts) <= 20
        assert len({p["id"] for p in prompts}) == len(prompts)


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({}, "exactly one of `server`"),
        ({"server": "deploy", "base_url": "http://h"}, "exactly one of `server`"),
        ({"server": "d", "prompt_sets": ["math", "poetry"]}, "unknown prompt sets \\['poetry'\\]"),
        ({"server": "d", "prompt_sets": []}, "at least one prompt set"),
        ({"server": "d", "prompt_sets": {"my set": "a.jsonl"}}, "letters, digits and _ only"),
        ({"server": "d", "prompt_sets": {"mine\n": "a.jsonl"}}, "letters, digits and _ only"),  # matched whole
        ({"server": "d", "api": "generate", "prompt_template": "<user>{text}</user>"}, "must contain {prompt}"),
        ({"server": "d", "prompt_template": "<user>{prompt}</user>"}, "applies to `api: generate` only"),
        ({"server": "d", "api": "generate", "thinking": False}, "thinking: a chat template setting"),
        ({"server": "d", "api": "generate", "thinking_kwarg": "x"}, "thinking_kwarg: a chat template setting"),
        ({"server": "d", "api": "completions"}, "'chat' or 'generate'"),
        ({"server": "d", "speculative": False, "compare_outputs_to": "e0"}, "is the reference"),
        ({"server": "d", "lossless_tolerance": 1.5}, "less than or equal to 1"),
        ({"server": "d", "max_new_tokens": 0}, "greater than or equal to 1"),
    ],
)
def test_parameters_are_checked_when_the_runbook_loads(params: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        EvalAcceptanceStep(id="e", **params)


def test_limit_and_template_apply_to_what_is_sent_and_the_deploy_step_is_needed() -> None:
    step = EvalAcceptanceStep(
        id="e", server="dflash", prompt_sets=["math"], limit=2, api="generate", prompt_template="<u>{prompt}</u>"
    )
    (prompts,) = step._sets(None).values()
    assert isinstance(prompts, list) and len(prompts) == 2
    assert prompts[0]["text"].startswith("<u>A bakery") and prompts[0]["text"].endswith("</u>")
    assert "dflash" in step.needs()


@given(limit=st.one_of(st.none(), st.integers(1, 20)), screen=st.integers(1, 20))
def test_a_searchs_screen_sends_the_first_prompts_of_each_set_and_says_how_many_it_has(
    limit: int | None, screen: int
) -> None:
    """Cut after `limit`: each set longer than `screen_prompts` sends its first ones, the rest as they are; a set
    read at run time (plan's placeholder) is left alone."""
    step = EvalAcceptanceStep(id="e", server="dflash", limit=limit, screen_prompts=screen)
    sets: dict[str, list[dict[str, str]] | str] = {**step._sets(None), "mine": "<read at run time>"}
    sent, cut = step.screened(sets)
    assert sent["mine"] == "<read at run time>" and "mine" not in cut
    for name in ("math", "code", "chat"):
        whole = sets[name]
        assert isinstance(whole, list)
        assert sent[name] == whole[:screen]
        assert cut.get(name) == (len(whole) if len(whole) > screen else None)


def test_a_screened_lossless_check_fails_no_configuration_that_the_whole_sets_check_passes() -> None:
    """The tolerance exists because a greedy output may flip on a GPU (kernels not batch-invariant): a screen of a
    set's first prompts must not turn it into exact equality, failing (and losing to the search) a configuration
    whose whole evaluation, where it is deployed, passes with the same answers."""
    step = EvalAcceptanceStep(id="e", base_url="http://h", prompt_sets=["math"], compare_outputs_to="base")
    sets = step._sets(None)
    setup = step.setup(sets)
    sent, cut = step.screened(sets)
    whole = sets["math"]
    assert isinstance(whole, list) and cut == {"math": len(whole)} and len(whole) >= 10

    def answered(prompts: list[dict[str, str]] | str, flipped: str | None = None) -> list[dict[str, Any]]:
        assert isinstance(prompts, list)
        answer = {"seconds": 1.0, "prompt_tokens": 9, "completion_tokens": 4, "spec_verify_ct": 2}
        return [answer | {"id": p["id"], "output_ids": [1, 2, 3, 9 if p["id"] == flipped else 4]} for p in prompts]

    baseline = [request_facts("math", {**r, "spec_verify_ct": None}) for r in answered(whole)]
    reference = Reference(step="base", requests=baseline, **setup.model_dump())
    flipped = whole[0]["id"]  # one near-tie flipped, among the first prompts: 1 of the set's 16 differs

    def verdict(prompts: list[dict[str, str]] | str, screened_from: dict[str, int] | None = None) -> dict[str, str]:
        document = HostDocument(
            base_url="http://h",
            error=None,
            flush=FlushFacts(flushed=True, attempts=1, status=200, body="Cache flushed."),
            planned={"math": len(prompts)},
            sets={"math": answered(prompts, flipped)},
        )
        return facts_from(document, step, setup, reference, screened_from).lossless_failed

    assert verdict(whole) == {}  # the whole set's check: 1 of 16 differs, at most 1 (10%) may
    assert verdict(sent["math"], cut) == {}
    assert "at most 0 (10% of 4) may" in verdict(sent["math"])["math"]  # unscreened, 4 prompts are the set


class _ScreenedHost:
    """What EvalAcceptanceStep.execute asks of its context, in a configuration a campaign's search launched: a
    screen, and a host program that answers every prompt it was sent."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.output_dir, self.host_name, self.base_dir = run_dir, run_dir / "out", "gpu", run_dir
        self.redactor = Redactor([])
        self.sent: dict[str, list[dict[str, str]]] = {}

    def screened(self) -> bool:
        return True

    def progress(self, message: str, /, **fields: Any) -> None:
        pass

    async def run(self, script: str, **_: Any) -> Any:
        config = json.loads(next(line for line in script.splitlines() if line.startswith('{"base_url"')))
        self.sent = config["sets"]
        answer = {"seconds": 1.0, "prompt_tokens": 9, "completion_tokens": 4, "spec_verify_ct": 2}
        document = {
            "base_url": "http://h", "error": None,
            "flush": {"flushed": True, "attempts": 1, "status": 200, "body": "Cache flushed."},
            "planned": {name: len(p) for name, p in self.sent.items()},
            "sets": {name: [answer | {"id": q["id"], "output_ids": [1]} for q in p] for name, p in self.sent.items()},
        }  # fmt: skip
        collect = Collector()
        collect.stdout.feed(json.dumps(document).encode() + b"\n")
        return collect.result(0)


def test_a_screened_evaluation_sends_its_first_prompts_and_keeps_the_whole_sets_digest(tmp_path: Path) -> None:
    """Its facts say what was cut (`screened_from`), and its digest is of every prompt of the set, as the reference's
    is (the field says so): a lossless check compares it with a baseline that evaluated the whole set."""
    step = EvalAcceptanceStep(id="e", base_url="http://h", prompt_sets=["math"])
    host = _ScreenedHost(tmp_path)
    outcome = asyncio.run(step.execute(cast(StepContext, host)))
    facts = outcome.facts
    assert isinstance(facts, EvalAcceptanceFacts) and facts.screened_from == {"math": 16}
    whole = step._sets(None)["math"]
    assert isinstance(whole, list) and host.sent["math"] == whole[: step.screen_prompts]
    assert facts.prompts_sha256 == step.setup({"math": whole}).prompts_sha256 != step.setup(host.sent).prompts_sha256


def test_a_runbooks_own_file_that_cannot_be_read_or_parsed_fails_with_its_path(tmp_path: Path) -> None:
    step = EvalAcceptanceStep(id="e", base_url="http://h", prompt_sets={"mine": "prompts/mine.jsonl"})
    with pytest.raises(FactsError, match=r"prompt set 'mine': cannot read .*prompts/mine\.jsonl"):
        step._sets(tmp_path)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "mine.jsonl").write_text('{"prompt": "hi"}\n{"promt": "typo"}\n')
    with pytest.raises(FactsError, match=r"prompt set 'mine': .*mine\.jsonl line 2: needs exactly one of"):
        step._sets(tmp_path)


def test_a_prompt_set_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    """Before: a FIFO as the prompt set waited for a writer for ever (the run hung in its event loop), and a
    device was read as one (/dev/zero: an endless line filling memory; /dev/null here, harmless)."""
    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "device.jsonl").symlink_to(os.devnull)
    for name in ("fifo.jsonl", "device.jsonl"):
        step = EvalAcceptanceStep(id="e", base_url="http://h", prompt_sets={"mine": name})
        answered: list[BaseException] = []

        def read(step: EvalAcceptanceStep = step, answered: list[BaseException] = answered) -> None:
            with pytest.raises(FactsError, match="not a regular file") as caught:
                step._sets(tmp_path)
            answered.append(caught.value)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(10)
        if reader.is_alive():  # free the reader stuck on the FIFO before failing
            os.close(os.open(tmp_path / "fifo.jsonl", os.O_WRONLY | os.O_NONBLOCK))
        assert answered, f"{name}: no answer within 10 s"


# ------------------------------------------------------------------------------------------- statistics


def request(completion: int | None, verify: int | None, seconds: float = 1.0, error: str | None = None) -> RequestFacts:
    return RequestFacts(
        set="s",
        id="1",
        seconds=seconds,
        prompt_tokens=10,
        completion_tokens=completion,
        verify_ct=verify,
        accept_length=completion / verify if completion is not None and verify else None,
        server_accept_length=None,
        finish_reason="length",
        error=error,
        output_ids=None,
    )


def test_a_one_token_answer_proves_nothing_about_speculation() -> None:
    """Prefill gives the first token with no verify step, so a one-token answer has spec_verify_ct 0 even with
    speculation on: it neither fails the proof nor makes it."""
    assert speculated([request(64, 16), request(1, 0)])
    assert not speculated([request(64, 16), request(64, 0)])
    assert not speculated([request(1, 0)]) and not speculated([])


measured_requests = st.lists(
    st.tuples(st.integers(min_value=1, max_value=4096), st.integers(min_value=1, max_value=4096)).map(
        lambda cv: request(max(cv), min(cv))  # completion >= verify: at least one token per verify step
    ),
    min_size=1,
    max_size=60,
)


@given(measured=measured_requests, without_spec=st.integers(min_value=0, max_value=5))
def test_statistics_are_ordered_and_agree_with_the_stdlib(measured: list[RequestFacts], without_spec: int) -> None:
    plain = [request(50, None) for _ in range(without_spec)]
    summary = summarize(measured + plain, len(measured) + without_spec)
    values = sorted(r.accept_length for r in measured if r.accept_length is not None)
    assert summary.unknown_reason is None
    assert summary.measured == len(measured) and summary.without_spec == without_spec
    assert summary.min is not None and summary.max is not None and summary.mean is not None
    assert summary.p10 is not None and summary.median is not None and summary.weighted_mean is not None
    assert summary.min <= summary.p10 <= summary.median <= summary.max
    assert summary.min <= summary.mean <= summary.max
    assert summary.min >= 1.0  # the bonus token: never below one
    assert summary.median == pytest.approx(statistics.median(values), abs=1e-4)
    assert summary.mean == pytest.approx(statistics.fmean(values), abs=1e-4)
    if len(values) >= 2:
        p10 = statistics.quantiles(values, n=10, method="inclusive")[0]
        assert summary.p10 == pytest.approx(p10, abs=1e-4)
    tokens = sum(r.completion_tokens or 0 for r in measured)
    verify = sum(r.verify_ct or 0 for r in measured)
    assert summary.weighted_mean == pytest.approx(tokens / verify, abs=1e-4)
    assert summary.completion_tokens == tokens + 50 * without_spec and summary.verify_ct == verify
    assert summary.tokens_per_s == pytest.approx(summary.completion_tokens / (len(measured) + without_spec), rel=1e-3)
    assert summary.requests == len(measured) + without_spec  # every request sent, measured or not
    assert sum(b.count for b in summary.histogram) == len(measured)  # the histogram is of the measured ones


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(min_value=0.25, max_value=64.0), min_size=1, max_size=80))
def test_histogram_bins_are_half_wide_from_one_and_hold_each_value_once(values: list[float]) -> None:
    bins = histogram(values)
    assert bins[0].low == (1.0 if min(values) >= 1.0 else math.floor(min(values) * 2) / 2)
    for before, after in itertools.pairwise(bins):
        assert after.low == before.high  # contiguous, empty bins included
    for item in bins:
        assert item.high - item.low == 0.5
        assert item.count == sum(1 for v in values if item.low <= v < item.high)  # [low, high)
    assert sum(b.count for b in bins) == len(values)
    assert bins[-1].count > 0 and bins[-1].low <= max(values) < bins[-1].high  # up to the largest value


def test_histogram_edges_belong_to_the_bin_above() -> None:
    bins = histogram([1.0, 1.5, 1.49, 3.0])
    assert [(b.low, b.high, b.count) for b in bins] == [(1.0, 1.5, 2), (1.5, 2.0, 1), (2.0, 2.5, 0), (2.5, 3.0, 0),
                                                        (3.0, 3.5, 1)]  # fmt: skip
    assert histogram([]) == []


token_ids = st.lists(st.integers(min_value=0, max_value=5), max_size=12)


@settings(max_examples=200, deadline=None)
@given(reference=token_ids, output=token_ids)
def test_first_divergence_is_the_first_index_that_differs(reference: list[int], output: list[int]) -> None:
    index = first_divergence(reference, output)
    if reference == output:
        assert index is None
        return
    assert index is not None and reference[:index] == output[:index]
    assert index == min(len(reference), len(output)) or reference[index] != output[index]


def test_a_screen_fails_no_set_the_whole_check_passes_where_the_references_first_answers_failed() -> None:
    """LosslessSet.set_prompts: "a screen fails no configuration the whole set's check would pass". Where the
    reference did not answer a set's first prompts (timeouts after its flush), the screen sends the first it did
    answer, so that each of its answers is compared."""
    step = EvalAcceptanceStep(id="e", base_url="http://h", prompt_sets={"s": "s.jsonl"})
    prompts: list[dict[str, str]] = [{"id": str(i), "text": f"q{i}"} for i in range(16)]
    answered = request(4, 2).model_copy(update={"output_ids": [1, 2, 3, 4], "set": "s"})
    failed = {"error": "timed out", "output_ids": None}
    reference = [answered.model_copy(update={"id": str(i)} | (failed if i < 4 else {})) for i in range(16)]
    outputs = [answered.model_copy(update={"id": str(i)}) for i in range(16)]
    whole = compare_outputs(reference, outputs, ["s"], 0.1)
    assert whole["s"].compared == 12 and lossless_failures(whole, "base") == {}
    sent, cut = step.screened({"s": prompts}, {(r.set, r.id) for r in reference if r.output_ids})
    assert cut == {"s": 16} and [p["id"] for p in sent["s"]] == ["4", "5", "6", "7"]
    screened = compare_outputs(reference, [o for o in outputs if o.id in {"4", "5", "6", "7"}], ["s"], 0.1, cut)
    assert screened["s"].compared == 4 and lossless_failures(screened, "base") == {}


def test_lossless_tolerance_is_a_share_of_the_compared_outputs() -> None:
    def outputs(ids: dict[str, list[int]]) -> list[RequestFacts]:
        return [request(4, 2).model_copy(update={"id": k, "output_ids": v}) for k, v in ids.items()]

    reference = outputs({str(i): [1, 2, 3, 4] for i in range(20)})
    one_off = outputs({str(i): [1, 2, 3, 4] for i in range(19)} | {"19": [1, 2, 9, 9]})
    two_off = outputs({str(i): [1, 2, 3, 4] for i in range(18)} | {"18": [1, 9, 3, 4], "19": [1, 2, 3]})
    result = compare_outputs(reference, one_off, ["s"], 0.05)["s"]
    assert (result.compared, result.identical, result.differing, result.first_divergence) == (20, 19, 1, [2])
    assert lossless_failures({"s": result}, "base") == {}  # 1 of 20 is 5%: allowed
    result = compare_outputs(reference, two_off, ["s"], 0.05)["s"]
    assert result.first_divergence == [1, 3] and result.differing_ids == ["18", "19"]
    assert lossless_failures({"s": result}, "base") == {
        "s": "2 of 20 outputs differ from base's (prompts 18, 19; first divergence at token [1, 3]); "
        "at most 1 (5% of 20) may"
    }
    unmatched = compare_outputs(reference, outputs({"x": [1]}), ["s"], 0.1)
    assert unmatched["s"].compared == 0 and "no output could be compared" in lossless_failures(unmatched, "base")["s"]


@given(count=st.integers(min_value=1, max_value=20))
def test_answers_without_spec_fields_are_unknown_never_zero_or_one(count: int) -> None:
    summary = summarize([request(100, None) for _ in range(count)], count)
    assert summary.mean is None and summary.median is None and summary.p10 is None and summary.min is None
    assert summary.unknown_reason is not None and "no speculative decoding fields" in summary.unknown_reason
    assert summary.completion_tokens == 100 * count  # the tokens and speed are still real
    assert summary.tokens_per_s == 100.0


def test_failed_and_unsent_requests_are_unknown_with_the_reason() -> None:
    failed = summarize([request(None, None, error="HTTP 400: DFLASH does not support return_logprob")], 1)
    assert failed.mean is None and failed.failed == 1
    assert failed.unknown_reason == "every request failed; the first: HTTP 400: DFLASH does not support return_logprob"
    assert failed.errors == ["1: HTTP 400: DFLASH does not support return_logprob"]
    unsent = summarize([], 16)
    assert (
        unsent.requests == 0
        and unsent.histogram == []
        and unsent.unknown_reason is not None
        and "(16 planned)" in unsent.unknown_reason
    )


def test_facts_list_every_planned_set_and_count_failures() -> None:
    document = HostDocument(
        base_url="http://127.0.0.1:30000",
        error="the server stopped answering during set 'code', prompt 2: connection refused",
        flush=FlushFacts(flushed=True, attempts=1, status=200, body="Cache flushed."),
        planned={"math": 2, "code": 2, "chat": 2},
        sets={
            "math": [
                {"id": "m1", "seconds": 0.5, "completion_tokens": 64, "spec_verify_ct": 16, "prompt_tokens": 30},
                {"id": "m2", "seconds": 0.5, "completion_tokens": 60, "spec_verify_ct": 12, "prompt_tokens": 30},
            ],
            "code": [{"id": "c1", "seconds": 0.1, "error": "HTTP 500: boom"}],
        },
    )
    step = EvalAcceptanceStep(id="e", base_url="http://h", max_new_tokens=64)
    facts = facts_from(document, step, step.setup({}))
    assert list(facts.sets) == ["math", "code", "chat"]
    assert facts.sets["math"].mean == 4.5 and facts.sets["math"].weighted_mean == pytest.approx(124 / 28, abs=1e-4)
    assert facts.sets["math"].tokens_per_s == 124.0
    assert set(facts.sets_without_results) == {"code", "chat"}
    assert facts.failed_requests == 1 and facts.overall.measured == 2 and facts.overall.requests == 3
    assert [r.accept_length for r in facts.requests] == [4.0, 5.0, None]


# ------------------------------------------------------------------- the host program's reading of answers


class Scripted(BaseHTTPRequestHandler):
    """Answers of a scripted server: {path: [(status, body), ...]} in turn; records the requests seen."""

    answers: dict[str, list[tuple[int, str]]]
    seen: list[tuple[str, str | None, bytes]]

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.path, self.headers.get("Authorization"), body))
        scripted = self.answers.get(self.path.partition("?")[0])  # a path not scripted: as a server without it
        status, text = scripted.pop(0) if scripted else (404, '{"detail":"Not Found"}')
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def scripted_run(answers: dict[str, list[tuple[int, str]]], **config: Any) -> tuple[dict[str, Any], list[Any]]:
    """Run the host program's evaluate() against a scripted server on loopback."""
    seen: list[tuple[str, str | None, bytes]] = []
    handler = type("Handler", (Scripted,), {"answers": answers, "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        document = host.evaluate(
            {
                "base_url": f"http://127.0.0.1:{server.server_address[1]}",
                "api": "generate",
                "thinking": None,
                "thinking_kwarg": "thinking",
                "max_new_tokens": 8,
                "request_timeout_s": 10,
                "flush_attempts": 2,
                "flush_delay_s": 0,
                "api_key_var": None,
                "metric_families": list(FAMILIES),
                "sets": {"s": [{"id": "a", "text": "hello"}]},
                **config,
            }
        )
    finally:
        server.shutdown()
        server.server_close()
    return document, seen


def test_a_200_whose_body_is_not_cache_flushed_is_a_refusal() -> None:
    # SGLang before 0.5.23 answered 200 to a refused flush: the body is what counts
    document, seen = scripted_run({"/flush_cache": [(200, "Flush cache failed.\n"), (200, "ok")]})
    assert document["flush"] == {"flushed": False, "attempts": 2, "status": 200, "body": "ok"}
    assert document["error"] == "the server did not flush its cache after 2 attempt(s); it answered HTTP 200: ok"
    assert [path for path, _, _ in seen] == ["/metrics", "/flush_cache", "/flush_cache"]  # and no /generate


def test_requests_are_greedy_carry_the_api_key_and_a_bad_answer_is_that_requests_error(monkeypatch) -> None:
    monkeypatch.setenv("EVAL_KEY", "sk-123")
    flushed = (200, "Cache flushed.\nPlease check backend logs for more details.")
    answers = {"/flush_cache": [flushed], "/generate": [(200, '{"text": "hi"}'), (200, "{")]}
    sets = {"s": [{"id": "a", "text": "hello"}, {"id": "b", "text": "again"}]}
    document, seen = scripted_run(answers, api_key_var="EVAL_KEY", sets=sets)
    assert document["error"] is None and document["flush"]["flushed"] is True
    assert {auth for _, auth, _ in seen} == {"Bearer sk-123"}
    assert [path for path, _, _ in seen][:3] == ["/metrics", "/flush_cache", "/generate"]  # the key to /metrics too
    assert json.loads(seen[2][2]) == {"text": "hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    first, second = document["sets"]["s"]
    assert first["error"].startswith("unexpected answer ('meta_info')") and second["error"].startswith("unexpected")
    assert "sk-123" not in json.dumps(document)


def test_the_chat_api_sends_what_sglang_takes_and_reads_the_first_choices_meta_info_and_token_ids() -> None:
    models = json.dumps({"object": "list", "data": [{"id": "moonshotai/Kimi-K2.6", "object": "model"}]})
    meta = {"completion_tokens": 3, "prompt_tokens": 12, "spec_verify_ct": 2, "finish_reason": {"type": "length"}}
    answer = {
        "choices": [{"index": 0, "message": {"content": "x"}, "meta_info": meta, "response_token_ids": [5, 6, 7]}]
    }
    document, seen = scripted_run(
        {
            "/flush_cache": [(200, "Cache flushed.")],
            "/v1/models": [(200, models)],
            "/v1/chat/completions": [(200, json.dumps(answer))],
        },
        api="chat",
        thinking=False,
        thinking_kwarg="enable_thinking",
    )
    assert document["error"] is None
    assert [path for path, _, _ in seen] == [
        "/metrics",
        "/flush_cache",
        "/v1/models",
        "/v1/chat/completions",
        "/metrics",
        "/server_info",
    ]  # /metrics around the prompts (404 here: a server without metrics), the running average after
    assert json.loads(seen[3][2]) == {
        "model": "moonshotai/Kimi-K2.6",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": False,
        "chat_template_kwargs": {"enable_thinking": False},
        "return_meta_info": True,
        "return_token_ids": True,
    }
    (record,) = document["sets"]["s"]
    assert record["output_ids"] == [5, 6, 7] and record["spec_verify_ct"] == 2 and record["prompt_tokens"] == 12
    assert record["finish_reason"] == "length"


def test_no_served_model_stops_the_chat_evaluation_before_any_prompt() -> None:
    document, seen = scripted_run({"/flush_cache": [(200, "Cache flushed.")], "/v1/models": [(404, "no")]}, api="chat")
    assert document["error"].endswith("/v1/models named no served model (HTTP 404): no")
    assert [path for path, _, _ in seen] == ["/metrics", "/flush_cache", "/v1/models"]


@pytest.mark.parametrize(
    "number", ["NaN", "-Infinity", "1e999", pytest.param("[" * 100_000 + "]" * 100_000, id="nested-100000-deep")]
)
def test_a_number_json_has_not_in_an_answer_is_that_requests_error_and_the_document_still_prints(number: str) -> None:
    """Python's JSON reads NaN, and 1e999 as inf; the kit prints its document with allow_nan=False, so one such
    answer must not lose every request's record in a traceback."""
    answer = '{"meta_info": {"completion_tokens": 8, "spec_verify_ct": ' + number + "}}"
    document, _ = scripted_run({"/flush_cache": [(200, "Cache flushed.")], "/generate": [(200, answer)]})
    json.dumps(document, allow_nan=False)
    assert document["sets"]["s"][0]["error"].startswith("unexpected answer (")


# ------------------------------------------------------------------------------- runs through the test host


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_eval(
    host: SandboxHost, tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str
) -> tuple[int, dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Run a runbook of `body`'s steps on `host` with --json: (exit code, {step: record}, events)."""
    path = tmp_path / "eval.yaml"
    path.write_text("name: eval\n" + host.host_yaml() + "steps:\n" + textwrap.indent(textwrap.dedent(body), "  "))
    logs = tmp_path / "logs"
    code = main(["run", str(path), "--log-dir", str(logs), "--json"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert main(["status", "--log-dir", str(logs), "--json"]) == 0
    records = {record["step"]: record for record in json.loads(capsys.readouterr().out)["steps"]}
    return code, records, events


def test_plan_shows_every_prompt_sent_and_marks_what_is_known_at_run_time(sshd, tmp_path: Path, capsys) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "name: plan\n" + sshd.host_yaml() + "steps:\n"
        "  - {id: dflash, kind: shell, script: 'true'}\n"
        "  - id: eval\n    kind: eval_acceptance\n    server: dflash\n    limit: 2\n"
        "    prompt_sets: {math: math.jsonl}\n"
    )
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert "<known at run time: steps.dflash.facts.base_url>" in out
    assert "<read at run time from math.jsonl, relative to the runbook's folder>" in out
    path.write_text(path.read_text().replace("    prompt_sets: {math: math.jsonl}\n", "    prompt_sets: [math]\n"))
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert "A bakery sells muffins" in out and "A train leaves a station" in out  # the first two, as sent
    assert "Tom has twice as many marbles" not in out  # limit: 2
    assert "# hostprograms/eval_acceptance.py with the kit, zip sha256:" in out  # the host program, as shipped


def test_a_server_that_does_not_answer_fails_the_step_naming_the_flush(testhost, tmp_path: Path, capsys) -> None:
    port = free_port()
    code, records, _ = run_eval(
        testhost("h200"),
        tmp_path,
        capsys,
        f"""
        - id: eval
          kind: eval_acceptance
          base_url: http://127.0.0.1:{port}
          flush_attempts: 2
          flush_retry_delay: 0
          retry: {{attempts: 1}}
        """,
    )
    assert code != 0
    record = records["eval"]
    assert record["status"] == "failed"
    assert "the acceptance evaluation stopped early" in record["message"]
    assert "did not flush its cache after 2 attempt(s)" in record["message"]
    assert "Connection refused" in record["message"]
    assert record["facts"]["flush"] == {
        "flushed": False,
        "attempts": 2,
        "status": None,
        "body": f"http://127.0.0.1:{port}/flush_cache: [Errno 111] Connection refused",
    }
    assert set(record["facts"]["sets_without_results"]) == {"math", "code", "chat"}


# --------------------------------------------------------------- against the SGLang stand-in on the test host

FAST = {"decode_tokens_per_s": 4000.0, "startup_s": 0.3}  # the stand-in's switches: keep the tests short


@dataclass(frozen=True)
class Servers:
    """Stand-in servers started by deploy steps on the h200 test host, for the whole module."""

    host: SandboxHost
    deploy: dict[str, str]  # server name -> the YAML of its deploy step (id = the name)
    ports: dict[str, int]

    def base_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"


def deploy_yaml(host: SandboxHost, name: str, port: int, models: Path, drafter: bool) -> str:
    lines = [
        f"- id: {name}",
        "  kind: deploy",
        f"  python: {host.python}",
        f"  model_path: {models / 'target'}",
        f"  port: {port}",
        "  tp_size: 1",
        "  attention_backend: fa3",
        "  trust_remote_code: false",
        "  ready_timeout: 60",
    ]
    if drafter:
        lines += [
            f"  draft_model_path: {models / 'drafter'}",
            "  draft_attention_backend: fa3",
            "  speculative_num_draft_tokens: 8",
        ]
    return "\n".join(lines) + "\n"


def switches(host: SandboxHost, **values: Any) -> None:
    """Write the stand-in's switches ($HOME/sglang-standin.json), read when a server starts."""
    (host.home / "sglang-standin.json").write_text(json.dumps({**FAST, **values}))


def runbook_file(host: SandboxHost, folder: Path, steps: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "runbook.yaml"
    path.write_text("name: eval-servers\n" + host.host_yaml() + "steps:\n" + textwrap.indent(steps, "  "))
    return path


@pytest.fixture(scope="module")
def servers(testhost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """A DFlash server (the stand-in's default acceptance: math ~5.4, code ~4.9, chat ~3.7), a
    baseline without speculative decoding, a weak drafter (acceptance ~2) and a broken one (its
    greedy outputs differ from the baseline's), started through the deploy kind; stopped by it at the end."""
    host: SandboxHost = testhost("h200")
    tmp = tmp_path_factory.mktemp("eval-servers")
    models = host.home / "models-eval"
    for name, config in (("target", target_config()), ("drafter", drafter_config())):
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text(json.dumps(config))
    ports = {name: free_port() for name in ("dflash", "baseline", "weak", "broken")}
    yaml = {name: deploy_yaml(host, name, port, models, drafter=name != "baseline") for name, port in ports.items()}
    try:
        switches(host)
        started = runbook_cli("run", str(runbook_file(host, tmp / "start", yaml["dflash"] + yaml["baseline"])),
                              "--log-dir", str(tmp / "logs"))  # fmt: skip
        assert started.returncode == 0, started.stderr
        switches(host, accept_length=2.0)
        started = runbook_cli(
            "run", str(runbook_file(host, tmp / "weak", yaml["weak"])), "--log-dir", str(tmp / "logs")
        )
        assert started.returncode == 0, started.stderr
        switches(host, broken_drafter=True)
        started = runbook_cli(
            "run", str(runbook_file(host, tmp / "broken", yaml["broken"])), "--log-dir", str(tmp / "logs")
        )
        assert started.returncode == 0, started.stderr
        (host.home / "sglang-standin.json").unlink()
        yield Servers(host, yaml, ports)
    finally:
        (host.home / "sglang-standin.json").unlink(missing_ok=True)
        stop = "".join(f"- {{id: stop_{n}, kind: stop_server, port: {p}, python: {host.python}}}\n"
                       for n, p in ports.items())  # fmt: skip
        stopped = runbook_cli("run", str(runbook_file(host, tmp / "stop", stop)), "--log-dir", str(tmp / "logs"))
        assert stopped.returncode == 0, stopped.stderr
        shutil.rmtree(models)


def eval_yaml(**params: Any) -> str:
    return "- id: eval\n  kind: eval_acceptance\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in params.items())


def test_dflash_acceptance_per_prompt_set_through_the_deploy_steps_facts(servers: Servers, tmp_path, capsys) -> None:
    steps = servers.deploy["dflash"] + eval_yaml(
        server="dflash",
        limit=3,
        max_new_tokens=48,
        gates=[
            "facts.error is none",
            "exit_code == 0",
            "not facts.sets_without_results",
            {"that": "facts.sets.math.mean >= 3.0", "message": "DFlash accepts fewer than 3 tokens per step on math"},
        ],
    )
    code, records, events = run_eval(servers.host, tmp_path, capsys, steps)
    assert code == 0, records
    assert records["dflash"]["facts"]["reused"] is True  # the module's server, found by its arguments
    facts = records["eval"]["facts"]
    assert facts["base_url"] == servers.base_url("dflash")
    assert facts["flush"]["flushed"] is True and facts["flush"]["body"].startswith("Cache flushed.")
    sets = facts["sets"]
    assert list(sets) == ["math", "code", "chat"]
    for summary in sets.values():
        assert summary["requests"] == summary["measured"] == 3 and summary["failed"] == 0
        assert summary["unknown_reason"] is None
        assert 1 < summary["min"] <= summary["p10"] <= summary["median"] <= summary["max"] <= 8  # the draft tokens
        assert summary["min"] <= summary["mean"] <= summary["max"]
        assert summary["completion_tokens"] == 3 * 48 and summary["verify_ct"] > 0
        assert summary["tokens_per_s"] > 0 and summary["prompt_tokens"] > 0
    assert sets["math"]["mean"] > sets["chat"]["mean"]
    assert facts["overall"]["requests"] == 9 and facts["overall"]["completion_tokens"] == 9 * 48
    for request in facts["requests"]:
        assert request["accept_length"] == pytest.approx(request["completion_tokens"] / request["verify_ct"])
        assert request["accept_length"] == pytest.approx(request["server_accept_length"])
    progress = [e for e in events if e["event"] == "progress" and e["step"] == "eval"]
    assert len(progress) == 9
    assert progress[0]["message"].startswith("math 1/3: accept length ")
    assert progress[-1]["message"].startswith("chat 3/3: accept length ")
    assert "48 tokens" in progress[-1]["message"] and progress[-1]["fields"]["id"] == "chat-03"


def test_a_server_without_speculative_decoding_is_unknown_and_fails_never_reads_as_one(
    servers: Servers, tmp_path, capsys
) -> None:
    steps = eval_yaml(base_url=servers.base_url("baseline"), limit=2, max_new_tokens=16, retry={"attempts": 1})
    code, records, _ = run_eval(servers.host, tmp_path, capsys, steps)
    assert code != 0
    record = records["eval"]
    assert record["status"] == "failed"
    assert "prompt sets without an acceptance length" in record["message"]
    assert "it runs without speculative decoding" in record["message"]  # the reason, in the gate's detail
    for summary in record["facts"]["sets"].values():
        assert summary["mean"] is None and summary["median"] is None and summary["p10"] is None
        assert summary["without_spec"] == 2 and summary["completion_tokens"] == 32  # answered all the same


def test_a_refused_cache_flush_is_retried_then_fails_with_the_servers_answer(
    servers: Servers, tmp_path, capsys
) -> None:
    switches(servers.host, fault="refuse_flush_cache")
    try:
        steps = eval_yaml(
            base_url=servers.base_url("dflash"), flush_attempts=3, flush_retry_delay=0.1, retry={"attempts": 1}
        )
        code, records, events = run_eval(servers.host, tmp_path, capsys, steps)
    finally:
        (servers.host.home / "sglang-standin.json").unlink()
    assert code != 0
    record = records["eval"]
    assert "the acceptance evaluation stopped early" in record["message"]
    assert "did not flush its cache after 3 attempt(s); it answered HTTP 400: Flush cache failed." in record["message"]
    assert record["facts"]["flush"]["attempts"] == 3
    assert record["facts"]["overall"]["requests"] == 0  # not one prompt was sent on a warm cache
    assert not [e for e in events if e["event"] == "progress"]


def test_the_example_gate_fails_on_a_weak_drafter_with_the_measured_mean(servers: Servers, tmp_path, capsys) -> None:
    gate = {"that": "facts.sets.math.mean >= 3.0", "message": "DFlash accepts fewer than 3 tokens per step on math"}
    steps = eval_yaml(
        base_url=servers.base_url("weak"), prompt_sets=["math"], limit=4, gates=[gate], retry={"attempts": 1}
    )
    code, records, _ = run_eval(servers.host, tmp_path, capsys, steps)
    assert code != 0
    record = records["eval"]
    mean = record["facts"]["sets"]["math"]["mean"]
    assert 1.5 < mean < 2.5
    assert "DFlash accepts fewer than 3 tokens per step on math" in record["message"]
    assert f"facts.sets.math.mean = {mean}" in record["message"]


def test_a_runbooks_own_jsonl_file_relative_to_the_runbook(servers: Servers, tmp_path, capsys) -> None:
    (tmp_path / "prompts").mkdir()
    lines = [
        {"id": "q1", "prompt": "How many legs do 3 spiders and 2 ants have in total?"},
        {"text": "Tell me about the moons of Jupiter."},
        {"id": 7, "prompt": "Write a Python function that returns the median of a list."},
    ]
    (tmp_path / "prompts" / "mine.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    steps = eval_yaml(base_url=servers.base_url("dflash"), prompt_sets={"mine": "prompts/mine.jsonl"}, max_new_tokens=8)
    code, records, _ = run_eval(servers.host, tmp_path, capsys, steps)
    assert code == 0, records
    facts = records["eval"]["facts"]
    assert list(facts["sets"]) == ["mine"] and facts["sets"]["mine"]["measured"] == 3
    assert [r["id"] for r in facts["requests"]] == ["q1", "2", "7"]


def test_the_api_key_goes_to_the_server_and_nowhere_else(servers: Servers, tmp_path, capsys, monkeypatch) -> None:
    key = "sk-eval-test-9f8e7d6c5b4a"
    monkeypatch.setenv("EVAL_TEST_SGLANG_KEY", key)
    step = eval_yaml(base_url=servers.base_url("dflash"), prompt_sets=["chat"], limit=1, api_key_var="SGLANG_API_KEY")
    secrets = "secrets:\n  SGLANG_API_KEY: {env: EVAL_TEST_SGLANG_KEY}\n"
    path = tmp_path / "eval.yaml"
    path.write_text("name: eval\n" + servers.host.host_yaml() + secrets + "steps:\n" + textwrap.indent(step, "  "))
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs"), "--json"]) == 0
    out = capsys.readouterr()
    assert key not in out.out + out.err
    for file in (tmp_path / "logs").rglob("*"):
        if file.is_file():
            assert key.encode() not in file.read_bytes(), file


def test_meta_info_of_unexpected_types_fails_the_attempt_with_a_message() -> None:
    document = {
        "base_url": "http://127.0.0.1:30000",
        "error": None,
        "flush": {"flushed": True, "attempts": 1, "status": 200, "body": "Cache flushed."},
        "planned": {"math": 1},
        "sets": {"math": [{"id": "m1", "seconds": 0.5, "completion_tokens": "many", "spec_verify_ct": 4}]},
    }
    collect = Collector()
    collect.stdout.feed((json.dumps(document) + "\n").encode())
    result = collect.result(0)
    with pytest.raises(FactsError, match="meta_info has fields of unexpected types"):
        EvalAcceptanceStep(id="e", base_url="http://h").parse_facts(result)


def parsed(record: dict[str, Any], max_new_tokens: int = 64) -> Any:
    """The facts of a host document of one math request whose record is `record`."""
    document = {
        "base_url": "http://127.0.0.1:30000",
        "error": None,
        "flush": {"flushed": True, "attempts": 1, "status": 200, "body": "Cache flushed."},
        "planned": {"math": 1},
        "sets": {"math": [{"id": "m1", "seconds": 0.5, "error": None, **record}]},
    }
    collect = Collector()
    collect.stdout.feed((json.dumps(document) + "\n").encode())
    return EvalAcceptanceStep(id="e", base_url="http://h", max_new_tokens=max_new_tokens).parse_facts(collect.result(0))


@pytest.mark.parametrize(
    "record",
    [
        {"completion_tokens": True, "spec_verify_ct": True},  # JSON true is no count
        {"completion_tokens": "64", "spec_verify_ct": 16},  # nor a string of digits
        {"completion_tokens": -64, "spec_verify_ct": 16},  # nor a negative number: acceptance -4.0
        {"completion_tokens": 64, "spec_verify_ct": 16, "prompt_tokens": -1},
        {"completion_tokens": 64, "spec_verify_ct": 16, "output_ids": [1, True, "2", 3.0]},
        {"completion_tokens": 64, "spec_verify_ct": 16, "output_ids": [[1, 2]]},
    ],
)
def test_counts_and_token_ids_that_are_not_plain_non_negative_integers_fail_the_attempt(
    record: dict[str, Any],
) -> None:
    with pytest.raises(FactsError, match="unexpected types"):
        parsed(record)


@pytest.mark.parametrize(
    "record, what",
    [
        # 10**7 tokens in one verify step: a histogram of 2 * 10**7 bins, built before any gate looks
        ({"completion_tokens": 10**7, "spec_verify_ct": 1}, "completion_tokens 10000000"),
        ({"completion_tokens": 64, "spec_verify_ct": 16, "output_ids": list(range(65))}, "65 output token ids"),
    ],
)
def test_an_answer_longer_than_max_new_tokens_fails_the_attempt_naming_the_request(
    record: dict[str, Any], what: str
) -> None:
    with pytest.raises(FactsError, match=f"math m1: {what} .*max_new_tokens 64"):
        parsed(record)


def test_an_answer_of_exactly_max_new_tokens_counts() -> None:
    facts = parsed({"completion_tokens": 64, "spec_verify_ct": 16, "output_ids": list(range(64))})
    assert facts.sets["math"].mean == 4.0 and facts.requests[0].completion_tokens == 64


# ------------------------------------------------- as the model is served, lossless, proof of speculation


def templated(text: str, thinking: bool = True) -> str:
    """A prompt as the stand-in's /v1/chat/completions puts it through its chat template."""
    return simulation.apply_chat_template([{"role": "user", "content": text}], thinking)


def test_the_chat_template_and_thinking_setting_decide_the_acceptance_and_the_facts_name_them(
    servers: Servers, tmp_path, capsys
) -> None:
    common = {"base_url": servers.base_url("dflash"), "prompt_sets": ["math", "chat"], "limit": 3, "max_new_tokens": 32}
    steps = (
        eval_yaml(**common).replace("id: eval", "id: thinking_on")
        + eval_yaml(**common, thinking=False).replace("id: eval", "id: thinking_off")
        + eval_yaml(**common, api="generate").replace("id: eval", "id: raw")
    )
    code, records, _ = run_eval(servers.host, tmp_path, capsys, steps)
    assert code == 0, records
    on, off, raw = (records[name]["facts"] for name in ("thinking_on", "thinking_off", "raw"))
    assert (on["api"], on["template"], on["thinking"]) == (
        "chat",
        "the server's chat template (/v1/chat/completions)",
        True,
    )
    assert (off["api"], off["thinking"]) == ("chat", False)
    assert (raw["api"], raw["template"], raw["thinking"]) == ("generate", "none (raw text to /generate)", None)
    for name in ("math", "chat"):  # the drafter was trained on templated text, thinking on
        assert on["sets"][name]["mean"] > off["sets"][name]["mean"] > raw["sets"][name]["mean"]
        assert raw["sets"][name]["mean"] < 0.75 * on["sets"][name]["mean"]  # raw text: clearly lower
    assert on["sets"]["math"]["mean"] > on["sets"]["chat"]["mean"]
    summary = on["sets"]["math"]
    assert summary["requests"] == 3 and summary["weighted_mean"] is not None
    assert sum(b["count"] for b in summary["histogram"]) == 3 and summary["histogram"][0]["low"] == 1.0
    # a speculating eval's token ids are read by no one (only a reference's are): they are not kept in the state
    assert all(r["output_ids"] is None for r in on["requests"] + raw["requests"])
    assert on["speculation_on"] is True and on["lossless"] is None and on["lossless_failed"] == {}


def lossless_steps(servers: Servers, candidate: str, **params: Any) -> str:
    """A baseline eval on the baseline server and a speculative one on `candidate` comparing with it."""
    common = {"prompt_sets": ["math", "code"], "limit": 4, "max_new_tokens": 24}
    return eval_yaml(base_url=servers.base_url("baseline"), speculative=False, **common).replace(
        "id: eval", "id: eval_baseline"
    ) + eval_yaml(base_url=servers.base_url(candidate), compare_outputs_to="eval_baseline", **common | params)


def test_a_good_drafter_gives_the_baselines_outputs_and_passes_the_lossless_gate(servers: Servers, tmp_path, capsys):
    code, records, _ = run_eval(servers.host, tmp_path, capsys, lossless_steps(servers, "dflash"))
    assert code == 0, records
    baseline = records["eval_baseline"]
    assert baseline["status"] == "passed"  # no acceptance length: its default gates only ask for answered requests
    assert baseline["facts"]["speculative"] is False and baseline["facts"]["speculation_on"] is False
    assert all(len(r["output_ids"]) == 24 for r in baseline["facts"]["requests"])  # the reference keeps its ids
    facts = records["eval"]["facts"]
    assert facts["compared_to"] == "eval_baseline" and facts["speculation_on"] is True
    for name in ("math", "code"):
        assert facts["lossless"][name] == {
            "compared": 4,
            "identical": 4,
            "differing": 0,
            "first_divergence": [],
            "differing_ids": [],
            "max_differing_fraction": 0.1,
            "set_prompts": None,  # every prompt sent: no search's screen
        }
    assert facts["lossless_failed"] == {}


def test_a_broken_drafter_fails_the_lossless_gate_naming_the_set_and_where_outputs_diverge(
    servers: Servers, tmp_path, capsys
) -> None:
    steps = lossless_steps(servers, "broken", retry={"attempts": 1})
    code, records, _ = run_eval(servers.host, tmp_path, capsys, steps)
    assert code != 0
    record = records["eval"]
    assert record["status"] == "failed"
    assert "greedy outputs differ from eval_baseline's beyond the tolerance" in record["message"]
    prompts = EvalAcceptanceStep(id="e", base_url="h", prompt_sets=["math"], limit=4)._sets(None)["math"]
    assert isinstance(prompts, list)
    expected = [simulation.divergence_index(templated(p["text"])) for p in prompts]
    lossless = record["facts"]["lossless"]["math"]
    assert (lossless["compared"], lossless["identical"], lossless["differing"]) == (4, 0, 4)
    assert lossless["first_divergence"] == expected and max(expected) < 10  # early, per prompt
    failed = record["facts"]["lossless_failed"]
    assert set(failed) == {"math", "code"}
    assert failed["math"].startswith("4 of 4 outputs differ from eval_baseline's (prompts math-01, math-02")
    assert f"first divergence at token {expected}" in failed["math"] and "at most 0 (10% of 4) may" in failed["math"]
    assert f"first divergence at token {expected}" in record["message"]  # the gate shows the value it read
    assert record["facts"]["speculation_on"] is True  # it did speculate: only its outputs are wrong


@pytest.mark.parametrize("speculative", [False, True])
def test_a_reference_eval_whose_server_speculated_is_refused_before_sending_anything(
    servers: Servers, tmp_path, capsys, speculative: bool
) -> None:
    """eval_baseline pointed at the DFlash server (by `speculative: false` or not): the lossless check would
    compare DFlash with DFlash and pass whatever the drafter does to the outputs."""
    common = {"prompt_sets": ["math"], "limit": 2, "max_new_tokens": 8}
    reference = eval_yaml(base_url=servers.base_url("broken"), speculative=speculative, **common)
    steps = reference.replace("id: eval", "id: eval_baseline") + eval_yaml(
        base_url=servers.base_url("broken"), compare_outputs_to="eval_baseline", retry={"attempts": 1}, **common
    )
    code, records, events = run_eval(servers.host, tmp_path, capsys, steps)
    assert code != 0 and records["eval_baseline"]["status"] == "passed"
    record = records["eval"]
    assert record["status"] == "failed" and record["facts"] is None
    assert (
        "compare_outputs_to: 'eval_baseline' is no reference without speculative decoding: its server speculated "
        "(spec_verify_ct > 0) on 2 of 2 requests (math math-01, math math-02)"
    ) in record["message"]
    assert not [e for e in events if e["event"] == "progress" and e["step"] == "eval"]


def test_a_baseline_server_given_to_a_speculative_eval_fails_speculation_on(servers: Servers, tmp_path, capsys):
    gates = ["facts.error is none", {"that": "facts.speculation_on", "message": "speculation was off"}]
    steps = eval_yaml(base_url=servers.base_url("baseline"), limit=1, max_new_tokens=8, gates=gates,
                      retry={"attempts": 1})  # fmt: skip
    code, records, _ = run_eval(servers.host, tmp_path, capsys, steps)
    assert code != 0
    record = records["eval"]
    assert "speculation was off" in record["message"] and "facts.speculation_on = false" in record["message"]
    assert record["facts"]["overall"]["answered"] == 3 and record["facts"]["overall"]["without_spec"] == 3


@pytest.mark.parametrize(
    ("params", "differ"),
    [
        ({"max_new_tokens": 16}, "max_new_tokens (24 there, 16 here)"),
        ({"thinking": False}, "thinking (True there, False here)"),
        ({"limit": 3}, "the prompts of the sets ['code', 'math']"),
        (
            {"api": "generate"},
            "api ('chat' there, 'generate' here); template (\"the server's chat template (/v1/chat/completions)\" "
            "there, 'none (raw text to /generate)' here); thinking (True there, None here)",
        ),
    ],
)
def test_an_eval_whose_requests_differ_from_its_reference_is_refused_before_sending_anything(
    servers: Servers, tmp_path, capsys, params: dict[str, Any], differ: str
) -> None:
    steps = lossless_steps(servers, "dflash", retry={"attempts": 1}, **params)
    code, records, events = run_eval(servers.host, tmp_path, capsys, steps)
    assert code != 0
    record = records["eval"]
    assert record["status"] == "failed" and record["facts"] is None
    assert (
        "compare_outputs_to: 'eval_baseline' evaluated other requests than this step would send: " in record["message"]
    )
    assert differ in record["message"] and record["message"].endswith("max_new_tokens on both sides; nothing was sent")
    assert not [e for e in events if e["event"] == "progress" and e["step"] == "eval"]


HOSTILE_NUMBER = st.one_of(
    st.sampled_from([0, -1, 1e308, -1e308, 5e-324, 10**400, -(10**400), 10**12, "x", None, True, [1], {"a": 1}]),
    st.integers(0, 64),
    st.floats(min_value=0, max_value=1e300),
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            name: HOSTILE_NUMBER
            for name in ("seconds", "completion_tokens", "spec_verify_ct", "prompt_tokens", "spec_accept_length")
        },
    )
)
@example({"seconds": 5e-324, "completion_tokens": 8, "spec_verify_ct": 2})  # 8 / 5e-324 tokens/s: infinite
@example({"completion_tokens": 10**400, "spec_verify_ct": 1})  # 10**400 / 1: an OverflowError
@example({"seconds": "x", "completion_tokens": 8})  # float("x"): a ValueError
def test_any_number_in_a_request_gives_facts_of_finite_numbers_or_a_failure_naming_the_field(
    record: dict[str, Any],
) -> None:
    """Counts, seconds and the server's acceptance length that are negative, 1e308, 5e-324, 400 digits, text or
    nested: the facts hold only finite numbers, or the attempt fails (FactsError) naming the field; never an
    OverflowError or a ValueError escaping as "failed unexpectedly"."""
    try:
        facts = parsed(record)
    except FactsError as exc:
        named = {"seconds", "completion_tokens", "verify_ct", "prompt_tokens", "server_accept_length"}
        assert any(name in str(exc) for name in named) or "max_new_tokens 64" in str(exc), str(exc)
        return
    json.dumps(facts.model_dump(), allow_nan=False)  # python mode: mode="json" would write inf as null


def test_a_var_in_base_url_expands_on_the_host_and_an_unset_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `base_url: $url` reached the host program as the text `$url` (urllib: unknown url type)."""
    from hostprograms import kit

    config = {"base_url": "http://$srv", "api": "chat", "flush_attempts": 1, "flush_delay_s": 0}
    config |= {"request_timeout_s": 2, "api_key_var": None, "sets": {}, "metric_families": list(FAMILIES)}
    silent = socket.socket()  # nothing listens here once closed: the flush is refused at once
    silent.bind(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    silent.close()
    monkeypatch.setenv("srv", f"127.0.0.1:{port}")
    document = host.evaluate(dict(config))
    assert document["base_url"] == f"http://127.0.0.1:{port}"
    assert document["flush"]["body"].startswith(f"http://127.0.0.1:{port}/flush_cache:")
    monkeypatch.delenv("srv")
    with pytest.raises(kit.Refused, match="runbook var srv is unset or empty"):
        host.evaluate(dict(config))
    assert "srv" in EvalAcceptanceStep(id="e", base_url="http://$srv").env_names(["srv", "other"])
