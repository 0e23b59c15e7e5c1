"""Matrices: expansion into step instances, ids and order, typed substitution, per-cell errors, and what
`runbook validate`/`plan` show (README, "Matrices")."""

from __future__ import annotations

import contextlib
import itertools
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.errors import InvalidRunbook
from executor.faces.cli import main
from executor.runbook.loader import Runbook, load_runbook, parse_runbook
from executor.runbook.matrix import (
    MAX_AXES,
    MAX_CELL_CHARS,
    MAX_CELL_STEPS,
    MAX_ID,
    MAX_INSTANCE_VALUES,
    MAX_RULES,
    MAX_VALUE_CHARS,
)
from executor.runbook.planner import PLAN_SHOWN, placed_hosts, plan_document
from tests.clirun import runbook_cli

SWEEP = """\
name: sweep
hosts:
  gpu1: {address: 127.0.0.1}
  gpu2: {address: 127.0.0.1}
vars:
  models_dir: /srv/models
steps:
  - id: probe
    kind: probe
    hosts: [gpu1, gpu2]
  - group: dflash
    matrix:
      concurrency: [1, 4]
      drafter:
        - {name: zlab, repo: z-lab/Kimi-K2.6-DFlash, dir: Kimi-K2.6-DFlash}
        - {name: tmp-long, repo: SubSir/Kimi-K2.6-DFlash-tmp-long, dir: Kimi-K2.6-DFlash-tmp-long}
      spec:
        - {name: dflash-4, algorithm: DFLASH, tokens: 4}
        - {name: dflash-8, algorithm: DFLASH, tokens: 8}
      exclude: [{drafter: tmp-long, spec: dflash-8}]
    on_failure: continue
    hosts: [gpu1, gpu2]
    placement: spread
    steps:
      - id: download
        kind: shell
        script: echo "fetch $matrix_drafter_repo"
      - id: deploy_dflash
        kind: deploy
        probe: probe
        model_path: $models_dir/target
        draft_model_path: $models_dir/${{ matrix.drafter.dir }}
        speculative_algorithm: ${{ matrix.spec.algorithm }}
        speculative_num_draft_tokens: ${{ matrix.spec.tokens }}
        ready_timeout: 20m
      - id: bench
        kind: benchmark
        server: deploy_dflash
        concurrencies:
          - ${{ matrix.concurrency }}
        num_prompts: 4
"""


def load(text: str) -> Runbook:
    return parse_runbook(textwrap.dedent(text), Path("sweep.yaml"))


def problems(text: str) -> list[str]:
    with pytest.raises(InvalidRunbook) as caught:
        load(text)
    return [str(problem) for problem in caught.value.problems]


def test_ids_order_and_typed_substitution() -> None:
    runbook = load(SWEEP)
    ids = [spec.id for spec in runbook.steps]
    assert ids == [
        "probe",
        "download[drafter=zlab]",
        "deploy_dflash[drafter=zlab,spec=dflash-4]",
        "bench[concurrency=1,drafter=zlab,spec=dflash-4]",
        "bench[concurrency=4,drafter=zlab,spec=dflash-4]",
        "deploy_dflash[drafter=zlab,spec=dflash-8]",
        "bench[concurrency=1,drafter=zlab,spec=dflash-8]",
        "bench[concurrency=4,drafter=zlab,spec=dflash-8]",
        "download[drafter=tmp-long]",
        "deploy_dflash[drafter=tmp-long,spec=dflash-4]",
        "bench[concurrency=1,drafter=tmp-long,spec=dflash-4]",
        "bench[concurrency=4,drafter=tmp-long,spec=dflash-4]",
    ]
    steps = {spec.id: spec for spec in runbook.steps}
    deploy = steps["deploy_dflash[drafter=tmp-long,spec=dflash-4]"]
    assert deploy.speculative_num_draft_tokens == 4  # type: ignore[attr-defined]  # an int, not "4"
    assert deploy.draft_model_path == "$models_dir/Kimi-K2.6-DFlash-tmp-long"  # type: ignore[attr-defined]
    bench = steps["bench[concurrency=4,drafter=zlab,spec=dflash-8]"]
    assert bench.server == "deploy_dflash[drafter=zlab,spec=dflash-8]"  # type: ignore[attr-defined]
    assert bench.concurrencies == [4]  # type: ignore[attr-defined]
    (group,) = runbook.groups
    assert group.server_axes == ("drafter", "spec")  # concurrency is client-side: it never relaunches
    assert len(group.servers) == 3 and len(group.cells) == 6 and group.excluded == 2
    assert runbook.instances[bench.id].server == "deploy_dflash[drafter=zlab,spec=dflash-8]"
    assert runbook.instances["download[drafter=zlab]"].server is None
    assert runbook.step_hosts[deploy.id] == ["gpu1", "gpu2"]  # the group's hosts, inherited


