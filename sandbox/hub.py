"""Local Hugging Face Hub server: a TEST DOUBLE for the public Hub, which tests cannot reach.

The real `huggingface_hub` client (>= 1.0, its `hf` CLI included) and plain HTTP clients download from it
through `HF_ENDPOINT`. It answers what the client actually requests (read from huggingface_hub 2.4's
file_download.py, _snapshot_download.py, hf_api.py, utils/_http.py), with the real formats and headers:

- Model and dataset repositories alike (`Repo.repo_type`): a dataset's API paths start `/api/datasets/` instead
  of `/api/models/` and its files `/datasets/{repo}/resolve/` (huggingface_hub's `repo_type="dataset"`, `hf
  download --repo-type dataset`); a repo asked for under the other type's paths is not found, as on the Hub.
- `GET /api/models/{repo}[/revision/{rev}]` (`model_info`, `repo_info`): id, sha (40 hex), siblings;
  with `?blobs=true` (`files_metadata=True`) each sibling has size, blobId and, for LFS files,
  lfs {sha256, size, pointerSize}; `?expand=...` keeps only the named properties.
- `GET /api/models/{repo}/tree/{rev}[/{dir}]?recursive=true` (`list_repo_tree`, which snapshot_download
  calls): entries {type, path, size, oid, lfs {oid, size, pointerSize}}, paginated `page_size` entries at a
  time through a `Link: <...>; rel="next"` header, as the Hub does.
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}`: small files answer 200 with `ETag` = git blob sha1,
  `Content-Length`, `X-Repo-Commit`. LFS files answer `302` to a second listener standing in for the CDN
  (`cdn_endpoint`, another origin, so the client neither follows it on HEAD nor sends the token there) with
  `X-Linked-Etag` = sha256, `X-Linked-Size`, `X-Repo-Commit`: what the real Hub does. A plain HTTP client
  must follow that redirect (urllib does). No Xet headers are ever sent.
- Ranges (`bytes=a-b`, `bytes=a-`, `bytes=-n`) on resolve and CDN answers: `206` with `Content-Range`,
  `416` when unsatisfiable, so downloads can resume.
- Errors carry the Hub's `X-Error-Code`/`X-Error-Message` headers, which the client maps to its exceptions:
  unknown repo `RepoNotFound` (401 without a valid token, 404 with), unknown revision `RevisionNotFound`
  (404), unknown file `EntryNotFound` (404, with `X-Repo-Commit`), a wrong token 401 "Invalid credentials in
  Authorization header", a gated repo 401 `GatedRepo` (-> `GatedRepoError`) on `/resolve` unless the request
  carries `Authorization: Bearer <token>`; like the Hub, a gated repo's info and tree stay public.

Use:

    with HubServer() as hub:                      # repos from sandbox.repos.default_repos()
        env = hub.client_env(tmp_path / "hf-home", token=True)  # env for a client subprocess
        hub.faults.fail(TARGET_ID, "config.json", status=503, times=2)
        hub.requests.count(TARGET_ID, "config.json", method="HEAD")

`HubServer`: `.endpoint` ("http://127.0.0.1:PORT", the HF_ENDPOINT), `.cdn_endpoint`, `.token` (a fresh
hf_... token), `.repos` ({repo_id: sandbox.repos.Repo}), `.faults` (`Faults`), `.requests` (`RequestLog`),
`.page_size`, `.client_env(hf_home, token=False)`, `.reset()` (faults and log), `start()`/`stop()`.

`Faults` (thread-safe, settable while serving). A fault on a file matches that file's resolve and CDN
requests; `path=None` matches every request about the repo, API ones included. Counted faults fire on the
next `times` matching requests, then the server behaves again:

- `fail(repo, path=None, status=500, times=1, method=None)`: answer `status` (5xx), to `method` only if
  given. The client retries a 5xx on the metadata HEAD (the first retry at once, then 1 s, 2 s, 4 s, 8 s,
  8 s apart) and on tree pages, but not on `repo_info` nor on the file GET: a 5xx there fails the call
  (`fail(repo, path, method="GET")` makes one download attempt fail, the next one succeed).
- `stall(repo, path, after_bytes=None, times=1, hold_s=60)`: on a GET, send headers and `after_bytes`
  (default half) of the body, then hang for `hold_s` or until the server stops, then close.
- `truncate(repo, path, after_bytes=None, times=1)`: on a GET, send the full `Content-Length` but close after
  `after_bytes` (default half) of the body.
- `corrupt(repo, path, times=1)`: on a GET, serve the content with its last byte flipped: same size, other
  sha256 (for safetensors the header stays valid: only hashing notices).
- `gate(repo, gated=True)`: the repo becomes gated (model_info says `gated: "manual"`); `is_gated(repo)`.
- `reset()`: all off.

`RequestLog`: every request as a `Request` (method, kind "api"/"resolve"/"cdn", repo_id, path, range, status,
authorized); `entries(repo, path=None, method=None, kind=None)`, `count(...)`, `clear()`.

What the real client does with these faults (huggingface_hub 2.4): a GET cut short (truncate) or timing out
(stall, after HF_HUB_DOWNLOAD_TIMEOUT) is retried in the same process after 1 s, up to 5 times without
progress, with `Range: bytes=N-` where N counts only whole 10 MiB chunks it wrote (so files under 10 MiB,
all of ours, are fetched again from byte 0, without Range); each process downloads to a fresh uniquely
named `*.incomplete` file, deleted on failure, so a new process starts over. A 5xx on the transfer GET is
not retried. The client checks sizes only, never sha256: corrupted bytes download "fine". A `--local-dir`
download leaves the client's bookkeeping in `DIR/.cache/huggingface/` (not repo files). Clients must set
HF_HUB_DISABLE_UPDATE_CHECK=1 or the `hf` CLI asks pypi.org for its latest version; `client_env` sets it,
with HF_HUB_DISABLE_XET and HF_HUB_DISABLE_TELEMETRY.
"""

