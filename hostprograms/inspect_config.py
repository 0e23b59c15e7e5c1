"""Checks config.json of a DFlash drafter and its target model. Runs ON THE HOST.

The `inspect_config` step (steps/inspect_config.py) ships this program with the kit to the host's
Python (stdlib only). Its config: `target_dir` and `drafter_dir` (or null), as the runbook wrote them
(`~` and `$var` expand here, kit.expand_path). It prints the facts as its one result document and
every problem on stderr, `problem: ...` one per line, so that a failed gate's output tail lists them.
It exits 0 whenever it wrote the document: problems are for gates to judge; any other exit means the
checker itself broke.

The drafter checks follow what SGLang's DFLASH loader reads (sglang 0.5.23:
srt/speculative/dflash_utils.py `parse_dflash_draft_config`, srt/arg_groups/speculative_hook.py
`_handle_dflash`), written anew. Where SGLang would silently pick one of two values, ignore a
field or fall back to a default block size of 16, this reports a problem instead. Every problem
names the file and the field: `/models/X/config.json: dflash_config.block_size = 0 must be ...`.

A fact that cannot be determined is `{"value": null, "unknown_reason": ...}`, never a bare null.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from hostprograms import kit

MIN_PYTHON = (3, 7)
CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SGLANG_DEFAULT_BLOCK_SIZE = 16
DEFAULT_MASK_TOKEN = "<|MASK|>"
# read by SGLang from dflash_config only: a top-level copy is silently ignored
DFLASH_ONLY = (
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
    "output_multiplier",
)


def known(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source, "unknown_reason": None}


def unknown(reason: str) -> dict[str, Any]:
    return {"value": None, "source": None, "unknown_reason": reason}


def show(value: Any) -> str:
    """A config value as it reads in JSON, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


class Section:
    """One JSON object of a config file, and how its fields are named in messages.

    `data` is None when the file could not be read: every field is then unknown for that
    reason, and no field is reported missing (the file's problem already was).
    """

    def __init__(self, data: dict[str, Any] | None, file: str, prefix: str, problems: Problems) -> None:
        self.data = data
        self.file = file
        self.prefix = prefix
        self.problems = problems

    def has(self, key: str) -> bool:
        return self.data is not None and key in self.data

    def get(self, key: str) -> Any:
        return None if self.data is None else self.data.get(key)

    def name(self, key: str) -> str:
        return self.prefix + key

    def source(self, key: str) -> str:
        return f"{self.file} {self.name(key)}"

    def problem(self, key: str, message: str) -> None:
        self.problems.add(self.file, f"{self.name(key)} = {show(self.get(key))} {message}")

    def missing(self, key: str) -> dict[str, Any]:
        """Unknown, saying why: no file, no such field, or null."""
        if self.data is None:
            return unknown(f"{self.file} could not be read")
        state = "is null" if self.has(key) else "is not"
        return unknown(f"{self.name(key)} {state} in {self.file}")

    def absent(self, key: str, required: str | None) -> dict[str, Any]:
        """A field that is missing or null (SGLang reads both as unset); a problem if `required`."""
        if required and self.data is not None:
            state = "is null" if self.has(key) else "is missing"
            self.problems.add(self.file, f"{self.name(key)} {state}: {required}")
        return self.missing(key)

    def invalid(self, key: str, message: str) -> dict[str, Any]:
        self.problem(key, message)
        return unknown(f"{self.name(key)} in {self.file} is invalid")

    def child(self, key: str) -> Section | None:
        """The object under `key`; None when unset; a problem when not an object."""
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.problem(key, "must be a JSON object")
            return None
        return Section(value, self.file, f"{self.name(key)}.", self.problems)

    def integer(self, key: str, minimum: int, required: str | None = None) -> dict[str, Any]:
        """An integer >= minimum; `required` says why its absence is a problem."""
        value = self.get(key)
        if value is None:
            return self.absent(key, required)
        if not is_int(value) or value < minimum:
            return self.invalid(key, f"must be an integer >= {minimum}")
        return known(value, self.source(key))

    def strings(self, key: str, required: str | None = None) -> dict[str, Any]:
        """A non-empty list of names (`architectures`)."""
        value = self.get(key)
        if value is None:
            return self.absent(key, required)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            return self.invalid(key, "must be a non-empty list of names")
        return known(value, self.source(key))

    def text(self, key: str) -> dict[str, Any]:
        value = self.get(key)
        if value is None:
            return self.missing(key)
        if not isinstance(value, str):
            return self.invalid(key, "must be a string")
        return known(value, self.source(key))