def test_include_adds_back_an_excluded_cell_and_a_one_step_matrix_is_named_by_its_step() -> None:
    text = SWEEP.replace(
        "exclude: [{drafter: tmp-long, spec: dflash-8}]",
        "exclude: [{drafter: tmp-long, spec: dflash-8}]\n"
        "      include: [{concurrency: 4, drafter: tmp-long, spec: dflash-8}]",
    )
    group = load(text).groups[0]
    assert group.included == 1 and len(group.cells) == 7
    one = load(
        """\
        name: t
        hosts: {box: {address: local}}
        steps:
          - id: note
            kind: shell
            matrix: {n: [1, 2, 3]}
            script: echo $matrix_n
        """
    )
    assert [s.id for s in one.steps] == ["note[n=1]", "note[n=2]", "note[n=3]"]
    assert one.groups[0].name == "note"


def test_a_step_of_the_group_using_no_axis_runs_once() -> None:
    text = SWEEP.replace('script: echo "fetch $matrix_drafter_repo"', "script: echo fetch")
    ids = [spec.id for spec in load(text).steps]
    assert ids.count("download") == 1 and ids.index("download") == 1


def test_an_axis_value_that_breaks_a_parameter_is_reported_per_cell() -> None:
    text = SWEEP.replace(
        "{name: dflash-8, algorithm: DFLASH, tokens: 8}", "{name: dflash-8, algorithm: DFLASH, tokens: -1}"
    )
    found = problems(text)
    prefix = f"{at(text, '${{ matrix.spec.tokens')}: deploy_dflash[drafter=zlab,spec=dflash-8]: "
    assert f"{prefix}speculative_num_draft_tokens.constrained-int: Input should be greater than 0" in found
    assert all(p.startswith(prefix) for p in found), found  # only the one cell (tmp-long with it is excluded)


