"""A benchmark's latency SLOs (`slo:`), given to SGLang's serving benchmark as its own `--goodput`, and the
goodput it reports for each run, so that the numbers are SGLang's own accounting.

SGLang 0.5.23 (benchmark/serving.py `_goodput_slo`, benchmark/goodput.py `calculate_goodput`; tests/release/
checks the names against the pinned release): `--goodput KEY:VALUE ...` with KEY in `ttft`, `tpot`, `e2el` and
VALUE a finite float > 0 in milliseconds. A request is good when it succeeded and meets every given SLO (its
TTFT, its TPOT = (latency - TTFT) / (output tokens - 1), 0 for a single token, its end-to-end latency, each at
most the SLO). The result line then holds `goodput_slos_ms`, `request_goodput` (good requests per second of the
run's duration), `slo_attainment` (good requests / requests sent: a failed request counts against it) and
`slo_attainment_by_metric`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from executor.runbook.model import Model

#: the step's parameter -> the client's --goodput KEY (0.5.23 benchmark/goodput.py GOODPUT_SLO_METRICS)
CLIENT_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2el"}
#: the result line's fields the release writes with --goodput (0.5.23 benchmark/goodput.py GoodputMetrics)
RESULT_FIELDS = ("goodput_slos_ms", "request_goodput", "slo_attainment", "slo_attainment_by_metric")
#: No latency SLO reaches a day (ms): a larger one is a typo, and its text would still have to be a float
SLO_MAX_MS = 86_400_000.0

SloMs = Annotated[float, Field(gt=0, le=SLO_MAX_MS, allow_inf_nan=False)]


class Slo(Model):
    """`slo:` of a benchmark step: the latency objectives a request must all meet to count toward goodput (ms)."""

    ttft_ms: SloMs | None = None  # time to first token
    tpot_ms: SloMs | None = None  # time per output token after the first
    e2e_ms: SloMs | None = None  # end-to-end latency of the request

    @model_validator(mode="after")
    def _one_at_least(self) -> Slo:
        if self.client_slos() == {}:
            raise ValueError(f"expected at least one of {', '.join(CLIENT_KEYS)} (milliseconds, above 0)")
        return self

    def client_slos(self) -> dict[str, float]:
        """{client KEY: ms} of the SLOs stated, in the client's order (ttft, tpot, e2el)."""
        return {key: value for name, key in CLIENT_KEYS.items() if (value := getattr(self, name)) is not None}

    def goodput_args(self) -> list[str]:
        """`--goodput ttft:2000 tpot:50`: each value written so that the client's float() reads it back exactly."""
        return ["--goodput", *(f"{key}:{_number(ms)}" for key, ms in self.client_slos().items())]

    def shown(self) -> str:
        """`TTFT <= 2000 ms, TPOT <= 50 ms` for plans and reports."""
        return shown(self.client_slos())


def shown(slos_ms: Mapping[str, float]) -> str:
    """SLOs in words, from the client's keys: `TTFT <= 2000 ms, E2EL <= 30000 ms`."""
    return ", ".join(f"{key.upper()} <= {_number(ms)} ms" for key, ms in slos_ms.items())


def _number(value: float) -> str:
    """A float as its shortest exact text: 2000.0 -> `2000`, 0.1 -> `0.1` (repr round-trips; `:g` would not)."""
    return str(int(value)) if value.is_integer() else repr(value)


def _fraction(value: Any) -> float | None:
    """A share from 0 to 1 as the client writes it, or None when it is none (NaN, a string, 1.5, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= 1 else None


def attainment(line: Mapping[str, Any], asked: Mapping[str, float], unknown: dict[str, str]) -> dict[str, Any]:
    """The run's `slo_attainment` and `slo_attainment_by_metric` from its result line, where the client measured
    against the SLOs `asked` (its `goodput_slos_ms` equal to them); otherwise None and {} with the reason in
    `unknown` (`request_goodput` is read with the run's other rates)."""
    slos = line.get("goodput_slos_ms")
    if slos != dict(asked):
        why = "no goodput_slos_ms" if slos is None else f"goodput_slos_ms {str(slos)[:80]}"
        unknown["slo_attainment"] = f"the run asked --goodput {dict(asked)}; its JSONL line has {why}"
        return {"slo_attainment": None, "slo_attainment_by_metric": {}}
    share = _fraction(line.get("slo_attainment"))
    if share is None:
        unknown["slo_attainment"] = f"bench_serving reported slo_attainment as {str(line.get('slo_attainment'))[:40]}"
    by_metric = line.get("slo_attainment_by_metric")
    by_metric = by_metric if isinstance(by_metric, dict) else {}
    shares = {key: value for key in asked if (value := _fraction(by_metric.get(key))) is not None}
    return {"slo_attainment": share, "slo_attainment_by_metric": shares}
