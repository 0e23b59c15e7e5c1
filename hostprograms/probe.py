"""The `probe` step's program ON THE HOST: stdlib only, Python >= 3.8 (MIN_PYTHON).

The probe step ships this program with the kit and runs it with the host's `python3`; the config's
`role` says which of its three roles it plays:

- `host` (the first run): the host's facts (OS, CPUs, memory, disks, GPUs, HF token, models); for
  the Python facts it runs itself again with the given interpreter:
- `interpreter`: that interpreter's version, package versions (importlib.metadata) and the
  capabilities of its SGLang, read from SGLang's files (ast, file existence) without importing it:
  `import sglang` needs torch, and a probe must not;
- `hub`: sizes of Hub repos (a model's, or a dataset's: `datasets/org/name`), and whether the token may read
  their files (`readable`), asked with that interpreter's huggingface_hub (HF_ENDPOINT and the token come from
  the environment, as for any client); the file patterns of `hub_files` (what the runbook's downloads of a repo
  include) that match none of its files (`missing`).

A fact it cannot determine is null with a reason in the section's `unknown` map, never an empty
answer that looks like "none". The Hugging Face token's value is never printed, only its source.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from typing import Any

from hostprograms import kit

MIN_PYTHON = (3, 8)
GPU_QUERY = "index,name,uuid,memory.total,memory.used,memory.free,driver_version,compute_cap,pci.bus_id"
_NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "")
_UNSET_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")

# Where an SGLang release keeps what the probe reads, relative to the `sglang` package folder.
# Newer releases first; older ones kept the choice lists in server_args.py.
CHOICES_FILES = ("srt/arg_groups/choices.py", "srt/server_args.py")
SPEC_INFO_FILE = "srt/speculative/spec_info.py"
# The launch parser's option strings: fields declared `name: A[type, "help" | Arg(...)]` (0.5.23 builds its
# parser from them), then the `parser.add_argument("--flag", ...)` calls of server_args.py (all of them before).
FIELDS_DIR = "srt/arg_groups/fields"
SERVER_ARGS_FILE = "srt/server_args.py"
MODELS_DIR = "srt/models"
KIMI_K25_FILE = "kimi_k25.py"
KIMI_ARCH = "KimiK25ForConditionalGeneration"
ATTENTION_DIR = "srt/layers/attention"
#: SGLang's serving benchmark, (module, its file), preferred first: 0.5.23 moved it to sglang.benchmark.serving and
#: deprecated sglang.bench_serving (a FutureWarning), the only one of older releases (steps/bench_entry.py)
BENCH_ENTRY_POINTS = (
    ("sglang.benchmark.serving", "benchmark/serving.py"),
    ("sglang.bench_serving", "bench_serving.py"),
)


# ---------------------------------------------------------------- parsers (pure)


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines of os-release(5); values may be quoted with shell quoting."""
    result = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if line.split("=", 1)[1][0] == '"':
                value = re.sub(r'\\([\\$"`])', r"\1", value)
        result[key] = value
    return result


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes by name (`MemTotal: 131981020 kB`)."""
    result = {}
    for line in text.splitlines():
        match = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?\s*$", line)
        if match:
            factor = 1024 if line.rstrip().endswith("kB") else 1
            result[match.group(1)] = int(match.group(2)) * factor
    return result


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in _NOT_AVAILABLE else text


def _int(text: str) -> int | None:
    value = _value(text)
    return int(value) if value is not None and value.isdigit() else None


def parse_gpu_query(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        if len(row) != len(GPU_QUERY.split(",")):
            raise ValueError(f"expected {len(GPU_QUERY.split(','))} fields, got {len(row)}: {row!r}")
        index, name, uuid, total, used, free, driver, cap, bus = row
        gpus.append(
            {
                "index": _int(index),
                "name": _value(name),
                "uuid": _value(uuid),
                "memory_total_mib": _int(total),
                "memory_used_mib": _int(used),
                "memory_free_mib": _int(free),
                "driver_version": _value(driver),
                "compute_capability": _value(cap),
                "pci_bus_id": _value(bus),
            }
        )
    return gpus


def parse_cuda_version(table: str) -> str | None:
    """The driver's CUDA version from the header of plain `nvidia-smi`."""
    match = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", table)
    return match.group(1) if match else None


