"""`runbook mcp`: the Model Context Protocol server over stdio, for agents and editors.

Built on the official `mcp` SDK (the optional extra `runbook[mcp]`), its tools give the CLI's answers as
structured JSON: `validate` and `plan` read a runbook as `runbook validate` and `plan` do; `run` and
`resume` start `python -m executor.faces.cli run ... --json` in its own session and return once its first event
(`run_started`) says which run it is, never waiting for the run itself; `events` reads the run folder's
events.jsonl by `seq`; `status` and `runs` return what executor.faces.views gives `--json`, `report` its summary
of a report (or one of its sections, or with `format: csv` its tidy rows, page by page); `tail` a step's output
from the audit log; `stop` interrupts
a run as Ctrl-C would (SIGINT to the process holding its lock, once its lock's record proves that process is the
one that took it). Every result is capped (`RESULT_CAP`
bytes, its text block too: a long list is cut, saying so, how much was left out and which file holds it whole)
and holds only what the run stored, redacted as the console shows it; secrets come from the server's own
environment, as the CLI reads them, never from a tool's arguments. Every path a tool is given (a runbook, an
inventory, a `log_dir`, a `run_dir`, a run's folder) must resolve under the server's roots (`Roots`), and any
failure, a crash included, is an `ok: false` result (`RunbookServer.call_tool`), never a protocol error.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlparse

from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, ListRootsResult, TextContent
from pydantic import Field, ValidationError

from executor import strict_json
from executor.documents import Table
from executor.errors import ArgumentRefused, InvalidRunbook, Problem, RunbookError, StateError
from executor.faces import views
from executor.faces.campaign_overlay import laid_under
from executor.faces.inputs import COMPARE_THRESHOLD_MAX_PCT, COMPARE_THRESHOLD_PCT, load_checked
from executor.files import LOG_DIR, json_data, lines_within, open_run_file, refusal
from executor.run.audit import AUDIT_FILE, read_records
from executor.run.events import EVENTS_FILE
from executor.run.state import STATE_FILE, LockRecord, RunLock, process_start
from executor.runbook.loader import not_a_runbook
from executor.runbook.planner import CampaignVar, host_fields, plan_document, secrets_redactor

#: The most bytes of JSON one tool result holds: a long list in it is cut to fit (`truncated`, `left_out`).
RESULT_CAP = 64 * 1024
#: How long `run` waits for the run's first event before answering without it.
START_TIMEOUT_S = 60.0
#: `events` returns at most this many events per call (fewer when the cap cuts them).
EVENTS_LIMIT = 500
#: The largest `since_seq` taken (no run has this many events; one of 5000 digits could not be written back).
MAX_SEQ = 2**63 - 1
#: The longest line of events.jsonl read as an event (one is a few KiB): a longer one is read past, unparsed.
EVENT_MAX_BYTES = 16 << 20
#: The most bytes of JSON an error's message takes (one that quotes a huge argument back is cut to it).
ERROR_CAP = 4096
#: `tail` returns at most this many lines of each stream (and never more than its share of the cap).
TAIL_LINES = 200


def capped(result: dict[str, Any], key: str, cap: int = RESULT_CAP, whole: Path | None = None) -> dict[str, Any]:
    """`result` whose JSON fits in `cap` bytes: the list at `key` cut from its end as far as needed, with
    `truncated: true`, `left_out` (how many items were cut) and `whole` (the file that holds it all, when
    there is one). A result that does not fit even without the list says so instead of being sent."""
    items = result.get(key)
    if _size(result) <= cap:
        return result
    if whole is not None:
        result = result | {"whole": str(whole)}
    if not isinstance(items, list):
        return _over_cap(f"the result ({_size(result)} bytes) is over the cap of {cap} bytes", whole)
    kept = _most(
        len(items), lambda n: _size(result | {key: items[:n], "truncated": True, "left_out": len(items) - n}) <= cap
    )
    cut = result | {key: items[:kept], "truncated": True, "left_out": len(items) - kept}
    if _size(cut) > cap:
        return _over_cap(f"the result is over the cap of {cap} bytes even without its {key}", whole)
    return cut


def _over_cap(said: str, whole: Path | None) -> dict[str, Any]:
    """A result that cannot be cut to fit, as a failure (the CLI's `--json` prints it whole, from `whole`)."""
    return {"ok": False, "exit_code": 1, "truncated": True, "error": said} | ({"whole": str(whole)} if whole else {})


def capped_status(view: dict[str, Any], cap: int = RESULT_CAP, whole: Path | None = None) -> dict[str, Any]:
    """A status that fits in `cap` bytes: the largest facts left out first (`facts: null`, named in
    `facts_left_out` as STEP@HOST; `runbook status --json` has them, from `whole`), then steps cut from the end."""
    if _size(view) <= cap:
        return view
    steps = [dict(step) for step in view["steps"]]
    result = view | {"steps": steps, "truncated": True, "facts_left_out": []}
    result |= {"whole": str(whole)} if whole is not None else {}
    for step in sorted(steps, key=lambda step: _size(step["facts"]), reverse=True):
        if _size(result) <= cap or step["facts"] is None:
            break
        step["facts"] = None
        result["facts_left_out"].append(f"{step['step']}@{step['host']}")
    return capped(result, "steps", cap, whole)


def capped_plan(document: dict[str, Any], cap: int = RESULT_CAP) -> dict[str, Any]:
    """A plan that fits in `cap` bytes: its matrix groups' long parts (cells, instances, servers, the header's
    lines) cut to their first items, as few as needed for the groups to take at most half of it (each cut one
    says how many it left out in `KEY_left_out`; `runbook plan --json` has them all), then steps cut from the
    end. A 10 000-cell grid's cells alone are far over the cap."""
    if _size(document) <= cap:
        return document
    groups = document["groups"]

    def first(count: int) -> dict[str, Any]:
        return document | {"groups": [_first_items(group, count) for group in groups], "truncated": True}

    longest = max((len(group[key]) for group in groups for key in GROUP_PARTS), default=0)
    return capped(first(_most(longest, lambda n: _size(first(n)["groups"]) <= cap // 2)), "steps", cap)


def capped_summary(summary: dict[str, Any], whole: Path, cap: int = RESULT_CAP) -> dict[str, Any]:
    """A report's summary (views.report_summary) that fits in `cap` bytes, saying the cap (`cap`): a campaign's
    best configurations cut to half of it first (`best_left_out`: its section "Best configuration per
    concurrency" has them all), then the sections listed (`sections_left_out`; report.json, `whole`, has them)."""
    result = summary | {"cap": cap}
    if _size(result) <= cap:
        return result
    if "best" in result:
        result = _cut(result, "best", lambda cut: _size(cut["best"]) <= cap // 2)
    result = _texts_cut(result, cap // 4) if _size(result) > cap else result
    result = _cut(result | {"truncated": True, "whole": str(whole)}, "sections", lambda cut: _size(cut) <= cap)
    return result if _size(result) <= cap else _over_cap(f"the report's summary is over the cap of {cap} bytes", whole)


def _texts_cut(summary: dict[str, Any], budget: int) -> dict[str, Any]:
    """`summary` with each note and each failed cell's reason (a remote's error text, of any length) cut to its
    share of `budget` bytes, saying so (`texts_cut`): twenty long reasons would otherwise refuse the summary."""
    verdicts = summary.get("verdicts", {})
    failed = verdicts.get("failed", [])
    share = budget // max(1, len(summary["notes"]) + len(failed))
    notes = [_within(note, share) for note in summary["notes"]]
    failed = [each | {"reason": _within(each["reason"], share)} for each in failed]
    cut = summary | {"notes": notes, "texts_cut": True}
    return cut | {"verdicts": verdicts | {"failed": failed}} if failed else cut


def capped_section(table: Table, offset: int, whole: Path, cap: int = RESULT_CAP) -> dict[str, Any]:
    """The rows of a report's table from `offset`, as many as fit in `cap` bytes: `next_offset` is where the next
    page starts (null after the last row), `rows_total` how many it has. A row over the cap alone comes with
    each cell cut to its share (`cells_cut`), so that paging always moves on."""
    head = {"ok": True, "section": table.title, "columns": table.columns, "rows_total": len(table.rows)}
    head |= {"offset": offset, "cap": cap, "whole": str(whole)}
    rows = table.rows[offset:]

    def page(count: int, cut: list[list[str]] | None = None) -> dict[str, Any]:
        following = offset + count if offset + count < len(table.rows) else None
        return head | {"rows": cut or rows[:count], "next_offset": following, "truncated": following is not None}

    kept = _most(len(rows), lambda count: _size(page(count)) <= cap)
    if kept or not rows:
        return page(kept)
    share = (cap - _size(page(0))) // (2 * max(1, len(rows[0])))
    return page(1, [[_within(cell, share) for cell in rows[0]]]) | {"cells_cut": True}


def capped_rows(run_dir: Path, section: str | None, offset: int, cap: int = RESULT_CAP) -> dict[str, Any]:
    """`runbook report --format csv`'s rows of the run's report (executor/faces/report_csv.py), its cells as the
    csv has them, paged as a section is (`capped_section`); refused with a section, which is another table."""
    from executor.faces import report_csv  # the report's models: only for the rows

    if section is not None:
        raise ArgumentRefused(f"report: section {section!r} or format csv, not both")
    table = report_csv.tidy_table(views.read_report(run_dir)[0], run_dir)
    return capped_section(table, offset, run_dir / views.REPORT_FILE, cap)


def _cut(result: dict[str, Any], key: str, fits: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """`result` with its list at `key` cut from its end until `fits` holds, saying how many items it left out
    (`KEY_left_out`)."""
    items = result[key]

    def first(count: int) -> dict[str, Any]:
        return result | {key: items[:count], f"{key}_left_out": len(items) - count}

    return first(_most(len(items), lambda count: fits(first(count))))


#: The parts of a plan's matrix group that grow with its cells.
GROUP_PARTS = ("cells", "instances", "servers", "header")


def _first_items(group: dict[str, Any], count: int) -> dict[str, Any]:
    """`group` with each of its GROUP_PARTS longer than `count` cut to its first `count` items."""
    cut = dict(group)
    for key in GROUP_PARTS:
        items = group[key]
        if len(items) > count:
            cut[key] = dict(list(items.items())[:count]) if isinstance(items, dict) else items[:count]
            cut[f"{key}_left_out"] = len(items) - count + group.get(f"{key}_left_out", 0)  # plan_document's too
    return cut


def _size(value: Any) -> int:
    return len(json.dumps(value, default=str).encode("utf-8"))


def _failure(exc: RunbookError) -> dict[str, Any]:
    """An error as a result: what the CLI prints for it and the exit code it would exit with (its start, where
    it quotes a huge argument back: `no run RUN_ID`)."""
    if isinstance(exc, InvalidRunbook):
        return {"ok": False, "exit_code": exc.exit_code, "problems": _problems(exc.problems)}
    return {"ok": False, "exit_code": exc.exit_code, "error": _within(str(exc), ERROR_CAP)}


def _problems(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Problems (or warnings) as an answer holds them: file, line, column, message."""
    return [{"file": p.file, "line": p.line, "column": p.column, "message": p.message} for p in problems]


def _pairs(variables: Mapping[str, str] | None) -> list[str]:
    return [f"{name}={value}" for name, value in (variables or {}).items()]


class Launches:
    """The runs this server started: each a `python -m executor.faces.cli run --json` in its own session (so an
    agent's interrupt never reaches it, and it outlives the server), stdin at EOF, stdout and stderr in
    files of a folder of the server's own (`/tmp/runbook-mcp-*`, made at the first run). Children that ended
    are reaped at every call, and their files removed unless the run said something on stderr, which stays
    for a reader until the server exits (`close`): then the folder goes, whatever still runs."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.children: dict[subprocess.Popen[bytes], Path] = {}  # each run's process -> its stderr file

    def reap(self) -> None:
        for child, err_path in list(self.children.items()):
            if child.poll() is not None:
                del self.children[child]
                with contextlib.suppress(FileNotFoundError):
                    if err_path.stat().st_size == 0:  # nothing said: nothing to keep
                        err_path.unlink()

    def close(self) -> None:
        """Remove the folder and everything in it (a run still going on keeps writing to its open files)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    async def start(self, argv: list[str]) -> dict[str, Any]:
        """Start the run and wait for its `run_started` only: {run_id, run_dir, pid}; a run that ends before
        it (a bad runbook, a locked run) gives its exit code and what it printed."""
        self.reap()
        if any("\0" in arg for arg in argv):  # the CLI refuses a var holding one, but it cannot even get there
            return {
                "ok": False,
                "exit_code": 2,
                "error": "an argument (a var, a path) holds a NUL byte, which no command line can carry",
            }
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="runbook-mcp-"))
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{len(os.listdir(self.folder))}"
        out_path, err_path = self.folder / f"{stamp}.jsonl", self.folder / f"{stamp}.stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            try:
                child = subprocess.Popen(
                    [sys.executable, "-m", "executor.faces.cli", "run", "--json", *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    # its messages are an agent's, whole lines: no terminal width of the server's starter (COLUMNS)
                    env={name: value for name, value in os.environ.items() if name != "COLUMNS"},
                )
            except OSError as exc:  # E2BIG: the arguments are the caller's, not the server's failure
                if exc.errno != errno.E2BIG:
                    raise
                out_path.unlink()
                err_path.unlink()
                return {
                    "ok": False,
                    "exit_code": 2,
                    "error": f"the arguments are too long for a command line: {exc.strerror}",
                }
        self.children[child] = err_path
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            first = out_path.read_bytes().partition(b"\n")
            if first[1]:
                event = json.loads(first[0])
                out_path.unlink()  # the same lines are in the run folder's events.jsonl
                return {
                    "ok": True,
                    "run_id": event["run_id"],
                    "run_dir": event["run_dir"],
                    "pid": child.pid,
                    "stderr": str(err_path),
                    "carried": event.get("carried"),  # a resume's --var and --inventory of the run it continues
                }
            if child.poll() is not None:
                said = err_path.read_text(encoding="utf-8", errors="replace").splitlines()
                del self.children[child]
                out_path.unlink()
                err_path.unlink()  # what it said is in this answer
                return capped({"ok": False, "exit_code": child.returncode, "messages": said}, "messages")
            await asyncio.sleep(0.05)
        return {"ok": False, "pid": child.pid, "error": f"no run_started within {START_TIMEOUT_S:.0f}s"}


class Roots:
    """The folders the tools read and write under: the server's own (its working folder, and each `runbook mcp
    --root DIR`) and the client's (its MCP roots, `file://` ones only, asked at each call when it declares
    the capability: `ClientRoots`). A path is inside when it resolves, symlinks followed, to one or below."""

    def __init__(self, folders: Sequence[Path]) -> None:
        self.server = [folder.resolve() for folder in folders]
        self.client: list[Path] = []  # the client's, for one call (`with_client`)

    def inside(self, argument: str, what: str) -> Path:
        """`argument` as a path, or ArgumentRefused (exit 2) when it resolves outside every root."""
        try:
            resolved = Path(argument).resolve()
        except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a symlink loop
            raise ArgumentRefused(f"{what} {_within(argument, 200)!r}: not a usable path ({exc})") from None
        if any(resolved.is_relative_to(root) for root in (*self.server, *self.client)):
            return Path(argument)
        roots = ", ".join(str(root) for root in (*self.server, *self.client))
        raise ArgumentRefused(
            f"{what} {_within(argument, 200)!r} is outside the server's roots ({_within(roots, 1000)}; "
            "`runbook mcp --root DIR` adds one): refused"
        )

    def with_client(self, listed: ListRootsResult | None) -> Roots:
        """These roots and the client's `file://` ones of this host (others, such as `https://` or
        `file://elsewhere/`, name no folder here, and neither does a path no folder can have, holding a NUL)."""
        joined = Roots(self.server)
        uris = [urlparse(str(root.uri)) for root in (listed.roots if listed else [])]
        here = [unquote(uri.path) for uri in uris if uri.scheme == "file" and uri.netloc in ("", "localhost")]
        joined.client = [folder for path in here if path and (folder := _resolved(path)) is not None]
        return joined


def _resolved(path: str) -> Path | None:
    """`path` with its links and `..` resolved; None when it cannot be (a NUL byte in it, a symlink loop)."""
    try:
        return Path(path).resolve()
    except (OSError, ValueError, RuntimeError):
        return None


def ask_client_roots(context: Context[Any, Any]) -> ListRoots | None:
    """The client's roots, asked (`roots/list`, the SDK carrying it as the protocol version wants) when the
    client declares the capability; None otherwise, and for a call made in-process, outside any request."""
    try:
        capabilities = context.client_capabilities
    except ValueError:  # no request: called in-process
        return None
    return ListRoots() if capabilities is not None and capabilities.roots is not None else None


#: A tool's parameter filled with the client's roots by the SDK (never an argument of the caller).
ClientRoots = Annotated[ListRootsResult | None, Resolve(ask_client_roots)]


def _run_dir(roots: Roots, log_dir: str, run_id: str | None) -> Path:
    """The folder of the run `run_id` names (a whole id or a unique prefix; the latest when None), the log
    folder and the run's folder both under the roots."""
    folder = roots.inside(log_dir, "log_dir") / views.latest(Path(log_dir), run_id).run_id
    return roots.inside(str(folder), "run folder")


#: A concurrency band of a campaign's schedule: the band holding this concurrency.
Band = Annotated[int, Field(ge=1, le=1 << 20)] | None


def campaign_folder(
    roots: Roots, log_dir: str, campaign: str | None, campaign_dir: str | None, band: int | None
) -> Path | None:
    """The run folder of the campaign a tool's answer is laid over (`campaign`: a run id under `log_dir`;
    `campaign_dir`: a run folder), under the roots; None when neither is given (a band alone is refused)."""
    if campaign is not None and campaign_dir is not None:
        raise ArgumentRefused("give campaign (a run id under log_dir) or campaign_dir (its run folder), not both")
    if campaign_dir is not None:
        return roots.inside(campaign_dir, "campaign_dir")
    if campaign is not None:
        return _run_dir(roots, log_dir, campaign)
    if band is not None:
        raise ArgumentRefused("band names a band of a campaign's schedule: give campaign or campaign_dir too")
    return None


def runbook_files(roots: Roots, file: str, inventory: str | None) -> tuple[Path, Path | None]:
    """The runbook and inventory arguments as paths, each under the roots and shaped as what it should be:
    ArgumentRefused in one line that quotes none of a file that is not (a copied /etc/passwd, a binary)."""
    path = roots.inside(file, "file")
    inventory_path = roots.inside(inventory, "inventory") if inventory else None
    for given, is_inventory in ((path, False), (inventory_path, True)):
        why = not_a_runbook(given, is_inventory) if given is not None else None
        if why:
            raise ArgumentRefused(why)
    return path, inventory_path


def read_events(run_dir: Path, since_seq: int, limit: int) -> dict[str, Any]:
    """The events of a run with `seq` > `since_seq`, at most `limit`; `finished` once its `run_finished`
    is among those returned, `running` while a process holds the run's lock."""
    path = run_dir / EVENTS_FILE
    events: list[dict[str, Any]] = []
    if os.path.lexists(path):
        with _run_file(path) as handle:
            # line N holds seq N (seqs count from 1 without gaps, in order): the lines before since_seq are
            # skipped unparsed, so following a long run by polling costs its new lines, not all of them again
            for number, (line, too_long) in enumerate(lines_within(handle, EVENT_MAX_BYTES), start=1):
                if not line.endswith(b"\n"):  # being written: it comes whole at the next call
                    break
                if number > since_seq:
                    events.append(_event_within(_event(line, number, too_long), RESULT_CAP // 2, number))
                if len(events) >= limit:
                    break
    result = capped({"run_id": run_dir.name, "events": events}, "events", whole=path)
    returned = result.get("events", [])
    # counted in lines, not taken from the last event's seq: a line's content never holds a follower back
    result["next_seq"] = max(since_seq, 0) + len(returned) if returned else since_seq
    result["finished"] = any(event.get("event") == "run_finished" for event in returned)
    result["running"] = RunLock(run_dir).held()
    return result


def _event(line: bytes, number: int, too_long: bool) -> dict[str, Any]:
    """The event on line `number` of events.jsonl, or one saying why that line holds none (`unreadable`:
    longer than EVENT_MAX_BYTES, or no JSON object, a hand edit or a damaged disk), so that `next_seq`
    moves past it rather than every later call failing on it."""
    why = f"longer than {EVENT_MAX_BYTES >> 20} MiB (the limit of an event)" if too_long else None
    if why is None:
        try:
            event = json_data(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            return event
        why = "not a JSON object"
    return {"seq": number, "event": "unreadable", "error": f"{EVENTS_FILE} line {number}: {why}"}


def _run_file(path: Path) -> Any:
    """A run folder's file opened as every reader opens one (executor.files.open_run_file); StateError naming
    it when it is a FIFO, a socket, a device or a symlink."""
    try:
        return open_run_file(path)
    except OSError as exc:
        raise StateError(f"{path} is unreadable ({refusal(exc)})", reason=f"{path.name}: {refusal(exc)}") from None


def _event_within(event: dict[str, Any], budget: int, number: int) -> dict[str, Any]:
    """`event` (line `number`), or where its JSON is over `budget` bytes (a run_started listing a thousand
    steps) its scalars alone, each text cut to its share, with `truncated` and the fields left out
    (`fields_left_out`; the run's events.jsonl has it whole), or where even that is over (20 000 keys) its seq
    and kind alone: cut from a list as a whole, it would stop a follower at its `seq` for good."""
    if _size(event) <= budget:
        return event
    left_out = [name for name, value in event.items() if isinstance(value, list | dict)]
    kept = {name: value for name, value in event.items() if name not in left_out}
    share = budget // (2 * max(1, sum(isinstance(value, str) for value in kept.values())))
    kept = {name: _within(value, share) if isinstance(value, str) else value for name, value in kept.items()}
    cut = kept | {"truncated": True, "fields_left_out": left_out}
    if _size(cut) <= budget:
        return cut
    said = f"{EVENTS_FILE} line {number}: over {budget} bytes even with its scalars alone (the file has it whole)"
    return {"seq": number, "event": _within(str(event.get("event")), 200), "truncated": True, "error": said}


def step_tail(run_dir: Path, step: str, host: str | None, lines: int) -> dict[str, Any]:
    """The last `lines` lines of stdout and stderr of the latest command of `step` (on `host`, or on any)
    in the run's audit log, as stored (redacted, long output clipped in its middle)."""
    last: dict[str, Any] | None = None
    for _, record, _ in read_records(run_dir):
        same_host = record is not None and (host is None or record.get("host") == host)
        if record and same_host and record.get("event") == "command" and record.get("step") == step:
            last = record
    if last is None:
        said = (
            f"no command of step {step!r}{f' on {host}' if host else ''} in run {run_dir.name}'s audit log "
            "(not run yet, still running its first command, or reused from an earlier run: see status)"
        )
        return {"ok": False, "error": _within(said, ERROR_CAP)}
    share = RESULT_CAP // 3  # each stream's share of the cap
    result: dict[str, Any] = {
        "ok": True,
        "step": step,
        "host": last.get("host"),
        "attempt": last.get("attempt"),
        "exit_code": last.get("exit_code"),
        "timed_out": last.get("timed_out"),
        "whole": str(run_dir / AUDIT_FILE),
    }
    for name in ("stdout", "stderr"):
        kept = str(last.get(name) or "").splitlines()[-lines:]
        text = "\n".join(kept)
        result[name] = _within(text, share, end=True)
        result[f"{name}_truncated"] = bool(last.get(f"{name}_truncated")) or len(result[name]) < len(text)
    return result


def _within(text: str, budget: int, end: bool = False) -> str:
    """The longest start (with `end`: end) of `text` whose JSON string takes at most `budget` bytes: measured,
    not counted in characters, since a control character (binary output, a terminal's escapes) takes six."""
    count = _most(len(text), lambda n: _size(text[len(text) - n :] if end else text[:n]) <= budget)
    return text[len(text) - count :] if end else text[:count]


def _most(high: int, fits: Callable[[int], bool]) -> int:
    """The largest n from 0 to `high` for which `fits(n)` holds (0 when none does), `fits` true up to some n
    and false past it: a binary search, since each test measures a result's JSON."""
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def stop_run(run_dir: Path) -> dict[str, Any]:
    """SIGINT to the process holding the run's lock, as Ctrl-C: it kills its steps' remote sessions,
    records them interrupted and exits 130. Refused for a run no process holds, and for a pid not proven to
    be the process that took the lock (`not_the_holder`): a pid is reused once its process ends."""
    lock = RunLock(run_dir)
    if not lock.held():
        return {"ok": False, "exit_code": 2, "error": f"run {run_dir.name} is not running"}
    holder = lock.holder()
    if holder is None:
        no_record = "its lock holds no record of the process that took it (an older runbook's, or damaged)"
        return {"ok": False, "exit_code": 2, "error": f"run {run_dir.name}: not signalled: {no_record}"}
    try:
        # the process pinned before it is checked: were the pid reused after the check, the signal goes nowhere
        pidfd = os.pidfd_open(holder.pid)
    except (OSError, OverflowError) as exc:
        return {"ok": False, "exit_code": 2, "error": f"run {run_dir.name}: not signalled: process {holder.pid}: {exc}"}
    try:
        why = not_the_holder(holder, lock)
        if why:
            return {"ok": False, "exit_code": 2, "error": f"run {run_dir.name}: not signalled: {why}"}
        signal.pidfd_send_signal(pidfd, signal.SIGINT)
    except OSError as exc:
        return {"ok": False, "exit_code": 1, "error": f"could not signal the process of run {run_dir.name}: {exc}"}
    finally:
        os.close(pidfd)
    return {"ok": True, "run_id": run_dir.name, "pid": holder.pid, "signal": "SIGINT"}


def not_the_holder(holder: LockRecord, lock: RunLock) -> str | None:
    """Why the lock's record does not prove its pid is this run's `runbook` process now, or None: the record
    names this run, the pid's process started when the one that took the lock did (/proc/PID/stat), and the
    kernel lists that process as the lock's holder (a record is only what someone wrote in the file)."""
    if holder.run_id != lock.path.parent.name:
        return f"its lock was taken for run {_within(holder.run_id, 200)!r}"
    started = process_start(holder.pid)
    if holder.started is None or started != holder.started:
        return (
            f"process {holder.pid} is not the one that took its lock (it started at tick {started}, the lock's "
            f"at {holder.started}): its pid was reused"
        )
    if not lock.taken_by(holder.pid):
        return f"process {holder.pid} holds no lock on {lock.path.name} (the kernel's /proc/locks): its record is false"
    return None


class RunbookServer(MCPServer):
    """The SDK's server, every tool call's answer made here: the result (its structured content, and its text
    block as the same compact JSON, not the SDK's indented copy, half as large again) within RESULT_CAP, and
    any failure, a RunbookError, arguments that do not validate and a crash alike, an `ok: false` result
    rather than the SDK's error text or a protocol error."""

    def __init__(self) -> None:
        super().__init__("runbook", instructions=__doc__)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        context = context or Context(mcp_server=self, subscriptions=self._subscriptions)
        try:
            # the tool's value itself (as MCPServer.call_tool runs it, without its conversion, which fails on
            # text that JSON cannot carry, a lone surrogate: `answer` makes it JSON first)
            result = await self._tool_manager.call_tool(name, arguments, context)
            return answer(result) if isinstance(result, dict) else result
        except Exception as exc:  # the SDK wraps a tool's exception; its cause says what it was
            return answer(_refusal(name, exc))


def as_json(value: dict[str, Any]) -> dict[str, Any]:
    """`value` as strict JSON can hold it: a lone surrogate in a text (json.loads gives one for `"\\ud800"` in
    what a remote printed) as U+FFFD, NaN and Infinity by their names (`strict_json`, as every other answer
    writes them), any other value as its text."""
    text = strict_json.dumps(value, default=str, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return dict(json.loads(text.decode("utf-8", "replace")))


def answer(result: dict[str, Any]) -> CallToolResult:
    """A tool's result as sent: structured content and one text block of the same JSON, each within the cap
    (a result the tool did not cut to fit is replaced by one saying so), as JSON can hold it (`as_json`)."""
    result = as_json(result)
    if _size(result) > RESULT_CAP:
        result = _over_cap(f"the result is over {RESULT_CAP} bytes", None)
    return CallToolResult(
        content=[TextContent(type="text", text=strict_json.dumps(result, default=str))], structured_content=result
    )


def _refusal(tool: str, exc: Exception) -> dict[str, Any]:
    """An exception from a tool call as a result: a RunbookError as the CLI says it; arguments that do not
    validate by their names (never their values); anything else by its type and message, one line, cut."""
    cause = exc.__cause__ if isinstance(exc, ToolError) and exc.__cause__ is not None else exc
    if isinstance(cause, ToolError):  # the SDK's own refusal of the call (an unknown tool): a bad argument
        return {"ok": False, "exit_code": 2, "error": _within(str(cause), ERROR_CAP)}
    if isinstance(cause, RunbookError):
        return capped(_failure(cause), "problems")
    if isinstance(cause, ValidationError):
        names = sorted({".".join(map(str, error["loc"])) or "arguments" for error in cause.errors()})
        return {"ok": False, "exit_code": 2, "error": f"{tool}: invalid arguments: {', '.join(names)}"}
    said = " ".join(str(cause).split())
    return {"ok": False, "exit_code": 1, "error": _within(f"{tool}: {type(cause).__name__}: {said}", ERROR_CAP)}


def build_server(launches: Launches, roots: Roots | None = None) -> RunbookServer:
    """The server with its tools; each returns a JSON object (a RunbookError it raises becomes an `ok: false`
    result: `RunbookServer.call_tool`). `launches` holds the runs it starts; `roots` the folders its tools
    may use (the working folder when None), with the client's roots of each call (`client_roots`)."""
    roots = roots or Roots([Path.cwd()])
    server = RunbookServer()
    _checking_tools(server, roots)
    _launching_tools(server, launches, roots)
    _reading_tools(server, launches, roots)
    _comparing_tools(server, roots)
    return server


def _checking_tools(server: RunbookServer, roots: Roots) -> None:
    """validate and plan: a runbook read, nothing run."""

    @server.tool()
    def validate(
        file: str, inventory: str | None = None, vars: dict[str, str] | None = None, client_roots: ClientRoots = None
    ) -> dict[str, Any]:
        """Check a runbook (with an inventory and var overrides): ok, with each host's fields and where each comes
        from (runbook, inventory or default), or its problems as file/line/column/message; `warnings` (same shape)
        point out what does not stop it (a script's `$NAME` that nothing defines)."""
        files = runbook_files(roots.with_client(client_roots), file, inventory)
        runbook, _ = load_checked(*files, _pairs(vars), os.environ)
        hosts = [host.model_dump(mode="json") for host in host_fields(runbook)]
        masked = secrets_redactor(runbook, os.environ).deep(hosts)
        answer = {"ok": True, "steps": len(runbook.steps), "problems": [], "warnings": _problems(runbook.warnings)}
        return capped({**answer, "hosts": masked}, "hosts")

    @server.tool()
    def plan(
        file: str,
        inventory: str | None = None,
        vars: dict[str, str] | None = None,
        campaign: str | None = None,
        campaign_dir: str | None = None,
        band: Band = None,
        log_dir: str = str(LOG_DIR),
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """What a run would do, per step and host; runs nothing. With a campaign (its run id under `log_dir`, or its
        run folder `campaign_dir`): its schedule's vars for the band holding concurrency `band` laid over the
        runbook (over the inventory, under `vars`), each with its source in `campaign`."""
        here = roots.with_client(client_roots)
        files = runbook_files(here, file, inventory)
        folder = campaign_folder(here, log_dir, campaign, campaign_dir, band)
        laid: list[CampaignVar] = []
        lay = None if folder is None else laid_under(folder, band, list(vars or {}), laid)
        runbook, overrides = load_checked(*files, _pairs(vars), os.environ, lay)
        redactor = secrets_redactor(runbook, os.environ)
        document = plan_document(runbook, overrides, redactor)
        return capped_plan(document | {"campaign": redactor.deep([each.model_dump() for each in laid])})


def _launching_tools(server: RunbookServer, launches: Launches, roots: Roots) -> None:
    """run and resume: a `runbook run` started in the background (`launches`)."""

    @server.tool()
    async def run(
        file: str,
        inventory: str | None = None,
        vars: dict[str, str] | None = None,
        log_dir: str = str(LOG_DIR),
        from_step: str | None = None,
        only: str | None = None,
        campaign: str | None = None,
        campaign_dir: str | None = None,
        band: Band = None,
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """Start a run in the background; returns its run_id, run_dir and pid at once (follow it with events,
        status). Secrets come from this server's environment. `campaign`, `campaign_dir`, `band`: as for plan."""
        here = roots.with_client(client_roots)
        runbook_files(here, file, inventory)
        here.inside(log_dir, "log_dir")
        folder = campaign_folder(here, log_dir, campaign, campaign_dir, band)
        laid = [f"--from-campaign={folder}"] if folder else []
        laid += [f"--band={band}"] if band is not None else []
        return await launches.start(_run_argv(file, inventory, vars, log_dir, *laid, from_step=from_step, only=only))

    @server.tool()
    async def resume(
        file: str,
        run_id: str | None = None,
        inventory: str | None = None,
        vars: dict[str, str] | None = None,
        log_dir: str = str(LOG_DIR),
        unset_vars: list[str] | None = None,
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """Continue a run (default: the latest of this runbook) in the background: what passed is reused. The
        run's --var and --inventory carry over (`carried` in the answer); `vars` override them, `unset_vars`
        drops carried --var values (the runbook's or inventory's apply again)."""
        here = roots.with_client(client_roots)
        runbook_files(here, file, inventory)
        here.inside(log_dir, "log_dir")
        resume = f"--resume={run_id}" if run_id else "--resume"
        unset = [f"--unset-var={name}" for name in unset_vars or []]
        return await launches.start(_run_argv(file, inventory, vars, log_dir, resume, *unset))


def _reading_tools(server: RunbookServer, launches: Launches, roots: Roots) -> None:
    """status, runs, events, tail, stop and report: what a run folder says (stop: and its process)."""

    @server.tool()
    def status(
        run_id: str | None = None, log_dir: str = str(LOG_DIR), client_roots: ClientRoots = None
    ) -> dict[str, Any]:
        """A run's steps (status, attempts, duration, failing gate and message, facts) and failed cells."""
        launches.reap()
        run_dir = _run_dir(roots.with_client(client_roots), log_dir, run_id)
        return capped_status(views.status(Path(log_dir), run_dir.name), whole=run_dir / STATE_FILE)

    @server.tool()
    def runs(log_dir: str = str(LOG_DIR), client_roots: ClientRoots = None) -> dict[str, Any]:
        """Recent runs, newest first: id, runbook, status, start, end, the run it resumed."""
        launches.reap()
        folder = roots.with_client(client_roots).inside(log_dir, "log_dir")
        return capped({"runs": views.runs(folder)}, "runs", whole=folder)

    @server.tool()
    def events(
        run_id: str,
        since_seq: Annotated[int, Field(le=MAX_SEQ)] = 0,
        limit: int = EVENTS_LIMIT,
        log_dir: str = str(LOG_DIR),
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """A run's events with seq > since_seq (as `run --json` prints them), next_seq to ask from next,
        finished once run_finished is among them, running while its process lives."""
        launches.reap()
        run_dir = _run_dir(roots.with_client(client_roots), log_dir, run_id)
        return read_events(run_dir, since_seq, max(1, min(limit, EVENTS_LIMIT)))

    @server.tool()
    def tail(
        run_id: str,
        step: str,
        host: str | None = None,
        lines: int = 50,
        log_dir: str = str(LOG_DIR),
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """The last lines of stdout and stderr of a step's latest command (from the run's audit log)."""
        run_dir = _run_dir(roots.with_client(client_roots), log_dir, run_id)
        return step_tail(run_dir, step, host, max(1, min(lines, TAIL_LINES)))

    @server.tool()
    def stop(run_id: str, log_dir: str = str(LOG_DIR), client_roots: ClientRoots = None) -> dict[str, Any]:
        """Interrupt a running run as Ctrl-C would; returns at once (it then ends interrupted, exit 130)."""
        return stop_run(_run_dir(roots.with_client(client_roots), log_dir, run_id))

    @server.tool()
    def report(
        run_id: str | None = None,
        log_dir: str = str(LOG_DIR),
        run_dir: str | None = None,
        section: str | None = None,
        offset: Annotated[int, Field(ge=0)] = 0,
        format: Literal["summary", "csv"] = "summary",
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """A run's report in short: headline, speedup (a benchmark's) or best configuration per concurrency (a
        campaign's), verdicts, its sections (tables) by name, figures, per-request records and the paths of the
        whole report. With `section` (a section's name, or its start): that table's rows from `offset`, as many
        as the cap holds (`next_offset` asks for the rest). With `format: csv`: `runbook report --format csv`'s
        rows (one per cell x workload x concurrency, with what its numbers are of), paged the same way. (No
        `json`: the summary is JSON, and report.json, megabytes for a campaign, is at `report_json`.) Refused
        without a complete provenance. The run is `run_id` under `log_dir` (the latest when no run_id), as for
        the other tools, or `run_dir`."""
        here = roots.with_client(client_roots)
        folder = here.inside(run_dir, "run_dir") if run_dir else _run_dir(here, log_dir, run_id)
        whole = folder / views.REPORT_FILE
        if format == "csv":
            return capped_rows(folder, section, offset)
        if section is None:
            return capped_summary(views.report_summary(folder), whole)
        return capped_section(views.report_table(folder, section), offset, whole)


def _comparing_tools(server: RunbookServer, roots: Roots) -> None:
    """`compare`: two runs' reports cell by cell (executor/faces/compare.py)."""

    @server.tool()
    def compare(
        run_a: str,
        run_b: str,
        log_dir: str = str(LOG_DIR),
        threshold: Annotated[float, Field(ge=0, le=COMPARE_THRESHOLD_MAX_PCT, allow_inf_nan=False)] = (
            COMPARE_THRESHOLD_PCT
        ),
        figure: str | None = None,
        client_roots: ClientRoots = None,
    ) -> dict[str, Any]:
        """`runbook compare RUN_A RUN_B --json`: the two runs' cells matched (cell, workload, concurrency), each
        metric's change in percent with its 95% interval from the repeats, the regressions (worse by more than
        `threshold` percent and beyond noise; `exit_code` 1 when any, as the CLI's) and the cells of one run only.
        Each run is a run id (or unique prefix) under `log_dir`, or a run folder (a path); `figure`: where to
        draw the figure (none without it). Within the cap: `cells` cut from the end, `regressions` whole."""
        here = roots.with_client(client_roots)
        first, second = _run_or_folder(here, log_dir, run_a, "run_a"), _run_or_folder(here, log_dir, run_b, "run_b")
        from executor.faces import compare as comparing  # the reports' models: only for a comparison

        comparison = comparing.compare(first, second, threshold)
        if figure is not None:
            from executor.faces.compare_figure import draw

            path = here.inside(figure, "figure")
            try:
                draw(comparison, path)
            except OSError as exc:
                raise ArgumentRefused(f"figure {_within(figure, 200)!r}: cannot be written ({refusal(exc)})") from None
            comparison.figure = str(path)
        answer = {"ok": True, "exit_code": comparing.EXIT_REGRESSED if comparison.regressed else 0}
        return capped(answer | comparison.model_dump(mode="json"), "cells")


def _run_or_folder(roots: Roots, log_dir: str, run: str, what: str) -> Path:
    """A run as `runbook compare` names it: a run folder given by its path (one holding a `/`, or a folder), or a
    run id (or unique prefix) under `log_dir`; either under the roots."""
    if os.sep in run or os.path.isdir(run):
        return roots.inside(run, what)
    return _run_dir(roots, log_dir, run)


def _run_argv(
    file: str,
    inventory: str | None,
    variables: Mapping[str, str] | None,
    log_dir: str,
    *options: str,
    from_step: str | None = None,
    only: str | None = None,
) -> list[str]:
    """`runbook run`'s arguments (after --json) for these tool arguments: each value joined to its option by
    `=` and the file after `--`, so that none is read as an option (`--help`, a folder named `-logs`)."""
    argv = [f"--log-dir={log_dir}", *options]
    argv += [f"--inventory={inventory}"] if inventory else []
    argv += [f"--var={pair}" for pair in _pairs(variables)]
    argv += [f"--from={from_step}"] if from_step else []
    argv += [f"--only={only}"] if only else []
    return [*argv, "--", file]


def serve(roots: Sequence[Path] = ()) -> None:
    """Serve over stdio until the client closes it (or SIGTERMs the server), then remove the runs' files;
    its tools use the working folder and `roots` (`runbook mcp --root DIR`)."""
    launches = Launches()
    signal.signal(signal.SIGTERM, _terminated)
    try:
        build_server(launches, Roots([Path.cwd(), *roots])).run("stdio")
    finally:
        launches.close()


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM ends the server as the end of its input does, its `finally` run (Python's default skips it)."""
    raise SystemExit(128 + signum)
