"""Synthetic Hub repos for the local Hub test double (sandbox/hub.py): small, deterministic, real formats.

Repos shaped like the ones the DFlash runbooks deploy, a few MB in all instead of ~600 GB:

- `DRAFTER_ID` (like z-lab/Kimi-K2.6-DFlash): config.json from `sandbox.model_configs.drafter_config()`,
  the `dflash.py` custom-code file, README.md and one `model.safetensors`;
- `TARGET_ID` (like moonshotai/Kimi-K2.6): config.json from `target_config()`, generation and tokenizer
  files (`tiktoken.model` is LFS-tracked, as on the Hub), and `SHARDS` safetensors shards
  `model-0000N-of-0000M.safetensors` with a `model.safetensors.index.json` whose weight_map and
  total_size match the shards;
- `TMP_LONG_ID` (like SubSir/Kimi-K2.6-DFlash-tmp-long): the drafter's layout, its config naming itself;
- `HYBRID_TARGET_ID` (like Qwen/Qwen3.6-27B): `hybrid_target_config()`, a tokenizer config, one shard;
- `SPEED_BENCH_ID`, a DATASET repository (`repo_type` "dataset": the Hub serves it under `/api/datasets/` and
  `/datasets/{repo}/resolve/`) named like nvidia/SPEED-Bench, holding sandbox/datasets.py's files in the formats
  SGLang's benchmark client reads (SPEED-Bench throughput JSONL, `custom` JSONL, ShareGPT JSON). The real
  nvidia/SPEED-Bench holds Parquet files per config (qualitative, throughput_1k ... throughput_32k), some of
  whose rows are placeholders that NVIDIA's preparation script fills in: not the JSONL the client reads (README,
  "Datasets"). Its `.jsonl` files are LFS here, so a dataset is verified by sha256 through the CDN as weights are.
  `SPEED_BENCH_PARQUET_ID` is a dataset repository shaped like the real one: a Parquet-like file per config and no
  JSONL, so a runbook pointed at it must fail at its probe, before any download.

`oversized_copy` makes a model folder whose checkpoint is as large as a real one (a sparse file), so
the SGLang stand-in's start-up memory check (sandbox/sglang_standin/memory.py) meets a model that
does not fit the GPUs.

Every `.safetensors` file is valid (8-byte little-endian header length, JSON header with dtype, shape and
data_offsets, then the data), written with the stdlib, so header checks and safetensors readers accept it.
Which files are LFS follows the Hub: the repo's own `.gitattributes` patterns, or a size of 10 MiB and more.
For each file `RepoFile` gives what the Hub's manifest says about it: size, sha256 (LFS oid), git blob id
(of the LFS pointer for LFS files), pointer size. `Repo.sha` is a 40-hex commit id derived from the content.

Nothing here is real model data: tensors are bytes of SHAKE-256, the README says it is a test double.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import hashlib
import json
import math
import shutil
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from sandbox.datasets import DATASET_FILES
from sandbox.model_configs import TMP_LONG_ID, custom_code_files, drafter_config, hybrid_target_config, target_config

DRAFTER_ID = "z-lab/Kimi-K2.6-DFlash"
TARGET_ID = "moonshotai/Kimi-K2.6"
HYBRID_TARGET_ID = "Qwen/Qwen3.6-27B"
SPEED_BENCH_ID = "nvidia/SPEED-Bench"  # a dataset repository (`Repo.repo_type`)
SPEED_BENCH_PARQUET_ID = "nvidia/SPEED-Bench-parquet"  # a dataset repository as the Hub's: Parquet, no JSONL
SHARDS = 4
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # the Hub stores files of 10 MiB and more in LFS whatever their name

GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.bin",
        "*.ckpt",
        "*.h5",
        "*.model",
        "*.msgpack",
        "*.onnx",
        "*.pt",
        "*.pth",
        "*.safetensors",
        "*.tar.*",
        "*.zip",
        "*tfevents*",
    )
)

_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1}


@dataclass(frozen=True)
class RepoFile:
    """One file of a repo and the metadata the Hub publishes about it."""

    path: str
    content: bytes
    lfs: bool

    @property
    def size(self) -> int:
        return len(self.content)

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @cached_property
    def pointer(self) -> bytes:
        """The git-lfs pointer git stores in place of an LFS file."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @cached_property
    def blob_id(self) -> str:
        """Git blob sha1 of what git stores: the pointer for LFS files, the content otherwise."""
        stored = self.pointer if self.lfs else self.content
        return hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()

    @property
    def etag(self) -> str:
        """What the Hub sends as (linked) ETag: sha256 for LFS files, the git blob sha1 otherwise."""
        return self.sha256 if self.lfs else self.blob_id


