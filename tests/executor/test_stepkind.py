"""The step kinds' shared reader of host programs' `runbook-progress {json}` lines (executor/stepkind.py):
lines survive any cutting of the stream, other streams and other lines are ignored, a garbled line is skipped,
an endless line is not kept whole; and the prefix the controller reads is the one the host programs' kit prints."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from executor.hostprogram import PACKAGE
from executor.stepkind import (
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

    def progress(self, message: str, **fields: Any) -> None:
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
