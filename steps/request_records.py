"""Per-request records, one JSON object a line, in the run folder: what a notebook or another benchmark tool reads
without our code (README "Results others can use").

- the benchmark's: `sglang.bench_serving --output-details` (SGLang 0.5.23, benchmark/serving.py `result_details`)
  adds to its JSONL line one list per field, one item per request in the order sent: `input_lens`,
  `output_lens`, `ttfts` (s), `itls` (s, one per streamed chunk after the first), `generated_texts`, `errors`.
  `bench_records` turns them into one object per request, with the run's step, label, workload (and
  SPEED-Bench category), concurrency, repeat and seed, times in ms, and the generated text cut to TEXT_MAX_CHARS
  (its length kept whole: a record stays small). A run asks for the details only where they stay well
  within what the controller keeps of a command's output (`asks_details`: DETAILS_MAX_TOKENS);
- the acceptance eval's: its per-request facts (SGLang's `meta_info` as hostprograms/eval_acceptance.py
  reports it: prompt and completion tokens, spec_verify_ct, accept length, finish reason, error), without the
  reference's output token ids.

Each step writes its own file afresh (`RecordsFile`: a step run again starts it over), through the run's redactor,
under `hosts/HOST/requests/` of the run folder; the report's provenance names it (`requests`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from executor import durable
from executor.files import json_data
from executor.redact import Redactor

#: The folder of a host's records, inside its folder of the run folder (`StepContext.output_dir`).
FOLDER = "requests"
#: A run asks bench_serving for per-request details only up to this many output tokens asked (prompts x
#: output_len): its line then carries one inter-token latency (~20 bytes of JSON) and ~5 bytes of text per token,
#: ~13 MB at most, well within the 32 MiB the controller keeps of a command's output (OUTPUT_KEEP_BYTES, which
#: would cut a longer line in two and fail the run). A larger run's requests have no records (its command, in the
#: provenance, has no `--output-details`).
DETAILS_MAX_TOKENS = 500_000
#: The characters of a request's generated text a record keeps (`generated_chars` is its whole length).
TEXT_MAX_CHARS = 1000
#: The longest error text a record keeps (a server's traceback can be long).
ERROR_MAX_CHARS = 1000
#: A step name as a file name: characters outside these become `_`; a long or changed one gets a hash.
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+-]")
_NAME_MAX = 100
#: The per-request lists of `--output-details`, as the real client names them.
DETAIL_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def asks_details(num_prompts: int, output_len: int) -> bool:
    """Whether a run of `num_prompts` prompts of `output_len` tokens asks for per-request details."""
    return num_prompts * output_len <= DETAILS_MAX_TOKENS


def file_name(step: str) -> str:
    """The records file of `step` (a matrix instance's name holds `[`, `/` may be in an axis value)."""
    safe = _UNSAFE.sub("_", step).lstrip(".") or "_"
    if safe != step or len(safe) > _NAME_MAX:
        safe = f"{safe[:_NAME_MAX]}-{hashlib.sha256(step.encode()).hexdigest()[:8]}"
    return f"{safe}.jsonl"


def _ms(seconds: Any) -> float | None:
    """Seconds as ms; None for what is no finite number (Python's json reads NaN)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return None
    return round(seconds * 1000, 6)


def _count(value: Any) -> int | None:
    """A token count as a record keeps it: a whole number from 0, else None (Python's json reads NaN and 1e999,
    which no strict JSON writes: `RecordsFile.append` would refuse the run's records)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _cut(text: Any, most: int) -> str | None:
    return text[:most] if isinstance(text, str) else None


def bench_records(line: str, about: dict[str, Any]) -> list[dict[str, Any]] | None:
    """One record per request of a bench_serving JSONL line with `--output-details`: `about` (step, label,
    workload, concurrency, repeat, seed) then the request's index and metrics; None when the line has no
    details (no `--output-details`, or another release) or they are not lists of one length."""
    try:
        result = json_data(line)
    except ValueError:
        return None
    found = [result.get(name) for name in DETAIL_FIELDS] if isinstance(result, dict) else []
    lists = [each for each in found if isinstance(each, list)]
    if not lists or len(lists) < len(DETAIL_FIELDS) or len({len(each) for each in lists}) != 1:
        return None
    records = []
    for index, (input_len, output_len, ttft, itl, text, error) in enumerate(zip(*lists, strict=True)):
        records.append(
            about
            | {
                "index": index,
                "input_len": _count(input_len),
                "output_len": _count(output_len),
                "ttft_ms": _ms(ttft),
                "itl_ms": [_ms(gap) for gap in itl] if isinstance(itl, list) else None,
                "error": _cut(error, ERROR_MAX_CHARS) or None,
                "generated_chars": len(text) if isinstance(text, str) else None,
                "generated_text": _cut(text, TEXT_MAX_CHARS),
            }
        )
    return records


def eval_records(about: dict[str, Any], requests: Iterable[Any]) -> list[dict[str, Any]]:
    """One record per request of an acceptance eval (its RequestFacts), without the output token ids."""
    return [
        about | {"index": index} | request.model_dump(exclude={"output_ids"}) for index, request in enumerate(requests)
    ]


class RecordsFile:
    """A step's records file, started afresh and appended to run by run; every write goes through the run's
    redactor, and a failing disk is a DurableWriteError (it stops the run, as a report's write does)."""

    def __init__(self, host_dir: Path, step: str, redactor: Redactor) -> None:
        self.folder = host_dir / FOLDER
        self.path = self.folder / file_name(step)
        self.redactor = redactor
        self.records = 0
        self._write(b"", os.O_TRUNC)

    def relative_to(self, run_dir: Path) -> str:
        return os.path.relpath(self.path, run_dir)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        lines = [json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n" for record in records]
        # a lone surrogate (a host's `"\ud800"` in generated text) as JSON's own escape of it, which reads back the same
        self._write(self.redactor.text("".join(lines)).encode("utf-8", "backslashreplace"), os.O_APPEND)
        self.records += len(lines)

    def _write(self, data: bytes, how: int) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | how, 0o644)
            try:
                durable.write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise durable.failed(exc, self.folder, f"the per-request records {self.path.name}") from None
