"""Record a landscape of the flagship campaign: the grid run once on the demo site's test host with one of
demo.LANDSCAPES, every configuration's measure written as tests/executor/runbook/search_landscapes/ holds them
(`baseline` -> band -> [median, min, max, accept], `configs` -> deploy instance -> the same; `switches`: the
stand-in's landscape), which the pure search is then driven over in-process (tests/executor/runbook/test_search.py).

    python3 -m sandbox.record_landscape headroom tests/executor/runbook/search_landscapes/standin_headroom.json

A few minutes (the grid's 12 launches, one repeat each). Nothing here is used by a real run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from executor.run.state import open_state
from executor.runbook.cells import Index
from executor.runbook.loader import load_runbook
from executor.runbook.search import Measure
from sandbox.demo import LANDSCAPES, demo_site, searching_copy


def rows(measures: dict[str, Measure]) -> dict[str, list[float | None]]:
    return {band: [m.median, m.low, m.high, m.accept] for band, m in measures.items()}


def record(landscape: str, out: Path) -> None:
    """Run the grid with `landscape` and write what its measuring steps measured to `out`."""
    with tempfile.TemporaryDirectory() as folder, demo_site(Path(folder), sweep=True, landscape=landscape) as site:
        logs = Path(folder) / "logs"
        args = [str(site.runbook), "--inventory", str(site.inventory), "--log-dir", str(logs), "--json"]
        done = subprocess.run(
            [sys.executable, "-m", "executor.faces.cli", "run", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_TOKEN": site.hf_token},
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"the grid failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        with open_state(logs / json.loads(done.stdout.splitlines()[0])["run_id"]) as state:
            records = {r.step: r for r in state.records() if r.status == "passed"}
        # the grid's steps are its searching copy's, whose `search:` names the measuring steps
        runbook = load_runbook(searching_copy(site.runbook, Path(folder)), site.inventory)
    specs = {spec.id: spec for spec in runbook.steps}
    group = next(g for g in runbook.groups if g.search is not None)
    assert group.search is not None and group.search.baseline is not None
    index = Index(runbook)

    def measured(step: str) -> dict[str, Measure]:
        return specs[step].search_measures(records[step].facts)

    configs = {}
    for server in group.servers:
        step = index.mate(server, group.search.measure)
        assert step is not None, server
        configs[server] = rows(measured(step))
    data = {"switches": LANDSCAPES[landscape], "baseline": rows(measured(group.search.baseline)), "configs": configs}
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    record(sys.argv[1], Path(sys.argv[2]))
