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
from sandbox.embedded_sshd import start_embedded_sshd
from sandbox.hub import HubServer
from sandbox.sglang_standin import faults as standin_switches
from sandbox.sshd import SSHD, SSHServer, free_port, start_sshd

RUNBOOK = prepare.REPO / "runbooks" / "k26_dflash.yaml"
SshServerKind = Literal["auto", "openssh", "embedded"]
DEMO_STANDIN = {"decode_tokens_per_s": 1500.0, "startup_s": 1.0}


@dataclass(frozen=True)
class DemoSite:
    runbook: Path
    inventory: Path
    hf_token: str
    ssh_server: str  # "openssh" or "embedded"
    host_root: Path


def _ssh_server(kind: SshServerKind, root: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], SSHServer, str]:
    use_openssh = kind == "openssh" or (kind == "auto" and Path(SSHD).exists() and os.geteuid() == 0)
    if use_openssh:
        proc, server = start_sshd(root, extra_config=testhost.sshd_config(env))
        return proc, server, "openssh"
    proc, server = start_embedded_sshd(root, env)
    return proc, server, "embedded"


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
def demo_site(log_dir: Path, ssh: SshServerKind = "auto", say: Callable[[str], None] = print) -> Iterator[DemoSite]:
    """The test host and local Hub, running, and an inventory for them; all stopped on exit."""
    if testhost.missing():
        say("demo: preparing the test host once (the real SGLang release's files, huggingface_hub) ...")
        prepare.main()
    root = log_dir.resolve() / "demo-host"
    stop_servers(root / "home")  # a demo killed outright in this log dir left its server: its record goes next
    shutil.rmtree(root, ignore_errors=True)
    home = root / "home"
    home.mkdir(parents=True)
    # the stand-in decodes faster than Kimi-K2.6 on 8 GPUs, so the runbook's full benchmark takes seconds
    standin_switches.path(home).write_text(json.dumps(DEMO_STANDIN))
    proc, server, served_by = _ssh_server(ssh, root / "ssh", testhost.session_env("h200", home))
    try:
        with HubServer() as hub:
            inventory = root / "inventory.yaml"
            site_vars = {
                "models_dir": str(home / "models"),
                "sglang_python": str(prepare.VENV_PYTHON),
                "hf_cli": str(prepare.VENV / "bin" / "hf"),
                "HF_ENDPOINT": hub.endpoint,
                "sglang_port": free_port(),
            }
            inventory.write_text(yaml.safe_dump({"hosts": {"gpu": server.host_dict()}, "vars": site_vars}))
            yield DemoSite(RUNBOOK, inventory, hub.token, served_by, root)
    finally:
        stop_servers(home)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