def literal_lists(source: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    """Module-level `NAME = [...]` literal lists of strings, by name (ast; nothing is executed)."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in names and node.value is not None:
                try:
                    items = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(items, (list, tuple)) and all(isinstance(item, str) for item in items):
                    found[target.id] = list(items)
    return found


def class_attributes(source: str, class_name: str) -> list[str] | None:
    """Names assigned in the body of a module-level class (enum members), None if no such class."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names = []
            for item in node.body:
                if isinstance(item, ast.Assign):
                    names += [t.id for t in item.targets if isinstance(t, ast.Name)]
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.append(item.target.id)
            return names
    return None


def _keywords(node: ast.expr) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in node.keywords if k.arg} if isinstance(node, ast.Call) else {}


def field_options(source: str) -> list[list[str]]:
    """The option strings of each `name: A[type, meta]` field of the module's classes, as SGLang's
    add_cli_args_from_dataclass makes them: `cli_name` or `--name-with-dashes`, then `aliases`; none for
    `no_cli=True`. Only literals are read (ast)."""
    found = []
    for cls in ast.parse(source).body:
        for node in cls.body if isinstance(cls, ast.ClassDef) else []:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            ann = node.annotation
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
                continue
            inner = ann.slice
            if type(inner).__name__ == "Index":  # Python 3.8 wraps a subscript's slice in ast.Index
                inner = getattr(inner, "value", inner)
            if not isinstance(inner, ast.Tuple) or len(inner.elts) < 2:
                continue
            keywords = _keywords(inner.elts[1])
            try:
                if "no_cli" in keywords and ast.literal_eval(keywords["no_cli"]) is True:
                    continue
                name = ast.literal_eval(keywords["cli_name"]) if "cli_name" in keywords else None
                aliases = ast.literal_eval(keywords["aliases"]) if "aliases" in keywords else []
            except ValueError:
                continue
            group = [name or "--" + node.target.id.replace("_", "-"), *[str(a) for a in aliases]]
            found.append(group)
            if _negatable(keywords.get("action")):
                found.append(negations(group))
    return found


def _negatable(action: ast.expr | None) -> bool:
    """Whether an Arg's `action=` is argparse.BooleanOptionalAction, which adds a `--no-FLAG` per `--FLAG`."""
    name = action.attr if isinstance(action, ast.Attribute) else action.id if isinstance(action, ast.Name) else None
    return name == "BooleanOptionalAction"


def negations(group: list[str]) -> list[str]:
    """The `--no-` option strings BooleanOptionalAction adds for an argument's `group`: listed as an argument of
    their own, since they set the opposite value (an abbreviation of one is launched as it, never as the flag)."""
    return ["--no-" + option[2:] for option in group if option.startswith("--")]


def argument_options(source: str) -> list[list[str]]:
    """The option strings of each `*.add_argument("--flag", "--alias", ...)` call with literal names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if names and all(name.startswith("-") for name in names):
                found.append(names)
                if _negatable(_keywords(node).get("action")):
                    found.append(negations(names))
    return found


def model_classes(source: str) -> tuple[list[str], list[str]]:
    """(classes defined, names in `EntryClass`) of an SGLang model file."""
    tree = ast.parse(source)
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    entry: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            entry += [v.id for v in values if isinstance(v, ast.Name)]
    return classes, entry


# ---------------------------------------------------------------- helpers


def expand(path: str) -> tuple[str | None, str | None]:
    """(absolute path, None) after expanding $VARS and ~, or (None, why it cannot be expanded)."""
    expanded = os.path.expandvars(path)
    unset = _UNSET_VAR.search(expanded)
    if unset:
        return None, f"{path!r}: variable ${unset.group(1)} is not set on the host"
    return os.path.abspath(os.path.expanduser(expanded)), None


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr) of a command; never raises for its failure."""
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout:g} s"
    except OSError as exc:
        return 127, "", f"{argv[0]}: {exc.strerror}"
    return done.returncode, done.stdout, done.stderr


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


# ---------------------------------------------------------------- host facts


def os_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "id": None,
        "version_id": None,
        "pretty_name": None,
        "unknown": {},
    }
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            release = parse_os_release(read_text(path))
        except OSError:
            continue
        facts.update(id=release.get("ID"), version_id=release.get("VERSION_ID"), pretty_name=release.get("PRETTY_NAME"))
        break
    else:
        facts["unknown"] = dict.fromkeys(("id", "version_id", "pretty_name"), "no /etc/os-release on the host")
    return facts


