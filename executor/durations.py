"""Durations as runbooks write them: a number of seconds, or `500ms`, `30s`, `10m`, `2h`, `1h30m`."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """Return seconds for a duration; raise ValueError with the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, 10m or 2h, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if text and _PART.sub("", text) == "":
            return sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
        try:
            return parse_duration(float(text))
        except ValueError:
            pass
    raise ValueError(f"expected a duration such as 500ms, 30s, 10m or 2h, got {value!r}")


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


Duration = Annotated[float, BeforeValidator(parse_duration)]
