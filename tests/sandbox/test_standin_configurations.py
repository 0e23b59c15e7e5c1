"""The SGLang stand-in's configurations make the campaign's choices matter: acceptance and cost follow
the draft token count, the DDTREE budget, the target's architecture and the drafter, as on real GPUs
(sandbox/sglang_standin/simulation.py); DDTREE only where SGLang has it (the DDTree PR build)."""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.demo import LANDSCAPES
from sandbox.model_configs import TMP_LONG_ID, drafter_config, hybrid_target_config, target_config
from sandbox.sglang_standin import faults
from sandbox.sglang_standin.simulation import DEFAULT_PHYSICS, Physics, Speculation, apply_chat_template, step_seconds
from sandbox.sshd import free_port
from tests.conftest import SandboxHost
from tests.sandbox.test_sglang_standin import FAST, Server, foreground, generate, http, start, wait_healthy
from tests.sandbox.test_sglang_standin import servers as servers  # the fixture: servers stopped after the test

THINKING = {
    kind: [apply_chat_template([{"role": "user", "content": f"{text} Case {i}."}], thinking=True) for i in range(12)]
    for kind, text in {
        "math": "Natalia sold 48 clips in April and half as many in May. How many clips did she sell in total?",
        "code": "Write a python function that returns the n-th Fibonacci number.",
        "chat": "Tell me something nice about the sea in the morning.",
    }.items()
}
RAW = [f"lorem ipsum dolor {i} sit amet" for i in range(12)]


def mean_accept(speculation: Speculation, prompts: list[str]) -> float:
    return statistics.mean(speculation.accept_length(p, None) for p in prompts)


@pytest.mark.parametrize("kind", sorted(THINKING))
def test_more_draft_tokens_accept_more_with_diminishing_returns_and_a_falling_rate(kind: str) -> None:
    length = {k: mean_accept(Speculation("DFLASH", k), THINKING[kind]) for k in (2, 4, 8, 16)}
    assert length[2] < length[4] < length[8] < length[16]
    assert length[16] - length[8] < length[8] - length[4] < (length[4] - length[2]) * 2
    rate = {k: (length[k] - 1) / (k - 1) for k in length}  # accepted drafts per proposed one
    assert rate[2] > rate[4] > rate[8] > rate[16]


def test_ddtree_budget_raises_acceptance_on_attention_and_collapses_on_a_hybrid_target() -> None:
    prompts = THINKING["math"]
    pure = {b: mean_accept(Speculation("DDTREE", 8, b), prompts) for b in (16, 32, 64)}
    assert mean_accept(Speculation("DFLASH", 8), prompts) < pure[16] < pure[32] < pure[64]
    hybrid = {
        b: [Speculation("DDTREE", 8, b, hybrid_target=True).accept_length(p, None) for p in prompts] for b in pure
    }
    assert statistics.mean(hybrid[16]) > 4
    for budget in (32, 64):
        assert all(1.0 <= value <= 1.3 for value in hybrid[budget]), (budget, hybrid[budget])


def test_the_tmp_long_drafter_is_worse_on_code_only() -> None:
    zlab, tmp_long = Speculation("DFLASH", 8), Speculation("DFLASH", 8, drafter=TMP_LONG_ID)
    assert mean_accept(tmp_long, THINKING["code"]) < mean_accept(zlab, THINKING["code"]) - 0.8
    assert mean_accept(tmp_long, THINKING["math"]) == mean_accept(zlab, THINKING["math"])
    assert mean_accept(tmp_long, THINKING["chat"]) >= mean_accept(zlab, THINKING["chat"])


def speedup(speculation: Speculation, concurrency: int) -> float:
    """Decode throughput over the baseline's at this concurrency (bench_serving's random text: raw)."""
    accepted = mean_accept(speculation, RAW)
    return accepted * step_seconds(300.0, None, concurrency) / step_seconds(300.0, speculation, concurrency)


def test_verify_steps_cost_more_with_more_tokens_and_speculation_stops_paying_at_high_concurrency() -> None:
    costs = [Speculation("DFLASH", k).verify_cost for k in (4, 8, 16)] + [Speculation("DDTREE", 8, 64).verify_cost]
    assert costs == sorted(costs) and Speculation("DFLASH", 8).verify_cost == pytest.approx(1.3)
    for speculation in (Speculation("DFLASH", 4), Speculation("DFLASH", 16), Speculation("DDTREE", 8, 32)):
        gains = [speedup(speculation, c) for c in (1, 4, 16, 32)]
        assert gains == sorted(gains, reverse=True) and gains[0] > 1 > gains[-1], (speculation, gains)
    # the crossover comes earlier for the heavier configuration: at 16 the small one still pays
    assert speedup(Speculation("DFLASH", 4), 16) > 1 > speedup(Speculation("DFLASH", 16), 16)


