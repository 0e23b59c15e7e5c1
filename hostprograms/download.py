"""Host side of the `download` step: the Hub's file list, what is on disk, and the plain-HTTP method.

Shipped with the kit (hostprograms/kit.py: a config file in, one result document out; messages for people go to
stderr), stdlib only. The config's `command` says what to do, `local_dir` where (`~` and `$var` expand here);
`known`, when given, holds the precheck's `repo`, `commit`, `gated` and `manifest`:

- `check` with `repo`, `repo_type`, `revision`, `include`, `exclude`: ask the Hub for the revision's commit
  and file list (its API, as huggingface_hub does: `/api/models/{repo}/revision/{rev}`, `/api/datasets/...` for
  a dataset, then the recursive tree of that commit), filter it with the include/exclude patterns the way
  huggingface_hub does, check that the files can be read with the token at hand (one HEAD of a file, as a
  gated repo lists its files to anyone but serves them only with a token), then compare with LOCAL_DIR and report free disk.
- `check` with `known`: the same comparison, offline: it runs after each method.
- `fetch` with `known`: the plain-HTTP method. Every file not yet complete is fetched
  from `{HF_ENDPOINT}/{repo}/resolve/{commit}/{path}` (`/datasets/{repo}/resolve/...`) into `{path}.incomplete`,
  resumed with a Range request from the bytes already there (after an interrupted run, or a transfer cut short
  now), and moved into place once it has the manifest's size.

A file is complete when it is at its path with the manifest's size. When every file is, `*.incomplete`
files left under `local_dir` (staging files of a killed client, which the Hub client never reuses: it
writes each attempt to a fresh uniquely named one) are removed, as they only hold disk.

The token is the one huggingface_hub would use (kit.HubToken: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, the token file);
it is sent only as an `Authorization` header, and not to another host a redirect leads to (kit.request).
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

from hostprograms import kit

MIN_PYTHON = (3, 9)
DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20
PART_SUFFIX = ".incomplete"
#: Tries per file in `fetch` (each one resumes where the last stopped) and the pause before the n-th retry.
FETCH_TRIES = 5
RETRY_PAUSE_S = 0.5
#: HTTP statuses worth another try; any other error status ends the file's download at once.
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


class HubError(Exception):
    """The Hub refused or failed a request; the message says what it answered, `short` in a few words.

    `failure_class` is "AccessDenied" when the Hub refused the token (401, 403, a gated repo, in the Hub's own
    words: `kit.hub_refused`): asking again with the same token is refused again, so the controller does not
    retry it (executor/errors.py).
    """

    def __init__(self, message: str, short: str | None = None, failure_class: str | None = None) -> None:
        super().__init__(message)
        self.short = short or message[:60]
        self.failure_class = failure_class


# ----------------------------------------------------------------------------- token and HTTP


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def timeout_s() -> float:
    """Socket timeout: the Hub client's own HF_HUB_DOWNLOAD_TIMEOUT (default 10 s)."""
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", "10"))
    except ValueError:
        return 10.0


def _request(url: str, token: str | None, method: str = "GET", headers: dict[str, str] | None = None) -> Any:
    return kit.request(
        url, token=token, method=method, headers=headers, timeout=timeout_s(), follow_redirects=method != "HEAD"
    )


def http_error(exc: urllib.error.HTTPError, url: str, token_source: str | None) -> HubError:
    """The Hub's answer in one line; when it is about the token, what to do comes first."""
    code = exc.headers.get("X-Error-Code") if exc.headers else None
    message = exc.headers.get("X-Error-Message") if exc.headers else None
    if not message:
        try:
            message = exc.read(300).decode("utf-8", "replace").strip()
        except OSError:
            message = ""
    short = f"HTTP {exc.code}{' ' + code if code else ''}"
    text = f"{short}: {message or exc.reason} ({url})"
    if kit.hub_refused(exc.code, exc.headers):
        if token_source is None:
            hint = "a token is needed and none reached the host (no HF_TOKEN in its environment, no token file)"
        elif exc.code == 403 or code == "GatedRepo":
            hint = f"the token from {token_source} has no access to this repo (were its terms accepted on the Hub?)"
        else:
            hint = f"the token from {token_source} was refused"
        text = f"{hint}; the Hub answered {text}"
        return HubError(text, short, "AccessDenied")
    return HubError(text, short)


