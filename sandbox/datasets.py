"""Small benchmark datasets in the real formats SGLang 0.5.23's client reads (TEST DOUBLE data).

The release's `sglang.benchmark.serving` reads realistic workloads from a local file
(sglang/benchmark/datasets/): `speed-bench` (NVIDIA's SPEED-Bench throughput JSONL: one JSON object a
line, its prompt the first of `turns`, filtered by `category`, one of low_entropy / mixed / high_entropy),
`custom` (JSONL: `conversations` or `conversation`, a list of turns whose text is under `content` or
`value`; the first turn is the prompt, the second the reference completion) and `sharegpt` (one JSON
array of `{"conversations": [{"from": ..., "value": ...}, ...]}`). These are small deterministic files in
those formats, so that the Hub double can serve them as a dataset repository and the stand-in's
benchmark client can read them as the real one does, offline. The loaders read only the fields written
here (speed_bench.py: `turns` and `category`; custom.py and sharegpt.py: the conversation's first two
turns), besides each turn's speaker (`role`, ShareGPT's `from`) and ShareGPT's `id`, which its file has.

The prompts are short and chosen for what they are: SPEED-Bench's low-entropy category holds tasks
whose answer is predictable from the prompt (copying, reformatting, continuing a sequence), the
high-entropy one open-ended writing, mixed the two together, which is what makes a drafter's
acceptance differ by category on a real server and on the stand-in (simulation.py).
"""

from __future__ import annotations

import json
from typing import Any

#: file names as a dataset repository holds them (the Hub double serves them under these names)
SPEED_BENCH_FILENAME = "throughput_1k.jsonl"
CUSTOM_FILENAME = "custom.jsonl"
SHAREGPT_FILENAME = "sharegpt.json"
#: SPEED-Bench's entropy categories, as `--speed-bench-category` takes them
SPEED_BENCH_CATEGORIES = ("low_entropy", "mixed", "high_entropy")

_LOW_ENTROPY = (
    "Copy this list exactly, one item a line: apple, apple, banana, banana, cherry, cherry, apple, banana.",
    "Continue the sequence for ten more terms: 2, 4, 6, 8, 10, 12, 14, 16, 18, 20.",
    'Convert to YAML: {"name": "box", "size": 1, "tags": ["a", "a", "b"], "size2": 1}.',
    "Repeat the sentence five times: The quick brown fox jumps over the lazy dog.",
    "Write the numbers from 1 to 30 separated by commas: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ...",
    "Rewrite in upper case: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    "Fill in the table for x = 1 to 8: | x | 2x |\n| 1 | 2 |\n| 2 | 4 |\n| 3 | 6 |",
    "Sort alphabetically: delta, alpha, charlie, bravo, echo, alpha, bravo, delta, charlie, echo.",
    "Translate each line to French: Monday. Tuesday. Wednesday. Thursday. Friday. Saturday. Sunday.",
    "List the months of the year in order, one a line: January, February, March, and so on.",
)
_MIXED = (
    "Summarise in two sentences: a cache keeps recent results so that a repeated request is answered fast.",
    "Explain the difference between a list and a tuple in Python, then give one example of each.",
    "Here is a recipe: flour, eggs, milk, butter. Suggest a name for the dish and list the steps.",
    "Answer briefly, then justify: is a tomato a fruit or a vegetable?",
    "Rewrite this email to be more polite: Send me the report today, I asked twice already.",
    "Give three pros and three cons of working from home, as a bulleted list.",
    "Extract the dates from: We met on 3 May, shipped on 9 June and closed the deal on 1 July.",
    "Describe what a hash table is to a ten-year-old, then to an engineer.",
    "Outline a one-day trip to a city of your choice: morning, afternoon and evening.",
    "Correct the grammar and explain each change: He go to school every days and like it.",
)
_HIGH_ENTROPY = (
    "Write a short poem about a lighthouse keeper who collects lost umbrellas.",
    "Invent a board game played with seashells and describe its most surprising rule.",
    "Tell a two-paragraph story in which a violin and a thunderstorm trade places.",
    "Brainstorm ten unusual names for a café on the Moon, each with a one-line pitch.",
    "Imagine a letter from a glacier to the sea. Write it.",
    "Invent a colour that does not exist and describe it to someone who has never seen any.",
    "Compose a riddle whose answer is 'yesterday', then a second whose answer is 'silence'.",
    "Write a dialogue between a retired robot gardener and a curious hedgehog.",
    "Imagine a festival for a town where it rains upward once a year.",
    "Write the opening line of ten different novels, each in a different genre.",
)
_SPEED_BENCH = {"low_entropy": _LOW_ENTROPY, "mixed": _MIXED, "high_entropy": _HIGH_ENTROPY}

#: (prompt, reference completion) pairs for the `custom` and `sharegpt` files
_CONVERSATIONS = (
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Write a Python function that returns the square of a number.", "def square(x):\n    return x * x"),
    ("Solve 12 + 30 and explain the steps.", "12 + 30 = 42: add the tens, then the units."),
    ("Give me a tip for learning a new language.", "Practise a little every day and speak from the start."),
    ("Translate 'good morning' into Spanish.", "'Good morning' in Spanish is 'buenos días'."),
    ("Name three primary colours.", "Red, yellow and blue are the traditional primary colours."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("Suggest a title for a story about a lost key.", "'The Key Nobody Missed' could be a good title."),
)


def speed_bench_rows(category: str | None = None) -> list[dict[str, Any]]:
    """The SPEED-Bench rows (all categories in order, or one), as speed_bench.py reads them."""
    return [
        {"category": name, "turns": [prompt]}
        for name, prompts in _SPEED_BENCH.items()
        if category in (None, name)
        for prompt in prompts
    ]


def _jsonl(rows: list[dict[str, object]]) -> bytes:
    """One compact JSON object a line, UTF-8, as the release's loaders read line by line."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


def speed_bench_jsonl() -> bytes:
    """The SPEED-Bench throughput file (`SPEED_BENCH_FILENAME`)."""
    return _jsonl(speed_bench_rows())


def custom_rows() -> list[dict[str, object]]:
    """The `custom` rows: `conversations` of a user and an assistant turn under `content` (custom.py)."""
    return [
        {"conversations": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}
        for prompt, answer in _CONVERSATIONS
    ]


def custom_jsonl() -> bytes:
    """The `custom` file (`CUSTOM_FILENAME`)."""
    return _jsonl(custom_rows())


def sharegpt_rows() -> list[dict[str, object]]:
    """The ShareGPT conversations: `from` human/gpt and `value`, as ShareGPT_V3's file (sharegpt.py)."""
    return [
        {"id": f"standin-{index}", "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]}
        for index, (p, a) in enumerate(_CONVERSATIONS)
    ]


def sharegpt_json() -> bytes:
    """The ShareGPT file (`SHAREGPT_FILENAME`): one JSON array."""
    return json.dumps(sharegpt_rows(), ensure_ascii=False, indent=1).encode()


#: every file of the dataset repository, by name -> its bytes (what the Hub double serves)
DATASET_FILES = {
    SPEED_BENCH_FILENAME: speed_bench_jsonl,
    CUSTOM_FILENAME: custom_jsonl,
    SHAREGPT_FILENAME: sharegpt_json,
}
