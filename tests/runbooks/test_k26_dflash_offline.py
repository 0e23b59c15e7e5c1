"""The flagship runbook, unedited, in-process on scripted hosts: every step's host program answered with what
it printed on the sandbox's H200 test host (tests/runbooks/offline/k26_dflash_host.json: the documents of a
run of tests/runbooks/test_k26_dflash.py, paths and port rewritten to the runbook's defaults), in seconds.

`FlagshipHost` plays the GPU host: the server on the port is the one deploy started last (a benchmark
measures that one), and the acceptance evaluation answers each prompt its config sends."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from executor.transport.scripted import Answer, HostProgramCall, ScriptedCommand, ScriptedTransport
from steps.bench_entry import ENTRY_MARKER
from steps.benchmark_results import JSONL_MARKER
from steps.server_metrics import GENERATION_TOKENS, METRICS_MARKER, REQUESTS, VERIFY_CALLS

if TYPE_CHECKING:  # the plugin is imported as a plugin, below (imported before, pytest could not rewrite it)
    from executor.faces.testing import Offline, OfflineRun

pytest_plugins = ["executor.faces.testing"]  # runbook's own plugin, installed or not (pyproject's pytest11 entry point)

RUNBOOK = Path("runbooks/k26_dflash.yaml")
ANSWERS = json.loads((Path(__file__).parent / "offline" / "k26_dflash_host.json").read_text())
SPEED_BENCH = "nvidia/SPEED-Bench"


def dataset_answers(answers: dict[str, Any]) -> None:
    """The download and verify documents of the SPEED-Bench dataset repository: the drafter's recorded ones with
    the dataset's repo, folder and one file (only the file count, path and repo matter to the steps here)."""
    folder = "/root/models/SPEED-Bench"
    drafter = "z-lab/Kimi-K2.6-DFlash"
    answers["download"][SPEED_BENCH] = {
        state: answers["download"][drafter][state] | {"local_dir": folder} for state in ("complete", "missing")
    }
    answers["download"][SPEED_BENCH]["complete"] |= {"files": 1, "complete_files": 1}
    answers["verify"][SPEED_BENCH] = answers["verify"][drafter] | {"repo": SPEED_BENCH, "local_dir": folder}
    answers["verify"][SPEED_BENCH] |= {"files_checked": 1, "files_expected": 1, "hashed": 1}


dataset_answers(ANSWERS)
STEPS = [
    "probe",
    "download_drafter",
    "verify_drafter",
    "download_speed_bench",
    "verify_speed_bench",
    "download_target",
    "verify_target",
    "inspect",
    "deploy_baseline",
    "eval_baseline",
    "benchmark_baseline",
    "deploy_dflash",
    "eval",
    "benchmark_dflash",
    "stop",
]


#: the drafter's throughput and acceptance on each SPEED-Bench category, relative to random ids
CATEGORY_GAIN = {"low_entropy": 1.5, "mixed": 1.2, "high_entropy": 0.9}