def cpu_facts() -> dict[str, Any]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"count": os.cpu_count(), "usable": usable}


def memory_facts() -> dict[str, Any]:
    try:
        info = parse_meminfo(read_text("/proc/meminfo"))
    except OSError as exc:
        reason = f"/proc/meminfo: {exc.strerror}"
        return {
            "total_bytes": None,
            "available_bytes": None,
            "unknown": {"total_bytes": reason, "available_bytes": reason},
        }
    unknown = {
        key: f"/proc/meminfo has no {name}"
        for key, name in (("total_bytes", "MemTotal"), ("available_bytes", "MemAvailable"))
        if name not in info
    }
    return {"total_bytes": info.get("MemTotal"), "available_bytes": info.get("MemAvailable"), "unknown": unknown}


def _mount_point(path: str) -> str:
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def disk_facts(given: str) -> dict[str, Any]:
    """Size, used and available bytes (as df counts them) of the filesystem that holds `given`.

    A path that does not exist yet (a models dir before the first download) is measured at its
    nearest existing parent, named in `measured_at`.
    """
    facts: dict[str, Any] = {"path": given, "resolved": None, "exists": None, "measured_at": None, "mount_point": None}
    facts.update(size_bytes=None, used_bytes=None, avail_bytes=None, unknown_reason=None)
    resolved, problem = expand(given)
    if resolved is None:
        facts["unknown_reason"] = problem
        return facts
    at = resolved
    while not os.path.exists(at):
        at = os.path.dirname(at)
    try:
        st = os.statvfs(at)
    except OSError as exc:
        facts.update(resolved=resolved, exists=os.path.exists(resolved), unknown_reason=f"statvfs {at}: {exc.strerror}")
        return facts
    facts.update(resolved=resolved, exists=os.path.exists(resolved), measured_at=at, mount_point=_mount_point(at))
    facts.update(
        size_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        avail_bytes=st.f_bavail * st.f_frsize,
    )
    return facts


def gpu_facts(timeout: float) -> dict[str, Any]:
    """GPUs from `nvidia-smi --query-gpu`, the driver's CUDA version from plain `nvidia-smi`."""
    exe = shutil.which("nvidia-smi")
    facts: dict[str, Any] = {"nvidia_smi": exe, "gpus": [], "reason": None, "unknown": {}}
    facts.update(driver_version=None, cuda_version=None)

    def no_gpus(reason: str, versions_unknown: str) -> dict[str, Any]:
        facts.update(reason=reason, unknown=dict.fromkeys(("driver_version", "cuda_version"), versions_unknown))
        return facts

    if exe is None:
        return no_gpus("nvidia-smi not found on PATH (" + os.environ.get("PATH", "") + ")", "nvidia-smi not found")
    code, out, err = run([exe, "--query-gpu=" + GPU_QUERY, "--format=csv,noheader,nounits"], timeout)
    if code != 0:
        return no_gpus(
            f"nvidia-smi --query-gpu failed (exit {code}): {kit.tail(out + err) or '(no output)'}", "nvidia-smi failed"
        )
    try:
        facts["gpus"] = parse_gpu_query(out)
    except ValueError as exc:
        return no_gpus(f"nvidia-smi --query-gpu printed something unexpected: {exc}", "nvidia-smi not understood")
    if not facts["gpus"]:
        return no_gpus("nvidia-smi listed no GPUs", "nvidia-smi listed no GPUs")
    drivers = sorted({str(g["driver_version"]) for g in facts["gpus"] if g["driver_version"]})
    if len(drivers) == 1:
        facts["driver_version"] = drivers[0]
    else:
        facts["unknown"]["driver_version"] = f"the GPUs report driver versions {drivers}"
    code, out, err = run([exe], timeout)
    facts["cuda_version"] = parse_cuda_version(out) if code == 0 else None
    if facts["cuda_version"] is None:
        said = kit.tail(out + err) or "(no output)"
        facts["unknown"]["cuda_version"] = f"no 'CUDA Version' in plain nvidia-smi (exit {code}): {said}"
    return facts


def token_facts() -> dict[str, Any]:
    """Whether huggingface_hub on the host would find a token, and where: never the token itself."""
    found = kit.HubToken()
    return {
        "available": found.token is not None,
        "source": found.source,
        "checked": found.checked,
        "reason": found.reason,
    }


