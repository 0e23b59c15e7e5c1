"""GPU memory at start-up (TEST DOUBLE): does the configuration fit the GPUs nvidia-smi reports?

As SGLang 0.5.23 lays it out per GPU (model_runner.py, pool_configurator.py): the target's weights
split over the tensor-parallel ranks, the drafter's weights on every rank, and the KV cache in what
`--mem-fraction-static` (of the GPU's memory) leaves after the weights and the CUDA graphs. The
weights are the bytes of the checkpoint files in the model folders (what the real loader moves to the
GPUs), so a test makes a configuration too big with a sparse shard (`sandbox.repos.oversized_copy`).

Two failures, with the real lines: weights that do not fit a GPU at all fail while loading with
torch's CUDA out-of-memory error; weights that fit but leave no room for the KV cache fail in
MemoryPoolConfig with "Not enough memory. Please try to increase --mem-fraction-static.".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
MIB = 2**20
#: the fraction SGLang settles on for a large GPU when `--mem-fraction-static` is not given
DEFAULT_MEM_FRACTION = 0.88
#: per GPU, what the CUDA graphs take per token verified in one step (draft tokens or tree nodes)
CUDA_GRAPH_BYTES_PER_TOKEN = 64 * MIB
CUDA_GRAPH_BASE_BYTES = 2 * GIB
#: one token's KV entry of an MLA target shaped like Kimi K2.6 (61 layers x (512 + 64) x bf16)
KV_BYTES_PER_TOKEN = 61 * (512 + 64) * 2
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class Weights:
    """Bytes of the checkpoint files: the target's and the drafter's (0 without one)."""

    target: int
    draft: int

    def per_gpu(self, tp_size: int) -> int:
        return self.target // max(tp_size, 1) + self.draft


@dataclass(frozen=True)
class Fit:
    """How the memory of one GPU is used once the server is up."""

    total: int
    weights: int
    kv: int

    @property
    def kv_tokens(self) -> int:
        return self.kv // KV_BYTES_PER_TOKEN


def weight_bytes(folder: Path) -> int:
    """The checkpoint's bytes in a model folder (file sizes as the file system reports them)."""
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def fit(weights: Weights, tp_size: int, gpu_memory_mib: int, mem_fraction: float | None, verified: int) -> Fit:
    total = gpu_memory_mib * MIB
    per_gpu = weights.per_gpu(tp_size)
    graphs = CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_BYTES_PER_TOKEN * verified
    kv = int(total * (mem_fraction or DEFAULT_MEM_FRACTION)) - per_gpu - graphs
    return Fit(total, per_gpu, kv)


def load_error(memory: Fit) -> str | None:
    """torch's line when the weights alone do not fit one GPU (raised while loading them)."""
    if memory.weights <= memory.total:
        return None
    shard = memory.weights - memory.total // 2
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {shard / GIB:.2f} GiB. GPU 0 has a total "
        f"capacity of {memory.total / GIB:.2f} GiB of which {memory.total // 2 // MIB} MiB is free. Including "
        f"non-PyTorch memory, this process has {(memory.total - memory.total // 2) / GIB:.2f} GiB memory in use."
    )


def pool_error(memory: Fit, mem_fraction: float | None) -> str | None:
    """MemoryPoolConfig's line when no KV cache token fits (pool_configurator.py)."""
    if memory.kv_tokens > 0:
        return None
    return (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        f"Current value: mem_fraction_static={mem_fraction or DEFAULT_MEM_FRACTION}"
    )
