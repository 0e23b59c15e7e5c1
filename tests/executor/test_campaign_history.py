"""A campaign's report after partial reruns (`--only`, `--resume`) of the same run folder: every cell that passed in
the run's history is reported from its recorded facts, `skipped` only for a cell that never passed.

In-process (`executor.faces.cli.main`) on the controller (`address: local`), no sshd: the benchmark's `python` is a
script that writes bench_serving's JSONL line (its output throughput from a file per cell), the servers are shell
steps printing a base_url, so one run of the whole campaign takes about a second.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.faces.cli import main

# the benchmark's python: asked which client it has (-c), it names the current one; run as the client (-m), it
# writes a line; running the /metrics scrape (a program file), it answers as a server launched without metrics
FAKE_BENCH = """#!/bin/sh
case $1 in -c) echo sglang.benchmark.serving; exit;; -m) ;; *) echo '{"status": 404, "lines": []}'; exit;; esac
for word; do out=$word; done
throughput=$(cat "$THROUGHPUT_FILE.$matrix_n" 2>/dev/null || echo 100)
[ "$throughput" != fail ] || exit 3
printf '{"completed": 1000, "output_throughput": %s, "median_tpot_ms": 10.0}\\n' "$throughput" > "$out"
"""
SERVER = r'echo "{\"base_url\": \"http://127.0.0.1:9\", \"cell\": \"$matrix_n\"}"'


class Campaign:
    """A baseline and three cells (`sweep[n=1..3]`) on one local host, and a campaign report."""

    def __init__(self, root: Path) -> None:
        self.root, self.logs = root, root / "logs"
        fake = root / "fake_python"
        fake.write_text(FAKE_BENCH)
        fake.chmod(0o755)
        bench = {"kind": "benchmark", "python": str(fake), "concurrencies": [1], "repeats": 1}
        bench |= {"pass_env": ["THROUGHPUT_FILE"]}
        book = {
            "name": "history",
            "hosts": {"here": {"address": "local"}},
            "vars": {"THROUGHPUT_FILE": str(root / "throughput")},
            "steps": [
                {"id": "up_base", "kind": "shell", "parse": "json", "script": SERVER},
                {"id": "bench_baseline", "server": "up_base", **bench},
                {
                    "group": "sweep",
                    "matrix": {"n": [1, 2, 3]},
                    "on_failure": "continue",
                    "steps": [
                        {"id": "up", "kind": "shell", "parse": "json", "script": SERVER},
                        {"id": "bench", "server": "up", "label": "b${{ matrix.n }}", **bench},
                    ],
                },
                {"id": "report", "kind": "campaign_report", "baseline": "bench_baseline"},
            ],
        }
        self.book = root / "book.yaml"
        self.book.write_text(yaml.safe_dump(book, sort_keys=False))

    def throughput(self, cell: int, value: str) -> None:
        (self.root / f"throughput.{cell}").write_text(value)

    def run(self, *args: str) -> int:
        return main(["run", str(self.book), "--log-dir", str(self.logs), *args])

    def newest(self) -> Path:
        return max(self.logs.iterdir(), key=lambda p: json.loads((p / "run.json").read_text())["started_at"])

    def cells(self) -> dict[str, tuple[str, str | None]]:
        report = json.loads((self.newest() / "report.json").read_text())["campaign"]
        return {c["name"]: (c["status"], c["reason"]) for c in report["cells"]}

    def best(self) -> Any:
        return json.loads((self.newest() / "report.json").read_text())["campaign"]["comparisons"][0]["best"]


ALL_PASSED = dict.fromkeys(["bench_baseline", "sweep[n=1]", "sweep[n=2]", "sweep[n=3]"], ("passed", None))


@pytest.fixture
def campaign(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Campaign:
    """The campaign run once whole, every cell passed (100 tokens/s each)."""
    made = Campaign(tmp_path)
    assert made.run() == 0, capsys.readouterr()
    assert made.cells() == ALL_PASSED
    return made


def test_only_one_cell_then_only_the_report_reports_every_cell_that_passed(
    campaign: Campaign, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--only bench[n=2]` keeps the later cell n=3 (it does not need n=2); `--only report` then reports it
    passed with its recorded facts, n=2 with its new numbers (the best now), not `skipped (never passed)`."""
    campaign.throughput(2, "300")
    assert campaign.run("--only", "bench[n=2]") == 0
    assert campaign.run("--only", "report") == 0, capsys.readouterr()
    assert campaign.cells() == ALL_PASSED
    [best] = campaign.best()
    assert (best["best"], best["output_throughput"]) == ("sweep[n=2]", 300.0)