class FlagshipHost:
    """The GPU host's answers, by host program; `accept` is the drafter's tokens per verify step."""

    def __init__(self, host: ScriptedTransport, accept: float = 4.0) -> None:
        self.serving = "none"
        self.accept = accept
        from executor.faces.testing import h200_probe

        host.program("probe", h200_probe())
        host.program("download", self.download)
        host.on(r"download method 1 of 3: hf_cli", stdout="Downloaded\n")
        host.program("verify", lambda call: ANSWERS["verify"][call.config["repo"]])
        host.program("inspect_config", ANSWERS["inspect_config"])
        host.program("deploy", self.deploy)
        host.program("eval_acceptance", self.evaluate)
        host.on(r"-m \"\$entry\" --backend sglang ", self.bench_serving)

    @staticmethod
    def download(call: HostProgramCall) -> Any:
        """The files are missing before the method runs, complete after (its check then knows the manifest)."""
        return ANSWERS["download"][call.config["repo"]]["complete" if "known" in call.config else "missing"]

    def deploy(self, call: HostProgramCall) -> Any:
        if call.config["action"] == "stop":
            return ANSWERS["deploy"]["stop"]
        speculative = any(word == "--speculative-algorithm" for word, _ in call.config["launch"])
        self.serving = "dflash" if speculative else "baseline"
        return ANSWERS["deploy"][self.serving]

    def bench_serving(self, command: ScriptedCommand) -> Answer:
        """The line bench_serving wrote against the server on the port, with every prompt asked answered, after
        the /metrics scrapes around the measured run (its warm-up, a run before them, not in their difference); the
        drafter gains more on SPEED-Bench's predictable prompts (`CATEGORY_GAIN`), as a real one does."""
        asked = re.findall(r"--num-prompts (\d+)", command.script)  # the warm-up's, then the measured run's
        assert len(asked) == 2, command.script
        line = ANSWERS["bench_serving"][self.serving] | {"completed": int(asked[-1])}
        category = re.search(r"--speed-bench-category (\w+)", command.script)
        if category and self.serving == "dflash":
            gain = CATEGORY_GAIN[category.group(1)]
            line |= {name: line[name] * gain for name in ("output_throughput", "accept_length")}
        tokens, accept = line["total_output_tokens"], line.get("accept_length")
        verify = round((tokens - line["completed"]) / accept) if accept else 0
        scrapes = [self.scrape(0, 0, 0), self.scrape(tokens, verify, line["completed"])]
        entry = f"{ENTRY_MARKER}sglang.benchmark.serving"
        return Answer(stdout="\n".join([entry, METRICS_MARKER, *scrapes, JSONL_MARKER, json.dumps(line)]) + "\n")

    @staticmethod
    def scrape(tokens: int, verify: int, requests: int) -> str:
        """The scrape_metrics document of a server with these counters (a baseline's has no verify series)."""
        lines = [f'{GENERATION_TOKENS}{{is_streaming="true"}} {float(tokens)}', f"{REQUESTS} {float(requests)}"]
        return json.dumps(
            {"status": 200, "error": None, "lines": lines + ([f"{VERIFY_CALLS} {verify}.0"] * bool(verify))}
        )

    def evaluate(self, call: HostProgramCall) -> dict[str, Any]:
        """Every prompt answered with 200 tokens; with speculation on, in 200 / `accept` verify steps."""
        speculative = self.serving == "dflash"
        sets = {
            name: [
                {
                    "id": prompt["id"],
                    "seconds": 0.2,
                    "prompt_tokens": 40,
                    "completion_tokens": 200,
                    "spec_verify_ct": round(200 / self.accept) if speculative else None,
                    "finish_reason": "length",
                    "error": None,
                    "output_ids": list(range(200)),
                }
                for prompt in prompts
            ]
            for name, prompts in call.config["sets"].items()
        }
        return {
            "base_url": call.config["base_url"],
            "error": None,
            "flush": {"flushed": True, "attempts": 1, "status": 200, "body": ""},
            "planned": {name: len(prompts) for name, prompts in call.config["sets"].items()},
            "sets": sets,
        }


def run_flagship(offline: Offline, **options: Any) -> OfflineRun:
    offline.environ["HF_TOKEN"] = "hf_offline_token_1234"
    return offline.run(RUNBOOK, **options)


