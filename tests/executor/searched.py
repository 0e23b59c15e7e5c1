"""A campaign's search run by the engine in-process (`address: local`, real bash; no SSH, no SGLang stand-in), for
tests/executor/test_search_run.py and test_search_attacks.py: two kinds in place of deploy and benchmark, the
runbook they run in, its table of what each configuration measures, and readers of what a run recorded.

- `searched_server`: a server launch that says where it sits (drafter, DFLASH, tokens verified) and its GPUs (its
  argv's `--tp-size`), or fails as a launch out of memory does (its key in the table's `fail`);
- `searched_bench`: prints what the table (a JSON file beside the runbook, read when the step renders, so a test may
  change it between runs) says its configuration measures, 2% either side of the median; with `count_in`, a file
  counting the measures run, the `fail_at`th one fails (a measure that fails once).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from executor.command_result import CommandResult
from executor.run.events import EVENTS_FILE
from executor.run.state import SEARCH_KEY, open_state
from executor.runbook.search import Band, Measure, Position
from executor.stepkind import RenderContext, StepSpec
from steps.provenance import gpus_of
from tests.clirun import runbook_cli

GROUP = "sweep"
#: (drafter-tokens, or `base`) -> (acceptance, band -> median tok/s): acceptance concave in the tokens verified, a
#: verify step's cost convex, drafter a ahead of b (the physical model of tests/executor/runbook/test_search.py).
TABLE: dict[str, Any] = {
    "bands": {
        "base": [None, {"r c=1": 100.0, "r c=8": 600.0}],
        "a-2": [1.6, {"r c=1": 156.9, "r c=8": 834.8}],
        "a-4": [2.314, {"r c=1": 218.3, "r c=8": 957.5}],
        "a-8": [2.835, {"r c=1": 248.7, "r c=8": 829.8}],
        "a-16": [2.991, {"r c=1": 230.0, "r c=8": 552.1}],
        "b-2": [1.45, {"r c=1": 142.2, "r c=8": 756.5}],
        "b-4": [1.986, {"r c=1": 187.3, "r c=8": 821.6}],
        "b-8": [2.376, {"r c=1": 208.5, "r c=8": 695.6}],
        "b-16": [2.493, {"r c=1": 191.8, "r c=8": 460.2}],
    },
    "fail": [],  # keys whose launch fails (out of memory)
}
SPREAD = 0.02  # the repeats' range around the median
GRID_BEST = {"r c=1": "up[drafter=a,tokens=8]", "r c=8": "up[drafter=a,tokens=4]"}
CONFIGS = [f"up[drafter={d},tokens={n}]" for d in ("a", "b") for n in (2, 4, 8, 16)]

RUNBOOK = """\
name: searched
hosts:
  box: {address: local}
steps:
  - {id: base_up, kind: searched_server, table: TABLE}
  - {id: base_bench, kind: searched_bench, table: TABLE COUNTED}
  - group: sweep
    matrix:
      drafter: [a, b]
      tokens: [2, 4, 8, 16]
    strategy: search
    search:
      budget: BUDGET
      measure: bench
      baseline: base_bench
    steps:
      - id: up
        kind: searched_server
        table: TABLE
        drafter: ${{ matrix.drafter }}
        tokens: ${{ matrix.tokens }}
      - {id: bench, kind: searched_bench, table: TABLE,
         drafter: "${{ matrix.drafter }}", tokens: "${{ matrix.tokens }}" COUNTED}
