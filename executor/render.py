"""Quoting-safe command rendering.

A step's script never passes through a command line or a template. What runs on the host is
always the same small bash program (`WRAPPER`), started with two numbers as arguments; the
exported vars and the script follow on its stdin as raw bytes, of exactly those lengths. So
any byte sequence arrives intact (quotes, backslashes, `$(...)`, CRLF, no trailing newline,
a line equal to any heredoc delimiter), and no size limit of the command line applies.

The wrapper runs the script as its own session (`setsid`) with stdin at EOF, so a `read` in
the script cannot swallow anything. It then waits on its own stdin: when that closes (the
controller's timeout or interrupt, or a lost connection) it kills every process of the step's
session, whatever process group it moved to (GNU `timeout`, jobs under `set -m`): TERM, up to 2 s
for the session to empty, then KILL round after round until /proc shows none left; the last line
of its stderr then says what it confirmed (KILLED_NOTE, or UNCONFIRMED_NOTE and why). When the
script ends, whatever it left in its session is killed the same way: a daemon that must outlive
its step has to start its own session (`setsid`).

Step kinds that embed a program in a script (Python for a probe, say) use `heredoc`, whose
delimiter is random and checked to be absent from the body.
"""

from __future__ import annotations

import hashlib
import re
import secrets as _random
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

#: The step's own shell: `bash --norc -c STEP_SHELL runbook-step ENV_FILE SCRIPT_FILE` sources the exported
#: vars, then becomes the script's bash. The persistent runner (executor/transport/runner_host.py) starts
#: the script's bash alone instead, with `RenderedCommand.env` put in its environment: one bash start
#: less, and the step sees the same (tests/executor/test_runner.py compares the two).
STEP_SHELL = '. "$1" && exec bash "$2"'

#: The last line of a stopped step's stderr when the host confirmed that its session is empty.
KILLED_NOTE = "[runbook] stopped: every process of the step's session was killed"
#: The start of the last line of a step's stderr when the host could not confirm that (the runner
#: writes both lines too: executor/transport/runner_host.py; base.kill_note reads them).
UNCONFIRMED_NOTE = "[runbook] could not confirm that the step's processes were killed"
#: Rounds of KILL over the step's session before its survivors are reported (the 6th on pause 50 ms).
KILL_ROUNDS = 40
#: Scans of the step's session in a row that must find it empty before it counts as empty (a process
#: that forks and exits between a scan's listing of /proc and its reads is missed by one scan): after a
#: stop, or once a scan found anyone; END_SCANS at the end of a script that left nothing behind, the
#: common case, paid by every step.
EMPTY_SCANS = 3
END_SCANS = 2

