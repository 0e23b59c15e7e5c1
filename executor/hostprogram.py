"""Ship a host program (`hostprograms/<name>.py`) to the host with its config, and run it there.

`host_program(name, config, python)` renders the bash lines that do it. The program travels as one zip
holding `hostprograms/__init__.py`, the shared `kit.py`, the program and a `__main__.py`: each helper has
one source, bundled when shipped, never copied. The zip is deterministic (fixed timestamps, sorted
entries, stored uncompressed so no zlib is needed on either side), and so are the heredocs' delimiters
(fixed: neither base64 nor a JSON line can hold one), so the rendered script and `runbook plan` are
stable; it is sent base64 in a quoted heredoc (`render.heredoc`), the config
(JSON, any size: eval_acceptance's prompt sets too) in another, both into a `mktemp -d` folder removed
on exit (or, when its bash was killed first, by the next program on the host: `host_program`), then run
as `PYTHON program.pyz config.json` (hostprograms/kit.py says what it prints).

The `__main__.py` checks the interpreter against the program's MIN_PYTHON before the program is read,
in syntax any Python parses, so an old interpreter fails in one plain line with kit.TOO_OLD, which
`executor.stepkind.host_document` turns into a clear message.

The programs are read as files, never imported: the controller does not run them (only the kit is
imported: even the kit's constants are read from its source, so that `runbook validate` and `plan` import
no host program).
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import io
import json
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.render import heredoc, host_word

#: The line that opens a shipped program's lines in a script: the readable plan names the program by it.
PROGRAM_LINE = re.compile(
    r"^# hostprograms/([A-Za-z_][A-Za-z0-9_]*)\.py with the kit, zip sha256:([0-9a-f]{16})$", re.MULTILINE
)
PACKAGE = Path(__file__).resolve().parent.parent / "hostprograms"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold

_MAIN = """\
import sys
if sys.version_info < {min_python!r}:
    sys.stderr.write("runbook: %s needs Python >= {min_text}, %s is %s\\n"
                     % ({name!r}, sys.executable, sys.version.split()[0]))
    sys.exit({too_old})
