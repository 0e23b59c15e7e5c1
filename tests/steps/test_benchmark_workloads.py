"""A benchmark step's workloads: the real client's flags per dataset, one run per SPEED-Bench category, the
chat-template rule, refusals of bad parameters and of unlike comparisons (at validate and at run time), and
the report's speedup and acceptance per workload and category, built offline from facts."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from executor.consoles import table_parts
from executor.faces.cli import main
from executor.runbook.campaign import AxisValue
from executor.runbook.planner import PlanContext
from sandbox.prepare import site_packages
from steps.benchmark import BenchmarkStep
from steps.benchmark_report import build_report, markdown, md_text, speedup
from steps.benchmark_workloads import Workload
from steps.server_metrics import ExactAcceptance, RunAcceptance
from tests.steps.test_benchmark import standin  # noqa: F401  (a fixture)
from tests.steps.test_benchmark_report import ACCEPTANCE, bench_run, provenance_of, side_of

SPEED = {"label": "speed", "dataset": "speed-bench", "path": "$datasets/speed/throughput_1k.jsonl"}
CHAT = {"label": "chat", "dataset": "custom", "path": "~/data/chat.jsonl"}
RANDOM = {"label": "random-ids", "dataset": "random-ids"}
SPEED_HERE = SPEED | {"path": "/data/speed/throughput_1k.jsonl"}  # in a runbook without the var


def step(*workloads: dict[str, Any], **params: Any) -> BenchmarkStep:
    listed = [Workload.model_validate(w) for w in workloads]
    return BenchmarkStep(id="b", server="d", concurrencies=[4], repeats=1, workloads=listed, **params)


def real_parser() -> tuple[set[str], set[str]]:
    """The flags sglang 0.5.23's benchmark/serving.py declares, and its --dataset-name choices."""
    site = site_packages()
    assert site is not None, "run `python3 -m sandbox.prepare` first"
    text = (site / "sglang" / "benchmark" / "serving.py").read_text()
    flags = set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', text))
    choices = re.search(r'"--dataset-name",.*?choices=\[(.*?)\]', text, re.S)
    assert choices is not None
    return flags, set(re.findall(r'"([a-z0-9-]+)"', choices.group(1)))


def test_each_dataset_sends_the_real_clients_flags_one_speed_bench_run_per_category() -> None:
    chat_off = CHAT | {"label": "chat_nothink", "thinking": False}
    planned = step(SPEED, CHAT, chat_off, RANDOM, output_len=64).plan(PlanContext("box", {"datasets": "/d"}))
    names = [name for name, _ in planned]
    assert names == [
        "speed/low_entropy, concurrency 4",
        "speed/mixed, concurrency 4",
        "speed/high_entropy, concurrency 4",
        "chat, concurrency 4",
        "chat_nothink, concurrency 4",
        "random-ids, concurrency 4",
    ]
    # each script's last client command is the measured run's (its warm-up's comes first: steps/benchmark.py `metered`)
    commands = [[line for line in script.splitlines() if '-m "$entry"' in line][-1] for _, script in planned]
    assert [f"--seed {seed} " in command for seed, command in enumerate(commands, start=1)] == [True] * 6
    low = commands[0]
    assert "--dataset-name speed-bench --speed-bench-output-len 64 --speed-bench-category low_entropy" in low
    assert '--dataset-path "${datasets:?runbook var datasets is unset or empty}"/speed/throughput_1k.jsonl' in low
    assert "--dataset-name custom --sharegpt-output-len 64 --num-prompts" in commands[3]  # plan: not speculative
    assert "--apply-chat-template" not in commands[3]
    assert '--dataset-path "${HOME:?is not set}"/data/chat.jsonl' in commands[3]
    assert "--backend sglang-oai-chat " in commands[4] and "--apply-chat-template" not in commands[4]
    assert """--extra-request-body '{"chat_template_kwargs":{"thinking":false}}'""" in commands[4]
    assert (
        "--dataset-name random-ids --random-input-len 1024 --random-output-len 64 --random-range-ratio 1.0"
        in (commands[5])
    )
    assert "--dataset-path" not in commands[5]
    flags, datasets = real_parser()
    for command in commands:
        words = shlex.split(command)
        used = {word for word in words if word.startswith("--")}
        assert used <= flags, used - flags
        assert words[words.index("--dataset-name") + 1] in datasets


