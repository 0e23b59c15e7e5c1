"""config.json contents for the synthetic model repos: TEST DATA, not copies of the real files.

Test double data, used by the tests and the local Hub's synthetic repos, never by a real run.
The shapes follow what SGLang 0.5.23 reads from these models and what their public model cards
state, so the checks of the `inspect_config` step meet realistic input:

- the drafter is shaped like z-lab/Kimi-K2.6-DFlash: a Qwen3-style decoder of 6 layers at the
  target's width (7168), `architectures: ["DFlashDraftModel"]`, the DFlash fields SGLang's
  `parse_dflash_draft_config` reads (`block_size`, `num_target_layers`,
  `dflash_config.target_layer_ids`, `dflash_config.mask_token_id`) and an `auto_map` naming its
  custom code `dflash.py`. 6 layers x (64 query heads, 8 KV heads, head_dim 128, MLP 18432) plus
  the 6 x 7168 -> 7168 context projection is ~3.5 G parameters, ~6.5 GiB in bf16: the size the
  seeds saw on disk;
- the target is shaped like moonshotai/Kimi-K2.6 (the Kimi K2.5 layout SGLang's
  `configs/kimi_k25.py` reads): `KimiK25ForConditionalGeneration` with the language model, a
  DeepSeek-V3 MoE with MLA (61 layers, 384 routed experts, 8 per token), nested in `text_config`
  next to a MoonViT `vision_config`; the experts are INT4 (compressed-tensors, pack-quantized,
  group size 32) while attention, shared experts, the dense first layer and the vision tower stay
  bf16 (`ignore`).

- a second drafter shaped like SubSir/Kimi-K2.6-DFlash-tmp-long (`drafter_config(TMP_LONG_ID)`): the
  same layout, its config naming itself in `_name_or_path` (as configs saved by transformers do),
  which the SGLang stand-in reads to give it its acceptance profile (worse on code);
- a hybrid target shaped like Qwen/Qwen3.6-27B (`hybrid_target_config()`, the Qwen3.5 layout SGLang's
  `configs/qwen3_5.py` reads): `Qwen3_5ForConditionalGeneration`, 64 text layers of which three in
  four are Gated DeltaNet linear attention (`layer_types`: "linear_attention") and every fourth full
  attention, the layout whose recurrent state DDTree's sibling branches corrupt (the seeds' collapse at
  budgets 32/64).

The values that tie the two together (61 target layers, hidden size 7168, vocab 163840) match, so
a fault in a test is one edit away. `custom_code_files` lists the Python files an `auto_map`
names: a synthetic repo ships those files next to config.json, as the real repos do.
"""

from __future__ import annotations

from typing import Any

DRAFT_LAYERS = 6
TARGET_LAYERS = 61
HIDDEN_SIZE = 7168
VOCAB_SIZE = 163840
BLOCK_SIZE = 8
# DFlash's default spread of 6 context layers over 61: round(1 + i * 57 / 5)
TARGET_LAYER_IDS = [1, 12, 24, 35, 47, 58]
MASK_TOKEN_ID = 163838  # a reserved token of the Kimi tokenizer
BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID = 163584, 163585, 163839


TMP_LONG_ID = "SubSir/Kimi-K2.6-DFlash-tmp-long"
HYBRID_LAYERS = 64
HYBRID_FULL_ATTENTION_INTERVAL = 4


def drafter_config(name: str | None = None) -> dict[str, Any]:
    """config.json of a DFlash drafter shaped like z-lab/Kimi-K2.6-DFlash; `name` its `_name_or_path`."""
    return ({"_name_or_path": name} if name else {}) | {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": BLOCK_SIZE,
        "bos_token_id": BOS_TOKEN_ID,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": list(TARGET_LAYER_IDS)},
        "dtype": "bfloat16",
        "eos_token_id": EOS_TOKEN_ID,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": 0.02,
        "intermediate_size": 18432,
        "layer_types": ["full_attention"] * DRAFT_LAYERS,
        "max_position_embeddings": 262144,
        "max_window_layers": DRAFT_LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": 64,
        "num_hidden_layers": DRAFT_LAYERS,
        "num_key_value_heads": 8,
        "num_target_layers": TARGET_LAYERS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 50000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }


