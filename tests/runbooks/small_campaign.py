"""The flagship campaign (runbooks/k26_dflash_sweep.yaml) cut down to a few of its cells, run through the CLI on
test hosts (`testhosts`) against the local Hub, for the campaign tests that need a real run but not all 48
cells: the same steps, `when:` and placement, fewer axis values and shorter benchmarks and evals.

`cut(...)` is the runbook as YAML data; `CampaignSite` stands up what `runbook demo --sweep` stands up (the
Hub double, an inventory whose pool `gpus` lists the hosts, the stand-in's switches in each HOME), runs the
campaign, and on exit stops the servers and removes what it wrote into the hosts' HOMEs (shared with other
tests of the session).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from sandbox import prepare
from sandbox.demo import stop_servers
from sandbox.hub import HubServer
from sandbox.sglang_standin import faults as standin_switches
from sandbox.testhost import PoolHost, pool_inventory
from tests.conftest import runbook_cli

FLAGSHIP = Path(__file__).resolve().parents[2] / "runbooks" / "k26_dflash_sweep.yaml"


def cut(
    drafters: Sequence[str],
    specs: Sequence[str],
    *,
    concurrencies: Sequence[int],
    repeats: int,
    output_len: int,
    input_len: int = 16,
    exclude: Sequence[Mapping[str, str]] = (),
    eval_limit: int = 1,
    eval_tokens: int = 16,
    slo: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The flagship with only these drafters and specs (by name, in this order: the order of the launches and of
    the placement), its benchmarks at these concurrencies and lengths on random ids alone (the sweep's workloads
    are tests/runbooks/test_k26_dflash_sweep.py's), its evals on `eval_limit` prompts per set; `slo` replaces the
    benchmarks' SLOs (the flagship's suit its 512 output tokens on real GPUs, not a cut benchmark on the stand-in)."""
    data: dict[str, Any] = yaml.safe_load(FLAGSHIP.read_text())
    steps = {step.get("id") or step["group"]: step for step in data["steps"]}
    group = steps["sweep"]
    matrix = group["matrix"]
    for axis, names in (("drafter", drafters), ("spec", specs)):
        by_name = {value["name"]: value for value in matrix[axis]}
        matrix[axis] = [by_name[name] for name in names]
    if exclude:
        matrix["exclude"] = [dict(e) for e in exclude]
    mates = {step["id"]: step for step in group["steps"]}
    for bench in (steps["benchmark_baseline"], mates["benchmark"]):
        bench |= {"concurrencies": list(concurrencies), "repeats": repeats}
        bench |= {"input_len": input_len, "output_len": output_len}
        bench.pop("workloads")
        bench.pop("slo", None)
        bench |= {"slo": dict(slo)} if slo else {}
    for evaluation in (steps["eval_baseline"], mates["eval"]):
        evaluation |= {"limit": eval_limit, "max_new_tokens": eval_tokens}
    data["vars"]["sglang_ready_timeout"] = "2m"
    return data


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@dataclass
class CampaignSite:
    """The hosts, the Hub double and an inventory of them; `run` runs a campaign there through the CLI."""

    hosts: Sequence[PoolHost]
    root: Path  # where the runbook, inventory and logs go
    switches: Mapping[str, object]  # the stand-in's (sandbox/sglang_standin/faults.py), on every host
    hub: HubServer = field(default_factory=HubServer)
    _before: dict[Path, set[Path]] = field(default_factory=dict)

    def __enter__(self) -> CampaignSite:
        self.hub.start()
        for host in self.hosts:
            self._before[host.home] = set(host.home.iterdir())
            standin_switches.path(host.home).write_text(json.dumps(dict(self.switches)))
        site_vars = {
            "sglang_python": str(prepare.VENV_PYTHON),
            "hf_cli": str(prepare.VENV / "bin" / "hf"),
            "HF_ENDPOINT": self.hub.endpoint,
        }
        data = pool_inventory(self.hosts, site_vars) | {"pools": {"gpus": [host.name for host in self.hosts]}}
        self.inventory.write_text(yaml.safe_dump(data))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.hub.stop()
        for host in self.hosts:
            stop_servers(host.home)
            for path in set(host.home.iterdir()) - self._before.get(host.home, set()):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yaml"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def run(self, runbook: Mapping[str, Any], *more: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`runbook run RUNBOOK --inventory ... --json` with the Hub's token as HF_TOKEN (the runbook is written
        to `campaign.yaml` first, so a `--resume` after a change runs the changed file)."""
        path = self.root / "campaign.yaml"
        path.write_text(yaml.safe_dump(dict(runbook), sort_keys=False))
        args = ("run", str(path), "--inventory", str(self.inventory), "--log-dir", str(self.logs), "--json", *more)
        return runbook_cli(*args, env={"HF_TOKEN": self.hub.token}, timeout=timeout)

    def status(self, run_id: str) -> dict[str, Any]:
        done = runbook_cli("status", run_id, "--log-dir", str(self.logs), "--json")
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result