def test_validate_exits_2_naming_the_file_line_and_cell_whose_axis_value_breaks_a_parameter(tmp_path: Path) -> None:
    """Through the CLI, as a user meets it: the line of the `${{ }}` that took the value, the cell's instance id,
    the parameter and pydantic's reason, for the one cell (its tmp-long twin is excluded), and no traceback."""
    text = SWEEP.replace(
        "{name: dflash-8, algorithm: DFLASH, tokens: 8}", "{name: dflash-8, algorithm: DFLASH, tokens: 0}"
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    done = runbook_cli("validate", str(path))
    assert done.returncode == 2, done.stderr
    where = f"{path}{at(text, '${{ matrix.spec.tokens').removeprefix('sweep.yaml')}"
    cell = "deploy_dflash[drafter=zlab,spec=dflash-8]"
    lines = done.stderr.splitlines()
    assert f"{where}: {cell}: speculative_num_draft_tokens.constrained-int: Input should be greater than 0" in lines
    assert all(line.startswith(f"{where}: {cell}: speculative_num_draft_tokens.") for line in lines), lines
    assert "Traceback" not in done.stderr


def at(text: str, snippet: str) -> str:
    """`sweep.yaml:LINE:COL` of the first character of `snippet` in `text`."""
    before = text[: text.index(snippet)]
    return f"sweep.yaml:{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10))}"


@pytest.mark.parametrize(
    ("change", "where", "expected"),
    [
        (("{name: zlab, repo:", "{repo:"), "{repo:", "matrix axis 'drafter': a mapping value needs a `name`"),
        (("concurrency: [1, 4]", "concurrency: [1, 1]"), "1]", "matrix axis 'concurrency': value '1' appears twice"),
        (
            ("{drafter: tmp-long, spec", "{drafter: nope, spec"),
            "nope",
            "matrix exclude: axis 'drafter' has no value 'nope'",
        ),
        (("{drafter: tmp-long, spec", "{drafters: x, spec"), "drafters", "matrix exclude: unknown axis 'drafters'"),
        (
            ("${{ matrix.drafter.dir }}", "${{ matrix.drafter.folder }}"),
            "$models_dir/${{",
            "no value of axis 'drafter' has a field 'folder'",
        ),
        (
            ("${{ matrix.spec.algorithm }}", "${{ vars.x }}"),
            "${{ vars",
            "speculative_algorithm: ${{ vars.x }} is not matrix.AXIS",
        ),
        (
            ('"fetch $matrix_drafter_repo"', "${{ matrix.drafter }}"),
            "echo ${{",
            "script: a script reads the matrix from its environment",
        ),
        (
            ("  models_dir: /srv/models", "  matrix_spec: x"),
            "- {name: dflash-4",
            "matrix axis 'spec': its script variable $matrix_spec would shadow",
        ),
        (
            ("    hosts: [gpu1, gpu2]\n    placement", "    placement"),
            "spread",
            "placement needs the hosts to spread over",
        ),
        (
            ("        probe: probe\n", "        probe: probe\n        host: gpu1\n"),
            "host: gpu1",
            "step 'deploy_dflash': a step of a placed group runs where the placement puts it",
        ),
        (
            (
                "        num_prompts: 4\n",
                "        num_prompts: 4\n      - id: again\n        kind: deploy\n        model_path: /m\n",
            ),
            "id: again",
            "group 'dflash': a second server-starting step ('again' after 'deploy_dflash')",
        ),
        (
            ("kind: probe\n", 'kind: probe\n    when: "matrix.x or ("\n'),
            '"matrix.x or',
            "when 'matrix.x or (' does not parse",
        ),
        (
            ("kind: probe\n", 'kind: probe\n    when: "matrix.spec == 1"\n'),
            '"matrix.spec',
            "when: `matrix` in a step without a matrix",
        ),
        (
            ("      concurrency: [1, 4]\n", "      concurrency: [1, 4]\n      unused: [a, b]\n"),
            "unused:",
            "matrix axis 'unused': no step of 'dflash' uses it, so its cells would all run the same commands",
        ),
        (("concurrency: [1, 4]", 'concurrency: [1, "4\\n"]'), '"4', "value '4\\n' is not readable in a cell id"),
        (("concurrency: [1, 4]", f"concurrency: [1, {'x' * 65}]"), "xx", "(letters, digits, _ . + -; at most 64"),
        (("concurrency: [1, 4]", "concurrency: [1, 0123]"), "0123", "YAML reads 0123 as the int 83; quote it"),
        (("dir: Kimi-K2.6-DFlash}", "dir: yes}"), "yes}", "field 'dir': YAML reads yes as the bool true; quote"),
        (
            ("repo: z-lab/Kimi-K2.6-DFlash,", 'repo: "z-lab\\0K",'),
            '"z-lab',
            "matrix axis 'drafter': field 'repo' contains a NUL byte, which no environment can carry",
        ),
    ],
    ids=lambda value: str(value)[:40],
)
def test_a_broken_matrix_is_refused_at_its_position(change: tuple[str, str], where: str, expected: str) -> None:
    assert change[0] in SWEEP
    text = SWEEP.replace(*change)
    found = problems(text)
    assert any(p.startswith(f"{at(text, where)}: ") and expected in p for p in found), (at(text, where), found)


def test_a_reference_into_a_group_from_outside_is_refused() -> None:
    text = SWEEP + "  - id: after\n    kind: benchmark\n    host: gpu1\n    server: deploy_dflash\n"
    assert problems(text) == [
        f"{at(text, 'id: after')}: 'deploy_dflash' is a matrix step of group 'dflash': "
        "only its group mates can refer to it"
    ]


def test_the_product_is_bounded_before_it_is_made() -> None:
    axes = ", ".join(f"a{i}: [{', '.join(str(v) for v in range(10))}]" for i in range(5))
    text = (
        "name: t\nhosts: {box: {address: local}}\nsteps:\n"
        f"  - id: s\n    kind: shell\n    matrix: {{{axes}}}\n    script: echo\n"
    )
    found = problems(text)
    assert found == ["sweep.yaml:6:13: the matrix has 100000 combinations; the limit is 10000 cells"]


def test_validate_lists_every_cell_and_plan_shows_launches_and_placement(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    done = runbook_cli("validate", str(path))
    assert done.returncode == 0, done.stderr
    assert (
        "group dflash: 6 cells (2 excluded, 0 included), 11 step instances, 3 server configurations = 3 launches"
        in done.stderr
    )
    assert "  cell concurrency=4,drafter=tmp-long,spec=dflash-4" in done.stderr.splitlines()
    plan = runbook_cli("plan", str(path))
    assert plan.returncode == 0, plan.stderr
    assert "#   roughly how long: at most 1h00m of server start-up (3 launches x ready_timeout 20m00s)" in plan.stdout
    assert "#     deploy_dflash[drafter=zlab,spec=dflash-4] on gpu1" in plan.stdout
    assert "#     deploy_dflash[drafter=zlab,spec=dflash-8] on gpu2" in plan.stdout
    # each instance's commands, on the host the placement gives it (one host, not the pool)
    assert plan.stdout.count("'deploy_dflash[drafter=zlab,spec=dflash-8]' (deploy) on gpu2") == 1
    assert "'deploy_dflash[drafter=zlab,spec=dflash-8]' (deploy) on gpu1" not in plan.stdout
    assert "--speculative-num-draft-tokens 8" in plan.stdout


# ---- properties ----------------------------------------------------------------------------------------

_values = st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True)
_axes = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _values, min_size=1, max_size=3)


