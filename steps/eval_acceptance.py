"""`eval_acceptance`: measure the acceptance length of a speculative-decoding server on prompt sets.

Acceptance length is how many tokens one verify step of the target model yields: the accepted
draft tokens plus the bonus token, `completion_tokens / spec_verify_ct` of SGLang's `meta_info`.
It decides how much faster DFlash decodes than the target alone, and it depends on the kind of
text: math runs long, chat short. So the step measures it per prompt set.

The server is the one a `deploy` step started (`server: <step id>`, whose `base_url` fact is the
address on the host) or any address given as `base_url`. hostprograms/eval_acceptance.py runs on
the host (stdlib only): it flushes the cache and checks the answer's body (SGLang may answer 200
and still not flush), retries a refusal a few times, then sends each prompt at temperature 0 with
`max_new_tokens`, one at a time, and reports meta_info and the output's token ids per request.
The step turns that into, per set and overall: requests, the per-request (equal-weight) mean and
the token-weighted mean, median, p10, min, max and a histogram (bins of 0.5 from 1.0), with
tokens and tokens/s. Token-weighted acceptance favours long completions, hence both.

As the model is served (`api`): a drafter is trained on the target's templated outputs, so
acceptance on raw text is not what users get. `api: chat` (the default) posts each prompt as one
user message to `/v1/chat/completions`, so the server applies the model's chat template, with the
thinking setting explicit: `thinking: true` (Kimi-K2.6's default; the published DFlash acceptance
lengths were measured so) or false, sent as `chat_template_kwargs: {thinking_kwarg: ...}` (`thinking`
is what Kimi K2's template and SGLang's kimi_k2 reasoning parser read). `api: generate` sends raw
text to `/generate`; only there may `prompt_template` wrap each prompt (`{prompt}` marks where).
Facts `api`, `template` and `thinking` (None for raw text) say which was used.

Lossless check: speculative decoding must not change greedy output. A step with
`speculative: false` evaluates the baseline server (no acceptance length: its default gates only
require answered requests) and records reference outputs; a speculative step with
`compare_outputs_to: <that step>` compares, per set and prompt id, its output token ids with the
reference's: how many are identical and, for the others, the first token index where they diverge
(`facts.lossless`). Both must send the same prompts with the same api, template, thinking and
max_new_tokens, and the reference's server must not have speculated on any request (a drafter
compared with itself passes however it changes the outputs), else the step is refused before
anything is sent. `lossless_tolerance` is the share of a set's outputs that may differ (default
0.1; of the whole set's prompts where a campaign search's screen sent some of them): exact equality
is too strict on real GPUs, whose kernels are not batch-invariant (a verify step of 8 tokens reduces in
another order than 8 decode steps, and a near-tie between two tokens can flip); that tolerance was not
measured on a GPU here, so measure yours (the baseline against itself) and set it. A drafter whose outputs differ more
fails the default gate `not facts.lossless_failed`, which names the set and divergence indexes.

Proof that speculation was on: `facts.speculation_on` is true when every answered request that
decoded past its first token had `spec_verify_ct > 0` (SGLang's own DFlash sweep fails without it),
and at least one did; a default gate of a speculative step. A one-token answer comes from prefill
alone, with no verify step even when speculation is on, so it proves nothing either way. A server
without speculative decoding answers with no `spec_*` fields: the set's acceptance length is then
None with an `unknown_reason`, and the default gates fail. It never reads as 0 or 1.

Prompt sets: `prompt_sets: [math, code, chat]` names sets shipped in steps/prompt_sets/;
`prompt_sets: {name: FILE}` reads a JSONL file, relative to the runbook's folder. One JSON object a
line: `{"prompt": "..."}` or `{"text": "..."}`, with an optional `"id"` (string or integer); blank
lines are skipped, anything else is an error naming the line. The prompts travel inside the
script, so `runbook plan` shows every one that will be sent (a runbook's own file is read when the
step runs).

Gate example (a runbook's own gates replace the defaults, so keep those it needs):

    gates:
      - that: facts.error is none
      - that: not facts.sets_without_results
      - that: facts.speculation_on
      - that: not facts.lossless_failed
      - that: facts.sets.math.mean >= 3.0
        message: DFlash accepts fewer than 3 tokens per step on math
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from executor.errors import AttemptFailed, StepFailed
from executor.files import json_data, open_regular
from executor.hostprogram import host_program
from executor.runbook.durations import Delay, Duration
from executor.runbook.model import DataModel, Gate, Model
from executor.stepkind import (
    FactsError,
    Outcome,
    ProgressLines,
    RenderContext,
    StepContext,
    StepRef,
    StepSpec,
    fact_field,
    host_document,
)
from steps.benchmark_results import MEASURED_MAX, Measured, unusable
from steps.server_metrics import FAMILIES, RunAcceptance, Scrape, run_acceptance

if TYPE_CHECKING:
    from executor.transport.base import CommandResult, OutputSink

SHIPPED = resources.files("steps") / "prompt_sets"
SET_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # usable in a gate as facts.sets.<name>
ERRORS_KEPT = 5  # request errors listed per set
BIN_WIDTH = 0.5  # of the acceptance-length histogram
CHAT_TEMPLATE = "the server's chat template (/v1/chat/completions)"
RAW_TEXT = "none (raw text to /generate)"


def shipped_sets() -> list[str]:
    """Names of the prompt sets that ship with the project (steps/prompt_sets/NAME.jsonl)."""
    return sorted(item.name.removesuffix(".jsonl") for item in SHIPPED.iterdir() if item.name.endswith(".jsonl"))


class Prompt(Model):
    id: str
    text: str


def parse_prompt_lines(text: str, source: str) -> list[Prompt]:
    """The prompts of a JSONL text; a line that is not `{"prompt"|"text": str, "id"?: str|int}` is an error
    naming `source` and the line."""
    prompts: list[Prompt] = []
    seen: set[str] = set()
    # lines end at \n only: str.splitlines would also split at U+0085 or U+2028 inside a JSON string
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            item = json_data(line)
        except ValueError as exc:
            raise ValueError(
                f"{where}: not JSON ({exc.msg if isinstance(exc, json.JSONDecodeError) else exc})"
            ) from None
        if not isinstance(item, dict):
            raise ValueError(f'{where}: expected an object like {{"prompt": "..."}}, got {type(item).__name__}')
        keys = [key for key in ("prompt", "text") if key in item]
        unknown = sorted(set(item) - {"prompt", "text", "id"})
        if len(keys) != 1 or unknown:
            raise ValueError(f"{where}: needs exactly one of \"prompt\" or \"text\" (and optionally \"id\"), "
                             f"got keys {sorted(item)}")  # fmt: skip
        prompt = item[keys[0]]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f'{where}: "{keys[0]}" must be a non-empty string')
        ident = item.get("id", len(prompts) + 1)
        if isinstance(ident, bool) or not isinstance(ident, str | int):
            raise ValueError(f'{where}: "id" must be a string or an integer')
        if str(ident) in seen:
            raise ValueError(f"{where}: id {str(ident)!r} appears twice")
        seen.add(str(ident))
        prompts.append(Prompt(id=str(ident), text=prompt))
    if not prompts:
        raise ValueError(f"{source}: no prompts")
    return prompts


# ---------------------------------------------------------------------------------------- statistics


class HistogramBin(Model):
    """Requests whose acceptance length is in [low, high)."""

    low: float
    high: float
    count: int


def histogram(values: Iterable[float]) -> list[HistogramBin]:
    """Bins of BIN_WIDTH from 1.0 (lower where a value is below it) up to the bin holding the largest
    value, empty bins included, so that a plot of them has no gaps. No values: no bins."""
    values = list(values)
    if not values:
        return []
    start = min(1.0, math.floor(min(values) / BIN_WIDTH) * BIN_WIDTH)
    counts = [0] * (math.floor((max(values) - start) / BIN_WIDTH) + 1)
    for value in values:
        counts[math.floor((value - start) / BIN_WIDTH)] += 1
    return [
        HistogramBin(low=start + i * BIN_WIDTH, high=start + (i + 1) * BIN_WIDTH, count=count)
        for i, count in enumerate(counts)
    ]


class Summary(Model):
    """Acceptance length over a group of requests: None everywhere, with the reason, when unknown."""

    requests: int  # requests sent
    answered: int  # answered with meta_info
    measured: int  # answered with speculative decoding fields (the statistics are over these)
    without_spec: int  # answered, but with no spec_verify_ct: not counted
    failed: int  # error status or unusable answer
    mean: float | None  # per request: each request counts once, however long its output
    median: float | None
    p10: float | None
    min: float | None
    max: float | None
    weighted_mean: float | None  # completion_tokens / verify_ct over the measured requests (token-weighted)
    histogram: list[HistogramBin]  # of the measured requests' acceptance lengths
    prompt_tokens: int
    completion_tokens: int  # over the answered requests
    verify_ct: int  # over the measured requests
    seconds: float  # wall time of the answered requests, one at a time
    tokens_per_s: float | None
    unknown_reason: str | None
    errors: list[str] = Field(default_factory=list)  # the first few request errors


#: A count or a token id as the server must send it: a JSON integer, never `true`, `"64"` or `64.0` (which
#: pydantic would take for one), never negative (a negative count makes a negative acceptance length), below
#: MEASURED_MAX (10**400 / 1 would overflow a float).
Count = Annotated[int, Field(strict=True, ge=0, lt=MEASURED_MAX)]


class RequestFacts(Model):
    """One request as the host program reported it; a number out of its bounds is a ValidationError naming it."""

    set: str
    id: str
    seconds: Measured
    prompt_tokens: Count | None
    completion_tokens: Count | None
    verify_ct: Count | None
    accept_length: float | None  # completion_tokens / verify_ct; None without speculative decoding
    server_accept_length: Measured | None  # meta_info.spec_accept_length as the server reported it
    finish_reason: str | None
    error: str | None
    output_ids: list[Count] | None  # the greedy output's token ids, kept by a reference eval (speculative: false)


def request_facts(set_name: str, raw: dict[str, Any]) -> RequestFacts:
    """One request as the host program reported it, with its acceptance length: validated first (a ValidationError
    naming the field), so that the division is of two counts below MEASURED_MAX."""
    request = RequestFacts.model_validate(
        {
            "set": set_name,
            "id": str(raw.get("id")),
            "seconds": raw.get("seconds") or 0.0,
            "prompt_tokens": raw.get("prompt_tokens"),
            "completion_tokens": raw.get("completion_tokens"),
            "verify_ct": raw.get("spec_verify_ct"),
            "accept_length": None,
            "server_accept_length": raw.get("spec_accept_length"),
            "finish_reason": raw.get("finish_reason"),
            "error": raw.get("error"),
            "output_ids": raw.get("output_ids"),
        }
    )
    completion, verify = request.completion_tokens, request.verify_ct
    if completion is None or not verify:
        return request
    return request.model_copy(update={"accept_length": completion / verify})


def summarize(requests: Iterable[RequestFacts], expected: int) -> Summary:
    """Statistics of acceptance length over `requests`; `expected` prompts were meant to be sent."""
    done = list(requests)
    failed = [r for r in done if r.error is not None]
    answered = [r for r in done if r.error is None]
    measured = [r for r in answered if r.accept_length is not None]
    values = sorted(r.accept_length for r in measured if r.accept_length is not None)
    completion = sum(r.completion_tokens or 0 for r in answered)
    verify = sum(r.verify_ct or 0 for r in measured)
    seconds = sum(r.seconds for r in answered)
    rate = completion / seconds if seconds > 0 and completion else None  # 8 tokens in 5e-324 s: infinite, unusable
    unknown = None
    if not done:
        unknown = f"no request was sent ({expected} planned): the evaluation stopped before this set"
    elif not answered:
        unknown = f"every request failed; the first: {failed[0].error}"
    elif not measured:
        unknown = (
            "the server's answers carry no speculative decoding fields (meta_info.spec_verify_ct): "
            "it runs without speculative decoding"
        )
    stats: dict[str, float | None] = dict.fromkeys(("mean", "median", "p10", "min", "max", "weighted_mean"))
    if values:
        low, high = values[0], values[-1]
        stats = {
            "mean": min(max(statistics.fmean(values), low), high),  # never outside by a rounding error
            "median": statistics.median(values),
            # linear between neighbours, numpy's default; one value is its own p10
            "p10": statistics.quantiles(values, n=10, method="inclusive")[0] if len(values) > 1 else low,
            "min": low,
            "max": high,
            "weighted_mean": sum(r.completion_tokens or 0 for r in measured) / verify if verify else None,
        }
    return Summary(
        requests=len(done),
        answered=len(answered),
        measured=len(measured),
        without_spec=len(answered) - len(measured),
        failed=len(failed),
        **{name: None if value is None else round(value, 4) for name, value in stats.items()},
        histogram=histogram(values),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in answered),
        completion_tokens=completion,
        verify_ct=verify,
        seconds=round(seconds, 3),
        tokens_per_s=round(rate, 2) if rate is not None and unusable(rate) is None else None,
        unknown_reason=unknown,
        errors=[f"{r.id}: {r.error}" for r in failed[:ERRORS_KEPT]],
    )


# ---------------------------------------------------------------------------------------------- facts


class FlushFacts(Model):
    flushed: bool
    attempts: int
    status: int | None  # HTTP status of the last answer; None when the server did not answer
    body: str | None  # its body (clipped), or why there was no answer


class LosslessSet(Model):
    """One set's outputs against the reference step's, prompt by prompt (by id)."""

    compared: int  # prompts answered with token ids on both sides
    identical: int
    differing: int
    first_divergence: list[int]  # per differing output (in prompt order): the first token index that differs
    differing_ids: list[str]  # their prompt ids, in the same order
    max_differing_fraction: float  # the tolerance: the share of `compared` (or of `set_prompts`) that may differ
    #: the set's prompts, where a search's screen compared only some (the tolerance's share is of the whole set: a
    #: screen fails no configuration the whole set's check would pass); None: the share is of `compared`
    set_prompts: int | None = None


def first_divergence(reference: list[int], output: list[int]) -> int | None:
    """The first token index where two outputs differ (a shorter one differs where it ends); None if equal."""
    for index, (a, b) in enumerate(zip(reference, output, strict=False)):
        if a != b:
            return index
    return None if len(reference) == len(output) else min(len(reference), len(output))


def compare_outputs(
    reference: Iterable[RequestFacts],
    requests: Iterable[RequestFacts],
    sets: Iterable[str],
    tolerance: float,
    screened_from: Mapping[str, int] | None = None,
) -> dict[str, LosslessSet]:
    """Per set, the outputs of `requests` against the reference's outputs of the same prompt ids; `screened_from`:
    the sets a screen cut -> their prompts."""
    known = {(r.set, r.id): r.output_ids for r in reference if r.error is None and r.output_ids is not None}
    compared: dict[str, list[tuple[str, int | None]]] = {name: [] for name in sets}
    for request in requests:
        ids = known.get((request.set, request.id))
        if ids is not None and request.error is None and request.output_ids is not None:
            compared[request.set].append((request.id, first_divergence(ids, request.output_ids)))
    lossless = {}
    for name, pairs in compared.items():
        differing = [(ident, index) for ident, index in pairs if index is not None]
        lossless[name] = LosslessSet(
            compared=len(pairs),
            identical=len(pairs) - len(differing),
            differing=len(differing),
            first_divergence=[index for _, index in differing],
            differing_ids=[ident for ident, _ in differing],
            max_differing_fraction=tolerance,
            set_prompts=(screened_from or {}).get(name),
        )
    return lossless


def lossless_failures(lossless: dict[str, LosslessSet], reference: str) -> dict[str, str]:
    """Set name -> why it fails the lossless check: nothing compared, or more outputs differ than allowed."""
    failed = {}
    for name, result in lossless.items():
        share_of = result.set_prompts or result.compared
        allowed = math.floor(result.max_differing_fraction * share_of + 1e-9)
        if result.compared == 0:
            failed[name] = f"no output could be compared with {reference}'s (no prompt answered with token ids on both)"
        elif result.differing > allowed:
            failed[name] = (
                f"{result.differing} of {result.compared} outputs differ from {reference}'s (prompts "
                f"{', '.join(result.differing_ids)}; first divergence at token {result.first_divergence}); "
                f"at most {allowed} ({result.max_differing_fraction:.0%} of {share_of}"
                f"{' prompts, the whole set: a screen sent some' if result.set_prompts else ''}) may"
            )
    return failed


class EvalAcceptanceFacts(Model):
    base_url: str
    api: Literal["chat", "generate"]
    template: str  # what was applied to each prompt: the server's chat template, none, or the prompt_template
    thinking: bool | None  # the chat template's thinking setting; None for raw text
    speculative: bool  # false: a baseline evaluation, the reference of a lossless check
    max_new_tokens: int
    #: per set, of its prompts as sent (ids and texts; of every prompt where a search's screen sent some: the
    #: reference's, `screened_from`): what a comparison checks
    prompts_sha256: dict[str, str]
    flush: FlushFacts
    error: str | None  # why the evaluation stopped early (cache not flushed, server gone)
    sets: dict[str, Summary]
    overall: Summary
    sets_without_results: dict[str, str]  # set name -> why it has no acceptance length
    failed_requests: int
    speculation_on: bool  # every answered request past one token (at least one) had spec_verify_ct > 0
    compared_to: str | None  # the step whose outputs were the reference (compare_outputs_to)
    lossless: dict[str, LosslessSet] | None  # None without compare_outputs_to
    lossless_failed: dict[str, str]  # set name -> why it fails the lossless check
    requests: list[RequestFacts]
    # the per-request records (steps/request_records.py), relative to the run folder; None: none were written
    requests_file: str | None = None
    #: set -> its prompts, where a campaign search's screen sent only `screen_prompts` of them, the first the
    #: reference answered (None: every prompt was sent); the lossless check compares those with the reference's
    screened_from: dict[str, int] | None = None
    #: exact acceptance from the server's /metrics counters around the run, beside the running average and the
    #: per-request mean (steps/server_metrics.py); None in facts from before it was recorded
    acceptance: RunAcceptance | None = None


class HostDocument(Model):
    """What hostprograms/eval_acceptance.py prints."""

    base_url: str
    error: str | None
    flush: FlushFacts
    planned: dict[str, int]  # prompts of each set, in the order sent
    sets: dict[str, list[dict[str, Any]]]  # per set, one record per request answered or failed
    metrics_before: Scrape | None = None  # /metrics before the flush
    metrics_after: Scrape | None = None  # and after the last prompt (absent when the run stopped early)
    running_average: Measured | None = None  # /server_info's avg_spec_accept_length after the last prompt


class Setup(DataModel):
    """What must match between an evaluation and the one whose outputs it compares with; read from
    the reference step's facts (its other facts are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    api: str
    template: str
    thinking: bool | None
    max_new_tokens: int
    prompts_sha256: dict[str, str]


