"""Secret values are redacted by value, not by key name, from everything the run writes or shows.

A secret leaves a host in more shapes than its exact value: a key file's single lines, the value
without the newline it was read with, the value escaped inside a JSON string or a Python repr (a gate
shows values so). `forms` lists them; `Redactor` masks each with `***`, longest first. Output is
redacted as it streams in (`StreamRedactor`), before anything keeps, cuts, hashes or shows it, so no
cut of a capped output and no chunk boundary can leave a secret's prefix or suffix behind.

A text shorter than MIN_SECRET_CHARS is never masked on its own: masking a 1-character secret would
mask that character everywhere (`st***p`) and so spell the secret out. A secret must be at least that
long (the loader refuses a shorter one, `executor.runbook.loader.secret_values`); a line of a multi-line
secret that is shorter (a `{`, a PEM armour's last `==`) is masked only as part of the whole value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote, quote_plus

from executor.files import json_data
from executor.render import MASK

#: The shortest secret (without surrounding whitespace), and the shortest text masked as one.
MIN_SECRET_CHARS = 8
MASK_BYTES = MASK.encode()


def forms(value: str) -> set[str]:
    """Every text in which `value` may be printed by a host or shown by the run: the value, the value
    without surrounding whitespace, its lines joined (CR and LF dropped, as huggingface_hub and the host
    programs' kit.HubToken use a token), each of its lines (stripped), the forms of each string in it when it
    is a JSON document (a credential file's `private_key`, printed alone), each of those inside a shell word
    where it holds a `'`, each escaped as inside a JSON string (ASCII-only and not), inside a Python repr (`'`
    escaped or not) and percent-encoded in a URL, and each ASCII one in UTF-16; those shorter than
    MIN_SECRET_CHARS left out (a short line is never masked on its own, in whatever quoting)."""
    joined = value.replace("\r", "").replace("\n", "").strip()  # as huggingface_hub sends a token (_clean_token)
    plain = {value, value.strip(), joined, *(line.strip() for line in value.splitlines())}
    plain |= {_shell(text) for text in plain if "'" in text and len(text) >= MIN_SECRET_CHARS}
    escaped = {
        form
        for text in plain
        if len(text) >= MIN_SECRET_CHARS
        for form in (
            text,
            json.dumps(text)[1:-1],
            json.dumps(text, ensure_ascii=False)[1:-1],
            *_reprs(text),
            *_urls(text),
        )
    }
    return escaped.union(*map(_utf16, escaped), *(forms(leaf) for leaf in _json_strings(value)))


def _shell(text: str) -> str:
    """`text` inside a word `shlex.quote` wrote (a `--var` holding a secret, exported by the command a run
    records and `plan --full` prints): each `'` closes the quote, is quoted as `"'"` and reopens it."""
    return text.replace("'", "'\"'\"'")


def _reprs(text: str) -> tuple[str, str]:
    """`text` inside a Python repr, both ways: alone, and within a longer string that also holds a `"`
    (the runner's last words quoted in a note), where the repr escapes each `'` as `\\'`."""
    return repr(text)[1:-1], repr(text + '"')[1:-2]


def _urls(text: str) -> tuple[str, str, str]:
    """`text` percent-encoded as in a URL (a password with `@` or `/` in `postgresql://app:...@db/`, which a
    failing client prints): every reserved character encoded, `/` kept, and a form's `+` for a space."""
    return quote(text, safe=""), quote(text), quote_plus(text, safe="")


def _utf16(text: str) -> set[str]:
    """An ASCII text in UTF-16, little- and big-endian, as the text its bytes decode to (a NUL beside each
    character): what a Windows tool or `iconv -t UTF-16` writes, which a terminal shows as
    `t\\x00o\\x00k\\x00...`, readable. (Another text's UTF-16 bytes are no UTF-8: they never decode to it.)"""
    if not text.isascii():
        return set()
    return {"".join(f"{char}\0" for char in text), "".join(f"\0{char}" for char in text)}


def _json_strings(value: str) -> list[str]:
    """The string values of a JSON object or array, at any depth (not its keys: names such as `type` are
    no secret); none for other text."""
    try:
        document = json_data(value)
    except ValueError:
        return []
    found: list[str] = []
    pending = [document] if isinstance(document, dict | list) else []
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += item.values()
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            found.append(item)
    return found


class Redactor:
    """Replaces every occurrence of any form of any secret value with `***`, longest form first."""

    def __init__(self, values: Iterable[str]) -> None:
        distinct = sorted({form for value in values for form in forms(value)}, key=len, reverse=True)
        encoded = sorted({form.encode("utf-8") for form in distinct}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, distinct))) if distinct else None
        self._bytes = re.compile(b"|".join(map(re.escape, encoded))) if encoded else None
        self._encoded = encoded
        #: The forms that hold no other form: any occurrence of a form holds one of these, which
        #: `bytes.find` looks for an order of magnitude faster than the alternation searches
        self._cores = [form for form in encoded if not any(other in form for other in encoded if other != form)]
        # where a form may start: a cheap test (run by the regex engine) before a whole one
        pairs = sorted({form[:2] for form in encoded})
        self._pair_starts = re.compile(b"(?=" + b"|".join(map(re.escape, pairs)) + b")") if encoded else None
        self._first_bytes = {form[:1] for form in encoded}
        #: The longest form in bytes: a stream's redactor holds back at most one byte less.
        self.longest = len(encoded[0]) if encoded else 0

    def text(self, value: str) -> str:
        return self._pattern.sub(MASK, value) if self._pattern else value

    def data(self, value: bytes) -> bytes:
        out: list[bytes] = []
        done = 0
        for found in self.matches(value):
            out += (value[done : found.start()], MASK_BYTES)
            done = found.end()
        return b"".join([*out, value[done:]]) if out else value

    def deep(self, value: Any) -> Any:
        """Redact strings anywhere inside JSON-like data (facts, events)."""
        if not self._pattern:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.deep(k): self.deep(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.deep(v) for v in value]
        return value

    def stream(self) -> StreamRedactor:
        """A redactor for one byte stream that arrives in chunks."""
        return StreamRedactor(self)

    def matches(self, data: bytes, before: int | None = None) -> Iterator[re.Match[bytes]]:
        """The occurrences of forms in `data` that `re.sub` would replace (leftmost, the longest where
        several start there, not overlapping), those that start before `before`.

        The alternation is searched only from where a match may start: a match holds an occurrence of
        a core form (`_cores`), so none starts more than `longest - 1` bytes before the next one."""
        if self._bytes is None:
            return
        limit = len(data) if before is None else before
        ahead = dict.fromkeys(self._cores, -1)  # each core's next occurrence at or after `start` (-1: unknown)
        start = 0
        while start < limit:
            for core, at in ahead.items():
                if at != len(data) and at < start:
                    found_at = data.find(core, start)
                    ahead[core] = len(data) if found_at < 0 else found_at
            nearest = min(ahead.values())
            if nearest >= len(data):
                return
            found = self._bytes.search(data, max(start, nearest - self.longest + 1))
            if found is None or found.start() >= limit:
                return
            yield found
            start = found.end()

    def undecided(self, data: bytes) -> int:
        """Where the end of `data` may start a form that more data would complete (len(data): nowhere).
        Before that point, which form (if any) starts at each position is known from `data` alone."""
        if self._pair_starts is None or not data:
            return len(data)
        candidates = [m.start() for m in self._pair_starts.finditer(data, max(0, len(data) - self.longest + 1))]
        if data[-1:] in self._first_bytes:
            candidates.append(len(data) - 1)
        for start in candidates:
            rest = data[start:]
            if any(len(form) > len(rest) and form.startswith(rest) for form in self._encoded):
                return start
        return len(data)


#: Masks nothing: where a run has no secrets (and the default of a transport's output).
NO_SECRETS = Redactor(())


class StreamRedactor:
    """Redacts a byte stream chunk by chunk exactly as `Redactor.data` redacts it whole.

    It holds back the end of what has arrived from the first position where a form may start that the
    next chunk would complete (at most `longest - 1` bytes; usually none, so the live display does not
    lag): before that point the decision is final. `flush` (at the end of the stream) redacts and returns
    what is held back.
    """

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far is now safe to pass on, redacted."""
        if not self._redactor.longest:
            return chunk
        data = self._held + chunk
        undecided = self._redactor.undecided(data)
        out: list[bytes] = []
        done = 0
        for found in self._redactor.matches(data, undecided):
            out += (data[done : found.start()], MASK_BYTES)
            done = found.end()
        cut = max(done, undecided)
        out.append(data[done:cut])
        self._held = data[cut:]
        return b"".join(out)

    def flush(self) -> bytes:
        """The rest of the stream, redacted; the redactor is then empty."""
        rest, self._held = self._redactor.data(self._held), b""
        return rest
