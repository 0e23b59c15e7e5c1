"""What every host program shares (stdlib only): the one contract, and the helpers they all need.

The contract: `PYTHON program.pyz CONFIG_FILE`. The config is one JSON object in a file (whatever its
size); progress goes to stderr as `runbook-progress {json}` lines (PROGRESS_PREFIX, which the controller's
executor.stepkind reads from here); the result is ONE JSON document on the last line of stdout, which the
controller parses into the kind's pydantic facts (`executor.stepkind.host_document`). A program that cannot
run (a var unset, an interpreter too old) says why in one line on stderr, with no document.

This module is bundled into every program's zip, so it must run on the oldest interpreter any program
declares (MIN_PYTHON; tests/hostprograms/test_versions.py holds each module to its declaration with vermin).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Mapping, TypeVar

MIN_PYTHON = (3, 7)
#: How a line of live progress starts on stderr: this prefix, then one JSON object.
PROGRESS_PREFIX = "runbook-progress "
#: Exit status of a program that refused to run (REFUSED) or of an interpreter older than the program
#: declares (TOO_OLD, set by the zip's `__main__` before the program is even read).
REFUSED = 2
TOO_OLD = 86
USER_AGENT = "runbook-hostprogram/1"

Document = Dict[str, Any]
T = TypeVar("T")


class Refused(Exception):
    """The program cannot do what its config asks (a var unset, a path that cannot be); its message says why."""


def progress(fields: Mapping[str, Any]) -> None:
    """One line of live progress on stderr (flushed: the controller shows it as it arrives)."""
    print(PROGRESS_PREFIX + json.dumps(dict(fields)), file=sys.stderr, flush=True)


def main(run: Callable[[Document], Document], failed: Callable[[Document], bool] = lambda _: False) -> int:
    """Read the config file named by argv[1], run, print the result as the last line of stdout.

    Exit 0, or 1 when `failed(document)` (the document says why), or REFUSED with one line on stderr.
    """
    try:
        with open(sys.argv[1], encoding="utf-8") as file:
            config = json.load(file)
        document = run(config)
    except Refused as exc:
        print(f"runbook: {exc}", file=sys.stderr)
        return REFUSED
    sys.stdout.write(json.dumps(document, allow_nan=False) + "\n")
    return 1 if failed(document) else 0


def loads(text: str | bytes) -> Any:
    """JSON as the controller reads it: NaN, Infinity and numbers out of a float's range (`1e999`) are
    ValueError, as for malformed JSON. Python's json reads them, but `main` could then print no document."""

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is no JSON value")

    def number(text: str) -> float:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ValueError(f"{text[:40]} is out of a float's range")
        return value

    return json.loads(text, parse_constant=constant, parse_float=number)


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_path(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """`text` with a leading `~` and each `$name`/`${name}` replaced from the environment, nothing else.

    The same expansion as executor.render.host_word gives in bash: a var that is unset or empty is
    Refused, naming it, rather than turning `$models_dir/Kimi-K2.6` into `/Kimi-K2.6`.
    """

    def value(name: str, what: str) -> str:
        found = environ.get(name, "")
        if not found:
            raise Refused(f"{name}: {what}")
        return found

    head = ""
    if text == "~" or text.startswith("~/"):
        head, text = value("HOME", "is not set"), text[1:]
    return head + _VAR.sub(
        lambda m: value(m.group(1) or m.group(2), f"runbook var {m.group(1) or m.group(2)} is unset or empty"), text
    )


def tail(text: str, limit: int = 400) -> str:
    """The end of an output, stripped, at most `limit` characters (`...` marks a cut)."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


class HubToken:
    """Where huggingface_hub would find its token on this host (`get_token()` without OIDC or Colab).

    HF_TOKEN, else the legacy HUGGING_FACE_HUB_TOKEN, then the file at HF_TOKEN_PATH or $HF_HOME/token
    (HF_HOME defaulting to ${XDG_CACHE_HOME:-~/.cache}/huggingface, `~` and `$VARS` expanded), each value
    without CR, LF and surrounding whitespace. `checked` lists where it looked; `reason` says why there is
    none. The token itself is never part of a document.
    """

    def __init__(self) -> None:
        environ = os.environ  # read as huggingface_hub reads it, when the lookup is made
        self.token: str | None = None
        self.source: str | None = None
        self.reason: str | None = None
        # as huggingface_hub: `os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")`
        name = "HF_TOKEN" if environ.get("HF_TOKEN") else "HUGGING_FACE_HUB_TOKEN"
        self.checked: list[str] = ["env HF_TOKEN"] + ([] if name == "HF_TOKEN" else [f"env {name}"])
        self.token = _clean(environ.get(name))
        if self.token is not None:
            self.source = f"env {name}"
            return
        home = os.path.join(
            environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface"
        )
        hf_home = os.path.expandvars(os.path.expanduser(environ.get("HF_HOME", home)))
        path = os.path.expandvars(os.path.expanduser(environ.get("HF_TOKEN_PATH", os.path.join(hf_home, "token"))))
        self.checked.append(f"file {path}")
        try:
            with open(path, encoding="utf-8", errors="replace") as file:
                self.token = _clean(file.read())
        except FileNotFoundError:
            self.reason = f"no HF_TOKEN in the environment and no token file at {path}"
            return
        except OSError as exc:
            self.reason = f"token file {path} unreadable: {exc.strerror}"
            return
        if self.token is None:
            self.reason = f"token file {path} is empty"
        else:
            self.source = f"file {path}"


def hub_refused(status: Any, headers: Any) -> bool:
    """Whether an HTTP answer is the Hub refusing the token (the controller's AccessDenied, never retried): a 401
    or 403 that carries the Hub's own `X-Error-Code` or `X-Error-Message` header, as every refusal of the Hub
    does (huggingface_hub reads them). One without is not the Hub's word: a proxy, a CDN or a rate limit in
    front of it (a WAF's block is a 403) may answer so for a while, and another attempt may pass."""
    if status not in (401, 403) or headers is None:
        return False
    return any(headers.get(name) for name in ("X-Error-Code", "X-Error-Message"))


def _clean(token: str | None) -> str | None:
    """huggingface_hub's `_clean_token`: no CR or LF, no surrounding whitespace; empty is none."""
    if token is None:
        return None
    return token.replace("\r", "").replace("\n", "").strip() or None


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but send the token only to the host it was meant for (not to a CDN), and never
    in clear after a redirect from https to http (as `requests`, huggingface_hub's client, strips it)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old, to = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if new is not None and (to.netloc != old.netloc or (old.scheme == "https" and to.scheme != "https")):
            new.remove_header("Authorization")
        return new


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def request(
    url: str,
    *,
    token: str | None = None,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 10.0,
    follow_redirects: bool = True,
    watch: _Deadline | None = None,
) -> Any:
    """Open `url` (an http.client.HTTPResponse; urllib's HTTPError for an error status).

    A token goes only as `Authorization: Bearer`, and never to another host a redirect leads to. `timeout`
    bounds each read of the socket only; `watch` (see `exchange`) bounds the whole answer.
    """
    sent = urllib.request.Request(url, data=data, method=method, headers={"User-Agent": USER_AGENT, **(headers or {})})
    if token:
        if not token.isascii():  # http.client would raise UnicodeEncodeError (a ValueError) mid-request
            raise urllib.error.URLError(
                "the Hub token holds a character other than ASCII, which no HTTP header carries"
            )
        sent.add_header("Authorization", f"Bearer {token}")
    handlers: list[urllib.request.BaseHandler] = [_SameHostAuth() if follow_redirects else _NoRedirect()]
    if watch is not None:
        handlers += [_WatchedHTTP(watch)] + ([_WatchedHTTPS(watch)] if hasattr(http.client, "HTTPSConnection") else [])
    return urllib.request.build_opener(*handlers).open(sent, timeout=timeout)


class NoAnswer(Exception):
    """A server gave no whole answer: refused, reset, unreachable, or not done by the deadline (`late`)."""

    def __init__(self, message: str, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


class _Deadline:
    """Shuts the sockets of one request down when its deadline passes.

    A socket timeout bounds each read, not the answer: a server that sends a byte a second never trips it.
    Shutting the socket down ends whatever read is waiting (status line, headers, body), from another thread.
    """

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.001)

    def passed(self) -> bool:
        """Whether the deadline has passed, by the clock: the socket's own timeout (the same seconds, from a little
        later) may end a read before a loaded machine has woken the timer's thread."""
        return self.expired or time.monotonic() >= self.end

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    """Shut the connection under `sock` (TLS's too: its own shutdown would first drop the TLS state)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _watched(http_class: Any, watch: _Deadline) -> Any:
    """`http_class` whose connection waits at most what is left of `watch` and is shut down at its end."""

    class Watched(http_class):  # type: ignore[misc]
        def connect(self) -> None:
            self.timeout = watch.left()  # the deadline's rest, for the connect, and for each read after
            super().connect()
            watch.add(self.sock)

    return Watched


class _WatchedOpen:
    """do_open of urllib's HTTP and HTTPS handlers alike, with the connection class watched by the deadline."""

    def __init__(self, watch: _Deadline) -> None:
        super().__init__()
        self.watch = watch

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(_watched(http_class, self.watch), req, **kwargs)  # type: ignore[misc]


class _WatchedHTTP(_WatchedOpen, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPS(_WatchedOpen, urllib.request.HTTPSHandler):
    pass


def exchange(
    url: str,
    deadline: float,
    *,
    token: str | None = None,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    data: bytes | None = None,
    limit: int | None = None,
) -> tuple[int, bytes]:
    """(status, body: its first `limit` bytes, else all) of one request whose whole answer, redirects, status
    line, headers and body, comes within `deadline` seconds; an HTTP error status is an answer too.

    NoAnswer otherwise, naming the server: `late` when the deadline passed (however slowly it sent).
    """
    watch = _Deadline(deadline)
    late = False
    try:
        try:
            with request(
                url, token=token, method=method, headers=headers, data=data, timeout=deadline, watch=watch
            ) as response:
                status, body = response.status, _body(response, limit, url)
        except urllib.error.HTTPError as exc:
            status, body = exc.code, _body(exc, limit, url)
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, cut, unreadable
        late = watch.passed()
        if not late:
            raise NoAnswer(f"{url}: {getattr(exc, 'reason', exc)}") from None
    finally:
        watch.cancel()
    if late or watch.expired:
        server = urllib.parse.urlsplit(url).netloc
        raise NoAnswer(f"{server} did not answer {url} whole within {deadline:g} s", late=True)
    return status, body


#: The most bytes of one answer's body `exchange` keeps when no smaller `limit` is asked for (an eval's answer,
#: a completion with its token ids, is well under 1 MiB): a server's claimed length (a Content-Length of 10**15)
#: or endless chunks never decide what the host program holds in memory.
ANSWER_MAX_BYTES = 64 << 20
_PIECE_BYTES = 1 << 16


def _body(answer: Any, limit: int | None, url: str) -> bytes:
    """The first `limit` bytes of an answer's body, or all of it: read a piece at a time, so that neither a
    claimed length nor endless chunks make one read (or its buffer) unbounded. NoAnswer, naming the server,
    when a body asked for whole holds more than ANSWER_MAX_BYTES."""
    most = ANSWER_MAX_BYTES + 1 if limit is None else limit
    pieces: list[bytes] = []
    held = 0
    while held < most:
        piece = answer.read(min(_PIECE_BYTES, most - held))
        if not piece:
            _whole(answer, b"".join(pieces))
            break
        pieces.append(piece)
        held += len(piece)
    if held > ANSWER_MAX_BYTES:
        server = urllib.parse.urlsplit(url).netloc
        raise NoAnswer(
            f"{server} answered {url} with more than {ANSWER_MAX_BYTES >> 20} MiB, the most one answer may hold"
        )
    return b"".join(pieces)


def _whole(answer: Any, read: bytes) -> None:
    """IncompleteRead when the connection ended before the Content-Length an answer (or its HTTPError's) claimed:
    a read of a piece returns what came, where a read of all of it said that it was cut."""
    response = answer if isinstance(answer, http.client.HTTPResponse) else getattr(answer, "fp", None)
    missing = getattr(response, "length", None)
    if missing:
        raise http.client.IncompleteRead(read, missing)


class Retry(Exception):
    """This try failed in a way another try may fix."""


def with_retries(
    attempt: Callable[[], T], tries: int, pause_s: float, note: Callable[[str], None]
) -> tuple[T | None, Retry | None]:
    """(result, None) of the first of `tries` calls that raises no Retry, else (None, the last Retry).

    The pause doubles after each try; `note` hears each retry before its pause.
    """
    for number in range(1, tries + 1):
        try:
            return attempt(), None
        except Retry as exc:
            if number == tries:
                return None, exc
            pause = pause_s * 2 ** (number - 1)
            note(f"{exc}; try {number + 1} of {tries} in {pause:g}s")
            time.sleep(pause)
    raise ValueError("tries must be at least 1")


def listening_inodes(table: str, port: int) -> list[str]:
    """Socket inodes of /proc/net/tcp[6] rows LISTENing (state 0A) on `port`."""
    inodes = []
    for row in table.splitlines()[1:]:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            inodes.append(cols[9])
    return inodes


def port_holder(port: int) -> str:
    """Who listens on `port`, as `pid N (command line)`, or why that cannot be told (Linux: /proc).

    Shared by the programs that must refuse a busy port naming its holder: deploy (the server's port) and
    node_preflight (rank 0's dist-init port)."""
    inodes: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as handle:
            inodes += listening_inodes(handle.read(), port)
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for name in os.listdir("/proc") if wanted else []:
        if name.isdigit() and fd_links(name) & wanted:
            return f"pid {name} ({cmdline(int(name))[:200]})"
    return "a process this user cannot see"


def fd_links(pid: str) -> set[str]:
    """What the open files of a process point at (`socket:[123]`); fds that close meanwhile are skipped."""
    links = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


#: The most bytes of /metrics `scrape_metrics` reads: a real SGLang's whole exposition (every histogram, per
#: label set) is well under 1 MiB; a server past this is no SGLang to read counters from.
METRICS_MAX_BYTES = 8 << 20


def scrape_metrics(base_url: str, families: list[str], deadline: float, token: str | None = None) -> Document:
    """One GET of the server's Prometheus `/metrics`: its status and only the lines of `families` (their samples
    and `# TYPE` lines: the controller parses them, steps/server_metrics.py), or why there is no answer. The rest
    (hundreds of histogram lines) stays on the host."""
    url = base_url.rstrip("/") + "/metrics"
    scrape: Document = {"status": None, "error": None, "lines": []}
    try:
        status, body = exchange(url, deadline, token=token, limit=METRICS_MAX_BYTES + 1)
    except NoAnswer as exc:
        scrape["error"] = str(exc)
        return scrape
    scrape["status"] = status
    if len(body) > METRICS_MAX_BYTES:
        scrape["error"] = f"more than {METRICS_MAX_BYTES >> 20} MiB, the most a scrape reads"
    elif status == 200:
        names = set(families)
        for line in body.decode("utf-8", "replace").split("\n"):
            words = line.split()
            named = words[2] if line.startswith("#") and words[1:2] == ["TYPE"] and len(words) > 2 else None
            if named in names or re.split(r"[{\s]", line, maxsplit=1)[0] in names:
                scrape["lines"].append(line)
    return scrape
