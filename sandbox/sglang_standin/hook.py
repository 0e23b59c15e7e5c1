"""TEST DOUBLE wiring: make `python -m sglang.launch_server|benchmark.serving|bench_serving` run the stand-in.

`python -m sandbox.prepare` writes a one-line `.pth` file into the test venv's site-packages that
runs this file (by path) at interpreter start-up, but only when the command line names one of
the entry modules; this file then checks precisely that the interpreter was started as
`python [options] -m sglang.launch_server` (or `sglang.benchmark.serving`, `sglang.bench_serving`) and only then
puts a meta-path finder first on `sys.meta_path` that answers for exactly these names:

- `sglang` and `sglang.benchmark`: the REAL package folders (origin and search locations from the normal path
  finder), with a loader that runs nothing, because the real `sglang/__init__.py` needs torch;
- `sglang.launch_server` -> `sglang_standin.server.main()`, `sglang.benchmark.serving` (SGLang 0.5.23 on) and
  the deprecated `sglang.bench_serving` -> `sglang_standin.bench_client.main()`, each only where the real
  package has its file (`ENTRY_POINTS`): a build without it fails as a real one does ("No module named ...");
- `sglang_standin`: this folder as a top-level package (its modules import each other relatively).

Any other interpreter in the venv (the probe step's `find_spec("sglang")`, `import sglang`)
never sees the finder, so it meets the real release files and the real import failure.
Stdlib only; runs under the test venv's Python.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, ModuleType

HERE = Path(__file__).resolve().parent
PACKAGE = "sglang_standin"
#: the real entry modules and the stand-in module whose main() replaces each
ENTRY_POINTS = {
    "sglang.launch_server": "server",
    "sglang.benchmark.serving": "bench_client",
    "sglang.bench_serving": "bench_client",
}
#: the packages on the way to an entry module, loaded from their real folders without running their __init__.py
_PACKAGES = ("sglang", "sglang.benchmark")
# interpreter options that take a value as the next argument (python(1))
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def module_run(argv: Sequence[str]) -> str | None:
    """The module named by `-m` on an interpreter command line (`sys.orig_argv`), else None."""
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-m":
            return args[0] if args else None
        if arg.startswith("-m"):
            return arg[2:]
        if arg in _OPTIONS_WITH_VALUE:
            args = args[1:]
        elif arg == "-c" or arg == "-" or not arg.startswith("-"):
            return None  # a command, stdin or a script: no -m
    return None


class _RunNothing(importlib.abc.Loader):
    """Loads the real `sglang` package folder without executing its __init__.py."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = "The real SGLang files, not imported: the sandbox's SGLang stand-in is running."


class _EntryPoint(importlib.abc.InspectLoader):
    """`python -m sglang.X` runs the code from get_code(): the stand-in module's main()."""

    def __init__(self, target: str) -> None:
        self.target = target

    def get_source(self, fullname: str) -> str:
        return (
            "import sys\n"
            f"if __name__ == '__main__':\n"
            f"    from {PACKAGE}.{self.target} import main\n"
            "    sys.exit(main())\n"
        )

    def get_code(self, fullname: str) -> CodeType:
        return compile(self.get_source(fullname), str(HERE / f"{self.target}.py"), "exec")

    def exec_module(self, module: ModuleType) -> None:
        exec(self.get_code(module.__name__), module.__dict__)


class StandinFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _PACKAGES:
            real = importlib.machinery.PathFinder.find_spec(fullname, path)
            if real is None:
                return None
            spec = importlib.machinery.ModuleSpec(fullname, _RunNothing(), origin=real.origin, is_package=True)
            spec.submodule_search_locations = list(real.submodule_search_locations or [])
            spec.has_location = real.has_location
            return spec
        if fullname in ENTRY_POINTS and importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            module = ENTRY_POINTS[fullname]
            return importlib.machinery.ModuleSpec(fullname, _EntryPoint(module), origin=str(HERE / f"{module}.py"))
        if fullname == PACKAGE:
            return importlib.util.spec_from_file_location(
                PACKAGE, HERE / "__init__.py", submodule_search_locations=[str(HERE)]
            )
        return None


def install(argv: Sequence[str]) -> bool:
    """Put the finder first when this interpreter runs one of the entry modules; True if it did."""
    if module_run(argv) not in ENTRY_POINTS:
        return False
    if not any(isinstance(finder, StandinFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, StandinFinder())
    return True


def pth_line() -> str:
    """The `.pth` line that runs this file at start-up of an interpreter that may need it."""
    names = " or ".join(f"{name!r} in ' '.join(sys.orig_argv)" for name in ENTRY_POINTS)
    return (
        f"import sys; ({names}) and __import__('runpy').run_path({str(Path(__file__).resolve())!r}, "
        f"run_name='sglang_standin_hook')\n"
    )


if __name__ == "sglang_standin_hook":
    install(sys.orig_argv)
