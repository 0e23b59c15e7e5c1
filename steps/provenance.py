"""What a report's numbers are of: the repos' commits, the servers and their launch commands, the GPUs,
the benchmark commands with their seeds and times, and the acceptance eval's settings.

A throughput means nothing to its reader without these: a speedup of DFlash is a speedup of one drafter
commit on one SGLang version on one GPU model. They come from the facts of the steps that ran before the
report on the same host (`StepContext.facts_of_kind`), so a runbook does not have to name them:

- `repos`: each `verify` step's repo (`verified` when it found every file as the Hub's manifest says),
  else each `download` step's (`verified: false`: the files were fetched, never checked);
- `deployments`: the `deploy` step each benchmark measured (SGLang version from `/server_info`, argv), and
  for one across a node group (`deploy` with `nodes:`) the group: its nodes in rank order with their GPU
  model and count, the tp size and the dist-init address (rank 0's facts: steps/server/node_group.py GroupFacts);
- `gpus`: the last `probe` step's GPUs (model, count, driver, CUDA);
- `benchmarks`: every run of each side (concurrency, repeat, seed, command, start and end);
- `acceptance`: the eval step's API, template and thinking setting, when the report has one.

Anything not known is null and named with the reason in `unknown` (`"gpus": "no probe step ran on host
gpu ..."`): a missing commit does not fail the benchmark, but the report says so. Facts are read
through models that ignore what they do not use, so a kind may grow facts without breaking this.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ConfigDict, ValidationError

from executor.runbook.model import DataModel
from executor.stepkind import StepContext
from steps.benchmark_results import BenchRun


class RepoProvenance(DataModel):
    repo: str
    revision: str | None
    commit: str | None
    local_dir: str
    step: str  # the verify step (or, without one, the download step) that says so
    verified: bool  # every file checked against the Hub's manifest of `commit`


class NodeProvenance(DataModel):
    rank: int
    host: str
    gpu_model: str | None
    gpus: int


class GroupProvenance(DataModel):
    """A server across a node group: its nodes in rank order (rank 0 serves the benchmarked port)."""

    nodes: list[NodeProvenance]
    tp_size: int
    dist_init_addr: str  # ADDR:PORT, as every rank got it


class DeploymentProvenance(DataModel):
    side: str  # the benchmark's label
    step: str  # the deploy step
    host: str
    server_version: str | None
    argv: list[str] | None
    model_path: str | None
    draft_model_path: str | None
    speculative_algorithm: str | None
    gpus: int | None  # GPUs the server runs on: tp x pp (x dp without DP attention) of its argv
    group: GroupProvenance | None = None  # None: the server runs on one host


class GpuProvenance(DataModel):
    step: str  # the probe step
    model: str | None  # nvidia-smi's name; several names joined with ", " on a mixed host
    count: int
    driver_version: str | None
    cuda_version: str | None


class RunProvenance(DataModel):
    workload: str | None = None  # the run's workload label (None: a report from before workloads, random ids)
    category: str | None = None  # its SPEED-Bench category (None: the whole workload)
    concurrency: int
    repeat: int
    seed: int
    command: str
    started_at: str
    finished_at: str


class BenchmarkProvenance(DataModel):
    side: str
    step: str
    runs: list[RunProvenance]
    requests: str | None = None  # its per-request records (JSONL), relative to the run folder


class AcceptanceProvenance(DataModel):
    step: str
    api: str | None
    template: str | None
    thinking: bool | None  # None for raw text (no template, no thinking switch)
    requests: str | None = None  # its per-request records (JSONL), relative to the run folder


class Provenance(DataModel):
    """`provenance` of report.json. `runbook report` refuses a report without those of executor/documents.py's
    `Provenance` (tests/executor/test_cli_report.py keeps them fields of this one)."""

    generated_at: str  # ISO-8601 UTC
    repos: list[RepoProvenance]
    deployments: list[DeploymentProvenance]
    gpus: GpuProvenance | None
    benchmarks: list[BenchmarkProvenance]
    acceptance: AcceptanceProvenance | None
    unknown: dict[str, str]  # a dotted path of a null above -> why it is not known


# ---- the facts read, tolerantly ----------------------------------------------------------------------


class _Seen(DataModel):
    model_config = ConfigDict(extra="ignore")


_SeenT = TypeVar("_SeenT", bound=_Seen)


class _Verify(_Seen):
    repo: str
    revision: str | None = None
    local_dir: str
    commit: str | None = None
    manifest_error: str | None = None
    files_expected: int = 0
    missing: list[Any] = []
    incomplete: list[Any] = []
    size_mismatch: list[Any] = []
    sha_mismatch: list[Any] = []
    bad_headers: list[Any] = []

    @property
    def problem(self) -> str | None:
        """Why the files are not known to be the commit's, or None when every one was checked."""
        if self.manifest_error or self.commit is None:
            return f"the Hub's manifest could not be read: {self.manifest_error or 'it names no commit'}"
        if self.files_expected == 0:
            return "no file of the manifest matched include/exclude: nothing was checked"
        found = {
            "missing": self.missing,
            "incomplete": self.incomplete,
            "of another size": self.size_mismatch,
            "with other contents": self.sha_mismatch,
            "with a bad safetensors header": self.bad_headers,
        }
        bad = [f"{len(files)} {what}" for what, files in found.items() if files]
        return f"files {', '.join(bad)}" if bad else None