@st.composite
def _matrices(
    draw: st.DrawFn,
) -> tuple[dict[str, list[int]], list[dict[str, int]], list[dict[str, int]], list[str], list[str]]:
    axes = draw(_axes)
    names = list(axes)
    combo = st.fixed_dictionaries({}, optional={a: st.sampled_from(v) for a, v in axes.items()})
    exclude = draw(st.lists(combo.filter(bool), max_size=2))
    include = draw(st.lists(st.fixed_dictionaries({a: st.sampled_from(v) for a, v in axes.items()}), max_size=2))
    server_uses = draw(st.lists(st.sampled_from(names), unique=True))
    client_uses = draw(st.lists(st.sampled_from(names), unique=True))
    return axes, exclude, include, server_uses, client_uses


def _runbook(axes: dict[str, Any], exclude: list[Any], include: list[Any], server: list[str], client: list[str]) -> str:
    matrix: dict[str, Any] = {**axes}
    if exclude:
        matrix["exclude"] = exclude
    if include:
        matrix["include"] = include
    deploy = {"id": "dep", "kind": "deploy", "model_path": "/m", "tp_size": 1, "description": "x"}
    deploy["extra_args"] = [f"--x=${{{{ matrix.{a} }}}}" for a in server]
    bench = {"id": "b", "kind": "shell", "script": " ".join(f"$matrix_{a}" for a in client) or "true"}
    tail = {"id": "t", "kind": "eval_acceptance", "server": "dep"}
    body = {
        "name": "p",
        "hosts": {"box": {"address": "local"}},
        "steps": [{"group": "g", "matrix": matrix, "steps": [deploy, bench, tail]}],
    }
    return yaml.safe_dump(body, sort_keys=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_matrices())
