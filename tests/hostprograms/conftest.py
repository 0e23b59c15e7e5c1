"""Run a host program as the host runs it: its bundle (`executor.hostprogram.bundle`, the kit included) under
`python -I -S` (the SGLang venv's python has nothing of ours), with a config file; its one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from executor.hostprogram import bundle

ProgramRun = Callable[[str, dict[str, Any]], dict[str, Any]]


def program_command(tmp_path: Path, name: str, config: dict[str, Any]) -> list[str]:
    """The command line that runs program `name` with `config` (files written under `tmp_path`)."""
    program = tmp_path / f"{name}.pyz"
    if not program.exists():
        program.write_bytes(bundle(name))
    config_file = tmp_path / f"{name}-{len(list(tmp_path.glob(f'{name}-*.json')))}.json"
    config_file.write_text(json.dumps(config))
    return [sys.executable, "-I", "-S", str(program), str(config_file)]


def document(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.fixture
def run_program(tmp_path: Path) -> ProgramRun:
    """`run_program(name, config)`: its document. The run must end, stdout and stderr closed, within 60 s:
    a process it leaves behind (a server, its keeper) holds neither (they are an SSH session's channel)."""

    def run(name: str, config: dict[str, Any]) -> dict[str, Any]:
        command = program_command(tmp_path, name, config)
        return document(subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL))

    return run
