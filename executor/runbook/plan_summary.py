"""The readable `runbook plan`: per step, host and fallback what it does in a line or two, the commands a
person cares about, its gates, what it learns only at run time and from which step, and the host programs
it ships as name, size and digest (never their bodies: `runbook plan --full` prints every script as sent).

It renders `executor.runbook.planner.plan_model`'s typed document, already masked, so the text and
`plan --json` say the same.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executor.runbook.planner import PlanDocument, PlanHostFields, PlanVariant

WIDTH = 160  # of every line but an unbreakable word, where the terminal's width is not known (a pipe, a file)
INDENT = "    "
MORE = "        "  # a wrapped line's continuation
COMMAND = INDENT + "$ "


def summary_text(document: PlanDocument, width: int = WIDTH) -> str:
    """The plan document as text, in runbook order, each matrix group's header before its first instance; every
    line fits `width` but one that is a single word (a path, a digest)."""
    hosts = sorted({host for step in document.steps for host in step.hosts})
    count = len(document.steps) + sum(group.instances_left_out for group in document.groups)
    lines = _comment(
        f"# runbook {document.runbook}: {count} steps on {', '.join(hosts) or 'no host'}; nothing is run "
        "(`runbook plan --full` prints every command as sent)",
        width,
    )
    if document.secrets:
        lines += _comment("# secrets are shown as '***'; their values come at run time", width)
    lines += host_lines(document.hosts, width)
    for laid in document.campaign:  # --from-campaign's band, each var with its source
        lines += _comment(f"# var {laid.shown}", width)
    first = {group.instances[0]: group for group in document.groups if group.instances}
    for step in document.steps:
        if step.id in first:
            header = "\n".join(first[step.id].header).split("\n")
            lines += ["", *(line for head in header for line in _comment(head, width))]
        for on in step.on:
            for variant in on.variants:
                title = f"## step {step.number} '{step.id}' ({step.kind}) on {on.host} [{on.address}], {variant.via}"
                lines += ["", *_comment(title, width)]
                if step.description and variant.via == "primary":
                    lines += _wrapped(step.description, INDENT, width)
                lines += list(_variant_lines(variant, width))
    return "\n".join(lines)


def host_lines(hosts: list[PlanHostFields], width: int = WIDTH) -> list[str]:
    """Each host's fields, one a line with where it is written (the runbook's or the inventory's FILE:LINE), then
    its defaults on one line: what a site file changed, and what it kept, at a glance; each fitted to `width`."""
    lines = []
    for host in hosts:
        lines.append(f"\n## host {host.host}")
        names = max((len(field.name) for field in host.fields if field.at), default=0)
        written = [field for field in host.fields if field.at]
        values = max((len(field.shown) for field in written), default=0)
        for f in written:
            lines += _wrapped(f"{f.name:<{names}}  {f.shown:<{values}}  ({f.source} {f.at})", INDENT, width)
        defaults = ", ".join(f"{field.name} {field.shown}" for field in host.fields if not field.at)
        if defaults:
            lines += _wrapped(f"defaults: {defaults}", INDENT, width)
    return lines


def _variant_lines(variant: PlanVariant, width: int) -> Iterator[str]:
    for line in variant.summary:
        yield from _wrapped(line, INDENT, width)
    for command in variant.commands:
        yield from command_lines(command, width)
    if variant.gates:
        yield from _wrapped("gates: " + "; ".join(gate.that for gate in variant.gates), INDENT, width)
    by_step: dict[str, list[str]] = {}
    for value in variant.run_time:
        by_step.setdefault(value.step, []).append(value.value.removeprefix(f"steps.{value.step}.facts."))
    for step, paths in by_step.items():
        yield from _wrapped(f"known at run time, from step '{step}': {', '.join(paths)}", INDENT, width)
    for program in variant.programs:
        shipped = f"host program {program.name}: {program.size} bytes, sha256:{program.sha256}"
        yield from _wrapped(shipped, INDENT, width)


def _comment(line: str, width: int) -> list[str]:
    """A line of `#` (a title, a group's header) broken to fit `width`, each continuation after the same `#` and
    two more spaces."""
    head = line[: len(line) - len(line.lstrip("# "))]
    return _wrapped(line[len(head) :], head, width, head + "  ") if line else [line]


def _wrapped(text: str, indent: str, width: int, more: str = MORE) -> list[str]:
    """`text` broken between words to fit `width`, the first line after `indent`, the others after `more`."""
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=more,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


def command_lines(command: str, width: int = WIDTH) -> list[str]:
    """A command as a person would paste it: after `$ `, broken only between shell words to fit `width`, with
    ` \\` at the end of every line but the last, so that the lines paste as one command. A word no line holds
    (a long run-time mark) gets lines of its own, broken between its inner words."""
    try:
        words = _options(shlex.split(command, posix=False), width - len(MORE) - 2)
    except ValueError:  # no shell words (an unbalanced quote): shown as it is
        return _wrapped(command, COMMAND, width)
    rows: list[list[str]] = [[]]
    for word in words:
        head = COMMAND if len(rows) == 1 else MORE
        if rows[-1] and len(head) + len(" ".join([*rows[-1], word])) + 2 > width:
            rows.append([])
        rows[-1].append(word)
    shown = [_wrapped(" ".join(row), COMMAND if n == 0 else MORE, width - 2) for n, row in enumerate(rows)]
    return [line for lines in shown[:-1] for line in [*lines[:-1], lines[-1] + " \\"]] + shown[-1]


def _options(words: list[str], most: int) -> list[str]:
    """The words with each `--option` joined to its value, so that no line ends between the two, where the two
    fit in `most` characters or the value is a run-time mark (which has lines of its own, broken inside it);
    else a line may end between them with ` \\` (a long path)."""
    joined: list[str] = []
    for word in words:
        last = joined[-1] if joined else ""
        fits = len(f"{last} {word}") <= most or " " in word
        if last.startswith("--") and " " not in last and not word.startswith("-") and fits:
            joined[-1] += " " + word
        else:
            joined.append(word)
    return joined