@dataclass(frozen=True)
class Repo:
    """A repo at one commit: files by path, reachable by revision `main` or by `sha`; `repo_type` is the
    Hub's ("model", or "dataset": served under the Hub's dataset paths only)."""

    repo_id: str
    files: Mapping[str, RepoFile]
    repo_type: str = "model"

    @cached_property
    def sha(self) -> str:
        listing = "".join(f"{path}\0{f.blob_id}\n" for path, f in sorted(self.files.items()))
        return hashlib.sha1(f"{self.repo_id}\n{listing}".encode()).hexdigest()

    @property
    def contents(self) -> dict[str, bytes]:
        return {path: f.content for path, f in self.files.items()}

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())

    @property
    def lfs_files(self) -> list[RepoFile]:
        return [f for f in self.files.values() if f.lfs]


def build_repo(repo_id: str, contents: Mapping[str, bytes], repo_type: str = "model") -> Repo:
    """A repo from its files' bytes; `.gitattributes` (added if absent) decides which are LFS."""
    contents = {".gitattributes": GITATTRIBUTES.encode(), **contents}
    patterns = [line.split()[0] for line in contents[".gitattributes"].decode().splitlines() if "filter=lfs" in line]

    def is_lfs(path: str, data: bytes) -> bool:
        name = path.rsplit("/", 1)[-1]
        return len(data) >= LFS_SIZE_THRESHOLD or any(fnmatch.fnmatchcase(name, p) for p in patterns)

    files = {path: RepoFile(path, data, is_lfs(path, data)) for path, data in sorted(contents.items())}
    return Repo(repo_id, files, repo_type)


def safetensors_bytes(tensors: Mapping[str, tuple[str, list[int]]], seed: str) -> bytes:
    """A valid safetensors file: tensors by name as (dtype, shape), data from SHAKE-256 of `seed`."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        end = offset + _nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header so the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + hashlib.shake_256(seed.encode()).digest(offset)


def _nbytes(dtype: str, shape: list[int]) -> int:
    return _DTYPE_BYTES[dtype] * math.prod(shape)


def tensor_bytes(tensors: Mapping[str, tuple[str, list[int]]]) -> int:
    """Bytes of data the tensors take (what `metadata.total_size` of a shard index sums)."""
    return sum(_nbytes(dtype, shape) for dtype, shape in tensors.values())


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def _png(width: int, height: int) -> bytes:
    """A valid grey PNG image (repos keep README figures in a folder: it gives the tree a directory)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _readme(repo_id: str, body: str) -> bytes:
    return (
        f"---\nlicense: other\nlibrary_name: transformers\n---\n# {repo_id} (synthetic test double)\n\n"
        f"{body}\nThis repository is generated by sandbox/repos.py for tests: the weights are random bytes.\n"
    ).encode()


DFLASH_PY = '''\
"""DFlash draft model (synthetic stand-in for the custom code shipped with DFlash drafters)."""

from transformers import PretrainedConfig, PreTrainedModel


class DFlashDraftModel(PreTrainedModel):
    """Block-diffusion drafter conditioned on hidden states of `target_layer_ids` of the target."""

    config_class = PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        self.block_size = getattr(config, "block_size", None) or config.dflash_config["block_size"]
'''