def _tree_size(root: str) -> tuple[int, int, int]:
    """(bytes, files, *.incomplete files) under a folder; symlinks count as themselves, not targets."""
    size = files = incomplete = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            size += 0 if stat.S_ISLNK(st.st_mode) else st.st_size
            incomplete += name.endswith(".incomplete")
    return size, files, incomplete


def models_facts(models_dir: str) -> dict[str, Any]:
    """Each folder in the models dir with its size; a missing models dir holds no models."""
    resolved, problem = expand(models_dir)
    facts: dict[str, Any] = {
        "disk": disk_facts(models_dir),
        "dir": models_dir,
        "resolved": resolved,
        "exists": None,
        "entries": None,
        "unknown_reason": problem,
    }
    if resolved is None:
        return facts
    facts["exists"] = os.path.isdir(resolved)
    if not facts["exists"]:
        facts["entries"] = []
        return facts
    try:
        names = sorted(os.listdir(resolved))
    except OSError as exc:
        facts["unknown_reason"] = f"cannot list {resolved}: {exc.strerror}"
        return facts
    entries = []
    for name in names:
        path = os.path.join(resolved, name)
        if not os.path.isdir(path):
            continue
        size, files, incomplete = _tree_size(path)
        has_config = os.path.isfile(os.path.join(path, "config.json"))
        entries.append(
            {
                "name": name,
                "path": path,
                "bytes": size,
                "files": files,
                "incomplete_files": incomplete,
                "has_config": has_config,
            }
        )
    facts["entries"] = entries
    return facts


def _resolve_python(python: str) -> tuple[str | None, str | None, str | None]:
    """(the interpreter found, what `python` expanded to on this host, why none was found). The reason names the
    expanded path: `$sglang_python` alone does not say which file is missing."""
    named = os.sep not in python and "$" not in python and not python.startswith("~")
    resolved, problem = (python, None) if named else expand(python)
    if resolved is None:
        return None, None, problem
    found = shutil.which(resolved)
    if found is None:
        where = "not found on PATH" if "/" not in resolved else "does not exist or is not executable"
        shown = repr(python) if resolved == python else f"{resolved!r} (from {python!r})"
        return None, resolved, f"python {shown} {where}"
    return found, resolved, None


