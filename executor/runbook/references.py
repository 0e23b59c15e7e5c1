"""The `$name` references of a step, checked at `validate` against the names that exist (README, "`$var`
references").

A parameter's `$name` is a runbook var (or secret) that the host expands (`executor.render.host_word`): one
the runbook does not have is a typo, and the step would stop on the host ("runbook var X is unset or empty")
after minutes of probing and downloading. So it is an error at `validate`. A script is bash: its `$NAME` may
also be a variable the script sets itself, or one of bash's or the login's environment, so a name found in
none of these is only a warning. What bash never expands is skipped: single quotes, `$'...'`, comments, a
backslash-escaped `$`, and the body of a heredoc whose delimiter is quoted.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Collection, Generator, Iterator
from dataclasses import dataclass

#: What bash sets itself, and what a login's environment (or the step's: executor.render.UNATTENDED_ENV)
#: has: a `$NAME` of these names no var of the runbook (patterns, as `pass_env` takes them).
ENVIRONMENT = (
    *("_", "BASH", "BASH_*", "BASHOPTS", "BASHPID", "COLUMNS", "COMP_*", "DIRSTACK", "EPOCHREALTIME"),
    *("EPOCHSECONDS", "EUID", "FUNCNAME", "GROUPS", "HISTCMD", "HISTFILE", "HOSTNAME", "HOSTTYPE", "IFS"),
    *("LINENO", "LINES", "MACHTYPE", "OLDPWD", "OPTARG", "OPTERR", "OPTIND", "OSTYPE", "PIPESTATUS", "PPID"),
    *("PS1", "PS2", "PS3", "PS4", "PWD", "RANDOM", "REPLY", "SECONDS", "SHELLOPTS", "SHLVL", "SRANDOM"),
    *("TIMEFORMAT", "TMOUT", "UID", "HOME", "PATH", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE"),
    *("LC_*", "TZ", "TMPDIR", "MAIL", "DISPLAY", "EDITOR", "PAGER", "SSH_*", "XDG_*", "SUDO_*"),
    *("DEBIAN_FRONTEND", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CUDA_HOME"),
    "CUDA_VISIBLE_DEVICES",
)

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
#: A reference where bash expands one: `$name`, `${name...}`, `${#name}`, `${!name}`.
_REFERENCE = re.compile(rf"\$(?:\{{[#!]?({_NAME})|({_NAME}))")
#: What a script sets: `NAME=`, `NAME+=`, `NAME[i]=` (at a command's start or as an argument: a warning
#: is worth less than a false one), `for NAME in`, `select NAME`, `((NAME++))`, `printf -v NAME`. A name starts
#: a word and a subscript is short: tried at every offset of a word, or each `NAME[` to its line's end, the
#: pattern took minutes over a 100 KB word.
_ASSIGNED = re.compile(
    rf"(?<![\w$-])({_NAME})(?:\[[^\]\n]{{0,200}}\])?\+?=|\b(?:for|select)\s+({_NAME})\b"
    rf"|(?<!\w)({_NAME})\s*(?:\+\+|--)|\bprintf\s+-v\s+({_NAME})"
)
#: Commands whose words are names they set (or declare): every name-like word up to the command's end.
_DECLARING = re.compile(
    r"\b(?:read|local|export|declare|typeset|readonly|mapfile|readarray|getopts|let|unset)\b([^;&|\n)]*)"
)
_WORD = re.compile(rf"(?<![\w$=-]){_NAME}\b")
_HEREDOC = re.compile(rf"<<(-?)\s*(?:'({_NAME})'|\"({_NAME})\"|\\?({_NAME}))")


_ENVIRONMENT = re.compile("|".join(fnmatch.translate(pattern) for pattern in ENVIRONMENT))


def is_environment(name: str) -> bool:
    """Whether `name` is bash's own or the environment's (ENVIRONMENT)."""
    return _ENVIRONMENT.match(name) is not None


def parameter_names(text: str) -> Iterator[tuple[int, str]]:
    """(offset, name) of each `$name` in a parameter's text (the host expands every one)."""
    for match in _REFERENCE.finditer(text):
        yield match.start(), match.group(1) or match.group(2)


def reference_at(text: str, offset: int) -> str:
    """The reference as written at `offset` of `text` (`$name`, `${name`, `${#name`)."""
    match = _REFERENCE.match(text, offset)
    return match.group(0) if match else "$"


@dataclass(frozen=True)
class ScriptNames:
    """What a script reads (`references`: offset and name of each `$NAME` bash expands) and sets."""

    references: tuple[tuple[int, str], ...]
    assigned: frozenset[str]


