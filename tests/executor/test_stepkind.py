"""The step kinds' shared reader of host programs' `runbook-progress {json}` lines (executor/stepkind.py):
lines survive any cutting of the stream, other streams and other lines are ignored, a garbled line is skipped,
an endless line is not kept whole; and the prefix the controller reads is the one the host programs' kit prints."""

from __future__ import annotations

import functools
import io
import itertools
import json
import types
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from executor.hostprogram import PACKAGE
from executor.redact import Redactor
from executor.run.attempts import HostContext
from executor.run.emitter import Emitter, EventStream
from executor.run.event_models import Progress
from executor.run.events import JsonReporter, RedactingReporter, Reporter
from executor.stepkind import (
    FACTS_MAX_DEPTH,
    PROGRESS_LINE_MAX,
    PROGRESS_PREFIX,
    FactsError,
    ProgressLines,
    host_document,
    progress_messages,
)
from executor.transport.base import Collector, CommandResult
from hostprograms import kit

STDERR = (
    b'runbook-progress {"message": "started the server: pid 7", "phase": "started", "pid": 7}\n'
    b'a line of the server\'s own, mentioning runbook-progress {"message": "not at the start"}\n'
    b'runbook-progress {"message": "ready after 1.5s", "ready_s": 1.5}\n'
    b"runbook-progress not json\n"
    b'runbook-progress {"message": "cut short"\n'
    b'runbook-progress ["not", "an", "object"]\n'
    b'runbook-progress {"phase": "no message"}\n'
    b'runbook-progress {"message": "\xc3\xa9t\xc3\xa9 (utf-8)", "n": 3}\n'
    b"\n"
    b"the last line has no newline yet: runbook-progress "
)
SHOWN = [
    ("started the server: pid 7", {"phase": "started", "pid": 7}),
    ("ready after 1.5s", {"ready_s": 1.5}),
    ("\u00e9t\u00e9 (utf-8)", {"n": 3}),
]


class Collect:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def progress(self, message: str, /, **fields: Any) -> None:
        self.calls.append((message, fields))


@given(st.lists(st.integers(min_value=0, max_value=len(STDERR)), max_size=20), st.booleans())
def test_progress_lines_survive_any_chunking(cuts: list[int], stdout_between: bool) -> None:
    ctx = Collect()
    reader = progress_messages(ctx)
    for start, end in itertools.pairwise([0, *sorted(cuts), len(STDERR)]):
        reader.feed("stderr", STDERR[start:end])
        if stdout_between:  # stdout carries the host program's document, never progress
            reader.feed("stdout", b'runbook-progress {"message": "stdout is the document"}\nhalf a line ')
    assert ctx.calls == SHOWN


def test_a_line_too_long_to_be_progress_is_not_kept_and_not_read() -> None:
    seen: list[dict[str, Any]] = []
    reader = ProgressLines(seen.append)
    head = PROGRESS_PREFIX + b'{"pad": "'
    longest = head + b"z" * (PROGRESS_LINE_MAX - len(head) - 2) + b'"}'  # a progress line of the longest kept
    assert len(longest) == PROGRESS_LINE_MAX
    reader.feed("stderr", longest)
    reader.feed("stderr", b"\n")
    reader.feed("stderr", b"noise before it: " + longest)  # its end looks like progress; the line is not
    reader.feed("stderr", b"\n")
    for _ in range(3):
        reader.feed("stderr", b"y" * PROGRESS_LINE_MAX)
        assert len(reader.pending) <= PROGRESS_LINE_MAX
    reader.feed("stderr", b"\n" + PROGRESS_PREFIX + b'{"next": 1}\n')
    assert [set(fields) for fields in seen] == [{"pad"}, {"next"}]


def test_a_progress_line_with_a_number_json_has_not_is_skipped() -> None:
    """A host may print `NaN` or `Infinity` (Python's json writes them): shown, they would make the `--json`
    line of the progress event one that a strict JSON parser refuses."""
    seen: list[dict[str, Any]] = []
    reader = ProgressLines(seen.append)
    for value in (b"NaN", b"Infinity", b"-Infinity", b"[1, NaN]", b"1e999", b"-1e400", b"1.5"):
        reader.feed("stderr", PROGRESS_PREFIX + b'{"rate": ' + value + b"}\n")
    assert seen == [{"rate": 1.5}]


def test_a_reader_for_stdout_ignores_stderr() -> None:
    seen: list[dict[str, Any]] = []
    reader = ProgressLines(seen.append, stream="stdout")
    reader.feed("stderr", PROGRESS_PREFIX + b'{"disk_bytes": 1}\n')
    reader.feed("stdout", PROGRESS_PREFIX + b'{"disk_bytes": 2}\n')
    assert seen == [{"disk_bytes": 2}]


def test_host_programs_print_the_prefix_the_controller_reads() -> None:
    """One definition: the kit's, bundled into every program; no program keeps a copy of its own."""
    assert kit.PROGRESS_PREFIX.encode() == PROGRESS_PREFIX
    assert [p.name for p in PACKAGE.glob("*.py") if "PROGRESS_PREFIX =" in p.read_text()] == ["kit.py"]