def _sub_probe(
    python: str, role: str, config: dict[str, Any], timeout: float, keys: set[str]
) -> tuple[dict[str, Any] | None, str]:
    """Run this program with another interpreter in another role; (its document, or None and why).

    The document must be an object of exactly `keys`: `python` may name anything executable, and JSON of
    another shape (its config printed back) must be a reason, not a KeyError that loses the host's facts."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=os.path.dirname(sys.argv[0])) as file:
        json.dump({**config, "role": role}, file)
        file.flush()
        code, out, err = run([python, sys.argv[0], file.name], timeout)
    if code != 0:
        return None, f"{python} --{role} failed (exit {code}): {kit.tail(err) or kit.tail(out) or '(no output)'}"
    try:  # the kit's result document: the last line
        document = kit.loads((out.strip().splitlines() or [""])[-1])
    except (ValueError, RecursionError):
        document = None
    if not isinstance(document, dict) or set(document) != keys:
        return None, f"{python} --{role} printed no JSON document of its facts: {kit.tail(out) or '(nothing)'}"
    return document, ""


SGLANG_KEYS = (
    "version",
    "package_dir",
    "dflash",
    "speculative_algorithms",
    "ddtree",
    "attention_backends",
    "draft_attention_backends",
    "kimi_k25_model",
    "kimi_k25_classes",
    "launch_options",
    "bench_entry_points",
)


def _sglang_blank() -> dict[str, Any]:
    """The sglang section with nothing known yet."""
    facts: dict[str, Any] = dict.fromkeys(("installed", *SGLANG_KEYS))
    facts.update(sources={}, attention_backend_files=None, unknown={})
    return facts


def python_facts(config: dict[str, Any]) -> dict[str, Any]:
    python = str(config["python"])
    packages = [str(p) for p in config["packages"]]
    facts: dict[str, Any] = {
        "requested": python,
        "resolved": None,
        "executable": None,
        "version": None,
        "packages": None,
        "unknown_reason": None,
    }
    found, facts["resolved"], problem = _resolve_python(python)
    if found is not None:
        document, problem = _sub_probe(
            found, "interpreter", {"packages": packages}, float(config["python_timeout"]), INTERPRETER_KEYS
        )
        if document is not None:
            sglang = document.pop("sglang")
            facts.update(document, requested=python, unknown_reason=None)
            return {"python": facts, "sglang": sglang}
    facts["unknown_reason"] = problem
    sglang = _sglang_blank()
    sglang["unknown"] = dict.fromkeys(("installed", *SGLANG_KEYS), problem)
    return {"python": facts, "sglang": sglang}


def hub_facts(config: dict[str, Any], python: dict[str, Any]) -> dict[str, Any]:
    repos = [str(r) for r in config["hub_repos"]]
    if not repos:
        return {}
    if python["executable"] is None:
        return {r: _hub_unknown(r, f"no Python to ask the Hub with: {python['unknown_reason']}") for r in repos}
    document, problem = _sub_probe(
        python["executable"],
        "hub",
        {"hub_repos": repos, "hub_files": config.get("hub_files", {})},
        float(config["hub_timeout"]),
        set(repos),
    )
    if document is None:
        return {r: _hub_unknown(r, problem) for r in repos}
    return document


def host_facts(config: dict[str, Any]) -> dict[str, Any]:
    disks = {str(path): disk_facts(str(path)) for path in config["paths"]}
    document: dict[str, Any] = {
        "os": os_facts(),
        "cpu": cpu_facts(),
        "memory": memory_facts(),
        "disks": disks,
        "gpu": gpu_facts(float(config["gpu_timeout"])),
        "hf_token": token_facts(),
        "models": models_facts(str(config["models_dir"])),
    }
    document.update(python_facts(config))
    document["hub"] = hub_facts(config, document["python"])
    return document


# ---------------------------------------------------------------- interpreter role


def _version_of(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_facts() -> dict[str, Any]:
    """What this interpreter's SGLang can do, from its files; nothing of SGLang is imported."""
    import importlib.util

    facts = _sglang_blank()
    unknown: dict[str, str] = facts["unknown"]
    try:
        spec = importlib.util.find_spec("sglang")  # a top-level package: found, not imported
    except (ImportError, ValueError) as exc:
        unknown.update(dict.fromkeys(("installed", *SGLANG_KEYS), f"find_spec('sglang') failed: {exc}"))
        return facts
    if spec is None:
        facts["installed"] = False
        unknown.update(dict.fromkeys(SGLANG_KEYS, f"sglang is not installed for {sys.executable}"))
        return facts
    facts["installed"] = True
    locations = list(spec.submodule_search_locations or [])
    package = os.path.dirname(spec.origin) if spec.origin else (locations[0] if locations else None)
    if package is None:
        unknown.update(dict.fromkeys(SGLANG_KEYS, "sglang has no package folder (a namespace package?)"))
        return facts
    facts["package_dir"] = package
    facts["version"] = _version_of("sglang")
    if facts["version"] is None:
        unknown["version"] = "no distribution metadata for sglang (importlib.metadata)"
    _read_choices(package, facts)
    _read_dflash(package, facts)
    _read_kimi(package, facts)
    _read_launch_options(package, facts)
    facts["bench_entry_points"] = bench_entry_points(package)
    facts["sources"]["bench_entry_points"] = package
    attention = os.path.join(package, ATTENTION_DIR)
    if os.path.isdir(attention):
        names = sorted(n[: -len("_backend.py")] for n in os.listdir(attention) if n.endswith("_backend.py"))
        facts["attention_backend_files"] = names
    return facts


def bench_entry_points(package: str) -> list[str]:
    """The serving benchmark modules this SGLang has (their files in its package folder), preferred first."""
    return [module for module, path in BENCH_ENTRY_POINTS if os.path.isfile(os.path.join(package, path))]


def _parse_file(path: str) -> tuple[str | None, str]:
    """(source, '') or (None, why not)."""
    try:
        source = read_text(path)
        ast.parse(source)
    except OSError as exc:
        return None, f"{path}: {exc.strerror}"
    except SyntaxError as exc:
        return None, f"{path} does not parse with Python {platform.python_version()}: {exc.msg} (line {exc.lineno})"
    return source, ""


