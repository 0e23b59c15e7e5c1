"""The facts of a `probe` step (steps/probe.py): the document hostprograms/probe.py prints (`HostReport`), and
what gates need besides (`ProbeFacts`: the GPU architecture, the MLA backends usable on it).

A module of its own so that `runbook validate` and `plan`, which import the probe kind to check a runbook, do not
define these 16 models (bench/RESULTS.md, 9d): the step imports them when it reads its host's answer.
"""

from __future__ import annotations

from pydantic import ConfigDict, computed_field

from executor.runbook.model import DataModel

_SM80_AND_LATER = ("sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")
#: Attention backends that serve MLA models (DeepSeek-V3, Kimi K2.x), by the GPU architectures
#: they run on. Sources: ../shared/reference/sglang-dflash.md (trtllm_mla needs SM100/SM103 and
#: fails "Unsupported architecture" on SM120; FA3 is Hopper-only; flashinfer and triton on SM120),
#: sglang 0.5.23 srt/arg_groups/overrides.py (CuteDSL MLA: SM100 only), FlashMLA's kernels
#: (SM90 and SM100). Older releases had cutlass_mla (SM100). An architecture not listed is not usable.
MLA_BACKEND_ARCHS: dict[str, tuple[str, ...]] = {
    "trtllm_mla": ("sm100", "sm103"),
    "cutedsl_mla": ("sm100", "sm103"),
    "tokenspeed_mla": ("sm100", "sm103"),  # deprecated alias of cutedsl_mla
    "cutlass_mla": ("sm100", "sm103"),
    "flashmla": ("sm90", "sm100", "sm103"),
    "fa3": ("sm90",),
    "flashinfer": _SM80_AND_LATER,
    "triton": _SM80_AND_LATER,
}


class Facts(DataModel):
    """Base of the probe's facts: a key the host program sends that no model names is an error."""

    model_config = ConfigDict(extra="forbid")


class OsFacts(Facts):
    hostname: str
    kernel: str
    arch: str
    id: str | None
    version_id: str | None
    pretty_name: str | None
    unknown: dict[str, str]


class CpuFacts(Facts):
    count: int | None  # CPUs online
    usable: int | None  # CPUs this process may run on (what nproc says)


class MemoryFacts(Facts):
    total_bytes: int | None
    available_bytes: int | None
    unknown: dict[str, str]


class DiskFacts(Facts):
    """The filesystem holding `path`; a path not created yet is measured at `measured_at`."""

    path: str
    resolved: str | None
    exists: bool | None
    measured_at: str | None
    mount_point: str | None
    size_bytes: int | None
    used_bytes: int | None
    avail_bytes: int | None
    unknown_reason: str | None


def sm_arch(compute_capability: str | None) -> str | None:
    """`9.0` -> `sm90`, `12.0` -> `sm120`; None for anything else."""
    major, _, minor = (compute_capability or "").partition(".")
    return f"sm{major}{minor}" if major.isdigit() and minor.isdigit() else None


class Gpu(Facts):
    index: int | None
    name: str | None
    uuid: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    driver_version: str | None
    compute_capability: str | None
    pci_bus_id: str | None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def arch(self) -> str | None:
        return sm_arch(self.compute_capability)


class GpuFacts(Facts):
    """GPUs as nvidia-smi lists them; an empty list always comes with `reason`."""

    nvidia_smi: str | None
    gpus: list[Gpu]
    reason: str | None
    driver_version: str | None
    cuda_version: str | None
    unknown: dict[str, str]


class TokenFacts(Facts):
    """Whether huggingface_hub on the host finds a token, and where from. Never the token."""

    available: bool
    source: str | None  # "env HF_TOKEN" or "file /root/.cache/huggingface/token"
    checked: list[str]
    reason: str | None


class ModelEntry(Facts):
    name: str
    path: str
    bytes: int
    files: int
    incomplete_files: int
    has_config: bool


class ModelsFacts(Facts):
    """Folders in the models dir; a models dir that does not exist holds none (`exists: false`)."""

    dir: str
    resolved: str | None
    exists: bool | None
    entries: list[ModelEntry] | None
    disk: DiskFacts
    unknown_reason: str | None


class PythonFacts(Facts):
    requested: str
    resolved: str | None  # `requested` with $VARS and ~ expanded on the host; None where it cannot be
    executable: str | None
    version: str | None
    packages: dict[str, str | None] | None  # None as a version: not installed
    unknown_reason: str | None