def api_json(url: str, token: str | None, token_source: str | None) -> tuple[Any, Any]:
    """(decoded JSON, response headers) of an API GET; HubError with the Hub's answer otherwise."""
    try:
        with _request(url, token) as response:
            return json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        raise http_error(exc, url, token_source) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise HubError(f"cannot reach the Hub at {endpoint()}: {reason}") from None
    except ValueError as exc:
        raise HubError(f"the Hub answered {url} with something that is not JSON: {exc}") from None


# ----------------------------------------------------------------------------- the manifest


def selected(path: str, include: list[str], exclude: list[str]) -> bool:
    """huggingface_hub's allow/ignore matching (`filter_repo_objects`): case-sensitive fnmatch, `\\` read as
    `/`, a pattern ending in `/` means everything under that folder."""

    def norm(pattern: str) -> str:
        pattern = pattern.replace("\\", "/")
        return pattern + "*" if pattern.endswith("/") else pattern

    path = path.replace("\\", "/")
    if include and not any(fnmatch.fnmatchcase(path, norm(p)) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(path, norm(p)) for p in exclude)


def read_manifest(config: dict[str, Any], token: str | None, token_source: str | None) -> dict[str, Any]:
    """The commit the revision is at, whether the repo is gated, and its files (path, size) after filtering."""
    repo, revision = config["repo"], config["revision"]
    base = f"{endpoint()}/api/{repo_type(config)}s/{repo}"
    info, _ = api_json(f"{base}/revision/{urllib.parse.quote(revision, safe='')}", token, token_source)
    commit = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise HubError(f"the Hub's answer about {repo}@{revision} has no commit sha")
    files: list[dict[str, Any]] = []
    url: str | None = f"{base}/tree/{commit}?recursive=true"
    while url:
        page, headers = api_json(url, token, token_source)
        for entry in page if isinstance(page, list) else [page]:
            if file_entry(entry, f"{repo}@{revision}") and selected(
                entry["path"], config["include"], config["exclude"]
            ):
                files.append({"path": entry["path"], "size": entry["size"]})
        link = re.search(r'<([^>]+)>;\s*rel="next"', headers.get("Link") or "")
        url = link.group(1) if link else None
    files.sort(key=lambda f: f["path"])
    return {"commit": commit, "gated": info.get("gated") or False, "manifest": files}


def file_entry(entry: Any, where: str) -> bool:
    """Whether an entry of the Hub's file list is a file; HubError for one this program must not act on.

    The HTTP method writes `local_dir / path`: a path that is absolute or leaves the folder (`..`), from a
    broken or hostile Hub or mirror, would write elsewhere on the host; a size that is no count of bytes
    would end the program in a traceback instead of the Hub's error.
    """
    if not isinstance(entry, dict):
        raise HubError(f"the Hub's file list of {where}: {entry!r:.80} is not a file entry")
    if entry.get("type") != "file":
        return False
    path, size = entry.get("path"), entry.get("size")
    parts = path.replace("\\", "/").split("/") if isinstance(path, str) else [""]
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise HubError(f"the Hub's file list of {where}: {path!r:.80} is not a path inside the repo")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise HubError(f"the Hub's file list of {where}: {path!r:.80} has no size in bytes")
    return True


def check_access(repo: str, commit: str, path: str, token: str | None, token_source: str | None) -> None:
    """One HEAD of a file: a gated repo shows its file list to anyone but serves its files only with a token.
    `repo` is as the Hub's URLs name it (`repo_path`)."""
    url = resolve_url(repo, commit, path)
    try:
        _request(url, token, method="HEAD").close()
    except urllib.error.HTTPError as exc:
        if not 300 <= exc.code < 400:  # a redirect to the CDN is the normal answer for a large file
            raise http_error(exc, url, token_source) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise HubError(f"cannot reach the Hub at {endpoint()}: {getattr(exc, 'reason', exc)}") from None


def repo_type(config: dict[str, Any]) -> str:
    """The repo's type as huggingface_hub names it: "model" (the default) or "dataset"."""
    return str(config.get("repo_type") or "model")