def _read_choices(package: str, facts: dict[str, Any]) -> None:
    wanted = {
        "attention_backends": "ATTENTION_BACKEND_CHOICES",
        "draft_attention_backends": "DRAFT_ATTENTION_BACKEND_CHOICES",
    }
    tried = []
    for relative in CHOICES_FILES:
        path = os.path.join(package, relative)
        source, problem = _parse_file(path)
        tried.append(problem or path)
        if source is None:
            continue
        lists = literal_lists(source, tuple(wanted.values()))
        for key, name in wanted.items():
            if facts[key] is None and name in lists:
                facts[key] = lists[name]
                facts["sources"][key] = path
    for key, name in wanted.items():
        if facts[key] is None:
            facts["unknown"][key] = f"no literal {name} list in: " + "; ".join(tried)


def _read_dflash(package: str, facts: dict[str, Any]) -> None:
    path = os.path.join(package, SPEC_INFO_FILE)
    source, problem = _parse_file(path)
    members = class_attributes(source, "SpeculativeAlgorithm") if source is not None else None
    if members is None:
        reason = problem or f"no class SpeculativeAlgorithm in {path}"
        facts["unknown"].update(dict.fromkeys(("dflash", "speculative_algorithms", "ddtree"), reason))
        return
    facts["dflash"] = "DFLASH" in members
    # --speculative-algorithm takes any member but NONE (SpeculativeAlgorithm.from_string); DDTREE is
    # there only in a build with the DDTree pull request (#29907), not in a release up to 0.5.23
    facts["speculative_algorithms"] = [name for name in members if name != "NONE"]
    facts["ddtree"] = "DDTREE" in members
    for key in ("dflash", "speculative_algorithms", "ddtree"):
        facts["sources"][key] = path


def _read_kimi(package: str, facts: dict[str, Any]) -> None:
    """Whether a model file registers KIMI_ARCH (the architecture of Kimi K2.5 and K2.6 checkpoints)
    in its `EntryClass`: kimi_k25.py first, then any model file that names it."""
    models = os.path.join(package, MODELS_DIR)
    if not os.path.isdir(models):
        facts["unknown"].update(dict.fromkeys(("kimi_k25_model", "kimi_k25_classes"), f"no folder {models}"))
        return
    first = os.path.join(models, KIMI_K25_FILE)
    others = sorted(os.path.join(models, n) for n in os.listdir(models) if n.endswith(".py") and n != KIMI_K25_FILE)
    problems = []
    for path in [first, *others]:
        try:
            if not os.path.exists(path) or (path != first and KIMI_ARCH not in read_text(path)):
                continue
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        source, problem = _parse_file(path)
        if source is None:
            problems.append(problem)
            continue
        _, entry = model_classes(source)
        if KIMI_ARCH in entry:
            facts.update(kimi_k25_model=True, kimi_k25_classes=entry)
            facts["sources"]["kimi_k25_model"] = path
            return
    if problems:
        facts["unknown"].update(dict.fromkeys(("kimi_k25_model", "kimi_k25_classes"), "; ".join(problems)))
        return
    facts.update(kimi_k25_model=False, kimi_k25_classes=[])
    facts["sources"]["kimi_k25_model"] = models


def _read_launch_options(package: str, facts: dict[str, Any]) -> None:
    """Every option string of `python -m sglang.launch_server`, one list per argument (its flag first, then its
    aliases): what `deploy` resolves extra_args against, as SGLang's argparse (allow_abbrev) will."""
    fields = os.path.join(package, FIELDS_DIR)
    try:  # releases before the field declarations kept every flag in server_args.py
        names = sorted(os.listdir(fields)) if os.path.isdir(fields) else []
    except OSError as exc:
        facts["unknown"]["launch_options"] = f"{fields}: {exc.strerror}"
        return
    paths = [os.path.join(fields, name) for name in names if name.endswith(".py")]
    paths.append(os.path.join(package, SERVER_ARGS_FILE))
    groups: list[list[str]] = [["--help", "-h"]]  # argparse's own
    seen = {"--help", "-h"}
    for path in paths:
        source, problem = _parse_file(path)
        if source is None:
            facts["unknown"]["launch_options"] = problem
            return
        read = field_options(source) if path.startswith(fields + os.sep) else argument_options(source)
        for group in read:  # an option string declared twice: the first declaration has it, as in argparse
            fresh = [option for option in group if option not in seen]
            seen.update(fresh)
            if fresh:
                groups.append(fresh)
    facts["launch_options"] = groups
    read_from = [os.path.join(fields, "*.py")] if len(paths) > 1 else []
    facts["sources"]["launch_options"] = " and ".join([*read_from, paths[-1]])


