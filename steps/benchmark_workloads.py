"""The workloads of a `benchmark` step: which prompts SGLang's serving benchmark sends, and how.

Speculative decoding's gain depends on the text: a drafter guesses chat well and code less so, and random
token ids (the default `random-ids`, nothing to download) worst of all. So a benchmark step may run several
workloads, each a labelled dataset of sglang 0.5.23's client (benchmark/serving.py `--dataset-name`), read
from a local file on the host (`path`: `~` and `$vars` expand there), so that it runs offline:
- `random-ids`: token ids drawn from the seed (`--random-input-len`, `--random-output-len`); no file;
- `speed-bench`: NVIDIA's SPEED-Bench JSONL (`{"category", "turns": [...]}` a line), one run per entropy
  category (`--speed-bench-category low_entropy | mixed | high_entropy`, all three by default): the client
  reports a run as a whole, so a per-category number needs a run per category;
- `custom`: JSONL of `{"conversations": [{"content": ...}, {"content": ...}]}` (the first turn is the prompt);
- `sharegpt`: ShareGPT's JSON from a local path.
Output lengths are the step's `output_len` (`--speed-bench-output-len`, `--sharegpt-output-len`).

The chat template (`chat_template`): the serving-benchmark playbooks require it for every speculative run,
since a drafter is trained on templated text and raw prompts silently lower acceptance. The rule:
- `custom`, `sharegpt`: on when the server speculates (its deploy step's fact `speculative_algorithm` is set),
  off otherwise, unless the workload says (`--apply-chat-template`); a baseline compared with a speculative
  candidate must then say `chat_template: true`, or the comparison is refused as unlike;
- `speed-bench`: always on: the release's loader applies the tokenizer's template itself, flag or not, so
  `chat_template: false` is refused;
- `random-ids`: never: token ids have no text, so `chat_template: true` is refused.
Thinking (`thinking: true | false`): the client templates with the template's defaults and has no flag for
template kwargs, so an explicit setting sends the prompts to the server's chat API instead (`--backend
sglang-oai-chat`, the prompt as one user message) with `--extra-request-body '{"chat_template_kwargs":
{thinking_kwarg: ...}}'`, as eval_acceptance's `api: chat` does; only `custom` and `sharegpt` can (speed-bench's
prompts come templated from the client, random ids have no text). Unset, the template's default holds
(Kimi-K2.6: thinking on).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from executor.runbook.model import Model

Dataset = Literal["random-ids", "speed-bench", "custom", "sharegpt"]
#: serving.py's `--speed-bench-category` choices, in the order a report lists them.
SPEED_BENCH_CATEGORIES = ("low_entropy", "mixed", "high_entropy")
Category = Literal["low_entropy", "mixed", "high_entropy"]
#: The label a benchmark without `workloads` gives its one workload (and facts written before workloads had).
RANDOM_IDS = "random-ids"
_FROM_FILE = ("speed-bench", "custom", "sharegpt")
#: A workload's label: its name in facts, the report's tables and the csv's `workload` column.
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Workload(Model):
    """One workload as a runbook writes it (a benchmark step's `workloads` entry): an unknown key is an error."""

    label: str = Field(pattern=LABEL.pattern)  # its name in facts and the report (no "/")
    dataset: Dataset  # the client's --dataset-name: random-ids, speed-bench, custom or sharegpt
    path: str | None = None  # the file on the host; `~` and `$vars` expand there
    categories: list[Category] | None = None  # speed-bench only; default all three
    chat_template: bool | None = None  # None: the module's rule
    thinking: bool | None = None  # None: the template's default
    thinking_kwarg: str = Field(default="thinking", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # its chat_template_kwargs key

    @field_validator("label", mode="before")
    @classmethod
    def _label(cls, value: Any) -> Any:
        """Says what a label may be, before the pattern's own message (a regex) would: `/` is the report's."""
        if isinstance(value, str) and not LABEL.fullmatch(value):
            slash = "; '/' separates a workload from its SPEED-Bench category in the report" if "/" in value else ""
            raise ValueError(
                f"label {value!r}: 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit{slash}"
            )
        return value

    @field_validator("categories")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError(f"categories: each of {list(SPEED_BENCH_CATEGORIES)} at most once, at least one")
        return value

    @model_validator(mode="after")
    def _fits_the_dataset(self) -> Workload:
        where = f"workload {self.label!r} ({self.dataset})"
        if self.dataset in _FROM_FILE and not self.path:
            raise ValueError(f"{where}: needs `path`, the dataset file on the host (the client reads it offline)")
        if self.dataset == "random-ids" and self.path:
            raise ValueError(f"{where}: random-ids draws token ids from the seed; it reads no `path`")
        if self.categories is not None and self.dataset != "speed-bench":
            raise ValueError(f"{where}: `categories` are SPEED-Bench's entropy categories; only speed-bench has them")
        if self.chat_template is False and self.dataset == "speed-bench":
            raise ValueError(
                f"{where}: the client's speed-bench loader always applies the chat template; chat_template: false "
                "cannot hold"
            )
        if self.chat_template and self.dataset == "random-ids":
            raise ValueError(f"{where}: random ids are token ids, no text: there is no chat template to apply")
        if self.thinking is not None and self.dataset not in ("custom", "sharegpt"):
            raise ValueError(
                f"{where}: `thinking` needs prompts the server templates (custom or sharegpt); "
                f"{self.dataset}'s prompts reach the server {'templated by the client' if self.path else 'as ids'}"
            )
        return self

    def slices(self) -> list[str | None]:
        """The categories it runs one by one (speed-bench), else [None]: one run covers the workload."""
        if self.dataset != "speed-bench":
            return [None]
        return list(self.categories or SPEED_BENCH_CATEGORIES)

    def as_run(self, speculative: bool) -> dict[str, Any]:
        """What it runs against a server that speculates (or not), the chat template decided by the rule: the
        fields of its `WorkloadFacts`, as plain data (`validate` compares them without building a facts model)."""
        template = {"speed-bench": True, "random-ids": False}.get(self.dataset)
        if template is None:
            template = speculative if self.chat_template is None else self.chat_template
        return {
            "label": self.label,
            "dataset": self.dataset,
            "path": self.path,
            "categories": [c for c in self.slices() if c is not None],
            "chat_template": template,
            "thinking": self.thinking,
            "thinking_kwarg": self.thinking_kwarg,
        }

    def resolved(self, speculative: bool) -> WorkloadFacts:
        return WorkloadFacts(**self.as_run(speculative))


@dataclass(frozen=True)
class WorkloadFacts:
    """A workload as it ran (the facts'): the chat template decided. Two benchmarks compare only when theirs are
    equal. A dataclass, not a model: `plan` and `validate` render commands from it and build no facts model
    (the facts models that hold it validate it)."""

    label: str
    dataset: str
    path: str | None
    categories: list[str]  # the speed-bench runs' categories, in order; [] for one run of the whole
    chat_template: bool
    thinking: bool | None
    thinking_kwarg: str = "thinking"

    def template_shown(self) -> str:
        """How the report names its prompts' template."""
        if self.dataset == "random-ids":
            return "none (token ids)"
        if not self.chat_template:
            return "off (raw text)"
        return "on" if self.thinking is None else f"on, thinking {'on' if self.thinking else 'off'} (server)"

    def client_args(self, category: str | None, input_len: int, output_len: int) -> list[str]:
        """serving.py's arguments for the dataset of one run (the path excepted: a host word, added by the step)."""
        args = ["--dataset-name", self.dataset]
        if self.dataset == "random-ids":
            return [*args, "--random-input-len", str(input_len), "--random-output-len", str(output_len)]
        if self.dataset == "speed-bench":
            args += ["--speed-bench-output-len", str(output_len)]
            return [*args, "--speed-bench-category", category] if category else args
        args += ["--sharegpt-output-len", str(output_len)]
        if self.thinking is not None:  # the server templates, with the setting; the client must not too
            body = {"chat_template_kwargs": {self.thinking_kwarg: self.thinking}}
            return [*args, "--extra-request-body", json.dumps(body, separators=(",", ":"))]
        return [*args, "--apply-chat-template"] if self.chat_template else args

    @property
    def backend(self) -> str:
        """serving.py's --backend: /generate, or the chat API where the server applies the template's kwargs."""
        return "sglang-oai-chat" if self.thinking is not None else "sglang"


#: The workload of a benchmark without `workloads`: random ids, as before workloads existed.
DEFAULT = Workload(label=RANDOM_IDS, dataset="random-ids")


def slice_key(workload: str, category: str | None) -> str:
    """How facts, gates and the report name one workload's runs: `speed-bench/low_entropy`, or `random-ids`."""
    return f"{workload}/{category}" if category else workload


def unlike(baseline: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]]) -> str | None:
    """Why two benchmarks' workloads (`Workload.as_run`, or `WorkloadFacts` dumped) cannot be compared, or None
    when they ran the same ones."""
    if list(baseline) == list(candidate):
        return None
    base = {w["label"]: w for w in baseline}
    for workload in candidate:
        other = base.get(workload["label"])
        if other is None:
            return f"the baseline ran no workload {workload['label']!r} (it ran {sorted(base) or 'none'})"
        if other != workload:
            differ = [f"{k} {other.get(k)!r} there, {v!r} here" for k, v in workload.items() if other.get(k) != v]
            template = other.get("chat_template") != workload["chat_template"]
            hint = "; set chat_template: true on the baseline's" if template else ""
            return f"workload {workload['label']!r}: {'; '.join(differ)}{hint}"
    labels = [w["label"] for w in candidate]
    return f"the baseline ran workloads {[w['label'] for w in baseline]}, this step {labels}"
