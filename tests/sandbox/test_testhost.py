"""The test host: the nvidia-smi double against the real host's outputs, and sessions through its sshd."""

from __future__ import annotations

import concurrent.futures
import errno
import ipaddress
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import gpu, netns, testhost
from sandbox.netns import NetnsUnavailable
from sandbox.prepare import BIN, DDTREE_BUILD, OLD_CLIENT_BUILD, PINS, STANDIN_PTH, VENV, site_packages
from sandbox.testhost import PoolHost, pool_inventory
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


def ssh(host: SandboxHost | PoolHost, command: str) -> subprocess.CompletedProcess[str]:
    server = host.server
    return subprocess.run(
        [
            *("ssh", "-F", str(server.root / "ssh_config"), "-i", str(server.client_key), "-p", str(server.port)),
            *(
                "-o",
                f"UserKnownHostsFile={server.known_hosts}",
                "-o",
                "BatchMode=yes",
                f"{server.user}@{server.address}",
            ),
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
        f"{DDTREE_BUILD / 'sglang'} up to date",
        f"{OLD_CLIENT_BUILD / 'sglang'} up to date",
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


@pytest.mark.parametrize("server", ["openssh", "embedded"])
def test_three_test_hosts_answer_at_once_each_with_its_own_gpus_home_and_port(
    testhosts: Callable[..., list[PoolHost]], tmp_path: Path, server: str
) -> None:
    hosts = testhosts(3, variants=("h200x8", "h100", "h200"), ssh=server)
    assert (
        len({h.server.port for h in hosts}) == len({h.sglang_port for h in hosts}) == len({h.home for h in hosts}) == 3
    )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    command = (  # each waits until all three sessions have started: they run at the same time
        f'touch {barrier}/"$RUNBOOK_SANDBOX_GPU"; for i in $(seq 300); do [ "$(ls {barrier} | wc -l)" = 3 ] && break; '
        'sleep 0.05; done; echo "$HOME $(nvidia-smi -L | wc -l) $(ls ' + str(barrier) + ' | wc -l)"'
    )
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda host: ssh(host, command), hosts))
    assert [a.returncode for a in answers] == [0, 0, 0], [a.stderr for a in answers]
    expected = [[str(h.home), gpus, "3"] for h, gpus in zip(hosts, "881", strict=True)]
    assert [a.stdout.split() for a in answers] == expected
    inventory = pool_inventory(hosts, {"HF_ENDPOINT": "http://127.0.0.1:1"})
    assert inventory["hosts"]["gpu2"]["vars"] == {
        "models_dir": str(hosts[1].home / "models"),
        "sglang_port": hosts[1].sglang_port,
    }
    assert inventory["hosts"]["gpu3"]["port"] == hosts[2].server.port and inventory["vars"] == {
        "HF_ENDPOINT": "http://127.0.0.1:1"
    }


def test_test_nodes_each_listen_on_their_own_loopback_address(testnodes: Callable[..., list[PoolHost]]) -> None:
    nodes = testnodes(3, variants=("h100x8", "h100x8", "h200x8"))
    assert [n.address for n in nodes] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    for node, gpus in zip(nodes, ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA H200"), strict=True):
        # the server side of the SSH connection is the node's address: sshd listens there only
        done = ssh(node, 'echo "$SSH_CONNECTION $HOME"; nvidia-smi --query-gpu=name --format=csv,noheader | sort -u')
        assert done.returncode == 0, done.stderr
        connection, names = done.stdout.splitlines()[0].split(), done.stdout.splitlines()[1:]
        assert connection[2:] == [node.address, str(node.server.port), str(node.home)] and names == [gpus]
        with socket.socket() as other:  # the same port on 127.0.0.1 is not this node's sshd
            assert other.connect_ex(("127.0.0.1", node.server.port)) != 0
    inventory = pool_inventory(nodes, {})
    assert [h["address"] for h in inventory["hosts"].values()] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert len({n.sglang_port for n in nodes}) == len({n.home for n in nodes}) == 3


def netns_listed() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def test_an_isolated_node_is_reached_over_its_veth_reaches_no_other_nodes_loopback_and_goes_away(
    tmp_path: Path,
) -> None:
    try:
        pool = testhost.start_pool(tmp_path, ("h100x8", "h100x8"), own_addresses=True, isolated=(2,))
    except NetnsUnavailable as exc:
        pytest.skip(f"node 2 needs a network namespace of its own: {exc}")
    (_, gpu1), (_, gpu2) = pool
    try:
        assert gpu1.netns is None and gpu2.netns is not None and gpu2.address == gpu2.netns.address
        assert ipaddress.ip_address(gpu2.address) in netns.RANGE and gpu2.netns.name in netns_listed()
        reach = "python3 -c 'import socket, sys; print(socket.socket().connect_ex((sys.argv[1], int(sys.argv[2]))))'"
        reach += f" {gpu1.address} {gpu1.server.port}"
        # gpu1's sshd: reached from gpu1 itself, refused from gpu2, where its address is gpu2's own loopback's
        assert ssh(gpu1, reach).stdout.split() == ["0"]
        inside = ssh(gpu2, reach + '; echo "$SSH_CONNECTION"')
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.split()[0] == str(errno.ECONNREFUSED) and inside.stdout.split()[3] == gpu2.address
    finally:
        testhost.stop_pool(pool)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert gpu2.netns.name not in netns_listed() and gpu2.netns.host_veth not in links


def test_an_isolated_host_whose_sshd_fails_leaves_no_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("sshd exited")

    made: list[netns.Namespace] = []
    create = netns.create

    def recorded() -> netns.Namespace:
        made.append(create())
        return made[-1]

    monkeypatch.setattr(netns, "create", recorded)
    monkeypatch.setattr(testhost, "start_sshd", fails)
    try:
        with pytest.raises(RuntimeError, match="sshd exited"):
            testhost.start(tmp_path, "gpu2", "h100x8", isolated=True)
    except NetnsUnavailable as exc:
        pytest.skip(f"a network namespace cannot be made here: {exc}")
    (namespace,) = made
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert namespace.name not in netns_listed() and namespace.host_veth not in links


def test_h100x8_is_eight_h100_80gb_cards() -> None:
    query, code = gpu.answer(["--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader"], "h100x8", 0)
    assert code == 0 and query.splitlines() == [f"{i}, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB" for i in range(8)]
    root = ET.fromstring(gpu.answer(["-q", "-x"], "h100x8", time.time())[0])
    assert root.findtext("attached_gpus") == "8"
    assert {c.findtext("product_architecture") for c in root.findall("gpu")} == {"Hopper"}
    assert len({c.findtext("uuid") for c in root.findall("gpu")}) == 8
