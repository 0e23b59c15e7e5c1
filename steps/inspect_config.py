"""`inspect_config`: read config.json of the target model and its DFlash drafter on the host, and
check them the way SGLang will read them, before a deployment spends minutes loading 600 GB.

The checking program is hostprograms/inspect_config.py (stdlib only), shipped by
`executor.hostprogram.host_program` and run by `python` on the host, where the configs are. Its result
document is validated here into `InspectConfigFacts`: every problem (each naming the file and the
field), what the drafter and the target are, and what the SGLang launch takes from them (`deploy`: the
draft token count is the drafter's block size). The default gate fails on any problem.

Paths may use the runbook's vars as `$name` or `${name}` and start with `~`; nothing else in them
is interpreted, and a var that is unset or empty stops the step with its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from executor.hostprogram import host_program
from executor.render import with_vars
from executor.runbook.model import Gate, Model
from executor.stepkind import RenderContext, StepSpec, host_document

if TYPE_CHECKING:
    from executor.transport.base import CommandResult

T = TypeVar("T")


class Known(Model, Generic[T]):
    """A fact, where it was read (`FILE FIELD`), or why it is not known."""

    value: T | None
    source: str | None
    unknown_reason: str | None


class QuantGroup(Model):
    """One compressed-tensors scheme: which layers, how their weights (and inputs) are stored."""

    name: str
    targets: list[str]
    weight_bits: int | None
    weight_type: str | None
    strategy: str | None
    group_size: int | None
    activation_bits: int | None


class Quantization(Model):
    """How the weights are stored; method `none` when the config names no quantization."""

    method: str
    format: str | None
    bits: int | None  # weight bits common to every group; None when they differ or are unset
    groups: list[QuantGroup]
    ignore: list[str]  # modules (or `re:` patterns) left unquantized
    quant_algo: str | None  # ModelOpt's algorithm, from hf_quant_config.json


class CustomCode(Model):
    auto_map: dict[str, str]
    python_files: list[str]
    missing_code_files: list[str]


class ModelDir(CustomCode):
    dir: str
    config_path: str
    config_read: bool
    architectures: Known[list[str]]
    model_type: Known[str]
    hidden_size: Known[int]
    vocab_size: Known[int]


class DrafterFacts(ModelDir):
    draft_layers: Known[int]
    num_target_layers: Known[int]
    block_size: Known[int]
    target_layer_ids: Known[list[int]]
    mask_token: Known[str]
    mask_token_id: Known[int]
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    output_multiplier: float
    has_dflash_py: bool


class TargetFacts(ModelDir):
    text_config_nested: bool
    text_architectures: Known[list[str]]
    text_model_type: Known[str]
    num_layers: Known[int]
    num_attention_heads: Known[int]
    attention_arch: Known[str]  # MLA (kv_lora_rank set) or MHA
    kv_lora_rank: Known[int]
    qk_rope_head_dim: Known[int]
    n_routed_experts: Known[int]
    num_experts_per_tok: Known[int]
    max_position_embeddings: Known[int]
    dtype: Known[str]
    quantization: Known[Quantization]


class DeployFacts(Model):
    """What `sglang.launch_server` takes from these configs."""

    model_path: str
    draft_model_path: str | None  # None: the step was given no drafter_dir
    speculative_num_draft_tokens: Known[int]
    trust_remote_code: bool  # a config's auto_map names custom code
    attention_arch: Known[str]


class InspectConfigFacts(Model):
    problems: list[str]
    drafter: DrafterFacts | None  # None: the step was given no drafter_dir
    target: TargetFacts
    deploy: DeployFacts


class InspectConfigStep(StepSpec):
    kind: Literal["inspect_config"] = "inspect_config"
    target_dir: str  # the target model's folder on the host (`~` and `$vars` expand there)
    drafter_dir: str | None = None  # the DFlash drafter's folder, checked against the target
    python: str = "python3"  # any python3 on the host (the program is stdlib only)

    def render(self, ctx: RenderContext) -> str:
        config = {"target_dir": self.target_dir, "drafter_dir": self.drafter_dir}
        return host_program("inspect_config", config, self.python)

    def summary(self, ctx: RenderContext) -> list[str]:
        drafter = f" and {with_vars(self.drafter_dir, ctx.vars)}" if self.drafter_dir else ""
        return [
            f"read config.json of {with_vars(self.target_dir, ctx.vars)}{drafter}: custom code, attention, the "
            "drafter's block size (what deploy chooses from), problems"
        ]

    def parse_facts(self, result: CommandResult) -> InspectConfigFacts:
        return host_document(result, InspectConfigFacts, "the config check")

    def default_gates(self) -> list[Gate]:
        return [
            Gate(that="exit_code == 0", message="the config check did not run to its end"),
            Gate(
                that="facts.problems | length == 0",
                message="config.json problems, each listed below as `problem: FILE: FIELD ...`",
            ),
        ]
