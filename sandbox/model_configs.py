"""Realistic config.json contents for the synthetic repos (test double data).

STUB: the inspect_config helper fills this in; signatures are fixed so other modules can import them.
"""

from __future__ import annotations

from typing import Any


def drafter_config() -> dict[str, Any]:
    """config.json of a DFlash drafter shaped like z-lab/Kimi-K2.6-DFlash."""
    return {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 6, "num_target_layers": 61,
            "block_size": 8, "dflash_config": {"target_layer_ids": [1, 12, 24, 35, 47, 58], "mask_token_id": 163838}}


def target_config() -> dict[str, Any]:
    """config.json of a target shaped like moonshotai/Kimi-K2.6 (DeepSeek-V3 style, text_config nesting)."""
    return {"architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61}}
