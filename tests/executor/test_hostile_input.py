"""Hostile runbooks and inventories: `runbook validate` answers every file within seconds, in bounded
memory, with exit 0 or exit 2 and `FILE:LINE:COL: message` lines naming the limit, never a traceback.

The cases that hang, exhaust memory or crash the process on a loader without limits run the CLI in a
subprocess (with a time bound); the others call it in-process, as do the property tests, for speed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from executor.runbook.loader import (
    MAX_ALIASES,
    MAX_FILE_BYTES,
    MAX_NUMBER_CHARS,
    MAX_PROBLEMS,
    MAX_SCALAR_CHARS,
    MAX_STEP_HOSTS,
    MAX_VALUES,
    load_runbook,
)
from executor.runbook.matrix import MAX_CELL_CHARS, MAX_RULES, MAX_VALUE_TEXT
from executor.runbook.model import var_text
from executor.runbook.planner import PLAN_SHOWN
from executor.stepkind import MAX_FALLBACKS
from steps.server.base import MAX_NODES
from tests.conftest import runbook_cli
from tests.executor.test_loader import GOOD

PROBLEM = re.compile(r"^F:\d+:\d+: \S")
#: the answer for any file, however hostile, comes within these bounds (a CLI start included)
SECONDS = 10
MEMORY = 1 << 30  # address space: the interpreter, pydantic and the file's nodes fit in well under half


def _bomb() -> str:
    """The billion laughs: 9 aliases per level, 9 levels (~1.5 KB; 9**9 values once expanded)."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n" + GOOD


def _merge_bomb() -> str:
    """Each mapping merges the one before twice: PyYAML's flatten_mapping doubles its pairs per line."""
    lines = ["m0: &m0 {a: 1}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}" for i in range(1, 40)]
    return "\n".join(lines) + "\n" + GOOD


def _alias_chain(length: int) -> str:
    """Each anchor wraps the one before in a list: shallow as written, `length` deep once expanded."""
    lines = ["c0: &c0 [x]"] + [f"c{i}: &c{i} [*c{i - 1}]" for i in range(1, length)]
    return "\n".join(lines) + "\n" + GOOD


