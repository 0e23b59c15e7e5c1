"""What the stand-in server pretends to compute (TEST DOUBLE): tokens, acceptance length, timing.

Deterministic per prompt, so tests and the demo see stable numbers:

- acceptance length (tokens per verify step, bonus token included, as SGLang's
  `spec_accept_length`): by kind of prompt, shaped like the published Kimi-K2.5-DFlash figures
  (math ~5.4, code ~4.9, chat ~3.7), or centred on the configured mean; a per-prompt jitter of
  +-0.4 from a hash of the prompt; always within [1, draft token count];
- decode: a request decodes at `decode_tokens_per_s` when alone; a DFLASH verify step costs
  VERIFY_COST decode steps and yields the acceptance length in tokens; with N requests in flight
  each step slows down by a batching factor (more for the heavier verify steps), so speculative
  decoding is faster than the baseline, and its edge shrinks with concurrency, as on real GPUs.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

DEFAULT_ACCEPT = {"math": 5.4, "code": 4.9, "chat": 3.7}
JITTER = 0.4
VERIFY_COST = 1.3
BATCH_SLOWDOWN = {False: 0.02, True: 0.1}  # per extra request in flight: baseline, speculative
PREFILL_TOKENS_PER_S = 40_000.0
PREFILL_OVERHEAD_S = 0.005

_MATH = re.compile(r"\d+\s*[-+*/=^]\s*\d+|\b(solve|how many|how much|calculate|sum|total|percent|equation)\b", re.I)
_CODE = re.compile(
    r"\bdef |\bclass |\breturn\b|[{};]\s*$|\bfunction\b|\bimport\b|```|\bwrite a (python )?function\b", re.I | re.M
)


def prompt_kind(text: str) -> str:
    """math | code | chat: what a DFlash drafter finds easier to guess comes first."""
    if _CODE.search(text):
        return "code"
    if _MATH.search(text):
        return "math"
    return "chat"


def _unit(text: str) -> float:
    """A stable number in [0, 1) from the prompt."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def accept_length(prompt: str, draft_tokens: int, mean: float | None) -> float:
    """The acceptance length this prompt gets with a drafter of `draft_tokens` (the block size)."""
    centre = DEFAULT_ACCEPT[prompt_kind(prompt)] if mean is None else mean
    value = centre + (2 * _unit(prompt) - 1) * JITTER
    return min(max(value, 1.0), float(draft_tokens))


@dataclass(frozen=True)
class SpecCounts:
    """A finished request's speculative-decoding counters, as SGLang's scheduler reports them."""

    verify_ct: int
    num_correct_drafts: int
    num_proposed_drafts: int

    def meta_info(self, completion_tokens: int) -> dict[str, float | int]:
        """The spec_* fields of /generate's meta_info (tokenizer_manager's formulas)."""
        return {
            "spec_accept_rate": self.num_correct_drafts / self.num_proposed_drafts,
            "spec_accept_length": completion_tokens / self.verify_ct,
            "spec_num_correct_drafts": self.num_correct_drafts,
            "spec_num_proposed_drafts": self.num_proposed_drafts,
            "spec_verify_ct": self.verify_ct,
        }


def steps(completion_tokens: int, accept: float) -> list[int]:
    """Tokens produced by each decode (or verify) step, summing to completion_tokens.

    The first token comes from prefill; then each step yields `accept` tokens on average.
    """
    if completion_tokens <= 0:
        return []
    chunks = [1]
    produced, total = 1, 0.0
    while produced < completion_tokens:
        total += accept
        size = max(1, min(completion_tokens - produced, 1 + math.floor(total) - produced))
        chunks.append(size)
        produced += size
    return chunks


def spec_counts(chunks: list[int], draft_tokens: int) -> SpecCounts | None:
    """Counters for a request decoded in these chunks: the first comes from prefill, each later one
    from a verify step (accepted drafts + 1 bonus token). None without any verify step, where
    SGLang reports no spec_* fields."""
    verify_ct = len(chunks) - 1
    if verify_ct <= 0:
        return None
    return SpecCounts(
        verify_ct=verify_ct,
        num_correct_drafts=sum(chunks[1:]) - verify_ct,
        num_proposed_drafts=verify_ct * (draft_tokens - 1),
    )


def step_seconds(decode_tokens_per_s: float, speculative: bool, in_flight: int) -> float:
    """Wall time of one decode (or verify) step with `in_flight` requests running."""
    base = (VERIFY_COST if speculative else 1.0) / decode_tokens_per_s
    return base * (1 + BATCH_SLOWDOWN[speculative] * max(in_flight - 1, 0))


def prefill_seconds(prompt_tokens: int) -> float:
    return PREFILL_OVERHEAD_S + prompt_tokens / PREFILL_TOKENS_PER_S


def count_tokens(text: str) -> int:
    """The stand-in's tokenizer: one token per whitespace-separated word (at least one)."""
    return max(1, len(text.split()))


def token_text(prompt: str, index: int) -> str:
    """The index-th generated token (a word), deterministic per prompt."""
    words = ("the", "answer", "is", "so", "we", "get", "then", "and", "step", "next", "thus", "value")
    return " " + words[(index + int(_unit(prompt) * 997)) % len(words)]
