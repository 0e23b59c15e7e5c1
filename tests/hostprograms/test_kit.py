"""The host programs' kit (hostprograms/kit.py) and how a program ships (executor/hostprogram.py):
paths expand as `host_word` expands them in bash, the Hub token is found where huggingface_hub finds it,
the zip is the same bytes every time, a program runs from it with its config file, and an interpreter
older than the program declares fails in one plain line that the kind reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from executor.hostprogram import bundle, host_program, minimum_python
from executor.render import host_word, render_command
from executor.stepkind import FactsError, host_document
from executor.transport.base import Collector
from hostprograms import kit
from steps.inspect_config import InspectConfigFacts


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("$models_dir/Kimi-K2.6", {"models_dir": "/m"}),
        ("${models_dir}x/'q' \"$(id)\" `id` * $", {"models_dir": "/a b"}),
        ("~/models", {"HOME": "/home/u"}),
        ("~", {"HOME": "/home/u"}),
        ("a~/$ ~x $1 ${x", {}),
        ("", {}),
    ],
)
def test_a_path_expands_as_host_word_expands_it_in_bash(text: str, env: dict[str, str]) -> None:
    bash = subprocess.run(
        ["bash", "--norc", "-c", f"printf %s {host_word(text)}"], env=env, capture_output=True, text=True, check=True
    )
    assert kit.expand_path(text, env) == bash.stdout


@pytest.mark.parametrize("env", [{}, {"models_dir": ""}])
def test_an_unset_or_empty_var_is_refused_naming_it(env: dict[str, str]) -> None:
    with pytest.raises(kit.Refused, match=r"^models_dir: runbook var models_dir is unset or empty$"):
        kit.expand_path("/x/$models_dir/y", env)
    with pytest.raises(kit.Refused, match=r"^HOME: is not set$"):
        kit.expand_path("~/y", env)


TOKEN_CASES = [
    {"HF_TOKEN": "hf_env_token_1"},
    {"HUGGING_FACE_HUB_TOKEN": " hf_legacy_token\n"},
    {"HF_TOKEN": "hf_a", "HUGGING_FACE_HUB_TOKEN": "hf_b"},
    {"HF_TOKEN": "  ", "HUGGING_FACE_HUB_TOKEN": "hf_b"},  # huggingface_hub takes HF_TOKEN, cleans it to none
    {"HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "hf_b"},
    {"FILE": "hf_from_the_file\r\n"},
    {"FILE": "\n"},
    {"HF_HOME": "$BASE/hf-home", "FILE": "hf_in_hf_home"},
    {"HF_TOKEN_PATH": "$BASE/elsewhere/tok", "FILE": "hf_at_its_path"},
    {"XDG_CACHE_HOME": "$BASE/xdg", "FILE": "hf_in_xdg"},
    {},
]


#: Run with the case's environment: huggingface_hub reads its paths when imported, the kit when asked.
BOTH = """
import json
from huggingface_hub import constants, get_token
from hostprograms import kit
found = kit.HubToken()
print(json.dumps([get_token(), constants.HF_TOKEN_PATH, found.token, found.source, found.reason, found.checked]))
"""


@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda case: ",".join(case) or "none")
def test_the_hub_token_is_the_one_huggingface_hub_finds(case: dict[str, str], tmp_path: Path) -> None:
    env = {k: v.replace("$BASE", str(tmp_path)) for k, v in case.items() if k != "FILE"}
    env |= {"HOME": str(tmp_path / "home"), "BASE": str(tmp_path), "PATH": os.environ["PATH"]}
    env["PYTHONPATH"] = str(Path(kit.__file__).parent.parent)

    def ask() -> list[Any]:
        done = subprocess.run([sys.executable, "-c", BOTH], env=env, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    theirs, path, token, source, reason, checked = ask()
    assert path.startswith(str(tmp_path))  # never the real home's token file
    if "FILE" in case:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(case["FILE"])
        theirs, path, token, source, reason, checked = ask()
    assert token == theirs
    assert (token is None) == (source is None) == (reason is not None)
    if not (case.get("HF_TOKEN") or case.get("HUGGING_FACE_HUB_TOKEN", "").strip()):
        assert checked[-1] == f"file {path}"


@pytest.mark.parametrize(
    ("to", "sent"),
    [
        ("https://hub.example/b", True),
        ("https://cdn.example/b", False),
        ("http://hub.example/b", False),  # the token would travel in clear
    ],
)
def test_a_redirect_keeps_the_token_only_to_the_same_host_over_https(to: str, sent: bool) -> None:
    asked = urllib.request.Request("https://hub.example/a", headers={"Authorization": "Bearer hf_x"})
    new = kit._SameHostAuth().redirect_request(asked, None, 302, "Found", {}, to)
    assert new is not None and new.has_header("Authorization") == sent


def test_the_bundle_is_the_same_bytes_every_time_and_runs_its_program(tmp_path: Path) -> None:
    first = bundle("inspect_config")
    bundle.cache_clear()
    assert bundle("inspect_config") == first
    script = host_program("inspect_config", {"target_dir": "$models_dir/t", "drafter_dir": None}, sys.executable)
    done = subprocess.run(
        ["bash", "--norc", "-c", script], env={"PATH": os.environ["PATH"], "models_dir": str(tmp_path)},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    facts = InspectConfigFacts.model_validate_json(done.stdout.splitlines()[-1])
    assert facts.target.dir == f"{tmp_path}/t" and facts.problems == [f"{tmp_path}/t: no such directory"]


def test_a_program_and_its_config_render_to_the_same_script_every_time() -> None:
    """`runbook plan` shows a host program's step the same every time (no random heredoc delimiter)."""
    config = {"target_dir": "$models_dir/t", "drafter_dir": None, "note": "RUNBOOK_EOF_\nRUNBOOK_CONFIG"}
    script = host_program("inspect_config", config, sys.executable)
    assert host_program("inspect_config", config, sys.executable) == script
    assert "<<'RUNBOOK_PROGRAM'\n" in script and "<<'RUNBOOK_CONFIG'\n" in script