class _Floats(BaseModel):
    rate: float
    items: list[int] = []


def _printed(stdout: bytes, exit_code: int = 0) -> CommandResult:
    collect = Collector()
    collect.stdout.feed(stdout)
    return collect.result(exit_code)


def test_a_document_of_many_wrong_items_fails_in_a_short_message() -> None:
    """A host printing 100000 wrong items must not make a 20 MB message (event, state, console)."""
    line = json.dumps({"rate": 1.0, "items": ["x"] * 100_000}).encode()
    with pytest.raises(FactsError, match=r"unexpected shape: 100000 errors; items\.0: Input should be") as caught:
        host_document(_printed(line), _Floats, "the program")
    assert len(str(caught.value)) < 2000


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_a_document_holding_a_number_json_has_not_is_refused(number: bytes) -> None:
    """The kit prints with allow_nan=False: a NaN in a float fact would reach state and gates as null."""
    with pytest.raises(FactsError, match=r"unexpected shape"):
        host_document(_printed(b'{"rate": ' + number + b"}"), _Floats, "the program")


@pytest.mark.parametrize("exit_code", [1, kit.TOO_OLD])
def test_the_stderr_a_failed_program_leaves_is_quoted_in_short_lines(exit_code: int) -> None:
    """A host printing a megabyte line on stderr and no document must not make a megabyte message."""
    collect = Collector()
    collect.stderr.feed(b"Traceback\n" + b"E" * 1_000_000 + b"\nthe end\n")
    with pytest.raises(FactsError, match=r": Traceback\nE{300} \.\.\.\nthe end$") as caught:
        host_document(collect.result(exit_code), _Floats, "the program")
    assert len(str(caught.value)) < 2000


def test_a_kinds_step_references_are_needed_by_their_type_alone() -> None:
    """A kind declares a reference to another step by typing the field `StepRef`; `needs()` (what resume,
    the loader's order check and a matrix's cells follow) has it without the kind restating it."""
    from typing import Literal

    from executor.stepkind import StepRef, StepSpec

    class Pointing(StepSpec):
        kind: Literal["pointing_test"] = "pointing_test"
        server: StepRef
        other: StepRef | None = None

    try:
        step = Pointing(id="p", server="up", gates=["steps.probe.facts.ok"])
        assert step.needs() == {"up", "probe"}
        assert Pointing(id="q", server="up", other="eval", gates=[]).needs() == {"up", "eval"}
    finally:
        StepSpec.registry.pop("pointing_test")  # a test kind: out of the registry the other tests read


# ---- hostile progress lines through every sink, into the engine's own `progress` ------------------------------


class Recorded(Reporter):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)


def engine_progress() -> tuple[Any, Recorded]:
    """The engine's HostContext.progress (the method itself) on a real Emitter: what a sink calls in a run."""
    recorded = Recorded()
    events = Emitter(EventStream(recorded, "run", Redactor([]))).bind(step="s", host="h", attempt=1)
    return types.SimpleNamespace(
        progress=functools.partial(HostContext.progress, cast(HostContext, types.SimpleNamespace(events=events)))
    ), recorded


#: Keys that are names in Python or in the event: a progress line's keys are data all the same
NAMES = ["self", "message", "id", "__class__", "kind", "event", "step", "fields", "seq", "set", "done", "total"]
KNOWN = ["files_done", "files_total", "bytes_done", "bytes_total", "bytes_per_s", "disk_bytes", "completion_tokens"]
KNOWN += ["spec_verify_ct", "seconds", "prompt_tokens", "spec_accept_length", "output_ids", "error", "finish_reason"]
HOSTILE: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([0, -1, 1e308, -1e308, 10**400, -(10**400), 1.5, "x", "", None, True, [], {}]),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES + KNOWN), HOSTILE, max_size=12))
def test_a_progress_line_of_any_keys_and_numbers_is_shown_with_its_keys_as_data_or_skipped(
    fields: dict[str, Any],
) -> None:
    """Every sink of the kinds (the deploy's and stop_server's messages, eval_acceptance's per-request line,
    verify's hashing, download's size lines), fed one line whose keys are `self`, `id`, `message`, ... and
    whose numbers are negative, 1e308, 400 digits or text: the line is shown, every key of it a field as sent,
    or skipped; never a TypeError (`self` as a keyword), an OverflowError or a ValueError out of the feed."""
    line = PROGRESS_PREFIX + json.dumps(fields).encode() + b"\n"
    for make in (progress_messages_feed, eval_progress, verify_progress, download_meter):
        ctx, recorded = engine_progress()
        feed = make(ctx)
        feed("stderr", line)
        if make is progress_messages_feed:
            assert len(recorded.events) == ("message" in fields)
        for event in recorded.events:
            assert isinstance(event, Progress) and (event.step, event.host) == ("s", "h")
            shown = {k: v for k, v in fields.items() if k != "message"} if make is progress_messages_feed else None
            if shown is not None:
                assert event.fields == shown and event.message == str(fields["message"])
            elif make is not download_meter:
                assert event.fields == fields