def test_the_chat_template_rule() -> None:
    """custom and sharegpt: on for a speculative server unless the workload says; speed-bench: always (the
    client's loader templates); random ids: never (no text)."""
    custom = Workload(label="c", dataset="custom", path="/c.jsonl")
    assert [custom.resolved(s).chat_template for s in (True, False)] == [True, False]
    assert Workload(label="c", dataset="sharegpt", path="/s", chat_template=True).resolved(False).chat_template
    assert not Workload(label="c", dataset="custom", path="/c", chat_template=False).resolved(True).chat_template
    assert Workload(label="s", dataset="speed-bench", path="/s").resolved(False).chat_template
    assert not Workload(label="r", dataset="random-ids").resolved(True).chat_template
    speculative = custom.resolved(True).client_args(None, 8, 16)
    assert speculative[-1] == "--apply-chat-template"


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"label": "s", "dataset": "speed-bench"}, "workload 's' (speed-bench): needs `path`"),
        ({"label": "r", "dataset": "random-ids", "path": "/x"}, "it reads no `path`"),
        (CHAT | {"categories": ["mixed"]}, "only speed-bench has them"),
        (SPEED | {"categories": ["mixed", "mixed"]}, "at most once"),
        (SPEED | {"categories": ["code"]}, "'low_entropy', 'mixed' or 'high_entropy'"),
        (SPEED | {"chat_template": False}, "always applies the chat template"),
        (RANDOM | {"chat_template": True}, "no text: there is no chat template"),
        (SPEED | {"thinking": False}, "templated by the client"),
        (RANDOM | {"thinking": True}, "as ids"),
        ({"label": "a/b", "dataset": "random-ids"}, "'/' separates a workload from its SPEED-Bench category"),
        ({"label": "-a", "dataset": "random-ids"}, "label '-a': 1 to 64 letters, digits, '_', '.' or '-', starting"),
        ({"label": "x", "dataset": "mmlu"}, "'random-ids', 'speed-bench', 'custom' or 'sharegpt'"),
        (SPEED | {"categorie": ["mixed"]}, "categorie\n  Extra inputs are not permitted"),
    ],
)
def test_bad_workloads_are_refused_naming_what_is_expected(workload: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        step(workload)


def test_labels_are_unique_and_the_seeds_count_every_run() -> None:
    with pytest.raises(ValidationError, match="each label may appear once"):
        step(RANDOM, RANDOM)
    with pytest.raises(ValidationError, match="the last run's seed would be 4294967296"):
        step(SPEED, RANDOM, seed=2**32 - 3)  # 3 categories + 1: 4 runs


def comparison(baseline: dict[str, Any], candidate: dict[str, Any]) -> str:
    deploy = {"kind": "deploy", "model_path": "/m/Kimi", "tp_size": 1, "attention_backend": "fa3"}
    steps = [
        {"id": "deploy_base", **deploy},
        {"id": "base", "kind": "benchmark", "server": "deploy_base", **baseline},
        {"id": "deploy_dflash", **deploy, "draft_model_path": "/m/drafter", "draft_attention_backend": "fa3"},
        {"id": "dflash", "kind": "benchmark", "server": "deploy_dflash", "compare_to": "base", **candidate},
    ]
    return "name: t\n__HOSTS__\nsteps:\n" + "".join(f"  - {json.dumps(s)}\n" for s in steps)


@pytest.mark.parametrize(
    ("baseline", "candidate", "message"),
    [
        ({"workloads": [SPEED]}, {"workloads": [SPEED, RANDOM]}, "the baseline ran no workload 'random-ids'"),
        ({}, {"workloads": [SPEED]}, "the baseline ran no workload 'speed'"),
        (
            {"workloads": [SPEED]},
            {"workloads": [SPEED | {"categories": ["mixed"]}]},
            "workload 'speed': categories ['low_entropy', 'mixed', 'high_entropy'] there, ['mixed'] here",
        ),
        (  # the baseline does not speculate: its custom workload runs raw unless it says chat_template: true
            {"workloads": [CHAT]},
            {"workloads": [CHAT]},
            "chat_template False there, True here; set chat_template: true on the baseline's",
        ),
    ],
)
def test_unlike_workloads_are_refused_at_validate(
    write_runbook: Any,
    capsys: pytest.CaptureFixture[str],
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    message: str,
) -> None:
    path = write_runbook(comparison(baseline, candidate))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path.name}:" in err and "step 'dflash': compare_to 'base' runs other prompts: " in err
    assert message in err and "Traceback" not in err
    assert main(["validate", str(write_runbook(comparison({"workloads": [CHAT | {"chat_template": True}]}, {
        "workloads": [CHAT]})))]) == 0  # fmt: skip


