"""The README's "Testing a runbook offline" example: its two files are docs/examples/ as they are, and pytest
runs them, with the runbook_offline fixture of the plugin runbook installs (executor.faces.testing), as a user's
project would."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


@pytest.mark.parametrize(("name", "language"), [("my_runbook.yaml", "yaml"), ("test_my_runbook.py", "python")])
def test_the_readme_shows_the_example_files_as_they_are(name: str, language: str) -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"`docs/examples/{name}`" in readme
    assert f"```{language}\n{(EXAMPLES / name).read_text()}```\n" in readme


def test_the_example_passes_under_pytest_with_the_plugin(pytester: pytest.Pytester) -> None:
    for name in ("my_runbook.yaml", "test_my_runbook.py"):
        pytester.makefile(Path(name).suffix, **{Path(name).stem: (EXAMPLES / name).read_text()})
    # `-p executor.faces.testing` is the installed entry point's plugin (named alike: loaded once either way)
    result = pytester.runpytest_inprocess("-p", "executor.faces.testing", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