def list_folder(model_dir: str, problems: Problems) -> list[str] | None:
    try:
        return sorted(os.listdir(model_dir))
    except FileNotFoundError:
        problems.add(model_dir, "no such directory")
    except NotADirectoryError:
        problems.add(model_dir, "not a directory")
    except OSError as exc:
        problems.add(model_dir, f"cannot list the directory: {exc.strerror or exc}")
    return None


def read_json(path: str, problems: Problems) -> dict[str, Any] | None:
    """The JSON object in a file; None, with the problem said, when it is missing or malformed."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        problems.add(path, "no such file")
        return None
    except OSError as exc:
        problems.add(path, f"cannot read it: {exc.strerror or exc}")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.add(path, f"not UTF-8 text (byte {exc.start})")
        return None

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                problems.add(path, f"key {json.dumps(key)} appears twice in one object; JSON readers keep the last")
            seen[key] = value
        return seen

    try:
        config = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        problems.add(path, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
        return None
    except RecursionError:
        problems.add(path, "JSON nested too deeply to read")
        return None
    if not isinstance(config, dict):
        problems.add(path, f"expected a JSON object at the top, got {type(config).__name__}")
        return None
    return config


def custom_code(sections: list[Section | None], names: list[str], problems: Problems) -> dict[str, Any]:
    """Python files in the folder, and those an `auto_map` names but the folder lacks."""
    auto_map: dict[str, str] = {}
    missing: list[str] = []
    for section in sections:
        if section is None or not section.has("auto_map"):
            continue
        mapping = section.get("auto_map")
        if not isinstance(mapping, dict):
            section.problem("auto_map", "must be a JSON object")
            continue
        for cls, ref in mapping.items():
            refs = ref if isinstance(ref, list) else [ref]
            for one in refs:
                if not isinstance(one, str) or "." not in one:
                    if one is not None:
                        section.problem("auto_map", f"names {show(one)} for {cls}, not `module.Class`")
                    continue
                auto_map[cls] = one
                if "--" in one:  # code of another repo, fetched by transformers
                    continue
                module_file = one.rsplit(".", 1)[0].replace(".", "/") + ".py"
                if module_file.split("/")[0] not in names and module_file not in missing:
                    missing.append(module_file)
                    problems.add(
                        section.file,
                        f"{section.name('auto_map')}.{cls} names {one}, but {module_file} is not in the folder",
                    )
    return {
        "auto_map": auto_map,
        "python_files": [n for n in names if n.endswith(".py")],
        "missing_code_files": missing,
    }


def dflash_field(dflash: Section, top: Section, key: str) -> Section:
    """Where SGLang reads a DFlash field: dflash_config when it has the key, else the top level.

    Two different values are a problem: SGLang takes the dflash_config one without a word
    (even a null, which then counts as unset).
    """
    if not dflash.has(key):
        return top
    if top.has(key) and dflash.get(key) != top.get(key):
        top.problems.add(
            top.file,
            f"{dflash.name(key)} = {show(dflash.get(key))} and {key} = {show(top.get(key))} differ; "
            f"SGLang uses {dflash.name(key)}",
        )
    return dflash


def pair(dflash: Section, first: str, second: str) -> dict[str, int]:
    """Two dflash_config integers that SGLang needs both or neither of (unset or 0: off)."""
    values = {}
    for key in (first, second):
        value = dflash.get(key)
        if value is not None and (not is_int(value) or value < 0):
            dflash.problem(key, "must be an integer >= 0")
        values[key] = value if is_int(value) and value > 0 else 0
    if bool(values[first]) != bool(values[second]):
        dflash.problems.add(
            dflash.file,
            f"{dflash.name(first)} = {values[first]} and {dflash.name(second)} = {values[second]}: "
            "SGLang needs both set or neither",
        )
    return values


def load(model_dir: str, problems: Problems) -> tuple[str, dict[str, Any] | None, list[str]]:
    """(path of config.json, its object or None, the names in the model folder)."""
    path = os.path.join(model_dir, CONFIG)
    names = list_folder(model_dir, problems)
    if names is None:
        return path, None, []
    return path, read_json(path, problems), names


def inspect_drafter(model_dir: str, problems: Problems) -> dict[str, Any]:
    path, config, names = load(model_dir, problems)
    top = Section(config, path, "", problems)
    text = top.child("text_config") or top  # SGLang reads the layer count from the text model
    dflash = top.child("dflash_config") or Section({}, path, "dflash_config.", problems)
    architectures = top.strings("architectures", required="SGLang picks the draft model class by it")
    if architectures["value"] and not any("DFlash" in name for name in architectures["value"]):
        top.problem("architectures", "names no DFlash draft model (SGLang's DFLASH loads DFlash* classes)")
    for key in DFLASH_ONLY:
        if top.has(key) and not dflash.has(key):
            problems.add(path, f"{key} is at the top level, where SGLang ignores it: it reads dflash_config.{key}")
    draft_layers = text.integer("num_hidden_layers", 1, required="SGLang's DFLASH requires the draft layer count")
    check_layer_types(text, draft_layers)
    block = dflash_field(dflash, top, "block_size").integer(
        "block_size",
        1,
        required=f"SGLang reads dflash_config.block_size, then block_size, and without either silently "
        f"uses {SGLANG_DEFAULT_BLOCK_SIZE} draft tokens, whatever the drafter was trained for",
    )
    mask = dflash_field(dflash, top, "mask_token")
    mask_token = mask.text("mask_token")
    if mask.get("mask_token") is None:
        mask_token = known(DEFAULT_MASK_TOKEN, "SGLang's default (the config sets no mask_token)")
    elif mask_token["value"] == "":
        mask_token = mask.invalid("mask_token", "must not be empty")
    return {
        "dir": model_dir,
        "config_path": path,
        "config_read": config is not None,
        "architectures": architectures,
        "model_type": top.text("model_type"),
        "draft_layers": draft_layers,
        "hidden_size": text.integer("hidden_size", 1, required="the draft model is built at this width"),
        "vocab_size": text.integer("vocab_size", 1),
        "num_target_layers": dflash_field(dflash, top, "num_target_layers").integer("num_target_layers", 1),
        "block_size": block,
        "target_layer_ids": target_layer_ids(dflash_field(dflash, top, "target_layer_ids")),
        "mask_token": mask_token,
        "mask_token_id": dflash_field(dflash, top, "mask_token_id").integer("mask_token_id", 0),
        **pair(dflash, "conv_kernel_size", "conv_group_size"),
        **pair(dflash, "selector_rank", "selector_top_k"),
        "output_multiplier": output_multiplier(dflash),
        "has_dflash_py": "dflash.py" in names,
        **custom_code([top], names, problems),
    }


def target_layer_ids(section: Section) -> dict[str, Any]:
    """The target layers whose hidden states feed the drafter; SGLang derives them when unset."""
    ids = section.get("target_layer_ids")
    if ids is None:
        reason = section.missing("target_layer_ids")["unknown_reason"]
        return unknown(f"{reason}: SGLang spreads the context layers over the target's layers")
    if not isinstance(ids, list) or not ids or not all(is_int(i) and i >= 0 for i in ids):
        return section.invalid("target_layer_ids", "must be a non-empty list of layer numbers (integers >= 0)")
    return known(ids, section.source("target_layer_ids"))


def output_multiplier(dflash: Section) -> float:
    if not dflash.has("output_multiplier"):
        return 1.0
    value = dflash.get("output_multiplier")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        dflash.problem("output_multiplier", "must be a number > 0")
        return 1.0
    return float(value)


def check_layer_types(text: Section, draft_layers: dict[str, Any]) -> None:
    """`layer_types`: names of attention kinds; sliding ones need `sliding_window` (as SGLang says)."""
    if not text.has("layer_types"):
        return
    kinds = text.get("layer_types")
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        text.problem("layer_types", "must be a list of attention type names")
        return
    if draft_layers["value"] is not None and len(kinds) != draft_layers["value"]:
        text.problem("layer_types", f"has {len(kinds)} entries for {draft_layers['value']} layers")
    window = text.get("sliding_window")
    if "sliding_attention" in kinds and (not is_int(window) or window < 1):
        text.problem("sliding_window", "must be an integer >= 1: layer_types has sliding_attention layers")


def quant(method: str, **details: Any) -> dict[str, Any]:
    return {"method": method, "format": None, "bits": None, "groups": [], "ignore": [], "quant_algo": None, **details}


def quantization(sections: list[Section], model_dir: str, names: list[str], problems: Problems) -> dict[str, Any]:
    """The weights' quantization, where SGLang finds it: quantization_config (top level, or the
    text model's, which SGLang's Kimi K2.5 config hoists), else compression_config, else a
    separate hf_quant_config.json (ModelOpt)."""
    for key in ("quantization_config", "compression_config"):
        for section in sections:
            if section.has(key):
                return parse_quantization(section, key)
    top = sections[0]
    if top.data is None:
        return top.missing("quantization_config")
    if "hf_quant_config.json" in names:
        path = os.path.join(model_dir, "hf_quant_config.json")
        data = read_json(path, problems)
        if data is None:
            return unknown(f"{path} could not be read")
        inner = data.get("quantization")
        algo = inner.get("quant_algo") if isinstance(inner, dict) else None
        return known(quant("modelopt", quant_algo=algo if isinstance(algo, str) else None), path)
    return known(quant("none"), f"{top.file}: no quantization_config, the weights are stored unquantized")


def parse_quantization(section: Section, key: str) -> dict[str, Any]:
    config = section.child(key)
    invalid = unknown(f"{section.name(key)} in {section.file} is invalid")
    if config is None:
        return invalid
    method = config.get("quant_method")
    if not isinstance(method, str) or not method:
        config.problem("quant_method", "must name the method (compressed-tensors, fp8, ...)")
        return invalid
    ignore = config.get("ignore")
    if ignore is None:
        ignore = []
    elif not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        config.problem("ignore", "must be a list of module names or `re:` patterns")
        ignore = []
    fmt = config.get("format")
    details: dict[str, Any] = {"ignore": ignore, "format": fmt if isinstance(fmt, str) else None}
    if method == "compressed-tensors":
        details["groups"] = groups = compressed_tensors_groups(config)
        bits = {g["weight_bits"] for g in groups if g["weight_bits"] is not None}
        details["bits"] = bits.pop() if len(bits) == 1 else None
    elif method == "fp8":
        details["bits"] = 8
    else:
        bits = config.get("bits") if config.has("bits") else config.get("w_bit")
        details["bits"] = bits if is_int(bits) else None
    return known(quant(method, **details), section.source(key))


def compressed_tensors_groups(config: Section) -> list[dict[str, Any]]:
    """The schemes of a compressed-tensors config: which layers, their weight and input bits."""
    groups = config.child("config_groups")  # not an object: already a problem
    if groups is None or not groups.data:
        if config.get("config_groups") is None or groups is not None:
            config.problems.add(config.file, f"{config.name('config_groups')} is missing or empty: no scheme is set")
        return []
    found = []
    for name in groups.data:
        group = groups.child(name)
        if group is None:
            continue
        weights = group.child("weights")
        targets = group.get("targets")
        found.append(
            {
                "name": name,
                "targets": [t for t in targets if isinstance(t, str)] if isinstance(targets, list) else [],
                "weight_bits": None if weights is None else weights.integer("num_bits", 1)["value"],
                "weight_type": setting(weights, "type", str),
                "strategy": setting(weights, "strategy", str),
                "group_size": setting(weights, "group_size", int),
                "activation_bits": setting(group.child("input_activations"), "num_bits", int),
            }
        )
    return found


def setting(scheme: Section | None, key: str, kind: type) -> Any:
    """A descriptive setting of a quantization scheme; None when unset or of another type."""
    value = None if scheme is None else scheme.get(key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def tokenizer_section(model_dir: str, names: list[str], problems: Problems) -> Section | None:
    """tokenizer_config.json, where a tokenizer that is remote code names its class in `auto_map` (Kimi's
    tiktoken tokenizer): SGLang loads it only with --trust-remote-code, the baseline's launch too."""
    if TOKENIZER_CONFIG not in names:
        return None
    path = os.path.join(model_dir, TOKENIZER_CONFIG)
    return Section(read_json(path, problems), path, "", problems)


