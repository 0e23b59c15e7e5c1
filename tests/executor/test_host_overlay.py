"""An inventory lays its hosts over the runbook's field by field: the README's site file of `{address, user}`
keeps the runbook's `identity_file`, `known_hosts` and `connect_timeout`; an entry of `user:` alone is valid; a
host an inventory's pool adds needs its address; `runbook plan` (text and `--json`) and the MCP `validate`
and `plan` say where each host field comes from (runbook FILE:LINE, inventory FILE:LINE, or the default)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli

RUNBOOK = """\
name: overlay
hosts:
  box:
    address: gpu-box.example
    user: root
    port: {port}
    identity_file: {key}
    known_hosts: {known}
    connect_timeout: 7s
    vars: {{port_var: 1, dir_var: /a}}
vars: {{port_var: 0, dir_var: /d}}
pools:
  gpus: [box]
steps:
  - {{id: hello, kind: shell, hosts: gpus, script: 'echo "hello $dir_var"'}}
"""


def _files(tmp_path: Path, site: str, port: object = 2222, key: object = "~/.ssh/k", known: object = "~/kh") -> Path:
    (tmp_path / "book.yaml").write_text(RUNBOOK.format(port=port, key=key, known=known))
    (tmp_path / "site.yaml").write_text(textwrap.dedent(site))
    return tmp_path / "book.yaml"


def _line(path: Path, text: str) -> str:
    """`FILE:LINE` of the first line of `path` holding `text`."""
    return f"{path}:{next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)}"


def _fields(document: dict[str, Any], host: str = "box") -> dict[str, dict[str, Any]]:
    (found,) = (h for h in document["hosts"] if h["host"] == host)
    return {field["name"]: field for field in found["fields"]}


def test_a_site_file_of_address_and_user_keeps_the_runbooks_key_known_hosts_and_timeout(
    sshd: SSHServer, tmp_path: Path
) -> None:
    """The README's site file, against the real sshd: the runbook's port, key and known_hosts reach it."""
    site = f"hosts:\n  box: {{address: {sshd.address}, user: {sshd.user}}}\n"
    book = _files(tmp_path, site, sshd.port, sshd.client_key, sshd.known_hosts)
    inventory = str(tmp_path / "site.yaml")
    done = runbook_cli("run", str(book), "--inventory", inventory, "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stderr
    # wide enough that no source (a long tmp_path) is wrapped below its value
    planned = runbook_cli("plan", str(book), "--inventory", inventory, env={"COLUMNS": "400"})
    assert planned.returncode == 0, planned.stderr
    text = planned.stdout
    assert f"address          {sshd.address}" in text and f"(inventory {inventory}:2)" in text
    assert f"(runbook {_line(book, 'identity_file')})" in text
    assert f"(runbook {_line(book, 'known_hosts')})" in text
    assert "connect_timeout  7s" in text and f"(runbook {_line(book, 'connect_timeout')})" in text


def test_an_entry_of_user_alone_is_valid_and_plan_says_where_each_field_comes_from(tmp_path: Path) -> None:
    site = """\
        hosts:
          box:
            user: ubuntu
            identity_file: null
            vars: {dir_var: /site}
        """
    book = _files(tmp_path, site)
    inventory = tmp_path / "site.yaml"
    args = (str(book), "--inventory", str(inventory))
    assert runbook_cli("validate", *args).returncode == 0
    planned = runbook_cli("plan", *args, "--json")
    assert planned.returncode == 0, planned.stderr
    fields = _fields(json.loads(planned.stdout))
    said = {name: (f["shown"], f["source"], f["at"]) for name, f in fields.items()}
    assert said["address"] == ("gpu-box.example", "runbook", _line(book, "address:"))
    assert said["user"] == ("ubuntu", "inventory", _line(inventory, "user:"))
    assert said["identity_file"] == ("unset", "inventory", _line(inventory, "identity_file"))  # null drops it
    assert said["known_hosts"] == ("~/kh", "runbook", _line(book, "known_hosts"))
    assert said["connect_timeout"] == ("7s", "runbook", _line(book, "connect_timeout"))
    assert said["keepalive"] == ("15s", "default", None)
    assert said["vars.dir_var"] == ("/site", "inventory", _line(inventory, "dir_var"))  # vars: name by name
    assert said["vars.port_var"] == ("1", "runbook", _line(book, "port_var: 1"))
    text = runbook_cli("plan", *args).stdout
    assert f"user             ubuntu           (inventory {_line(inventory, 'user:')})" in text
    assert (
        "defaults: verify_host_key true, keepalive 15s, proxy_jump unset, ssh_config unset, runner persistent" in text
    )
    assert "on box [gpu-box.example]" in text
    full = runbook_cli("plan", *args, "--full").stdout
    assert "export dir_var=/site" in full


@pytest.mark.parametrize(
    ("site", "where", "said"),
    [
        (
            "hosts:\n  box2: {user: x}\npools:\n  gpus: [box, box2]\n",
            ":2:3:",
            "hosts.box2: a host the runbook does not have needs its `address`",
        ),
        ("hosts:\n  box:\n    address: null\n", ":3:5:", "hosts.box: `address: null` leaves the host without one"),
    ],
    ids=["pool-adds-a-host-without-address", "address-null"],
)
def test_a_host_left_without_an_address_is_refused_at_the_inventorys_line(
    tmp_path: Path, site: str, where: str, said: str
) -> None:
    book = _files(tmp_path, site)
    done = runbook_cli("validate", str(book), "--inventory", str(tmp_path / "site.yaml"))
    assert done.returncode == 2
    assert f"{tmp_path / 'site.yaml'}{where} {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_host_the_pool_adds_has_its_own_fields_and_the_runbooks_host_keeps_its(tmp_path: Path) -> None:
    site = """\
        hosts:
          box: {address: gpu-box.example}
          box2: {address: gpu-box2.example, user: ubuntu}
        pools:
          gpus: [box, box2]
        """
    book = _files(tmp_path, site)
    planned = runbook_cli("plan", str(book), "--inventory", str(tmp_path / "site.yaml"), "--json")
    document = json.loads(planned.stdout)
    assert _fields(document)["known_hosts"]["source"] == "runbook"
    added = _fields(document, "box2")
    assert (added["address"]["source"], added["known_hosts"]["source"]) == ("inventory", "default")
    assert [on["address"] for step in document["steps"] for on in step["on"]] == ["gpu-box.example", "gpu-box2.example"]


def test_mcp_validate_and_plan_carry_where_each_host_field_comes_from(tmp_path: Path) -> None:
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    from tests.executor.test_mcp_guards import call

    book = _files(tmp_path, "hosts:\n  box: {user: ubuntu}\n")
    inventory = str(tmp_path / "site.yaml")
    for tool in ("validate", "plan"):
        answer = call(tool, tmp_path, file=str(book), inventory=inventory)
        fields = _fields(answer)
        assert (fields["user"]["source"], fields["user"]["at"]) == ("inventory", f"{inventory}:2"), tool
        assert (fields["identity_file"]["source"], fields["port"]["value"]) == ("runbook", 2222), tool
