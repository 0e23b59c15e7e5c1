"""The `runbook` command line. The engine holds no CLI code; this module only parses
arguments, picks a reporter, maps outcomes to exit codes, and prints.

Exit codes: 0 success; 1 a step failed (or `audit verify` found tampering, or `compare` a regression); 2 invalid input
(runbook, arguments, nothing to resume, missing secret, a run folder that cannot be read or
made); 3 the run is locked by another process; 4 a write to the run folder failed (disk full,
I/O error, read-only, quota: the run stopped at once, `--resume` continues it once the disk is
fixed); 130 interrupted (SIGINT, SIGTERM, or SIGHUP unless started under nohup); 141 stdout was a
pipe that closed early (`runbook status | head`): the command stops quietly.
`audit verify` exits 1 for a cut or a seal the key does not prove too, and `audit` 2 for an audit
key that is missing or unusable (or, for `audit key`, already there).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import math
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from executor import strict_json
from executor.command_result import how_it_ended
from executor.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    DurableWriteError,
    InvalidRunbook,
    ResumeError,
    RunbookError,
    TransportError,
)
from executor.faces.inputs import COMPARE_THRESHOLD_MAX_PCT, COMPARE_THRESHOLD_PCT, load_checked
from executor.files import LOG_DIR
from executor.run import seal
from executor.run.state import NOT_STARTED, STOPPED, WRITE_FAILED, StepRecord, passed_before
from executor.runbook.campaign import EXIT_CELLS_FAILED
from executor.runbook.durations import format_duration
from executor.terminal import fitted, line_width, shown, shown_text

# The engine, the reporters, the loader and the audit log are imported by the commands that use them: `runbook status`
# must not pay for a run's modules (asyncssh, the step kinds) at every start (bench/startup.py); rich's
# console and tables likewise (`validate` prints plain text).
if TYPE_CHECKING:
    from _typeshed import SupportsWrite
    from rich.text import Text

    from executor import documents
    from executor.consoles import FittingConsole, PipedConsole, UnattendedConsole, Whole
    from executor.run.engine import Engine
    from executor.runbook.loader import Runbook
    from executor.runbook.planner import CampaignVar
    from executor.transport.ssh import OfferedKey

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a program whose reader went away

#: `runbook status` shows a message's first line up to this many characters; the whole one follows the table.
MESSAGE_CELL = 120
#: ... and a failing gate's first line up to this many (the whole gate follows the table too).
GATE_CELL = 60
#: A report table's column of this name holds commands: on a terminal they follow the table (`_print_report_table`).
COMMAND_COLUMN = "command"
#: `runbook demo --landscape`: sandbox.demo.LANDSCAPES' names (the sandbox is imported only when the demo runs)
DEMO_LANDSCAPES = ("h200", "headroom")
#: What `runbook report --format` prints: the tables, report.json, the tidy rows (executor/faces/report_csv.py).
REPORT_FORMATS = ("text", "json", "csv")


@functools.cache
def err() -> UnattendedConsole:
    """stderr's console, made on first use (rich's console is a good part of a plain command's start-up)."""
    from executor.consoles import UnattendedConsole

    return UnattendedConsole(stderr=True)


@functools.cache
def out() -> PipedConsole:
    """stdout's console, made on first use."""
    from executor.consoles import PipedConsole

    return PipedConsole()


class _Parser(argparse.ArgumentParser):
    """argparse, its usage errors shown as everything else is: `unrecognized arguments: ...` quotes argv
    as given, which a script may have built from a host's output (an ESC in it would reach the terminal)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        super()._print_message(shown(message), file)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="runbook", description="Run YAML runbooks on remote hosts, unattended.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a runbook; print FILE:LINE:COL: message per problem")
    p.add_argument("file", type=Path)
    p.add_argument("--inventory", type=Path, metavar="FILE", help="hosts and vars laid over the runbook")
    _add_run(sub)

    p = sub.add_parser("plan", help="what each step will do, in summary (--full: every command as sent); run nothing")
    p.add_argument("file", type=Path)
    p.add_argument("--var", action="append", default=[], metavar="K=V")
    p.add_argument("--inventory", type=Path, metavar="FILE")
    _add_campaign(p)
    p.add_argument("--log-dir", type=Path, default=LOG_DIR, help="where --from-campaign's run id is")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--full", action="store_true", help="every command exactly as it would run (long)")
    shape.add_argument("--json", action="store_true", help="the plan as one JSON document")

    for name, text in (("status", "steps of a run (default: the latest)"), ("runs", "recent runs")):
        p = sub.add_parser(name, help=text)
        if name == "status":
            p.add_argument("run_id", nargs="?")
        p.add_argument("--log-dir", type=Path, default=LOG_DIR)
        p.add_argument("--json", action="store_true")
    _add_demo(sub)

    p = sub.add_parser(
        "mcp", help="serve the Model Context Protocol over stdio (tools: validate, plan, run, status, events, ...)"
    )
    p.add_argument(
        "--root",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a folder the tools may use besides the working folder (repeatable); every path outside is refused",
    )

    p = sub.add_parser("report", help="print the tables of a run's report (report.json in the run folder)")
    p.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="a run id (or a unique prefix) under --log-dir, or a run folder; default: the latest run",
    )
    p.add_argument("--log-dir", type=Path, default=LOG_DIR)
    p.add_argument(
        "--format",
        choices=REPORT_FORMATS,
        help="text: the tables (default); json: report.json as it is; csv: a row per cell x workload x "
        "concurrency with what its numbers are of",
    )
    p.add_argument("--json", action="store_true", help="short for --format json")
    p.set_defaults(settle=functools.partial(_report_format, error=p.error))

    _add_compare(sub)

    p = sub.add_parser("schema", help="print the JSON Schema of the runbook format (for editors to complete and check)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--inventory", action="store_true", help="the inventory file's schema instead")
    which.add_argument(
        "--report", action="store_true", help="report.json's schema instead (a benchmark's, a campaign's)"
    )
    which.add_argument("--plan", action="store_true", help="the plan document's schema instead (plan --json)")
    which.add_argument("--compare", action="store_true", help="the comparison's schema instead (compare --json)")
    _add_audit(sub)
    _add_trust_host(sub)
    return parser


def _add_compare(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`runbook compare RUN_A RUN_B`: each metric's change with its interval, regressions flagged (exit 1)."""
    p = sub.add_parser(
        "compare",
        help="compare two runs' reports cell by cell: each metric's change with its 95%% interval from the repeats; "
        "exit 1 when one regressed beyond --threshold and beyond noise",
    )
    for name in ("run_a", "run_b"):
        p.add_argument(name, metavar=name.upper(), help="a run id (or unique prefix) under --log-dir, or a run folder")
    p.add_argument("--log-dir", type=Path, default=LOG_DIR)
    p.add_argument(
        "--threshold",
        type=_threshold,
        default=COMPARE_THRESHOLD_PCT,
        metavar="PCT",
        help=f"a regression is worse by more than PCT percent, beyond noise (default {COMPARE_THRESHOLD_PCT:g})",
    )
    p.add_argument("--json", action="store_true", help="the comparison as one JSON document (runbook schema --compare)")
    drawn = p.add_mutually_exclusive_group()
    drawn.add_argument(
        "--figure",
        type=Path,
        metavar="PATH",
        help="where the figure goes (default: beside the second run's folder, compare-A-vs-B.png)",
    )
    drawn.add_argument("--no-figure", action="store_true", help="draw no figure")