def inspect_target(model_dir: str, problems: Problems) -> dict[str, Any]:
    path, config, names = load(model_dir, problems)
    top = Section(config, path, "", problems)
    nested = top.child("text_config")
    text = nested or top  # the language model: Kimi K2.5/K2.6 nest a DeepSeek-V3 config here
    experts = text.integer("n_routed_experts", 1)
    per_token = text.integer("num_experts_per_tok", 1)
    if experts["value"] is not None and per_token["value"] is not None and per_token["value"] > experts["value"]:
        text.problem("num_experts_per_tok", f"is more than n_routed_experts = {experts['value']}")
    if text.get("kv_lora_rank") is not None:
        attention = known("MLA", text.source("kv_lora_rank"))
    elif config is None:
        attention = top.missing("kv_lora_rank")
    else:
        attention = known("MHA", f"{path}: no {text.name('kv_lora_rank')}, so no latent attention")
    dtype = text.text("dtype") if text.has("dtype") else text.text("torch_dtype")
    return {
        "dir": model_dir,
        "config_path": path,
        "config_read": config is not None,
        "architectures": top.strings("architectures", required="SGLang picks the model class by it"),
        "model_type": top.text("model_type"),
        "text_config_nested": nested is not None,
        "text_architectures": text.strings("architectures"),
        "text_model_type": text.text("model_type"),
        "num_layers": text.integer("num_hidden_layers", 1, required="the layer count of the model"),
        "hidden_size": text.integer("hidden_size", 1, required="the width of the model"),
        "vocab_size": text.integer("vocab_size", 1, required="the size of the vocabulary"),
        "num_attention_heads": text.integer("num_attention_heads", 1),
        "attention_arch": attention,
        "kv_lora_rank": text.integer("kv_lora_rank", 1),
        "qk_rope_head_dim": text.integer("qk_rope_head_dim", 1),
        "n_routed_experts": experts,
        "num_experts_per_tok": per_token,
        "max_position_embeddings": text.integer("max_position_embeddings", 1),
        "dtype": dtype,
        "quantization": quantization([top, text] if nested else [top], model_dir, names, problems),
        **custom_code([top, nested, tokenizer_section(model_dir, names, problems)], names, problems),
    }


