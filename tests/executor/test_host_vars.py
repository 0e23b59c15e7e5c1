"""`hosts.NAME.vars`: each host of a pool gets its own values of the runbook's vars, in its steps'
environment, its gates' `vars`, the plan and its steps' fingerprints, so a resume reruns only the steps of
the host whose var changed. Through the CLI, on three test hosts answering at once (`testhosts`)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sandbox.testhost import PoolHost, pool_inventory
from tests.clirun import runbook_cli
from tests.runfolders import run_folders

RUNBOOK = """\
name: pool
hosts: {gpu1: {address: 127.0.0.1}, gpu2: {address: 127.0.0.1}, gpu3: {address: 127.0.0.1}}
vars: {sglang_port: 30000, models_dir: /nowhere, barrier: BARRIER}
steps:
  - id: where
    kind: shell
    hosts: all
    parse: json
    script: |
      touch "$barrier/$sglang_port"
      for i in $(seq 300); do [ "$(ls "$barrier" | wc -l)" -ge 3 ] && break; sleep 0.1; done
      printf '{"port": %s, "gpu": "%s", "home": "%s", "seen": %s}' \\
        "$sglang_port" "$RUNBOOK_SANDBOX_GPU" "$HOME" "$(ls "$barrier" | wc -l)"
    gates:
      - that: "facts.port == vars.sglang_port and vars.models_dir == facts.home ~ '/models'"
  - id: after
    kind: shell
    hosts: all
    script: test -e "$barrier/go"
"""


def facts_by_host(logs: Path, step: str) -> dict[str, Any]:
    done = runbook_cli("status", "--log-dir", str(logs), "--json")
    assert done.returncode == 0, done.stderr
    return {r["host"]: r["facts"] for r in json.loads(done.stdout)["steps"] if r["step"] == step}


def test_each_host_gets_its_own_vars_and_a_changed_one_reruns_only_its_steps(
    testhosts: Callable[..., list[PoolHost]], tmp_path: Path
) -> None:
    hosts = testhosts(3, variants=("h200x8", "h200x8", "h100"))
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    book = tmp_path / "pool.yaml"
    book.write_text(RUNBOOK.replace("BARRIER", str(barrier)))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(pool_inventory(hosts, {})))
    ports = {host.name: host.sglang_port for host in hosts}
    assert len(set(ports.values())) == 3 and 30000 not in ports.values()

    plan = runbook_cli("plan", "--full", str(book), "--inventory", str(inventory))
    assert plan.returncode == 0, plan.stderr
    for host in hosts:
        section = plan.stdout.split(f"'where' (shell) on {host.name} ")[1].split("##")[0]
        assert f"export sglang_port={host.sglang_port}\n" in section
        assert f"export models_dir={host.home / 'models'}\n" in section

    logs = tmp_path / "logs"
    first = runbook_cli("run", str(book), "--inventory", str(inventory), "--log-dir", str(logs))
    assert first.returncode == 1 and "after" in first.stderr  # `where` passed everywhere, its gate included
    where = facts_by_host(logs, "where")
    assert {name: f["port"] for name, f in where.items()} == ports
    assert {name: f["gpu"] for name, f in where.items()} == {"gpu1": "h200x8", "gpu2": "h200x8", "gpu3": "h100"}
    assert len({f["home"] for f in where.values()}) == 3
    assert all(f["seen"] >= 3 for f in where.values())  # each waited for the others: the three ran at once

    (barrier / "go").touch()
    moved = pool_inventory(hosts, {})
    moved["hosts"]["gpu2"]["vars"]["sglang_port"] = ports["gpu2"] + 1
    inventory.write_text(yaml.safe_dump(moved))
    again = runbook_cli("run", str(book), "--resume", "--inventory", str(inventory), "--log-dir", str(logs))
    assert again.returncode == 0, again.stderr
    said = again.stdout + again.stderr
    assert "runs again on gpu2 (changed there since" in said and "var sglang_port); reused on gpu1, gpu3" in said
    resumed = run_folders(logs)[-1]
    audit = [json.loads(line) for line in (resumed / "audit.jsonl").read_text().splitlines()]
    ran = {(r.get("step"), r.get("host")) for r in audit if r.get("step")}
    assert ("where", "gpu2") in ran and ("where", "gpu1") not in ran and ("where", "gpu3") not in ran
    assert {("after", name) for name in ports} <= ran
    assert facts_by_host(logs, "where")["gpu2"]["port"] == ports["gpu2"] + 1


def test_a_host_var_the_runbook_does_not_declare_is_refused_where_it_is_written(tmp_path: Path) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(
        textwrap.dedent("""\
        name: typo
        hosts:
          a: {address: local, vars: {sglang_prot: 1}}
          b: {address: local, vars: {sglang_port: 0123}}
        vars: {sglang_port: 30000}
        steps:
          - {id: s, kind: shell, hosts: all, script: 'echo "$sglang_port"'}
        """)
    )
    done = runbook_cli("validate", str(book))
    assert done.returncode == 2
    assert f"{book}:3:30: hosts.a.vars: 'sglang_prot' is not a var of the runbook" in done.stderr
    assert "did you mean 'sglang_port'" in done.stderr
    assert f"{book}:4:43: hosts.b.vars.sglang_port: YAML reads 0123 as the int 83" in done.stderr
