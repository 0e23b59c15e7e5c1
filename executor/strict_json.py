"""Every JSON that leaves runbook is strict JSON (RFC 8259), which has no NaN or Infinity.

Python's json module writes a non-finite float as the bare word `NaN`, `Infinity` or `-Infinity`, which
no strict reader (JavaScript's `JSON.parse`, Go, jq) accepts: one host that prints `{"tps": NaN}` as its
facts would make `status --json`, an MCP answer or report.json unreadable. So each kind of answer leaves
the program through `dumps` (the `--json` event lines and events.jsonl, `status`/`runs`/`report`/`plan
--json`, report.json, the debug log, and every MCP result: `mcp_server.as_json`): a non-finite float
becomes the string of its name (`"NaN"`, `"Infinity"`, `"-Infinity"`), decided here once, and
`allow_nan=False` proves that nothing else non-finite is left.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: What a non-finite float is written as: the word Python's json would write bare, as a string.
NON_FINITE_NAMES = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def strict(value: Any) -> Any:
    """`value` (JSON-like data) with each non-finite float, at any depth, replaced by its name as a string;
    tuples become lists, as json writes them. Everything else is returned as it is."""
    if isinstance(value, float):
        # repr of the float itself: a subclass's own repr (numpy's `np.float64(nan)`) names no key
        return value if math.isfinite(value) else NON_FINITE_NAMES[repr(float(value)).lower()]
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict(item) for item in value]
    return value


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether JSON-like data nests deeper than `limit`, walked without recursion: data read back from a run
    folder's file may nest past what a recursive walk (`strict`, json.dumps with `indent`, dataclasses.asdict)
    survives, so a reader checks it first and refuses the file instead of ending in a RecursionError."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def dumps(value: Any, **options: Any) -> str:
    """`json.dumps` of `value` made strict (see `strict`), with `allow_nan=False`: the one way a JSON answer
    or file of runbook is written. `options` are json.dumps's (`indent`, `default`, ...)."""
    return json.dumps(strict(value), allow_nan=False, **options)