def test_expansion_properties(matrix: tuple[Any, ...]) -> None:
    text = _runbook(*matrix)
    axes, _, _, server, client = matrix
    unused = sorted(set(axes) - set(server) - set(client))
    try:
        runbook = load(text)
    except InvalidRunbook as exc:  # every combination excluded, or an axis no step uses: nothing else
        named = sorted(p.message.split("'")[1] for p in exc.problems if "no step of 'g' uses it" in p.message)
        assert named == unused or any("no cell is left" in p.message for p in exc.problems), exc.problems
        assert all("no cell is left" in p.message or "uses it" in p.message for p in exc.problems), exc.problems
        return
    assert not unused  # an axis that multiplies cells but no step's commands is never accepted
    (group,) = runbook.groups
    cells = [cell.id for cell in group.cells]
    assert len(cells) == len(set(cells))  # every cell once
    ids = [spec.id for spec in runbook.steps]
    assert len(ids) == len(set(ids)) and ids == list(group.instances)
    assert ids == [spec.id for spec in load(text).steps]  # stable
    for instance in runbook.instances.values():  # each instance belongs to the cells whose values it has
        assert all(cell in cells for cell in instance.cells)
    covered = {cell for instance in runbook.instances.values() if instance.base == "t" for cell in instance.cells}
    assert covered == set(cells)
    # each server's dependents come after it and before the next server
    position = {iid: n for n, iid in enumerate(ids)}
    servers = list(group.servers)
    for iid, instance in runbook.instances.items():
        if instance.server is not None and iid != instance.server:
            start = position[instance.server]
            nxt = servers.index(instance.server) + 1
            end = position[servers[nxt]] if nxt < len(servers) else len(ids)
            assert start < position[iid] < end
    assert len(servers) == len({str(sorted(runbook.instances[s].values.items())) for s in servers})  # one each


_yamlish = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from(["a", "x y", "${{ matrix.a }}", "${{", "name", ""]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "name", "exclude", "include", "x-y"]), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_yamlish, _yamlish)
def test_the_loader_only_ever_refuses_random_matrices(matrix: Any, param: Any) -> None:
    body = {
        "name": "p",
        "hosts": {"box": {"address": "local"}},
        "steps": [
            {
                "group": "g",
                "matrix": matrix,
                "hosts": param,
                "steps": [{"id": "s", "kind": "shell", "script": "true", "description": param}],
            },
            {"id": "one", "kind": "benchmark", "server": "s", "matrix": matrix, "concurrency": param},
        ],
    }
    with contextlib.suppress(InvalidRunbook):  # anything else (a traceback) fails the test
        load(yaml.safe_dump(body))


def test_cells_keep_their_order_across_axes() -> None:
    """Cells sharing the server axes are consecutive: server axes slowest, by value index."""
    runbook = load(SWEEP)
    keys = [(c.values["drafter"]["name"], c.values["spec"]["name"]) for c in runbook.groups[0].cells]  # type: ignore[index]
    assert [k for k, _ in itertools.groupby(keys)] == [
        ("zlab", "dflash-4"),
        ("zlab", "dflash-8"),
        ("tmp-long", "dflash-4"),
    ]


def test_fallbacks_are_expanded_with_their_step() -> None:
    text = SWEEP.replace(
        "        ready_timeout: 20m\n",
        "        ready_timeout: 20m\n        fallbacks:\n          - {attention_backend: triton}\n"
        "          - draft_model_path: /other/${{ matrix.drafter }}\n",
    )
    runbook = load(text)
    fallbacks = runbook.fallbacks["deploy_dflash[drafter=tmp-long,spec=dflash-4]"]
    assert [fb.id for fb in fallbacks] == ["deploy_dflash[drafter=tmp-long,spec=dflash-4]"] * 2
    assert fallbacks[0].draft_model_path == "$models_dir/Kimi-K2.6-DFlash-tmp-long"  # type: ignore[attr-defined]
    assert fallbacks[1].draft_model_path == "/other/tmp-long"  # type: ignore[attr-defined]


def test_the_instances_of_a_runbook_are_bounded_before_they_are_made() -> None:
    steps = "".join(
        f"  - id: s{n}\n    kind: shell\n    matrix: {{a: [{', '.join(map(str, range(100)))}], "
        f"b: [{', '.join(map(str, range(100)))}]}}\n    script: echo $matrix_a $matrix_b\n"
        for n in range(2)
    )
    found = problems(f"name: t\nhosts: {{box: {{address: local}}}}\nsteps:\n{steps}")
    assert found == ["sweep.yaml:10:13: the matrices expand to more than 10000 step instances (the limit)"]