def repo_path(config: dict[str, Any]) -> str:
    """The repo as the Hub's file URLs name it: `org/name` for a model, `datasets/org/name` for a dataset
    (huggingface_hub's REPO_TYPES_URL_PREFIXES)."""
    kind = repo_type(config)
    return config["repo"] if kind == "model" else f"{kind}s/{config['repo']}"


def resolve_url(repo: str, commit: str, path: str) -> str:
    """A file's URL; `repo` as `repo_path` gives it."""
    return f"{endpoint()}/{repo}/resolve/{commit}/{urllib.parse.quote(path)}"


# ----------------------------------------------------------------------------- the local folder


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def compare(local_dir: Path, manifest: list[dict[str, Any]]) -> dict[str, Any]:
    """Each manifest file's state in `local_dir`, and the `*.incomplete` files left there: removed once every
    file is complete (no download is using them then)."""
    complete_files = complete_bytes = partial_bytes = 0
    incomplete = []
    for entry in manifest:
        path, size = entry["path"], entry["size"]
        have, part = _size(local_dir / path), _size(local_dir / (path + PART_SUFFIX))
        if have == size:
            complete_files += 1
            complete_bytes += size
            continue
        if have is not None:
            state, on_disk = ("short" if have < size else "long"), have
        elif part is not None:
            state, on_disk = "partial", part
        else:
            state, on_disk = "missing", 0
        partial_bytes += min(on_disk, size)
        incomplete.append({"path": path, "size": size, "have": on_disk, "state": state})
    staging = {entry["path"] + PART_SUFFIX for entry in manifest}
    expected = {entry["path"] for entry in manifest} | staging
    leftovers = []
    if local_dir.is_dir():
        for root, _dirs, names in os.walk(local_dir):
            for name in names:
                relative = os.path.relpath(os.path.join(root, name), local_dir)
                if name.endswith(PART_SUFFIX) and relative not in expected:
                    leftovers.append(relative)
    removed = []
    if not incomplete:
        for relative in [*leftovers, *(p for p in staging if _size(local_dir / p) is not None)]:
            (local_dir / relative).unlink(missing_ok=True)
            removed.append(relative)
        leftovers = []
    return {
        "files": len(manifest),
        "bytes": sum(entry["size"] for entry in manifest),
        "complete_files": complete_files,
        "complete_bytes": complete_bytes,
        "partial_bytes": partial_bytes,
        "incomplete": incomplete,
        "leftovers": sorted(leftovers),
        "removed": sorted(removed),
    }


def disk(local_dir: Path) -> dict[str, Any]:
    """Free and total bytes of the file system `local_dir` is (or will be) on: statvfs of its nearest existing
    folder. Free is what an unprivileged writer gets (f_bavail)."""
    probe = local_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stat = os.statvfs(probe)
    return {
        "path": str(probe),
        "free_bytes": stat.f_bavail * stat.f_frsize,
        "total_bytes": stat.f_blocks * stat.f_frsize,
    }


def check(config: dict[str, Any], known: dict[str, Any] | None) -> dict[str, Any]:
    """The precheck (the file list from the Hub) or, given the precheck's list (`known`), the check after a
    method; both compare with `local_dir` and report free disk."""
    found = kit.HubToken()
    token, token_source = found.token, found.source
    local_dir = Path(config["local_dir"])
    report: dict[str, Any] = {"local_dir": str(local_dir), "endpoint": endpoint(), "token_source": token_source}
    report["hub_error"] = None
    if known is not None:
        report |= {"commit": known["commit"], "gated": known["gated"]}
        manifest = known["manifest"]
    else:
        try:
            listed = read_manifest(config, token, token_source)
        except HubError as exc:
            return report | {"hub_error": str(exc), "failure_class": exc.failure_class, "disk": disk(local_dir)}
        report |= listed
        manifest = listed["manifest"]
        if not manifest:
            report["hub_error"] = f"no file of {config['repo']}@{config['revision']} matches include/exclude"
    report |= compare(local_dir, manifest)
    if known is None and report["incomplete"] and report["hub_error"] is None:
        first = report["incomplete"][0]["path"]
        try:
            check_access(repo_path(config), report["commit"], first, token, token_source)
        except HubError as exc:
            report["hub_error"], report["failure_class"] = str(exc), exc.failure_class
    report["disk"] = disk(local_dir)
    return report


