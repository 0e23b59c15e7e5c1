"""Secret values are redacted by value, not by key name, from everything the run writes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from executor.render import MASK


class Redactor:
    """Replaces every occurrence of any secret value with `***`, longest value first."""

    def __init__(self, values: Iterable[str]) -> None:
        # also as it appears inside a JSON string (a step printing JSON escapes quotes and backslashes)
        forms = {
            form for v in values if v for form in (v, json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1])
        }
        distinct = sorted(forms, key=len, reverse=True)
        self._bytes = [v.encode("utf-8") for v in distinct]
        self._pattern = re.compile("|".join(re.escape(v) for v in distinct)) if distinct else None

    def text(self, value: str) -> str:
        return self._pattern.sub(MASK, value) if self._pattern else value

    def data(self, value: bytes) -> bytes:
        for secret in self._bytes:
            value = value.replace(secret, MASK.encode())
        return value

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
