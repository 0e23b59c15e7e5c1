"""tests.clirun: the CLI in this process answers as its subprocess would, and leaves the process as it found it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.clirun import runbook_cli

BOOK = """\
name: clirun
hosts:
  here: {address: local}
secrets:
  TOKEN: {env: RB_CLIRUN_TOKEN}
steps:
  - id: one
    kind: shell
    script: 'echo "$TOKEN" > /dev/null; echo "an output line long enough to be cut by a narrow terminal"'
"""


def test_a_run_leaves_environment_folder_umask_and_signal_handlers_as_they_were(tmp_path: Path) -> None:
    (tmp_path / "book.yaml").write_text(BOOK)
    before = dict(os.environ), os.getcwd(), os.umask(0o022), {s: signal.getsignal(s) for s in signal.valid_signals()}
    os.umask(before[2])
    done = runbook_cli("run", "book.yaml", "--json", env={"RB_CLIRUN_TOKEN": "s3cret-value-1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["event"] for line in done.stdout.splitlines()][-1] == "run_finished"
    assert (tmp_path / "logs").is_dir()  # the relative default log folder is under `cwd`
    umask = os.umask(0o022)
    os.umask(umask)
    after = dict(os.environ), os.getcwd(), umask, {s: signal.getsignal(s) for s in signal.valid_signals()}
    assert after == before  # `run` sets umask 077 and SIGINT/SIGTERM/SIGHUP handlers; none is left behind


def test_a_usage_error_is_exit_2_with_argparse_s_message_and_help_is_exit_0() -> None:
    usage = runbook_cli("status", "--no-such-option")
    assert usage.returncode == 2 and "unrecognized arguments: --no-such-option" in usage.stderr
    helped = runbook_cli("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: runbook")