# ----------------------------------------------------------------------------- fetch (plain HTTP)


def fetch_once(url: str, part: Path, size: int, token: str | None, token_source: str | None) -> None:
    """One GET of the file's missing bytes (a Range request when `part` has some), appended to `part`."""
    have = _size(part) or 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        response = _request(url, token, headers=headers)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have == size:
            return
        if exc.code in TRANSIENT_STATUS:
            raise kit.Retry(f"HTTP {exc.code}") from None
        raise http_error(exc, url, token_source) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise kit.Retry(str(getattr(exc, "reason", exc))) from None
    with response:
        resumed = response.status == 206
        if resumed:
            match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range") or "")
            if not match or int(match.group(1)) != have:
                raise kit.Retry(f"the server answered Range bytes={have}- with {response.headers.get('Content-Range')}")
        try:  # unbuffered, and each block as it arrives: a killed process leaves every byte it received
            with part.open("ab" if resumed else "wb", buffering=0) as out:
                while block := response.read1(CHUNK):
                    out.write(block)
        except (OSError, http.client.HTTPException) as exc:
            raise kit.Retry(f"transfer broke off: {exc!r}") from None
    got = _size(part) or 0
    if got < size:
        raise kit.Retry(f"transfer ended after {got} of {size} bytes")


def fetch_file(repo: str, commit: str, local_dir: Path, path: str, size: int, token: kit.HubToken) -> dict[str, Any]:
    """Fetch one file (resuming its `.incomplete`, or a shorter file at its path); raises HubError when it can't."""
    final, part = local_dir / path, local_dir / (path + PART_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    have = _size(final)
    if have is not None and have < size and _size(part) is None:
        os.replace(final, part)  # a file cut short at its place (a copy that broke off): continue it
    if (_size(part) or 0) > size:
        part.unlink()  # longer than the file can be: not a prefix of it
    url = resolve_url(repo, commit, path)
    resumed_from = _size(part) or 0
    range_requests = 0

    def once() -> None:
        nonlocal range_requests
        range_requests += 1 if _size(part) else 0
        fetch_once(url, part, size, token.token, token.source)

    _, failed = kit.with_retries(
        once, FETCH_TRIES, RETRY_PAUSE_S, lambda note: print(f"{path}: {note}", file=sys.stderr, flush=True)
    )
    if failed is not None:
        raise HubError(f"{failed} (gave up after {FETCH_TRIES} tries)", str(failed)[:60])
    got = _size(part)
    if got != size:
        part.unlink(missing_ok=True)
        raise HubError(f"the server sent {got} bytes, the manifest says {size}", "wrong size")
    os.replace(part, final)
    return {"path": path, "bytes": size, "resumed_from": resumed_from, "range_requests": range_requests}


def fetch(config: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    token = kit.HubToken()
    local_dir = Path(config["local_dir"])
    fetched, failed = [], []
    for entry in known["manifest"]:
        if _size(local_dir / entry["path"]) == entry["size"]:
            continue
        try:
            fetched.append(
                fetch_file(repo_path(known), known["commit"], local_dir, entry["path"], entry["size"], token)
            )
        except (HubError, OSError) as exc:
            short = exc.short if isinstance(exc, HubError) else (exc.strerror or str(exc))
            failed.append({"path": entry["path"], "error": str(exc), "short": short})
            print(f"{entry['path']}: {exc}", file=sys.stderr, flush=True)
    if failed:  # last, for whoever reads the end of the output: what failed, in brief
        names = ", ".join(f"{f['path']} ({f['short']})" for f in failed[:3]) + (", ..." if len(failed) > 3 else "")
        print(f"{len(failed)} of {len(known['manifest'])} files not fetched: {names}", file=sys.stderr, flush=True)
    return {"fetched": fetched, "failed": failed}


def run(config: dict[str, Any]) -> dict[str, Any]:
    config["local_dir"] = kit.expand_path(config["local_dir"])
    if not os.path.isabs(config["local_dir"]):
        raise kit.Refused(f"local_dir {config['local_dir']!r} is not an absolute path")
    known = config.get("known")
    return fetch(config, known) if config["command"] == "fetch" and known is not None else check(config, known)


def main() -> int:
    return kit.main(run, failed=lambda document: bool(document.get("failed")))