class Reference(Setup):
    """The reference step's facts that a lossless check reads."""

    step: str
    requests: list[RequestFacts]


def too_long(requests: Iterable[RequestFacts], max_new_tokens: int) -> None:
    """FactsError when an answer has more tokens than were asked: SGLang caps an output at max_new_tokens
    (schedule_batch.py), so the server is broken, and its count would make an acceptance length (and a
    histogram of that many bins, built before any gate reads it) of nothing real."""
    for r in requests:
        found = [f"completion_tokens {r.completion_tokens}"] if (r.completion_tokens or 0) > max_new_tokens else []
        if r.output_ids is not None and len(r.output_ids) > max_new_tokens:
            found.append(f"{len(r.output_ids)} output token ids")
        if found:
            raise FactsError(
                f"the server answered {r.set} {r.id}: {' and '.join(found)} for max_new_tokens {max_new_tokens}"
            )


def speculated(answered: list[RequestFacts]) -> bool:
    """Whether the answers prove speculation on: every one that decoded past its first token (prefill gives
    that one, with no verify step) had verify steps, and at least one did."""
    decoded = [r for r in answered if (r.completion_tokens or 0) > 1]
    return bool(decoded) and all((r.verify_ct or 0) > 0 for r in decoded)


def facts_from(
    document: HostDocument,
    step: EvalAcceptanceStep,
    setup: Setup,
    reference: Reference | None = None,
    screened_from: dict[str, int] | None = None,
) -> EvalAcceptanceFacts:
    """Per-set and overall statistics from the host program's per-request records, and the lossless
    check against `reference`'s outputs when there is one; `screened_from`: the sets a search's screen cut -> their
    prompts."""
    requests = [request_facts(name, raw) for name in document.planned for raw in document.sets.get(name, [])]
    too_long(requests, setup.max_new_tokens)
    sets = {
        name: summarize((r for r in requests if r.set == name), planned) for name, planned in document.planned.items()
    }
    answered = [r for r in requests if r.error is None]
    overall = summarize(requests, sum(document.planned.values()))
    lossless, lossless_failed = None, {}
    if reference is not None:
        lossless = compare_outputs(
            reference.requests, requests, document.planned, step.lossless_tolerance, screened_from
        )
        lossless_failed = lossless_failures(lossless, reference.step)
    return EvalAcceptanceFacts(
        base_url=document.base_url,
        api=step.api,
        template=setup.template,
        thinking=setup.thinking,
        speculative=step.speculative,
        max_new_tokens=setup.max_new_tokens,
        prompts_sha256=setup.prompts_sha256,
        flush=document.flush,
        error=document.error,
        sets=sets,
        overall=overall,
        sets_without_results={name: s.unknown_reason for name, s in sets.items() if s.unknown_reason},
        failed_requests=sum(s.failed for s in sets.values()),
        speculation_on=speculated(answered),
        compared_to=None if reference is None else reference.step,
        screened_from=screened_from or None,
        lossless=lossless,
        lossless_failed=lossless_failed,
        # only a reference's token ids are read again (a speculating eval is never one): the others would only
        # grow the state, by up to max_new_tokens ids a request
        requests=requests if not step.speculative else [r.model_copy(update={"output_ids": None}) for r in requests],
        acceptance=run_acceptance(
            document.metrics_before,
            document.metrics_after,
            document.running_average,
            overall.weighted_mean,
            overall.mean,
        ),
    )