ONE_BOX = "name: t\nhosts:\n  box: {address: local}\n  gpu2: {address: 127.0.0.1}\nsteps:\n"


def test_a_step_id_written_twice_in_a_group_is_refused_not_dropped() -> None:
    """Both mates expand to one instance id; the second used to vanish from the run without a word."""
    steps = (
        "  - group: g\n    matrix: {a: [1, 2]}\n    hosts: [box]\n    steps:\n"
        "      - {id: x, kind: shell, script: echo one $matrix_a}\n"
        "      - {id: x, kind: shell, script: echo two}\n"
    )
    assert problems(ONE_BOX + steps) == ["sweep.yaml:11:14: duplicate step id 'x' (also step 1 of group 'g')"]


def test_two_axes_whose_script_variables_collide_are_refused() -> None:
    """Axis `a`'s field `b` and axis `a_b` would both be $matrix_a_b: one would silently win."""
    steps = (
        "  - id: s\n    kind: shell\n    host: box\n"
        "    matrix: {a: [{name: x, b: 1}], a_b: [2]}\n    script: echo $matrix_a_b\n"
    )
    assert problems(ONE_BOX + steps) == [
        "sweep.yaml:9:36: matrix axis 'a_b': its script variable $matrix_a_b is also one of axis 'a'"
    ]


def test_a_placed_group_listing_a_host_twice_is_refused() -> None:
    """Two lanes on one host would run two servers on it at once (the pools already refuse this)."""
    steps = (
        "  - group: g\n    matrix: {a: [1, 2]}\n    hosts: [box, box]\n    placement: spread\n    steps:\n"
        "      - {id: d, kind: deploy, tp_size: 1, model_path: '/m/${{ matrix.a }}'}\n"
    )
    assert problems(ONE_BOX + steps) == ["sweep.yaml:8:12: hosts: host 'box' is listed twice"]


def test_each_bad_option_of_a_group_is_reported_at_its_place_none_hiding_another() -> None:
    """A group's options are checked one by one (executor.runbook.matrix.GroupOptions): each refused option is named
    at its line and column with what it may be, and read as not given, so the next one is still checked."""
    steps = (
        "  - group: g\n    matrix: {a: [1, 2]}\n    on_failure: maybe\n    placement: pack\n    hosts: [box, 7]\n"
        "    steps:\n      - {id: s, kind: shell, host: box, script: echo $matrix_a}\n"
    )
    assert problems(ONE_BOX + steps) == [
        "sweep.yaml:8:17: on_failure: 'stop' or 'continue', not 'maybe'",
        "sweep.yaml:9:16: placement: 'spread' (each server configuration on one host), not 'pack'",
        "sweep.yaml:10:12: hosts: a list of host names, `all` or a pool's name (the group's hosts)",
    ]
    # a bad `hosts:` under `placement: spread` leaves the placement nothing to spread over: said too
    placed = steps.replace("on_failure: maybe\n    placement: pack", "placement: spread")
    assert problems(ONE_BOX + placed) == [
        "sweep.yaml:8:16: placement needs the hosts to spread over: give `hosts: [gpu1, gpu2]`",
        "sweep.yaml:9:12: hosts: a list of host names, `all` or a pool's name (the group's hosts)",
    ]


def test_a_matrix_step_s_own_bad_on_failure_is_reported_at_it() -> None:
    steps = "  - id: s\n    kind: shell\n    host: box\n    matrix: {a: [1]}\n    on_failure: 3\n"
    steps += "    script: echo $matrix_a\n"
    assert problems(ONE_BOX + steps) == ["sweep.yaml:10:17: on_failure: 'stop' or 'continue', not 3"]


# ---- limits that bound a matrix's work, checked before it is done ---------------------------------------


def _group(axes: str, steps: str, rules: str = "") -> str:
    """A runbook of one group with `axes` (YAML lines under `matrix:`), `rules` and `steps` (lines)."""
    head = "name: t\nhosts: {box: {address: local}}\nsteps:\n  - group: g\n    matrix:\n"
    return f"{head}{axes}{rules}    steps:\n{steps}"


def _axis(name: str, values: list[str]) -> str:
    return f"      {name}: [{', '.join(values)}]\n"


