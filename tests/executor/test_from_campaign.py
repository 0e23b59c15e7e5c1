"""A campaign's answer deployed: the schedule its report writes from constructed cells (a tie deploys the cheaper,
the baseline's band deploys nothing), `plan`/`run --from-campaign RUN --band C` laying it over the flagship (each
var's source in the plan, the launch argv on the offline flagship's scripted host), and every refusal exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.faces.campaign_overlay import SCHEDULE_MAX_BYTES, campaign_overlay
from executor.runbook.loader import load_runbook
from executor.stepkind import StepView
from steps.campaign_report_cells import choose
from steps.campaign_schedule import SCHEDULE_JSON
from tests.clirun import runbook_cli
from tests.runbooks.test_k26_dflash_offline import RUNBOOK, FlagshipHost, run_flagship
from tests.steps.test_campaign_report import ZLAB_4, cell, gpu_facts, host_views, view, write_campaign

if TYPE_CHECKING:
    from executor.faces.testing import Offline

pytest_plugins = ["executor.faces.testing"]

DRAFTER = "z-lab/Kimi-K2.6-DFlash"


def repo_view(step: str, repo: str, local_dir: str) -> StepView:
    return view(step, "verify", {"repo": repo, "revision": "main", "commit": "a" * 40, "local_dir": local_dir})


def campaign_views(gpu: str = "NVIDIA H200", count: int = 1) -> list[StepView]:
    """host_views (DFLASH 4 and 8 tokens: tied at 1 and 4, 4 ahead at 16, the baseline at 32) on `count` GPUs,
    with the verify steps that say which repositories the drafter and the target are."""
    views = [view("probe", "probe", gpu_facts(gpu, count)) if v.kind == "probe" else v for v in host_views()]
    target = repo_view("verify_target", "moonshotai/Kimi-K2.6", "/models/Kimi-K2.6")
    return [*views, target, repo_view("verify_drafter", DRAFTER, "/models/Kimi-K2.6-DFlash")]


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    run_dir = tmp_path / "logs" / "20260101T000000Z-sweep"
    write_campaign(run_dir, campaign_views())
    return run_dir


def test_the_schedule_deploys_the_cheaper_of_a_tie_and_names_the_baseline_s_band(campaign: Path) -> None:
    [schedule] = json.loads((campaign / SCHEDULE_JSON).read_text())["schedules"]
    assert (schedule["gpus"], schedule["target_repo"], schedule["crossover"]) == (
        "1x NVIDIA H200",
        "moonshotai/Kimi-K2.6",
        32,
    )
    speculative, baseline = schedule["bands"]
    assert (speculative["low"], speculative["high"], speculative["measured"]) == (1, 31, [1, 4, 16])
    assert speculative["configuration"] == ZLAB_4 and speculative["on_tie"] == [1, 4]  # 8 tokens faster, within noise
    assert speculative["vars"] == {
        "drafter_repo": DRAFTER, "drafter_dir": "Kimi-K2.6-DFlash", "speculative_algorithm": "DFLASH",
        "speculative_num_draft_tokens": "4", "ddtree_budget": "none",
    }  # fmt: skip
    assert (baseline["low"], baseline["high"], baseline["baseline"], baseline["vars"]) == (32, None, True, {})
    markdown = (campaign / "schedule.md").read_text()
    # outside the default log folder (./logs), it names the run's folder: the id alone would not be found
    assert f"runbook run runbooks/k26_dflash.yaml --from-campaign {campaign.resolve()} --band 1" in markdown
    assert "### Concurrency 32+: the baseline, no speculation" in markdown


def test_a_tie_of_equal_draft_tokens_goes_to_the_smaller_budget_whatever_the_names() -> None:
    """Before: one `tokens or budget` key; with equal draft tokens the name decided (`b-128` before `b-32`)."""
    cells = []
    for name, budget in (("b-128", 128), ("b-32", 32)):
        made = cell(name, 8, 8, 500.0)
        cells.append(
            made.model_copy(update={"launch": made.launch.model_copy(update={"algorithm": "DDTREE", "budget": budget})})
        )
    best = choose(cells, 1, 0.02)
    assert best is not None and best.best == "b-32" and best.tied == ["b-32", "b-128"]


def plan(campaign: Path, *args: str) -> Any:
    return runbook_cli("plan", str(RUNBOOK), "--from-campaign", str(campaign), *args)  # a run folder, as `report` takes


def deploy_command(document: dict[str, Any]) -> str:
    [step] = [s for s in document["steps"] if s["id"] == "deploy_dflash"]
    return "\n".join(step["on"][0]["variants"][0]["commands"])


def test_plan_from_campaign_deploys_the_band_s_choice_and_says_each_var_s_source(campaign: Path) -> None:
    shown = plan(campaign, "--band", "8", "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    source = f"from campaign {campaign.name}, band 1-31: {ZLAB_4}, the cheapest of a tie at 1, 4, schedule.json"
    laid = {v["name"]: (v["value"], v["source"]) for v in document["campaign"]}
    assert laid["speculative_num_draft_tokens"] == ("4", source) and laid["drafter_repo"] == (DRAFTER, source)
    assert "--speculative-num-draft-tokens 4" in deploy_command(document)
    assert shown.stderr == ""  # the plan says the sources itself; a run says them on stderr
    # --var over the campaign, the campaign over the runbook
    over = plan(campaign, "--band", "1", "--json", "--var", "speculative_num_draft_tokens=8")
    document = json.loads(over.stdout)
    assert "--speculative-num-draft-tokens 8" in deploy_command(document)
    assert [v["overridden"] for v in document["campaign"] if v["name"] == "speculative_num_draft_tokens"] == [True]
    text = plan(campaign, "--band", "1")
    assert text.returncode == 0 and "# var speculative_algorithm = DFLASH  (from campaign " in text.stdout
    plain = runbook_cli("plan", str(RUNBOOK), "--json")  # without a campaign: the drafter's block size, as before
    assert "steps.inspect.facts.deploy.speculative_num_draft_tokens" in deploy_command(json.loads(plain.stdout))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "has 2 bands; name one: --band 1: concurrency 1-31, dflash[drafter=zlab,tokens=4]; --band 32: "),
        (("--band", "40"), "answer is the baseline: speculation stops paying (crossover 32)"),
        (("--band", "0"), "expected a concurrency, a whole number 1 to"),
    ],
)
def test_a_band_to_name_or_one_the_baseline_wins_is_refused(campaign: Path, args: tuple[str, ...], said: str) -> None:
    refused = plan(campaign, *args)
    assert refused.returncode == 2 and said in " ".join(refused.stderr.split()), refused.stderr


def test_run_from_campaign_launches_the_band_s_drafter_settings_and_the_probe_checks_its_gpus(
    runbook_offline: Offline, campaign: Path
) -> None:
    overlay = campaign_overlay(load_runbook(RUNBOOK), campaign, 16)
    FlagshipHost(runbook_offline.host("gpu"))
    run = run_flagship(runbook_offline, var=[f"{v.name}={v.value}" for v in overlay.vars_given(())])
    assert run.exit_code == 0, run.failures()
    gpu = runbook_offline.host("gpu")
    deploys = [(c.program.config, c.env) for c in gpu.commands if c.program and c.program.name == "deploy"]
    argv = [word for word, _ in deploys[1][0]["launch"]]  # as sent (its answer is a recorded document)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "$models_dir/$drafter_dir"  # the host expands
    assert deploys[1][1]["drafter_dir"] == "Kimi-K2.6-DFlash"
    assert run.facts("deploy_dflash")["choices"]["speculative_num_draft_tokens"]["source"] == (
        "runbook var speculative_num_draft_tokens"
    )


def test_a_campaign_of_other_gpus_stops_the_run_at_the_probe(runbook_offline: Offline, tmp_path: Path) -> None:
    run_dir = tmp_path / "b200"
    write_campaign(run_dir, campaign_views("NVIDIA B200", 8))
    overlay = campaign_overlay(load_runbook(RUNBOOK), run_dir, 1)
    FlagshipHost(runbook_offline.host("gpu"))
    run = run_flagship(runbook_offline, var=[f"{v.name}={v.value}" for v in overlay.vars_given(())])
    assert run.exit_code == 1 and run.ran() == ["probe"]
    assert "measured other GPUs than this host's" in (run.step("probe").message or "")


def tamper(campaign: Path, change: Any) -> None:
    document = json.loads((campaign / SCHEDULE_JSON).read_text())
    change(document["schedules"][0]["bands"][0])
    (campaign / SCHEDULE_JSON).write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda band: band["vars"].update(sglang_port="22"), "var 'sglang_port' is none a schedule may set"),
        (
            lambda band: band["vars"].update(drafter_dir="x; rm -rf /"),
            "var drafter_dir = 'x; rm -rf /' is not of the form",
        ),
        (lambda band: band["vars"].update(drafter_repo="gpu-box.example:22/x y"), "var drafter_repo"),
        (lambda band: band.update(low=float("nan")), "low"),
        (lambda band: band.pop("vars"), "vars"),
        (lambda band: band.update(high=2), "expected bands from 1 on"),
    ],
)
def test_a_tampered_schedule_is_refused_naming_what_was_expected(campaign: Path, change: Any, said: str) -> None:
    tamper(campaign, change)
    refused = plan(campaign, "--band", "1")
    assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert f"{SCHEDULE_JSON}:1:1: " in refused.stderr


def test_a_fifo_or_a_huge_schedule_is_refused_unread(campaign: Path) -> None:
    path = campaign / SCHEDULE_JSON
    path.unlink()
    os.mkfifo(path)
    refused = plan(campaign, "--band", "1")  # would wait forever on a FIFO opened for reading
    assert refused.returncode == 2 and "FIFO" in refused.stderr, refused.stderr
    path.unlink()
    with path.open("wb") as handle:
        handle.truncate(SCHEDULE_MAX_BYTES + 1)  # sparse: its size refuses it before a byte is read
    refused = plan(campaign, "--band", "1")
    assert refused.returncode == 2 and "larger than 1 MiB" in refused.stderr, refused.stderr


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=20), value=st.text(max_size=40))
def test_any_var_outside_the_documented_ones_or_off_pattern_is_refused(campaign: Path, name: str, value: str) -> None:
    from pydantic import ValidationError

    from steps.campaign_schedule import OVERLAY_VARS, Band

    band = json.loads((campaign / SCHEDULE_JSON).read_text())["schedules"][0]["bands"][0]
    band["vars"][name] = value
    known = name in OVERLAY_VARS and __import__("re").fullmatch(OVERLAY_VARS[name], value)
    if known:
        return
    with pytest.raises(ValidationError):
        Band.model_validate(band)


def test_the_mcp_plan_lays_a_campaign_under_its_roots_and_refuses_one_outside(campaign: Path, tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from tests.executor.test_mcp_guards import call

    flagship = tmp_path / "k26_dflash.yaml"
    flagship.write_text(RUNBOOK.read_text())
    answer = call("plan", tmp_path, file=str(flagship), campaign_dir=str(campaign), band=4)
    laid = {v["name"]: v["value"] for v in answer["campaign"]}
    assert laid["speculative_num_draft_tokens"] == "4" and laid["campaign_gpus"] == "1x NVIDIA H200", answer
    elsewhere = tmp_path / "site"
    elsewhere.mkdir()
    (elsewhere / "k26_dflash.yaml").write_text(RUNBOOK.read_text())
    refused = call("plan", elsewhere, file=str(elsewhere / "k26_dflash.yaml"), campaign_dir=str(campaign), band=4)
    assert refused["ok"] is False and refused["exit_code"] == 2 and "outside the server's roots" in refused["error"]
    refused = call("run", elsewhere, file=str(elsewhere / "k26_dflash.yaml"), campaign_dir=str(campaign), band=4)
    assert refused["ok"] is False and "outside the server's roots" in refused["error"], refused
    refused = call("plan", tmp_path, file=str(flagship), campaign_dir=str(campaign), band=40)  # the baseline's band
    assert refused["ok"] is False and refused["exit_code"] == 2 and "answer is the baseline" in json.dumps(refused)


@pytest.mark.parametrize(
    ("pair", "said"),
    [
        ("speculative_num_draft_tokens=x", "speculative_num_draft_tokens = 'x' does not fit: expected auto or a"),
        ("speculative_algorithm=", "speculative_algorithm is empty: expected an algorithm's name"),
        (
            "ddtree_budget=16",
            "speculative_ddtree_budget is DDTREE's tree budget: it needs `speculative_algorithm: DDTREE`",
        ),
    ],
)
def test_a_speculative_var_that_does_not_fit_stops_plan_at_the_deploy_s_line(pair: str, said: str) -> None:
    refused = runbook_cli("plan", str(RUNBOOK), "--var", pair)
    assert refused.returncode == 2 and "k26_dflash.yaml:" in refused.stderr and said in refused.stderr, refused.stderr


def test_run_from_campaign_says_each_var_s_source_and_refuses_the_baseline_s_band_before_any_host(
    campaign: Path, tmp_path: Path
) -> None:
    logs = ["--log-dir", str(tmp_path / "runs")]
    refused = runbook_cli("run", str(RUNBOOK), "--from-campaign", str(campaign), "--band", "32", *logs)
    assert refused.returncode == 2 and "answer is the baseline" in refused.stderr, refused.stderr
    assert not (tmp_path / "runs").exists()  # no run started
    # laid over before the run starts (here one that cannot: a resume of no run)
    said = runbook_cli("run", str(RUNBOOK), "--from-campaign", str(campaign), "--band", "2", "--resume", "none", *logs)
    assert said.returncode == 2 and "runbook: speculative_num_draft_tokens = 4  (from campaign " in said.stderr


def test_a_campaign_of_another_model_or_of_several_gpu_kinds_is_refused(campaign: Path, tmp_path: Path) -> None:
    document = json.loads((campaign / SCHEDULE_JSON).read_text())
    document["schedules"][0]["target_repo"] = "deepseek-ai/DeepSeek-V3"
    (campaign / SCHEDULE_JSON).write_text(json.dumps(document))
    refused = plan(campaign, "--band", "1")
    assert refused.returncode == 2 and "measured the model deepseek-ai/DeepSeek-V3" in refused.stderr, refused.stderr
    mixed = tmp_path / "mixed"
    write_campaign(mixed, campaign_views() + host_views("gpu2", "NVIDIA B200", scale=2.0))
    refused = plan(mixed, "--band", "1")
    assert refused.returncode == 2 and "the campaign ran on several GPU kinds" in refused.stderr, refused.stderr


def test_schedule_md_s_command_finds_a_campaign_run_outside_the_default_log_folder(tmp_path: Path) -> None:
    """`runbook demo --sweep --search --log-dir /tmp/d` writes `--from-campaign RUN --band 1`, which `runbook run`
    looks up under ./logs ("no run RUN in logs", exit 2): the command is not ready to paste unless it says where."""
    run_dir = tmp_path / "elsewhere" / "20260101T000000Z-sweep"
    write_campaign(run_dir, campaign_views())
    [command] = [line for line in (run_dir / "schedule.md").read_text().splitlines() if "--band 1" in line]
    assert str(run_dir) in command or f"--log-dir {run_dir.parent}" in command, command


def test_schedule_md_names_a_run_in_the_default_log_folder_by_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where `runbook run --from-campaign RUN` looks by default (./logs), the id is enough."""
    monkeypatch.chdir(tmp_path)
    run_dir = Path("logs") / "20260101T000000Z-sweep"
    write_campaign(run_dir, campaign_views())
    markdown = (run_dir / "schedule.md").read_text()
    assert f"runbook run runbooks/k26_dflash.yaml --from-campaign {run_dir.name} --band 1" in markdown


def test_plan_from_campaign_says_a_band_the_searchs_budget_left_unproven(tmp_path: Path) -> None:
    """A searched campaign whose budget left DFLASH 16 able to beat DFLASH 4 at 16: each var's source says so."""
    from tests.steps.test_campaign_report_search import left_open_at_c16

    run_dir = tmp_path / "logs" / "20260101T000000Z-sweep"
    write_campaign(run_dir, [*campaign_views(), *left_open_at_c16()])
    planned = plan(run_dir, "--band", "16", "--json")
    assert planned.returncode == 0, planned.stderr
    sources = {v["name"]: v["source"] for v in json.loads(planned.stdout)["campaign"]}
    assert "unproven at 16 (the search's budget: schedule.md)" in sources["speculative_num_draft_tokens"], sources


def test_a_band_unproven_where_it_never_measured_is_refused(campaign: Path) -> None:
    tamper(campaign, lambda band: band.update(unproven=[4096]))
    refused = plan(campaign, "--band", "1", "--json")
    assert refused.returncode == 2 and "unproven" in refused.stderr, (refused.stderr, refused.stdout[-600:])