def _threshold(text: str) -> float:
    """--threshold: a percentage from 0 to COMPARE_THRESHOLD_MAX_PCT (`5`, `2.5`, `5%`)."""
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        value = math.nan
    if not 0 <= value <= COMPARE_THRESHOLD_MAX_PCT:  # NaN fails both
        raise argparse.ArgumentTypeError(f"{text[:100]!r}: a percentage from 0 to {COMPARE_THRESHOLD_MAX_PCT:g}")
    return value


def _add_run(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`runbook run`: the runbook, its overrides, where its run goes, and where it starts."""
    p = sub.add_parser(
        "run",
        help="run a runbook",
        # written out (FILE may follow --resume), so argparse does not wrap it: two lines that fit 100 columns
        usage="%(prog)s FILE [--var K=V] [--unset-var NAME] [--inventory FILE] [--log-dir DIR]\n"
        "                   [--json] [-v] [--resume [RUN_ID]] [--from STEP | --only STEP]",
    )
    # optional to argparse only: `--resume FILE` gives FILE to --resume, and `_runbook_of_run` puts it back
    p.add_argument("file", type=Path, nargs="?", metavar="FILE")
    p.set_defaults(settle=functools.partial(_runbook_of_run, error=p.error))
    p.add_argument("--var", action="append", default=[], metavar="K=V", help="override a var (repeatable)")
    p.add_argument(
        "--unset-var",
        action="append",
        default=[],
        metavar="NAME",
        help="with --resume: do not carry the resumed run's --var NAME over (the runbook's or inventory's value "
        "applies again; --var NAME= is the empty string); repeatable",
    )
    p.add_argument("--inventory", type=Path, metavar="FILE", help="hosts and vars laid over the runbook")
    _add_campaign(p)
    p.add_argument("--log-dir", type=Path, default=LOG_DIR)
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="the run's diagnostics (its debug.log) on stderr as well, and each instance of a matrix in the step list",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="RUN_ID",
        help="continue a run (default: the latest run of this runbook)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--from", dest="from_step", metavar="STEP", help="start at STEP, reusing earlier facts")
    group.add_argument("--only", dest="only_step", metavar="STEP", help="run only STEP, reusing earlier facts")
    p.set_defaults(results=True)  # end by saying where the report is (the demo says it after the report's tables)
    p.set_defaults(resumable=True)  # end a run that stopped with the command that continues it (not the demo's)


def _add_campaign(p: argparse.ArgumentParser) -> None:
    """`--from-campaign RUN [--band C]` of `run` and `plan` (executor/faces/campaign_overlay.py)."""
    p.add_argument(
        "--from-campaign",
        metavar="RUN",
        help="lay a campaign's answer over the runbook: its schedule's vars for the band of --band (a run id "
        "under --log-dir, or a run folder); over the inventory, under --var",
    )
    p.add_argument(
        "--band", type=_concurrency, metavar="C", help="with --from-campaign: the band holding concurrency C"
    )
    p.set_defaults(settle=functools.partial(_campaign_args, error=p.error, then=p.get_default("settle")))


def _concurrency(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1 << 20:
        raise argparse.ArgumentTypeError(f"expected a concurrency, a whole number 1 to {1 << 20}, got {text!r}")
    return int(text)


def _campaign_args(
    args: argparse.Namespace, error: Callable[[str], NoReturn], then: Callable[..., None] | None
) -> None:
    if args.band is not None and args.from_campaign is None:
        error("--band names a band of --from-campaign RUN's schedule: give --from-campaign too")
    if then is not None:
        then(args)


def campaign_lay(args: argparse.Namespace, laid: list[CampaignVar], say: bool) -> Callable[[Runbook], list[str]]:
    """--from-campaign's band as --var pairs laid under those given, each var with where it comes from added to
    `laid` (and with `say`, said on stderr: a run's; a plan shows them itself); no pair without --from-campaign.
    The schedule's models (the campaign report's) are imported only then: `plan` and `run` start without them."""
    if args.from_campaign is None:
        return lambda runbook: []
    from executor.faces.campaign_overlay import laid_under

    lay = laid_under(
        report_folder(args.from_campaign, args.log_dir), args.band, [p.partition("=")[0] for p in args.var], laid
    )

    def said(runbook: Runbook) -> list[str]:
        pairs = lay(runbook)
        for each in laid if say else []:
            err().print(shown_text(f"runbook: {each.shown}"))
        return pairs

    return said


def _report_format(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """`runbook report`'s format: `--json` is `--format json`, and the two may not say different things."""
    if args.json and args.format not in (None, "json"):
        error(f"--json is short for --format json; it contradicts --format {args.format}: give one of them")
    args.format = "json" if args.json else args.format or "text"


def _runbook_of_run(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """`runbook run`'s FILE wherever it was typed. `--resume` takes an optional RUN_ID, so argparse hands it
    the word after it: `runbook run --resume FILE` made FILE the run id and then asked for a file, and
    `--resume FILE RUN_ID` took the run id for the runbook. A run id never ends in `.yaml`/`.yml` nor holds
    a `/`: what does (or names a file) is the runbook, put back in its place. Anything else is a usage error
    (exit 2) that says what to type."""
    resume, file = args.resume, args.file
    # FILE written as a runbook (`.yaml`, a `/`) and a bare word: the word is the run id, whatever file has its name
    by_name = file is not None and _written_as_a_runbook(str(file)) and not _written_as_a_runbook(resume or "")
    if resume not in (None, "latest") and _names_a_runbook(resume) and not by_name:
        if file is not None and _names_a_runbook(str(file)):
            error(f"two runbooks, {resume} and {file}: give one FILE, then --resume [RUN_ID]")
        args.file, args.resume = Path(resume), "latest" if file is None else str(file)
    if args.file is None:
        then = "" if args.resume is None else " --resume" if args.resume == "latest" else f" --resume {args.resume}"
        error(f"which runbook? give its FILE: runbook run FILE{then}")


def _names_a_runbook(text: str) -> bool:
    """Whether an argument is a runbook's path rather than a run id (`20261203-134350-be4f3f`, or a prefix)."""
    return _written_as_a_runbook(text) or Path(text).is_file()


def _written_as_a_runbook(text: str) -> bool:
    """Whether an argument is written as a path no run id can be: ending in `.yaml`/`.yml`, or holding a `/`."""
    return text.endswith((".yaml", ".yml")) or "/" in text or os.sep in text


def _add_demo(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`runbook demo`: the flagship or its sweep against the bundled test hosts."""
    p = sub.add_parser(
        "demo",
        help="run runbooks/k26_dflash.yaml (or, with --sweep, the campaign k26_dflash_sweep.yaml) end to end "
        "against the bundled test host(s) on this machine",
    )
    p.add_argument("--sweep", action="store_true", help="the campaign: drafters x draft tokens / DDTREE budgets")
    p.add_argument(
        "--search",
        action="store_true",
        help="with --sweep: the campaign with `strategy: search`, which launches at most half of its configurations "
        "and names each concurrency's answer, saying which its budget left unproven (README, 'Search')",
    )
    p.add_argument(
        "--hosts", type=_pool_size, default=1, help="test hosts of the sweep's pool, 1 to 4 (they run in parallel)"
    )
    p.add_argument(
        "--nodes",
        type=_pool_size,
        default=1,
        help="serve the flagship across this many test nodes, 1 to 4 (a node group: SGLang's multi-node mode)",
    )
    p.add_argument(
        "--sglang",
        choices=["ddtree-pr", "release"],
        default="ddtree-pr",
        help="the sweep's test hosts' SGLang: with the DDTree pull request (default), or the release, where the "
        "DDTREE cells are skipped with the reason",
    )
    p.add_argument(
        "--landscape",
        choices=DEMO_LANDSCAPES,
        default=DEMO_LANDSCAPES[0],
        help="with --sweep: what the test hosts' GPUs make of the grid: h200 (default: tmp-long's drafter wins, "
        "DFLASH 4-8) or headroom (a GPU with more compute per byte: z-lab's drafter and a DDTREE budget win at low "
        "concurrency, DFLASH 8 at high; README, 'Search')",
    )
    p.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="K=V",
        help="override a var of the runbook, as in runbook run (repeatable): --var bench_repeats=3 for the runbook's "
        "three repeats (the demo runs one)",
    )
    p.add_argument("--log-dir", type=Path, default=LOG_DIR)
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.add_argument(
        "--ssh-server",
        choices=["auto", "openssh", "embedded"],
        default="auto",
        help="what serves the test host over SSH (auto: OpenSSH's sshd when installed and root, else embedded)",
    )


def _add_audit(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`runbook audit show|verify|key`."""
    p = sub.add_parser("audit", help="show or verify a run's audit log, or make the key that seals it")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("show", help="one line per record").add_argument("run_dir", type=Path)
    a = actions.add_parser(
        "verify",
        help="check the chain, the head, state.db and (--key) the seal",
        usage="%(prog)s RUN_DIR [--key [PATH]]",
    )
    # optional to argparse only, as `run`'s FILE: `--key RUN_DIR` gives RUN_DIR to --key (`_run_dir_of_verify`)
    a.add_argument("run_dir", type=Path, nargs="?", metavar="RUN_DIR")
    a.set_defaults(settle=functools.partial(_run_dir_of_verify, error=a.error))
    a.add_argument(
        "--key",
        nargs="?",
        const=seal.default_key_path(),
        type=Path,
        metavar="PATH",
        help=f"check the seal with this key (default: {seal.default_key_path()})",
    )
    actions.add_parser("key", help=f"create the key that seals every later run's log ({seal.default_key_path()})")


def _run_dir_of_verify(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """`audit verify`'s RUN_DIR wherever it was typed: `--key` takes an optional PATH, so `audit verify --key
    RUN_DIR` gave the run folder to --key and asked for one. A key is a file, a run folder a folder: a folder
    given to --key is the run folder, checked with the default key."""
    key, run_dir = args.key, args.run_dir
    if key is not None and key.is_dir() and (run_dir is None or not run_dir.is_dir()):
        args.run_dir, args.key = key, run_dir or seal.default_key_path()
    if args.run_dir is None:
        error("which run? give its folder: runbook audit verify RUN_DIR [--key [PATH]]")


def _add_trust_host(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`runbook trust-host FILE HOST`: read a host's key, show its fingerprint, record it when told to."""
    p = sub.add_parser(
        "trust-host",
        help="show the SSH host key HOST presents now (its fingerprint), and record it in the host's known_hosts "
        "with --fingerprint (the one you checked) or --yes; exit 0 once it is trusted, 1 if not",
    )
    p.add_argument("file", type=Path)
    p.add_argument("host", help="a host of the runbook (or of the inventory)")
    p.add_argument("--inventory", type=Path, metavar="FILE", help="hosts and vars laid over the runbook")
    accept = p.add_mutually_exclusive_group()
    accept.add_argument(
        "--fingerprint",
        metavar="SHA256:...",
        type=_fingerprint,
        help="record the key only if it has this fingerprint (checked with its owner; MD5:... as ssh-keygen -E md5 "
        "prints it is taken too)",
    )
    accept.add_argument("--yes", action="store_true", help="record the key it presents, whatever its fingerprint")


def cmd_trust_host(args: argparse.Namespace) -> int:
    """Read the key `args.host` presents, without logging in, and say its fingerprint. Record it in the host's
    known_hosts file only when `--fingerprint` matches it or `--yes` is given: nothing waits for a person. Exit 0
    when the key is trusted afterwards (recorded now, or already), 1 when it is not (shown only, another key is
    recorded for the host, a fingerprint that differs, the host unreachable), 2 for a bad argument or runbook."""
    import asyncio

    from executor.transport.ssh import SSHTransport

    runbook, _ = load_checked(args.file, args.inventory, [], os.environ)
    host = runbook.hosts.get(args.host)
    if host is None or host.is_local:
        why = "is local: no SSH, no host key" if host else f"is no host of it (its hosts: {', '.join(runbook.hosts)})"
        say(f"runbook trust-host: {args.host!r} {why}")
        return InvalidRunbook.exit_code
    offered = asyncio.run(SSHTransport(args.host, host).offered_key())
    where = f"{args.host} ({offered.pattern})"
    say(f"{where} presents the {offered.key.get_algorithm()} key {offered.fingerprint}", stdout=True)
    trusted = offered.trusted()
    if trusted is not None:
        say(f"already trusted: {offered.file} holds it" if trusted else _changed_key(offered), stdout=True)
        return EXIT_OK if trusted else EXIT_FAILED
    if args.yes or offered.has_fingerprint(args.fingerprint):
        offered.record()
        say(f"recorded in {offered.file}: a run now trusts {where}", stdout=True)
        return EXIT_OK
    if args.fingerprint is not None:
        say(f"not recorded: it is not the key you gave ({args.fingerprint}); ask the host's owner", stdout=True)
        return EXIT_FAILED
    again = ["runbook", "trust-host", str(args.file), args.host]
    again += ["--inventory", str(args.inventory)] if args.inventory else []
    kind = offered.key.get_algorithm().removeprefix("ssh-").split("-")[0]
    hint = "not recorded: compare it with the host's own (on the host: `ssh-keygen -lf "
    hint += f"/etc/ssh/ssh_host_{kind}_key.pub`), then"
    command = shlex.join([*again, "--fingerprint", offered.fingerprint])
    if line_width(sys.stdout) is None:
        say(f"{hint}: {command}", stdout=True)
    else:  # the command on lines of its own, to paste
        say(f"{hint}:", stdout=True)
        print("\n".join(pasteable_lines(command, line_width(sys.stdout))))
    return EXIT_FAILED


def _changed_key(offered: OfferedKey) -> str:
    """What to say where the file already trusts another key for the host: nothing is added beside it."""
    return (
        f"not recorded: {offered.file} trusts another key for {offered.pattern}: the host's key changed (reinstalled?),"
        f" or this is not the host. Once its owner confirms the new key: ssh-keygen -f {shlex.quote(offered.file)} -R"
        f" {shlex.quote(offered.pattern)}, then run this again"
    )


def cmd_validate(args: argparse.Namespace) -> int:
    from executor.runbook.planner import matrix_summary

    # the secrets set here are masked in its problems as `plan` masks them (an inventory var holding one)
    runbook, _ = load_checked(args.file, args.inventory, [], os.environ)
    for warning in runbook.warnings:  # written safe to show, as a problem is
        print(fitted(str(warning), line_width(sys.stderr)), file=sys.stderr)
    hosts = sum(len(h) for h in runbook.step_hosts.values())
    say(f"{args.file}: ok ({len(runbook.steps)} steps, {hosts} step-host pairs)")
    for group in runbook.groups:
        say(matrix_summary(group))
        for cell in group.cells:
            say(f"  cell {cell.id}")
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from executor.faces.compare import compare_schema
    from executor.runbook import schema

    made = {"inventory": schema.inventory_schema, "report": schema.report_schema, "plan": schema.plan_schema}
    made |= {"compare": compare_schema}
    document = next((make for name, make in made.items() if getattr(args, name)), schema.runbook_schema)()
    print(strict_json.dumps(document, indent=2, ensure_ascii=True))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from executor.runbook.planner import plan_blocks, plan_model, secrets_redactor

    laid: list[CampaignVar] = []
    runbook, overrides = load_checked(
        args.file, args.inventory, args.var, os.environ, campaign_lay(args, laid, say=False)
    )
    redactor = secrets_redactor(runbook, os.environ)
    if args.full:
        for block in plan_blocks(runbook, overrides, redactor):  # as each comes: the whole may be gigabytes
            print(shown(block))  # not through rich, which measures each character's width (1 MB/s)
        return EXIT_OK
    document = plan_model(runbook, overrides, redactor)
    document.campaign = [type(each).model_validate(redactor.deep(each.model_dump())) for each in laid]
    if args.json:
        # ensure_ascii: no control character reaches the terminal
        print(strict_json.dumps(document.model_dump(mode="json")))
        return EXIT_OK
    from executor.runbook.plan_summary import WIDTH, summary_text  # the readable plan, from the same document

    # plain lines, as rich printed them (soft wrap, tabs to 8 columns): importing rich's console for a text
    # without styles was a tenth of `plan`'s start (bench/RESULTS.md, 9d); laid out to fit the terminal
    print(shown(summary_text(document, line_width(sys.stdout) or WIDTH)).expandtabs(8))
    return EXIT_OK


def _fingerprint(text: str) -> str:
    """A host key's fingerprint as `ssh-keygen -l` prints it (SHA256:BASE64, or MD5:HEX:... with `-E md5`): any
    other text was said to be "not the key you gave", a changed key, where it is no fingerprint at all."""
    if not re.fullmatch(r"SHA256:[A-Za-z0-9+/]{43}|MD5(:[0-9a-f]{2}){16}", text):
        raise argparse.ArgumentTypeError(
            f"{text[:100]!r} is no fingerprint: give it as `ssh-keygen -lf KEY.pub` prints it (SHA256:BASE64, or "
            "MD5:aa:bb:... with -E md5)"
        )
    return text


def _pool_size(text: str) -> int:
    if text not in ("1", "2", "3", "4"):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of test hosts from 1 to 4")
    return int(text)


def cmd_demo(args: argparse.Namespace) -> int:
    from executor import diagnostics
    from executor.faces import views
    from sandbox.demo import demo_site  # the test host's parts: only the demo (and the tests) use them

    diagnostics.route_asyncssh()  # before the demo's own SSH server logs anything, as for a run

    if args.hosts > 1 and not args.sweep:
        err().print(f"runbook demo: --hosts {args.hosts} is the size of the sweep's pool: add --sweep")
        return 2
    if args.search and not args.sweep:
        err().print("runbook demo: --search is the sweep's strategy: add --sweep")
        return 2
    if args.landscape != DEMO_LANDSCAPES[0] and not args.sweep:
        err().print(f"runbook demo: --landscape {args.landscape} is the sweep's test hosts': add --sweep")
        return 2
    if args.nodes > 1 and args.sweep:
        err().print(
            f"runbook demo: --nodes {args.nodes} serves the flagship across a node group; the sweep's pool is --hosts"
        )
        return 2
    site_of = demo_site(
        args.log_dir,
        args.ssh_server,
        say=err().print,
        sweep=args.sweep,
        search=args.search,
        hosts=args.hosts,
        sglang=args.sglang,
        nodes=args.nodes,
        landscape=args.landscape,
    )
    with site_of as site:
        err().print(
            shown_text(
                f"demo: {site.runbook.name} against the test host on this machine (SSH served by {site.ssh_server}), "
                f"laid over with {site.inventory}; a real site needs only its own inventory"
            )
        )
        saved = os.environ.get("HF_TOKEN")
        os.environ["HF_TOKEN"] = site.hf_token  # the local Hub's token, never a real one
        try:
            code = cmd_run(
                argparse.Namespace(
                    results=False,  # said below, after the report's tables
                    resumable=False,  # its test host ends with it: how to go on is said below
                    file=site.runbook,
                    inventory=site.inventory,
                    var=args.var,
                    unset_var=[],
                    log_dir=args.log_dir,
                    json=args.json,
                    verbose=False,
                    resume=None,
                    from_step=None,
                    only_step=None,
                    from_campaign=None,  # the demo deploys the flagship as written
                    band=None,
                )
            )
        finally:
            if saved is None:
                os.environ.pop("HF_TOKEN", None)
            else:
                os.environ["HF_TOKEN"] = saved
    run_dir = args.log_dir / views.latest(args.log_dir, None).run_id
    if (run_dir / views.REPORT_FILE).exists() and not args.json:
        cmd_report(argparse.Namespace(run=str(run_dir), log_dir=args.log_dir, format="text"))
    _say_demo_end(run_dir, args.log_dir, code, site.runbook.name, args.search)
    return code


def _say_demo_end(run_dir: Path, log_dir: Path, code: int, runbook_name: str, search: bool = False) -> None:
    """The demo's last lines: its audit log, its results (or where to look), what its numbers are, how to go on
    after a demo that stopped, and the command for a real GPU host."""
    from executor.run import audit

    results = results_lines(run_dir, log_dir)
    # each a line, or a hint and the command to paste, on a line of its own where both fit no line
    lines: list[str | tuple[str, str]] = [
        (f"demo: audit log: {run_dir / audit.AUDIT_FILE}; check it", f"runbook audit verify {run_dir}")
    ]
    lines += [f"demo: {line}" for line in results or [f"no report: see runbook status --log-dir {log_dir}"]]
    if results:
        lines.append(
            "demo: the numbers come from the SGLang stand-in (sandbox/sglang_standin), a test double: they show the "
            "runbook working, not how fast Kimi-K2.6 is"
        )
    if code != EXIT_OK:  # instead of the `--resume` a run ends with
        lines.append(
            "demo: its test host ended with it (`runbook run ... --resume` would find nothing listening): run the "
            "same `runbook demo` again, from the start"
        )
    lines.append(
        ("demo: on your GPU host", f"HF_TOKEN=hf_... runbook run runbooks/{runbook_name} --inventory my-site.yaml")
    )
    if search:
        lines.append("demo: to search there too, make its group's `strategy: grid` line `strategy: search`")
    for line in lines:
        if isinstance(line, tuple):
            _say_command(*line)
        else:
            err().print(shown_text(line))


def cmd_run(args: argparse.Namespace) -> int:
    # read once: the Engine finds the run a --resume continues, and continues it as it was started (its
    # --var and --inventory carry over, a --var given now overriding its own; executor.run.resume.begin)
    import asyncio

    from executor import diagnostics
    from executor.run.engine import Engine, RunOptions
    from executor.run.events import ConsoleReporter, JsonReporter, Reporter
    from executor.runbook.loader import load_runbook

    # what asyncssh logs reaches the run's debug.log, never the console (executor.diagnostics)
    diagnostics.route_asyncssh()
    runbook = load_runbook(args.file, args.inventory)
    options = RunOptions(
        log_dir=args.log_dir,
        resume=args.resume,
        from_step=args.from_step,
        only_step=args.only_step,
        var_args=[*campaign_lay(args, [], say=True)(runbook), *args.var],  # a --var given wins over the campaign's
        unset_vars=list(args.unset_var),
        inventory=args.inventory,
        verbose=args.verbose,
    )
    reporter: Reporter = JsonReporter() if args.json else ConsoleReporter(err(), runbook.groups, args.verbose)
    os.umask(0o077)
    log_dir = [] if args.log_dir == LOG_DIR else ["--log-dir", str(args.log_dir)]
    # a run of one step continues as one step: --resume would also run the steps --only left out; nor would it
    # carry this run's --inventory and --var, which are said again
    site = [*(["--inventory", str(args.inventory)] if args.inventory else []), *(f"--var={v}" for v in args.var)]
    site += ["--from-campaign", args.from_campaign] if args.from_campaign else []
    site += ["--band", str(args.band)] if args.band is not None else []
    scope = ["--only", args.only_step, *site] if args.only_step else ["--resume"]
    again = shlex.join(["runbook", "run", str(args.file), *scope, *log_dir])
    try:
        engine = Engine(runbook, options, reporter, say=lambda note: err().print(shown_text(f"runbook: {note}")))
        code = asyncio.run(_run_interruptible(engine))
    except DurableWriteError as exc:
        return failed(exc, again)
    finally:
        reporter.close()
    if args.results and not args.json:
        for line in results_lines(getattr(engine.folder, "run_dir", None), args.log_dir):  # set once it is made
            err().print(shown_text(line))
    if args.resumable and not args.json:  # the demo says how to go on itself
        _say_how_to_continue(engine, code, again, args.log_dir)
    return code


def _say_how_to_continue(engine: Engine, code: int, again: str, log_dir: Path) -> None:
    """The command that continues a run which stopped, by how it stopped (nothing for a run that passed)."""
    if code == EXIT_INTERRUPTED:  # nothing failed: the operator stopped it
        _say_command("interrupted; to continue where it stopped", again)
    elif code == EXIT_FAILED:
        # a failure a var's value caused is said with the command that resumes with another value instead
        if not _said_causes(engine, log_dir):
            _say_command("after fixing the cause, continue where it stopped", again)
    elif code == EXIT_CELLS_FAILED:
        _say_command("some cells failed (runbook status lists them); to run only those again", again)


def results_lines(run_dir: Path | None, log_dir: Path) -> list[str]:
    """Where a run's results are: its report.md, each figure, and the `runbook report` command that shows them
    again; none when it wrote no report (or never made its run folder). `runbook run` ends with these, a failed
    run that wrote a report too, and so does the demo."""
    from executor.faces import views

    if run_dir is None or not (run_dir / views.REPORT_FILE).exists():
        return []
    again = shlex.join(
        ["runbook", "report", run_dir.name, *([] if log_dir == LOG_DIR else ["--log-dir", str(log_dir)])]
    )
    # report.md and the figures are written after report.json: a run a full disk stopped may lack them
    markdown = run_dir / "report.md"
    unwritten = " (not written: the run stopped before it; runbook report shows report.json)"
    lines = [f"report: {markdown}" + ("" if os.path.exists(markdown) else unwritten)]
    try:
        figures = views.read_report(run_dir)[1].figures
    except RunbookError as exc:  # written, but not one `runbook report` shows: say why rather than the command
        return [*lines, f"runbook report refuses its {views.REPORT_FILE}: {exc}"]
    for figure in figures:
        path = run_dir / figure.path
        lines.append(f"figure: {path}" + ("" if os.path.exists(path) else " (not written)"))
    return [*lines, f"see it again: {again}"]


def _said_causes(engine: Engine, log_dir: Path) -> bool:
    """Say each failure a var's value caused (`StepRecord.cause`) and the command that resumes the run with
    another value of it; whether there was one."""
    from executor.faces import views

    causes = {
        (r.cause["var"], r.cause["value"]): r for r in engine.records.values() if r.cause and r.status == "failed"
    }
    for record in causes.values():
        assert record.cause is not None
        path, run_id = str(engine.runbook.path), engine.run_dir.name
        hint = f"{record.step}@{record.host} failed because of {views.caused_by(record.cause)}"
        hint += "; resume with another value"
        _say_command(hint, views.resume_with(path, run_id, log_dir, record.cause), below=True)
    return bool(causes)


def pasteable_lines(command: str, width: int | None) -> list[str]:
    """`command`, shown, on a line of its own where it fits `width` (or the width is not known), else broken between
    its words with ` \\` as a command that pastes whole (executor/runbook/plan_summary.py)."""
    from executor.runbook.plan_summary import command_lines

    text = shown(command)
    return [text] if width is None or len(text) <= width else command_lines(text, width)


def _pasteable(command: str, console: FittingConsole) -> Whole:
    """`pasteable_lines` for a rich console: lines it prints as they are."""
    from rich.text import Text

    from executor.consoles import Whole

    return Whole(Text("\n".join(pasteable_lines(command, console.fit_width))))


def _say_command(hint: str, command: str, below: bool = False) -> None:
    """`hint: command` on stderr, on one line where it fits and not `below`; else the hint, then the command on a
    line of its own (`_pasteable`)."""
    console = err()
    line = shown(f"{hint}: {command}")
    if not below and (console.fit_width is None or len(line) <= console.fit_width):
        console.print(shown_text(line))
    else:
        console.print(shown_text(f"{hint}:"))
        console.print(_pasteable(command, console))


def write_failed_message(exc: DurableWriteError, again: str | None = None) -> str:
    """The one paragraph a failed durable write ends with (exit 4)."""
    then = f"continue it: {again}" if again else "continue the run with runbook run FILE --resume"
    return (
        f"runbook: the run stopped: {exc}. It is not a step failure and was not retried: no command was started "
        "after it, and the command in flight was recorded if its record could still be written (otherwise the "
        "resumed run's audit log opens with an `abandoned` record for it); the run is not passed. Free space "
        f"(or fix the disk), then {then} (nothing that passed runs again)."
    )


async def _run_interruptible(engine: Engine) -> int:
    import asyncio

    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def stop() -> None:
        # the first signal starts a bounded clean-up (remote sessions killed, audit written);
        # a second one must not cut that short, or the interrupted command would go unrecorded
        if not task.cancelling():
            say("runbook: stopping: killing every process of the running commands' sessions")
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # the terminal or SSH session of the controller closing is an interrupt, unless the user
        # asked for the run to outlive it (`nohup runbook run ...` starts us with SIGHUP ignored)
        if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:
            loop.add_signal_handler(sig, stop)
    try:
        return await engine.run()
    except asyncio.CancelledError:
        return EXIT_INTERRUPTED


def _cell(text: str, width: int) -> str:
    """A table cell: the first line of `text`, cut to `width` characters (the whole text follows the table)."""
    first_line = text.partition("\n")[0]
    return first_line if len(first_line) <= width else first_line[: width - 1] + "…"


def cmd_status(args: argparse.Namespace) -> int:
    from executor.consoles import print_table
    from executor.faces import views

    view = views.status(args.log_dir, args.run_id)
    if args.json:
        print(strict_json.dumps(view, default=str, indent=2))
        return EXIT_OK
    run, failed_cells = view["run"], view["failed_cells"]
    status = run["status"]
    records = [StepRecord(**step) for step in view["steps"]]
    title = shown_text(f"run {run['run_id']} ({run['runbook']}): {_run_status(status, run['note'])}")
    rows: list[list[Text]] = []
    details: list[str | Whole] = []  # a message, or a command to paste
    for r in records:
        if r.reused_from and passed_before(r) and r.status == "skipped":  # left out by --only, its pass kept
            status_text = f"skipped (last passed in {r.reused_from})"
        elif r.reused_from and r.status == "failed":  # kept by --from/--only as it ended in an earlier run
            status_text = f"failed (in {r.reused_from})"
        elif r.reused_from:
            status_text = f"{r.status} (reused from {r.reused_from})"  # passed, or skipped by its `when:`
        elif r.status == "running" and status in (STOPPED, WRITE_FAILED):
            status_text = "running (process gone)" if status == STOPPED else "running (stopped by a failed write)"
        else:
            status_text = r.status
        started = r.status not in NOT_STARTED
        message, gate = r.message or "", r.gate or ""
        cell, gate_cell = _cell(message, MESSAGE_CELL), _cell(gate, GATE_CELL)
        cells = (
            r.step,
            r.host,
            status_text,
            str(r.attempts) if started else "",
            format_duration(r.duration_s or 0) if started else "",
            r.via or "",
            gate_cell,
            cell,
        )
        rows.append(list(map(shown_text, cells)))  # run data is never rich markup
        detail = message if message.strip() != cell.strip() and r.status in ("failed", "interrupted") else ""
        if gate_cell != gate and gate not in detail:  # the whole gate, when its cell had to be cut
            detail += f"\n  gate: {gate}" if detail else f"gate: {gate}"
        if detail:
            details.append(f"{r.step}@{r.host}: {detail}")
        if r.cause is not None and r.status == "failed":  # the view added the command that resumes
            details.append(f"{r.step}@{r.host}: caused by {views.caused_by(r.cause)}; resume with another value:")
            details.append(_pasteable(r.cause["resume"], out()))
    columns = ("step", "host", "status", "attempts", "duration", "via", "failing gate", "message")
    print_table(out(), title, columns, rows)
    for said in details:
        out().print(shown_text(said) if isinstance(said, str) else said)
    if failed_cells:
        out().print(shown_text(f"failed cells ({len(failed_cells)}):"))
        for failed in failed_cells:
            out().print(shown_text(f"  {failed['group']}[{failed['cell']}]: {failed['reason']}"))
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    """Recent runs, newest first; a run folder that cannot be read is a row saying why, never a traceback."""
    from executor.consoles import print_table
    from executor.faces import views

    rows = views.runs(args.log_dir)
    if args.json:
        print(strict_json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        out().print(shown_text(f"no runs in {args.log_dir}"))
        return EXIT_OK
    table = []
    for row in rows:
        cells = (
            row["run_id"],
            row["runbook"] or "",
            _run_status(row["status"], row["note"]),
            _when(row["started_at"]),
            _when(row["finished_at"]),
            row["resumed_from"] or "",
        )
        table.append(list(map(shown_text, cells)))
    columns = ("run", "runbook", "status", "started", "finished", "resumed from")
    print_table(out(), shown_text(f"runs in {args.log_dir}"), columns, table)
    return EXIT_OK


def _run_status(status: str | None, note: str | None) -> str:
    """A run's status for a table: `unreadable: why`, `stopped (why)`, or the status alone."""
    if note is None:
        return status or ""
    return f"{status}: {note}" if status == "unreadable" else f"{status} ({note})"


def _when(timestamp: str | None) -> str:
    """An ISO timestamp as `YYYY-MM-DD HH:MM:SS` (UTC), for tables."""
    return timestamp[:19].replace("T", " ") if timestamp else ""


def cmd_audit(args: argparse.Namespace) -> int:
    from executor.run import audit  # here: the log's reader and verifier (sqlite3, hashlib), for this command only

    if args.action == "key":
        return _make_key()
    if not (args.run_dir / audit.AUDIT_FILE).exists():
        if (args.run_dir / "run.json").exists() and args.action == "verify":
            say(f"TAMPERED: {args.run_dir}: the run's {audit.AUDIT_FILE} is gone")
            return EXIT_FAILED
        raise ResumeError(f"{args.run_dir}: not a run folder (no {audit.AUDIT_FILE} here)")
    if args.action == "verify":
        key = seal.load_key(args.key) if args.key else None
        report = audit.verify(args.run_dir, key=key)
        for note in report.notes:
            say(f"note: {note}")
        for problem in report.problems:
            say(f"TAMPERED: {problem}")
        verdict = "intact" if report.ok else "tampered"
        sealed = f"; sealed with key id {key.key_id}: seal checked" if key and report.ok else ""
        runs = ", ".join(report.runs)
        say(f"{verdict}: {report.records} records in {len(report.runs)} run(s): {runs}{sealed}", stdout=True)
        return EXIT_OK if report.ok else EXIT_FAILED
    for number, record, raw in audit.read_records(args.run_dir):
        say(f"{number:>4}  {_describe(record) if record else f'(torn line, {len(raw)} bytes)'}", stdout=True)
    return EXIT_OK


def _make_key() -> int:
    """`runbook audit key`: create the audit key (never over an existing one); its id is shown, never its bytes."""
    key = seal.create_key(seal.default_key_path())
    say(
        f"runbook: created the audit key {key.path} (key id {key.key_id}); every run started from now on seals "
        "its audit head with it. Keep a copy away from this machine's run folders: `runbook audit verify RUN_DIR "
        "--key PATH` proves with it that a log was not rewritten."
    )
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Print report.json's title, notes, tables, figures and per-request records (`--format json`: the document
    as it is; csv: its tidy rows, executor/faces/report_csv.py); what they mean is the writer's business."""
    from executor.faces import views

    run_dir = report_folder(args.run, args.log_dir)
    report, whole = views.read_report(run_dir)  # refused unless shaped as a report with a complete provenance
    if args.format == "json":
        print(strict_json.dumps(report, indent=2))
        return EXIT_OK
    if args.format == "csv":
        from executor.faces import report_csv

        report_csv.write(report_csv.tidy_table(report, run_dir), sys.stdout)
        return EXIT_OK
    shown, left_out = views.shown_within(whole)
    out().print(shown_text(shown.title, style="bold"))
    for note in shown.notes:
        out().print(shown_text(f"- {note}"))
    for each in shown.tables:
        _print_report_table(each)
    for figure in shown.figures:
        out().print(shown_text(f"{figure.title}: {run_dir / figure.path}"))
    for what, path in views.request_files(report):
        out().print(shown_text(f"per-request records of {what}: {run_dir / path}"))
    if left_out:
        out().print(shown_text(f"({left_out:,} more notes, cells or figures left out: --json prints them all)"))
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare two runs (executor/faces/compare.py): the table on stdout (`--json`: the document), the figure
    written where --figure says (by default beside the run folders, never into either); exit 1 when a metric
    regressed beyond --threshold and beyond noise, 0 otherwise, 2 for a run without a report to compare."""
    from executor.faces import compare

    run_a, run_b = report_folder(args.run_a, args.log_dir), report_folder(args.run_b, args.log_dir)
    comparison = compare.compare(run_a, run_b, args.threshold)
    if not args.no_figure:
        _draw_comparison(comparison, args.figure or _beside(run_a, run_b), asked=args.figure is not None)
    if args.json:
        print(strict_json.dumps(comparison.model_dump(mode="json"), indent=2))
    else:
        _print_comparison(comparison)
    return compare.EXIT_REGRESSED if comparison.regressed else EXIT_OK


def _beside(run_a: Path, run_b: Path) -> Path:
    """The default figure's path: beside the run folders (their log folder for run ids, the folder holding the
    second for run folders by path), outside both (a run kept inside the other: beside the outer one)."""
    first, second = run_a.resolve(), run_b.resolve()  # `.` names a folder too

    def outside(folder: Path) -> bool:
        return not (folder.is_relative_to(first) or folder.is_relative_to(second))

    folders = (second.parent, first.parent)
    return next((f for f in folders if outside(f)), second.parent) / f"compare-{first.name}-vs-{second.name}.png"


def _draw_comparison(comparison: Any, figure: Path, *, asked: bool) -> None:
    """The figure drawn to `figure`, said in the comparison. One asked for (`--figure`) that cannot be written is
    exit 2; the default one costs only itself, said on stderr: the comparison and its verdict still come."""
    from executor.faces.compare_figure import draw

    try:
        draw(comparison, figure)
    except OSError as exc:
        why = f"the figure cannot be written to {figure}: {exc.strerror or exc}"
        if asked:
            raise ResumeError(f"compare: {why}") from None
        say(f"runbook compare: no figure: {why} (--figure PATH says where)")
        return
    comparison.figure = str(figure)


def _print_comparison(comparison: Any) -> None:
    """The comparison as a table (a row per matched cell and metric), then the cells only one run has, the
    regressions and the figure."""
    from executor.consoles import print_table
    from executor.faces.compare import comparison_rows

    a, b = comparison.a, comparison.b
    title = f"{b.run} (B) vs {a.run} (A): change of each metric, 95% CI from the repeats"
    columns = ("cell", "workload", "concurrency", "metric", "A", "B", "change", "95% CI", "verdict")
    print_table(out(), shown_text(title), columns, [list(map(shown_text, row)) for row in comparison_rows(comparison)])
    for side, name in ((a, "A"), (b, "B")):
        for each in side.only_here:
            out().print(shown_text(f"only in {name} ({side.run}): {each.cell} {each.workload} c={each.concurrency}"))
    for line in comparison.regressions:
        out().print(shown_text(f"REGRESSION: {line}"))
    verdict = f"{len(comparison.regressions)} regression(s) beyond {comparison.threshold_pct:g}% and beyond noise"
    out().print(shown_text(verdict + (f"; figure: {comparison.figure}" if comparison.figure else "")))


def report_folder(run: str | None, log_dir: Path) -> Path:
    """The run folder `runbook report RUN` reads: RUN as a folder when it is one (or names one by a path: `logs/ID`),
    else a run id or unique prefix under `log_dir`, or without RUN the latest run there, as `status` finds it."""
    from executor.faces import views

    if run is not None and (os.path.isdir(run) or (os.sep in run and not os.path.isfile(run))):
        # os.path answers False, never OSError, for a name too long; a file (the runbook, mistaken for its run)
        # is refused by `latest`, saying so
        return Path(run)
    return log_dir / views.latest(log_dir, run).run_id


def _print_report_table(table: documents.Table) -> None:
    """A report's table, its cells data (never rich markup); on a terminal, the cells of a `command` column follow
    the table, numbered, each broken between its words as a command that pastes whole (executor/runbook/
    plan_summary.py), rather than wrapped inside a narrow cell."""
    from executor.consoles import print_table

    width = out().fit_width
    at = [n for n, column in enumerate(table.columns) if column.strip().lower() == COMMAND_COLUMN] if width else []
    commands: list[str] = []
    rows = []
    for row in table.rows:
        cells = list(row)
        for n in at:
            if cells[n].strip():
                commands.append(cells[n])
                cells[n] = f"({len(commands)})"
        rows.append(list(map(shown_text, cells)))
    print_table(out(), shown_text(table.title), list(map(shown_text, table.columns)), rows)
    if commands and width:
        from executor.consoles import Whole
        from executor.runbook.plan_summary import command_lines

        for number, command in enumerate(commands, start=1):
            first, *rest = command_lines(shown(command), width)
            label = f"({number})"
            out().print(Whole(shown_text("\n".join([label + first[len(label) :], *rest]))))


def _describe(record: dict[str, Any]) -> str:
    """One line per audit record for `audit show` (a record of an unexpected shape says so)."""
    try:
        return _describe_record(record)
    except (TypeError, ValueError, KeyError) as exc:
        return f"(a record of an unexpected shape: {exc!r}; `audit verify` checks it)"


def _describe_record(record: dict[str, Any]) -> str:
    started = str(record.get("started_at") or "")[:19]
    who = f"{started}  {record.get('step')}@{record.get('host')} #{record.get('attempt')}"
    if record.get("event") == "transfer":
        what = f"{record['direction']} {record['local']} <-> {record['remote']} ({record['size']} bytes)"
        return f"{who}  {what}"
    if record.get("event") == "abandoned":
        said = record.get("note") if "recorded_lines" in record else None  # older records: no record of it
        return (
            f"{who}  abandoned: was running when run {record.get('run')} stopped; {said or 'no record of its command'}"
        )
    ended = how_it_ended(record.get("exit_code"), interrupted=bool(record.get("interrupted")))
    status = "timeout" if record.get("timed_out") else ended
    lines = str(record.get("command", "")).rstrip("\n").split("\n")  # a CR is shown, never a line break
    return f"{who}  {status:<8} {float(record.get('duration_s') or 0):>7.3f}s  {(lines or [''])[-1][:80]}"


def _mcp_install_command() -> str:
    """The command that adds the `mcp` extra to this very installation: with this interpreter (the README's
    .venv), from the checkout where runbook runs from one, since `pip install 'runbook[mcp]'` there would
    fetch whatever an index calls `runbook`."""
    checkout = Path(__file__).resolve().parents[2]
    pip = [sys.executable, "-m", "pip", "install"]
    if (checkout / "pyproject.toml").is_file():
        return shlex.join([*pip, "-e", f"{checkout}[mcp]"])
    return shlex.join([*pip, "runbook[mcp]"])


def cmd_mcp(args: argparse.Namespace) -> int:
    """`runbook mcp`: the MCP server (executor.faces.mcp_server) over stdio, with the optional extra installed."""
    try:
        from executor.faces.mcp_server import serve
    except ModuleNotFoundError as exc:  # no SDK, or one without the server API (mcp < 2)
        if not (exc.name or "").startswith("mcp"):
            raise
        _say_command(f"runbook mcp: needs the MCP SDK ({exc.name})", _mcp_install_command())
        return InvalidRunbook.exit_code
    missing = [root for root in args.root if not root.is_dir()]
    if missing:
        raise ResumeError(f"mcp: --root {missing[0]} is not a folder")
    serve(args.root)
    return EXIT_OK


COMMANDS = {
    "validate": cmd_validate,
    "plan": cmd_plan,
    "run": cmd_run,
    "status": cmd_status,
    "runs": cmd_runs,
    "audit": cmd_audit,
    "demo": cmd_demo,
    "report": cmd_report,
    "compare": cmd_compare,
    "schema": cmd_schema,
    "mcp": cmd_mcp,
    "trust-host": cmd_trust_host,
}


def main(argv: Sequence[str] | None = None) -> int:
    # a character stdout's encoding lacks (ASCII under cron, Latin-1) is written as the escape `shown` uses
    # (`\u2713`), as Python writes stderr, never a UnicodeEncodeError traceback half-way through a table
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    if (settle := getattr(args, "settle", None)) is not None:
        settle(args)
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # what print() left in the buffer, here rather than at exit, where a closed pipe is noise
        return code
    except BrokenPipeError:
        # stdout's reader went away (`runbook audit show RUN | head`): stop quietly, and let nothing more
        # (Python's own flush at exit included) write to the closed pipe
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return COMMANDS[args.command](args)
    except RunbookError as exc:
        return failed(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def failed(exc: RunbookError, again: str | None = None) -> int:
    """The one place an error becomes what the CLI prints and its exit status: the error's own `exit_code`
    (executor.errors documents the tree). `again`: the command that continues a run a failed write stopped."""
    if isinstance(exc, InvalidRunbook):
        for problem in exc.problems:  # a Problem is written safe to show (executor.errors): one line, but fitted
            print(fitted(str(problem), line_width(sys.stderr)), file=sys.stderr)
    elif isinstance(exc, DurableWriteError):
        say(write_failed_message(exc, again))
    else:
        say(f"runbook: {exc}")
    if isinstance(exc, TransportError) and exc.check:  # a connection not made: what to check, once
        say(exc.check)
    return exc.exit_code


def say(text: str, *, stdout: bool = False) -> None:
    """`text` on stderr (or stdout) without rich (`validate` and a failure print plain text), as everything is
    shown: safe for a terminal, each line fitted to its width (executor/terminal.py)."""
    stream = sys.stdout if stdout else sys.stderr
    print(fitted(shown(text), line_width(stream)), file=stream)


def entry() -> NoReturn:
    """The process's entry (the `runbook` script, `python -m executor.faces.cli`): `main`, then an exit that leaves
    the heap's reference cycles to the operating system. The interpreter's exit would otherwise walk every
    object the command loaded (the step kinds' pydantic models and validators, their modules) to collect
    them: about 70 ms of CPU of `runbook validate`'s 500 (bench/RESULTS.md, 9c), for nothing, as the process
    ends. Exit handlers and the flush of stdout still run. Not done in `main`, which tests call in their own
    process."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
