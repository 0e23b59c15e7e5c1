"""TEST DOUBLE of the benchmark client's datasets read from a local file (SGLang 0.5.23,
sglang/benchmark/datasets/speed_bench.py, custom.py, sharegpt.py).

`--dataset-name speed-bench | custom | sharegpt` with `--dataset-path` read, filter, sample and refuse
as the real loaders do, with the same messages (the real client dies of the exception: its traceback's
last line is the message, exit 1), and draw the same rows in the same order for a `--seed` (the real
client seeds Python's `random` with it; these loaders draw from a `random.Random(seed)`):

- speed-bench: one JSON object a line, the first of `turns` its prompt, `--speed-bench-category` keeping
  one entropy category; ValueError without `--dataset-path` or without a row (for that category); the
  prompt ALWAYS in the model's chat template (speed_bench.py applies it whatever `--apply-chat-template`
  says, falling back to the raw text only where the tokenizer has none); `--speed-bench-output-len` tokens
  out; `--num-prompts` sampled (random.sample), or the rows repeated and shuffled when it asks for more;
- custom (JSONL: `conversations`/`conversation`, text under `content` or `value`; bad JSON lines skipped,
  FileNotFoundError "Dataset not found at PATH") and sharegpt (one JSON array, text under `value`):
  the first two turns are the prompt and its completion, shuffled, `--prompt-suffix` appended, the chat
  template applied only with `--apply-chat-template`, a prompt or completion under 2 tokens or beyond
  `--sharegpt-context-len` dropped, the completion's length unless `--sharegpt-output-len` (under 4:
  "output_len too small").

The chat template is the stand-in model's (simulation.apply_chat_template, thinking on as Kimi-K2.6's
default), where the real client calls the model's tokenizer; the tokenizer is the stand-in's (one token
per word, simulation.count_tokens). Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import random

from . import simulation

#: sglang/benchmark/datasets/common.py
ASSISTANT_SUFFIX = "Assistant:"
#: the datasets read here, from `--dataset-path`
LOCAL = ("speed-bench", "custom", "sharegpt")
#: what one request is: (prompt, prompt_len, output_len), as bench_client.sample_requests' rows
Row = tuple[str, int, int]


def load(args: argparse.Namespace, rng: random.Random) -> list[Row]:
    """The rows of `--dataset-name` (one of LOCAL), as the real client's get_dataset returns them."""
    loaders = {"speed-bench": speed_bench, "custom": custom, "sharegpt": sharegpt}
    return loaders[args.dataset_name](args, rng)


def templated(text: str) -> str:
    """tokenizer.apply_chat_template of one user turn with add_generation_prompt, as text."""
    return simulation.apply_chat_template([{"role": "user", "content": text}], thinking=True)


def speed_bench(args: argparse.Namespace, rng: random.Random) -> list[Row]:
    """SpeedBenchDataset.from_args + load: the first turn of each row of the category, templated."""
    if not args.dataset_path:
        raise ValueError(
            "--dataset-path must point to the SPEED-Bench JSONL file (run prepare_speed_bench.sh to generate it)."
        )
    category = args.speed_bench_category or None
    prompts = []
    with open(args.dataset_path, encoding="utf-8") as file:
        for line in file:
            row = json.loads(line)
            if category and row.get("category") != category:
                continue
            turns = row.get("turns", [])
            if turns:
                prompts.append(turns[0])
    if not prompts:
        raise ValueError(f"No rows found in {args.dataset_path}" + (f" for category={category}" if category else ""))
    output_len: int = args.speed_bench_output_len
    wanted: int = args.num_prompts
    rows = [(prompt, simulation.count_tokens(prompt), output_len) for prompt in map(templated, prompts)]
    if wanted <= len(rows):
        return rng.sample(rows, wanted)
    rows = (rows * (wanted // len(rows) + 1))[:wanted]
    rng.shuffle(rows)
    return rows


def custom(args: argparse.Namespace, rng: random.Random) -> list[Row]:
    """sample_custom_requests: JSONL conversations, text under `content` or `value`."""
    _check_text_prompt(args)
    if not os.path.isfile(args.dataset_path):
        raise FileNotFoundError(f"Dataset not found at {args.dataset_path}")
    dataset = []
    with open(args.dataset_path, encoding="utf-8") as file:
        for line in file:
            if line.strip():
                try:
                    dataset.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    pairs = []
    for data in dataset:
        turns = data.get("conversations", data.get("conversation", []))
        if len(turns) >= 2:
            user, assistant = (turn.get("content", turn.get("value", "")) for turn in turns[:2])
            pairs.append((user, assistant))
    return _sample(pairs, args, rng)


def sharegpt(args: argparse.Namespace, rng: random.Random) -> list[Row]:
    """sample_sharegpt_requests from a local file (bench_client refuses an empty path: it would download)."""
    _check_text_prompt(args)
    with open(args.dataset_path) as file:
        dataset = json.load(file)
    conversations = [d.get("conversations", d.get("conversation", [])) for d in dataset]
    pairs = [(turns[0]["value"], turns[1]["value"]) for turns in conversations if len(turns) >= 2]
    return _sample(pairs, args, rng)


def _check_text_prompt(args: argparse.Namespace) -> None:
    """from_args' `assert not tokenize_prompt` (a bare AssertionError) and the output length's floor."""
    if args.tokenize_prompt:
        raise AssertionError
    if args.sharegpt_output_len is not None and args.sharegpt_output_len < 4:
        raise ValueError("output_len too small")


def _sample(pairs: list[tuple[str, str]], args: argparse.Namespace, rng: random.Random) -> list[Row]:
    """The part custom and sharegpt share: shuffle, suffix, template, count and prune."""
    rng.shuffle(pairs)
    rows: list[Row] = []
    for prompt, completion in pairs:
        if len(rows) == args.num_prompts:
            break
        if args.prompt_suffix:
            prompt = prompt.removesuffix(ASSISTANT_SUFFIX) + args.prompt_suffix + ASSISTANT_SUFFIX
        if args.apply_chat_template:
            prompt = templated(prompt)
        prompt_len = simulation.count_tokens(prompt)
        fixed = args.sharegpt_output_len
        output_len = simulation.count_tokens(completion) if fixed is None else fixed
        if prompt_len < 2 or output_len < 2:
            continue
        if args.sharegpt_context_len and prompt_len + output_len > args.sharegpt_context_len:
            continue
        rows.append((prompt, prompt_len, output_len))
    print(f"#Input tokens: {sum(row[1] for row in rows)}")
    print(f"#Output tokens: {sum(row[2] for row in rows)}")
    return rows
