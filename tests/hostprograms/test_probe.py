"""hostprograms/probe.py: its parsers on the real host's outputs, and its interpreter role on SGLang's files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.hostprogram import bundle
from hostprograms import probe as probe_host
from sandbox import gpu
from sandbox.prepare import VENV

REAL = Path(gpu.__file__).parent / "gpu_fixtures" / "h200"
SITE = next(VENV.glob("lib/python*/site-packages"), VENV)


# ---------------------------------------------------------------- parsers, on the real host's outputs


def test_the_gpu_query_is_the_one_the_real_host_answered_and_parses() -> None:
    header, row = (REAL / "query-gpu-csv.txt").read_text().splitlines()
    assert [h.split(" [")[0] for h in header.split(", ")] == probe_host.GPU_QUERY.split(",")
    (h200,) = probe_host.parse_gpu_query(row.replace(" MiB", ""))
    assert h200 == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-081868fe-7760-46d5-8624-9b6e58495c1d",
        "memory_total_mib": 143771,
        "memory_used_mib": 0,
        "memory_free_mib": 143156,
        "driver_version": "580.159.04",
        "compute_capability": "9.0",
        "pci_bus_id": "00000000:00:06.0",
    }


def test_gpu_query_values_not_available_are_null_and_a_short_row_is_an_error() -> None:
    (row,) = probe_host.parse_gpu_query("0, NVIDIA H200, [N/A], [N/A], 0, [Not Supported], 580.159.04, 9.0, [N/A]\n")
    assert row["uuid"] is None and row["memory_total_mib"] is None and row["memory_free_mib"] is None
    with pytest.raises(ValueError, match="expected 9 fields, got 2"):
        probe_host.parse_gpu_query("0, NVIDIA H200\n")


_names = (
    st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters=',"'), min_size=1)
    .map(str.strip)
    .filter(lambda name: name not in ("", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]"))
)


@given(
    gpus=st.lists(
        st.tuples(_names, st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(["9.0", "12.0"])),
        min_size=1,
        max_size=8,
    )
)
def test_what_the_gpu_double_renders_the_probe_reads_back(gpus: list[tuple[str, int, int, str]]) -> None:
    """The nvidia-smi double's renderer is proven on the real outputs (tests/sandbox); the parser
    reads back any GPUs it renders in the probe's query."""
    host = gpu.Host(
        driver_version="580.95.05",
        cuda_version="13.0",
        gpus=tuple(
            replace(
                gpu.RTX6000.gpus[0], index=i, name=name, memory_total_mib=total, memory_free_mib=free, compute_cap=cap
            )
            for i, (name, total, free, cap) in enumerate(gpus)
        ),
    )
    text = gpu.render_query(host, probe_host.GPU_QUERY.split(","), header=False, units=False)
    parsed = probe_host.parse_gpu_query(text)
    assert [
        (g["index"], g["name"], g["memory_total_mib"], g["memory_free_mib"], g["compute_capability"]) for g in parsed
    ] == [(i, *g) for i, g in enumerate(gpus)]


def test_cuda_version_comes_from_the_real_table_header() -> None:
    assert probe_host.parse_cuda_version((REAL / "nvidia-smi.txt").read_text()) == "13.0"
    assert probe_host.parse_cuda_version("No devices were found") is None


def test_os_release_of_the_real_host() -> None:
    release = probe_host.parse_os_release((REAL / "os-release").read_text())
    assert (release["ID"], release["VERSION_ID"], release["PRETTY_NAME"]) == ("ubuntu", "24.04", "Ubuntu 24.04.3 LTS")
    assert release["HOME_URL"] == "https://www.ubuntu.com/"


@given(
    st.dictionaries(
        st.from_regex(r"[A-Z][A-Z_]{0,10}", fullmatch=True),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    )
)
def test_os_release_values_round_trip_through_shell_quoting(values: dict[str, str]) -> None:
    def quote(value: str) -> str:
        return '"' + "".join("\\" + c if c in '\\$"`' else c for c in value) + '"'

    assert probe_host.parse_os_release("".join(f"{k}={quote(v)}\n" for k, v in values.items())) == values


def test_meminfo_agrees_with_free() -> None:
    info = probe_host.parse_meminfo(Path("/proc/meminfo").read_text())
    free = subprocess.run(["free", "-b"], capture_output=True, text=True, check=True).stdout.splitlines()[1].split()
    assert info["MemTotal"] == int(free[1])
    assert probe_host.parse_meminfo("MemTotal:       131981020 kB\nHugePages_Total:       0\n") == {
        "MemTotal": 131981020 * 1024,
        "HugePages_Total": 0,
    }


def test_choice_lists_are_read_from_the_real_sglang_source() -> None:
    source = (SITE / "sglang" / "srt" / "arg_groups" / "choices.py").read_text()
    lists = probe_host.literal_lists(source, ("ATTENTION_BACKEND_CHOICES", "DRAFT_ATTENTION_BACKEND_CHOICES"))
    assert len(lists["ATTENTION_BACKEND_CHOICES"]) == 25
    assert {"trtllm_mla", "flashmla", "cutedsl_mla", "flashinfer", "triton", "fa3", "fa4"} <= set(
        lists["ATTENTION_BACKEND_CHOICES"]
    )
    assert "cutlass_mla" not in lists["ATTENTION_BACKEND_CHOICES"]  # the seeds grepped for it; gone in 0.5.23
    assert lists["DRAFT_ATTENTION_BACKEND_CHOICES"] == [
        "flashinfer",
        "fa3",
        "fa4",
        "triton",
        "ascend",
        "trtllm_mha",
        "intel_xpu",
    ]


