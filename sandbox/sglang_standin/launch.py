"""Resolve a `python -m sglang.launch_server` command line as SGLang 0.5.23 would (TEST DOUBLE).

Two kinds of refusal, placed where the real server places them:

- argument errors (`prepare_server_args`, speculative_hook.py `_handle_dflash`): raised as
  ValueError before anything starts, so the process ends with a traceback and exit status 1;
- GPU errors (no driver, too few GPUs, an attention backend the GPU's architecture cannot run):
  found "in the scheduler" while loading, returned as the exception line the scheduler logs
  after `Scheduler hit an exception:`.

The GPUs are asked from `nvidia-smi` on PATH (on the test host: the nvidia-smi test double,
sandbox/gpu.py, following RUNBOOK_SANDBOX_GPU), as the real server asks the driver.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# what the stand-in simulates; everything else is refused honestly
SPECULATIVE_ALGORITHMS = ("DFLASH",)
DEFAULT_DFLASH_BLOCK = 16
NO_DRIVER = (
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
    "and installed a driver from http://www.nvidia.com/Download/index.aspx"
)
FA3_ERROR = (
    "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use `--attention-backend flashinfer`."
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    major: int
    minor: int
    memory_mib: int


@dataclass(frozen=True)
class Launch:
    """A resolved launch: what the server runs with and reports in /server_info."""

    args: argparse.Namespace
    argv: list[str]
    architectures: list[str]
    draft_tokens: int | None  # None: no speculative decoding
    warnings: list[str] = field(default_factory=list)

    @property
    def speculative(self) -> bool:
        return self.draft_tokens is not None

    @property
    def served_model_name(self) -> str:
        return str(self.args.served_model_name or self.args.model_path)

    @property
    def host(self) -> str:
        return str(self.args.host or "127.0.0.1")

    @property
    def port(self) -> int:
        return int(self.args.port or 30000)

    def server_args(self) -> dict[str, Any]:
        """The resolved arguments as /server_info and the `server_args=` log line show them: every
        field of the release (unset ones null: the stand-in resolves only those it simulates)."""
        resolved = dict(sorted(vars(self.args).items()))
        resolved.update(host=self.host, port=self.port, tp_size=int(self.args.tp_size or 1))
        resolved["served_model_name"] = self.served_model_name
        if self.speculative:
            resolved.update(
                speculative_num_draft_tokens=self.draft_tokens, speculative_num_steps=1, speculative_eagle_topk=1
            )
        return resolved


def _read_config(path: Path) -> dict[str, Any]:
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(
            f"{path} does not appear to have a file named config.json. "
            f"Checkout 'https://huggingface.co/{path}/tree/None' for available files."
        )
    data = json.loads(config.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{config} is not a JSON object")
    return data


def _draft_block_size(draft: dict[str, Any]) -> int | None:
    """block_size at the top level or in dflash_config (dflash_utils.parse_dflash_draft_config)."""
    for where in (draft, draft.get("dflash_config") or {}):
        if isinstance(where, dict) and isinstance(where.get("block_size"), int):
            return int(where["block_size"])
    return None


def resolve(args: argparse.Namespace, argv: list[str]) -> Launch:
    """Check the arguments like prepare_server_args; ValueError with SGLang's message if refused."""
    if not args.model_path:
        raise ValueError("the following arguments are required: --model-path/--model")
    architectures = list(_read_config(Path(args.model_path)).get("architectures") or [])
    algorithm = args.speculative_algorithm
    if algorithm is None:
        return Launch(args, argv, architectures, None)
    if algorithm not in SPECULATIVE_ALGORITHMS:
        raise ValueError(f"the SGLang stand-in (a test double) simulates only DFLASH, not {algorithm!r}")
    if args.speculative_draft_model_path is None:
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    draft = _read_config(Path(args.speculative_draft_model_path))
    block, tokens = args.speculative_dflash_block_size, args.speculative_num_draft_tokens
    warnings = []
    if block is not None:
        if block <= 0:
            raise ValueError(f"DFLASH requires --speculative-dflash-block-size to be positive, got {block}.")
        if tokens is not None and tokens != block:
            raise ValueError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                "but they differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={tokens}, speculative_dflash_block_size={block}."
            )
        tokens = block
    if tokens is None:
        tokens = _draft_block_size(draft)
    if tokens is None:
        tokens = DEFAULT_DFLASH_BLOCK
        warnings.append(f"speculative_num_draft_tokens is not set; defaulting to {tokens} for DFLASH.")
    return Launch(args, argv, architectures, int(tokens), warnings)


def query_gpus() -> list[Gpu] | None:
    """The GPUs nvidia-smi reports, None when there is no working driver (or no nvidia-smi)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    gpus = []
    for line in done.stdout.splitlines():
        index, name, cap, memory = (part.strip() for part in line.split(","))
        major, minor = cap.split(".")
        gpus.append(Gpu(int(index), name, int(major), int(minor), int(memory)))
    return gpus


def scheduler_error(launch: Launch, gpus: list[Gpu] | None) -> str | None:
    """The exception line a scheduler of this launch dies with on these GPUs, or None."""
    if not gpus:
        return NO_DRIVER
    tp = int(launch.args.tp_size or 1)
    if tp > len(gpus):
        return (
            "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
            f"GPU {len(gpus)} requested by tp rank {len(gpus)} (--tp-size {tp}); this host has {len(gpus)} GPU(s)"
        )
    gpu = gpus[0]
    sm = f"SM{gpu.major}{gpu.minor}"
    backends = [launch.args.attention_backend, launch.args.decode_attention_backend]
    if launch.speculative:
        backends.append(launch.args.speculative_draft_attention_backend)
    for backend in backends:
        if backend == "trtllm_mla" and gpu.major != 10:
            return (
                "RuntimeError: trtllm-gen MLA kernels: Unsupported architecture "
                f"{sm} ({gpu.name}); trtllm_mla needs SM100/SM103 (Blackwell B200/B300)"
            )
        if backend == "fa3" and gpu.major not in (8, 9):
            return FA3_ERROR
    return None
