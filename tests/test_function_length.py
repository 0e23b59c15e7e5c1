"""No function of executor/ or steps/ over MAX_LINES lines (issue 28: small functions with one job, which a
reader takes in at once). Counted from its `def` (decorators aside) to its last line, docstring included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 80


def too_long(root: Path) -> list[str]:
    """Each function over MAX_LINES as `path:line name (N lines)`."""
    found = []
    for folder in ("executor", "steps"):
        for path in sorted((root / folder).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_LINES:
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_executor_or_steps_is_over_80_lines() -> None:
    assert too_long(ROOT) == []


def test_a_long_function_is_found(tmp_path: Path) -> None:
    """The check itself: a method of 81 lines is named, a function of 80 is not."""
    (tmp_path / "executor").mkdir()
    (tmp_path / "steps").mkdir()
    lines = [f"x{i} = {i}" for i in range(MAX_LINES - 1)]
    fits = "\n".join(["def fits():", *(f"    {line}" for line in lines)])
    over = "\n".join(["class K:", "    async def over(self):", *(f"        {line}" for line in [*lines, "y = 0"])])
    (tmp_path / "executor" / "ok.py").write_text(fits + "\n")
    (tmp_path / "steps" / "long.py").write_text(over + "\n")
    assert too_long(tmp_path) == ["steps/long.py:2 over (81 lines)"]
