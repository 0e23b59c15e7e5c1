"""Pools: named lists of hosts (`hosts: gpus`), and an inventory that gives a pool a site's hosts, so one
campaign runbook runs on one host or on three without being edited. Through the CLI (`validate`, `plan`),
as a user would try it; each test fails on a runbook format without `pools:`."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.clirun import runbook_cli

SWEEP = Path(__file__).resolve().parents[2] / "runbooks" / "k26_dflash_sweep.yaml"

RUNBOOK = """\
name: pooled
hosts:
  gpu: {address: gpu-box.example}
  box: {address: local}
pools:
  gpus: [gpu]
steps:
  - {id: hello, kind: shell, hosts: gpus, script: echo hi}
  - group: grid
    matrix: {n: [1, 2, 3]}
    hosts: gpus
    placement: spread
    steps:
      - {id: up, kind: deploy, model_path: "/m${{ matrix.n }}", tp_size: 1, port: 30000, attention_backend: fa3}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_step_and_a_matrix_group_name_a_pool_and_an_inventory_gives_it_other_hosts(tmp_path: Path) -> None:
    runbook = write(
        tmp_path,
        "pooled.yaml",
        RUNBOOK.replace("      - {id: note, kind: shell, script: 'echo \"$matrix_n\"', host: box}\n", ""),
    )
    plan = runbook_cli("plan", str(runbook))
    assert plan.returncode == 0, plan.stderr
    assert "## step 1 'hello' (shell) on gpu [gpu-box.example]" in plan.stdout
    assert "#   placement: spread over gpu" in plan.stdout
    site = {
        "hosts": {"gpu1": {"address": "127.0.0.1", "port": 2201}, "gpu2": {"address": "127.0.0.1", "port": 2202}},
        "pools": {"gpus": ["gpu1", "gpu2"]},
    }
    inventory = write(tmp_path, "site.yaml", yaml.safe_dump(site))
    plan = runbook_cli("plan", str(runbook), "--inventory", str(inventory))
    assert plan.returncode == 0, plan.stderr
    assert re.findall(r"## step \d+ 'hello' \(shell\) on (\w+)", plan.stdout) == ["gpu1", "gpu2"]
    assert "#   placement: spread over gpu1, gpu2" in plan.stdout
    placed = re.findall(r"#     (up\[n=\d\]) on (\w+)", plan.stdout)
    assert placed == [("up[n=1]", "gpu1"), ("up[n=2]", "gpu2"), ("up[n=3]", "gpu1")]


def test_the_campaign_runbook_spreads_its_server_configurations_over_an_inventorys_pool(tmp_path: Path) -> None:
    hosts = {f"gpu{n}": {"address": "127.0.0.1", "port": 2200 + n} for n in (1, 2, 3)}
    inventory = write(tmp_path, "site.yaml", yaml.safe_dump({"hosts": hosts, "pools": {"gpus": list(hosts)}}))
    done = runbook_cli("plan", str(SWEEP), "--inventory", str(inventory))
    assert done.returncode == 0, done.stderr
    placed = re.findall(r"#     deploy_dflash\[[^\]]+\] on (\w+)", done.stdout)
    assert len(placed) == 12 and {placed.count(h) for h in hosts} == {4}
    assert "12 cells (0 excluded, 0 included), 42 step instances, 12 server configurations = 12 launches" in done.stdout
    # every GPU host downloads what its cells need: both drafters reach every host of three
    assert (
        len(re.findall(r"## step \d+ 'download_drafter\[drafter=tmp-long\]' \(download\) on gpu\d", done.stdout)) >= 2
    )


def test_pool_mistakes_are_refused_at_their_line(tmp_path: Path) -> None:
    runbook = write(tmp_path, "pooled.yaml", RUNBOOK.replace("hosts: gpus, script", "hosts: gpuz, script"))
    done = runbook_cli("validate", str(runbook))
    assert done.returncode == 2
    assert f"{runbook}:8:" in done.stderr and "hosts: 'gpuz' is neither `all` nor a pool" in done.stderr
    assert "did you mean 'gpus'" in done.stderr
    named_host = write(tmp_path, "host.yaml", RUNBOOK.replace("hosts: gpus, script", "hosts: box, script"))
    done = runbook_cli("validate", str(named_host))
    assert done.returncode == 2 and "'box' is a host: `host: box`" in done.stderr
    bad_member = write(tmp_path, "member.yaml", RUNBOOK.replace("gpus: [gpu]", "gpus: [gpu, gpx]"))
    done = runbook_cli("validate", str(bad_member))
    assert done.returncode == 2
    assert f"{bad_member}:6:15: pools.gpus[1]: pool 'gpus' lists 'gpx', not a host of the runbook" in done.stderr
    host_named = write(tmp_path, "named.yaml", RUNBOOK.replace("gpus: [gpu]", "gpus: [gpu]\n  box: [gpu]"))
    done = runbook_cli("validate", str(host_named))
    assert done.returncode == 2 and f"{host_named}:7:8: pools.box: pool 'box' has the name of a host" in done.stderr
    both = "vars: {hf_token: x}\nsecrets:\n  hf_token: {env: T}\npools:"
    clash = write(tmp_path, "clash.yaml", RUNBOOK.replace("pools:", both))
    done = runbook_cli("validate", str(clash))
    said = f"{clash}:7:13: secrets.hf_token: names used both as var and as secret"
    assert done.returncode == 2 and said in done.stderr


def test_nodes_all_is_every_host_in_the_runbooks_order(tmp_path: Path) -> None:
    text = RUNBOOK.split("pools:")[0].replace("box: {address: local}", "gpu2: {address: gpu-box2.example}")
    text += "steps:\n  - {id: probe, kind: probe, hosts: all}\n"
    text += "  - {id: up, kind: deploy, nodes: all, probe: probe, model_path: /m, port: 1, attention_backend: fa3}\n"
    runbook = write(tmp_path, "all.yaml", text)
    plan = runbook_cli("plan", "--full", str(runbook))
    assert plan.returncode == 0, plan.stderr
    assert "rank 0 on gpu: launch" in plan.stdout and "rank 1 on gpu2: launch" in plan.stdout


def test_an_inventory_adds_only_the_hosts_its_pools_list_and_only_pools_the_runbook_has(tmp_path: Path) -> None:
    runbook = write(tmp_path, "pooled.yaml", RUNBOOK)
    cases = {
        "stray": {"hosts": {"gpu9": {"address": "127.0.0.1"}}},
        "pool": {"pools": {"gpux": ["gpu"]}},
        "member": {"hosts": {"gpu1": {"address": "127.0.0.1"}}, "pools": {"gpus": ["gpu1", "gpu7"]}},
    }
    expected = {
        "stray": "hosts: 'gpu9' is not in the runbook (a host the runbook does not name is added by listing it",
        "pool": "pools: 'gpux' is not in the runbook",
        "member": "pools.gpus: 'gpu7' is a host of neither the runbook nor this inventory",
    }
    for name, data in cases.items():
        inventory = write(tmp_path, f"{name}.yaml", yaml.safe_dump(data))
        done = runbook_cli("validate", str(runbook), "--inventory", str(inventory))
        assert done.returncode == 2, name
        assert f"{inventory}:" in done.stderr and expected[name] in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