INTERPRETER_KEYS = {"executable", "version", "packages", "unknown_reason", "sglang"}  # what interpreter_facts returns


def interpreter_facts(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "executable": sys.executable,
        "version": platform.python_version(),
        "packages": {str(name): _version_of(str(name)) for name in config["packages"]},
        "unknown_reason": None,
        "sglang": sglang_facts(),
    }


# ---------------------------------------------------------------- hub role


def _hub_unknown(repo: str, reason: str) -> dict[str, Any]:
    """A hub_repos entry (`[datasets/]org/name[@revision]`) with nothing known yet but why."""
    name, _, revision = repo.partition("@")
    dataset = name.startswith("datasets/")
    return {
        "repo": name[len("datasets/") :] if dataset else name,
        "repo_type": "dataset" if dataset else "model",
        "revision": revision or "main",
        "sha": None,
        "files": None,
        "bytes": None,
        "readable": None,
        "unknown_reason": reason,
    }


def hub_readable(api: Any, facts: dict[str, Any], first: str | None) -> tuple[bool | None, str | None]:
    """Whether the token at hand may read the repo's files (None: could not tell), and why not: one HEAD of its
    first file, as a download's first request. The Hub shows a gated repo's file list to anyone but serves its
    files only to a token whose owner accepted its terms, so the list alone says nothing of access."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    if first is None:
        return None, "the Hub lists no file in it"
    url = hf_hub_url(facts["repo"], first, repo_type=facts["repo_type"], revision=facts["sha"], endpoint=api.endpoint)
    try:
        get_hf_file_metadata(url)
    except Exception as exc:  # the client's error is the reason, never a crash
        response = getattr(exc, "response", None)
        refused = kit.hub_refused(getattr(response, "status_code", None), getattr(response, "headers", None))
        said = f"{_first_line(exc)} (endpoint {api.endpoint})"
        return (False, f"the token at hand may not read its files: {said}") if refused else (None, said)
    return True, None


def hub_missing(facts: dict[str, Any], names: list[str], patterns: list[str]) -> None:
    """The patterns the runbook's downloads include that match no file of the repo (`missing`), by huggingface_hub's
    own matching (`filter_repo_objects`, as a download selects), and a `reason` saying so: a download of them
    would fetch nothing, and the step reading the file would fail only after the downloads before it."""
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]  # public, not in __all__

    facts["missing"] = [p for p in patterns if not list(filter_repo_objects(names, allow_patterns=[p]))]
    if facts["missing"]:
        held = ", ".join(names[:5]) + (f", ... ({len(names)} files)" if len(names) > 5 else "")
        facts["reason"] = (
            f"{facts['repo']}@{facts['revision']} holds no file matching {', '.join(facts['missing'])}, which a "
            f"download step of the runbook includes; it holds {held or 'no file'}"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def hub_sizes(config: dict[str, Any]) -> dict[str, Any]:
    repos = [str(r) for r in config["hub_repos"]]
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:
        return {r: _hub_unknown(r, f"huggingface_hub is not importable by {sys.executable}: {exc}") for r in repos}
    api = HfApi()
    result = {}
    for repo in repos:
        facts = _hub_unknown(repo, "")
        try:
            info = (api.dataset_info if facts["repo_type"] == "dataset" else api.model_info)(
                facts["repo"], revision=facts["revision"], files_metadata=True
            )
        except Exception as exc:  # any failure of the client is this repo's reason, never a crash
            facts["unknown_reason"] = f"{_first_line(exc)} (endpoint {api.endpoint})"
            result[repo] = facts
            continue
        siblings = info.siblings or []
        sizes = [s.size for s in siblings]
        facts.update(sha=info.sha, files=len(sizes), bytes=sum(s or 0 for s in sizes), unknown_reason=None)
        facts["readable"], facts["unknown_reason"] = hub_readable(
            api, facts, siblings[0].rfilename if siblings else None
        )
        if any(s is None for s in sizes):
            facts.update(bytes=None, unknown_reason=f"the Hub gave no size for {sizes.count(None)} files")
        hub_missing(facts, [s.rfilename for s in siblings], config.get("hub_files", {}).get(repo, []))
        result[repo] = facts
    return result


ROLES = {"host": host_facts, "interpreter": interpreter_facts, "hub": hub_sizes}


def main() -> int:
    return kit.main(lambda config: ROLES[config.get("role", "host")](config))