def test_a_bad_workload_in_a_runbook_is_a_validate_error(
    write_runbook: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_runbook(comparison({"workloads": [{"label": "s", "dataset": "speed-bench"}]}, {}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "needs `path`, the dataset file on the host" in err and "Traceback" not in err


def test_a_baseline_whose_facts_ran_other_workloads_is_refused_before_anything_runs(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Facts from a shell step (no benchmark step to compare at validate): refused when the step starts.
    A baseline from before workloads ran random ids."""
    baseline = {"label": "baseline", "input_len": 1024, "output_len": 512, "runs": [], "points": [], "failure": None}
    steps = [
        {"id": "deploy", "kind": "shell", "parse": "json", "script": 'echo \'{"base_url": "http://127.0.0.1:9"}\''},
        {"id": "base", "kind": "shell", "parse": "json", "script": f"echo '{json.dumps(baseline)}'"},
        {"id": "dflash", "kind": "benchmark", "server": "deploy", "compare_to": "base", "workloads": [SPEED_HERE]},
    ]
    path = write_runbook("name: t\n__HOSTS__\nsteps:\n" + "".join(f"  - {json.dumps(s)}\n" for s in steps))
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs")]) == 1
    err = capsys.readouterr().err
    assert "the baseline 'base' ran other prompts: the baseline ran no workload 'speed' (it ran ['random-ids'])" in err
    assert "sglang.bench_serving" not in err and not list((tmp_path / "logs").glob("*/report.json"))


# ------------------------------------------------------------------------------------------ the report, offline


def runs_of(throughputs: dict[str, float], accept: dict[str, float] | None = None) -> list[Any]:
    """One run at concurrency 4 per slice key (`speed/mixed`), with its output throughput and accept length."""
    runs = []
    for key, throughput in throughputs.items():
        workload, _, category = key.partition("/")
        length = (accept or {}).get(key, 1.0)
        run = bench_run(4, throughput, accept_length=length)
        runs.append(run.model_copy(update={"workload": workload, "category": category or None}))
    return runs


def exact(value: float | None, running_average: float | None, verify_calls: int | None = None) -> RunAcceptance:
    """A run's acceptance as the counters gave it (`value` None: not known, with a reason)."""
    counted = ExactAcceptance(
        value=value, decode_value=value, generation_tokens=None, verify_calls=verify_calls, requests=None,
        accept_gauge=None, unknown_reason=None if value else "no verify call during the run",
    )  # fmt: skip
    return RunAcceptance(exact=counted, running_average=running_average, weighted_mean=None, per_request_mean=None,
                         disagreements=[])  # fmt: skip


def test_the_per_workload_acceptance_says_which_is_exact_and_which_an_estimate() -> None:
    """The table a configuration is chosen by gives the counters' exact length (the median of the repeats) in a
    column of its own, beside the client's running average, each header saying which it is."""
    workloads = step(SPEED).resolved_workloads(True)
    base = [bench_run(4, 100.0, r).model_copy(update={"workload": "speed", "category": "mixed"}) for r in (1, 2, 3)]
    cand = [
        bench_run(4, 150.0, r, accept_length=2.0).model_copy(
            update={"workload": "speed", "category": "mixed", "acceptance": exact(value, 2.0)}
        )
        for r, value in ((1, 3.0), (2, 5.0), (3, 4.0))
    ]
    baseline = side_of("baseline", base).model_copy(update={"workloads": workloads})
    candidate = side_of("dflash", cand).model_copy(update={"workloads": workloads})
    report = build_report(baseline, candidate, provenance_of(baseline, candidate), ACCEPTANCE)
    table = next(t for t in report.tables if t.title == "Speedup and acceptance per workload")
    assert table.columns[3:6] == ["speedup", "dflash accept length, exact (counters)", "dflash accept length, estimate"]
    assert table.rows[0][3:6] == ["1.50x", "4.00", "2.00"]
    assert any(n.startswith("dflash accept length per workload: exact (counters) is the median") for n in report.notes)
    latency = next(t for t in report.tables if t.title.startswith("Latency per concurrency"))
    assert latency.columns[-1] == "accept length (estimate)"
    one_short = [*cand[:2], cand[2].model_copy(update={"acceptance": exact(None, 2.0)})]
    candidate = side_of("dflash", one_short).model_copy(update={"workloads": workloads})
    report = build_report(baseline, candidate, provenance_of(baseline, candidate), ACCEPTANCE)
    table = next(t for t in report.tables if t.title == "Speedup and acceptance per workload")
    assert table.rows[0][4] == "4.00 (2 of 3 runs)"
    # at 100 columns the table is printed in parts: the first has the whole key, the speedup and both lengths
    rows = [[*row[:6], "281,467.3 (noisy)", "281,467.3 (noisy)", *row[8:]] for row in table.rows]
    first, *_ = table_parts(table.title, table.columns, rows, 100)
    assert [str(c.header) for c in first.columns][:6] == table.columns[:6]


def test_a_baseline_that_never_speculated_has_a_note_not_a_row_per_run_in_the_exact_table() -> None:
    """A baseline's runs count no verify call: a row each would be n/a throughout (48 in the flagship)."""
    base = [bench_run(c, 100.0).model_copy(update={"acceptance": exact(None, None, 0)}) for c in (1, 4)]
    cand = [bench_run(c, 150.0).model_copy(update={"acceptance": exact(3.0, 3.0, 10)}) for c in (1, 4)]
    baseline, candidate = side_of("baseline", base), side_of("dflash", cand)
    report = build_report(baseline, candidate, provenance_of(baseline, candidate), ACCEPTANCE)
    table = next(t for t in report.tables if t.title == "Acceptance length per run: exact and estimates")
    assert [row[0] for row in table.rows] == [ACCEPTANCE.step, "dflash", "dflash"]  # `eval`, not "eval eval"
    assert "baseline: none of its 2 runs made a verify call (sglang:spec_verify_calls_total did not grow: no " in (
        " ".join(report.notes)
    )
    speculating = side_of("baseline", [run.model_copy(update={"acceptance": exact(2.0, 2.0, 5)}) for run in base])
    report = build_report(speculating, candidate, provenance_of(speculating, candidate), ACCEPTANCE)
    table = next(t for t in report.tables if t.title == "Acceptance length per run: exact and estimates")
    assert [row[0] for row in table.rows].count("baseline") == 2


def test_the_report_gives_speedup_and_acceptance_per_workload_and_category() -> None:
    """A drafter that wins on low-entropy text and loses on high-entropy: one number over all would hide it."""
    workloads = step(SPEED, RANDOM).resolved_workloads(True)
    base_runs = runs_of(
        {"speed/low_entropy": 100.0, "speed/mixed": 100.0, "speed/high_entropy": 100.0, "random-ids": 100.0}
    )
    cand_runs = runs_of(
        {"speed/low_entropy": 250.0, "speed/mixed": 150.0, "speed/high_entropy": 80.0, "random-ids": 110.0},
        {"speed/low_entropy": 5.5, "speed/mixed": 3.5, "speed/high_entropy": 1.9, "random-ids": 1.2},
    )
    baseline = side_of("baseline", base_runs).model_copy(update={"workloads": workloads})
    candidate = side_of("dflash", cand_runs).model_copy(update={"workloads": workloads})
    gain = speedup(baseline, candidate)
    assert {key: part.by_concurrency for key, part in gain.by_workload.items()} == {
        "speed/low_entropy": {"4": 2.5},
        "speed/mixed": {"4": 1.5},
        "speed/high_entropy": {"4": 0.8},
        "random-ids": {"4": 1.1},
    }
    assert (gain.min, gain.max, gain.by_concurrency) == (0.8, 2.5, {"4": 0.8})  # the worst workload's
    report = build_report(baseline, candidate, provenance_of(baseline, candidate), ACCEPTANCE)
    tables = {table.title: table for table in report.tables}
    rows = tables["Speedup and acceptance per workload"].rows
    assert [row[:6] + row[8:] for row in rows] == [  # no exact acceptance: these runs scraped no /metrics
        ["speed", "low_entropy", "4", "2.50x", "n/a", "5.50", "speed-bench", "on"],
        ["speed", "mixed", "4", "1.50x", "n/a", "3.50", "speed-bench", "on"],
        ["speed", "high_entropy", "4", "0.80x", "n/a", "1.90", "speed-bench", "on"],
        ["random-ids", "all", "4", "1.10x", "n/a", "1.20", "random-ids", "none (token ids)"],
    ]
    for key in gain.by_workload:
        assert (
            f"Output throughput per concurrency: {key}" in tables and f"Latency per concurrency (ms): {key}" in tables
        )
    assert any(
        note.startswith("workload speed: speed-bench $datasets/speed/throughput_1k.jsonl, one run per")
        for note in report.notes
    )
    text = markdown(report)
    assert "| " + " | ".join(map(md_text, rows[2])) + " |" in text
    assert report.data.speedup.by_workload["speed/high_entropy"].min == 0.8
    runs = tables["Provenance: benchmark runs"]  # each run named with its workload and category
    assert [row[:2] for row in runs.rows[4:]] == [["dflash", key] for key in gain.by_workload]


# ------------------------------------------------------------------------------------------ the campaign, offline


def two_workload_facts(server: str, throughputs: dict[str, float]) -> dict[str, Any]:
    """A benchmark's facts with a SPEED-Bench category and random ids, one run each at concurrency 4."""
    from steps.benchmark_report import BenchmarkFacts
    from steps.benchmark_results import points

    runs = runs_of(throughputs)
    facts = BenchmarkFacts(
        label="bench", server=server, base_url="http://127.0.0.1:30000", input_len=256, output_len=64,
        workloads=step(SPEED | {"categories": ["low_entropy"]}, RANDOM).resolved_workloads(True),
        concurrencies=[4], repeats=1, spread_threshold=0.05, runs=runs, points=points(runs, 0.05),
        failure=None, compare_to=None, speedup=None, report=None,
    )  # fmt: skip
    return facts.model_dump(mode="json")


def test_the_campaign_compares_each_workload_on_its_own() -> None:
    """The drafter wins on low-entropy text and loses on random ids: each workload has its own best."""
    from steps.campaign_report_cells import collect, compare
    from tests.steps.test_campaign_report import deploy_facts, gpu_facts, view

    cell: dict[str, AxisValue] = {"drafter": "zlab", "tokens": 4}
    base, dflash = {"speed/low_entropy": 100.0, "random-ids": 100.0}, {"speed/low_entropy": 300.0, "random-ids": 90.0}
    views = [
        view("probe", "probe", gpu_facts("NVIDIA H200")),
        view("deploy_baseline", "deploy", deploy_facts()),
        view("bench_baseline", "benchmark", two_workload_facts("deploy_baseline", base)),
        view("deploy_dflash[drafter=zlab,tokens=4]", "deploy", deploy_facts("DFLASH", tokens=4), cell=cell),
        view(
            "bench[drafter=zlab,tokens=4]",
            "benchmark",
            two_workload_facts("deploy_dflash[drafter=zlab,tokens=4]", dflash),
            cell=cell,
        ),
    ]  # fmt: skip
    cells = collect(views, "bench_baseline")
    assert [(c.name, c.workload) for c in cells] == [
        ("bench_baseline (speed/low_entropy)", "speed/low_entropy"),
        ("bench_baseline (random-ids)", "random-ids"),
        ("dflash[drafter=zlab,tokens=4] (speed/low_entropy)", "speed/low_entropy"),
        ("dflash[drafter=zlab,tokens=4] (random-ids)", "random-ids"),
    ]
    assert [c.points[0].speedup for c in cells[2:]] == [3.0, 0.9]
    comparisons = compare(cells, {"gpu1": "8x NVIDIA H200"}, 0.02, across_gpus=False)
    shown = {c.shown_workload: c.best[0].best for c in comparisons}
    assert shown == {
        "speed/low_entropy, 64 out": "dflash[drafter=zlab,tokens=4] (speed/low_entropy)",
        "random-ids, 256 in / 64 out": "bench_baseline (random-ids)",
    }


# ------------------------------------------------------------------- through sshd and the SGLang stand-in, the CLI


def test_speedup_and_acceptance_per_workload_and_category_through_the_cli(
    standin: dict[str, Any],  # noqa: F811  (the fixture imported above)
    write_runbook: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The stand-in's acceptance follows content (sandbox/sglang_standin/simulation.py): SPEED-Bench's
    low-entropy prompts are accepted longer than its high-entropy ones, random ids least."""
    from sandbox.datasets import SPEED_BENCH_FILENAME, speed_bench_jsonl
    from tests.steps.test_benchmark import dflash_deploy, facts_of, yaml_steps

    data = standin["host"].home / "datasets" / SPEED_BENCH_FILENAME
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(speed_bench_jsonl())
    speed = SPEED | {"path": f"~/datasets/{SPEED_BENCH_FILENAME}", "categories": ["low_entropy", "high_entropy"]}
    lengths = {"concurrencies": [2], "input_len": 16, "output_len": 24, "num_prompts": 4, "repeats": 1}
    bench = {"kind": "benchmark", "workloads": [speed, RANDOM], **lengths}
    body = "name: bench\n__HOSTS__\n" + yaml_steps(
        {"id": "deploy_baseline", **standin["deploy"]},
        {"id": "base", "server": "deploy_baseline", "label": "baseline", **bench},
        {"id": "deploy_dflash", **dflash_deploy(standin)},
        {"id": "dflash", "server": "deploy_dflash", "label": "dflash", "compare_to": "base", **bench},
    )
    log_dir = tmp_path / "logs"
    code = main(["run", str(write_runbook(body, hosts=standin["host"].host_yaml())), "--log-dir", str(log_dir)])
    assert code == 0, capsys.readouterr().err
    facts = facts_of(log_dir, capsys)["dflash"]
    keys = ["speed/low_entropy", "speed/high_entropy", "random-ids"]
    assert [(r["workload"], r["category"]) for r in facts["runs"]] == [
        ("speed", "low_entropy"),
        ("speed", "high_entropy"),
        ("random-ids", None),
    ]
    assert "--speed-bench-category high_entropy" in facts["runs"][1]["command"]
    accept = {key: facts["runs"][n]["accept_length"] for n, key in enumerate(keys)}
    assert accept["speed/low_entropy"] > accept["speed/high_entropy"] > accept["random-ids"] > 1.0
    assert list(facts["speedup"]["by_workload"]) == keys
    assert facts["speedup"]["min"] == min(s["min"] for s in facts["speedup"]["by_workload"].values())
    (run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]
    report = json.loads((run_dir / "report.json").read_text())
    table = next(t for t in report["tables"] if t["title"] == "Speedup and acceptance per workload")
    assert [row[:2] for row in table["rows"]] == [
        ["speed", "low_entropy"],
        ["speed", "high_entropy"],
        ["random-ids", "all"],
    ]
    assert [row[5] for row in table["rows"]] == [f"{accept[key]:.2f}" for key in keys]
    exact = {key: facts["runs"][n]["acceptance"]["exact"]["value"] for n, key in enumerate(keys)}
    assert [row[4] for row in table["rows"]] == [f"{exact[key]:.2f}" for key in keys]
    assert [row[3] for row in table["rows"]] == [f"{facts['speedup']['by_workload'][key]['min']:.2f}x" for key in keys]
    markdown_text = (run_dir / "report.md").read_text()
    assert "## Speedup and acceptance per workload" in markdown_text
    assert "| " + " | ".join(map(md_text, table["rows"][1])) + " |" in markdown_text


def test_thinking_off_is_accepted_less_than_on_through_the_chat_api(
    standin: dict[str, Any],  # noqa: F811  (the fixture imported above)
    write_runbook: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same `custom` prompts with `thinking: true` and `false`: the client sends them to the chat API with
    `chat_template_kwargs` (sandbox/sglang_standin/bench_client.py, as the release's openai chat backend), the
    server templates them with an open or an empty think block, and a DFLASH drafter accepts less with thinking
    off (simulation.TEMPLATE_SCALE)."""
    from sandbox.datasets import CUSTOM_FILENAME, custom_jsonl
    from tests.steps.test_benchmark import dflash_deploy, facts_of, yaml_steps

    data = standin["host"].home / "datasets" / CUSTOM_FILENAME
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(custom_jsonl())
    chat = CHAT | {"path": f"~/datasets/{CUSTOM_FILENAME}"}
    workloads = [chat | {"label": "think", "thinking": True}, chat | {"label": "nothink", "thinking": False}]
    lengths = {"concurrencies": [2], "input_len": 16, "output_len": 16, "num_prompts": 4, "repeats": 1}
    body = "name: bench\n__HOSTS__\n" + yaml_steps(
        {"id": "deploy_dflash", **dflash_deploy(standin)},
        {"id": "dflash", "kind": "benchmark", "server": "deploy_dflash", "workloads": workloads, **lengths},
    )
    log_dir = tmp_path / "logs"
    code = main(["run", str(write_runbook(body, hosts=standin["host"].host_yaml())), "--log-dir", str(log_dir)])
    assert code == 0, capsys.readouterr().err
    facts = facts_of(log_dir, capsys)
    runs = facts["dflash"]["runs"]
    assert [r["workload"] for r in runs] == ["think", "nothink"]
    assert all(r["completed"] == 4 and "--backend sglang-oai-chat" in r["command"] for r in runs)
    think, nothink = (r["acceptance"]["exact"]["value"] for r in runs)
    assert think > nothink > 1.0
    assert runs[0]["accept_length"] > runs[1]["accept_length"]
    # the server's access log: from the first run's flush on, every request was a chat completion
    log = Path(facts["deploy_dflash"]["log_file"]).read_text()
    posts = re.findall(r'"POST (\S+) HTTP', log[log.index('"POST /flush_cache') :])
    assert {p for p in posts if not p.startswith("/flush_cache")} == {"/v1/chat/completions"}
    assert posts.count("/v1/chat/completions") >= 2 * 4