def eval_progress(ctx: Any) -> Any:
    from steps.eval_acceptance import progress_sink

    return progress_sink(ctx)


def verify_progress(ctx: Any) -> Any:
    from steps.verify import progress_sink

    return progress_sink(ctx)


def download_meter(ctx: Any) -> Any:
    from steps.download import ProgressMeter

    return ProgressMeter(ctx, "org/repo", "hf", total=1000, done_before=0).feed


def progress_messages_feed(ctx: Any) -> Any:
    return progress_messages(ctx).feed


VALID: dict[Any, dict[str, Any]] = {
    eval_progress: {"set": "math", "done": 1, "total": 2, "completion_tokens": 8, "spec_verify_ct": 2, "seconds": 0.5},
    verify_progress: {"files_done": 1, "files_total": 2, "bytes_done": 1, "bytes_total": 2, "bytes_per_s": 1},
    progress_messages_feed: {"message": "started"},
}


@pytest.mark.parametrize("make", list(VALID))
def test_keys_named_as_python_or_the_event_names_things_are_fields_like_any_other(make: Any) -> None:
    names = {"self": 1, "id": "p7", "__class__": "x", "kind": "k", "event": "e", "step": "t", "fields": [1]}
    ctx, recorded = engine_progress()
    make(ctx)("stderr", PROGRESS_PREFIX + json.dumps(VALID[make] | names).encode() + b"\n")
    [event] = recorded.events
    assert isinstance(event, Progress) and event.event == "progress" and event.step == "s"
    assert {k: event.fields[k] for k in names} == names


@pytest.mark.parametrize("depth", [FACTS_MAX_DEPTH + 1, 600, 990])
def test_a_progress_line_nested_past_the_facts_depth_is_skipped_and_the_reporters_live_on(depth: int) -> None:
    """A line nested 600 deep parses, and then stopped the console and `--json` reporters for the rest of the run
    (a RecursionError where the redacting reporter walks the event): it is skipped, the next event is printed."""
    out, said = io.StringIO(), io.StringIO()
    stream = EventStream(RedactingReporter(JsonReporter(out), Redactor(["s3cret"])), "run", Redactor([]), said)
    events = Emitter(stream).bind(step="s", host="h", attempt=1)
    ctx = types.SimpleNamespace(
        progress=functools.partial(HostContext.progress, cast(HostContext, types.SimpleNamespace(events=events)))
    )
    nested = b"[" * depth + b"]" * depth
    progress_messages(ctx).feed("stderr", PROGRESS_PREFIX + b'{"message": "deep", "x": ' + nested + b"}\n")
    progress_messages(ctx).feed("stderr", PROGRESS_PREFIX + b'{"message": "next"}\n')
    shown = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["message"] for e in shown] == ["next"] and stream.failed == [] and said.getvalue() == ""


#: host output nested past json.loads' recursion (about 1000 levels), never past PARSE_MAX_DEPTH's count
PAST_THE_PARSER = b"[" * 5000 + b"]" * 5000


def test_a_host_programs_document_nested_past_the_parser_is_a_facts_error_counted_before_parsing() -> None:
    """Every host program's document (probe, deploy, eval_acceptance, ...) is host output: counted before the parser
    sees it (executor.files.json_data), its refusal a FactsError naming the program, as any malformed document's."""
    with pytest.raises(FactsError, match="the program printed a document of an unexpected shape"):
        host_document(_printed(PAST_THE_PARSER + b"\n"), _Floats, "the program")


def test_a_progress_line_nested_past_the_parser_never_reaches_its_recursion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skipped as before, but refused by its count: json.loads is never left to recurse into a RecursionError."""
    recursed: list[str] = []
    parse = json.loads

    def watched(text: str | bytes, **options: Any) -> Any:
        try:
            return parse(text, **options)
        except RecursionError:
            recursed.append("json.loads")
            raise

    monkeypatch.setattr(json, "loads", watched)
    seen: list[dict[str, Any]] = []
    reader = ProgressLines(seen.append)
    reader.feed("stderr", PROGRESS_PREFIX + b'{"x": ' + PAST_THE_PARSER + b"}\n" + PROGRESS_PREFIX + b'{"n": 1}\n')
    assert seen == [{"n": 1}] and recursed == []


class _Open(BaseModel):
    """A document whose one field holds whatever JSON the host printed (a shell-like, open fact)."""

    data: Any


def test_a_host_programs_document_nested_past_the_facts_depth_fails_naming_the_facts_depth() -> None:
    """README: facts drawn from host output nest at most 64 levels; deeper JSON fails the attempt with "nested
    deeper than 64 levels", whatever the depth (65 is said so by the facts' own check after parsing)."""
    deep = b'{"data": ' + b"[" * 300 + b"]" * 300 + b"}"
    with pytest.raises(FactsError, match="nested deeper than 64 levels"):
        host_document(_printed(deep + b"\n"), _Open, "the program")