WRAPPER = (
    r"""# runbook step wrapper. Arguments: byte lengths of the environment and of the script,
# which follow on stdin. Exit 125: the payload did not arrive whole.
set -u
umask 077
exec 3<&0  # background jobs get /dev/null as stdin; the watcher below needs the real one
dir=$(mktemp -d "${TMPDIR:-/tmp}/runbook.XXXXXXXX") || exit 125
trap 'rm -rf "$dir"' EXIT
head -c "$1" <&3 > "$dir/env" || exit 125
head -c "$2" <&3 > "$dir/script" || exit 125
# a newline follows the payload: if it cannot be read, the payload was cut short (no fork to check)
if ! IFS= read -r -n 1 _ <&3; then
  echo "runbook: the script did not arrive whole" >&2
  exit 125
fi
# The step's session into $found: every live process whose session id (field 6 of /proc/PID/stat,
# counted after the command name, which may hold spaces and parens) is the step's pid, whatever
# process group it moved to (GNU timeout, set -m). Only setsid leaves it.
# The listing is read one file at a time: a process that forks and exits meanwhile (a chain of them)
# is gone when its file is read, its child not listed. So the pids started since the listing (the
# 5th field of /proc/loadavg is the newest) are read next, newest range after range, until none is new.
members() {
  found=()
  local f newest seen=0 n rounds=0
  { read -r _ _ _ _ seen < /proc/loadavg; } 2> /dev/null
  for f in /proc/[0-9]*/stat; do member "$f"; done
  while { read -r _ _ _ _ newest < /proc/loadavg; } 2> /dev/null && [ "$newest" -gt "$seen" ] \
    && [ $((rounds += 1)) -le 64 ]; do
    if [ $((newest - seen)) -le 4096 ]; then
      for ((n = seen + 1; n <= newest; n++)); do member "/proc/$n/stat"; done
    else  # too many to read one by one: the whole listing again (no range is ever skipped)
      for f in /proc/[0-9]*/stat; do member "$f"; done
    fi
    seen=$newest
  done
}
member() {
  # the whole file: a command name may hold a newline (read stops at none; its status is 1 at EOF).
  # Emptied first: a file that ended meanwhile must not leave the last one's line (nor, under set -u,
  # an unset one: that would end the watcher without a word)
  local line=
  { IFS= read -r -d '' line < "$1"; } 2> /dev/null
  [ -n "$line" ] || return 0
  line=${line#*) }
  case $line in *")"*) line=${line##*) } ;; esac
  case $line in [ZX]*) return 0 ;; esac
  line=${line#* }
  line=${line#* }
  line=${line#* }
  [ "${line%% *}" = "$pid" ] && found+=("${1:6:-5}")
  return 0
}
killed_note="""
    + shlex.quote(KILLED_NOTE)
    + r"""
unconfirmed_note="""
    + shlex.quote(UNCONFIRMED_NOTE)
    + r"""
# KILL the step's session until it is empty (its processes may fork meanwhile). Status 0: empty;
# 1: $found survived every round; 2: no /proc, only the step's process group got KILL. Empty means
# that many scans in a row found nothing: one scan can miss a process that forks and exits meanwhile.
kill_session() {
  local round empty=0 needed=${1:-"""
    + str(EMPTY_SCANS)
    + r"""}
  kill -KILL -- "-$pid" "$pid" 2> /dev/null
  [ -r /proc/self/stat ] || return 2
  for ((round = 1; round <= """
    + str(KILL_ROUNDS)
    + r"""; round++)); do
    members
    if [ "${#found[@]}" -eq 0 ]; then
      ((++empty < needed)) || return 0
      continue
    fi
    empty=0 needed="""
    + str(EMPTY_SCANS)
    + r"""
    kill -KILL "${found[@]}" 2> /dev/null
    [ "$round" -le 5 ] || sleep 0.05
  done
  members
  [ "${#found[@]}" -eq 0 ]
}
setsid bash --norc -c '"""
    + STEP_SHELL
    + r"""' runbook-step "$dir/env" "$dir/script" < /dev/null 3<&- &
pid=$!
# stdin closed (the controller's timeout or interrupt, or a lost connection): stop the step. TERM to
# its session, and to "$pid" itself, as its session is missing until setsid has run; KILL once the
# session is still not empty after 2 s; then the last line of stderr says what the host confirmed.
(
  cat <&3 > /dev/null 2>&1
  : > "$dir/stop"
  members
  kill -TERM -- "-$pid" "$pid" ${found[@]+"${found[@]}"} 2> /dev/null
  for ((tick = 0; tick < 20; tick++)); do
    members
    [ "${#found[@]}" -eq 0 ] && break
    sleep 0.1
  done
  kill_session
  case $? in
    0) printf '\n%s\n' "$killed_note" >&2 ;;
    1) printf '\n%s: %s still running after KILL (pids %s)\n' \
      "$unconfirmed_note" "${#found[@]}" "${found[*]}" >&2 ;;
    *) printf '\n%s: %s\n' "$unconfirmed_note" "this host has no /proc, only its process group was killed" >&2 ;;
  esac
) &
watcher=$!
wait "$pid" 2> /dev/null  # (bash's own note on a step killed by a signal is no line of the step's)
rc=$?
if [ -e "$dir/stop" ]; then
  wait "$watcher"
else
  # the script ended: what it left running in its session dies with it
  kill "$watcher" 2> /dev/null
  kill_session """
    + str(END_SCANS)
    + r"""
  if [ $? = 1 ]; then
    printf '\n%s: %s the script left running survived KILL (pids %s)\n' \
      "$unconfirmed_note" "${#found[@]}" "${found[*]}" >&2
  fi
fi
exit "$rc"
"""
)

