"""The rich consoles that stderr's messages and stdout's tables go through, apart from the reporters.

A module of its own so that the CLI can make its console at start-up without importing the reporters
(executor.run.events: pydantic's event models, rich's live display), which only `runbook run` needs.

Every line they print fits the terminal (`executor.terminal.line_width`: `COLUMNS`, else the terminal's width;
a pipe or a file without `COLUMNS` gets its lines whole): a text is broken between words, its continuation
lines indented (a word longer than a line, a path or a command, keeps a line of its own, whole, to be copied),
and a table (`print_table`) wraps inside its cells, a table too wide for the terminal even so printed as
several, each starting with the row's key columns again (`key_columns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.table import Table
from rich.text import Text

from executor.terminal import line_breaks, line_width

#: The cells a table's frame takes per column (a border and a space each side) and once (the last border).
COLUMN_FRAME = 3
TABLE_FRAME = 1


class FittingConsole(Console):
    """A rich console whose lines fit the terminal's width (`fit_width`; None where it is not known)."""

    def __init__(self, *, stderr: bool = False, file: IO[str] | None = None) -> None:
        super().__init__(stderr=stderr, file=file, highlight=False, soft_wrap=True)
        self.fit_width = line_width(self.file)
        if self.fit_width is not None:
            self.width = self.fit_width
            self.push_render_hook(_FitLines(self.fit_width))


class UnattendedConsole(FittingConsole):
    """A rich console that goes quiet when its reader goes away (`runbook run ... 2>&1 | head`).

    rich's default exits the process on a broken pipe, which would stop a deployment half-way
    because nobody is reading its progress; the run goes on, its state and audit log complete.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True


class PipedConsole(FittingConsole):
    """stdout's console: a reader that went away (`runbook status | head`) ends the command quietly
    (`main` exits 141), instead of rich's own exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


class Whole:
    """Lines a console prints as they are: a command already broken where it pastes whole, never again."""

    def __init__(self, text: Text) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text


class _FitLines(RenderHook):
    """Each text a console prints, its lines broken to fit `width` (`fitted_text`); tables fit on their own."""

    def __init__(self, width: int) -> None:
        self.width = width

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [fitted_text(r, self.width) if isinstance(r, Text) else r for r in renderables]


def fitted_text(text: Text, width: int) -> Text:
    """`text` with each line broken between words to fit `width` cells (`executor.terminal.line_breaks`), its
    styles kept."""
    lines: list[Text] = []
    for line in text.split("\n", allow_blank=True):
        breaks, more = line_breaks(line.plain, width)
        first, *rest = line.divide(breaks)
        for piece in (first, *rest):
            piece.rstrip()
        lines += [first, *(Text.assemble(more, piece) for piece in rest)]
    joined = Text("\n").join(lines)
    joined.end = text.end
    return joined


def print_table(
    console: FittingConsole, title: Text | str, columns: Sequence[Text | str], rows: Sequence[Sequence[Text]]
) -> None:
    """A table that fits the terminal (`table_parts`); where its width is not known, whole, however wide."""
    if console.fit_width is None:
        table = _table(title, columns, rows, dict.fromkeys(range(len(columns))))
        wanted = console.measure(table, options=console.options.update_width(10_000)).maximum
        whole = type(console)(file=console.file)
        whole.width = max(console.width, wanted)
        whole.print(table)
        return
    for part in table_parts(title, columns, rows, console.fit_width):
        console.print(part, soft_wrap=False)  # soft_wrap would keep the title from wrapping


def table_parts(
    title: Text | str, columns: Sequence[Text | str], rows: Sequence[Sequence[Text]], width: int
) -> list[Table]:
    """The table as one or more tables that fit `width` cells, each cell's text wrapped between words (a word
    wider than a whole table folded). Where even the longest words of every column do not fit side by side, the
    columns go into several tables, in order, each starting with the row's key again (`key_columns`) where that
    takes at most half the width, titled `TITLE (1/2)`, `TITLE (2/2)`: a number or an id is never cut."""
    cells = [[column, *(row[n] for row in rows)] for n, column in enumerate(columns)]
    most = width - COLUMN_FRAME - TABLE_FRAME  # what one column alone may take
    words = [min(max((cell_len(w) for cell in column for w in str(cell).split()), default=1), most) for column in cells]
    lines = [max(cell_len(line) for cell in column for line in str(cell).split("\n")) for column in cells]
    groups = column_groups(words, width, key_columns([[str(cell) for cell in row] for row in rows]))
    parts = []
    for n, group in enumerate(groups, start=1):
        widths = fit_widths([words[c] for c in group], [lines[c] for c in group], width)
        named = title if len(groups) == 1 else Text.assemble(title, f" ({n}/{len(groups)})")
        parts.append(_table(named, columns, rows, dict(zip(group, widths, strict=True))))
    return parts


def key_columns(rows: Sequence[Sequence[str]]) -> int:
    """How many leading columns tell the rows apart (a latency table's concurrency and deployment, a workload
    table's workload, category and concurrency): the fewest whose values differ between every two rows, else 1."""
    width = min((len(row) for row in rows), default=1)
    return next((n for n in range(1, width + 1) if len({tuple(row[:n]) for row in rows}) == len(rows)), 1)


def column_groups(widths: Sequence[int], width: int, key_count: int = 1) -> list[list[int]]:
    """The columns (by index), in order, in groups whose `widths` side by side, with a table's frame, fit `width`;
    each group after the first starts with the first `key_count` columns again where they take at most half the
    width (else with column 0 alone where it does)."""

    def needs(group: list[int]) -> int:
        return sum(widths[n] + COLUMN_FRAME for n in group) + TABLE_FRAME

    fitting = [list(range(n)) for n in (key_count, 1) if len(widths) > n and needs(list(range(n))) <= width // 2]
    key = fitting[0] if fitting else []
    groups: list[list[int]] = []
    group = [*key]
    for n in range(len(key), len(widths)):
        if len(group) > len(key) and needs([*group, n]) > width:
            groups.append(group)
            group = [*key]
        group.append(n)
    return [*groups, group]


def fit_widths(least: Sequence[int], most: Sequence[int], width: int) -> list[int]:
    """Each column's width in a table of `width` cells: as wide as its widest line (`most`) where they all fit,
    else the widest narrowed first, a cell at a time, never below its widest word (`least`)."""
    widths = [max(low, high) for low, high in zip(least, most, strict=True)]
    room = width - COLUMN_FRAME * len(widths) - TABLE_FRAME
    while sum(widths) > room:
        narrower = [n for n, (now, low) in enumerate(zip(widths, least, strict=True)) if now > low]
        if not narrower:
            break
        widths[max(narrower, key=lambda n: widths[n])] -= 1
    return widths


def _table(
    title: Text | str, columns: Sequence[Text | str], rows: Sequence[Sequence[Text]], widths: dict[int, int | None]
) -> Table:
    """A rich table of the columns `widths` names (each that wide, or as rich measures it: None), in order."""
    table = Table(title=title)
    for n, column_width in widths.items():
        table.add_column(columns[n], overflow="fold", width=column_width)
    for row in rows:
        table.add_row(*(row[n] for n in widths))
    return table