def field(fact: dict[str, Any]) -> str:
    """The field a known fact was read from (its source is `FILE FIELD`)."""
    return str(fact["source"]).rsplit(" ", 1)[-1]


def cross_check(drafter: dict[str, Any], target: dict[str, Any], problems: Problems) -> None:
    """The drafter must fit the target: layer count, context layers, width, vocabulary."""
    where = drafter["config_path"]
    layers = target["num_layers"]["value"]
    declared = drafter["num_target_layers"]
    if declared["value"] is not None and layers is not None and declared["value"] != layers:
        problems.add(
            where,
            f"{field(declared)} = {declared['value']} but the target has {layers} layers "
            f"({target['num_layers']['source']})",
        )
    if layers is not None:
        limit, what = layers, f"a target with {layers} layers"
    else:  # the target's config is unreadable: the drafter's own claim is all there is
        limit, what = declared["value"], f"{field(declared)} = {declared['value']}"
    ids = drafter["target_layer_ids"]
    if limit is not None and ids["value"] is not None:
        for index, layer in enumerate(ids["value"]):
            if layer >= limit:
                problems.add(where, f"{field(ids)}[{index}] = {layer} is out of range for {what}")
    for key, meaning in (("hidden_size", "width"), ("vocab_size", "vocabulary")):
        mine, theirs = drafter[key], target[key]
        if mine["value"] is not None and theirs["value"] is not None and mine["value"] != theirs["value"]:
            problems.add(
                where,
                f"{field(mine)} = {mine['value']} but the target's {meaning} is {theirs['value']} ({theirs['source']})",
            )
    mask, vocab = drafter["mask_token_id"], target["vocab_size"]["value"] or drafter["vocab_size"]["value"]
    if mask["value"] is not None and vocab is not None and mask["value"] >= vocab:
        problems.add(where, f"{field(mask)} = {mask['value']} is not a token of a vocabulary of {vocab}")