"""


def _printed(document: object) -> str:
    return f"printf '%s\\n' {shlex.quote(json.dumps(document))}"


def _table(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return loaded


def _key(drafter: str | None, tokens: int) -> str:
    return "base" if drafter is None else f"{drafter}-{tokens}"


def _json_facts(result: CommandResult) -> Any:
    """What the script printed (None where it failed before printing: the exit code's gate says so)."""
    return json.loads(result.stdout_text) if result.exit_code == 0 else None


class SearchedServer(StepSpec):
    """A server launch as a search sees it: where it sits on its family's axis, the GPUs its argv holds."""

    kind: Literal["searched_server"] = "searched_server"
    starts_server: ClassVar[bool] = True
    table: str
    drafter: str | None = None
    tokens: int = 1
    tp: int = 2

    def render(self, ctx: RenderContext) -> str:
        if _key(self.drafter, self.tokens) in _table(self.table)["fail"]:
            return "echo 'torch.OutOfMemoryError: CUDA out of memory' >&2; exit 1"
        return _printed({"argv": ["python3", "-m", "sglang.launch_server", "--tp-size", str(self.tp)]})

    def parse_facts(self, result: CommandResult) -> Any:
        return _json_facts(result)

    def search_position(self) -> Position:
        algorithm = None if self.drafter is None else "DFLASH"
        cost = (0.0 if algorithm is None else 1.0, float(self.tokens), 0.0)
        return Position(self.drafter, algorithm, self.tokens, cost, f"{algorithm} {self.tokens}")

    def search_gpus(self, facts: Any) -> int | None:
        return gpus_of(facts["argv"])


class SearchedBench(StepSpec):
    """A measure of a launch: the table's bands of its configuration."""

    kind: Literal["searched_bench"] = "searched_bench"
    table: str
    drafter: str | None = None
    tokens: int = 1
    count_in: str | None = None
    fail_at: int = 0

    def render(self, ctx: RenderContext) -> str:
        accept, medians = _table(self.table)["bands"][_key(self.drafter, self.tokens)]
        bands = {b: [m, m * (1 - SPREAD), m * (1 + SPREAD), accept] for b, m in medians.items()}
        script = _printed({"bands": bands})
        if self.count_in is None:
            return script
        counter = shlex.quote(self.count_in)
        counted = f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}\n"
        return f'{counted}[ "$n" != {self.fail_at} ] || exit 1\n{script}'

    def parse_facts(self, result: CommandResult) -> Any:
        return _json_facts(result)

    def search_measures(self, facts: Any) -> dict[Band, Measure]:
        return {band: Measure(*row) for band, row in facts["bands"].items()}


def book(
    tmp_path: Path,
    edits: Mapping[str, str] | None = None,
    *,
    budget: str = "{launches: 8}",
    table: Mapping[str, Any] | None = None,
    fail_at: int | None = None,
) -> Path:
    """RUNBOOK (edited: old text -> new) with its budget, its table beside it, and its measures counted (the
    `fail_at`th failing)."""
    (tmp_path / "table.json").write_text(json.dumps(table or TABLE))
    text = RUNBOOK
    for old, new in (edits or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    counted = "" if fail_at is None else f", count_in: {tmp_path / 'measures'}, fail_at: {fail_at}"
    text = text.replace("BUDGET", budget).replace(" COUNTED", counted).replace("TABLE", str(tmp_path / "table.json"))
    path = tmp_path / "searched.yaml"
    path.write_text(text)
    return path


def run(path: Path, *more: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return runbook_cli("run", str(path), "--log-dir", str(path.parent / "logs"), *more, env=env)


def status(path: Path, run_id: str | None = None) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A run's folder (the last one's) and its steps by id (`runbook status --json`)."""
    logs = path.parent / "logs"
    done = runbook_cli("status", *([run_id] if run_id else []), "--log-dir", str(logs), "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    return logs / shown["run"]["run_id"], {row["step"]: row for row in shown["steps"]}


def events(run_dir: Path, *names: str) -> list[dict[str, Any]]:
    """The run's events named `names`, in order."""
    lines = (run_dir / EVENTS_FILE).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] in names]


def recorded(run_dir: Path) -> list[dict[str, Any]]:
    """The group's decisions as the run's state keeps them ([] where it keeps none)."""
    with open_state(run_dir) as state:
        raw = state.get(SEARCH_KEY)
    return [] if raw is None else list(json.loads(raw).get(GROUP, []))


def launched(steps: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The group's servers that started (passed or failed)."""
    return [c for c in CONFIGS if steps[c]["status"] in ("passed", "failed")]


def ran(run_dir: Path) -> list[str]:
    """The steps that ran in a run (finished other than skipped), in order."""
    return [e["step"] for e in events(run_dir, "step_finished") if e["status"] != "skipped"]