def test_only_a_step_before_the_group_then_only_the_report_reports_the_cells_of_the_run_before(
    campaign: Campaign, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--only bench_baseline` leaves every later step out (each may depend on it); their records keep the facts
    of their last pass (`runbook status` says so), so `--only report` reuses them; a `--resume` runs them again."""
    first = campaign.newest().name
    assert campaign.run("--only", "bench_baseline") == 0
    only = campaign.newest().name
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["status", "--log-dir", str(campaign.logs)]) == 0
    rows = [line.split("│") for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    status = {row[1].strip(): row[3].strip() for row in rows}
    assert status["bench[n=3]"] == status["report"] == f"skipped (last passed in {first})"
    assert campaign.run("--only", "report") == 0, capsys.readouterr()
    assert campaign.cells() == ALL_PASSED
    capsys.readouterr()
    assert campaign.run("--resume", only, "-v") == 0  # -v: the step list names each instance
    planned = {line.split()[0]: line for line in capsys.readouterr().err.splitlines() if line.startswith("  ")}
    for step in ("bench[n=3]", "report"):
        assert planned[step].endswith(f"runs (skipped in {only})"), planned[step]


def test_resume_after_only_one_cell_reuses_the_other_cells_and_runs_the_report(
    campaign: Campaign, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign.throughput(2, "300")
    assert campaign.run("--only", "bench[n=2]") == 0
    capsys.readouterr()
    assert campaign.run("--resume", "-v") == 0  # -v: the step list names each instance
    said = capsys.readouterr().err
    reused = {line.split()[0] for line in said.splitlines() if line.startswith("  ") and "reused (passed in" in line}
    assert {"up[n=3]", "bench[n=3]", "bench[n=1]", "bench[n=2]"} <= reused, said
    assert "running bench[n=3]" not in said and "running report" in said
    assert campaign.cells() == ALL_PASSED and campaign.best()[0]["best"] == "sweep[n=2]"


@pytest.mark.parametrize("throughput", ["-5e300", pytest.param("9" * 400, id="400-digits")])
def test_an_unusable_throughput_never_wins(
    campaign: Campaign, capsys: pytest.CaptureFixture[str], throughput: str
) -> None:
    """n=3 measures a negative or a 400-digit throughput after an --only of it: the benchmark keeps no such number
    (its facts say why), nothing fails unexpectedly, and the best stays among the cells with usable numbers."""
    campaign.throughput(3, throughput)
    capsys.readouterr()
    assert campaign.run("--only", "bench[n=3]") == 0
    assert campaign.run("--only", "report") == 0
    said = capsys.readouterr()
    assert "unexpectedly" not in said.out + said.err
    [best] = campaign.best()
    assert best["best"] != "sweep[n=3]" and best["output_throughput"] > 0
    state = json.loads((campaign.newest() / "report.json").read_text())["campaign"]["cells"]
    assert [c["points"][0]["output_throughput"] for c in state if c["name"] == "sweep[n=3]"] == [None]


def test_a_cell_that_failed_is_reported_failed_as_in_the_whole_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--only report` after a run in which n=3 failed reports it failed with the failure's message, as the whole
    run's report did (it said `skipped (never passed)`); the cells that passed stay passed."""
    campaign = Campaign(tmp_path)
    campaign.throughput(3, "fail")
    assert campaign.run() == 5, capsys.readouterr()  # cells-failed
    whole = campaign.cells()
    assert campaign.run("--only", "report") == 0, capsys.readouterr()
    assert campaign.cells() == whole
    status, reason = whole.pop("sweep[n=3]")
    assert status == "failed" and reason is not None and reason.startswith("bench[n=3]: ")
    assert whole == {name: cell for name, cell in ALL_PASSED.items() if name != "sweep[n=3]"}


def test_the_newest_outcome_wins_a_cell_that_failed_after_it_passed_is_failed_through_later_runs(
    campaign: Campaign, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """n=2 passed at 300 tokens/s, then failed in an `--only` of it: neither `--only report` nor one after an
    `--only` of another cell reports n=2 passed with the numbers of its older pass (nor `skipped (never
    passed)`): it is failed, with its failure, and never the best; `runbook status` says in which run it failed."""
    campaign.throughput(2, "300")
    assert campaign.run("--only", "bench[n=2]") == 0
    campaign.throughput(2, "fail")
    assert campaign.run("--only", "bench[n=2]") == 5
    failed_in = campaign.newest().name
    assert campaign.run("--only", "bench[n=1]") == 0  # leaves bench[n=2] out after it: its record stays failed
    for _ in range(2):  # and so does the report's, then the next one's
        assert campaign.run("--only", "report") == 0, capsys.readouterr()
        cells = campaign.cells()
        status, reason = cells.pop("sweep[n=2]")
        assert status == "failed" and reason is not None and "the benchmark did not complete" in reason
        assert cells == {name: cell for name, cell in ALL_PASSED.items() if name != "sweep[n=2]"}
        [best] = campaign.best()
        assert best["best"] != "sweep[n=2]" and best["fastest_throughput"] == 100.0
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["status", "--log-dir", str(campaign.logs)]) == 0
    rows = [line.split("│") for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert {row[1].strip(): row[3].strip() for row in rows}["bench[n=2]"] == f"failed (in {failed_in})"


#: A recorded median output throughput that is no measurement, and what the report says of it
UNUSABLE = [
    (-5.0, "greater than or equal to 0"),
    (float("nan"), "Out of range float values are not JSON compliant"),
    (10**400, "valid number"),
    ("fast", "valid number"),
]


def test_a_cell_whose_recorded_numbers_are_unusable_says_so(
    campaign: Campaign, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tampered state.db: n=2's recorded median output throughput is no measurement. `--only report` reports
    the cell failed, saying its recorded facts are unusable and why (it was `passed` with no number and no word),
    and the best is chosen among the others. Each value in turn, in the newest run (whose record `--only` copies)."""
    for median, why in UNUSABLE:
        db = sqlite3.connect(campaign.newest() / "state.db")
        with db:
            [(text,)] = db.execute("SELECT facts FROM steps WHERE step = 'bench[n=2]'").fetchall()
            facts = json.loads(text)
            facts["points"][0]["output_throughput"]["median"] = median
            db.execute("UPDATE steps SET facts = ? WHERE step = 'bench[n=2]'", (json.dumps(facts),))
        db.close()
        assert campaign.run("--only", "report") == 0, capsys.readouterr()
        cells = campaign.cells()
        status, reason = cells.pop("sweep[n=2]")
        assert status == "failed" and reason is not None, reason
        assert reason.startswith("bench[n=2]: its recorded facts are unusable: ") and why in reason, reason
        assert cells == {name: cell for name, cell in ALL_PASSED.items() if name != "sweep[n=2]"}
        [best] = campaign.best()
        assert best["best"] != "sweep[n=2]" and best["fastest_throughput"] == 100.0