class _Download(_Seen):
    repo: str
    revision: str | None = None
    commit: str | None = None
    local_dir: str
    hub_error: str | None = None


class _Group(_Seen):
    nodes: list[str]
    gpus_per_node: int
    gpu_model: str | None = None
    tp_size: int
    dist_init_addr: str


class _Deploy(_Seen):
    argv: list[str] | None = None
    model_path: str | None = None
    draft_model_path: str | None = None
    speculative_algorithm: str | None = None
    server_version: str | None = None
    server_version_unknown: str | None = None
    group: _Group | None = None


class _Gpu(_Seen):
    name: str | None = None


class _GpuReport(_Seen):
    gpus: list[_Gpu] = []
    reason: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    unknown: dict[str, str] = {}


class _Probe(_Seen):
    gpu: _GpuReport


@dataclass(frozen=True)
class Sources:
    """The facts a provenance is made of: per kind, step id -> facts (earlier steps on `host`)."""

    host: str
    probes: dict[str, Any]
    downloads: dict[str, Any]
    verifies: dict[str, Any]
    deploys: dict[str, Any]

    @classmethod
    def of(cls, ctx: StepContext) -> Sources:
        kinds = {name: ctx.facts_of_kind(name) for name in ("probe", "download", "verify", "deploy")}
        return cls(ctx.host_name, kinds["probe"], kinds["download"], kinds["verify"], kinds["deploy"])


@dataclass(frozen=True)
class Measured:
    """One side of the comparison as provenance sees it: its label, benchmark step, deploy step and runs."""

    label: str
    step: str
    server: str
    runs: Sequence[BenchRun]
    requests_file: str | None = None  # the benchmark's per-request records (steps/request_records.py)


def _read(model: type[_SeenT], facts: dict[str, Any]) -> dict[str, _SeenT]:
    """The facts that fit `model`; a step whose facts do not (a failed attempt's) is left out."""
    read = {}
    for step, value in facts.items():
        try:
            read[step] = model.model_validate(value)
        except ValidationError:
            continue
    return read


