"""executor.terminal: text made safe to show, read back unambiguously, and the console renderer using it."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from executor.errors import Problem
from executor.faces import cli
from executor.run.event_models import AttemptFailed, Note, StepFinished
from executor.run.events import ConsoleReporter
from executor.terminal import ESCAPED_CATEGORIES, escaped, shown, shown_text

# what a hostile host prints, and what makes the escaping's backslash rule matter, drawn often
TRICKY = ["\\", "x", "u", "U", "1", "b", "f", "0", "\x1b", "\r", "\x07", "\x9b", "\u202e", "\u2066", "\n", "\t"]
anything = st.characters(exclude_categories=())  # every code point, lone surrogates included
texts = st.text(st.one_of(anything, st.sampled_from(TRICKY)), max_size=40)

_TOKEN = re.compile(r"(\\*)(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})?")


def read_back(text: str) -> str:
    """The inverse of `shown`, as the module's docstring states it: before an escape-like body a run of
    backslashes is doubled literal ones, plus one escape when it is odd; anywhere else it is literal."""
    parts, at = [], 0
    for match in _TOKEN.finditer(text):
        if not match.group(0):
            continue
        parts.append(text[at : match.start()])
        run, body = match.groups()
        if body is None:
            parts.append(run)
        elif len(run) % 2:
            parts.append("\\" * (len(run) // 2) + chr(int(body[1:], 16)))
        else:
            parts.append("\\" * (len(run) // 2) + body)
        at = match.end()
    parts.append(text[at:])
    return "".join(parts)


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_the_shown_form_holds_no_control_or_format_character_but_newline_and_tab(text: str) -> None:
    safe = shown(text)
    assert not [c for c in safe if c not in "\n\t" and unicodedata.category(c) in ESCAPED_CATEGORIES]
    assert safe.count("\n") == text.count("\n") and safe.count("\t") == text.count("\t")
    safe.encode("utf-8")  # a lone surrogate would raise here, as it would when printed


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_the_shown_form_reads_back_to_the_exact_text(text: str) -> None:
    """So distinct texts are always shown differently: a literal `\\x1b` never passes for an ESC."""
    assert read_back(shown(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(exclude_categories=sorted(ESCAPED_CATEGORIES), exclude_characters="\\")))
def test_text_without_anything_to_escape_is_shown_as_it_is(text: str) -> None:
    assert shown(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),  # OSC 52: writes the clipboard
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # the terminal's title
        ("\x1b[2J\x1b[H\x1b[10A", "\\x1b[2J\\x1b[H\\x1b[10A"),  # clear the screen, move the cursor
        ("\x9b2J \x85 \x7f \x00", "\\x9b2J \\x85 \\x7f \\x00"),  # C1 CSI and NEL, DEL, NUL
        ("ok\rFAKE", "ok\\x0dFAKE"),  # a bare CR would overwrite the line
        ("if \u202eevil\u202c \u2066x\u2069", "if \\u202eevil\\u202c \\u2066x\\u2069"),  # Trojan Source
        ("a\u200bb\ufeff \u2028 tag\U000e0041", "a\\u200bb\\ufeff \\u2028 tag\\U000e0041"),  # invisible
        ("lone \ud800", "lone \\ud800"),
        ("keep\nlines\tand é, 中文, 👍", "keep\nlines\tand é, 中文, 👍"),
        ("C:\\Users \\n \\d+ \\\\ end\\", "C:\\Users \\n \\d+ \\\\ end\\"),  # backslashes stay ...
        ("\\x1b \\u202e \\U000e0041 \\X1B", "\\\\x1b \\\\u202e \\\\U000e0041 \\X1B"),  # ... doubled before look-alikes
        ("\\\x1b", "\\\\\\x1b"),  # and before an escape
    ],
)
def test_each_class_is_escaped_and_ordinary_text_kept(text: str, expected: str) -> None:
    assert shown(text) == expected
    assert read_back(expected) == text


@pytest.mark.parametrize("text", ["\u0301", "\U0001f3fb", "\u0301\u0302"])
def test_a_text_of_zero_width_characters_only_is_shown_escaped(text: str) -> None:
    """rich gives such a text no cells: a report's table cell or column of it would show as nothing."""
    plain = shown_text(text).plain
    assert cell_len(plain) > 0 and read_back(plain) == text
    assert shown_text("a\u0301").plain == "a\u0301"  # with a base character it shows: kept as it is


def test_a_problem_is_one_line_with_everything_escaped_as_shown_writes_it() -> None:
    """FILE:LINE:COL lines: a newline is escaped too, and a literal `\\x1b` is told apart from an ESC."""
    problem = Problem("rb.yaml", 3, 5, "unknown var 'a\\x1b\x1b]0;t\x07\nb\tc'")
    assert str(problem) == "rb.yaml:3:5: unknown var 'a\\\\x1b\\x1b]0;t\\x07\\x0ab\tc'"
    assert read_back(str(problem)) == "rb.yaml:3:5: " + problem.message


def test_a_long_run_of_backslashes_is_escaped_in_linear_time() -> None:
    text = "\\" * 1_000_000
    assert shown(text + "x1b") == text * 2 + "x1b" and shown(text + "!") == text + "!"


def test_escaped_agrees_with_the_categories() -> None:
    assert not escaped("\n") and not escaped("\t") and not escaped("é") and not escaped("\\")
    assert escaped("\x1b") and escaped("\r") and escaped("\u202e") and escaped("\u2029")


# what rich would read as markup or an emoji code, in host text; a tab is left out (rich expands tabs
# to blanks: it is shown, as spaces)
console_texts = st.lists(
    st.one_of(anything, st.sampled_from([*TRICKY, "[", "]", "/", ":", "[red]", "[/]", "[link=http://x]", ":smile:"])),
    max_size=30,
).map(lambda pieces: "".join(pieces).replace("\t", " "))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=console_texts)
def test_the_console_shows_event_text_exactly_as_shown_writes_it(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No markup (`[red]`, `[link=...]`), no emoji code (`:smile:`), no control sequence of a host's
    text reaches the run's console: it prints the escaped text, character for character."""
    capsys.readouterr()
    reporter = ConsoleReporter(cli.err())
    stamp = {"seq": 1, "run_id": "r", "time": 0.0}
    reporter.emit(Note(**stamp, host="box", message=text))
    reporter.emit(AttemptFailed(**stamp, step="s", host="box", attempt=1, message=text))
    reporter.emit(StepFinished(**stamp, step="s", status="failed", via=None, duration_s=1, hosts={}, failures=[text]))
    err = capsys.readouterr().err
    assert f"    note box: {shown(text)}\n" in err
    assert f"attempt 1 failed: {shown(text.split(chr(10))[0])}\n" in err
    assert f"elapsed)\n{shown(text)}\n" in err
