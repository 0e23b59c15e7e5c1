"""Which serving benchmark the host's SGLang has: `sglang.benchmark.serving`, else the old `sglang.bench_serving`.

SGLang 0.5.23 moved its serving benchmark to `python -m sglang.benchmark.serving`; `python -m sglang.bench_serving`
still works there but prints a FutureWarning and "will be removed in a future release" (bench_serving.py of
0.5.23), and releases before the move have only it. Both take the same flags and write the same JSONL line
(0.5.23's bench_serving.py re-exports benchmark/serving.py's `cli_main`).

The benchmark step chooses on the host, right before each run, with the step's own interpreter (which may not be
the probe's): `choose_lines` renders bash that finds the package folder as the probe does
(`importlib.util.find_spec("sglang")`, which imports nothing of SGLang: its runtime needs torch), takes the first
entry point whose file is there, prints it after ENTRY_MARKER, and fails with the reason (SGLang not installed, or
neither file) when there is none. `ran_entry_point` reads back which one ran, for the run's record. The probe reports
the same files as `sglang.bench_entry_points` (hostprograms/probe.py BENCH_ENTRY_POINTS, the same table: tests
check they agree).
"""

from __future__ import annotations

import shlex

#: (module, its file in the package folder), preferred first
ENTRY_POINTS = (("sglang.benchmark.serving", "benchmark/serving.py"), ("sglang.bench_serving", "bench_serving.py"))
#: The line the script prints before running the benchmark: what follows it names the module that ran.
ENTRY_MARKER = "==> runbook: the serving benchmark's entry point: "

#: One line of Python 3 (any version: the host's): the first entry point whose file is there, else why none.
_CHOOSE = (
    "import importlib.util, os, sys; spec = importlib.util.find_spec('sglang'); "
    "folder = spec and spec.origin and os.path.dirname(spec.origin); "
    "folder or sys.exit('sglang is not installed for %s' % sys.executable); "
    "have = [module for module, path in ENTRY_POINTS if os.path.isfile(os.path.join(folder, path))]; "
    "have or sys.exit('the SGLang at %s has no serving benchmark: neither %s' % (folder, ' nor '.join("
    "'%s (%s)' % entry for entry in ENTRY_POINTS))); "
    "print(have[0])"
)


def choose_lines(python: str) -> str:
    """Bash lines that set `$entry` to the host's serving benchmark module with `python` (a host word, rendered),
    print it after ENTRY_MARKER, and end the script with the reason on stderr where there is none."""
    program = _CHOOSE.replace("ENTRY_POINTS", repr(ENTRY_POINTS))
    return f'entry=$({python} -c {shlex.quote(program)}) || exit\necho {shlex.quote(ENTRY_MARKER)}"$entry"\n'


def ran_entry_point(stdout: str) -> str | None:
    """The entry point the script chose (the last ENTRY_MARKER line), None when it never printed one."""
    chosen = [line.removeprefix(ENTRY_MARKER) for line in stdout.splitlines() if line.startswith(ENTRY_MARKER)]
    return chosen[-1].strip() if chosen and chosen[-1].strip() in dict(ENTRY_POINTS) else None
