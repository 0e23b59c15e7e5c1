"""What a report's numbers are of, built offline from facts shaped as the kinds write them: complete when
the steps ran, and every gap named with its reason (no verify step, no probe)."""

from __future__ import annotations

from typing import Any

import pytest

from steps.provenance import Measured, Sources, build, gpus_of
from tests.steps.test_benchmark_report import bench_run

COMMIT = "4f1c" * 10
DRAFTER_COMMIT = "9a7e" * 10
ARGV = ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.6", "--tp-size", "8"]
DFLASH_ARGV = [*ARGV, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/drafter"]


def verify(repo: str, local_dir: str, commit: str, **problems: Any) -> dict[str, Any]:
    facts = {"repo": repo, "revision": "main", "local_dir": local_dir, "commit": commit, "manifest_error": None}
    return facts | {"files_expected": 3, "missing": [], "incomplete": [], "sha_mismatch": [], **problems}


def download(repo: str, local_dir: str, commit: str | None) -> dict[str, Any]:
    return {"repo": repo, "revision": "main", "commit": commit, "local_dir": local_dir, "hub_error": None}


def deploy(argv: list[str], draft: str | None = None, version: str | None = "0.5.23") -> dict[str, Any]:
    facts = {"argv": argv, "model_path": "/models/Kimi-K2.6", "draft_model_path": draft, "server_version": version}
    return facts | {"speculative_algorithm": "DFLASH" if draft else None, "server_version_unknown": None}


PROBE = {
    "gpu_count": 8,
    "gpu": {
        "gpus": [{"index": i, "name": "NVIDIA H200", "driver_version": "570.133.20"} for i in range(8)],
        "reason": None,
        "driver_version": "570.133.20",
        "cuda_version": "12.8",
        "unknown": {},
    },
}
DEPLOYS = {"deploy_baseline": deploy(ARGV), "deploy_dflash": deploy(DFLASH_ARGV, "/models/drafter")}
SIDES = [
    Measured("baseline", "benchmark_baseline", "deploy_baseline", [bench_run(1, 100.0), bench_run(4, 300.0)]),
    Measured("dflash", "benchmark_dflash", "deploy_dflash", [bench_run(1, 300.0), bench_run(4, 800.0)]),
]


def sources(**kinds: dict[str, Any]) -> Sources:
    return Sources(**({"host": "gpu", "probes": {}, "downloads": {}, "verifies": {}, "deploys": DEPLOYS} | kinds))


def test_every_part_is_known_when_the_steps_ran() -> None:
    found = sources(
        probes={"probe": PROBE},
        downloads={"download_target": download("moonshotai/Kimi-K2.6", "/models/Kimi-K2.6", COMMIT)},
        verifies={
            "verify_target": verify("moonshotai/Kimi-K2.6", "/models/Kimi-K2.6", COMMIT),
            "verify_drafter": verify("z-lab/Kimi-K2.6-DFlash", "/models/drafter/", DRAFTER_COMMIT),
        },
    )
    facts = {"api": "chat", "template": "the server's chat template (/v1/chat/completions)", "thinking": True}
    p = build(found, SIDES, "2026-12-01T18:00:00+00:00", "eval", facts)
    assert [(r.repo, r.commit, r.step, r.verified) for r in p.repos] == [
        ("moonshotai/Kimi-K2.6", COMMIT, "verify_target", True),
        ("z-lab/Kimi-K2.6-DFlash", DRAFTER_COMMIT, "verify_drafter", True),
    ]  # the download of a verified folder is not listed twice
    baseline, dflash = p.deployments
    assert (baseline.side, baseline.step, baseline.host) == ("baseline", "deploy_baseline", "gpu")
    assert baseline.server_version == "0.5.23"
    assert baseline.argv == ARGV and baseline.gpus == 8 and baseline.speculative_algorithm is None
    assert dflash.draft_model_path == "/models/drafter" and dflash.speculative_algorithm == "DFLASH"
    assert p.gpus is not None and (p.gpus.model, p.gpus.count, p.gpus.step) == ("NVIDIA H200", 8, "probe")
    assert (p.gpus.driver_version, p.gpus.cuda_version) == ("570.133.20", "12.8")
    assert [[r.concurrency for r in b.runs] for b in p.benchmarks] == [[1, 4], [1, 4]]
    assert p.acceptance is not None and (p.acceptance.api, p.acceptance.thinking) == ("chat", True)
    assert p.generated_at == "2026-12-01T18:00:00+00:00"
    benchmark_fields = {k for k in p.unknown if k.startswith("benchmarks.")}
    assert set(p.unknown) == benchmark_fields  # only what benchmark facts without repeats lack (below)


def test_without_a_verify_step_the_commit_is_the_download_s_and_unverified_and_said() -> None:
    found = sources(downloads={"download_target": download("moonshotai/Kimi-K2.6", "/models/Kimi-K2.6", COMMIT)})
    p = build(found, SIDES, "2026-12-01T18:00:00+00:00")
    ((repo,),) = [p.repos]
    assert (repo.commit, repo.step, repo.verified) == (COMMIT, "download_target", False)
    assert p.unknown["repos.moonshotai/Kimi-K2.6.verified"] == (
        "no verify step on host gpu checked /models/Kimi-K2.6: its files are not known to be those of the commit "
        "download_target downloaded"
    )
    assert p.unknown["deployments.dflash.draft_model_path"] == (
        "no download or verify step on host gpu names /models/drafter: its commit is not known"
    )
    assert p.gpus is None and p.unknown["gpus"].startswith("no probe step ran on host gpu: the GPU model")
    assert p.acceptance is None and "acceptance" not in p.unknown


def test_nothing_before_the_benchmark_still_gives_a_complete_provenance_of_nulls_and_reasons() -> None:
    bare = Sources(host="gpu", probes={}, downloads={}, verifies={}, deploys={})
    p = build(bare, SIDES, "2026-12-01T18:00:00+00:00", "eval", {"sets": {}})
    assert p.repos == [] and p.unknown["repos"].startswith("no download or verify step ran on host gpu")
    assert [d.argv for d in p.deployments] == [None, None]
    assert p.unknown["deployments.baseline"] == "no facts of the deploy step 'deploy_baseline' on host gpu"
    assert p.unknown["acceptance"].startswith("the facts of eval do not say which API, template and thinking")
    assert [(r.concurrency, r.repeat, r.seed) for r in p.benchmarks[0].runs] == [(1, 1, 1), (4, 1, 1)]


def test_a_verify_that_found_problems_is_not_verified_and_says_why() -> None:
    bad = verify("moonshotai/Kimi-K2.6", "/models/Kimi-K2.6", COMMIT, missing=["a.safetensors"], sha_mismatch=[{}])
    p = build(sources(verifies={"verify_target": bad}), SIDES, "t")
    assert [r.verified for r in p.repos] == [False]
    assert p.unknown["repos.moonshotai/Kimi-K2.6.verified"] == (
        "verify_target did not verify /models/Kimi-K2.6: files 1 missing, 1 with other contents"
    )


def test_a_server_that_did_not_say_its_version_is_named() -> None:
    deploys = {"deploy_baseline": deploy(ARGV, version=None), "deploy_dflash": deploy(DFLASH_ARGV)}
    deploys["deploy_baseline"]["server_version_unknown"] = "/server_info answered 404 'Not Found'"
    p = build(sources(deploys=deploys), SIDES, "t")
    assert p.unknown["deployments.baseline.server_version"] == "/server_info answered 404 'Not Found'"


def test_a_node_group_is_recorded_in_rank_order_and_one_hosts_server_has_none() -> None:
    group = {"nodes": ["gpu1", "gpu2"], "gpus_per_node": 8, "tp_size": 16, "dist_init_addr": "node1.example:20000"}
    group |= {"per_node": {}}  # as the deploy step records it, each rank's wiring besides (not provenance)
    deploys = {"deploy_baseline": deploy(ARGV), "deploy_dflash": deploy(DFLASH_ARGV) | {"group": group}}
    p = build(sources(deploys=deploys), SIDES, "t")
    baseline, dflash = p.deployments
    assert baseline.group is None and dflash.group is not None
    assert [(n.rank, n.host, n.gpus) for n in dflash.group.nodes] == [(0, "gpu1", 8), (1, "gpu2", 8)]
    assert (dflash.group.tp_size, dflash.group.dist_init_addr) == (16, "node1.example:20000")
    # facts of a deploy from before the group named its GPU model: null, and why
    assert all(n.gpu_model is None for n in dflash.group.nodes)
    assert (
        p.unknown["deployments.dflash.group.gpu_model"] == "the facts of deploy_dflash do not name the nodes' GPU model"
    )


@pytest.mark.parametrize(
    ("extra", "count"),
    [
        ([], 1),
        (["--tp-size", "8"], 8),
        (["--tensor-parallel-size", "4", "--pp-size", "2"], 8),
        (["--tp-size", "8", "--dp-size", "2"], 16),
        (["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], 8),  # DP attention lives inside TP
        (["--tp-size", "x"], None),
        # argparse's `--flag=value` form, as a deploy's extra_args may give it (its tp is always `--tp-size N`)
        (["--tp-size", "8", "--dp-size=2"], 16),
        (["--tp-size", "4", "--pipeline-parallel-size=2"], 8),
        (["--tp-size", "8", "--dp-size=x"], None),
        (["--tp-size", "-8"], None),  # no size below 1: -8 GPUs would be the cheapest configuration
        (["--tp-size", "8", "--pp-size=0"], None),
        (["--tp-size", "65536"], 65536),
        (["--tp-size", "9" * 400], None),  # a tampered argv: its throughput per GPU overflowed a float
        (["--tp-size", "8", "--dp-size=65537"], None),
    ],
)
def test_the_gpus_of_a_launch_command(extra: list[str], count: int | None) -> None:
    assert gpus_of(["python", "-m", "sglang.launch_server", *extra]) == count
