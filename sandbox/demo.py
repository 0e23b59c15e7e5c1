"""The site `runbook demo` runs the flagship runbook against: the bundled test host, on this machine.

`demo_site()` stands up, for the length of one run, what a real deployment would reach over the
network, all on loopback and all in `<log-dir>/demo-host/`:

- the test host (sandbox/testhost.py): this machine over real SSH, served by OpenSSH's sshd where
  it is installed and otherwise by the embedded asyncssh server (sandbox/embedded_sshd.py), with the
  nvidia-smi test double of an H200, the real SGLang release's files and the SGLang stand-in
  (sandbox/sglang_standin) answering `python -m sglang.launch_server` / `sglang.bench_serving`;
- the local Hub test double (sandbox/hub.py) serving small synthetic repos shaped like
  moonshotai/Kimi-K2.6 and z-lab/Kimi-K2.6-DFlash, and its token as HF_TOKEN;
- an inventory file pointing the runbook's host and vars at them: the runbook itself is not edited,
  which is the point: a real site differs only in its inventory.

Nothing here is used by a real run; `runbook run` never imports this package.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from hostprograms import deploy as deploy_host
from sandbox import prepare, testhost
from sandbox.hub import HubServer
from sandbox.model_configs import TMP_LONG_ID
from sandbox.sglang_standin import faults as standin_switches
from sandbox.sshd import SSHD

RUNBOOK = prepare.REPO / "runbooks" / "k26_dflash.yaml"
SWEEP_RUNBOOK = prepare.REPO / "runbooks" / "k26_dflash_sweep.yaml"
SWEEP_STRATEGY_LINE = "\n    strategy: grid\n"
SshServerKind = Literal["auto", "openssh", "embedded"]
#: the stand-in's switches (sglang_standin/faults.py): its benchmarks timed on the simulation's clock, an output
#: streamed every 16 tokens, so that the numbers are the model's and three repeats agree (on the wall clock of a
#: loaded machine, the CPU left to the server and the client made every point "(noisy)")
STABLE = {"stream_interval": 16, "modelled_clock": True}
DEMO_STANDIN = {"decode_tokens_per_s": 5000.0, "startup_s": 0.5, **STABLE}
#: the demo site's `bench_repeats` (the runbooks' 3): see demo_site
DEMO_REPEATS = 1
#: the sweep's 12 configurations x 4 concurrencies x 3 repeats take a few minutes at this speed
SWEEP_STANDIN = {"decode_tokens_per_s": 5000.0, "startup_s": 1.0, **STABLE}
#: the sweep's landscapes (the stand-in's switches of simulation.Physics, faults.py), by name:
#: - `h200`: the stand-in's defaults, an 8x H200 where tree verification does not pay (tmp-long wins everywhere;
#:   DFLASH 8 at concurrency 1-4, DFLASH 4 or the baseline at 16-32);
#: - `headroom`: a GPU with more compute per byte of memory bandwidth (a B300-class part, FP4 experts: about 4x the
#:   H200's FLOPs per byte), where a verify step stays bandwidth-bound to more tokens: each token verified costs
#:   about a quarter of the H200's (0.01 decode steps), and batched heavy steps saturate it half as fast (0.05: a
#:   DFLASH 4 step, 0.025 per extra request, still slows more than the baseline's one token, 0.02);
#:   DDTREE's acceptance per doubling of its budget as its paper's gains over DFlash (0.25, about +35% speed at
#:   its best budget, Ringel & Romano 2026), where the default's 0.12 was a cautious guess; and SubSir's tmp-long
#:   drafter, trained for long contexts, worse than z-lab's on the benchmarks' short prompts (0.9 of z-lab's
#:   acceptance beyond the bonus token on chat and open-ended writing, 0.95 on math, 0.7 on code as by default)
LANDSCAPES: dict[str, dict[str, object]] = {
    "h200": {},
    "headroom": {
        "tree_gain": 0.25,
        "verify_cost_per_token": 0.01,
        "batch_slowdown": 0.05,
        "drafter_profiles": {TMP_LONG_ID: {"math": 0.95, "code": 0.7, "chat": 0.9, "creative": 0.9}},
    },
}


@dataclass(frozen=True)
class DemoSite:
    runbook: Path
    inventory: Path
    hf_token: str
    ssh_server: str  # "openssh" or "embedded"
    host_root: Path


def searching_copy(runbook: Path, folder: Path) -> Path:
    """The sweep with its one `strategy: grid` line made `strategy: search`, as a user switches it (its `search:`
    settings are the runbook's), written into `folder` under the same name."""
    text = runbook.read_text()
    assert text.count(SWEEP_STRATEGY_LINE) == 1, f"{runbook} has no single {SWEEP_STRATEGY_LINE!r}"
    copy = folder / runbook.name
    copy.write_text(text.replace(SWEEP_STRATEGY_LINE, SWEEP_STRATEGY_LINE.replace("grid", "search")))
    return copy


def stop_servers(home: Path) -> None:
    """Stop SGLang stand-ins a run left behind (an interrupted demo): deploy records each one's group.

    Only a group whose leader is still the recorded process (same start time: pids get reused) is
    killed, so a stale record never kills someone else's processes.
    """
    for record in (home / ".runbook" / "sglang").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            server = json.loads(record.read_text())
            if deploy_host.alive(int(server["pid"]), server.get("starttime")):
                os.killpg(int(server["pgid"]), signal.SIGKILL)


@contextmanager
def demo_site(
    log_dir: Path,
    ssh: SshServerKind = "auto",
    say: Callable[[str], None] = print,
    *,
    sweep: bool = False,
    search: bool = False,
    hosts: int = 1,
    sglang: str = "ddtree-pr",
    nodes: int = 1,
    landscape: str = "h200",
) -> Iterator[DemoSite]:
    """The test hosts and local Hub, running, and an inventory for them; all stopped on exit.

    The flagship runs on one host (`gpu`), or with `nodes` > 1 across a node group: the inventory's pool
    `nodes` of that many 8x H100 test hosts (`gpu`, rank 0, then `gpu2`, ...), each on its own loopback
    address (127.0.0.2, ...) as separate machines would be, so SGLang's stand-in ranks meet at rank 0's
    dist-init address. The sweep (`sweep=True`) runs on `hosts` test hosts, the
    inventory's pool `gpus`, each an 8x H200 with its own HOME, SGLang port and models folder, and the
    SGLang build `sglang`: by default one with the DDTree pull request (the sandbox's test double of
    it), so every cell of the grid runs; `release` (0.5.23, no DDTREE) skips the DDTREE cells; its stand-ins
    compute the landscape `landscape` (LANDSCAPES' name). With `search`,
    the sweep as a user switches it to searching: its copy beside the inventory with `strategy: search`.
    """
    if testhost.missing():
        say("demo: preparing the test host once (the real SGLang release's files, huggingface_hub) ...")
        prepare.main()
    root = log_dir.resolve() / "demo-host"
    for home in root.glob("**/home"):  # a demo killed outright in this log dir left its servers: theirs go next
        stop_servers(home)
    shutil.rmtree(root, ignore_errors=True)
    use_openssh = ssh == "openssh" or (ssh == "auto" and Path(SSHD).exists() and os.geteuid() == 0)
    kind: Literal["openssh", "embedded"] = "openssh" if use_openssh else "embedded"
    # the sweep's pool gpu1..N; the flagship's rank 0 is its own host `gpu`, the node group's others gpu2..N
    names = [f"gpu{n}" for n in range(1, hosts + 1)] if sweep else ["gpu", *(f"gpu{n}" for n in range(2, nodes + 1))]
    started: list[tuple[subprocess.Popen[bytes], testhost.PoolHost]] = []
    try:
        for n, name in enumerate(names, start=1):
            host_root = root / name if len(names) > 1 else root
            gpu, build = ("h200x8", sglang) if sweep else ("h100x8", "release") if nodes > 1 else ("h200", "release")
            address = testhost.node_address(n) if nodes > 1 else "127.0.0.1"
            started.append(testhost.start(host_root, name, gpu=gpu, sglang=build, ssh=kind, address=address))
            # the stand-in decodes faster than Kimi-K2.6 on 8 GPUs, so the runbook's benchmarks take seconds
            switches = SWEEP_STANDIN | LANDSCAPES[landscape] if sweep else DEMO_STANDIN
            standin_switches.path(started[-1][1].home).write_text(json.dumps(switches))
        with HubServer() as hub:
            site_vars = {
                "sglang_python": str(prepare.VENV_PYTHON),
                "hf_cli": str(prepare.VENV / "bin" / "hf"),
                "HF_ENDPOINT": hub.endpoint,
                # one clean run per concurrency and workload, not the runbook's 3 (a median and spread): the demo
                # shows the whole runbook in a minute or two; `runbook demo --var bench_repeats=3` runs all of them
                "bench_repeats": DEMO_REPEATS,
            }
            pool = [host for _, host in started]
            data = testhost.pool_inventory(pool, site_vars)
            if sweep:
                data["pools"] = {"gpus": names}
            elif nodes > 1:
                data["pools"] = {"nodes": names}
            inventory = root / "inventory.yaml"
            inventory.write_text(yaml.safe_dump(data))
            runbook = searching_copy(SWEEP_RUNBOOK, root) if search else SWEEP_RUNBOOK if sweep else RUNBOOK
            yield DemoSite(runbook, inventory, hub.token, kind, root)
    finally:
        for proc, host in started:
            stop_servers(host.home)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
