"""`probe`: what a GPU host has, in ONE command that prints ONE JSON document, as typed facts.

The seeds' probe was a chain of greps whose empty answer ("no MLA backend") looked like a pass,
with a quoting bug on top. Here the host program (hostprograms/probe.py, stdlib only) travels as
data through `executor.hostprogram.host_program`, so no quoting applies; it reads SGLang's
capabilities from its files with the interpreter the deployment will use; and a fact it cannot
determine is null with its reason in an `unknown` map, so a gate on it fails instead of passing on
an empty list; that failure then says what the probe tried, as the host expanded it, and what to check
(`UnknownHints`).

Beyond what the host reports, the facts carry what later gates need: `gpu_arch` (sm90, sm100,
sm120, ...), `gpu_memory_min_mib`, the MLA backends of the installed SGLang and those of them
usable on the detected GPU architecture (`mla_backends_usable_on_gpu`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from executor.hostprogram import host_program
from executor.render import with_vars
from executor.runbook.durations import Duration
from executor.runbook.model import Gate
from executor.stepkind import (
    HUB_ENV,
    VAR_REF,
    FactHost,
    RenderContext,
    StepSpec,
    UnknownFact,
    fact_reasons,
    host_document,
    resolve_var,
)

if TYPE_CHECKING:
    from executor.transport.base import CommandResult
    from steps.probe_facts import ProbeFacts


class ProbeStep(StepSpec):
    """Probe the host: disks, memory, CPUs, OS, GPUs, HF token, models, a Python and its SGLang."""

    kind: Literal["probe"] = "probe"
    #: huggingface_hub (and its `hf` CLI) read HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_* from the environment
    kind_env: ClassVar[tuple[str, ...]] = HUB_ENV
    models_dir: str = "~/models"  # `~` and `$VARS` expand on the host (runbook vars are exported)
    paths: list[str] = ["/dev/shm"]  # measured besides the models dir
    python: str = "python3"  # the interpreter of the SGLang environment, e.g. /root/venv_sglang/bin/python
    #: distributions whose versions are read from `python`
    packages: list[str] = ["sglang", "sgl-kernel", "flashinfer-python", "torch", "transformers", "huggingface_hub"]
    #: `org/name`, `org/name@revision` or `datasets/org/name[@revision]`: files, bytes and access asked from the Hub,
    #: besides every repository the runbook's steps on this host download (`hub_repos_of`)
    hub_repos: list[str] = []
    gpu_timeout: Duration = 30.0  # for nvidia-smi: past it, the GPU facts are unknown, with the reason
    python_timeout: Duration = 60.0  # for reading the interpreter's packages and SGLang's features
    hub_timeout: Duration = 120.0  # for the Hub's answers (token, hub_repos)

    def hub_repos_of(self, ctx: RenderContext) -> list[str]:
        """The repositories asked from the Hub: `hub_repos` as written, then each one the runbook's steps on this
        host declare they fetch (`ctx.fetches()`: the downloads, a campaign's drafters and datasets included) that
        `hub_repos` does not name already, so that a gated one fails here, before any download begins."""
        return list(self.hub_files_of(ctx))

    def hub_files_of(self, ctx: RenderContext) -> dict[str, list[str]]:
        """Each repository of `hub_repos_of` with the file patterns the runbook's downloads of it include, which
        must each match a file there (the host program's `missing`): a dataset repository without the file the
        benchmark reads fails here, not after the downloads before it."""
        asked: dict[str, list[str]] = {repo: [] for repo in self.hub_repos}
        entries = {_canonical(repo): repo for repo in self.hub_repos}
        for address in ctx.fetches():
            if address.startswith(HUB_SCHEME):
                (kind, name, revision), pattern = _hub_address(address, ctx)
                prefix = DATASETS_PREFIX if kind == "dataset" else ""
                entry = prefix + name + ("" if revision == "main" else f"@{revision}")
                patterns = asked.setdefault(entries.setdefault((kind, name, revision), entry), [])
                patterns += [pattern] if pattern and pattern not in patterns else []
        return asked

    def config(self, ctx: RenderContext) -> dict[str, object]:
        """What the host program is told, as its config."""
        hub_files = {repo: patterns for repo, patterns in self.hub_files_of(ctx).items() if patterns}
        return ({"hub_files": hub_files} if hub_files else {}) | {
            "models_dir": self.models_dir,
            "paths": list(dict.fromkeys([self.models_dir, *self.paths])),
            "python": self.python,
            "packages": self.packages,
            "hub_repos": self.hub_repos_of(ctx),
            "gpu_timeout": self.gpu_timeout,
            "python_timeout": self.python_timeout,
            "hub_timeout": self.hub_timeout,
        }

    def render(self, ctx: RenderContext) -> str:
        return host_program("probe", self.config(ctx), "python3")  # the host's own: `python` may be missing

    def summary(self, ctx: RenderContext) -> list[str]:
        hub_repos = [repo + (f" ({', '.join(p)})" if p else "") for repo, p in self.hub_files_of(ctx).items()]
        repos = f", the Hub's files and access of {', '.join(hub_repos)}" if hub_repos else ""
        disks = ", ".join(with_vars(path, ctx.vars) for path in [self.models_dir, *self.paths])
        return [
            f"one round trip: GPUs, disks of {disks}, "
            f"memory, OS, the HF token, the packages of {with_vars(self.python, ctx.vars)}{repos}"
        ]

    def parse_facts(self, result: CommandResult) -> ProbeFacts:
        from steps.probe_facts import HostReport, ProbeFacts  # the facts' 16 models: a run's, not `validate`'s

        report = host_document(result, HostReport, "the probe (python3 on the host's PATH runs it)")
        return ProbeFacts.from_report(report)

    def default_gates(self) -> list[Gate]:
        return [Gate(that="exit_code == 0", message="the probe program failed on the host"), HUB_READABLE, HUB_HOLDS]

    def unknown_facts(self, facts: Any, path: tuple[Any, ...], host: FactHost) -> list[UnknownFact]:
        """The reasons the facts give (`fact_reasons`), each with what the probe tried, as the host expanded it,
        and what to check next (`UnknownHints`, by the section that gives the reason). A derived fact
        (`gpu_count`, `gpu_arch`, `mla_backends_usable_on_gpu`, ...) is explained by the section it comes from
        where it gives no reason of its own (`gpu_count` 0: why nvidia-smi listed no GPU)."""
        source = _derived_from(facts, path) or path
        reasons = fact_reasons(facts, path) or (fact_reasons(facts, source) if source != path else [])
        hints = UnknownHints(self, facts, host)
        return [UnknownFact(reason, *hints.of(at or source)) for reason, at in reasons]


#: How a step declares a Hub repository it fetches (`StepSpec.fetches`): huggingface_hub's HfFileSystem form.
HUB_SCHEME = "hf://"
DATASETS_PREFIX = "datasets/"


#: Every repository the probe asked the Hub about (those the runbook downloads among them) may be read with the
#: token at hand: a gated one fails the probe, before a download of hours begins. A runbook that writes its own
#: gates adds this one to them (runbooks/k26_dflash.yaml).
HUB_READABLE = Gate(
    that="facts.hub.values() | rejectattr('readable') | list == []",
    message="the token at hand may not read a repository the runbook downloads (gated: accept its terms on the Hub)",
)


#: Every file the runbook's downloads include is in its repository at that revision: a dataset repository without
#: the file the benchmark reads fails the probe, before the downloads (README, "Datasets").
HUB_HOLDS = Gate(
    that="facts.hub.values() | selectattr('missing') | list == []",
    message="a repository the runbook downloads holds no file matching what a download step includes",
)


def _hub_address(address: str, ctx: RenderContext) -> tuple[tuple[str, str, str], str | None]:
    """(repo type, `org/name`, revision) and the file pattern of an address of `StepSpec.fetches`,
    `hf://[datasets/]org/name@REVISION[/PATTERN]` (HfFileSystem's form, the revision URL-quoted), a part given
    as a var alone (`$speed_bench_repo`) resolved with ctx's host's vars, as the download step resolves it."""
    kind = "dataset" if address.removeprefix(HUB_SCHEME).startswith(DATASETS_PREFIX) else "model"
    name, _, rest = address.removeprefix(HUB_SCHEME).removeprefix(DATASETS_PREFIX).partition("@")
    revision, _, pattern = rest.partition("/")

    def value(text: str, what: str) -> str:
        return resolve_var(ctx, text, what, str) if VAR_REF.match(text) else text

    revision = value(revision, "revision") if VAR_REF.match(revision) else urllib.parse.unquote(revision)
    return (kind, value(name, "repo"), revision or "main"), value(pattern, "include") or None


def _canonical(repo: str) -> tuple[str, str, str]:
    """(repo type, `org/name`, revision) of a `[datasets/]org/name[@revision]`: `org/name` is `org/name@main`."""
    name, _, revision = repo.partition("@")
    kind = "dataset" if name.startswith(DATASETS_PREFIX) else "model"
    return kind, name.removeprefix(DATASETS_PREFIX), revision or "main"


def _derived_from(facts: Any, path: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The section a derived fact of `ProbeFacts.from_report` comes from, where `path` reads one."""
    if path[:1] in (("gpu_count",), ("gpu_arch",), ("gpu_memory_min_mib",)):
        return ("gpu", "gpus")
    if path[:1] == ("mla_backends_usable_on_gpu",):
        arch_known = isinstance(facts, dict) and facts.get("gpu_arch") is not None
        return ("sglang", "attention_backends") if arch_known else ("gpu", "gpus")
    return None


Hint = tuple[str | None, str | None]  # (what was tried, the next step)


class UnknownHints:
    """What the probe tried for each section of its facts, and what a person checks next when it could not
    tell, read from the facts themselves (the host's expansion of `$vars` and `~`: never a secret's value,
    facts are masked). One method per section that can be unknown; the next step names the host."""

    def __init__(self, step: ProbeStep, facts: Any, host: FactHost) -> None:
        self.step, self.host = step, host
        self.facts: dict[str, Any] = facts if isinstance(facts, dict) else {}

    def of(self, at: tuple[Any, ...]) -> Hint:
        """The hint of the section at `at` (its first key), nothing for a section without one."""
        sections: dict[Any, Callable[[tuple[Any, ...]], Hint]] = {
            "python": self._python,
            "sglang": self._sglang,
            "hub": self._hub,
            "gpu": self._gpu,
            "hf_token": self._hf_token,
            "models": self._models,
            "disks": self._disks,
            "memory": self._memory,
            "os": self._os,
        }
        method = sections.get(at[0]) if at else None
        return method(at) if method is not None else (None, None)

    def _section(self, *keys: Any) -> dict[str, Any]:
        node: Any = self.facts
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    def _python(self, at: tuple[Any, ...]) -> Hint:
        python = self._section("python")
        requested, resolved = python.get("requested"), python.get("resolved")
        tried = f"python: {requested}" + (f" -> {resolved}" if resolved and resolved != requested else "")
        setting = self.step.setting("python", dict(self.host.secrets))
        if resolved is None:
            return tried, f"check that every var of {requested} is set for the probe on {self.host}, or set {setting}"
        return tried, f"check that {resolved} exists on {self.host} and is executable, or set {setting}"

    def _sglang(self, at: tuple[Any, ...]) -> Hint:
        python, sglang = self._section("python"), self._section("sglang")
        if python.get("executable") is None:
            return self._python(at)
        executable, setting = python["executable"], self.step.setting("python", dict(self.host.secrets))
        if not sglang.get("installed"):
            tried = f"the sglang package of {executable}"
            return tried, f"install SGLang for {executable} on {self.host}, or set {setting} to the Python that has it"
        where = sglang.get("package_dir")
        tried = f"SGLang {sglang.get('version')} in {where}"
        return tried, f"check SGLang's files under {where} on {self.host}: the probe reads its capabilities from them"

    def _hub(self, at: tuple[Any, ...]) -> Hint:
        if self._section("python").get("executable") is None:
            return self._python(at)
        repo = self._section(*at[:2]) if len(at) > 1 else {}
        named = f"{repo.get('repo')}@{repo.get('revision')}" if repo else "the Hub's repos"
        tried = f"{named}, asked with the huggingface_hub of {self._section('python').get('executable')}"
        if repo.get("missing"):
            return tried, (
                f"name a repository (or revision) that holds {', '.join(repo['missing'])} where the download steps "
                'name this one (their `repo:`, or the var it holds), or change what they include (README, "Datasets")'
            )
        return tried, f"check that {self.host} reaches the Hub (HF_ENDPOINT) and that the token may read {named}"

    def _gpu(self, at: tuple[Any, ...]) -> Hint:
        tried = self._section("gpu").get("nvidia_smi") or "nvidia-smi on the PATH of the host's login"
        return tried, f"check that `nvidia-smi` lists the GPUs on {self.host} (the NVIDIA driver installed and loaded)"

    def _hf_token(self, at: tuple[Any, ...]) -> Hint:
        checked = self._section("hf_token").get("checked") or []
        tried = ", ".join(str(c) for c in checked) or None
        return (
            tried,
            f"give the secret HF_TOKEN in the controller's environment, or log in on {self.host} (hf auth login)",
        )

    def _models(self, at: tuple[Any, ...]) -> Hint:
        section = self._section(*at[:2]) if at[1:2] == ("disk",) else self._section("models")
        given = section.get("path") or section.get("dir")
        return self._folder(given, section.get("resolved"), "models_dir")

    def _disks(self, at: tuple[Any, ...]) -> Hint:
        section = self._section(*at[:2])
        return self._folder(section.get("path"), section.get("resolved"), "paths")

    def _folder(self, given: Any, resolved: Any, parameter: str) -> Hint:
        tried = f"{given}" + (f" -> {resolved}" if resolved and resolved != given else "")
        setting = self.step.setting(parameter, dict(self.host.secrets))
        if resolved is None:
            return tried, f"check that every var of {given} is set for the probe on {self.host}, or set {setting}"
        return tried, f"check that {resolved} (or the folder it would be made in) is readable on {self.host}"

    def _memory(self, at: tuple[Any, ...]) -> Hint:
        return "/proc/meminfo", f"check that /proc/meminfo is readable on {self.host}"

    def _os(self, at: tuple[Any, ...]) -> Hint:
        return "/etc/os-release, /usr/lib/os-release", f"check that one of them is readable on {self.host}"
