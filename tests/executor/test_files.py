"""executor/files.py's reading of JSON from a run folder: a document's depth is counted from its text before the
parser sees it (past its recursion json.loads raises a RecursionError that, even caught, left CPython 3.11's
compiler broken for the rest of a process: a CI worker's later tests, a long-lived MCP server's gates), exactly and
in linear time whatever the text holds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor import files, strict_json

#: strings that look like JSON's own syntax: quotes, escapes and brackets inside them are text, not structure
tricky_text = st.text(alphabet='[]{}"\\,:ab\u00e9\ud7ff', max_size=12)
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=30,
)


@given(value=documents, limit=st.integers(0, 8), ascii_only=st.booleans())
def test_the_text_scan_counts_the_depth_a_parse_would(value: Any, limit: int, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert files.nests_deeper(text.encode(), limit) == strict_json.nested_deeper(value, limit)


@pytest.mark.timeout(60)  # linear: well under a second; the regex it replaced took 30 s for 40 000 escapes
def test_a_string_of_escaped_quotes_never_closed_is_scanned_in_linear_time() -> None:
    escapes = b'\\"' * 2_000_000
    assert files.nests_deeper(b'"' + escapes, 8) is False
    assert files.nests_deeper(b"[" * 300 + b'"' + escapes, 8) is True
    assert files.nests_deeper(b'["' + escapes + b'[[[[[[[[[["]', 8) is False  # inside the string: text


def test_a_document_past_the_parsers_depth_is_refused_before_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: object, **__: object) -> object:
        raise AssertionError("json.loads was reached")

    monkeypatch.setattr(files.json, "loads", never)
    with pytest.raises(ValueError, match=f"nested deeper than {files.PARSE_MAX_DEPTH} levels"):
        files.json_data("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested deeper than 3 levels"):
        files.json_data(b'{"a": [[{"b": 1}]]}', 3)


def test_a_document_within_its_depth_reads_as_json_loads_reads_it() -> None:
    text = '{"a": [[{"b": "[[[[\\"]]"}]], "c": 1.5}'
    assert files.json_data(text, 4) == files.json_data(text.encode(), 4) == json.loads(text)
    assert files.json_data("[" * files.PARSE_MAX_DEPTH + "]" * files.PARSE_MAX_DEPTH) is not None


def test_bytes_are_read_as_utf_8_only() -> None:
    """json.loads takes UTF-16 bytes too, where an escaped quote is two bytes the scan does not read as one, so it
    pairs the quotes wrongly and misses the nesting after them: a run file is UTF-8, and other bytes are refused
    before the parser could follow that nesting into its RecursionError."""
    hidden = '["\\"", ' + "[" * 1000 + "]" * 1000 + ', ""]'
    assert files.nests_deeper(hidden.encode("utf-16"), files.PARSE_MAX_DEPTH) is False  # what the scan misses
    with pytest.raises(ValueError, match="utf-8"):
        files.json_data(hidden.encode("utf-16"))
    with pytest.raises(ValueError, match="nested deeper than"):
        files.json_data(hidden.encode())