@functools.lru_cache(maxsize=256)
def script_names(script: str) -> ScriptNames:
    """The script's references and assignments, worked out once per text (a matrix repeats its scripts)."""
    assigned = {next(filter(None, m.groups())) for m in _ASSIGNED.finditer(script)}
    for match in _DECLARING.finditer(script):
        assigned.update(_WORD.findall(match.group(1)))
    return ScriptNames(tuple(_Scanner(script).references()), frozenset(assigned))


def unknown_in_script(script: str, defined: Collection[str]) -> list[tuple[int, str]]:
    """(offset, name) of each `$NAME` of `script` that is neither in `defined`, set by the script, nor
    bash's or the environment's."""
    names = script_names(script)
    return [
        (offset, name)
        for offset, name in names.references
        if name not in defined and name not in names.assigned and not is_environment(name)
    ]


class _Scanner:
    """Walks a bash script as bash reads its quoting, yielding the references it expands."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.heredocs: list[tuple[bool, bool, str]] = []  # (strip tabs, quoted, delimiter) awaiting their line

    def references(self) -> Generator[tuple[int, str], None, None]:
        text, i, quoted = self.text, 0, False
        while i < len(text):
            char = text[i]
            if char == "\\":
                i += 2
            elif char == "$" and text.startswith("'", i + 1) and not quoted:  # `$'...'`: its `\'` is no end
                i = _end_of_ansi_c(text, i + 2)
            elif char == "$":
                i = yield from self._reference(i)
            elif char == '"':
                quoted, i = not quoted, i + 1
            elif quoted:
                i += 1
            elif char == "'":  # (after a `$`, the `$'...'` of bash's escapes: no expansion either)
                i = _end_of(text, i + 1, "'")
            elif char == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):  # to its newline (a `#` last: the end)
                i = max(i + 1, _end_of(text, i, "\n") - 1)
            elif text.startswith("((", i):  # arithmetic (`$((`, `((`): its `<<` is a shift, no heredoc
                i = yield from self._arithmetic(i)
            elif text.startswith("<<<", i):  # a here-string, no heredoc
                i += 3
            elif char == "<" and (match := _HEREDOC.match(text, i)) is not None:
                quoted_delimiter = bool(match.group(2) or match.group(3))
                self.heredocs.append((bool(match.group(1)), quoted_delimiter, next(filter(None, match.groups()[1:]))))
                i = match.end()
            elif char == "\n" and self.heredocs:
                i = yield from self._bodies(i + 1)
            else:
                i += 1

    def _reference(self, i: int) -> Generator[tuple[int, str], None, int]:
        match = _REFERENCE.match(self.text, i)
        if match is None:
            return i + 1
        yield i, match.group(1) or match.group(2)
        return match.end()

    def _arithmetic(self, i: int) -> Generator[tuple[int, str], None, int]:
        """The references of the arithmetic that opens at `i` (`((`), to its matching `))` on the same line."""
        depth, end = 0, i
        while end < len(self.text) and self.text[end] != "\n":
            depth += {"(": 1, ")": -1}.get(self.text[end], 0)
            end += 1
            if depth == 0:
                break
        yield from ((i + offset, name) for offset, name in _unescaped(self.text[i:end]))
        return end

    def _bodies(self, i: int) -> Generator[tuple[int, str], None, int]:
        """The heredocs begun on the line that ends at `i`: a quoted one's body is skipped, the others' read
        for references (quotes are plain characters there)."""
        for strip, quoted, delimiter in self.heredocs:
            start = i
            while i < len(self.text):
                end = _end_of(self.text, i, "\n")
                line = self.text[i : end - 1] if self.text[end - 1 : end] == "\n" else self.text[i:end]
                i = end
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
            if not quoted:
                yield from ((start + offset, name) for offset, name in _unescaped(self.text[start:i]))
        self.heredocs = []
        return i


def _unescaped(body: str) -> Iterator[tuple[int, str]]:
    """The references of an unquoted heredoc's body: every `$name` not after a backslash."""
    for match in _REFERENCE.finditer(body):
        if match.start() == 0 or body[match.start() - 1] != "\\":
            yield match.start(), match.group(1) or match.group(2)


def _end_of_ansi_c(text: str, start: int) -> int:
    """The offset after the `'` that ends a `$'...'` string whose text starts at `start` (a backslash escapes the
    character after it, `\'` included), the end of the text when none."""
    i = start
    while i < len(text) and text[i] != "'":
        i += 2 if text[i] == "\\" else 1
    return min(i + 1, len(text))


def _end_of(text: str, start: int, closing: str) -> int:
    """The offset after the first `closing` at or past `start` (the end of the text when none)."""
    found = text.find(closing, start)
    return len(text) if found < 0 else found + 1