@functools.cache
def drafter_repo(repo_id: str = DRAFTER_ID) -> Repo:
    """A DFlash drafter repo shaped like z-lab/Kimi-K2.6-DFlash (or SubSir's tmp-long one, TMP_LONG_ID)."""
    config = drafter_config(None if repo_id == DRAFTER_ID else repo_id)
    hidden, tensors = 128, {"fc.weight": ("BF16", [128, 384]), "hidden_norm.weight": ("BF16", [128])}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"layers.{layer}"
        tensors |= {
            f"{prefix}.input_layernorm.weight": ("BF16", [hidden]),
            f"{prefix}.self_attn.q_proj.weight": ("BF16", [hidden, hidden]),
            f"{prefix}.self_attn.k_proj.weight": ("BF16", [32, hidden]),
            f"{prefix}.self_attn.v_proj.weight": ("BF16", [32, hidden]),
            f"{prefix}.self_attn.o_proj.weight": ("BF16", [hidden, hidden]),
            f"{prefix}.mlp.gate_proj.weight": ("BF16", [256, hidden]),
            f"{prefix}.mlp.down_proj.weight": ("BF16", [hidden, 256]),
        }
    tensors["norm.weight"] = ("BF16", [hidden])
    return build_repo(
        repo_id,
        {
            "README.md": _readme(repo_id, "DFlash block-diffusion drafter for Kimi-K2.6 (speculative decoding).\n"),
            "config.json": _json(config),
            "dflash.py": DFLASH_PY.encode(),
            "model.safetensors": safetensors_bytes(tensors, repo_id),
        },
    )


def hybrid_target_repo() -> Repo:
    """A hybrid linear-attention target shaped like Qwen/Qwen3.6-27B: config, tokenizer config, one shard."""
    hidden = 128
    tensors = {"model.language_model.embed_tokens.weight": ("BF16", [512, hidden])}
    for layer, kind in enumerate(hybrid_target_config()["text_config"]["layer_types"]):
        prefix = f"model.language_model.layers.{layer}"
        mixer = "linear_attn.in_proj_qkvz.weight" if kind == "linear_attention" else "self_attn.qkv_proj.weight"
        tensors |= {f"{prefix}.input_layernorm.weight": ("BF16", [hidden]), f"{prefix}.{mixer}": ("BF16", [32, hidden])}
    return build_repo(
        HYBRID_TARGET_ID,
        {
            "README.md": _readme(HYBRID_TARGET_ID, "Qwen3.6-27B: hybrid Gated DeltaNet + attention (test double).\n"),
            "config.json": _json(hybrid_target_config()),
            "tokenizer_config.json": _json({"tokenizer_class": "Qwen2Tokenizer"}),
            "model.safetensors": safetensors_bytes(tensors, HYBRID_TARGET_ID),
        },
    )