# (file text, the one line `validate` prints: F for the file); these hang, fill memory or crash without limits
HOSTILE: dict[str, tuple[Callable[[], str], str]] = {
    "alias bomb": (_bomb, f"F:6:10: the document holds more than {MAX_VALUES} values once its aliases are expanded"),
    "merge bomb": (_merge_bomb, f"F:15:17: the document holds more than {MAX_VALUES} values once its aliases"),
    "900 deep": (lambda: "name: " + "[" * 900 + "]" * 900 + "\n", "F:1:70: nested more than 64 levels deep"),
    "10 000 deep [": (lambda: "[" * 10_000 + "]" * 10_000 + "\n", "F:1:65: nested more than 64 levels deep"),
    "10 000 deep {a:": (lambda: "{a: " * 10_000 + "}" * 10_000 + "\n", "F:1:257: nested more than 64 levels deep"),
    "200 000 deep": (lambda: "[" * 200_000 + "]" * 200_000 + "\n", "F:1:65: nested more than 64 levels deep"),
    "block nesting": (
        lambda: "".join(f"{'  ' * i}k:\n" for i in range(100)) + "  " * 100 + "v\n",
        "F:65:129: nested more than 64 levels deep",
    ),
    "alias chain": (lambda: _alias_chain(200), "F:64:12: nested more than 64 levels deep once aliases are expanded"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_refused_at_its_position_in_seconds(tmp_path: Path, case: str) -> None:
    make, expected = HOSTILE[case]
    path = tmp_path / "rb.yaml"
    path.write_text(make())
    started = time.monotonic()
    done = runbook_cli("validate", str(path), timeout=60, memory_bytes=MEMORY)
    assert time.monotonic() - started < SECONDS
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.replace(str(path), "F").splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert "(the limit)" in lines[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: " + "*a, " * 3, "F:1:4: YAML syntax error: found undefined alias 'a'"),
        ("a: &a [*a]\n", "F:1:8: YAML syntax error: found undefined alias 'a'"),  # no value holds itself
        ("a: &x 1\nb: &x 2\n", "F:2:4: YAML syntax error: found duplicate anchor 'x' (first defined at line 1)"),
        (GOOD + "---\n" + GOOD, "F:8:1: YAML syntax error: expected a single document, found another one"),
        (GOOD + "? [x, y]\n: 1\n", "F:8:3: a key must be text, not a sequence (`? [x, y]`)"),
        (GOOD + "? {a: 1}\n: 1\n", "F:8:3: a key must be text, not a mapping (`? {a: 1}`)"),
        (GOOD + "x: {? [a]: 1}\n", "F:8:7: a key must be text, not a sequence (`? [x, y]`)"),
        (GOOD + "k: &k [1]\n*k : 2\n", "F:9:1: a key must be text, not a sequence (`? [x, y]`)"),
        (GOOD + "<<: 3\n", "F:8:5: a merge (`<<:`) takes a mapping or a list of mappings"),
        ("name: " + "x" * (MAX_SCALAR_CHARS + 1), f"F:1:7: a value of {MAX_SCALAR_CHARS + 1} characters (the limit"),
        ("name: " + "1" * 5000, f"F:1:7: a number of 5000 characters (the limit is {MAX_NUMBER_CHARS}; quote it"),
        ("name: " + "1:" * 60 + "1", f"F:1:7: a number of 121 characters (the limit is {MAX_NUMBER_CHARS}"),
        ("name: 2026-13-45\n", "F:1:7: YAML cannot read '2026-13-45' as timestamp: month must be in 1..12"),
        ("[" + "a, " * (MAX_VALUES + 1) + "]", f"F:1:{3 * MAX_VALUES + 2}: the document holds more than"),
        ("a: &a x\nb: [" + "*a, " * (MAX_ALIASES + 1) + "]", f"F:2:{4 * MAX_ALIASES + 5}: more than {MAX_ALIASES}"),
    ],
)
def test_what_yaml_allows_but_a_runbook_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    code, lines = validate(tmp_path, text, capsys)
    assert code == 2
    assert any(line.startswith(expected) for line in lines), lines
    assert all(PROBLEM.match(line) for line in lines), lines


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = validate(tmp_path, "# " + "x" * MAX_FILE_BYTES + "\n" + GOOD, capsys)
    assert code == 2
    assert lines == [f"F:1:1: the runbook is larger than {MAX_FILE_BYTES} bytes (the limit of a file `runbook` reads)"]


def test_a_file_of_many_problems_reports_the_first_ones_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, lines = validate(tmp_path, GOOD + "".join(f"k{i}: 1\n" for i in range(40_000)), capsys)
    assert time.monotonic() - started < SECONDS
    assert code == 2 and len(lines) == MAX_PROBLEMS + 1
    assert lines[0] == "F:8:1: unknown key 'k0'"
    assert lines[-1] == f"F:108:1: more problems from here on; only the first {MAX_PROBLEMS} are reported (the limit)"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_runbook_path_that_is_no_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO's open waits for a writer and /dev/zero never ends: neither may hang `validate`."""
    path = tmp_path / "rb.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    done = runbook_cli("validate", str(path), timeout=30)
    assert done.returncode == 2
    assert done.stderr.startswith(f"{path}:1:1: cannot read the runbook: ") and "not a regular file" in done.stderr
    inventory = runbook_cli("validate", "runbooks/demo_local.yaml", "--inventory", str(path), timeout=30)
    assert inventory.returncode == 2 and "cannot read the inventory" in inventory.stderr


def test_merge_keys_still_work_the_first_merged_mapping_winning(tmp_path: Path) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text(
        textwrap.dedent("""\
            name: t
            hosts:
              box: {address: local}
            steps:
              - &a {id: zero, kind: shell, script: echo a, timeout: 5s}
              - &b {id: zero2, kind: shell, script: echo b, timeout: 7s, retry: {attempts: 2}}
              - <<: [*a, *b]
                id: one
                timeout: 9s
            """)
    )
    step = load_runbook(path).steps[2]
    assert (step.id, step.script, step.timeout, step.retry) == ("one", "echo a", 9.0, step.retry)  # type: ignore[attr-defined]
    assert step.retry is not None and step.retry.attempts == 2


def test_keys_are_read_as_written(tmp_path: Path) -> None:
    """`on:` is the var 'on', not the boolean true (a YAML 1.1 key that would no longer name anything)."""
    path = tmp_path / "rb.yaml"
    path.write_text(GOOD.replace("name: t", "name: t\nvars: {on: 1, off: 2, yes: 3}"))
    assert load_runbook(path).header.vars == {"on": 1, "off": 2, "yes": 3}


# ---- vars YAML would re-type ---------------------------------------------------------------------

RETYPED = {
    "0123": "the int 83",
    "012": "the int 10",
    "12:30": "the int 750",
    "1:20:30.5": "the float 4830.5",
    "yes": "the bool true",
    "No": "the bool false",
    "on": "the bool true",
    "OFF": "the bool false",
    "True": "the bool true",
    "1_000": "the int 1000",
    "0x1F": "the int 31",
    "0b11": "the int 3",
    "+5": "the int 5",
    "-0": "the int 0",
    ".inf": "the float inf",
    ".NaN": "the float nan",
    "1.10": "the float 1.1",
    "1.0e+3": "the float 1000.0",
    "2026-12-01": "the date 2026-12-01",
    "2026-12-01 10:00:00": "the datetime 2026-12-01 10:00:00",
    "~": "null (no value)",
    "null": "null (no value)",
}
KEPT = {"8000": 8000, "-3": -3, "1.5": 1.5, "0": 0, "true": True, "false": False, "'0123'": "0123", '"yes"': "yes"}


@pytest.mark.parametrize("where", ["runbook", "inventory"])
def test_a_var_yaml_would_re_type_is_refused_with_a_hint_to_quote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    entries = "".join(f"  v{i}: {text}\n" for i, text in enumerate(RETYPED))
    declared = "".join(f"  v{i}: x\n" for i in range(len(RETYPED)))
    if where == "runbook":
        code, lines = validate(tmp_path, GOOD.replace("name: t\n", f"name: t\nvars:\n{entries}"), capsys)
    else:
        (tmp_path / "site.yaml").write_text(f"vars:\n{entries}")
        code, lines = validate(tmp_path, GOOD.replace("name: t\n", f"name: t\nvars:\n{declared}"), capsys, "site.yaml")
    file = "F" if where == "runbook" else str(tmp_path / "site.yaml")
    first = 3 if where == "runbook" else 2
    assert code == 2
    assert lines == [
        f"{file}:{first + i}:{len(f'  v{i}: ') + 1}: vars.v{i}: YAML reads {text} as {read}; "
        f"quote it to keep the text: '{text}'"
        for i, (text, read) in enumerate(RETYPED.items())
    ]


def test_a_var_that_reads_back_as_written_is_kept_typed(tmp_path: Path) -> None:
    path = tmp_path / "rb.yaml"
    entries = "".join(f"  v{i}: {text}\n" for i, text in enumerate(KEPT))
    path.write_text(GOOD.replace("name: t\n", f"name: t\nvars:\n{entries}"))
    assert list(load_runbook(path).header.vars.values()) == list(KEPT.values())


plain_scalars = st.text(alphabet="0123456789.:-+_eExXobBOyYnNtTrRuUfFaAlLsS~ ", min_size=1, max_size=14)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=plain_scalars)
def test_a_var_reaches_the_steps_as_written_or_is_refused_where_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    assume(text == text.strip())  # the spaces around a plain scalar are not part of it
    path = tmp_path / "rb.yaml"
    path.write_text(GOOD.replace("name: t\n", f"name: t\nvars:\n  v: {text}\n"))
    code = main(["validate", str(path)])
    lines = capsys.readouterr().err.replace(str(path), "F").splitlines()
    assume(not any("YAML syntax error" in line for line in lines))  # no plain scalar: `0:`, `- x`
    if code == 0:
        assert var_text(load_runbook(path).header.vars["v"]) == text
    else:
        assert code == 2
        (line,) = lines
        assert line.startswith(f"F:3:6: vars.v: YAML reads {text} as ")
        assert line.endswith(f"; quote it to keep the text: '{text}'")