def _int4_experts() -> dict[str, Any]:
    """compressed-tensors INT4 for the routed experts only (Kimi K2 Thinking / K2.5 / K2.6 style)."""
    return {
        "config_groups": {
            "group_0": {
                "input_activations": None,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": 32,
                    "num_bits": 4,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "group",
                    "symmetric": True,
                    "type": "int",
                },
            }
        },
        "format": "pack-quantized",
        "ignore": [
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*vision_tower.*",
            "re:.*mm_projector.*",
        ],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def deepseek_v3_text_config() -> dict[str, Any]:
    """The language model of Kimi K2.x: DeepSeek-V3 architecture (MLA attention, 384-expert MoE).

    This is also what a flat DeepSeek-V3-style config.json holds at its top level.
    """
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": BOS_TOKEN_ID,
        "dtype": "bfloat16",
        "eos_token_id": EOS_TOKEN_ID,
        "ep_size": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": 0.02,
        "intermediate_size": 18432,
        "kv_lora_rank": 512,
        "max_position_embeddings": 262144,
        "model_type": "kimi_k2",
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": TARGET_LAYERS,
        "num_key_value_heads": 64,
        "num_nextn_predict_layers": 0,
        "pad_token_id": PAD_TOKEN_ID,
        "pretraining_tp": 1,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "quantization_config": _int4_experts(),
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 64.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 50000.0,
        "routed_scaling_factor": 2.827,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "use_cache": True,
        "v_head_dim": 128,
        "vocab_size": VOCAB_SIZE,
    }


def target_config() -> dict[str, Any]:
    """config.json of a target shaped like moonshotai/Kimi-K2.6 (DeepSeek-V3 style, text_config nesting)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {
            "AutoConfig": "configuration_kimi_k25.KimiK25Config",
            "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
        },
        "ignore_index": -100,
        "media_placeholder_token_id": 163605,
        "model_type": "kimi_k25",
        "pad_token_id": PAD_TOKEN_ID,
        "text_config": deepseek_v3_text_config(),
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "vision_config": {
            "init_pos_emb_height": 64,
            "init_pos_emb_time": 4,
            "init_pos_emb_width": 64,
            "merge_kernel_size": [2, 2],
            "merge_type": "sd2_tpool",
            "mm_hidden_size": 1152,
            "mm_projector_type": "patchmerger",
            "patch_size": 14,
            "pos_emb_type": "divided_fixed",
            "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-05,
            "text_hidden_size": HIDDEN_SIZE,
            "video_attn_type": "spatial_temporal",
            "vt_hidden_size": 1152,
            "vt_intermediate_size": 4304,
            "vt_num_attention_heads": 16,
            "vt_num_hidden_layers": 27,
        },
    }


def hybrid_target_config() -> dict[str, Any]:
    """config.json of a hybrid linear-attention target shaped like Qwen/Qwen3.6-27B (Qwen3.5 layout)."""
    layer_types = [
        "full_attention" if (i + 1) % HYBRID_FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for i in range(HYBRID_LAYERS)
    ]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": 248056,
        "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "dtype": "bfloat16",
            "eos_token_id": 248044,
            "full_attention_interval": HYBRID_FULL_ATTENTION_INTERVAL,
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": 5120,
            "initializer_range": 0.02,
            "intermediate_size": 17408,
            "layer_types": layer_types,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "linear_value_head_dim": 128,
            "max_position_embeddings": 262144,
            "model_type": "qwen3_5_text",
            "num_attention_heads": 24,
            "num_hidden_layers": HYBRID_LAYERS,
            "num_key_value_heads": 4,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000000,
                "rope_type": "default",
            },
            "tie_word_embeddings": False,
            "use_cache": True,
            "vocab_size": 248320,
        },
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "video_token_id": 248057,
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "model_type": "qwen3_5",
            "num_heads": 16,
            "out_hidden_size": 5120,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": 248054,
        "vision_start_token_id": 248053,
    }


def custom_code_files(config: dict[str, Any]) -> list[str]:
    """The Python files the `auto_map` of a config names (`dflash.DFlashDraftModel` -> dflash.py)."""
    refs = config.get("auto_map", {}).values()
    return sorted({ref.rsplit(".", 1)[0].replace(".", "/") + ".py" for ref in refs})