def _target_shards(num_layers: int) -> list[dict[str, tuple[str, list[int]]]]:
    """Tensors of a DeepSeek-V3 style model with INT4 packed experts, spread over `SHARDS` shards."""
    hidden = 128
    layers: list[dict[str, tuple[str, list[int]]]] = []
    for layer in range(num_layers):
        prefix = f"language_model.model.layers.{layer}"
        layers.append(
            {
                f"{prefix}.input_layernorm.weight": ("BF16", [hidden]),
                f"{prefix}.self_attn.q_a_proj.weight": ("BF16", [32, hidden]),
                f"{prefix}.self_attn.kv_a_proj_with_mqa.weight": ("BF16", [40, hidden]),
                f"{prefix}.self_attn.o_proj.weight": ("BF16", [hidden, hidden]),
                f"{prefix}.mlp.experts.0.down_proj.weight_packed": ("I32", [hidden, hidden // 8]),
                f"{prefix}.mlp.experts.0.down_proj.weight_scale": ("BF16", [hidden, hidden // 32]),
            }
        )
    shards: list[dict[str, tuple[str, list[int]]]] = [{} for _ in range(SHARDS)]
    shards[0]["language_model.model.embed_tokens.weight"] = ("BF16", [1024, hidden])
    per_shard = -(-num_layers // SHARDS)
    for layer, tensors in enumerate(layers):
        shards[layer // per_shard] |= tensors
    shards[-1] |= {
        "language_model.model.norm.weight": ("BF16", [hidden]),
        "language_model.lm_head.weight": ("BF16", [1024, hidden]),
    }
    return shards


@functools.cache
def target_repo() -> Repo:
    """A target repo shaped like moonshotai/Kimi-K2.6: sharded safetensors, index, config, tokenizer."""
    config = target_config()
    shards = _target_shards(config.get("text_config", config)["num_hidden_layers"])
    names = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    index = {
        "metadata": {"total_size": sum(tensor_bytes(t) for t in shards)},
        "weight_map": {tensor: name for name, t in zip(names, shards, strict=True) for tensor in sorted(t)},
    }
    vocab = b"".join(  # tiktoken's format: base64 of a token's bytes, space, rank
        base64.b64encode(hashlib.sha256(b"%d" % rank).digest()[: 1 + rank % 6]) + b" %d\n" % rank
        for rank in range(4096)
    )
    return build_repo(
        TARGET_ID,
        {
            "README.md": _readme(TARGET_ID, "Kimi K2.6: MoE with MLA attention, INT4 experts (compressed-tensors).\n"),
            "config.json": _json(config),
            "generation_config.json": _json({"max_length": 262144, "eos_token_id": 163586}),
            "tokenizer_config.json": _json(
                {
                    "tokenizer_class": "TikTokenTokenizer",
                    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                }
            ),
            "tokenization_kimi.py": b'"""Kimi tiktoken tokenizer (synthetic stand-in for the custom code)."""\n',
            **{
                name: f'"""{name}: synthetic stand-in for the repo\'s custom code (test data)."""\n'.encode()
                for name in custom_code_files(config)
            },
            "tiktoken.model": vocab,
            "model.safetensors.index.json": _json(index),
            "figures/kimi-logo.png": _png(16, 16),
            **{name: safetensors_bytes(t, f"{TARGET_ID}/{name}") for name, t in zip(names, shards, strict=True)},
        },
    )


@functools.cache
def speed_bench_repo() -> Repo:
    """The dataset repository named like nvidia/SPEED-Bench: sandbox/datasets.py's files (see the module's doc)."""
    readme = (
        "---\nlicense: other\n---\n# nvidia/SPEED-Bench (synthetic test double)\n\nSmall benchmark files in the "
        "formats SGLang's benchmark client reads, generated by sandbox/datasets.py for tests.\n"
    )
    files = {name: make() for name, make in DATASET_FILES.items()}
    attributes = GITATTRIBUTES + "*.jsonl filter=lfs diff=lfs merge=lfs -text\n"
    contents = {".gitattributes": attributes.encode(), "README.md": readme.encode(), **files}
    return build_repo(SPEED_BENCH_ID, contents, repo_type="dataset")


@functools.cache
def speed_bench_parquet_repo() -> Repo:
    """A dataset repository laid out as the real nvidia/SPEED-Bench (a Parquet file per config, none of the JSONL
    SGLang's client reads): Parquet's magic bytes around a few bytes that say it is a test double, not a table."""
    configs = ("qualitative", "throughput_1k", "throughput_2k")
    body = b"PAR1 synthetic test double: no Parquet table PAR1"
    contents = {f"{config}/test-00000-of-00001.parquet": body for config in configs}
    readme = "---\nlicense: other\n---\n# nvidia/SPEED-Bench as on the Hub (synthetic test double): Parquet only\n"
    return build_repo(SPEED_BENCH_PARQUET_ID, contents | {"README.md": readme.encode()}, repo_type="dataset")


def default_repos() -> dict[str, Repo]:
    """The repos the Hub test double serves unless told otherwise, by repo id."""
    repos = (drafter_repo(), drafter_repo(TMP_LONG_ID), target_repo(), hybrid_target_repo(), speed_bench_repo())
    return {repo.repo_id: repo for repo in (*repos, speed_bench_parquet_repo())}


def oversized_copy(source: Path, dest: Path, weight_bytes: int) -> Path:
    """`dest`: the model folder `source` (config and all) with its checkpoint replaced by one sparse
    shard of `weight_bytes` (no disk used), as large as the real model's weights."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != "model.safetensors.index.json":
            shutil.copyfile(path, dest / path.name)
    with open(dest / "model.safetensors", "wb") as shard:
        shard.truncate(weight_bytes)
    return dest
