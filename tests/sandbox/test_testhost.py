"""The test host: the nvidia-smi double against the real host's outputs, and sessions through its sshd."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import gpu, testhost
from sandbox.prepare import BIN, PINS, STANDIN_PTH, VENV, site_packages
from tests.conftest import SandboxHost

REAL = Path(gpu.__file__).parent / "gpu_fixtures" / "h200"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "gpu-host-h200"
CAPTURED = time.mktime(time.strptime("Mon Nov 30 11:18:55 2026", "%a %b %d %H:%M:%S %Y"))  # the capture's clock


@pytest.mark.parametrize(
    ("args", "fixture"),
    [
        ([], "nvidia-smi.txt"),
        (["-L"], "nvidia-smi-L.txt"),
        (
            [
                "--query-gpu=index,name,uuid,memory.total,memory.used,memory.free,driver_version,compute_cap,pci.bus_id",
                "--format=csv",
            ],
            "query-gpu-csv.txt",
        ),
        (
            ["--query-gpu=index,name,memory.total,memory.free,compute_cap", "--format=csv,noheader,nounits"],
            "query-gpu-csv-noheader-nounits.txt",
        ),
        (["-q", "-x"], "nvidia-smi-q-x.xml"),
        (["topo", "-m"], "nvidia-smi-topo-m.txt"),
    ],
)
def test_the_double_answers_what_the_real_h200_host_printed(args: list[str], fixture: str) -> None:
    assert gpu.answer(args, "h200", CAPTURED) == ((REAL / fixture).read_text(), 0)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/fixtures is not beside this checkout")
def test_the_repos_copies_are_the_shared_fixtures() -> None:
    assert (REAL / "nvidia-smi.txt").read_text() == (SHARED / "nvidia-smi.txt").read_text()
    assert (REAL / "nvidia-smi-q-x.xml").read_text() == (SHARED / "nvidia-smi-q.xml").read_text()
    query = (SHARED / "nvidia-query.txt").read_text()
    for name in ("nvidia-smi-L.txt", "query-gpu-csv.txt", "query-gpu-csv-noheader-nounits.txt"):
        assert (REAL / name).read_text() in query
    assert (REAL / "os-release").read_text() in (SHARED / "host.txt").read_text()


def test_rtx6000_host_is_eight_consistent_blackwell_cards() -> None:
    root = ET.fromstring(gpu.answer(["-q", "-x"], "rtx6000", time.time())[0])
    assert root.findtext("attached_gpus") == "8" and root.findtext("driver_version") == "580.95.05"
    cards = root.findall("gpu")
    assert [c.findtext("minor_number") for c in cards] == [str(i) for i in range(8)]
    assert {c.findtext("product_name") for c in cards} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {c.findtext("product_architecture") for c in cards} == {"Blackwell"}
    assert len({c.findtext("uuid") for c in cards}) == len({c.get("id") for c in cards}) == 8
    for card in cards:
        mib = {k: int((card.findtext(f"fb_memory_usage/{k}") or "").split()[0]) for k in ("total", "reserved", "free")}
        assert mib == {"total": 97887, "reserved": 638, "free": 97887 - 638 + 1}  # as real cards round it
        assert card.get("id") == card.findtext("pci/pci_bus_id")
    query, code = gpu.answer(["--query-gpu=index,compute_cap,memory.total", "--format=csv,noheader"], "rtx6000", 0)
    assert code == 0 and query.splitlines() == [f"{i}, 12.0, 97887 MiB" for i in range(8)]
    table = gpu.answer([], "rtx6000", 0)[0]
    assert table.count("NVIDIA RTX PRO 6000 Blac...    On  |") == 8 and table.count("0MiB /  97887MiB") == 8
    width = len((REAL / "nvidia-smi.txt").read_text().splitlines()[1])
    assert {len(line) for line in table.splitlines()[1:] if line} == {width}  # every row as wide as the real ones


@pytest.mark.parametrize(
    ("args", "variant", "said", "code"),
    [
        (["--bogus"], "h200", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2),
        (["--query-gpu=index,cuda_version", "--format=csv"], "h200", 'Field "cuda_version" is not a valid field', 2),
        (["--query-gpu=index"], "rtx6000", "Invalid combination of input arguments.", 2),
        (["-L"], "none", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9),
        (["-L", "-i", "8"], "rtx6000", "No devices were found", 6),
    ],
)
def test_the_double_refuses_like_the_real_tool(args: list[str], variant: str, said: str, code: int) -> None:
    text, exit_code = gpu.answer(args, variant, 0)
    assert text.startswith(said) and exit_code == code


def ssh(host: SandboxHost, command: str) -> subprocess.CompletedProcess[str]:
    server = host.server
    return subprocess.run(
        [
            *("ssh", "-F", str(server.root / "ssh_config"), "-i", str(server.client_key), "-p", str(server.port)),
            *("-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "BatchMode=yes", f"{server.user}@127.0.0.1"),
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_a_session_gets_the_test_hosts_path_home_and_gpus(testhost: Callable[[str], SandboxHost]) -> None:
    host = testhost("h200")
    done = ssh(host, 'echo "$PATH"; echo "$HOME"; command -v nvidia-smi python3 hf; nvidia-smi -L')
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{BIN}:{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin"  # root's ~/.bashrc did not run
    assert lines[1] == str(host.home)
    assert lines[2:5] == [str(BIN / "nvidia-smi"), str(VENV / "bin" / "python3"), str(VENV / "bin" / "hf")]
    assert "\n".join(lines[5:]) + "\n" == (REAL / "nvidia-smi-L.txt").read_text()


def test_the_venv_holds_the_real_releases_which_need_not_import(testhost: Callable[[str], SandboxHost]) -> None:
    done = ssh(
        testhost("h200"),
        'python3 -c \'import importlib.metadata as m; print(m.version("sglang"), m.version("huggingface_hub"))\'; '
        "hf version | tail -1; python3 -c 'import sglang' 2>&1 | tail -1",
    )
    assert done.returncode == 0, done.stderr
    versions, hf, import_error = done.stdout.splitlines()
    pins = {name: version for name, version, _ in PINS}
    assert versions.split() == [pins["sglang"], pins["huggingface_hub"]]
    assert pins["huggingface_hub"] in hf
    assert import_error.startswith("ModuleNotFoundError")  # --no-deps: its files are real, its imports are not


@pytest.mark.parametrize(("variant", "gpus"), [("rtx6000", 8), ("none", 0)])
def test_variants_answer_with_their_gpus(testhost: Callable[[str], SandboxHost], variant: str, gpus: int) -> None:
    done = ssh(testhost(variant), "nvidia-smi -L; echo rc=$?")
    assert done.stdout.count("NVIDIA RTX PRO 6000 Blackwell Server Edition") == gpus
    assert done.stdout.endswith(f"rc={0 if gpus else 9}\n")


def test_the_absent_variant_has_no_nvidia_smi(testhost: Callable[[str], SandboxHost]) -> None:
    done = ssh(testhost("absent"), "command -v nvidia-smi; echo rc=$?; command -v hf")
    assert done.stdout == f"rc=1\n{VENV / 'bin' / 'hf'}\n"


def test_an_unprepared_test_host_says_how_to_prepare_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert testhost.missing() is None
    monkeypatch.setattr(testhost, "VENV", tmp_path / "venv")
    monkeypatch.setattr(testhost, "VENV_PYTHON", tmp_path / "venv" / "bin" / "python")
    problem = testhost.missing()
    assert problem is not None and problem.endswith("run `python -m sandbox.prepare` first")
    assert str(tmp_path / "venv" / "bin" / "python") in problem


def test_prepare_is_idempotent() -> None:
    done = subprocess.run([sys.executable, "-m", "sandbox.prepare"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line.split(": ", 1)[1] for line in done.stdout.splitlines()] == [
        f"venv {VENV} exists",
        *(f"{name}=={version} already installed" for name, version, _ in PINS),
        f"{BIN / 'nvidia-smi'} up to date",
        f"{site_packages()}/{STANDIN_PTH} up to date",
    ]


def test_session_env_and_sshd_config(tmp_path: Path) -> None:
    env = testhost.session_env("rtx6000", tmp_path / "my home")
    assert env[gpu.ENV_VAR] == "rtx6000" and env["HOME"] == str(tmp_path / "my home")
    assert testhost.sshd_config(env).startswith(f'SetEnv "PATH={BIN}:')
    assert f'"HOME={tmp_path}/my home"' in testhost.sshd_config(env)
    with pytest.raises(ValueError, match="unknown GPU variant 'a100'"):
        testhost.session_env("a100", tmp_path)
    with pytest.raises(ValueError, match="double quote"):
        testhost.sshd_config({"HOME": 'a"b'})
