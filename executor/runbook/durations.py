"""Durations as runbooks write them: a number of seconds, or `500ms`, `30s`, `10m`, `2h`, `1h30m`.

A duration is a bound, so it must be one: finite, positive and at most `MAX_DURATION_S` (`inf`, `1e999`,
`nan`, `0` and negatives are refused where the runbook is read). A `Delay` (between retries) may be 0.

`Duration` and `Delay`, the pydantic field types, are made on first use (PEP 562): `runbook status` formats
durations (`format_duration`) and must not pay for pydantic's validators at every start.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Any

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+) ?(ms|s|m|h|d)")
_PARTS = re.compile(rf"(?:{_PART.pattern} ?)+")
_NUMBER = re.compile(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.|[-+]?(?:inf|nan|infinity)", re.IGNORECASE)
#: The longest duration a runbook may give (30 days: longer than any download, short enough for any clock).
MAX_DURATION_S = 30 * 86400.0
#: The shortest bound: nothing answers in less (a pause may still be 0).
MIN_DURATION_S = 0.001


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, 10m or 2h, got {_shown(value)}")
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer past any float
            return math.inf
    if isinstance(value, str):
        text = value.strip()
        if _PARTS.fullmatch(text):
            return sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
        if _NUMBER.fullmatch(text):  # ASCII digits only: float() would also take `1_000` and other scripts
            return float(text)
    raise ValueError(f"expected a duration such as 500ms, 30s, 10m or 2h, got {_shown(value)}")


def parse_duration(value: Any, *, zero: bool = False) -> float:
    """Seconds for a duration: finite, positive (or 0 with `zero`), at most MAX_DURATION_S; else ValueError."""
    seconds = _seconds(value)
    if math.isnan(seconds):
        raise ValueError(f"a duration must be a number of seconds, got {_shown(value)}")
    if seconds < 0 or (seconds < MIN_DURATION_S and not (zero and seconds == 0)):
        least = "0 or at least 1ms" if zero else "at least 1ms"
        raise ValueError(f"a duration must be {least}, got {_shown(value)}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be finite and at most 30d, got {_shown(value)}")
    return seconds


def parse_delay(value: Any) -> float:
    """Seconds for a pause (a retry's delay), where 0 means none."""
    return parse_duration(value, zero=True)


def format_duration(seconds: float) -> str:
    """Short human form for consoles and tables."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


if TYPE_CHECKING:  # a type checker sees the floats that the Annotated types below validate
    Duration = float
    Delay = float
else:

    def __getattr__(name: str) -> Any:
        """Duration and Delay: floats that pydantic parses from a runbook's text, and what the JSON Schema
        (`runbook schema`) says they take: seconds, or text the parser reads (never a boolean, which a lax
        float would take). Made once, then kept."""
        parse = {"Duration": parse_duration, "Delay": parse_delay}.get(name)
        if parse is None:  # asked for `__path__` by every `from executor.runbook.durations import ...`
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from pydantic import BeforeValidator, StringConstraints, WithJsonSchema

        text = Annotated[str, StringConstraints(pattern=rf"^\s*(?:{_PARTS.pattern}|{_NUMBER.pattern})\s*$")]
        written = Annotated[float, WithJsonSchema({"type": "number"})] | text
        globals()[name] = annotated = Annotated[float, BeforeValidator(parse, json_schema_input_type=written)]
        return annotated