def test_choice_lists_of_an_older_layout_and_non_literals() -> None:
    older = textwrap.dedent("""\
        import argparse
        ATTENTION_BACKEND_CHOICES: list = ["triton", "flashinfer", "cutlass_mla"]
        DRAFT_ATTENTION_BACKEND_CHOICES = compute_choices()
        """)
    assert probe_host.literal_lists(older, ("ATTENTION_BACKEND_CHOICES", "DRAFT_ATTENTION_BACKEND_CHOICES")) == {
        "ATTENTION_BACKEND_CHOICES": ["triton", "flashinfer", "cutlass_mla"]
    }


def test_dflash_and_kimi_are_read_from_the_real_sglang_source() -> None:
    spec_info = (SITE / "sglang" / "srt" / "speculative" / "spec_info.py").read_text()
    members = probe_host.class_attributes(spec_info, "SpeculativeAlgorithm")
    assert members is not None and "DFLASH" in members and "EAGLE" in members
    assert probe_host.class_attributes(spec_info, "NoSuchClass") is None
    classes, entry = probe_host.model_classes((SITE / "sglang" / "srt" / "models" / "kimi_k25.py").read_text())
    assert entry == ["KimiK25ForConditionalGeneration"] and "KimiK25ForConditionalGeneration" in classes


def interpreter_role(python_path: Path) -> dict[str, Any]:
    """The probe program's interpreter role, run as the probe runs it, with PYTHONPATH=python_path."""
    program, config = python_path / "probe.pyz", python_path / "config.json"
    program.write_bytes(bundle("probe"))
    config.write_text(json.dumps({"role": "interpreter", "packages": ["sglang"]}))
    done = subprocess.run(
        [sys.executable, str(program), str(config)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(python_path)},
    )
    facts: dict[str, Any] = json.loads(done.stdout)["sglang"]
    return facts


def test_an_older_sglang_layout_names_its_sources_and_says_what_it_cannot_tell(tmp_path: Path) -> None:
    srt = tmp_path / "sglang" / "srt"
    (srt / "models").mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("import torch\n")  # never imported by the probe
    (srt / "server_args.py").write_text('ATTENTION_BACKEND_CHOICES = ["triton", "flashinfer", "cutlass_mla"]\n')
    (srt / "models" / "deepseek_v2.py").write_text(
        "class DeepseekV2ForCausalLM: ...\nEntryClass = DeepseekV2ForCausalLM\n"
    )
    (srt / "models" / "kimi_vl.py").write_text(
        "class KimiK25ForConditionalGeneration: ...\nEntryClass = [KimiK25ForConditionalGeneration]\n"
    )
    facts = interpreter_role(tmp_path)
    assert facts["installed"] is True and facts["package_dir"] == str(tmp_path / "sglang")
    assert facts["attention_backends"] == ["triton", "flashinfer", "cutlass_mla"]
    assert facts["sources"]["attention_backends"] == str(srt / "server_args.py")
    assert facts["draft_attention_backends"] is None and facts["dflash"] is None and facts["version"] is None
    assert facts["unknown"]["draft_attention_backends"] == (
        f"no literal DRAFT_ATTENTION_BACKEND_CHOICES list in: {srt / 'arg_groups' / 'choices.py'}: "
        f"No such file or directory; {srt / 'server_args.py'}"
    )
    assert facts["unknown"]["dflash"] == f"{srt / 'speculative' / 'spec_info.py'}: No such file or directory"
    assert facts["unknown"]["version"] == "no distribution metadata for sglang (importlib.metadata)"
    assert facts["kimi_k25_model"] is True and facts["sources"]["kimi_k25_model"] == str(srt / "models" / "kimi_vl.py")
    (srt / "models" / "kimi_vl.py").unlink()
    facts = interpreter_role(tmp_path)
    assert facts["kimi_k25_model"] is False and facts["sources"]["kimi_k25_model"] == str(srt / "models")


@pytest.mark.parametrize("role", ["interpreter", "hub"])
def test_a_python_printing_json_of_another_shape_is_its_reason_not_a_traceback(
    role: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python:` may name anything executable; one printing its config back (valid JSON, exit 0) must be
    the probe's reason for the python or the Hub, not a KeyError that loses every fact of the host."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\ncat "$2"; echo\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "probe.pyz")])
    config = {"python": str(fake), "packages": ["sglang"], "python_timeout": 10, "hub_timeout": 10}
    if role == "interpreter":
        reason = probe_host.python_facts(config)["python"]["unknown_reason"]
    else:
        reason = probe_host.hub_facts({**config, "hub_repos": ["o/r"]}, {"executable": str(fake)})["o/r"][
            "unknown_reason"
        ]
    assert reason.startswith(f"{fake} --{role} printed no JSON document of its facts: ")