from hostprograms import {name}
sys.exit({name}.main())
"""


@functools.cache
def kit_constant(name: str) -> Any:
    """A constant of hostprograms/kit.py (TOO_OLD, PROGRESS_PREFIX), read from its source."""
    return _constant("kit", name)


def _constant(module: str, name: str) -> Any:
    """A constant a module of the package assigns at its top level, read from its source: from its own
    line when the assignment fits on one (parsing a whole program costs ~10 ms, at every `runbook plan`)."""
    source = (PACKAGE / f"{module}.py").read_text(encoding="utf-8")
    lines = [line for line in source.splitlines() if line.startswith(f"{name} =")]
    try:
        body = ast.parse(lines[0]).body if len(lines) == 1 else ast.parse(source).body
    except SyntaxError:  # an assignment over several lines
        body = ast.parse(source).body
    for node in body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"hostprograms/{module}.py assigns no {name}")


def minimum_python(name: str) -> tuple[int, int]:
    """The MIN_PYTHON a program declares."""
    major, minor = _constant(name, "MIN_PYTHON")
    return int(major), int(minor)


@functools.cache
def bundle(name: str) -> bytes:
    """The zip of program `name`: the package's `__init__`, the kit, the program, a `__main__`."""
    low = minimum_python(name)
    main = _MAIN.format(min_python=low, min_text=".".join(map(str, low)), name=name, too_old=kit_constant("TOO_OLD"))
    members = {
        "__main__.py": main.encode(),
        **{f"hostprograms/{f}.py": (PACKAGE / f"{f}.py").read_bytes() for f in ("__init__", "kit", name)},
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(members):
            entry = zipfile.ZipInfo(path, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, members[path])
    return out.getvalue()


@functools.cache
def _shipped(name: str) -> tuple[str, str]:
    """(sha256, base64 text) of the bundle: once per program, not once per rendered script."""
    data = bundle(name)
    return hashlib.sha256(data).hexdigest(), base64.encodebytes(data).decode()


@dataclass(frozen=True)
class Shipped:
    """A host program as the readable plan shows it: its bundle's size and whole sha256, never its body."""

    name: str
    size: int
    sha256: str


def shipped_programs(script: str) -> list[Shipped]:
    """The host programs a rendered script ships, in order: by the line `host_program` opens each with, its
    digest that of the program's bundle (a script that merely names a program ships none)."""
    names = dict.fromkeys(PROGRAM_LINE.findall(script))
    shipped = [
        name for name, digest in names if (PACKAGE / f"{name}.py").is_file() and _shipped(name)[0][:16] == digest
    ]
    return [Shipped(name, len(bundle(name)), _shipped(name)[0]) for name in dict.fromkeys(shipped)]


#: Before a program's folder is made: the start time of the bash that makes it (field 22 of /proc/PID/stat,
#: counted after the command name, which may hold spaces and parens), its marker with its pid; then every
#: folder of this user that such a marker names a bash no longer running for (a step killed outright: kill -9
#: of the controller or of its step, a lost host) is removed. A live step's folder, of this run or another,
#: names a running bash and stays. The marker carries the bash's pid namespace too (the inode of
#: /proc/PID/ns/pid; 0 where unreadable), and only folders of this one are judged: a container sharing /tmp
#: counts its pids apart, so its live program's pid names another process here, or none. Without /proc no
#: marker is read and nothing is swept. The script's own IFS (a strict mode's newline and tab), noglob or
#: failglob do not reach the sweep (a subshell, which keeps its variables too).
_SWEEP = r"""runbook_started() {
  local stat fields IFS=$' \t\n'
  runbook_start=0
  [[ $1 =~ ^[0-9]+$ ]] && { read -r stat < "/proc/$1/stat"; } 2> /dev/null || return 0
  read -r -a fields <<< "${stat##*) }"
  [[ ${fields[19]:-} =~ ^[0-9]+$ ]] && runbook_start=${fields[19]}
  return 0
}
runbook_started $$
runbook_ns=$(readlink "/proc/$$/ns/pid" 2> /dev/null) || runbook_ns=
runbook_ns=${runbook_ns//[^0-9]/}
runbook_ns=${runbook_ns:-0}
if [ "$runbook_start" != 0 ]; then
  (
    set +f
    shopt -u failglob
    for runbook_old in "${TMPDIR:-/tmp}"/runbook-prog.*.*.*.*; do
      [ -d "$runbook_old" ] && [ ! -L "$runbook_old" ] && [ -O "$runbook_old" ] || continue
      runbook_owner=${runbook_old##*/runbook-prog.}
      runbook_started "${runbook_owner%%.*}"
      runbook_owner=${runbook_owner#*.}
      runbook_other=${runbook_owner#*.}
      [ "${runbook_other%%.*}" = "$runbook_ns" ] || continue
      [ "$runbook_start" = "${runbook_owner%%.*}" ] || rm -rf -- "$runbook_old" || true
    done
  ) || true
fi
"""


def marked_folder(var: str) -> str:
    """Bash lines that sweep the folders of killed steps (`_SWEEP`), then make a folder for this one, in bash
    variable `var`, named after the bash that runs them (`runbook-prog.PID.START.PIDNS.XXXXXXXX`), removed at its
    exit. TERM and PIPE end it through that trap: a stopped step's bash says `Terminated` on a stderr whose
    reader may be gone (the controller killed), and PIPE's default would end it there, its folder left. What a
    step leaves in the host's temp folder lies in one (a host program, bench_serving's output)."""
    return (
        _SWEEP
        + f'{var}=$(mktemp -d "${{TMPDIR:-/tmp}}/runbook-prog.$$.$runbook_start.$runbook_ns.XXXXXXXX") || exit 1\n'
        + f"trap 'rm -rf -- \"${var}\"' EXIT\ntrap 'exit 143' TERM\ntrap 'exit 141' PIPE\n"
    )


def host_program(name: str, config: Mapping[str, Any], python: str = "python3") -> str:
    """Bash lines that run program `name` with `config` under the host's `python` (a host word: `~` and
    `$var` expand there) and leave its exit status as theirs. Its folder is named after the bash that runs
    it (`marked_folder`), so that the next program on the host removes it when that bash was killed before
    its EXIT trap could."""
    return program_files(name, config, "prog", marked_folder("prog")) + program_run(python, "prog")


def program_files(name: str, config: Mapping[str, Any], folder: str, before: str = "") -> str:
    """Bash lines that write program `name` and its config into the folder in bash variable `folder` (made by
    `marked_folder`, or by the `before` lines), opened with the line that names the program: a script that runs
    one program several times (a benchmark run's scrapes) ships it once."""
    digest, encoded = _shipped(name)
    return (
        f"# hostprograms/{name}.py with the kit, zip sha256:{digest[:16]}\n"
        + before
        + heredoc(encoded, command=f'base64 -d > "${folder}/program.pyz"', delimiter="RUNBOOK_PROGRAM")
        + heredoc(
            json.dumps(config, allow_nan=False), command=f'cat > "${folder}/config.json"', delimiter="RUNBOOK_CONFIG"
        )
    )


def program_run(python: str, folder: str) -> str:
    """The bash line that runs the program `program_files` wrote into `$folder` under the host's `python`."""
    return f'{host_word(python)} "${folder}/program.pyz" "${folder}/config.json"\n'


#: How a host program marks a line of live progress: this prefix, then one JSON object, then a newline
#: (hostprograms/kit.py prints it; the kit is bundled into each program, so both sides read one definition).
PROGRESS_PREFIX: bytes = kit_constant("PROGRESS_PREFIX").encode()
