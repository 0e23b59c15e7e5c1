"""The stand-in's benchmark client reads SGLang's realistic datasets from a local file (speed-bench, custom,
sharegpt: sandbox/sglang_standin/bench_datasets.py), as the real release's loaders read them and refuse
them, and the stand-in server's acceptance follows the prompt's content: SPEED-Bench's entropy category, the
chat template (sandbox/sglang_standin/simulation.py). The sample files are sandbox/datasets.py's.

The real loaders (the test venv's SGLang 0.5.23 files) run here on a stand-in tokenizer, their imports of
transformers and of the client's utilities stubbed (the release's runtime needs torch): the stand-in must
draw the same rows, in the same order, for a seed, and fail with the same exception and message.
In-process: the stand-in server on a thread (test_standin_stable.standin), its client called as a function."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import random
import re
import statistics
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import datasets
from sandbox.sglang_standin import bench_client, bench_datasets, launch_args, simulation
from sandbox.sshd import free_port
from tests.sandbox.test_sglang_standin import real_result_fields
from tests.sandbox.test_standin_stable import SGLANG, standin
from tests.sandbox.test_standin_stable import models as models  # the fixture: a Kimi target and a DFlash drafter

SHIPPED_SETS = Path(__file__).resolve().parents[2] / "steps" / "prompt_sets"


class Tokenizer:
    """A tokenizer for the real loaders that is the stand-in's: a token per word (with its trailing spaces, so
    that decode gives the text back), the stand-in model's chat template."""

    bos_token = None

    def encode(self, text: str) -> list[str]:
        return re.findall(r"\S+\s*", text)

    def decode(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def apply_chat_template(self, messages: list[dict[str, object]], *, tokenize: bool, **_: Any) -> Any:
        text = simulation.apply_chat_template(messages, thinking=True)
        return self.encode(text) if tokenize else text


def _stubbed(name: str) -> bool:
    return name.split(".")[0] in ("sglang", "transformers")


@pytest.fixture
def real() -> Iterator[dict[str, types.ModuleType]]:
    """The release's speed_bench, custom and sharegpt modules, imported from its files with their heavy
    imports stubbed; sys.modules' sglang and transformers entries as they were afterwards."""
    assert SGLANG is not None, "run python -m sandbox.prepare"
    saved = {name: module for name, module in sys.modules.items() if _stubbed(name)}
    for name, folder in (("sglang", SGLANG), ("sglang.benchmark", SGLANG / "benchmark")):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__path__ = [str(folder)]
    sys.modules["sglang.benchmark.datasets"] = types.ModuleType("sglang.benchmark.datasets")
    sys.modules["sglang.benchmark.datasets"].__path__ = [str(SGLANG / "benchmark" / "datasets")]
    utils = types.ModuleType("sglang.benchmark.utils")
    utils.remove_suffix = lambda text, suffix: text.removesuffix(suffix)  # type: ignore[attr-defined]
    utils.is_file_valid_json = lambda path: Path(path).is_file()  # type: ignore[attr-defined]
    utils.download_and_cache_hf_file = None  # type: ignore[attr-defined]  # a local path never downloads
    transformers = types.ModuleType("transformers")
    transformers.PreTrainedTokenizerBase = Tokenizer  # type: ignore[attr-defined]
    sys.modules |= {"sglang.benchmark.utils": utils, "transformers": transformers}
    try:
        yield {
            n: importlib.import_module(f"sglang.benchmark.datasets.{n}") for n in ("speed_bench", "custom", "sharegpt")
        }
    finally:
        for name in [name for name in sys.modules if _stubbed(name)]:
            del sys.modules[name]
        sys.modules |= saved


def client_args(*argv: str) -> argparse.Namespace:
    assert SGLANG is not None
    return bench_client.build_parser(SGLANG).parse_args(["--disable-tqdm", "--seed", "7", *argv])


def files(folder: Path) -> dict[str, Path]:
    """sandbox/datasets.py's files, written as a dataset repository's download holds them."""
    for name, content in datasets.DATASET_FILES.items():
        (folder / name).write_bytes(content())
    return {name: folder / name for name in datasets.DATASET_FILES}


def real_rows(module: types.ModuleType, args: argparse.Namespace) -> list[tuple[Any, int, int]]:
    """What the real client's get_dataset returns, after its `random.seed(args.seed)`."""
    name = {"speed-bench": "SpeedBenchDataset", "custom": "CustomDataset", "sharegpt": "ShareGPTDataset"}
    random.seed(args.seed)
    with contextlib.redirect_stdout(io.StringIO()):
        rows = getattr(module, name[args.dataset_name]).from_args(args).load(Tokenizer())
    return [(row.prompt, row.prompt_len, row.output_len) for row in rows]


def standin_rows(args: argparse.Namespace) -> list[tuple[Any, int, int]]:
    with contextlib.redirect_stdout(io.StringIO()):
        return bench_datasets.load(args, random.Random(args.seed))


@pytest.mark.parametrize(
    "argv",
    [
        ("--dataset-name", "speed-bench", "--num-prompts", "12"),  # more than a category: repeated and shuffled
        ("--dataset-name", "speed-bench", "--num-prompts", "50"),  # more than the file: repeated and shuffled
        ("--dataset-name", "speed-bench", "--speed-bench-category", "high_entropy", "--num-prompts", "4"),
        ("--dataset-name", "speed-bench", "--speed-bench-category", "low_entropy", "--speed-bench-output-len", "64"),
        ("--dataset-name", "custom", "--num-prompts", "5"),
        ("--dataset-name", "custom", "--apply-chat-template", "--sharegpt-output-len", "16"),
        ("--dataset-name", "custom", "--prompt-suffix", " Be brief.", "--sharegpt-context-len", "22"),
        ("--dataset-name", "sharegpt", "--num-prompts", "6", "--apply-chat-template"),
    ],
)
def test_the_client_reads_each_format_as_the_real_loaders_do(
    real: dict[str, types.ModuleType], tmp_path: Path, argv: tuple[str, ...]
) -> None:
    paths = files(tmp_path)
    name = {"speed-bench": datasets.SPEED_BENCH_FILENAME, "custom": datasets.CUSTOM_FILENAME}.get(argv[1])
    args = client_args(*argv, "--dataset-path", str(paths[name or datasets.SHAREGPT_FILENAME]))
    module = real[argv[1].replace("-", "_")]
    expected = real_rows(module, args)
    assert expected and standin_rows(args) == expected
    if argv[1] == "speed-bench":  # SPEED-Bench's prompts are always in the chat template (speed_bench.py)
        assert all(simulation.template_of(prompt) == "thinking" for prompt, _, _ in expected)


def refusal(call: Callable[[], object]) -> BaseException:
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(Exception) as caught:
        call()
    return caught.value


@pytest.mark.parametrize(
    "case",
    ["speed-bench without a path", "a category without rows", "an empty file", "custom, no file", "sharegpt, no file",
     "an output length under 4", "tokenized prompts"],
)  # fmt: skip
def test_the_client_refuses_what_the_real_one_refuses_with_its_words(
    real: dict[str, types.ModuleType], tmp_path: Path, case: str
) -> None:
    low_only = tmp_path / "low.jsonl"
    low_only.write_text("".join(json.dumps(row) + "\n" for row in datasets.speed_bench_rows("low_entropy")))
    (empty := tmp_path / "empty.jsonl").write_text("")
    argv = {
        "speed-bench without a path": ("--dataset-name", "speed-bench"),
        "a category without rows": ("--dataset-name", "speed-bench", "--dataset-path", str(low_only),
                                    "--speed-bench-category", "mixed"),
        "an empty file": ("--dataset-name", "speed-bench", "--dataset-path", str(empty)),
        "custom, no file": ("--dataset-name", "custom", "--dataset-path", str(tmp_path / "missing.jsonl")),
        "sharegpt, no file": ("--dataset-name", "sharegpt", "--dataset-path", str(tmp_path / "missing.json")),
        "an output length under 4": ("--dataset-name", "custom", "--dataset-path", str(empty),
                                     "--sharegpt-output-len", "3"),
        "tokenized prompts": ("--dataset-name", "sharegpt", "--dataset-path", str(empty), "--tokenize-prompt"),
    }[case]  # fmt: skip
    args = client_args(*argv)
    module = real[args.dataset_name.replace("-", "_")]
    expected = refusal(lambda: real_rows(module, args))
    got = refusal(lambda: standin_rows(args))
    assert (type(got), str(got)) == (type(expected), str(expected))
    assert str(got) or isinstance(got, AssertionError)


def run_client(url: str, out: Path, *argv: str) -> dict[str, Any]:
    """The stand-in's bench_serving against `url`; the JSONL line it appended."""
    args = client_args("--backend", "sglang", "--base-url", url, "--output-file", str(out), *argv)
    with contextlib.redirect_stdout(io.StringIO()):
        assert bench_client.run(args) == 0
    line: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return line


@pytest.fixture
def serve(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Callable[[], contextlib.AbstractContextManager[str]]:
    """A fresh DFLASH stand-in on a thread (its /server_info average is the run's alone)."""
    monkeypatch.setattr(launch_args, "sglang_dir", lambda: SGLANG)
    argv = ["--model-path", str(models["target"]), "--tp-size", "8", "--trust-remote-code", "--host", "127.0.0.1",
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(models["draft"])]  # fmt: skip
    return lambda: standin([*argv, "--port", str(free_port())], {"startup_s": 0, "decode_tokens_per_s": 4000.0})


def test_acceptance_differs_by_speed_bench_category_and_random_ids_accept_least(
    serve: Callable[[], contextlib.AbstractContextManager[str]], tmp_path: Path
) -> None:
    paths = files(tmp_path)
    out, accept = tmp_path / "bench.jsonl", {}
    for category in datasets.SPEED_BENCH_CATEGORIES:
        with serve() as url:
            line = run_client(url, out, "--dataset-name", "speed-bench", "--speed-bench-category", category,
                              "--dataset-path", str(paths[datasets.SPEED_BENCH_FILENAME]), "--num-prompts", "10",
                              "--speed-bench-output-len", "48")  # fmt: skip
        assert list(line) == real_result_fields() and line["dataset_name"] == "speed-bench"
        assert line["completed"] == 10 and line["total_output_tokens"] == 10 * 48
        accept[category] = line["accept_length"]
    with serve() as url:
        line = run_client(url, out, "--dataset-name", "random-ids", "--num-prompts", "10", "--random-input-len",
                          "32", "--random-output-len", "48", "--random-range-ratio", "1.0")  # fmt: skip
    assert accept["low_entropy"] > accept["mixed"] + 1.5  # measured: 5.8, 3.7, 2.9; random ids 2.1
    assert accept["mixed"] > accept["high_entropy"] + 0.5
    assert accept["high_entropy"] > line["accept_length"] + 0.3, (accept, line["accept_length"])


def test_the_chat_template_raises_acceptance_and_the_default_file_name_is_the_real_ones(
    serve: Callable[[], contextlib.AbstractContextManager[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = files(tmp_path)
    common = ("--num-prompts", "8", "--sharegpt-output-len", "48")
    accept = {}
    for dataset in ("custom", "sharegpt"):
        path = paths[datasets.CUSTOM_FILENAME if dataset == "custom" else datasets.SHAREGPT_FILENAME]
        for templated in (False, True):
            with serve() as url:
                extra = ("--apply-chat-template",) if templated else ()
                line = run_client(url, tmp_path / "b.jsonl", "--dataset-name", dataset, "--dataset-path", str(path),
                                  *common, *extra)  # fmt: skip
            assert line["completed"] == 8 and line["dataset_name"] == dataset
            accept[dataset, templated] = line["accept_length"]
    assert accept["custom", True] > accept["custom", False] * 1.4
    assert accept["sharegpt", True] > accept["sharegpt", False] * 1.4
    monkeypatch.chdir(tmp_path)  # no --output-file: serving.py's name for a dataset other than random
    path = paths[datasets.CUSTOM_FILENAME]
    args = client_args("--backend", "sglang", "--dataset-name", "custom", "--dataset-path", str(path), *common)
    with serve() as url, contextlib.redirect_stdout(io.StringIO()):
        args.base_url = url
        assert bench_client.run(args) == 0
    assert [p.name.split("_", 2)[2] for p in tmp_path.glob("sglang_*.jsonl")] == ["8_custom.jsonl"]


def test_a_drafter_can_win_on_chat_and_lose_on_code_and_random_ids_and_the_prompt_sets_keep_their_kinds() -> None:
    """The new kinds (rewrite, creative) leave the shipped prompt sets and random ids as they were: no prompt of
    them is either, so their acceptance is today's."""
    for path in SHIPPED_SETS.glob("*.jsonl"):
        kinds = {simulation.prompt_kind(json.loads(line)["prompt"]) for line in path.read_text().splitlines()}
        assert kinds <= {"math", "code", "chat"}, path
    args = argparse.Namespace(num_prompts=4, random_input_len=64, random_output_len=8, random_range_ratio=1.0,
                              tokenize_prompt=False)  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        random_ids = [row[0] for row in bench_client.sample_requests(args, random.Random(1))]
    assert {(simulation.prompt_kind(p), simulation.template_of(p)) for p in random_ids} == {("chat", "raw")}
    by_kind = {
        kind: [bench_datasets.templated(row["turns"][0]) for row in datasets.speed_bench_rows(category)]
        for kind, category in (("low", "low_entropy"), ("high", "high_entropy"))
    }
    zlab = simulation.Speculation("DFLASH", 8)
    tmp_long = simulation.Speculation("DFLASH", 8, drafter="SubSir/Kimi-K2.6-DFlash-tmp-long")
    code = [bench_datasets.templated(f"Write a python function that sorts a list, case {i}.") for i in range(8)]

    def mean(speculation: simulation.Speculation, prompts: list[str]) -> float:
        return statistics.mean(speculation.accept_length(p, None) for p in prompts)

    assert mean(tmp_long, by_kind["high"]) > mean(zlab, by_kind["high"])
    assert mean(tmp_long, code) < mean(zlab, code) - 0.8