def same_path(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


REPO_KEYS = {"repo", "revision", "commit", "local_dir"}  # what verify and download facts both say of a repo


def repos(sources: Sources, unknown: dict[str, str]) -> list[RepoProvenance]:
    """Each verified repo, then each downloaded one no verify step checked (same folder)."""
    verifies, downloads = _read(_Verify, sources.verifies), _read(_Download, sources.downloads)
    found = []
    for step, v in verifies.items():
        problem = v.problem
        if problem:
            unknown[f"repos.{v.repo}.verified"] = f"{step} did not verify {v.local_dir}: {problem}"
        found.append(RepoProvenance(**v.model_dump(include=REPO_KEYS), step=step, verified=problem is None))
    for step, d in downloads.items():
        if any(same_path(d.local_dir, r.local_dir) for r in found):
            continue
        unknown[f"repos.{d.repo}.verified"] = (
            f"no verify step on host {sources.host} checked {d.local_dir}: its files are not known to be those "
            f"of the commit {step} downloaded"
        )
        if d.commit is None:
            unknown[f"repos.{d.repo}.commit"] = f"{step}: the Hub did not say the commit ({d.hub_error})"
        found.append(RepoProvenance(**d.model_dump(include=REPO_KEYS), step=step, verified=False))
    return found


#: Flags of SGLang 0.5.23 that multiply the GPUs a server uses (srt/arg_groups/fields/parallel.py), each
#: with its aliases; absent, each is 1.
PARALLEL_FLAGS = {
    "tp": ("--tp-size", "--tensor-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size"),
}


#: The largest size of one parallel axis that counts as a number of GPUs: a `--tp-size` of 400 digits (a tampered
#: state.db's argv) made the campaign figure's throughput per GPU an OverflowError.
PARALLEL_MAX = 65536


def gpus_of(argv: list[str]) -> int | None:
    """The GPUs a server launched with `argv` runs on: tp x pp, times dp unless DP attention is on (its
    data-parallel groups live inside the TP group); None when a size is no number from 1 to PARALLEL_MAX
    (`--tp-size -8` would make the costliest configuration the cheapest)."""
    sizes = dict.fromkeys(PARALLEL_FLAGS, 1)
    for index, word in enumerate(argv):
        flag, equals, value = word.partition("=")  # `--dp-size 2` or argparse's `--dp-size=2`
        for name, flags in PARALLEL_FLAGS.items():
            if flag in flags and (equals or index + 1 < len(argv)):
                try:
                    sizes[name] = int(value if equals else argv[index + 1])
                except ValueError:
                    return None
                if not 1 <= sizes[name] <= PARALLEL_MAX:
                    return None
    dp = 1 if "--enable-dp-attention" in argv else sizes["dp"]
    return sizes["tp"] * sizes["pp"] * dp


def deployments(
    sources: Sources, sides: Sequence[Measured], found: list[RepoProvenance], unknown: dict[str, str]
) -> list[DeploymentProvenance]:
    """The server each side measured, and whether the models it served are among the repos."""
    deploys = _read(_Deploy, sources.deploys)
    result = []
    for side in sides:
        where = f"deployments.{side.label}"
        d = deploys.get(side.server)
        if d is None:
            unknown[where] = f"no facts of the deploy step {side.server!r} on host {sources.host}"
            d = _Deploy()
        elif d.server_version is None:
            unknown[f"{where}.server_version"] = d.server_version_unknown or "the deploy step did not record it"
        for key, path in (("model_path", d.model_path), ("draft_model_path", d.draft_model_path)):
            if path and not any(same_path(path, r.local_dir) for r in found):
                unknown[f"{where}.{key}"] = (
                    f"no download or verify step on host {sources.host} names {path}: its commit is not known"
                )
        group = None if d.group is None else _group(d.group)
        if d.group is not None and d.group.gpu_model is None:
            unknown[f"{where}.group.gpu_model"] = f"the facts of {side.server} do not name the nodes' GPU model"
        result.append(
            DeploymentProvenance(
                side=side.label,
                step=side.server,
                host=sources.host,
                server_version=d.server_version,
                argv=d.argv,
                model_path=d.model_path,
                draft_model_path=d.draft_model_path,
                speculative_algorithm=d.speculative_algorithm,
                gpus=None if d.argv is None else gpus_of(d.argv),
                group=group,
            )
        )
    return result


def _group(group: _Group) -> GroupProvenance:
    """A node group's nodes in rank order: the preflight found the same GPUs on each."""
    nodes = [
        NodeProvenance(rank=rank, host=host, gpu_model=group.gpu_model, gpus=group.gpus_per_node)
        for rank, host in enumerate(group.nodes)
    ]
    return GroupProvenance(nodes=nodes, tp_size=group.tp_size, dist_init_addr=group.dist_init_addr)


def gpus(sources: Sources, unknown: dict[str, str]) -> GpuProvenance | None:
    """The GPUs of the last probe step before the report."""
    probes = _read(_Probe, sources.probes)
    if not probes:
        unknown["gpus"] = f"no probe step ran on host {sources.host}: the GPU model, count and driver are not known"
        return None
    step, probe = list(probes.items())[-1]
    report = probe.gpu
    names = sorted({g.name for g in report.gpus if g.name})
    if not names:
        unknown["gpus.model"] = f"{step}: {report.reason or 'nvidia-smi gave no GPU name'}"
    for key in ("driver_version", "cuda_version"):
        if getattr(report, key) is None:
            unknown[f"gpus.{key}"] = f"{step}: {report.unknown.get(key) or report.reason or 'nvidia-smi did not say'}"
    return GpuProvenance(
        step=step,
        model=", ".join(names) or None,
        count=len(report.gpus),
        driver_version=report.driver_version,
        cuda_version=report.cuda_version,
    )


def benchmarks(sides: Sequence[Measured]) -> list[BenchmarkProvenance]:
    """Every run of each side: what it was asked, its seed, command and times."""
    return [
        BenchmarkProvenance(
            side=side.label,
            step=side.step,
            runs=[
                RunProvenance(
                    workload=run.workload,
                    category=run.category,
                    concurrency=run.max_concurrency,
                    repeat=run.repeat,
                    seed=run.seed,
                    command=run.command,
                    started_at=run.started_at,
                    finished_at=run.finished_at,
                )
                for run in side.runs
            ],
            requests=side.requests_file,
        )
        for side in sides
    ]


def acceptance(step: str | None, facts: dict[str, Any] | None, unknown: dict[str, str]) -> AcceptanceProvenance | None:
    """The eval's API, template and thinking setting, as the eval step recorded them."""
    if step is None:
        return None
    facts = facts or {}
    if facts.get("api") is None:
        unknown["acceptance"] = f"the facts of {step} do not say which API, template and thinking setting it used"
    return AcceptanceProvenance(
        step=step,
        api=facts.get("api"),
        template=facts.get("template"),
        thinking=facts.get("thinking"),
        requests=facts.get("requests_file"),
    )


def build(
    sources: Sources,
    sides: Sequence[Measured],
    generated_at: str,
    acceptance_step: str | None = None,
    acceptance_facts: dict[str, Any] | None = None,
) -> Provenance:
    """The provenance of a report comparing `sides`, from the facts in `sources`."""
    unknown: dict[str, str] = {}
    found = repos(sources, unknown)
    if not found:
        unknown["repos"] = f"no download or verify step ran on host {sources.host}: no commit is known"
    return Provenance(
        generated_at=generated_at,
        repos=found,
        deployments=deployments(sources, sides, found, unknown),
        gpus=gpus(sources, unknown),
        benchmarks=benchmarks(sides),
        acceptance=acceptance(acceptance_step, acceptance_facts, unknown),
        unknown=unknown,
    )