def test_the_flagship_runs_end_to_end_on_a_scripted_host(runbook_offline: Offline) -> None:
    FlagshipHost(runbook_offline.host("gpu"))
    run = run_flagship(runbook_offline)
    assert run.exit_code == 0, run.failures()
    assert run.started == STEPS and run.ran("passed") == STEPS
    gpu = runbook_offline.host("gpu")
    assert [name for name in gpu.programs_run() if name != "scrape_metrics"] == [
        "probe",
        *["download", "download", "verify"] * 3,  # a check, the method, the check again: hf_cli is no program
        "inspect_config",
        "deploy",
        "eval_acceptance",
        "deploy",
        "eval_acceptance",
        "deploy",
    ]
    # (3 SPEED-Bench categories + random ids) x 4 concurrencies x 3 repeats, per side
    runs = 2 * 4 * 4 * 3
    assert len([c for c in gpu.commands if "sglang.bench_serving" in c.script]) == runs
    assert gpu.programs_run().count("scrape_metrics") == runs  # shipped once a run, run before and after it
    first = run.facts("benchmark_dflash")["runs"][0]["acceptance"]
    assert first["exact"]["value"] == round(4096 / first["exact"]["verify_calls"], 4) and first["disagreements"] == []
    assert run.facts("benchmark_baseline")["runs"][0]["acceptance"]["exact"]["unknown_reason"].startswith("no verify")

    probe = run.facts("probe")
    assert (probe["gpu_arch"], probe["gpu_count"], probe["sglang"]["dflash"]) == ("sm90", 1, True)
    assert run.facts("verify_target")["files_expected"] == 15
    assert run.facts("inspect")["drafter"]["block_size"]["value"] == 8
    argv = run.facts("deploy_dflash")["argv"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert run.facts("eval")["sets"]["math"]["mean"] == 4.0
    assert {name: s["identical"] for name, s in run.facts("eval")["lossless"].items()} == dict.fromkeys(
        ("math", "code", "chat"), 16
    )
    bench = run.facts("benchmark_dflash")
    assert [p["max_concurrency"] for p in bench["points"]] == [1, 4, 16, 32] * 4
    by_workload = bench["speedup"]["by_workload"]
    random_ids = by_workload["random-ids"]["by_concurrency"]["1"]
    assert random_ids > 1.0
    for category, gain in CATEGORY_GAIN.items():  # each category's speedup is its own
        assert by_workload[f"speed-bench/{category}"]["by_concurrency"]["1"] == pytest.approx(random_ids * gain)
    assert run.facts("stop")["stopped"] is True

    report = json.loads((run.run_dir / "report.json").read_text())
    titles = [t["title"] for t in report["tables"]]
    assert titles[0] == "Acceptance length per prompt set" and "Speedup and acceptance per workload" in titles
    assert "Output throughput per concurrency: speed-bench/high_entropy" in titles
    assert (run.run_dir / "report.md").read_text().startswith("# Benchmark")
    assert all((run.run_dir / f["path"]).read_bytes().startswith(b"\x89PNG") for f in report["figures"])
    # the token reached the host's environment, and nothing the run wrote holds it
    downloads = [c for c in gpu.commands if c.program and c.program.name == "download"]
    assert [c.env.get("HF_TOKEN") for c in downloads] == ["hf_offline_token_1234"] * 6
    assert not [p for p in run.run_dir.rglob("*") if p.is_file() and b"hf_offline_token_1234" in p.read_bytes()]


def test_a_drafter_below_the_gate_fails_eval_and_a_fixed_one_resumes_from_deploy(runbook_offline: Offline) -> None:
    host = FlagshipHost(runbook_offline.host("gpu"), accept=2.0)
    run = run_flagship(runbook_offline)
    assert run.exit_code == 1
    assert run.ran("failed") == ["eval"] and "benchmark_dflash" not in run.started
    assert "DFlash accepts fewer than 3 tokens per verify step on the math set" in run.step("eval").message

    host.accept = 4.0  # a better drafter
    gpu = runbook_offline.host("gpu")
    sent = len(gpu.commands)
    again = run_flagship(runbook_offline, resume="latest")
    assert again.exit_code == 0, again.failures()
    assert again.ran("passed") == ["eval", "benchmark_dflash", "stop"]  # nothing before eval runs again
    rerun = [(c.program.name, c.program.config.get("action")) for c in gpu.commands[sent:] if c.program]
    rerun = [program for program in rerun if program[0] != "scrape_metrics"]  # each benchmark run's /metrics
    assert rerun == [("eval_acceptance", None), ("deploy", "stop")]  # no download, no second launch
    assert (again.run_dir / "report.json").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda doc: doc["gpu"].update(gpus=[]), "no GPU found by nvidia-smi"),
        (lambda doc: doc["hf_token"].update(available=False, source=None), "no Hugging Face token reaches the host"),
        (lambda doc: doc["models"]["disk"].update(avail_bytes=1000), "not enough disk in the models dir"),
    ],
)
def test_the_probe_gates_stop_the_run_before_any_download(runbook_offline: Offline, change: Any, message: str) -> None:
    from executor.faces.testing import h200_probe

    host = runbook_offline.host("gpu")
    FlagshipHost(host)
    probe = h200_probe()
    change(probe)
    host.program("probe", probe)  # the newest rule answers first
    run = run_flagship(runbook_offline)
    assert run.exit_code == 1
    assert run.ran() == ["probe"] and message in run.step("probe").message
    assert host.programs_run() == ["probe"]  # retry: {attempts: 1}: asked once, nothing downloaded
    assert re.search(r"gate: ", run.step("probe").message)