USES_A = "      - {id: s, kind: shell, script: echo $matrix_a $matrix_b}\n"
RULE = "        - {a: 1}\n"
FIELD = "f" * 2000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            _group("".join(_axis(f"a{i}", ["x"]) for i in range(MAX_AXES + 1)), USES_A),
            f"sweep.yaml:{6 + MAX_AXES}:7: the matrix has {MAX_AXES + 1} axes; the limit is {MAX_AXES}",
        ),
        (
            _group(_axis("a", [f"{{name: big, f: {'y' * MAX_VALUE_CHARS}}}"]) + _axis("b", ["1"]), USES_A),
            f"sweep.yaml:6:11: matrix axis 'a': value 'big' holds {MAX_VALUE_CHARS + 8} characters with its fields; "
            f"the limit is {MAX_VALUE_CHARS}",
        ),
        (
            _group("".join(_axis(a, [f"{{name: v, f1: {FIELD}, f2: {FIELD}}}"]) for a in "abcde"), USES_A),
            "sweep.yaml:6:7: a cell of the matrix holds 20060 characters of axes and values; "
            f"the limit is {MAX_CELL_CHARS}",
        ),
        (
            _group(_axis("a", ["1", "2"]) + _axis("b", ["1"]), USES_A, "      exclude:\n" + RULE * (MAX_RULES + 1)),
            f"sweep.yaml:{9 + MAX_RULES}:11: the matrix has more than {MAX_RULES} exclude and include entries "
            "(the limit)",
        ),
        (
            _group(
                _axis("a", [str(i) for i in range(100)]) + _axis("b", [str(i) for i in range(100)]),
                USES_A + "".join(f"      - {{id: t{i}, kind: shell, script: echo}}\n" for i in range(10)),
            ),
            f"sweep.yaml:6:7: 10000 cells x 11 steps is more than {MAX_CELL_STEPS} cell steps (the limit)",
        ),
        (
            _group(
                _axis("a", [str(i) for i in range(100)]) + _axis("b", [str(i) for i in range(100)]),
                USES_A.replace("}", f", pass_env: [{', '.join(['v'] * 200)}]}}"),
            ),
            f"sweep.yaml:6:7: the matrices' step instances hold more than {MAX_INSTANCE_VALUES} values (the limit)",
        ),
        (
            _group(_axis("a", ["1"]) + _axis("b", ["1"]), USES_A.replace("id: s,", f"id: {'s' * (MAX_ID + 1)},")),
            f"sweep.yaml:9:14: an id of {MAX_ID + 1} characters in a matrix (the limit is {MAX_ID})",
        ),
    ],
    ids=["axes", "value", "cell", "rules", "cell steps", "instance values", "id"],
)
def test_a_matrix_past_a_limit_is_refused_at_its_position_before_the_work(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def test_exclude_rules_are_matched_by_what_they_name_not_cells_times_rules() -> None:
    """1000 rules over 10 000 combinations took cells x rules `all()` checks (80 s for 10 000 rules); each
    rule now marks only the combinations it names. What is left and counted is the same."""
    values = [str(i) for i in range(100)]
    rules = [f"        - {{a: {1 + n % 99}, b: {n % 100}}}\n" for n in range(MAX_RULES - 100)]  # out anyway
    rules += ["        - {a: 0, b: 7}\n", *(f"        - {{a: {i}}}\n" for i in range(1, 100))]
    text = _group(_axis("a", values) + _axis("b", values), USES_A, "      exclude:\n" + "".join(rules))
    started = time.monotonic()
    (group,) = load(text).groups
    assert time.monotonic() - started < 5
    assert [cell.id for cell in group.cells] == [f"a=0,b={b}" for b in range(100) if b != 7]
    assert group.excluded == 10_000 - 99


def test_instances_share_each_cell_s_id() -> None:
    """Each instance lists the ids of its cells; a step using no axis lists every one. One text per cell,
    not a copy per instance: memory grows with cells and steps, never their product of copies."""
    text = _group(_axis("a", ["1", "2"]) + _axis("b", ["1", "2"]), USES_A + "      - {id: t, kind: shell, script: e}\n")
    runbook = load(text)
    (group,) = runbook.groups
    once = runbook.instances["t"]
    assert [id(c) for c in once.cells] == [id(cell.id) for cell in group.cells]
    per_cell = [instance for iid, instance in runbook.instances.items() if iid != "t"]
    assert all(instance.cells[0] is cell.id for instance, cell in zip(per_cell, group.cells, strict=True))


def test_plan_and_plan_json_summarise_a_big_grid_saying_what_they_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = [str(i) for i in range(30)]
    path = tmp_path / "grid.yaml"
    path.write_text(_group(_axis("a", values) + _axis("b", values), USES_A))
    assert main(["plan", "--json", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    (group,) = document["groups"]
    assert [step["id"] for step in document["steps"]] == group["instances"] == group["instances"][:PLAN_SHOWN]
    assert group["instances_left_out"] == group["cells_left_out"] == 900 - PLAN_SHOWN
    last = f"a={(PLAN_SHOWN - 1) // 30},b={(PLAN_SHOWN - 1) % 30}"
    assert len(group["cells"]) == PLAN_SHOWN and group["cells"][-1]["id"] == last
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# runbook t: 900 steps on box")
    assert f"... and {900 - PLAN_SHOWN} more cells (the plan shows the first {PLAN_SHOWN}; `runbook validate`" in text
    assert f"... and {900 - PLAN_SHOWN} more step instances" in text and "`runbook plan --full` every one" in text
    assert text.count("\n## step ") == PLAN_SHOWN


def test_a_placed_group_of_one_cell_and_thousands_of_steps_is_planned_in_seconds(tmp_path: Path) -> None:
    """Each step's mates were looked up among all of them (the loader's order check, the placement's
    `needed`): 5000 steps reading the first one's facts took 14 s to plan, 9000 took 38 s."""
    steps = "      - {id: s0, kind: shell, script: echo $matrix_a}\n"
    steps += "".join(f"      - {{id: s{i}, kind: shell, script: e, when: steps.s0}}\n" for i in range(1, 5000))
    text = _group(_axis("a", ["x"]), steps).replace(
        "    steps:\n", "    hosts: [box, gpu2]\n    placement: spread\n    steps:\n", 1
    )
    path = tmp_path / "one.yaml"
    path.write_text(
        text.replace("hosts: {box: {address: local}}", "hosts: {box: {address: local}, gpu2: {address: local}}")
    )
    started = time.monotonic()
    runbook = load_runbook(path)
    document = plan_document(runbook, {})
    assert time.monotonic() - started < 8
    assert document["groups"][0]["instances_left_out"] == 5000 - PLAN_SHOWN
    assert {tuple(hosts) for hosts in placed_hosts(runbook).values()} == {("box",)}  # after s0, on its host


def test_a_gate_repeated_by_every_instance_and_fallback_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each instance (and each fallback) repeats its step's gates and `when:`: a 200 kB gate parsed per
    instance took 0.3 s each, so `validate` of 100 cells took 33 s (10 000 cells: an hour). Each distinct
    text is parsed, and searched for step references, once."""
    from executor.runbook import gates

    parsed: list[str] = []
    searched: list[str] = []
    real_parse, real_refs = gates.parse, gates._STEP_REF

    def parse(expression: str) -> Any:
        parsed.append(expression)
        return real_parse(expression)

    class Refs:
        def finditer(self, text: str) -> Any:
            searched.append(text)
            return real_refs.finditer(text)

    monkeypatch.setattr(gates, "parse", parse)
    monkeypatch.setattr(gates, "_STEP_REF", Refs())
    gate = "matrix.a == '1' or " + " or ".join(f"stdout == 'x{i}'" for i in range(50))  # a text no other test has
    step = f'      - {{id: s, kind: shell, script: echo $matrix_a, when: "{gate} ", gates: [{{that: "{gate}"}}],'
    runbook = load(_group(_axis("a", [str(i) for i in range(40)]), step + " fallbacks: [{}, {}]}\n"))
    assert len(runbook.instances) == 40
    assert sorted(parsed) == sorted([gate, gate + " "]) and sorted(searched) == sorted(parsed)