def test_another_landscape_moves_the_optimum_to_a_tree_and_the_other_drafter() -> None:
    """The demo's `headroom` landscape (cheaper verification, a larger tree gain, tmp-long worse on chat): alone on
    the GPU, a DDTREE budget is fastest and z-lab's drafter beats tmp-long's, where the defaults have DFLASH 8 and
    tmp-long."""
    settings = [("DFLASH", k, None) for k in (4, 8, 16)] + [("DDTREE", 8, b) for b in (16, 32, 64)]

    def speed(setting: tuple[str, int, int | None], drafter: str | None, physics: Physics) -> float:
        speculation = Speculation(*setting, drafter, physics=physics)
        return mean_accept(speculation, THINKING["chat"]) / step_seconds(300.0, speculation, 1)

    headroom = faults.parse(LANDSCAPES["headroom"]).physics
    for physics, fastest, drafter in ((headroom, "DDTREE", None), (DEFAULT_PHYSICS, "DFLASH", TMP_LONG_ID)):
        ranked = sorted(((speed(s, d, physics), s, d) for s in settings for d in (None, TMP_LONG_ID)), reverse=True)
        assert ranked[0][1][0] == fastest and ranked[0][2] == drafter, ranked[:3]


# ---------------------------------------------------------------- through the stand-in server


@pytest.fixture
def folders(testhost: Callable[..., SandboxHost]) -> Iterator[Callable[[SandboxHost], dict[str, Path]]]:
    """Model folders (config.json only) in a host's HOME: Kimi-shaped and hybrid targets, both drafters."""
    made: list[Path] = []

    def make(host: SandboxHost) -> dict[str, Path]:
        root = host.home / "models-configurations"
        configs = {
            "kimi": target_config(),
            "qwen": hybrid_target_config(),
            "zlab": drafter_config(),
            "tmp-long": drafter_config(TMP_LONG_ID),
        }
        for name, config in configs.items():
            (root / name).mkdir(parents=True, exist_ok=True)
            (root / name / "config.json").write_text(json.dumps(config))
        made.append(root)
        return {name: root / name for name in configs}

    yield make
    for root in made:
        for path in sorted(root.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        root.rmdir()


def flags(target: Path, draft: Path, *extra: str) -> list[str]:
    return ["--model-path", str(target), "--speculative-draft-model-path", str(draft), "--tp-size", "1",
            "--host", "127.0.0.1", "--port", str(free_port()), *extra]  # fmt: skip


def accept_on(server: Server, prompts: list[str]) -> float:
    return statistics.mean(generate(server, p, max_new_tokens=48)["meta_info"]["spec_accept_length"] for p in prompts)


def test_ddtree_serves_tree_verification_only_on_the_build_with_the_ddtree_pr(
    testhost: Callable[..., SandboxHost], folders: Callable[[SandboxHost], dict[str, Path]], servers: list[Server]
) -> None:
    release = testhost("h200")
    models = folders(release)
    ddtree = ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "32")
    command = f"python -m sglang.launch_server {shlex.join(flags(models['kimi'], models['zlab'], *ddtree))}"
    status, output = foreground(release, command)
    assert status == 2 and "unrecognized arguments: --speculative-ddtree-budget 32" in output
    status, output = foreground(release, command.replace(" --speculative-ddtree-budget 32", ""))
    assert status == 1 and "ValueError: Unknown speculative algorithm name: DDTREE" in output

    pr = testhost("h200", sglang="ddtree-pr")
    models = folders(pr)
    with pr.standin(**FAST):
        servers.append(kimi := start(pr, flags(models["kimi"], models["zlab"], *ddtree), "ddtree-kimi"))
        servers.append(qwen := start(pr, flags(models["qwen"], models["zlab"], *ddtree), "ddtree-qwen"))
        wait_healthy(kimi)
        wait_healthy(qwen)
    info = json.loads(http(kimi.url + "/server_info")[1])
    assert info["speculative_algorithm"] == "DDTREE" and info["speculative_ddtree_budget"] == 32
    assert info["speculative_num_draft_tokens"] == 33  # CUDA graphs for budget + 1 tokens
    prompts = THINKING["math"][:4]
    assert accept_on(kimi, prompts) > 5 and 1.0 <= accept_on(qwen, prompts) <= 1.3  # the hybrid target collapses


def test_the_drafters_config_picks_its_profile_in_the_server(
    testhost: Callable[..., SandboxHost], folders: Callable[[SandboxHost], dict[str, Path]], servers: list[Server]
) -> None:
    host = testhost("h200")
    models = folders(host)
    dflash = ("--speculative-algorithm", "DFLASH")
    with host.standin(**FAST):
        servers.append(zlab := start(host, flags(models["kimi"], models["zlab"], *dflash), "zlab"))
        servers.append(tmp_long := start(host, flags(models["kimi"], models["tmp-long"], *dflash), "tmp-long"))
        wait_healthy(zlab)
        wait_healthy(tmp_long)
    code = THINKING["code"][:4]
    assert accept_on(tmp_long, code) < accept_on(zlab, code) - 0.8