class SglangFacts(Facts):
    """SGLang's capabilities read from its installed files; `sources` names the file of each."""

    installed: bool | None
    version: str | None
    package_dir: str | None
    dflash: bool | None
    speculative_algorithms: list[str] | None  # what --speculative-algorithm accepts (NONE left out)
    ddtree: bool | None  # DDTREE among them: a build with SGLang's DDTree pull request (#29907)
    attention_backends: list[str] | None
    draft_attention_backends: list[str] | None
    kimi_k25_model: bool | None
    kimi_k25_classes: list[str] | None
    attention_backend_files: list[str] | None
    #: every option string of `python -m sglang.launch_server`, one list per argument, its flag first: what
    #: `deploy` resolves extra_args against (abbreviations and aliases, as SGLang's argparse reads them)
    launch_options: list[list[str]] | None
    #: the serving benchmark modules it has, preferred first (steps/bench_entry.py): sglang.benchmark.serving
    #: (0.5.23 on), the deprecated sglang.bench_serving; [] where neither; None from a probe that did not look
    bench_entry_points: list[str] | None = None
    sources: dict[str, str]
    unknown: dict[str, str]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mla_attention_backends(self) -> list[str] | None:
        """The attention backends of this SGLang that serve MLA models."""
        if self.attention_backends is None:
            return None
        return [b for b in self.attention_backends if b in MLA_BACKEND_ARCHS or b.endswith("_mla")]


class HubRepoFacts(Facts):
    repo: str
    repo_type: str = "model"  # or "dataset"
    revision: str
    sha: str | None
    files: int | None
    bytes: int | None
    readable: bool | None = None  # the token at hand may read its files (a gated repo's list is public); None: unknown
    unknown_reason: str | None
    #: the patterns the runbook's downloads of it include that match none of its files; None: none asked, or unknown
    missing: list[str] | None = None
    reason: str | None = None  # why `missing` is not empty: what the repo holds instead


class HostReport(Facts):
    """The document hostprograms/probe.py prints."""

    os: OsFacts
    cpu: CpuFacts
    memory: MemoryFacts
    disks: dict[str, DiskFacts]
    gpu: GpuFacts
    hf_token: TokenFacts
    models: ModelsFacts
    python: PythonFacts
    sglang: SglangFacts
    hub: dict[str, HubRepoFacts]


class ProbeFacts(HostReport):
    """The host's report plus what gates need from it; `unknown` says why a derived fact is null."""

    gpu_count: int
    gpu_arch: str | None
    gpu_memory_min_mib: int | None
    mla_backends_usable_on_gpu: list[str] | None
    unknown: dict[str, str]

    @classmethod
    def from_report(cls, report: HostReport) -> ProbeFacts:
        gpus = report.gpu.gpus
        unknown: dict[str, str] = {}
        arches = {g.arch for g in gpus}
        arch = arches.pop() if len(arches) == 1 else None  # None too when nvidia-smi gave no compute capability
        if not gpus:
            unknown["gpu_arch"] = f"no GPUs: {report.gpu.reason}"
        elif arch is None:
            caps = ", ".join(sorted({str(g.compute_capability) for g in gpus}))
            unknown["gpu_arch"] = f"the GPUs' compute capabilities differ or are unknown: {caps}"
        known = [g.memory_total_mib for g in gpus if g.memory_total_mib is not None]
        memory_min = min(known) if gpus and len(known) == len(gpus) else None
        if memory_min is None:
            unknown["gpu_memory_min_mib"] = unknown.get("gpu_arch") or "nvidia-smi gave no memory size for a GPU"
        mla = report.sglang.mla_attention_backends
        usable = [b for b in mla if arch in MLA_BACKEND_ARCHS.get(b, ())] if arch and mla is not None else None
        if usable is None:
            why = [f"GPU architecture unknown: {unknown['gpu_arch']}"] if arch is None else []
            if mla is None:
                why.append(f"SGLang's attention backends unknown: {report.sglang.unknown.get('attention_backends')}")
            unknown["mla_backends_usable_on_gpu"] = "; ".join(why)
        return cls(
            **dict(report),
            gpu_count=len(gpus),
            gpu_arch=arch,
            gpu_memory_min_mib=memory_min,
            mla_backends_usable_on_gpu=usable,
            unknown=unknown,
        )
