"""The run folders of a log folder in the order `runbook` gives them, for tests that pick one."""

from __future__ import annotations

import json
from pathlib import Path


def run_folders(logs: Path) -> list[Path]:
    """The run folders of `logs`, oldest first: by run.json's `started_at`, as `runbook` orders them.

    Not by folder name: two runs started within one second share the stamp their ids begin with, and
    the random tail after it would order them by chance (CI failed on that once).
    """
    folders = [p for p in logs.iterdir() if p.is_dir()]
    return sorted(folders, key=lambda p: json.loads((p / "run.json").read_text())["started_at"])
