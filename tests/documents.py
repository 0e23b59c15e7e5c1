"""What `runbook schema --report` / `--plan` say of a document a run wrote, for the tests that hold one."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from tests.clirun import runbook_cli


def schema_problems(which: str, document: Any) -> list[str]:
    """Each way `document` breaks the JSON Schema that `runbook schema --{which}` prints, as `where: what`."""
    printed = runbook_cli("schema", f"--{which}")
    assert printed.returncode == 0, printed.stderr
    validator = jsonschema.Draft202012Validator(json.loads(printed.stdout))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(document)]
