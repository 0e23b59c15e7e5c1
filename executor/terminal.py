"""Text made safe to show on a terminal: what a host printed must never drive the operator's terminal.

A host's output, a stored run folder or a runbook can hold control sequences that a terminal obeys
(ESC ] 52 writes the clipboard, ESC ] 0 the title, ESC [ 2J clears the screen, U+009B is a one-byte
CSI, a bare CR overwrites a line) and invisible format characters that make a line lie (the bidi
overrides of "Trojan Source", U+202E). `shown` writes each such character as an escape and leaves
everything else as it is, so ordinary output reads the same and nothing hidden reaches the screen.

What is escaped: every character of Unicode's categories Cc (C0 controls but newline and tab, DEL,
C1 controls, CR included), Cf (format: bidi controls U+202A-U+202E and U+2066-U+2069, zero-width
characters, U+FEFF, tag characters), Zl and Zp (U+2028, U+2029: line breaks a reader cannot see)
and Cs (lone surrogates, which no terminal encoding can write). As `\\xHH` up to U+00FF, `\\uHHHH`
in the rest of the first plane, `\\UHHHHHHHH` beyond, lower-case hex: `\\x1b]52;...`, `\\u202e`.

The escaping is unambiguous (so the original can always be read back): a run of literal
backslashes is written doubled exactly where it stands before an escape or before text that
reads like one (`x` and 2 hex digits, `u` and 4, `U` and 8, digits of either case); anywhere else a
backslash stays as it is, so `C:\\dir`, `\\n` and `\\d+` read unchanged. Reading back: a run of
backslashes before such text is a real escape when the run is odd (its last backslash starts it),
half as many literal backslashes before literal text when even. `shown(shown(t))` is not `shown(t)`:
escape a text once, where it is shown (a `Problem` line is already shown text).

Only what is shown is escaped: the audit log, the state store and `--json` keep the exact text.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

#: Unicode categories of the characters `shown` escapes (but those it is told to keep).
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: What `shown` keeps by default: the line structure a person reads.
LINES = "\n\t"

# a whole run of backslashes (possessive, from its start: linear in a long run) and the character
# after it when that is outside printable ASCII (a candidate, decided by its category), or a whole
# run of backslashes before text that reads like an escape
_CANDIDATE = re.compile(r"(?<!\\)(\\*+)([^ -~])|(?<!\\)(\\++)(?=x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def shown(text: str, keep: str = LINES) -> str:
    """`text` as it may be shown to a person: control and format characters escaped (module docstring),
    but those in `keep` (`keep=""`: one line, whatever the text holds)."""
    return _CANDIDATE.sub(lambda match: _escape(match, keep), text)


def escaped(char: str, keep: str = LINES) -> bool:
    """Whether `shown` writes the character `char` as an escape."""
    return char not in keep and unicodedata.category(char) in ESCAPED_CATEGORIES


def _escape(match: re.Match[str], keep: str) -> str:
    """The replacement of one `_CANDIDATE` match."""
    run, char, before_lookalike = match.groups()
    if before_lookalike is not None:
        return before_lookalike * 2
    if not escaped(char, keep):
        return match.group(0)
    return run * 2 + _code(ord(char))


def _code(point: int) -> str:
    """The escape of one code point, in the shortest of the three forms that holds it."""
    if point <= 0xFF:
        return f"\\x{point:02x}"
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"


def shown_text(text: str, style: str = "") -> Text:
    """A rich Text of `text` as `shown` writes it: data for a table or a line, never markup, never
    a control character (rich's Text would drop CR, BEL and BS silently and pass ESC through).

    A text of zero-width characters only (a lone combining mark or emoji modifier) is written as
    escapes: rich gives it no cells, so a table column of it shows as nothing at all."""
    from rich.cells import cell_len  # here: every module shows text through `shown`, few print through rich
    from rich.text import Text

    safe = shown(text)
    if safe and cell_len(safe) == 0:
        safe = "".join(_code(ord(char)) for char in safe)
    return Text(safe, style=style)


#: The narrowest width lines are fitted to: a narrower terminal (or `COLUMNS`) gets lines of this many cells.
MIN_WIDTH = 20
#: What a broken line's continuation lines start with, after the first line's own indent.
HANGING = "  "
_WORD = re.compile(r"\S+\s*")


def line_width(stream: IO[str] | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """The width, in cells, that lines written to `stream` are fitted to: `COLUMNS` where it is set (a positive
    number), else the terminal's where `stream` is one, else None: a pipe or a file gets its lines whole, so that
    a log is read and searched one message a line."""
    columns = environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), MIN_WIDTH)
    try:
        if stream is not None and stream.isatty():
            return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH)
    except (OSError, ValueError, AttributeError):  # a closed stream, or one with no file descriptor
        pass
    return None


def line_breaks(line: str, width: int) -> tuple[list[int], str]:
    """Where one line (no newline in it) breaks to fit `width` cells: the offsets, between words, at which its
    continuation lines start, and the indent they get (the line's own indent and HANGING, where that leaves
    them half the width). A word longer than a line is never cut: it gets a line of its own (a path, a
    command, a URL stays whole to be copied)."""
    from rich.cells import cell_len  # here: only a command that fits its lines to a width pays for it

    if cell_len(line.rstrip()) <= width:
        return [], ""
    indent = line[: len(line) - len(line.lstrip(" "))]
    more = indent + HANGING if cell_len(indent + HANGING) <= width // 2 else ""
    breaks: list[int] = []
    used, placed = cell_len(indent), False
    for word in _WORD.finditer(line, len(indent)):
        if placed and used + cell_len(word.group().rstrip()) > width:
            breaks.append(word.start())
            used = cell_len(more)
        used += cell_len(word.group())
        placed = True
    return breaks, more


def fitted(text: str, width: int | None) -> str:
    """`text` with each of its lines broken between words to fit `width` cells (`line_breaks`); as it is where
    the width is not known (None: see `line_width`)."""
    if width is None:
        return text
    lines = []
    for line in text.split("\n"):
        breaks, more = line_breaks(line, width)
        starts = [0, *breaks]
        pieces = [line[start:end].rstrip() for start, end in zip(starts, [*breaks, len(line)], strict=True)]
        lines += [pieces[0], *(more + piece for piece in pieces[1:])]
    return "\n".join(lines)
