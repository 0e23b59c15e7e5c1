"""Benchmark 2: script transfer. 50 steps, each sending its own 256 KiB script that checks, on the
host, that it arrived whole.

A step kind that embeds a program (the probe's Python, the verify host program) sends tens to
hundreds of KiB per step. A tool that puts the script on a command line meets two limits: Linux
refuses to exec a single argument over 128 KiB (MAX_ARG_STRLEN; errno 7, E2BIG, "Argument list too
long"), and sshd drops the connection when an exec request does not fit in one SSH packet (256 KiB
in OpenSSH). So every tool sends the script its natural way, and where that fails the failure is
the result; where the tool has a second way (copy the script as a file, then run it) that way is
measured too:

- runbook: the script in a `shell` step (its wrapper reads it from stdin, byte-exact);
- raw asyncssh: as the exec request's command line (as `ssh host 'script'` would), and on the
  channel's stdin into a temporary file that bash runs, the floor of this benchmark;
- ansible-playbook: the `shell` module with the script inline, and the `script` module;
- pyinfra: `server.shell` with the script inline, and `server.script`.

Each script is distinct (its payload is seeded by the step's number), so nothing can be cached.
It holds a payload of base64 text in a quoted heredoc and ends by comparing the payload's length
and sha256, computed on the host, with the values written into it; it exits non-zero on any
difference, so a tool that damaged or cut the script fails its step. The measurement is the same
as benchmark 1's (bench.overhead: one step and all steps in each repetition, marginal cost per step).
"""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Callable

from bench.fleet import Shell
from bench.harness import Section
from bench.overhead import SHELL_LABELS, host_words, step_table, step_times, usable
from bench.tools import Ansible, AsyncsshFloor, Pyinfra, RunbookCLI, RunbookEngine, Runner

STEPS = 50
SIZE = 256 * 1024
LINE = 76  # base64 line length, as `base64` writes it
ROOM = 1024  # bytes of a checking script that are not payload: its code, its padding


def checking_script(seed: int, size: int = SIZE) -> str:
    """A bash script of exactly `size` bytes (ASCII, at least 1 KiB) that checks its payload's size
    and sha256 on the host; a comment line at its end pads it to the size."""
    chars = (size - ROOM) * LINE // (LINE + 1)
    if chars <= 0:
        raise ValueError(f"a checking script needs more than {ROOM} bytes, not {size}")
    text = base64.b64encode(random.Random(seed).randbytes(chars)).decode()[:chars]
    payload = "\n".join(text[i : i + LINE] for i in range(0, len(text), LINE))
    digest = hashlib.sha256(payload.encode()).hexdigest()
    body = (
        "#!/bin/bash\n"
        f"# runbook bench: step {seed}; its payload must arrive as {len(payload)} bytes, sha256 {digest}\n"
        "set -eu\n"
        "payload=$(cat <<'PAYLOAD_EOF'\n"
        f"{payload}\n"
        "PAYLOAD_EOF\n"
        ")\n"
        f'[ "${{#payload}}" -eq {len(payload)} ] || {{ echo "payload is ${{#payload}} bytes" >&2; exit 3; }}\n'
        'got=$(printf %s "$payload" | sha256sum | cut -d" " -f1)\n'
        f'[ "$got" = {digest} ] || {{ echo "payload sha256 is $got" >&2; exit 4; }}\n'
        f"echo ok {len(payload)} {digest}\n"
    )
    return body + "#" + "=" * (size - len(body) - 2) + "\n"


def runners() -> list[Runner]:
    """Every way of every tool, the floor (the script on stdin, to a file bash runs) last."""
    return [
        RunbookCLI(),
        RunbookEngine(),
        Ansible("shell"),
        Ansible("script"),
        Pyinfra("shell"),
        Pyinfra("script"),
        AsyncsshFloor(),
        AsyncsshFloor(stdin=True),
    ]


def section(
    steps: int = STEPS,
    size: int = SIZE,
    reps: int = 5,
    shell: Shell = "clean",
    log: Callable[[str], None] | None = None,
) -> Section:
    """Run benchmark 2 and describe it: one table, the failures as notes."""
    tools, notes = usable(runners())
    floor = tools[-1]
    times = step_times(tools, [checking_script(i, size) for i in range(steps)], reps, shell, log)
    return Section(
        title=f"2. Script transfer — {SHELL_LABELS[shell]}",
        method=(
            f"{steps} steps, each sending its own {size // 1024} KiB bash script that checks its payload's size "
            f"and sha256 on the host, to {host_words(shell)}. Measured as benchmark 1: "
            f"medians of {reps} interleaved repetitions, marginal cost per step = (T({steps}) - T(1)) / "
            f"{steps - 1}. The floor is raw asyncssh with the script on the channel's stdin, into a temporary "
            "file that bash runs (`bash -s` would read it from the pipe one byte at a time). A failed row is a "
            "tool that cannot send such a script its way; its message is the tool's own (a command line over "
            "128 KiB cannot be exec'ed: E2BIG, errno 7; an exec request over 256 KiB makes sshd drop the "
            "connection)."
        ),
        tables=[step_table(times, tools, floor)],
        notes=notes + times.failures(tools),
    )