# ---- any file -------------------------------------------------------------------------------------


def validate(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], inventory: str | None = None
) -> tuple[int, list[str]]:
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    code = main(["validate", str(path), *(["--inventory", str(tmp_path / inventory)] if inventory else [])])
    return code, capsys.readouterr().err.replace(str(path), "F").splitlines()


anchors = st.sampled_from(["a", "b", "c"])
flow = st.deferred(
    lambda: st.one_of(
        st.sampled_from(["x", "1", "0123", "yes", "~", "''", "'a: b'", "12:30", "2026-13-45", ".inf", ""]),
        anchors.map(lambda a: f"*{a}"),
        st.tuples(anchors, flow).map(lambda t: f"&{t[0]} {t[1]}"),
        st.lists(flow, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(st.tuples(flow, flow), max_size=3).map(
            lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
        ),
        st.tuples(flow, flow).map(lambda kv: "{? " + kv[0] + " : " + kv[1] + "}"),
        flow.map(lambda item: "{<<: " + item + "}"),
        st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    )
)
documents = st.one_of(
    flow,
    st.lists(st.tuples(st.sampled_from(["name", "vars", "steps", "hosts", "<<", "x"]), flow), max_size=5).map(
        lambda pairs: "".join(f"{k}: {v}\n" for k, v in pairs)
    ),
    st.builds(
        lambda head, extra: head + extra,
        st.sampled_from([GOOD, GOOD.replace("name: t", "vars: {v: 1}\nname: t")]),
        st.lists(st.tuples(st.sampled_from(["x", "? x", "v", "<<"]), flow), max_size=3).map(
            lambda pairs: "".join(f"{k}: {v}\n" for k, v in pairs)
        ),
    ),
    st.text(max_size=300),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=documents)
def test_any_yaml_like_text_is_answered_with_0_or_2_and_positions_in_bounded_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    started = time.monotonic()
    code, lines = validate(tmp_path, text, capsys)
    assert time.monotonic() - started < 2
    assert code in (0, 2)
    assert lines and (code == 0 or all(PROBLEM.match(line) for line in lines)), lines


# ---- found by a second reader ---------------------------------------------------------------------

#: every tag PyYAML's safe loader knows, on a scalar or a collection
safe_tags = st.sampled_from(
    ["bool", "int", "float", "timestamp", "binary", "null", "str", "set", "omap", "pairs", "map", "seq", "merge"]
)
tagged_values = st.one_of(
    st.text(alphabet="abc01-_:.+ xé", max_size=12).map(lambda t: '"' + t + '"'),
    st.sampled_from(["[1]", "{a: 1}", "[a: 1]", "[{a: 1, b: 2}]", "''"]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tag=safe_tags, value=tagged_values, where=st.sampled_from(["vars: {v: %s}\n", "x: %s\n"]))
def test_a_value_its_tag_cannot_read_is_refused_at_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tag: str, value: str, where: str
) -> None:
    """Only ever exit 0 or 2: `!!bool "abc"` is a KeyError in PyYAML, `!!int ""` an IndexError, `!!timestamp "x"` an
    AttributeError: each is a problem at its position, never a traceback."""
    code, lines = validate(tmp_path, GOOD + where % f"!!{tag} {value}", capsys)
    assert code in (0, 2)  # `!!str ""` is a fine var
    assert lines and (code == 0 or all(PROBLEM.match(line) for line in lines)), lines


def test_a_bool_tag_on_other_text_names_the_value_and_the_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = ["F:8:11: YAML cannot read 'abc' as bool"]
    assert validate(tmp_path, GOOD + 'vars: {v: !!bool "abc"}\n', capsys) == (2, expected)


def _near_misses(section: str, count: int) -> str:
    """`count` names each close to every other: difflib compares each unknown one with all of them."""
    if section == "pass_env":
        names = "".join(f"  variable_name_{i}: x\n" for i in range(30_000))
        unknown = ", ".join(f"variable_name_x{i}" for i in range(count))
        return GOOD.replace("steps:", "vars:\n" + names + "steps:") + f"    pass_env: [{unknown}]\n"
    hosts = "".join(f"  host_number_{i}: {{address: local}}\n" for i in range(20_000))
    steps = "".join(f"  - {{id: s{i}, kind: shell, script: e, host: host_number_x{i}}}\n" for i in range(count))
    return f"name: t\nhosts:\n{hosts}steps:\n{steps}"


@pytest.mark.parametrize("section", ["pass_env", "host"])
def test_many_unknown_names_among_many_known_ones_are_answered_in_seconds(tmp_path: Path, section: str) -> None:
    """A did-you-mean is worked out only for the problems reported, and only among a list of names short
    enough to hold a typo's neighbour: 300 near-misses of 30 000 names took difflib minutes."""
    path = tmp_path / "rb.yaml"
    path.write_text(_near_misses(section, 300))
    started = time.monotonic()
    done = runbook_cli("validate", str(path), timeout=60, memory_bytes=MEMORY)
    assert time.monotonic() - started < SECONDS
    lines = done.stderr.replace(str(path), "F").splitlines()
    assert done.returncode == 2 and len(lines) == MAX_PROBLEMS + 1, lines[-3:]
    assert all(PROBLEM.match(line) and "did you mean" not in line for line in lines), lines[:3]


def test_a_did_you_mean_still_comes_with_the_problems_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = GOOD.replace("kind: shell", "kind: shell\n    host: bax\n    pass_env: [HF_TOKN]")
    text = text.replace("steps:", "secrets: {HF_TOKEN: {env: HF_TOKEN, required: false}}\nsteps:")
    code, lines = validate(tmp_path, text + "  - {id: b, kind: shell, scrip: x}\n", capsys)
    assert code == 2
    assert "F:11:26: unknown key 'scrip'; did you mean 'script'?" in lines, lines
    assert any(line.endswith("unknown host 'bax'; did you mean 'box'?") for line in lines), lines
    assert any(line.endswith("neither a var nor a secret; did you mean 'HF_TOKEN'?") for line in lines), lines


def test_a_step_of_thousands_of_fallbacks_is_refused_at_once(tmp_path: Path) -> None:
    """Each fallback is the step validated again, gates and all: 50 000 `{}` under 100 gates filled
    a gigabyte; more than MAX_FALLBACKS is refused at the list."""
    gates = "".join(f"      - that: exit_code == {i}\n" for i in range(100))
    text = GOOD + "    gates:\n" + gates + "    fallbacks: [" + ", ".join(["{}"] * 50_000) + "]\n"
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    started = time.monotonic()
    done = runbook_cli("validate", str(path), timeout=60, memory_bytes=MEMORY)
    assert time.monotonic() - started < SECONDS
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.replace(str(path), "F").splitlines() == [
        f"F:109:16: steps[0].fallbacks: List should have at most {MAX_FALLBACKS} items after validation, not 50000"
    ]


def _worst_grid() -> str:
    """The heaviest matrix within its limits: 4 axes of 10 values, each 64 characters with a field as large
    as a cell allows, 1000 exclude entries, 10 steps (one using every axis: 9000 instances)."""
    names = [(f"v{j}_" * 32)[:MAX_VALUE_TEXT] for j in range(10)]
    field = (MAX_CELL_CHARS // 4) - MAX_VALUE_TEXT - 20
    axes = "".join(
        f"      a{a}:\n" + "".join(f"        - {{name: {n}, f: {chr(97 + j) * field}}}\n" for j, n in enumerate(names))
        for a in range(4)
    )
    combos = list(itertools.product(range(10), repeat=4))[::10][:MAX_RULES]
    rules = "".join("        - {" + ", ".join(f"a{a}: {names[v]}" for a, v in enumerate(c)) + "}\n" for c in combos)
    steps = "      - {id: s0, kind: shell, script: 'echo $matrix_a0_f $matrix_a1_f $matrix_a2_f $matrix_a3_f'}\n"
    steps += "".join(f"      - {{id: s{i}, kind: shell, script: 'echo'}}\n" for i in range(1, 10))
    head = GOOD.split("steps:")[0]
    return f"{head}steps:\n  - group: g\n    matrix:\n{axes}      exclude:\n{rules}    steps:\n{steps}"


def test_the_plan_of_the_largest_matrix_within_the_limits_answers_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """`plan --json` (which loads, expands, validates and places all of it) within 30 s and 600 MB. Before:
    20 s and 711 MB resident, 140 MB of JSON repeating each cell's values per instance; its validate alone
    matched cells x rules for 13 s."""
    path = tmp_path / "rb.yaml"
    path.write_text(_worst_grid())
    assert len(path.read_bytes()) < MAX_FILE_BYTES
    started = time.monotonic()
    done = runbook_cli("plan", "--json", str(path), timeout=60, memory_bytes=600 << 20)
    assert time.monotonic() - started < 30
    assert done.returncode == 0, done.stderr[-2000:]
    (group,) = json.loads(done.stdout)["groups"]
    assert group["excluded"] == MAX_RULES and group["instances_left_out"] == 9009 - PLAN_SHOWN


def test_steps_times_hosts_are_bounded_before_anything_renders_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`validate` and `plan` render each step on each of its hosts: 200 steps on `hosts: all` of 2000 hosts
    (60 kB) took 20 s and 750 MB for `plan --json`, and a 1 MiB file holds a hundred times that."""
    hosts = "".join(f"  h{i}: {{address: local}}\n" for i in range(2000))
    steps = "".join(f"  - {{id: s{i}, kind: shell, script: echo, hosts: all}}\n" for i in range(200))
    code, lines = validate(tmp_path, f"name: t\nhosts:\n{hosts}steps:\n{steps}", capsys)
    assert (code, lines) == (
        2,
        [
            f"F:2009:5: the steps run on more than {MAX_STEP_HOSTS} step-host pairs"
            " (each fallback and node counted; the limit)"
        ],
    )


@pytest.mark.parametrize(
    ("kind", "parameter", "line"),
    [
        ("download", "revision: v$rev", "repo: o/m, local_dir: /m"),
        ("download", "include: ['${rev}*.json']", "repo: o/m, local_dir: /m"),
        ("verify", "revision: 'refs/${rev}'", "repo: o/m, local_dir: /m"),
        ("verify", "exclude: $rev.bin", "repo: o/m, local_dir: /m"),
        ("deploy", "speculative_algorithm: DFLASH$rev", "model_path: /m, draft_model_path: /d, tp_size: 1"),
        ("deploy", "bind: '${rev}'", "model_path: /m, tp_size: 1"),
    ],
)
def test_a_var_in_a_parameter_the_host_gets_as_written_is_refused_at_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, parameter: str, line: str
) -> None:
    """`revision: $rev` reached the Hub as the revision "$rev", `bind: $ip` the server as "$ip": a parameter that
    is no path (which expands on the host) is sent as written, so a var in it is refused at its position (a var
    alone, `revision: $rev` or deploy's `speculative_algorithm: $algorithm`, is resolved on the controller:
    tests/steps/test_download.py, tests/executor/test_from_campaign.py)."""
    head = "name: t\nhosts: {box: {address: local}}\nvars: {rev: main}\nsteps:\n"
    code, lines = validate(tmp_path, f"{head}  - {{id: s, kind: {kind}, host: box, {line}, {parameter}}}\n", capsys)
    key = parameter.split(":")[0]
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch(rf"F:5:\d+: steps\[0\]\.{key}(\[0\])?: '.*': a \$var does not expand here .*", lines[0])


def test_a_node_group_is_bounded_and_each_node_and_fallback_counts_as_a_step_host_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`validate` and `plan` render a node group's commands on each node, and each fallback again: one deploy on
    `nodes: all` of 3000 hosts took 1.1 GB to validate and 1.9 GB to plan; 150 instances with 16 fallbacks on 64
    nodes, counted as 150 pairs, took 70 s to validate."""
    hosts = "".join(f"  h{i}: {{address: 10.0.0.{i + 1}}}\n" for i in range(MAX_NODES + 1))
    deploy = "kind: deploy, model_path: /m, tp_size: 1, speculative_num_draft_tokens: 4, trust_remote_code: false"
    code, lines = validate(tmp_path, f"name: t\nhosts:\n{hosts}steps:\n  - {{id: d, {deploy}, nodes: all}}\n", capsys)
    assert (code, lines) == (
        2,
        [
            f"F:{MAX_NODES + 5}:121: steps[0].nodes: List should have at most {MAX_NODES} items after validation,"
            f" not {MAX_NODES + 1}"
        ],
    )
    nodes = ", ".join(f"h{i}" for i in range(MAX_NODES))
    fallbacks = ", ".join(["{stop_timeout: 61}"] * MAX_FALLBACKS)
    per_step = MAX_NODES * (MAX_FALLBACKS + 1)
    steps = "".join(
        f"  - {{id: d{i}, {deploy}, probe: p, port: {30000 + i}, nodes: [{nodes}], fallbacks: [{fallbacks}]}}\n"
        for i in range(MAX_STEP_HOSTS // per_step + 1)
    )
    probe = f"  - {{id: p, kind: probe, hosts: [{nodes}]}}\n"
    code, lines = validate(tmp_path, f"name: t\nhosts:\n{hosts}steps:\n{probe}{steps}", capsys)
    assert (
        code == 2 and len(lines) == 1 and "more than 10000 step-host pairs (each fallback and node counted" in lines[0]
    )
