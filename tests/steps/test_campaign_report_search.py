"""A searched group's account in the campaign report (steps/campaign_report_search.py), from the steps' views as a
run leaves them: the launches and the configurations never launched, each with the decision's words as the engine
writes them (executor/run/searching.py `why_not`), and what the account says of its answers: proven where every
configuration was decided, unproven in the bands the budget left open, nothing either way where the run stopped."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from executor.runbook.campaign import AxisValue
from executor.runbook.search import LEFT_OUT, NOT_REACHED, UNPROVEN, Measure, Position, Search
from executor.stepkind import StepView
from steps.campaign_report_search import account, notes

GROUP = "sweep"
BAND = "chat c=1"


def deploy(config: str, status: str = "passed", message: str | None = None) -> StepView:
    return StepView(f"deploy[{config}]", "deploy", "deploy", "gpu1", status, message, {}, GROUP, {"spec": config})


def budget_left_open() -> str:
    """The message of a configuration the budget left open where it might still win: the real decision's words."""
    search = Search(
        {c: Position("zlab", "DFLASH", n, (1.0, float(n), 0.0), c) for c, n in [("dflash-4", 4), ("dflash-8", 8)]},
        0.02,
        baseline={BAND: Measure(100.0, 99.0, 101.0, None)},
    )
    search.measured["dflash-4"] = {BAND: Measure(250.0, 248.0, 252.0, 2.6)}
    decision = search.unexplored("dflash-8", "the search's budget of 1 launches was spent")
    return f"{LEFT_OUT}not launched dflash-8: {decision.reason}"


@pytest.mark.parametrize(
    ("left_out", "unproven", "said", "not_said"),
    [
        (
            "search: pruned dflash-8: chat c=1: at most 90 tok/s (...), beaten by dflash-4's 250",
            0,
            "each answer is proven",
            "budget",
        ),
        ("budget", 1, "The budget ended the search with 1 of them able to change an answer", "is proven"),
        (f"{LEFT_OUT}dflash-8 {NOT_REACHED}", 0, "never launched are in the table", "is proven"),
    ],
)
def test_the_account_says_whether_each_answer_is_proven(left_out: str, unproven: int, said: str, not_said: str) -> None:
    message = budget_left_open() if left_out == "budget" else left_out
    [searched] = account([deploy("dflash-4"), deploy("dflash-8", "skipped", message)], "benchmark_baseline")
    assert (searched.launched, searched.unproven, list(searched.never_launched)) == (1, unproven, ["deploy[dflash-8]"])
    [line] = notes([searched])
    assert said in line and not_said not in line, line
    if unproven:
        assert f"{BAND}: up to " in searched.never_launched["deploy[dflash-8]"]  # the band, its bound, the incumbent


def left_open_at_c16() -> list[StepView]:
    """DFLASH 16 left open by a search's budget at random-ids c=16, in the engine's words and facts, to add to
    tests/steps/test_campaign_report.py's host_views (where DFLASH 4 beats the rest there beyond the noise)."""
    cell: dict[str, AxisValue] = {"drafter": "zlab", "tokens": 16}
    said = (
        "not launched deploy_dflash[drafter=zlab,tokens=16]: never launched: the search's budget of 2 launches was "
        f"spent, {UNPROVEN} random-ids c=16 (unproven there); random-ids c=16: up to 1300 tok/s (the bound) against "
        "deploy_dflash[drafter=zlab,tokens=4]'s 1100"
    )
    facts = {"unproven": ["random-ids c=16"]}  # the engine's on the server instance (SearchDriver.left_out_facts)
    return [
        StepView(
            f"{base}[drafter=zlab,tokens=16]", base, kind, "gpu1", "skipped", LEFT_OUT + said, facts, "dflash", cell
        )
        for base, kind in (("deploy_dflash", "deploy"), ("bench", "benchmark"))
    ]


def _open_at_c16(tmp_path: Path) -> Path:
    """A campaign whose search left DFLASH 16 open at random-ids c=16: its report and schedule written."""
    from tests.steps.test_campaign_report import host_views, write_campaign

    write_campaign(tmp_path, [*host_views(), *left_open_at_c16()])
    return tmp_path


@pytest.mark.parametrize("document", ["report.md", "schedule.md"])
def test_an_answer_the_budget_left_unproven_says_so_where_it_is_read(tmp_path: Path, document: str) -> None:
    """The Best table's `why` says `beats the runner-up beyond the noise` and schedule.md deploys the band with no
    word of the configuration never launched whose bound beats it: a reader of either takes the answer as proven."""
    text = (_open_at_c16(tmp_path) / document).read_text()
    assert "The budget ended the search with 1 of them able to change an answer" in (tmp_path / "report.md").read_text()
    if document == "report.md":
        text = text.partition("## Best configuration per concurrency")[2].partition("\n## ")[0]
    assert "unproven" in text, text


def test_a_band_left_open_on_one_gpu_kind_leaves_the_other_kinds_answer_proven(tmp_path: Path) -> None:
    """The same campaign on gpu1 (H200) and gpu2 (B200), compared apart; the search left DFLASH 16 open at
    random-ids c=16 on gpu1 only. The B200 answer at c=16 is what gpu2 measured: nothing left open could change it."""
    from tests.steps.test_campaign_report import host_views, write_campaign

    views = host_views("gpu1", "NVIDIA H200") + host_views("gpu2", "NVIDIA B200", scale=2.0) + left_open_at_c16()
    write_campaign(tmp_path, views)
    comparisons = json.loads((tmp_path / "report.json").read_text())["campaign"]["comparisons"]
    unproven = {(c["hosts"][0], b["concurrency"]) for c in comparisons for b in c["best"] if b["unproven"]}
    assert unproven == {("gpu1", 16)}, unproven


def test_schedule_md_names_a_run_folder_with_a_space_as_one_word_of_the_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "my runs" / "run-1"
    run_dir.mkdir(parents=True)
    _open_at_c16(run_dir)
    text = (run_dir / "schedule.md").read_text()
    commands = re.findall(r"`(runbook run [^`]*)`", text)  # the one the prose says (no band here has vars)
    assert commands, text
    for line in commands:
        words = shlex.split(line)
        assert words[words.index("--from-campaign") + 1] == str(run_dir.resolve()), line
