"""Resolve a `python -m sglang.launch_server` command line as SGLang 0.5.23 would (TEST DOUBLE).

Two kinds of refusal, placed where the real server places them:

- argument errors (`prepare_server_args`, speculative_hook.py `_handle_dflash`): raised as
  ValueError before anything starts, so the process ends with a traceback and exit status 1;
- GPU errors (no driver, too few GPUs, an attention backend the GPU's architecture cannot run):
  found "in the scheduler" while loading, returned as the exception line the scheduler logs
  after `Scheduler hit an exception:`.

`--speculative-algorithm` takes the names of the installed release's `SpeculativeAlgorithm` (read with
ast), as `from_string` does: 0.5.23 refuses DDTREE with its "Unknown speculative algorithm name"; the
build with the DDTree pull request (sandbox/prepare.py) knows it and its `--speculative-ddtree-budget`
(the checks of the budget here are the stand-in's own wording: the PR is not released). The resolved
`Speculation` (simulation.py) carries what acceptance and cost depend on: the drafter's block and
`_name_or_path`, the budget, whether the target has linear-attention layers; `Weights` the checkpoint
bytes the start-up memory check needs (memory.py).

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

from . import launch_args, memory
from .simulation import Speculation

# what the stand-in simulates; everything else is refused honestly (DDTREE: only where the installed
# SGLang knows it, a build with the DDTree pull request)
SPECULATIVE_ALGORITHMS = ("DFLASH", "DDTREE")
DEFAULT_DFLASH_BLOCK = 16
NO_DRIVER = (
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
    "and installed a driver from http://www.nvidia.com/Download/index.aspx"
)
#: srt/utils/hf_transformers/tokenizer.py (0.5.23), raised when transformers refuses a custom tokenizer (Kimi's
#: tiktoken one) because the launch lacks --trust-remote-code: the process ends with a traceback, exit 1.
CUSTOM_TOKENIZER_ERROR = (
    "Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available in the HuggingFace "
    "transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` "
    "flag in the CLI."
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
    speculation: Speculation | None = None  # None: no speculative decoding
    weights: memory.Weights = field(default_factory=lambda: memory.Weights(0, 0))

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
        resolved.update(nnodes=int(self.args.nnodes or 1), node_rank=int(self.args.node_rank or 0))
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


def _custom_tokenizer(path: Path) -> bool:
    """Whether the tokenizer in `path` is remote code: tokenizer_config.json's `auto_map` names an AutoTokenizer
    (Kimi's `tokenization_kimi.TikTokenTokenizer`), which transformers runs only with trust_remote_code. The
    stand-in's rule: transformers also loads such a tokenizer when it knows the class itself."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    named = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    return any(isinstance(ref, str) for ref in (named if isinstance(named, list) else [named]))


def _draft_block_size(draft: dict[str, Any]) -> int | None:
    """block_size at the top level or in dflash_config (dflash_utils.parse_dflash_draft_config)."""
    for where in (draft, draft.get("dflash_config") or {}):
        if isinstance(where, dict) and isinstance(where.get("block_size"), int):
            return int(where["block_size"])
    return None


def _hybrid(config: dict[str, Any]) -> bool:
    """Whether the target has linear-attention (Mamba/GDN) layers: `layer_types` (Qwen3.5/3.6, Qwen3-Next)."""
    text = config.get("text_config")
    layers = (text if isinstance(text, dict) else config).get("layer_types") or []
    return "linear_attention" in layers


def _draft_tokens(args: argparse.Namespace, draft: dict[str, Any], warnings: list[str]) -> int:
    """The draft tokens per step as SGLang settles them: the block size, the draft model's, or its default
    (with a warning in `warnings`); ValueError for a block size that is not positive or differs."""
    block, tokens = args.speculative_dflash_block_size, args.speculative_num_draft_tokens
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
    return int(tokens)


def _ddtree_budget(args: argparse.Namespace, algorithm: str) -> int | None:
    """DDTREE's tree budget: required by DDTREE, refused by the others; ValueError with SGLang's message."""
    budget = getattr(args, "speculative_ddtree_budget", None)
    if algorithm == "DDTREE" and budget is None:
        raise ValueError("DDTREE speculative decoding requires setting --speculative-ddtree-budget.")
    if algorithm != "DDTREE" and budget is not None:
        raise ValueError("--speculative-ddtree-budget is only valid with --speculative-algorithm DDTREE.")
    if budget is not None and budget <= 0:
        raise ValueError(f"DDTREE requires --speculative-ddtree-budget to be positive, got {budget}.")
    return budget


def resolve(args: argparse.Namespace, argv: list[str]) -> Launch:
    """Check the arguments like prepare_server_args; ValueError (AssertionError where check_server_args
    asserts; RuntimeError for a custom tokenizer without --trust-remote-code) with SGLang's message if refused."""
    if not args.model_path:
        raise ValueError("the following arguments are required: --model-path/--model")
    if int(args.tp_size or 1) % int(args.nnodes or 1) != 0:  # validation_hook.check_server_args (pp_size 1)
        raise AssertionError("tp_size must be divisible by number of nodes")
    target = _read_config(Path(args.model_path))
    tokenizer = Path(args.tokenizer_path or args.model_path)
    if not args.trust_remote_code and not args.skip_tokenizer_init and _custom_tokenizer(tokenizer):
        raise RuntimeError(CUSTOM_TOKENIZER_ERROR)  # the tokenizer manager, before any request is served
    architectures = list(target.get("architectures") or [])
    algorithm = args.speculative_algorithm
    weights = memory.Weights(memory.weight_bytes(Path(args.model_path)), 0)
    if algorithm is None:
        return Launch(args, argv, architectures, None, weights=weights)
    if algorithm.upper() not in launch_args.speculative_algorithms(launch_args.sglang_dir()):
        raise ValueError(f"Unknown speculative algorithm name: {algorithm}")  # SpeculativeAlgorithm.from_string
    algorithm = algorithm.upper()
    if algorithm not in SPECULATIVE_ALGORITHMS:
        raise ValueError(f"the SGLang stand-in (a test double) simulates only DFLASH and DDTREE, not {algorithm!r}")
    if args.speculative_draft_model_path is None:
        raise ValueError(f"{algorithm} speculative decoding requires setting --speculative-draft-model-path.")
    draft = _read_config(Path(args.speculative_draft_model_path))
    weights = memory.Weights(weights.target, memory.weight_bytes(Path(args.speculative_draft_model_path)))
    warnings: list[str] = []
    tokens = _draft_tokens(args, draft, warnings)
    budget = _ddtree_budget(args, algorithm)
    drafter = draft.get("_name_or_path")
    speculation = Speculation(
        algorithm, int(tokens), budget, drafter if isinstance(drafter, str) else None, _hybrid(target)
    )
    # DDTREE's CUDA graphs are captured for budget + 1 draft tokens (sglang-dflash.md)
    draft_tokens = int(tokens) if budget is None else budget + 1
    return Launch(args, argv, architectures, draft_tokens, warnings, speculation, weights)


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
    """The exception line a scheduler of this launch dies with on these GPUs, or None. A node of a
    multi-node launch runs tp_size / nnodes TP ranks, one per GPU (engine.py _calculate_rank_ranges)."""
    if not gpus:
        return NO_DRIVER
    tp, nnodes = int(launch.args.tp_size or 1), int(launch.args.nnodes or 1)
    if tp // nnodes > len(gpus):
        first = int(launch.args.node_rank or 0) * (tp // nnodes)
        split = f" over --nnodes {nnodes}: {tp // nnodes} per node" if nnodes > 1 else ""
        return (
            "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
            f"GPU {len(gpus)} requested by tp rank {first + len(gpus)} (--tp-size {tp}{split}); "
            f"this host has {len(gpus)} GPU(s)"
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