def deploy(drafter: dict[str, Any] | None, target: dict[str, Any]) -> dict[str, Any]:
    """What the SGLang launch takes from these configs."""
    if drafter is None:
        tokens = unknown("no drafter_dir was given")
    elif drafter["block_size"]["value"] is None:
        tokens = unknown(f"the drafter's block size is unknown: {drafter['block_size']['unknown_reason']}")
    else:
        tokens = drafter["block_size"]
    return {
        "model_path": target["dir"],
        "draft_model_path": None if drafter is None else drafter["dir"],
        "speculative_num_draft_tokens": tokens,
        "trust_remote_code": bool(target["auto_map"] or (drafter and drafter["auto_map"])),
        "attention_arch": target["attention_arch"],
    }


def inspect(target_dir: str, drafter_dir: str | None = None) -> dict[str, Any]:
    """The facts document: every problem, the drafter's and the target's facts, the launch's."""
    problems = Problems()
    drafter = None if drafter_dir is None else inspect_drafter(drafter_dir, problems)
    target = inspect_target(target_dir, problems)
    if drafter is not None:
        cross_check(drafter, target, problems)
    return {"problems": problems.items, "drafter": drafter, "target": target, "deploy": deploy(drafter, target)}


def run(config: dict[str, Any]) -> dict[str, Any]:
    drafter = config.get("drafter_dir")
    facts = inspect(kit.expand_path(config["target_dir"]), None if drafter is None else kit.expand_path(drafter))
    for problem in facts["problems"]:
        print(f"problem: {problem}", file=sys.stderr)
    return facts


def main() -> int:
    return kit.main(run)