from __future__ import annotations

import hashlib
import http
import json
import re
import secrets
import string
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from sandbox.repos import Repo, RepoFile, default_repos

Kind = Literal["api", "resolve", "cdn"]
# Two loopback addresses: like the real CDN, ours is another host, not just another port (huggingface_hub
# follows a HEAD redirect that stays on the same host name, whatever the port, and then misses X-Repo-Commit).
HUB_ADDRESS, CDN_ADDRESS = "127.0.0.1", "127.0.0.2"
LAST_MODIFIED = "2026-04-20T12:00:00.000Z"

# `type`: "models" or "datasets" in the API's paths, "datasets" or nothing (a model) before a resolve path
_INFO = re.compile(r"/api/(?P<type>models|datasets)/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?")
_TREE = re.compile(r"/api/(?P<type>models|datasets)/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?")
_RESOLVE = re.compile(r"/(?:(?P<type>datasets)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")
_CDN = re.compile(r"/repos/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@dataclass(frozen=True)
class Request:
    """One request as the server answered it."""

    method: str
    kind: Kind
    repo_id: str | None
    path: str | None
    range: str | None
    status: int
    authorized: bool


class RequestLog:
    """Every request the server answered, to assert retries and resumes (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Request] = []

    def record(self, request: Request) -> None:
        with self._lock:
            self._entries.append(request)

    def entries(
        self,
        repo_id: str | None = None,
        path: str | None = None,
        *,
        method: str | None = None,
        kind: Kind | None = None,
    ) -> list[Request]:
        with self._lock:
            return [
                r
                for r in self._entries
                if (repo_id is None or r.repo_id == repo_id)
                and (path is None or r.path == path)
                and (method is None or r.method == method)
                and (kind is None or r.kind == kind)
            ]

    def count(
        self,
        repo_id: str | None = None,
        path: str | None = None,
        *,
        method: str | None = None,
        kind: Kind | None = None,
    ) -> int:
        return len(self.entries(repo_id, path, method=method, kind=kind))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


FaultKind = Literal["fail", "stall", "truncate", "corrupt"]


@dataclass
class Fault:
    """One armed fault: fires on the next `times` matching requests."""

    kind: FaultKind
    repo_id: str
    path: str | None
    times: int
    status: int = 500
    after_bytes: int | None = None
    hold_s: float = 60.0
    method: str | None = None

    def matches(self, repo_id: str, path: str | None, method: str) -> bool:
        return (
            self.repo_id == repo_id
            and (self.path is None or self.path == path)
            and (self.method is None or self.method == method)
        )


class Faults:
    """Fault switches of the Hub test double, settable at runtime from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[Fault] = []
        self._gated: set[str] = set()

    def fail(
        self, repo_id: str, path: str | None = None, *, status: int = 500, times: int = 1, method: str | None = None
    ) -> None:
        """Answer HTTP `status` to the next `times` requests about the file (or the whole repo), of `method`
        only if given ("HEAD": the metadata call; "GET": the transfer, which the client does not retry)."""
        self._arm(Fault("fail", repo_id, path, times, status=status, method=method))

    def stall(
        self, repo_id: str, path: str, *, after_bytes: int | None = None, times: int = 1, hold_s: float = 60.0
    ) -> None:
        """Send headers and part of the body of the next `times` GETs, then hang (bounded by `hold_s`)."""
        self._arm(Fault("stall", repo_id, path, times, after_bytes=after_bytes, hold_s=hold_s))

    def truncate(self, repo_id: str, path: str, *, after_bytes: int | None = None, times: int = 1) -> None:
        """Close the next `times` GETs after part of the body, the full Content-Length announced."""
        self._arm(Fault("truncate", repo_id, path, times, after_bytes=after_bytes))

    def corrupt(self, repo_id: str, path: str, *, times: int = 1) -> None:
        """Serve the next `times` GETs with the last byte flipped: same size, wrong sha256."""
        self._arm(Fault("corrupt", repo_id, path, times))

    def gate(self, repo_id: str, gated: bool = True) -> None:
        """Make the repo gated: its files answer 401 GatedRepo to requests without the server's token."""
        with self._lock:
            (self._gated.add if gated else self._gated.discard)(repo_id)

    def is_gated(self, repo_id: str) -> bool:
        with self._lock:
            return repo_id in self._gated

    def reset(self) -> None:
        with self._lock:
            self._armed.clear()
            self._gated.clear()

    def take(self, kinds: tuple[FaultKind, ...], repo_id: str, path: str | None, method: str) -> Fault | None:
        """The first armed fault of `kinds` matching the request, used up by one."""
        with self._lock:
            for fault in self._armed:
                if fault.kind in kinds and fault.matches(repo_id, path, method):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._armed.remove(fault)
                    return fault
        return None

    def _arm(self, fault: Fault) -> None:
        if fault.times < 1:
            raise ValueError(f"times must be >= 1, got {fault.times}")
        with self._lock:
            self._armed.append(fault)


@dataclass(frozen=True)
class _Call:
    """A request, parsed: which endpoint, repo and file, and whether it carries the server's token."""

    method: str
    kind: Kind
    match: re.Match[str] | None
    repo_id: str | None
    path: str | None
    query: dict[str, list[str]]
    bearer: str | None
    authorized: bool
    range: str | None
    repo_type: str = "model"  # what the path asks for: a repo of another type is not found, as on the Hub


@dataclass
class Response:
    """What the handler writes: status, headers, body, and the body fault to apply while writing it."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    fault: Fault | None = None


def _error(status: int, code: str | None, message: str, **headers: str) -> Response:
    hub_headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
    body = json.dumps({"error": message}).encode()
    return Response(status, {**hub_headers, **headers, "Content-Type": "application/json"}, body)


def _byte_range(header: str | None, size: int) -> tuple[int, int] | Response | None:
    """(start, end exclusive) of a single-range header; a 416 if unsatisfiable; None to send it all."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return None  # absent or not understood: RFC 9110 says serve the whole representation
    first, last = match.groups()
    if first and last and int(last) < int(first):
        return None  # an invalid range-spec is ignored, as RFC 9110 allows
    if first == "":
        start, end = max(size - int(last), 0), size
    else:
        start, end = int(first), min(int(last) + 1, size) if last else size
    if start >= end:
        return Response(416, {"Content-Range": f"bytes */{size}"})
    return start, end


def _tree_entry(path: str, repo: Repo) -> dict[str, Any]:
    if path in repo.files:
        f = repo.files[path]
        entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
        return entry
    tree_id = hashlib.sha1(f"{repo.sha}:{path}".encode()).hexdigest()
    return {"type": "directory", "oid": tree_id, "size": 0, "path": path}


class HubServer:
    """The local Hub test double: two loopback listeners (Hub and CDN) over one set of repos and faults."""

    def __init__(self, repos: Mapping[str, Repo] | None = None, token: str | None = None) -> None:
        self.repos: dict[str, Repo] = dict(repos if repos is not None else default_repos())
        self.token = token or "hf_" + "".join(secrets.choice(string.ascii_letters) for _ in range(34))
        self.faults = Faults()
        self.requests = RequestLog()
        self.page_size = 1000  # the Hub's page size for tree listings
        self.stopping = threading.Event()
        self._listeners = [_Listener(self, "hub"), _Listener(self, "cdn")]
        self.endpoint, self.cdn_endpoint = (f"http://{lst.server_name_and_port}" for lst in self._listeners)
        self._threads: list[threading.Thread] = []

    def start(self) -> HubServer:
        for listener in self._listeners:
            thread = threading.Thread(
                target=listener.serve_forever, args=(0.05,), name=f"hub-{listener.role}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopping.set()  # releases stalled transfers
        for listener in self._listeners:
            listener.shutdown()
            listener.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Faults off, request log empty: a clean server for the next test."""
        self.faults.reset()
        self.requests.clear()

    def client_env(self, hf_home: Path, *, token: bool = False) -> dict[str, str]:
        """Environment for a huggingface_hub client (Python or `hf`) that talks to this server only."""
        env = {
            "HF_ENDPOINT": self.endpoint,
            "HF_HOME": str(hf_home),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        }
        if token:
            env["HF_TOKEN"] = self.token
        return env

    # --- answering -------------------------------------------------------------------------------------------

    def answer(self, method: str, role: str, target: str, authorization: str | None, range_: str | None) -> Response:
        """The response to one request, recorded in the request log."""
        call = self._parse(method, role, target, authorization, range_)
        response = self._answer(call)
        self.requests.record(
            Request(method, call.kind, call.repo_id, call.path, range_, response.status, call.authorized)
        )
        return response

    def _parse(self, method: str, role: str, target: str, authorization: str | None, range_: str | None) -> _Call:
        url = urlsplit(target)
        bearer = authorization.removeprefix("Bearer ").strip() if authorization else None
        authorized = bearer is not None and secrets.compare_digest(bearer.encode(), self.token.encode())
        kind: Kind
        if role == "cdn":
            kind, match = "cdn", _CDN.fullmatch(url.path)
        elif match := _RESOLVE.fullmatch(url.path):
            kind = "resolve"
        else:
            kind, match = "api", _TREE.fullmatch(url.path) or _INFO.fullmatch(url.path)
        repo_id = unquote(match["repo"]) if match else None
        path = unquote(match["path"]) if match and kind == "resolve" else None
        if match and kind == "cdn" and repo_id in self.repos:
            path = next((f.path for f in self.repos[repo_id].lfs_files if f.sha256 == match["sha"]), None)
        repo_type = "dataset" if match and kind != "cdn" and match["type"] == "datasets" else "model"
        query = parse_qs(url.query)
        return _Call(method, kind, match, repo_id, path, query, bearer, authorized, range_, repo_type)

    def _answer(self, call: _Call) -> Response:
        method, kind, match, repo_id, path = call.method, call.kind, call.match, call.repo_id, call.path
        if match is None or repo_id is None:
            return _error(404, None, "Sorry, we can't find the page you are looking for.")
        if fault := self.faults.take(("fail",), repo_id, path, method):
            phrase = http.HTTPStatus(fault.status).phrase
            return Response(fault.status, {"Content-Type": "text/plain"}, phrase.encode())
        if kind == "cdn":
            if repo_id not in self.repos or path is None:
                return Response(404, {"Content-Type": "text/plain"}, b"NoSuchKey")
            return self._content(method, self.repos[repo_id], self.repos[repo_id].files[path], call.range, cdn=True)
        if call.bearer is not None and not call.authorized:
            return _error(401, None, "Invalid credentials in Authorization header")
        repo = self.repos.get(repo_id)
        if repo is None or repo.repo_type != call.repo_type:
            return _error(404 if call.authorized else 401, "RepoNotFound", "Repository not found")
        rev = unquote(match["rev"] or "main")
        if rev not in ("main", repo.sha):
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if kind == "api":
            tree = "/tree/" in match.group(0)
            return self._tree(repo, rev, match, call.query) if tree else self._info(repo, call.query)
        assert path is not None
        if self.faults.is_gated(repo_id) and not call.authorized:
            message = (
                f"Access to {repo.repo_type} {repo_id} is restricted. You must have access to it and be authenticated "
                "to access it. Please log in."
            )
            return _error(401, "GatedRepo", message)
        if path not in repo.files:
            return _error(404, "EntryNotFound", f'{path} does not exist on "{rev}"', **{"X-Repo-Commit": repo.sha})
        f = repo.files[path]
        if f.lfs:
            location = f"{self.cdn_endpoint}/repos/{repo_id}/{f.sha256}"
            return Response(
                302,
                {
                    "Location": location,
                    "X-Repo-Commit": repo.sha,
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(f.size),
                    "ETag": f'"{f.blob_id}"',
                    "Content-Type": "text/plain; charset=utf-8",
                },
                f"Found. Redirecting to {location}".encode(),
            )
        return self._content(method, repo, f, call.range, cdn=False)

    def _content(self, method: str, repo: Repo, f: RepoFile, range_: str | None, *, cdn: bool) -> Response:
        """A file's bytes (or a range of them), with the body faults armed for it."""
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", "ETag": f'"{f.etag}"'}
        if cdn:
            headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(f.path)}; filename=\"{f.path}\";"
        else:
            headers["X-Repo-Commit"] = repo.sha
        span = _byte_range(range_, f.size)
        if isinstance(span, Response):
            return span
        content, fault = f.content, None
        if method == "GET":
            if self.faults.take(("corrupt",), repo.repo_id, f.path, method):
                content = content[:-1] + bytes([content[-1] ^ 0xFF])
            fault = self.faults.take(("stall", "truncate"), repo.repo_id, f.path, method)
        if span is None:
            return Response(200, headers, content, fault)
        start, end = span
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        return Response(206, headers, content[start:end], fault)

    def _info(self, repo: Repo, query: dict[str, list[str]]) -> Response:
        blobs = query.get("blobs", ["false"])[0].lower() in ("true", "1")
        siblings = []
        for f in repo.files.values():
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling |= {"size": f.size, "blobId": f.blob_id}
                if f.lfs:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
            siblings.append(sibling)
        gated = "manual" if self.faults.is_gated(repo.repo_id) else False
        doc: dict[str, Any] = {
            "_id": repo.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": repo.sha,
            "lastModified": LAST_MODIFIED,
            "createdAt": LAST_MODIFIED,
            "private": False,
            "gated": gated,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "transformers",
            "tags": ["transformers", "safetensors"],
            "pipeline_tag": "text-generation",
            "siblings": siblings,
            "usedStorage": repo.total_size,
        }
        if repo.repo_type != "model":  # a dataset's info has no model card fields
            for key in ("modelId", "library_name", "pipeline_tag"):
                del doc[key]
            doc["tags"] = []
        if expand := query.get("expand"):
            if unknown := sorted(set(expand) - doc.keys()):
                return _error(400, None, f"Invalid expand value(s): {', '.join(unknown)}")
            doc = {key: doc[key] for key in ("_id", "id", *expand)}
        return Response(200, {"Content-Type": "application/json"}, json.dumps(doc).encode())

    def _tree(self, repo: Repo, rev: str, match: re.Match[str], query: dict[str, list[str]]) -> Response:
        base = unquote(match["path"] or "").strip("/")
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = f"{base}/" if base else ""
        paths: set[str] = set()
        for file_path in repo.files:
            if not file_path.startswith(prefix):
                continue
            parts = file_path[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            paths.update(prefix + "/".join(parts[:i]) for i in range(1, min(depth, len(parts)) + 1))
        if base and not paths:
            return _error(404, "EntryNotFound", f'{base} does not exist on "{rev}"')
        entries = [_tree_entry(p, repo) for p in sorted(paths)]
        cursor = int(query.get("cursor", ["0"])[0])
        page = entries[cursor : cursor + self.page_size]
        headers = {"Content-Type": "application/json"}
        if cursor + self.page_size < len(entries):
            params = urlencode({"recursive": str(recursive).lower(), "cursor": cursor + self.page_size})
            headers["Link"] = f'<{self.endpoint}{match.group(0)}?{params}>; rel="next"'
        return Response(200, headers, json.dumps(page).encode())


class _Listener(ThreadingHTTPServer):
    """One loopback socket of the test double; `role` is "hub" or "cdn"."""

    daemon_threads = True

    def __init__(self, hub: HubServer, role: str) -> None:
        self.hub, self.role = hub, role
        address = CDN_ADDRESS if role == "cdn" else HUB_ADDRESS
        super().__init__((address, 0), _Handler)
        self.server_name_and_port = f"{address}:{self.server_port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections end on their own
    server: _Listener

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def _serve(self, *, send_body: bool) -> None:
        hub = self.server.hub
        response = hub.answer(
            self.command, self.server.role, self.path, self.headers.get("Authorization"), self.headers.get("Range")
        )
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if not send_body:
            return
        try:
            self._write_body(response, hub.stopping)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: nothing left to say

    def _write_body(self, response: Response, stopping: threading.Event) -> None:
        fault = response.fault
        if fault is None:
            self.wfile.write(response.body)
            return
        sent = fault.after_bytes if fault.after_bytes is not None else len(response.body) // 2
        self.wfile.write(response.body[:sent])
        self.wfile.flush()
        if fault.kind == "stall":
            stopping.wait(fault.hold_s)
        self.close_connection = True  # the rest of the announced Content-Length never comes

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the RequestLog keeps what tests need."""
