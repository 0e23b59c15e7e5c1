"""`deploy` and `stop_server` across a node group (`nodes:`), through the CLI on test nodes (`testnodes`): each
an OpenSSH server on a loopback address of its own, with its GPU variant and the SGLang stand-in, which does
SGLang's multi-node rendezvous (sandbox/sglang_standin/distributed.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.errors import AttemptFailed
from executor.run import audit
from sandbox.hub import HubServer
from sandbox.model_configs import target_config
from sandbox.prepare import VENV_PYTHON
from sandbox.repos import DRAFTER_ID
from sandbox.sshd import free_port
from sandbox.testhost import PoolHost
from steps.server import node_group
from tests.clirun import runbook_cli

MODEL = "Kimi-K2.6"


class Group:
    """One test's node group: its nodes, a model folder on each, a dist-init port; `run` writes and runs a
    runbook of given steps. The teardown kills every rank recorded on the nodes' ports, whatever was asserted."""

    def __init__(self, nodes: list[PoolHost], tmp_path: Path) -> None:
        self.nodes, self.tmp_path = nodes, tmp_path
        self.dist_port = free_port()
        self.runs = 0
        self.run_dir: Path | None = None  # the last run's folder
        self.models = {node.name: node.home / f"models-group-{self.dist_port}" for node in nodes}
        for folder in self.models.values():
            (folder / MODEL).mkdir(parents=True)
            (folder / MODEL / "config.json").write_text(json.dumps(target_config()))

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def state_file(self, node: PoolHost) -> Path:
        return node.home / ".runbook" / "sglang" / f"{node.sglang_port}.json"

    def deploy(self, **params: Any) -> dict[str, Any]:
        step: dict[str, Any] = {"id": "serve", "kind": "deploy", "nodes": self.names, "probe": "probe"}
        step["python"] = str(VENV_PYTHON)
        step |= {"port": "$sglang_port", "model_path": "$models_dir/" + MODEL, "dist_init_port": self.dist_port}
        return step | {"ready_timeout": "60s", "stop_timeout": "10s", "watch_interval": "200ms"} | params

    def stop(self, **params: Any) -> dict[str, Any]:
        return {"id": "stop", "kind": "stop_server", "nodes": self.names, "port": "$sglang_port"} | params

    def probe(self, hosts: list[str] | None = None) -> dict[str, Any]:
        return {"id": "probe", "kind": "probe", "hosts": hosts or self.names, "python": "$probe_python"} | {
            "models_dir": "$models_dir",
            "packages": ["sglang"],
        }

    def write(
        self,
        *steps: dict[str, Any],
        host_vars: dict[str, dict[str, Any]] | None = None,
        runbook_vars: dict[str, Any] | None = None,
    ) -> Path:
        """A runbook of these steps on the nodes, each with its own vars (`host_vars` over them), and the runbook's
        vars (`runbook_vars` besides those the nodes' override)."""
        self.runs += 1
        hosts = {
            node.name: {
                **node.server.host_dict(),
                "vars": {"models_dir": str(self.models[node.name]), "sglang_port": node.sglang_port}
                | (host_vars or {}).get(node.name, {}),
            }
            for node in self.nodes
        }
        declared = {"models_dir": "/nowhere", "sglang_port": 1, "iface": "lo", "probe_python": str(VENV_PYTHON)}
        doc = {"name": "group", "hosts": hosts, "vars": declared | (runbook_vars or {})}
        path = self.tmp_path / f"group{self.runs}.yaml"
        path.write_text(yaml.safe_dump(doc | {"steps": list(steps)}, sort_keys=False))
        return path

    def run(
        self,
        *steps: dict[str, Any],
        extra: tuple[str, ...] = (),
        host_vars: dict[str, dict[str, Any]] | None = None,
        runbook_vars: dict[str, Any] | None = None,
    ) -> tuple[int, dict[tuple[str, str], Any], str]:
        """Run a runbook of these steps: (exit code, facts by (step, host), the CLI's output)."""
        path = self.write(*steps, host_vars=host_vars, runbook_vars=runbook_vars)
        logs = self.tmp_path / "logs"
        done = runbook_cli("run", str(path), "--log-dir", str(logs), *extra)
        status = runbook_cli("status", "--log-dir", str(logs), "--json")
        shown = json.loads(status.stdout) if status.returncode == 0 else {"steps": [], "run": None}
        self.run_dir = logs / shown["run"]["run_id"] if shown["run"] else None
        records = shown["steps"]
        return done.returncode, {(r["step"], r["host"]): r["facts"] for r in records}, done.stderr + done.stdout

    def audited(self) -> list[tuple[str, str, str]]:
        """The last run's audit log: (step, host, command) of every command it ran."""
        assert self.run_dir is not None
        records = [record for _, record, _ in audit.read_records(self.run_dir) if record]
        return [(r["step"], r["host"], r["command"]) for r in records if r.get("event") == "command"]

    def pid(self, node: PoolHost) -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(json.loads(self.state_file(node).read_text())["pid"])
        return None

    def teardown(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(json.loads(self.state_file(node).read_text())["pgid"], signal.SIGKILL)
            self.state_file(node).unlink(missing_ok=True)
            (node.home / "sglang-standin.json").unlink(missing_ok=True)
            shutil.rmtree(self.models[node.name], ignore_errors=True)


@pytest.fixture
def group(testnodes: Callable[..., list[PoolHost]], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    """Two h100x8 nodes; `@pytest.mark.parametrize("group", [3], indirect=True)` for three, or a dict of
    `testnodes` arguments for others (`{"variants": ("h100x8", "h200x8")}`, `{"isolated": (2,)}`)."""
    param = getattr(request, "param", 2)
    asked = {"n": param} if isinstance(param, int) else param
    count = asked.get("n", 2)
    here = Group(testnodes(**({"n": count, "variants": ("h100x8",) * count} | asked)), tmp_path)
    yield here
    here.teardown()


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone(pid: int | None, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


# ---- the plan ------------------------------------------------------------------------------------------------


def test_plan_renders_each_nodes_launch_with_every_choice_and_its_source(group: Group) -> None:
    path = group.write(group.probe(), group.deploy(), group.stop())
    done = runbook_cli("plan", "--full", str(path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    gpu1, gpu2 = group.nodes
    assert f"## step 2 'serve' (deploy) on gpu1 [{gpu1.address}], primary" in out
    assert f"#   also on gpu2 [{gpu2.address}]" in out
    for rank, node in enumerate(group.names):
        assert f"# rank {rank} on {node}: launch" in out
        assert f"#       --node-rank {rank} \\\n" in out
        assert f"#   node_rank: {rank} <- {node}'s position in nodes" in out
    assert "#       --nnodes 2 \\\n" in out and "#       --dist-timeout 3600\n" in out
    assert "#   tp_size: <known at run time: steps.probe.facts.gpu_count (summed over gpu1, gpu2)>" in out
    assert f"<the address of gpu1 as the other nodes reach it, port {group.dist_port}, known at run time>" in out
    assert "#   network_interface: <known at run time: node_preflight inspect on gpu2: the interface routing to" in out
    assert '"NCCL_SOCKET_IFNAME": "<known at run time: node_preflight inspect on gpu1' in out
    assert f"# preflight on gpu1: dist-init port {group.dist_port} free and reached" in out
    assert "# stop rank 1 on gpu2" in out
    # the readable plan: each launch, rank 0 first
    readable = runbook_cli("plan", str(path))
    assert readable.returncode == 0, readable.stderr
    assert "rank 0 on gpu1, rank 1 on gpu2" in readable.stdout and readable.stdout.count("--node-rank") == 2


def test_a_host_that_is_not_rank_0_or_an_unknown_node_is_refused_at_its_line(group: Group) -> None:
    path = group.write(group.probe(), group.deploy(host="gpu2"), group.stop(nodes=["gpu1", "gpux"]))
    done = runbook_cli("validate", str(path))
    assert done.returncode != 0
    lines = path.read_text().splitlines()
    host_line = next(i for i, line in enumerate(lines, start=1) if line.strip() == "host: gpu2")
    assert (
        f"{path}:{host_line}:" in done.stderr and "runs on gpu1 (nodes[0]); `host: gpu2` says otherwise" in done.stderr
    )
    unknown = next(i for i, line in enumerate(lines, start=1) if line.strip() == "- gpux")
    assert f"{path}:{unknown}:" in done.stderr and "step 'stop': unknown host 'gpux'" in done.stderr


def test_a_var_as_dist_init_addr_or_the_interface_variables_in_env_are_refused_at_their_line(tmp_path: Path) -> None:
    """Both were taken silently: `dist_init_addr: $var` as the address `$var` (failing at the preflight, after
    the downloads), env's NCCL_SOCKET_IFNAME replaced by the group's choice of interface."""
    hosts = {name: {"address": f"{name}.gpu-box.example"} for name in ("gpu1", "gpu2")}
    serve = {"id": "serve", "kind": "deploy", "nodes": "nodes", "probe": "probe", "model_path": "/m"}
    steps: list[dict[str, Any]] = [
        {"id": "probe", "kind": "probe", "hosts": "nodes"},
        serve | {"dist_init_addr": "$rank0_ib"},
    ]
    steps.append(serve | {"id": "again", "env": {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5"}})
    doc = {
        "name": "g",
        "hosts": hosts,
        "pools": {"nodes": ["gpu1", "gpu2"]},
        "vars": {"rank0_ib": "rank0-ib.gpu-box.example"},
    }
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump(doc | {"steps": steps}, sort_keys=False))
    done = runbook_cli("validate", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = path.read_text().splitlines()
    addr = next(i for i, line in enumerate(lines, start=1) if "dist_init_addr: $rank0_ib" in line)
    assert f"{path}:{addr}:" in done.stderr and "IPv4 address (no $var), got '$rank0_ib'" in done.stderr
    assert "env sets NCCL_SOCKET_IFNAME, which a node group's launch sets on each node" in done.stderr
    # a pool of one host serves as `host:` would: its env is its own
    path.write_text(yaml.safe_dump(doc | {"pools": {"nodes": ["gpu1"]}, "steps": [steps[0], steps[2]]}))
    assert runbook_cli("validate", str(path)).returncode == 0


# ---- a run ---------------------------------------------------------------------------------------------------


def test_two_nodes_serve_from_rank_0_are_adopted_whole_and_stopped_together(group: Group) -> None:
    code, facts, out = group.run(group.probe(), group.deploy())
    assert code == 0, out
    served = facts[("serve", "gpu1")]
    assert ("serve", "gpu2") not in facts  # facts on rank 0 only
    assert served["ready"] and served["health"]["status"] == 200 and served["generate"]["status"] == 200
    gpu1 = group.nodes[0]
    assert served["base_url"].endswith(f":{gpu1.sglang_port}")
    info = served["group"]
    assert info["nodes"] == ["gpu1", "gpu2"] and info["gpus_per_node"] == 8 and info["tp_size"] == 16
    assert info["dist_init_addr"] == f"{gpu1.address}:{group.dist_port}"
    for rank, node in enumerate(group.nodes):
        member = info["per_node"][node.name]
        assert member["rank"] == rank and member["interface"] == "lo" and member["source_address"]
        assert member["pid"] == group.pid(node) and alive(member["pid"]) and not member["reused"]
    assert served["choices"]["tp_size"]["value"] == 16 and "8 + 8" in served["choices"]["tp_size"]["source"]
    assert served["env"]["NCCL_SOCKET_IFNAME"] == "lo" and served["env"]["GLOO_SOCKET_IFNAME"] == "lo"

    # resumed from the deploy, with the same arguments: the whole group is adopted, nothing relaunched
    again, facts, out = group.run(group.probe(), group.deploy(), extra=("--resume", "--from", "serve"))
    assert again == 0, out
    adopted = facts[("serve", "gpu1")]["group"]["per_node"]
    assert all(adopted[n.name]["reused"] for n in group.nodes)
    assert [adopted[n.name]["pid"] for n in group.nodes] == [info["per_node"][n.name]["pid"] for n in group.nodes]

    # a synchronized stop: every rank stopped, GPUs freed on every node
    pids = [group.pid(node) for node in group.nodes]
    code, facts, out = group.run(group.stop())
    assert code == 0, out
    stopped = facts[("stop", "gpu1")]["per_node"]
    assert {name: s["gpu_freed"] for name, s in stopped.items()} == {"gpu1": True, "gpu2": True}
    assert all(gone(pid) for pid in pids) and not any(group.state_file(n).exists() for n in group.nodes)


# ---- preflight: nothing is launched when a check fails --------------------------------------------------------


def launched_nothing(group: Group) -> bool:
    return not any(group.state_file(node).exists() for node in group.nodes)


def test_an_sglang_version_that_differs_on_one_node_fails_the_preflight_naming_it(group: Group) -> None:
    other = group.nodes[1].home / f"other-sglang-{group.dist_port}"
    (other / "sglang-0.5.99.dist-info").mkdir(parents=True)
    (other / "sglang-0.5.99.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.99\n"
    )
    python = other / "python"  # the node's SGLang interpreter, its installed version another one
    python.write_text(f'#!/bin/sh\nPYTHONPATH={other} exec {VENV_PYTHON} "$@"\n')
    python.chmod(0o755)
    code, _, out = group.run(group.probe(), group.deploy(), host_vars={"gpu2": {"probe_python": str(python)}})
    assert code == 1, out
    assert "preflight: node gpu2: SGLang version 0.5.99 differs from rank 0 gpu1's 0.5.23" in out
    assert launched_nothing(group)
    shutil.rmtree(other)


@pytest.mark.parametrize("group", [{"variants": ("h100x8", "h200x8")}], indirect=True)
def test_a_gpu_model_that_differs_on_one_node_fails_the_preflight_before_any_command(group: Group) -> None:
    code, _, out = group.run(group.probe(), group.deploy())
    assert code == 1, out
    assert (
        "preflight: node gpu2: GPU model NVIDIA H200 differs from rank 0 gpu1's NVIDIA H100 80GB HBM3 "
        "(steps.probe.facts.gpu.gpus[].name)"
    ) in out
    # the audit log: the probe ran on both nodes, the deploy step on none (its facts' checks come first)
    ran = group.audited()
    assert {host for step, host, _ in ran if step == "probe"} == {"gpu1", "gpu2"}
    assert [(step, host) for step, host, _ in ran if step == "serve"] == [] and launched_nothing(group)


def test_a_probe_that_did_not_run_on_a_node_fails_the_preflight_naming_it(group: Group) -> None:
    code, _, out = group.run(group.probe(hosts=["gpu1"]), group.deploy())
    assert code == 1, out
    assert "preflight: node gpu2: step 'probe' did not pass on it" in out and launched_nothing(group)


def test_weights_verified_on_one_node_only_fail_the_preflight_naming_the_other(group: Group) -> None:
    """`verified` reads each node's own facts: rank 0's verification never stands in for gpu2's."""
    verify = {"id": "verify_target", "kind": "shell", "hosts": ["gpu1"], "parse": "json"}
    verify["script"] = 'echo \'{"commit": "0123abc"}\''
    code, _, out = group.run(group.probe(), verify, group.deploy(verified=["verify_target"]))
    assert code == 1, out
    assert "preflight: node gpu2: step 'verify_target' did not pass on it" in out and launched_nothing(group)


def test_weights_a_real_verify_step_checked_on_one_node_only_fail_the_preflight_naming_the_other(
    group: Group, hub: HubServer
) -> None:
    """The drafter downloaded from the Hub test double and verified (the `verify` kind) on gpu1 alone: its real
    facts pass on rank 0, and gpu2, where no step verified it, is named."""
    where = {"hosts": ["gpu1"], "repo": DRAFTER_ID, "local_dir": "$models_dir/Kimi-K2.6-DFlash"}
    download = {"id": "download_drafter", "kind": "download", "methods": ["snapshot_download"], **where}
    verify = {"id": "verify_drafter", "kind": "verify", **where}
    steps = (group.probe(), download, verify, group.deploy(verified=["verify_drafter"]))
    code, facts, out = group.run(*steps, runbook_vars=hub.client_env(group.tmp_path / "hf-home"))
    assert code == 1, out
    verified = facts[("verify_drafter", "gpu1")]
    assert verified["commit"] == hub.repos[DRAFTER_ID].sha and verified["files_checked"] == verified["files_expected"]
    assert "preflight: node gpu2: step 'verify_drafter' did not pass on it" in out and launched_nothing(group)


def test_a_missing_interface_fails_the_preflight_naming_the_node(group: Group) -> None:
    deploy = group.deploy(network_interface="$iface")
    code, _, out = group.run(group.probe(), deploy, host_vars={"gpu2": {"iface": "eth9"}})
    assert code == 1, out
    assert "preflight: node gpu2: network interface 'eth9' does not exist there (it has: lo" in out
    assert launched_nothing(group)


def test_a_dist_init_port_taken_on_rank_0_fails_the_preflight(group: Group) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind((group.nodes[0].address, group.dist_port))
        taken.listen()
        code, _, out = group.run(group.probe(), group.deploy())
    assert code == 1, out
    assert f"preflight: node gpu1: its dist-init port {group.nodes[0].address}:{group.dist_port} is taken" in out
    assert launched_nothing(group)


@pytest.mark.parametrize("group", [{"isolated": (2,)}], indirect=True)
def test_rank_0s_dist_init_port_unreachable_from_a_node_fails_the_preflight_naming_it(group: Group) -> None:
    """gpu2 on a network of its own (a namespace, reached over a veth): gpu1's address is, from there, gpu2's
    own loopback, where nothing listens."""
    gpu1, gpu2 = group.nodes
    assert gpu2.netns is not None and gpu2.address == gpu2.netns.address
    code, _, out = group.run(group.probe(), group.deploy())
    assert code == 1, out
    said = f"preflight: node gpu2 cannot reach gpu1's dist-init port {gpu1.address}:{group.dist_port}: "
    assert said + "Connection refused (for " in out
    assert "while gpu1 listened on it: a firewall between them, or " in out and launched_nothing(group)


# ---- the readiness barrier --------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", [3], indirect=True)
def test_an_nccl_error_on_rank_1_fails_at_once_with_its_line_and_every_rank_is_stopped(group: Group) -> None:
    with group.nodes[1].standin(fault="nccl_error"):
        code, _, out = group.run(group.probe(), group.deploy())
    assert code == 1, out
    # the rank that failed first is named first, with its own line; the others' deaths follow from it
    assert "serve@gpu1: [primary] node gpu2: its rank exited" in out and "ncclSystemError" in out
    assert "; then node gpu1: its rank exited" in out and "ncclRemoteError" in out
    assert "every rank stopped, GPUs freed on gpu1, gpu2, gpu3" in out and launched_nothing(group)
    # the three nodes serve once the fault is gone: tp 24 across them
    code, facts, out = group.run(group.probe(), group.deploy())
    assert code == 0, out
    info = facts[("serve", "gpu1")]["group"]
    assert info["tp_size"] == 24 and [info["per_node"][n]["rank"] for n in ("gpu1", "gpu2", "gpu3")] == [0, 1, 2]


def test_a_rank_hung_in_nccl_init_is_named_with_its_last_line_and_the_group_stopped(group: Group) -> None:
    with group.nodes[1].standin(fault="nccl_hang"):
        code, _, out = group.run(group.probe(), group.deploy(stall_timeout="8s"))
    assert code == 1, out
    said = out[out.index("serve@gpu1: [primary] ") :]
    assert said.startswith("serve@gpu1: [primary] node gpu2 has printed nothing since '[")  # its log line, as written
    assert "TP8] Init nccl begin.' for " in said and "(stall_timeout 8.0s)" in said
    assert "every rank stopped, GPUs freed on gpu1, gpu2" in out and launched_nothing(group)


# ---- adopting or relaunching the whole group ---------------------------------------------------------------------


def test_a_group_with_a_dead_rank_or_one_rank_changed_is_relaunched_whole(group: Group) -> None:
    code, facts, out = group.run(group.probe(), group.deploy())
    assert code == 0, out
    first = {n: m["pid"] for n, m in facts[("serve", "gpu1")]["group"]["per_node"].items()}
    os.killpg(first["gpu2"], signal.SIGKILL)  # rank 1 dies
    assert gone(first["gpu2"])
    code, facts, out = group.run(group.probe(), group.deploy())
    assert code == 0, out
    second = facts[("serve", "gpu1")]["group"]["per_node"]
    assert not any(m["reused"] for m in second.values()) and gone(first["gpu1"])
    assert all(second[n]["pid"] != first[n] and alive(second[n]["pid"]) for n in first)

    # rank 1's arguments change (its models folder moves), rank 0's do not: never a partial group
    moved = group.nodes[1].home / f"moved-{group.dist_port}"
    shutil.copytree(group.models["gpu2"], moved)
    code, facts, out = group.run(group.probe(), group.deploy(), host_vars={"gpu2": {"models_dir": str(moved)}})
    shutil.rmtree(moved)
    assert code == 0, out
    third = facts[("serve", "gpu1")]["group"]["per_node"]
    assert not any(m["reused"] for m in third.values()) and all(gone(second[n]["pid"]) for n in second)


# ---- the report ------------------------------------------------------------------------------------------------


def test_the_report_records_the_group_its_nodes_and_gpus_per_node(group: Group) -> None:
    """Two benchmarks of the group's server (rank 0's port) and the report comparing them: its provenance and
    report.md name every node in rank order with its GPUs."""
    lengths = {"concurrencies": [1], "input_len": 16, "output_len": 8, "num_prompts": 4, "repeats": 1}
    first = {"id": "first", "kind": "benchmark", "host": "gpu1", "server": "serve", **lengths}
    second = first | {"id": "second", "compare_to": "first"}
    with contextlib.ExitStack() as fast:
        for node in group.nodes:
            fast.enter_context(node.standin(startup_s=0.3, decode_tokens_per_s=400.0))
        code, facts, out = group.run(group.probe(), group.deploy(), first, second, group.stop())
    assert code == 0, out
    run_dir = Path(facts[("second", "gpu1")]["report"]["json_file"]).parent
    report = json.loads((run_dir / "report.json").read_text())
    address = f"{group.nodes[0].address}:{group.dist_port}"
    model = "NVIDIA H100 80GB HBM3"
    nodes = [{"rank": rank, "host": name, "gpu_model": model, "gpus": 8} for rank, name in enumerate(group.names)]
    deployed = report["provenance"]["deployments"]
    assert [d["side"] for d in deployed] == ["first", "second"]
    for side in deployed:
        assert (side["step"], side["host"], side["gpus"]) == ("serve", "gpu1", 16)
        assert side["group"] == {"nodes": nodes, "tp_size": 16, "dist_init_addr": address}
    markdown = (run_dir / "report.md").read_text()
    table = markdown[markdown.index("## Provenance: node groups") : markdown.index("## Provenance: GPUs")]
    assert "| side | step | rank | node | GPU model | GPUs | tp size | dist-init address |" in table
    for side in ("first", "second"):
        for rank, name in enumerate(group.names):
            assert f"| {side} | serve | {rank} | {name} | {model} | 8 | 16 | {address} |" in table


class _SilentNode:
    """A node whose transport broke (its sshd stopped answering): every command is a transport error."""

    host_name = "gpu2"

    async def run(self, script: str, *, timeout: float | None = None) -> Any:
        raise AttemptFailed("transport error: the runner's channel to gpu2 broke: Server not responding to keepalive")


def test_a_node_that_stops_answering_is_named_and_its_rank_said_to_be_left_running() -> None:
    """A transport error on a node is a GroupFailed naming it, like every other failure of the group; stopping the
    group then says which rank was not stopped and may hold its GPUs (it said only the transport's words)."""
    with pytest.raises(node_group.GroupFailed, match=r"^node gpu2: transport error: the runner's channel to gpu2"):
        asyncio.run(node_group.ask(_SilentNode(), "true", node_group.WatchReport, "watch", 5))  # type: ignore[arg-type]
    said = node_group.stopped_text([_SilentNode()], ["node gpu2: transport error: ..."])  # type: ignore[list-item]
    assert said == "node gpu2: transport error: ... (its rank may still run and hold its GPUs)"


def test_a_peers_remote_error_seen_before_the_dead_rank_is_not_named_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process, the barrier alone with its looks scripted (`ask` replaced): the first look caught gpu2 just
    before it died and gpu1 just after, already with NCCL's line for a peer gone. Naming from that look alone
    called gpu1's consequence the cause; the look after it finds gpu2 dead and names it first."""
    remote = "[rank0]: ncclRemoteError: A call failed possibly due to ... a remote process exiting prematurely."
    own = "[rank8]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed"

    def look(alive: bool, line: str | None, idle: float) -> node_group.WatchReport:
        return node_group.WatchReport(action="watch", port=1, alive=alive, exit_code=None if alive else 1,
                                      error_line=line, last_line=line, idle_s=idle, log_file="rank.log")  # fmt: skip

    looks = {"gpu1": [look(False, remote, 0.1), look(False, remote, 2.1)],
             "gpu2": [look(True, None, 0.1), look(False, own, 2.5)]}  # fmt: skip
    asked: list[str] = []

    async def ask(view: Any, *_: Any) -> tuple[None, node_group.WatchReport]:
        asked.append(view.host_name)
        return None, looks[view.host_name].pop(0)

    monkeypatch.setattr(node_group, "ask", ask)
    monkeypatch.setattr(node_group, "watch_script", lambda *_: "")
    monkeypatch.setattr(node_group, "FAILURE_SETTLE_S", 0.0)
    step: Any = type("Step", (), {"watch_interval": 1.0, "stall_timeout": 600.0, "ready_limit": lambda self, ctx: 60})()
    views: Any = [type("View", (), {"host_name": name})() for name in ("gpu1", "gpu2")]
    with pytest.raises(node_group.GroupFailed) as failed:
        asyncio.run(node_group.barrier(step, None, views))
    assert sorted(asked) == ["gpu1", "gpu1", "gpu2", "gpu2"]  # two looks at each
    assert str(failed.value).startswith(f"node gpu2: its rank exited (exit code 1): {own}")
    assert f"; then node gpu1: its rank exited (exit code 1): {remote}" in str(failed.value)