def progress_sink(ctx: StepContext) -> OutputSink:
    """One ctx.progress call per `runbook-progress {json}` line of the host program (one per prompt)."""
    measured: dict[str, list[float]] = {}

    def show(fields: dict[str, Any]) -> None:  # a line it cannot show (ValidationError, KeyError) is skipped
        request = request_facts(fields["set"], fields)
        head = f"{request.set} {fields['done']}/{fields['total']}"
        if request.error is not None:
            ctx.progress(f"{head}: failed: {request.error}", **fields)
            return
        values = measured.setdefault(request.set, [])
        if request.accept_length is not None:
            values.append(request.accept_length)
        accept = (
            f"accept length {request.accept_length:.2f} (mean {math.fsum(values) / len(values):.2f})"
            if request.accept_length is not None
            else "no speculative decoding fields"
        )
        speed = (
            f", {request.completion_tokens / request.seconds:.1f} tok/s"
            if request.seconds and request.completion_tokens
            else ""
        )
        ctx.progress(f"{head}: {accept}, {request.completion_tokens} tokens{speed}", **fields)

    return ProgressLines(show).feed


# ----------------------------------------------------------------------------------------------- step


class EvalAcceptanceStep(StepSpec):
    kind: Literal["eval_acceptance"] = "eval_acceptance"
    #: a template the host program fills, files the controller reads: text, never through a shell
    literal_fields: ClassVar[frozenset[str]] = frozenset({"prompt_template", "prompt_sets"})
    server: StepRef | None = None  # id of the deploy step whose `base_url` fact names the server
    base_url: str | None = None  # or the server's address as seen from the host; `$vars` expand there
    python: str = "python3"  # any python3 on the host (the program is stdlib only)
    #: shipped sets by name (steps/prompt_sets/), or `{name: FILE}`: JSONL files relative to the runbook's folder
    prompt_sets: list[str] | dict[str, str] = Field(default_factory=lambda: ["math", "code", "chat"])
    max_new_tokens: int = Field(default=256, ge=1)  # tokens asked of each answer
    limit: int | None = Field(default=None, ge=1)  # first N prompts of each set
    #: in a configuration a campaign's search launched (`RenderContext.screened`): N prompts of each set, the first
    #: the reference answered
    screen_prompts: int = Field(default=4, ge=1)
    api: Literal["chat", "generate"] = "chat"  # the server applies the chat template, or raw text to /generate
    thinking: bool = True  # the chat template's thinking setting (chat only)
    thinking_kwarg: str = Field(default="thinking", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # its chat_template_kwargs key
    prompt_template: str = "{prompt}"  # generate only: wraps each prompt
    speculative: bool = True  # false: the baseline server, whose outputs a speculative eval compares with
    compare_outputs_to: StepRef | None = None  # id of the `speculative: false` eval_acceptance step
    lossless_tolerance: float = Field(default=0.1, ge=0, le=1)  # share of a set's outputs that may differ
    request_timeout: Duration = 300.0  # per request, its whole answer (a bound: at most 30 days, as any)
    flush_attempts: int = Field(default=5, ge=1)  # tries to flush the server's cache before the prompts
    flush_retry_delay: Delay = 1.0  # between flush attempts (a pause: 0 too, at most 30 days)
    api_key_var: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # a runbook secret's name

    def env_names(self, available: Iterable[str]) -> list[str]:
        """Besides the `$vars` of its parameters, the secret holding the server's API key, if any."""
        available = list(available)
        names = super().env_names(available)
        key = self.api_key_var
        return [*names, key] if key is not None and key in available and key not in names else names

    @model_validator(mode="after")
    def _one_server(self) -> EvalAcceptanceStep:
        if (self.server is None) == (self.base_url is None):
            raise ValueError("give exactly one of `server` (a deploy step id) or `base_url`")
        return self

    @model_validator(mode="after")
    def _api_parameters(self) -> EvalAcceptanceStep:
        if self.api == "chat" and self.prompt_template != "{prompt}":
            raise ValueError(
                "prompt_template applies to `api: generate` only: with `api: chat` the server applies "
                "the model's chat template"
            )
        given = sorted({"thinking", "thinking_kwarg"} & self.model_fields_set)
        if self.api == "generate" and given:
            raise ValueError(f"{' and '.join(given)}: a chat template setting; `api: generate` sends raw text")
        if self.compare_outputs_to is not None and not self.speculative:
            raise ValueError(
                "compare_outputs_to: a `speculative: false` step is the reference that a speculative one compares with"
            )
        return self

    @field_validator("prompt_sets")
    @classmethod
    def _known_sets(cls, value: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
        names = list(value)
        if not names:
            raise ValueError("name at least one prompt set")
        for name in names:
            if not re.fullmatch(SET_NAME, name):  # whole: `$` also matches before a trailing newline
                raise ValueError(
                    f"prompt set name {name!r}: letters, digits and _ only (it is used as facts.sets.NAME)"
                )
        if isinstance(value, list):
            unknown = sorted(set(value) - set(shipped_sets()))
            if unknown:
                raise ValueError(f"unknown prompt sets {unknown}: shipped are {shipped_sets()}; "
                                 "give {name: path-to-jsonl} for your own")  # fmt: skip
            if len(set(value)) != len(value):
                raise ValueError("a prompt set is named twice")
        return value

    @field_validator("prompt_template")
    @classmethod
    def _template_has_prompt(cls, value: str) -> str:
        if "{prompt}" not in value:
            raise ValueError("prompt_template must contain {prompt}, where each prompt goes")
        return value

    def local_files(self) -> list[str]:
        return [] if isinstance(self.prompt_sets, list) else list(self.prompt_sets.values())

    # ---- prompts ------------------------------------------------------------------------------------

    def _sets(self, base_dir: Path | None) -> dict[str, list[dict[str, str]] | str]:
        """The prompts of each set as sent (limit and template applied); a runbook's own file is a
        placeholder when there is no runbook folder to read it from (`runbook plan`)."""
        sources: dict[str, tuple[Path | None, str]] = (
            {name: (None, name) for name in self.prompt_sets}
            if isinstance(self.prompt_sets, list)
            else {name: (Path(path).expanduser(), path) for name, path in self.prompt_sets.items()}
        )
        sets: dict[str, list[dict[str, str]] | str] = {}
        for name, (path, shown) in sources.items():
            if path is None:
                text, source = (SHIPPED / f"{name}.jsonl").read_text(encoding="utf-8"), f"shipped set {name!r}"
            elif base_dir is None:
                sets[name] = f"<read at run time from {shown}, relative to the runbook's folder>"
                continue
            else:
                source = str(base_dir / path)
                try:
                    with open_regular(base_dir / path) as handle:  # a FIFO or a device: refused at once
                        text = handle.read().decode("utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise FactsError(f"prompt set {name!r}: cannot read {source}: {exc}") from None
            try:
                prompts = parse_prompt_lines(text, source)
            except ValueError as exc:
                raise FactsError(f"prompt set {name!r}: {exc}") from None
            chosen = prompts[: self.limit] if self.limit else prompts
            sets[name] = [{"id": p.id, "text": self.prompt_template.replace("{prompt}", p.text)} for p in chosen]
        return sets

    # ---- script -------------------------------------------------------------------------------------

    def _base_url(self, ctx: RenderContext) -> str:
        return self.base_url if self.base_url is not None else str(ctx.fact(str(self.server), "base_url"))

    def render(self, ctx: RenderContext) -> str:
        sets = self._sets(ctx.base_dir if isinstance(ctx, StepContext) else None)
        return self._script(ctx, self.screened(sets)[0] if ctx.screened() else sets)

    def _script(self, ctx: RenderContext, sets: dict[str, list[dict[str, str]] | str]) -> str:
        config = {
            "base_url": self._base_url(ctx),
            "api": self.api,
            "thinking": self.thinking,
            "thinking_kwarg": self.thinking_kwarg,
            "max_new_tokens": self.max_new_tokens,
            "request_timeout_s": self.request_timeout,
            "flush_attempts": self.flush_attempts,
            "flush_delay_s": self.flush_retry_delay,
            "api_key_var": self.api_key_var,
            "metric_families": list(FAMILIES),
            "sets": sets,
        }
        counts = ", ".join(f"{name} ({len(p) if isinstance(p, list) else '?'})" for name, p in sets.items())
        how = (
            f"/v1/chat/completions (thinking {'on' if self.thinking else 'off'})" if self.api == "chat" else "/generate"
        )
        what = "acceptance length" if self.speculative else "reference outputs (no speculative decoding)"
        return (
            f"# {what}: flush the cache of {config['base_url']}, then greedy {how} of the prompt "
            f"sets {counts}\n" + host_program("eval_acceptance", config, self.python)
        )

    def summary(self, ctx: RenderContext) -> list[str]:
        said = super().summary(ctx)
        if self.compare_outputs_to:
            said.append(
                f"then its greedy outputs against {self.compare_outputs_to}'s, per set and prompt (lossless: at most "
                f"{self.lossless_tolerance:.0%} of a set's outputs may differ)"
            )
        return said

    # ---- what a comparison needs ----------------------------------------------------------------------

    def setup(self, sets: dict[str, list[dict[str, str]] | str]) -> Setup:
        """What this evaluation sends, as a lossless comparison checks it."""
        template = CHAT_TEMPLATE if self.api == "chat" else RAW_TEXT
        if self.api == "generate" and self.prompt_template != "{prompt}":
            template = self.prompt_template
        digests = {
            name: hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()
            for name, prompts in sets.items()
            if isinstance(prompts, list)
        }
        return Setup(
            api=self.api,
            template=template,
            thinking=self.thinking if self.api == "chat" else None,
            max_new_tokens=self.max_new_tokens,
            prompts_sha256=digests,
        )

    def _reference(self, ctx: StepContext, setup: Setup) -> Reference:
        """The reference step's outputs; refused (FactsError) unless it sent what this step will send."""
        step = str(self.compare_outputs_to)
        fields: dict[str, Any] = {"step": step}
        for name in Reference.model_fields.keys() - {"step"}:
            try:
                fields[name] = ctx.fact(step, name)
            except (KeyError, IndexError, TypeError):
                raise FactsError(
                    f"compare_outputs_to: step {step!r} has no facts.{name}: name an eval_acceptance step that ran"
                ) from None
        try:
            reference = Reference.model_validate(fields)
        except ValidationError as exc:
            raise FactsError(f"compare_outputs_to: the facts of step {step!r} are not an evaluation's: {exc}") from None
        differ = [
            f"{name} ({getattr(reference, name)!r} there, {getattr(setup, name)!r} here)"
            for name in ("api", "template", "thinking", "max_new_tokens")
            if getattr(reference, name) != getattr(setup, name)
        ]
        if reference.prompts_sha256 != setup.prompts_sha256:
            mine, theirs = setup.prompts_sha256, reference.prompts_sha256
            changed = sorted(n for n in mine.keys() | theirs.keys() if mine.get(n) != theirs.get(n))
            differ.append(f"the prompts of the sets {changed} (names, ids, texts, limit)")
        if differ:
            raise FactsError(
                f"compare_outputs_to: {step!r} evaluated other requests than this step would send: "
                f"{'; '.join(differ)}. A lossless check needs the same prompts, api, template, thinking and "
                "max_new_tokens on both sides; nothing was sent"
            )
        speculated = [f"{r.set} {r.id}" for r in reference.requests if (r.verify_ct or 0) > 0]
        if speculated:
            # a drafter compared with itself (or another) is identical however wrong it is: no proof at all
            raise FactsError(
                f"compare_outputs_to: {step!r} is no reference without speculative decoding: its server "
                f"speculated (spec_verify_ct > 0) on {len(speculated)} of {len(reference.requests)} requests "
                f"({', '.join(speculated[:3])}{', ...' if len(speculated) > 3 else ''}). Point that step at the "
                "baseline deployment; nothing was sent"
            )
        return reference

    # ---- facts --------------------------------------------------------------------------------------

    def parse_facts(
        self,
        result: CommandResult,
        setup: Setup | None = None,
        reference: Reference | None = None,
        screened_from: dict[str, int] | None = None,
    ) -> EvalAcceptanceFacts:
        document = host_document(result, HostDocument, "the acceptance evaluation")
        try:
            return facts_from(document, self, setup or self.setup({}), reference, screened_from)
        except ValidationError as exc:  # a meta_info field of an unexpected type
            raise FactsError(f"the server's meta_info has fields of unexpected types: {exc}") from None

    def failure_class(self, facts: Any) -> type[AttemptFailed] | None:
        """StepFailed when the evaluation stopped early (`error`: a flush refused, the server gone) or requests
        failed (`failed_requests`: an HTTP 503 of a busy server, an answer cut short), which another attempt may
        not meet; otherwise a false gate on its numbers (acceptance, speculation, lossless) is a definite
        GateFalse."""
        failed = fact_field(facts, "failed_requests")
        stopped = fact_field(facts, "error") is not None
        return StepFailed if stopped or (isinstance(failed, int) and failed > 0) else None

    def default_gates(self) -> list[Gate]:
        gates = [
            Gate(that="facts.error is none", message="the acceptance evaluation stopped early"),
            Gate(that="exit_code == 0", message="the acceptance evaluation did not run to its end"),
        ]
        if self.speculative:
            gates.append(
                Gate(
                    that="not facts.sets_without_results",
                    message="prompt sets without an acceptance length (the reason is given per set)",
                )
            )
        gates.append(Gate(that="facts.failed_requests == 0", message="requests failed (see facts.sets.*.errors)"))
        if self.speculative:
            gates.append(
                Gate(
                    that="facts.speculation_on",
                    message="not every answered request had spec_verify_ct > 0: speculative decoding was not on "
                    "for all of them (facts.sets.*.without_spec)",
                )
            )
        if self.compare_outputs_to is not None:
            gates.append(
                Gate(
                    that="not facts.lossless_failed",
                    message=f"greedy outputs differ from {self.compare_outputs_to}'s beyond the tolerance",
                )
            )
        return gates

    async def execute(self, ctx: StepContext) -> Outcome:
        sets = self._sets(ctx.base_dir)
        setup = self.setup(sets)  # of every prompt: a screen's are among the reference's
        reference = self._reference(ctx, setup) if self.compare_outputs_to is not None else None
        answered = None if reference is None else {(r.set, r.id) for r in reference.requests if r.output_ids}
        sent, cut = self.screened(sets, answered) if ctx.screened() else (sets, {})
        if cut:
            ctx.progress(f"a search's screen: {self.screen_prompts} prompts of each set")
        result = await ctx.run(self._script(ctx, sent), on_output=progress_sink(ctx))
        if result.timed_out or result.interrupted:
            return Outcome(result)
        return Outcome(result, self.keep_records(ctx, self.parse_facts(result, setup, reference, cut)))

    def screened(
        self, sets: dict[str, list[dict[str, str]] | str], answered: set[tuple[str, str]] | None = None
    ) -> tuple[dict[str, list[dict[str, str]] | str], dict[str, int]]:
        """A search's screen of the evaluation (it ranks nothing: the benchmark does): `screen_prompts` of each set,
        the first of those the reference `answered` with token ids ((set, id); all when None: `plan` shows the
        first), so that each is compared; and each set cut -> its prompts. The winner's whole evaluation runs where
        it is deployed (`runbook run runbooks/k26_dflash.yaml --from-campaign RUN`)."""
        cut = {name: len(p) for name, p in sets.items() if isinstance(p, list) and len(p) > self.screen_prompts}
        sent = dict(sets)
        for name in cut:
            prompts = sets[name]
            assert isinstance(prompts, list)
            order = sorted((answered is not None and (name, p["id"]) not in answered, i) for i, p in enumerate(prompts))
            sent[name] = [prompts[i] for _, i in order[: self.screen_prompts]]  # the answered first, each in order
        return sent, cut

    def keep_records(self, ctx: StepContext, facts: EvalAcceptanceFacts) -> EvalAcceptanceFacts:
        """Each request's meta_info (as its facts hold it) written as JSONL to the run folder, and where."""
        from steps.request_records import RecordsFile, eval_records

        records = RecordsFile(ctx.output_dir, self.id, ctx.redactor)
        records.append(eval_records({"run": ctx.run_dir.name, "host": ctx.host_name, "step": self.id}, facts.requests))
        return facts.model_copy(update={"requests_file": records.relative_to(ctx.run_dir)})