def test_a_large_config_travels_whole(tmp_path: Path) -> None:
    """Eval's prompt sets are megabytes: the config is a file, never an argument (no ARG_MAX), byte for byte."""
    padding = "".join(chr(c) for c in range(32, 0x2FF)) * 4000  # 2.6 MB of text, quotes and non-ASCII
    config = {"target_dir": str(tmp_path), "drafter_dir": None, "padding": padding}
    script = host_program("inspect_config", config, sys.executable) + 'cat "$prog/config.json" >&2\n'
    command = render_command(script, {})  # as a transport runs it: on the wrapper's stdin, held open till it ends
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(command.argv, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)
        assert proc.stdin is not None
        proc.stdin.write(command.stdin)
        proc.stdin.flush()
        code = proc.wait(timeout=60)
        proc.stdin.close()
    assert code == 0, err.read_bytes()[-500:]
    assert json.loads(err.read_text().splitlines()[-1]) == config


def test_an_unset_var_stops_the_program_with_its_name() -> None:
    script = host_program("inspect_config", {"target_dir": "$models_dir/t", "drafter_dir": None}, sys.executable)
    done = subprocess.run(["bash", "--norc", "-c", script], env={"PATH": os.environ["PATH"]}, capture_output=True)
    assert (done.returncode, done.stdout) == (kit.REFUSED, b"")
    assert done.stderr == b"runbook: models_dir: runbook var models_dir is unset or empty\n"


def test_an_interpreter_older_than_declared_fails_in_one_line_the_kind_reports(tmp_path: Path) -> None:
    """A fake `python` reporting 3.6 runs the zip's __main__ (any interpreter parses it) and stops there."""
    fake = tmp_path / "python3.6"
    fake.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c 'import sys, runpy; sys.version_info = (3, 6, 15);"
        " sys.argv = sys.argv[1:];"
        ' runpy.run_path(sys.argv[0], run_name="__main__")\' "$@"\n'
    )
    fake.chmod(0o755)
    script = host_program("inspect_config", {"target_dir": "/t", "drafter_dir": None}, str(fake))
    done = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, env={"PATH": os.environ["PATH"]})
    assert (done.returncode, done.stdout) == (kit.TOO_OLD, b"")
    line = done.stderr.decode()
    assert line.startswith("runbook: inspect_config needs Python >= 3.7, ") and line.count("\n") == 1
    collect = Collector()
    collect.stderr.feed(done.stderr)
    with pytest.raises(FactsError, match=r"^the config check cannot run on the host's interpreter: runbook: .*3\.7"):
        host_document(collect.result(kit.TOO_OLD), InspectConfigFacts, "the config check")
    assert minimum_python("inspect_config") == (3, 7)


def test_a_token_no_http_header_can_carry_is_a_clear_url_error_without_the_token() -> None:
    """A token pasted with a typographic quote: http.client raised UnicodeEncodeError, which download's API
    call took for "not JSON" and its fetch did not catch at all (a traceback)."""
    with pytest.raises(urllib.error.URLError, match="holds a character other than ASCII") as caught:
        kit.request("http://127.0.0.1:9/", token="hf_abc\u2019defgh")
    assert "hf_abc" not in str(caught.value)
