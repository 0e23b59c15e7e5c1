"""What the stand-in server pretends to compute (TEST DOUBLE): tokens, acceptance length, timing.

Deterministic per prompt, so tests and the demo see stable numbers:

- acceptance length (tokens per verify step, bonus token included, as SGLang's
  `spec_accept_length`): by kind of prompt, shaped like the published Kimi-K2.5-DFlash figures
  (math ~5.4, code ~4.9, chat ~3.7, measured with the chat template and thinking on), or centred
  on the configured mean; and by how predictable the answer is from the prompt, as SPEED-Bench's entropy
  categories are made: a task that copies, repeats, reformats or continues its prompt (`rewrite`, ~6.2:
  low entropy) accepts more than any, open-ended writing (`creative`, ~2.9: a poem, a story, a riddle:
  high entropy) less than chat, whose kinds a mixed prompt gets (sandbox/datasets.py holds such prompts);
  random token ids (bench_serving's random-ids: chat, raw) less, on average, than any kind templated;
  then scaled by how the text reached the model (TEMPLATE_SCALE): a DFlash
  drafter is trained on the target's own templated outputs, so text in the chat template with
  thinking on (`<think>` opened) gets those means, the template with thinking off
  (`<think></think>`) somewhat less, and raw text (no template: /generate's text, bench_serving's
  random ids) clearly less; a per-prompt jitter of +-0.4 from a hash of the prompt; always within
  [1, draft token count]. The template is CHAT_TEMPLATE's, shaped like Kimi K2's
  (`<|im_user|>user<|im_middle|>...<|im_end|><|im_assistant|>assistant<|im_middle|>`), and is
  recognised in any text, so /generate of a prompt templated by the caller counts as templated;
- greedy output: token ids and words deterministic per prompt, the same with and without
  speculative decoding (it is lossless), except with the `broken_drafter` switch: a speculative
  server's output then leaves the baseline's from an early index (BROKEN_FROM, per prompt) on;
- the configuration (`Speculation`): the kind means above are those of a DFLASH block of
  REFERENCE_BLOCK (8) draft tokens; with k tokens the acceptance length grows sublinearly
  (1 + (mean - 1) * (1 - q^(k-1)) / (1 - q^(REFERENCE_BLOCK-1)), q = CHAIN_Q: each further draft
  position is accepted less often), so the acceptance rate (accepted drafts / proposed) falls with k.
  DDTREE (tree verification over the drafter's block, a build with SGLang's pull request #29907)
  verifies a tree of `budget` nodes: +TREE_GAIN per doubling of the budget over REFERENCE_BLOCK on a
  pure-attention target (Kimi K2.6: MLA + MoE), but on a hybrid target (linear-attention/Mamba
  layers, `layer_types` with "linear_attention": Qwen3.6) a budget of HYBRID_COLLAPSE_BUDGET or more
  collapses to 1.0-1.3, as the seeds measured. A drafter may have a profile (DRAFTER_PROFILES, by its
  config's `_name_or_path`): SubSir/Kimi-K2.6-DFlash-tmp-long, trained for long contexts, is worse on
  code and slightly better on chat and open-ended writing;
- decode: a request decodes at `decode_tokens_per_s` when alone; a verify step costs
  `verify_cost` decode steps (1 + VERIFY_COST_PER_TOKEN per verified token: 1.3 for 8 tokens) and
  yields the acceptance length in tokens; with N requests in flight each step slows down by a batching
  factor that grows with the tokens verified per request (BATCH_SLOWDOWN, per REFERENCE_BLOCK tokens),
  so speculative decoding is faster than the baseline alone, its edge shrinks with concurrency, and
  at high concurrency a large draft count or tree budget is slower than the baseline (a crossover),
  as on real GPUs.

The constants of acceptance and cost above (TREE_GAIN, VERIFY_COST_PER_TOKEN, the speculative BATCH_SLOWDOWN,
DRAFTER_PROFILES) are one landscape's, an 8x H200 serving Kimi-K2.6 where tree verification does not pay:
`Physics` holds them, the defaults those constants, and the stand-in's switches (faults.py: `tree_gain`,
`verify_cost_per_token`, `batch_slowdown`, `drafter_profiles`) give another, so that a campaign's search can be
measured on a landscape of another optimum (tests/executor/runbook/search_landscapes/).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_ACCEPT = {"rewrite": 6.2, "math": 5.4, "code": 4.9, "chat": 3.7, "creative": 2.9}
#: how the text reached the model -> factor on the acceptance length (see the module docstring)
TEMPLATE_SCALE = {"thinking": 1.0, "no_thinking": 0.88, "raw": 0.6}
USER_TURN = "<|im_user|>user<|im_middle|>"
ASSISTANT_TURN = "<|im_end|><|im_assistant|>assistant<|im_middle|>"
THINK_ON, THINK_OFF = "<think>", "<think></think>"
BROKEN_FROM = range(2, 10)  # token index where a broken drafter's output first differs, by prompt
JITTER = 0.4
REFERENCE_BLOCK = 8
CHAIN_Q = 0.8
TREE_GAIN = 0.12
HYBRID_COLLAPSE_BUDGET = 32
VERIFY_COST_PER_TOKEN = 0.0375
BATCH_SLOWDOWN = {False: 0.02, True: 0.1}  # per extra request in flight: baseline, speculative (8 tokens)
#: drafter (config.json `_name_or_path`) -> factor on the acceptance length beyond the bonus token, by kind
DRAFTER_PROFILES = {"SubSir/Kimi-K2.6-DFlash-tmp-long": {"math": 1.0, "code": 0.7, "chat": 1.05, "creative": 1.05}}
#: the stand-in's own meta_info field with the `modelled_clock` switch (faults.py): an output's time on the
#: simulation's clock, seconds since its request arrived; the stand-in's bench_serving times a run on it
MODEL_CLOCK_KEY = "standin_model_s"
PREFILL_TOKENS_PER_S = 40_000.0
PREFILL_OVERHEAD_S = 0.005

_MATH = re.compile(r"\d+\s*[-+*/=^]\s*\d+|\b(solve|how many|how much|calculate|sum|total|percent|equation)\b", re.I)
_CODE = re.compile(
    r"\bdef |\bclass |\breturn\b|[{};]\s*$|\bfunction\b|\bimport\b|```|\bwrite a (python )?function\b", re.I | re.M
)


#: a task whose answer the prompt already holds (low entropy), and open-ended writing (high entropy)
_REWRITE = re.compile(
    r"\b(copy|repeat|continue the sequence|convert (this |it )?to|sort alphabetically|translate each|fill in"
    r"|in upper case|one a line|from 1 to)\b",
    re.I,
)
_CREATIVE = re.compile(r"\b(poem|story|imagine|invent|brainstorm|compose|riddle|dialogue|opening line)\b", re.I)


def prompt_kind(text: str) -> str:
    """rewrite | code | math | creative | chat (DEFAULT_ACCEPT's keys): what a DFlash drafter finds easier to
    guess comes first."""
    for kind, pattern in (("rewrite", _REWRITE), ("code", _CODE), ("math", _MATH), ("creative", _CREATIVE)):
        if pattern.search(text):
            return kind
    return "chat"


@functools.lru_cache(maxsize=256)
def _unit(text: str) -> float:
    """A stable number in [0, 1) from the prompt; remembered for the requests in flight, as each of their output
    tokens asks again (a sha256 of a 1024-token prompt per token was most of the stand-in's CPU at concurrency 32)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def apply_chat_template(messages: list[dict[str, object]], thinking: bool) -> str:
    """The prompt text /v1/chat/completions builds: the stand-in's Kimi-K2-shaped template, whose
    `thinking` kwarg (on by default, as Kimi-K2.6's) opens a think block or leaves an empty one."""
    turns = "".join(f"{USER_TURN}{message.get('content', '')}" for message in messages)
    return turns + ASSISTANT_TURN + (THINK_ON if thinking else THINK_OFF)


def template_of(prompt: str) -> str:
    """thinking | no_thinking | raw: how this text reached the model (TEMPLATE_SCALE's keys)."""
    if ASSISTANT_TURN not in prompt:
        return "raw"
    return "no_thinking" if prompt.rstrip().endswith(THINK_OFF) else "thinking"


@dataclass(frozen=True)
class Physics:
    """What acceptance and cost are made of on one GPU and drafter pair (module docstring); the defaults are the
    module's constants, the switches (faults.py) another landscape's."""

    tree_gain: float = TREE_GAIN  # acceptance beyond the bonus token, per doubling of a tree's budget over 8
    verify_cost_per_token: float = VERIFY_COST_PER_TOKEN  # a verify step's cost, in decode steps, per token
    batch_slowdown: float = BATCH_SLOWDOWN[True]  # per extra request in flight, per REFERENCE_BLOCK tokens
    #: drafter (config.json `_name_or_path`) -> kind of prompt -> factor on acceptance beyond the bonus token
    drafter_profiles: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: DRAFTER_PROFILES)


DEFAULT_PHYSICS = Physics()


@dataclass(frozen=True)
class Speculation:
    """What a speculative server's configuration means for acceptance and cost (module docstring)."""

    algorithm: str  # DFLASH | DDTREE
    block: int  # the drafter's block: draft tokens of DFLASH, the tree's depth of DDTREE
    budget: int | None = None  # DDTREE's tree budget (verified nodes)
    drafter: str | None = None  # the drafter's `_name_or_path`, for DRAFTER_PROFILES
    hybrid_target: bool = False  # the target has linear-attention (Mamba/GDN) layers
    physics: Physics = DEFAULT_PHYSICS  # the stand-in's switches (the server's), else the module's constants

    @property
    def verified_tokens(self) -> int:
        """Tokens one verify step checks per request: the block, or the tree's nodes and its root."""
        return self.block if self.budget is None else self.budget + 1

    def accept_length(self, prompt: str, mean: float | None) -> float:
        """The acceptance length this prompt gets; `mean` (the accept_length switch) overrides the
        configuration's shape, as the configured mean."""
        kind = prompt_kind(prompt)
        if mean is not None:
            centre = mean
        else:
            chain = (1 - CHAIN_Q ** (self.block - 1)) / (1 - CHAIN_Q ** (REFERENCE_BLOCK - 1))
            physics = self.physics
            tree = 1.0 if self.budget is None else 1 + physics.tree_gain * math.log2(self.budget / REFERENCE_BLOCK)
            gain = physics.drafter_profiles.get(self.drafter or "", {}).get(kind, 1.0)
            centre = 1 + (DEFAULT_ACCEPT[kind] - 1) * chain * tree * gain
        if self.budget is not None and self.hybrid_target and self.budget >= HYBRID_COLLAPSE_BUDGET:
            return 1.0 + 0.3 * _unit(prompt)  # tree verification on a hybrid Mamba/GDN target collapses
        centre *= TEMPLATE_SCALE[template_of(prompt)]
        value = centre + (2 * _unit(prompt) - 1) * JITTER
        return min(max(value, 1.0), float(self.block))

    @property
    def verify_cost(self) -> float:
        """A verify step's wall time in decode steps of the baseline."""
        return 1 + self.physics.verify_cost_per_token * self.verified_tokens

    @property
    def batch_slowdown(self) -> float:
        """Per extra request in flight: heavier verify steps saturate the GPU sooner."""
        return self.physics.batch_slowdown * self.verified_tokens / REFERENCE_BLOCK


def accept_length(prompt: str, draft_tokens: int, mean: float | None) -> float:
    """The acceptance length this prompt gets with a DFLASH drafter of `draft_tokens` (the block size)."""
    return Speculation("DFLASH", draft_tokens).accept_length(prompt, mean)


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


def step_seconds(decode_tokens_per_s: float, speculation: Speculation | None, in_flight: int) -> float:
    """Wall time of one decode (or verify) step with `in_flight` requests running."""
    cost, slowdown = (
        (1.0, BATCH_SLOWDOWN[False]) if speculation is None else (speculation.verify_cost, speculation.batch_slowdown)
    )
    return cost / decode_tokens_per_s * (1 + slowdown * max(in_flight - 1, 0))


def prefill_seconds(prompt_tokens: int) -> float:
    return PREFILL_OVERHEAD_S + prompt_tokens / PREFILL_TOKENS_PER_S


def prompt_token_ids(text: str) -> list[int]:
    """The stand-in tokenizer's ids of a text: one per word (count_tokens), from a hash of the word."""
    return [1000 + int(_unit(word) * 150000) for word in text.split()] or [1000]


def count_tokens(text: str) -> int:
    """The stand-in's tokenizer: one token per whitespace-separated word (at least one)."""
    return max(1, len(text.split()))


def output_token(prompt: str, index: int, broken_drafter: bool) -> tuple[int, str]:
    """The index-th greedy output token (its id and its word), deterministic per prompt; a broken
    drafter's differs from BROKEN_FROM's index for this prompt on (verification let wrong drafts through)."""
    words = ("the", "answer", "is", "so", "we", "get", "then", "and", "step", "next", "thus", "value")
    shift = int(broken_drafter and index >= divergence_index(prompt))
    token = 1000 + (index * 7919 + len(prompt)) % 150000 + shift
    return token, " " + words[(index + int(_unit(prompt) * 997) + shift) % len(words)]


def divergence_index(prompt: str) -> int:
    """Where a broken drafter's output for this prompt first differs from the greedy output."""
    return BROKEN_FROM[int(_unit(prompt) * len(BROKEN_FROM))]