#: Exported to every script: nothing may wait for a person.
UNATTENDED_ENV = {"DEBIAN_FRONTEND": "noninteractive", "SUDO_ASKPASS": "/bin/false"}
#: Names bash sets itself: readonly in bash (exporting one stops the wrapper's `. env`), or changed by
#: every bash start (SHLVL, `_`), so no two ways of starting a step could give them alike. No var or
#: secret may have one (executor/runbook/model.py says so when a runbook is loaded).
BASH_OWNED_NAMES = frozenset({"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "SHLVL", "UID", "_"})
MASK = "***"
PAYLOAD_END = b"\n"  # read by the wrapper after the script: proof that the payload arrived whole
WRAPPER_SHA256 = hashlib.sha256(WRAPPER.encode()).hexdigest()


@dataclass(frozen=True)
class RenderedCommand:
    """What a transport runs: `argv` as the command line, `stdin` as the payload."""

    argv: tuple[str, ...]
    stdin: bytes
    display: str  # the whole command as text, secrets masked: what the audit log records
    #: What the step's environment adds to the login shell's, secrets included (never in a repr): the
    #: wrapper gets it as the payload's `export` block, the persistent runner as data.
    env: Mapping[str, str] = field(repr=False)

    @property
    def script(self) -> bytes:
        """The script of the payload, byte for byte (the wrapper's second argument is its length)."""
        start = int(self.argv[-2])
        return self.stdin[start : start + int(self.argv[-1])]

    @property
    def command_line(self) -> str:
        """The command line for an SSH exec request (run by the login shell)."""
        return "exec " + shlex.join(self.argv)


def export_block(env: Mapping[str, str]) -> str:
    """`export NAME='value'` lines; every value arrives as literal data."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def render_command(
    script: str | bytes, env: Mapping[str, str], secrets: Mapping[str, str] | None = None
) -> RenderedCommand:
    """Render a script with its environment; `secrets` are exported too but masked in `display`."""
    secrets = secrets or {}
    owned = sorted(BASH_OWNED_NAMES.intersection([*env, *secrets]))
    if owned:
        raise ValueError(f"bash sets {', '.join(owned)} itself: a step's var or secret cannot have that name")
    body = script.encode("utf-8") if isinstance(script, str) else script
    full_env = {**UNATTENDED_ENV, **env, **secrets}
    env_bytes = export_block(full_env).encode("utf-8")
    masked_env = {**UNATTENDED_ENV, **env, **dict.fromkeys(secrets, MASK)}
    argv = ("bash", "--noprofile", "--norc", "-c", WRAPPER, "runbook", str(len(env_bytes)), str(len(body)))
    display = (
        f"{shlex.join(argv[:3])} -c <wrapper sha256:{WRAPPER_SHA256[:16]}> runbook {len(env_bytes)} {len(body)}\n"
        f"{export_block(masked_env)}{body.decode('utf-8', 'replace')}"
    )
    return RenderedCommand(argv=argv, stdin=env_bytes + body + PAYLOAD_END, display=display, env=full_env)


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


_REFERENCE = re.compile(r"\$\{?[#!]?([A-Za-z_][A-Za-z0-9_]*)")


def var_names(text: str) -> list[str]:
    """The names a text refers to: `$name`, and `${name}` in any of bash's forms (`${name:-x}`, `${#name}`)."""
    return _REFERENCE.findall(text)


def with_vars(text: str, variables: Mapping[str, str]) -> str:
    """`text` with the `$name`/`${name}` it holds replaced by their values, those not in `variables` kept:
    how the readable plan shows a path (the host expands it so; `executor.render.host_word`)."""
    return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), text)


def pasted_word(text: str, variables: Mapping[str, str], expands: bool = True) -> str:
    """One word of a command as a person would paste it into a shell on the host (the readable plan): with
    `expands`, the vars it names replaced by their values where known (`$name` kept where not) and a
    leading `~/` left unquoted so that it still expands; every other character quoted as needed."""
    if not expands:
        return shlex.quote(text)
    value = with_vars(text, variables)
    home, rest = ("~/", value[2:]) if value.startswith("~/") else ("", value)
    return home + (shlex.quote(rest) if rest else "")


def host_word(text: str) -> str:
    """`text` as one bash word in which only `~` (leading) and `$name`/`${name}` expand.

    A var that is unset or empty stops the script, naming it, rather than turning
    `$models_dir/Kimi-K2.6` into `/Kimi-K2.6`.
    """
    parts, pos = [], 0
    if text == "~" or text.startswith("~/"):
        parts.append('"${HOME:?is not set}"')
        pos = 1
    for match in _VAR.finditer(text, pos):
        if match.start() > pos:
            parts.append(shlex.quote(text[pos : match.start()]))
        name = match.group(1) or match.group(2)
        parts.append(f'"${{{name}:?runbook var {name} is unset or empty}}"')
        pos = match.end()
    if pos < len(text) or not parts:
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts)


def heredoc(body: str, command: str = "cat", delimiter: str | None = None) -> str:
    """`command <<'DELIM'` + body + DELIM, with a random delimiter absent from the body.

    The quoted delimiter turns off every expansion, so the body arrives as written; a
    heredoc always ends in a newline, so one is added where the body lacks it. A fixed `delimiter`
    makes the same body the same script every time (`runbook plan`), for a body that never holds it
    (base64, one line of JSON); should it hold it after all, a random one is taken. Only a line that is
    the delimiter ends the heredoc, so only such a line rules one out.
    """
    lines = body.split("\n")
    while delimiter is None or delimiter in lines:
        delimiter = f"RUNBOOK_EOF_{_random.token_hex(8)}"
    if not body.endswith("\n"):
        body += "\n"
    return f"{command} <<'{delimiter}'\n{body}{delimiter}\n"
