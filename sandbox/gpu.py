"""TEST DOUBLE of `nvidia-smi`: the GPUs of a host that this machine does not have.

It prints what a real nvidia-smi prints, in its formats, for one of these hosts, chosen by the
environment variable RUNBOOK_SANDBOX_GPU:

- `h200`: the real single-H200 host whose answers are in gpu_fixtures/h200/ (copied from
  ../shared/fixtures/gpu-host-h200/); rendering this host reproduces those files byte for byte,
  which the tests check, so the renderers below are the real formats;
- `rtx6000`: 8x NVIDIA RTX PRO 6000 Blackwell Server Edition (the seeds' CT200 host), derived
  with the same renderers: 97887 MiB each with 638 MiB reserved (what real cards of that model
  report), compute capability 12.0, 600 W, PCIe only;
- `h200x8`, `h100x8` (also `h100`): eight H200 or H100 80GB HBM3 cards of an HGX node, derived from
  the real H200 card (`_hgx`);
- `none`: the NVIDIA user-space tools without a working driver (nvidia-smi's own error, exit 9).

Commands: `nvidia-smi`, `-L`, `--query-gpu=FIELDS --format=csv[,noheader][,nounits]`, `-q -x`,
`topo -m`, each optionally with `-i INDEX[,INDEX]`. Anything else gets the real tool's answer to
a command line it does not accept (exit 2). Run as `.cache/testhost/bin/nvidia-smi` on the test
host's PATH (written by `python -m sandbox.prepare`); never part of a real run.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "gpu_fixtures"
ENV_VAR = "RUNBOOK_SANDBOX_GPU"

# nvidia-smi's exit codes (nvidia-smi(1), RETURN VALUE)
EXIT_INVALID_ARGUMENT = 2
EXIT_DRIVER_NOT_LOADED = 9
INVALID_ARGUMENTS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str
    uuid: str
    bus_id: str  # "00000000:00:06.0"
    memory_total_mib: int
    memory_reserved_mib: int
    memory_used_mib: int
    memory_free_mib: int  # nvidia-smi's own figure: total - reserved - used, rounded up by 1 MiB
    compute_cap: str
    architecture: str
    pci_device_id: str
    serial: str
    numa_node: int
    cpu_affinity: str
    persistence: bool = True
    fan: str = "N/A"
    temperature_c: int = 35
    perf: str = "P0"
    power_draw_w: int = 122
    power_limit_w: int = 700
    display_active: str = "Off"
    volatile_ecc: str = "0"
    utilization_pct: int = 0
    compute_mode: str = "Default"
    mig: str = "Disabled"


@dataclass(frozen=True)
class Host:
    """The GPUs of one host and its driver."""

    driver_version: str
    cuda_version: str
    gpus: tuple[Gpu, ...]


H200 = Host(
    driver_version="580.159.04",
    cuda_version="13.0",
    gpus=(
        Gpu(
            index=0,
            name="NVIDIA H200",
            uuid="GPU-081868fe-7760-46d5-8624-9b6e58495c1d",
            bus_id="00000000:00:06.0",
            memory_total_mib=143771,
            memory_reserved_mib=616,
            memory_used_mib=0,
            memory_free_mib=143156,
            compute_cap="9.0",
            architecture="Hopper",
            pci_device_id="233510DE",
            serial="1653724054981",
            numa_node=0,
            cpu_affinity="0-15",
        ),
    ),
)

_RTX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
RTX6000 = Host(
    driver_version="580.95.05",
    cuda_version="13.0",
    gpus=tuple(
        Gpu(
            index=i,
            name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
            uuid=f"GPU-5c7e{i:04x}-94d2-4b8e-8f31-6a02c0ffee{i:02x}",
            bus_id=f"00000000:{bus}:00.0",
            memory_total_mib=97887,
            memory_reserved_mib=638,
            memory_used_mib=0,
            memory_free_mib=97250,
            compute_cap="12.0",
            architecture="Blackwell",
            pci_device_id="2BB510DE",
            serial=f"17925240{i:05d}",
            numa_node=i // 4,
            cpu_affinity="0-47,96-143" if i < 4 else "48-95,144-191",
            temperature_c=27 + i % 3,
            perf="P8",
            power_draw_w=34 + i,
            power_limit_w=600,
        )
        for i, bus in enumerate(_RTX_BUSES)
    ),
)


def _hgx(card: Gpu, serial: int, uuid: str) -> tuple[Gpu, ...]:
    """Eight cards of one model in an HGX board, derived from one card: the bus ids and NUMA split
    of an 8-GPU node (as RTX6000's)."""
    return tuple(
        replace(
            card,
            index=i,
            uuid=f"GPU-{uuid}{i:04x}-{card.uuid[13:]}",
            bus_id=f"00000000:{bus}:00.0",
            serial=str(serial + i),
            numa_node=i // 4,
            cpu_affinity="0-47,96-143" if i < 4 else "48-95,144-191",
        )
        for i, bus in enumerate(_RTX_BUSES)
    )


#: 8x the real H200 card above: the node Kimi-K2.6 INT4 fits on (sglang-dflash.md, "Several nodes")
H200X8 = Host(H200.driver_version, H200.cuda_version, _hgx(H200.gpus[0], 1653724055000, "7a31"))
#: 8x H100 SXM 80 GB (81559 MiB, as the real cards report): too little memory for Kimi-K2.6 on one node,
#: so two of them serve it with tensor parallelism 16 (sglang-dflash.md, "Several nodes")
H100X8 = Host(
    H200.driver_version,
    H200.cuda_version,
    _hgx(
        replace(
            H200.gpus[0],
            name="NVIDIA H100 80GB HBM3",
            memory_total_mib=81559,
            memory_reserved_mib=532,
            memory_free_mib=81028,
            pci_device_id="233010DE",
        ),
        1652922011000,
        "3c90",
    ),
)

#: `h100` is the name H100X8 had before the multi-node test hosts, named like `h200x8` since (the same host)
HOSTS = {"h200": H200, "rtx6000": RTX6000, "h200x8": H200X8, "h100x8": H100X8, "h100": H100X8}


def _mib(value: int, units: bool) -> str:
    return f"{value} MiB" if units else str(value)


#: --query-gpu fields: (header unit, value). The header shows the unit unless `nounits`.
QUERY_FIELDS: dict[str, tuple[str, Callable[[Host, Gpu, bool], str]]] = {
    "index": ("", lambda h, g, u: str(g.index)),
    "name": ("", lambda h, g, u: g.name),
    "uuid": ("", lambda h, g, u: g.uuid),
    "serial": ("", lambda h, g, u: g.serial),
    "pci.bus_id": ("", lambda h, g, u: g.bus_id),
    "memory.total": ("MiB", lambda h, g, u: _mib(g.memory_total_mib, u)),
    "memory.reserved": ("MiB", lambda h, g, u: _mib(g.memory_reserved_mib, u)),
    "memory.used": ("MiB", lambda h, g, u: _mib(g.memory_used_mib, u)),
    "memory.free": ("MiB", lambda h, g, u: _mib(g.memory_free_mib, u)),
    "driver_version": ("", lambda h, g, u: h.driver_version),
    "compute_cap": ("", lambda h, g, u: g.compute_cap),
    "persistence_mode": ("", lambda h, g, u: "Enabled" if g.persistence else "Disabled"),
    "temperature.gpu": ("", lambda h, g, u: str(g.temperature_c)),
    "utilization.gpu": ("%", lambda h, g, u: f"{g.utilization_pct} %" if u else str(g.utilization_pct)),
    "power.limit": ("W", lambda h, g, u: f"{g.power_limit_w:.2f} W" if u else f"{g.power_limit_w:.2f}"),
    "count": ("", lambda h, g, u: str(len(h.gpus))),
}


def render_query(host: Host, fields: Sequence[str], header: bool, units: bool) -> str:
    """`--query-gpu=FIELDS --format=csv[,noheader][,nounits]`."""
    lines = []
    if header:
        lines.append(", ".join(f"{f} [{QUERY_FIELDS[f][0]}]" if QUERY_FIELDS[f][0] else f for f in fields))
    for gpu in host.gpus:
        lines.append(", ".join(QUERY_FIELDS[f][1](host, gpu, units) for f in fields))
    return "".join(line + "\n" for line in lines)


def render_list(host: Host) -> str:
    """`-L`."""
    return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in host.gpus)


_RULE = "+-----------------------------------------------------------------------------------------+\n"
_CELLS = "+-----------------------------------------+------------------------+----------------------+\n"
_TABLE_HEAD = (
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n"
    "|                                         |                        |               MIG M. |\n"
    "|=========================================+========================+======================|\n"
)
_NO_PROCESSES = (
    "| Processes:                                                                              |\n"
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n"
    "|        ID   ID                                                               Usage      |\n"
    "|=========================================================================================|\n"
    "|  No running processes found                                                             |\n"
)


def _short_name(name: str) -> str:
    return name if len(name) <= 27 else name[:24] + "..."


def render_table(host: Host, now: float) -> str:
    """Plain `nvidia-smi` (the driver 580 layout), stamped with the time `now`."""
    stamp = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now))
    smi = f"NVIDIA-SMI {host.driver_version}"
    out = [f"{stamp}       \n", _RULE]
    out.append(f"| {smi:<34}Driver Version: {host.driver_version:<15}CUDA Version: {host.cuda_version:<9}|\n")
    out += [_CELLS, _TABLE_HEAD]
    for g in host.gpus:
        pm = "On" if g.persistence else "Off"
        out.append(
            f"| {g.index:>3}  {_short_name(g.name):<27}    {pm:<4}|"
            f" {g.bus_id:>18} {g.display_active:<3} |{g.volatile_ecc:>21} |\n"
        )
        out.append(
            f"| {g.fan:>3}   {g.temperature_c:>2}C    {g.perf:<2}{g.power_draw_w:>15}W / {g.power_limit_w:>4}W |"
            f" {g.memory_used_mib:>7}MiB / {g.memory_total_mib:>6}MiB |{g.utilization_pct:>7}%{g.compute_mode:>13} |\n"
        )
        out.append(f"|{'':41}|{'':24}|{g.mig:>21} |\n")
        out.append(_CELLS)
    out += ["\n", _RULE, _NO_PROCESSES, _RULE]
    return "".join(out)


def render_topology(host: Host) -> str:
    """`topo -m`: PCIe only (no NVLink); NODE within a NUMA node, SYS across."""
    names = [f"GPU{g.index}" for g in host.gpus]
    head = "\t\x1b[4m" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m\n"
    rows = []
    for g in host.gpus:
        links = [" X " if o is g else ("NODE" if o.numa_node == g.numa_node else "SYS") for o in host.gpus]
        rows.append("\t".join([f"GPU{g.index}", *links, g.cpu_affinity, str(g.numa_node), "", "N/A"]) + "\n")
    legend = (FIXTURES / "h200" / "nvidia-smi-topo-m.txt").read_text().split("\n\n", 1)[1]
    return head + "".join(rows) + "\n" + legend


def _set(block: str, tag: str, value: str) -> str:
    """Replace the text of the first `<tag>` element in an XML block."""
    new, count = re.subn(rf"<{tag}>[^<]*</{tag}>", lambda _: f"<{tag}>{value}</{tag}>", block, count=1)
    if count != 1:
        raise ValueError(f"no <{tag}> in the nvidia-smi -q -x template")
    return new


def _xml_gpu(template: str, g: Gpu) -> str:
    bus, device = g.bus_id.split(":")[1], g.bus_id.split(":")[2].split(".")[0]
    block = re.sub(r'<gpu id="[^"]*">', f'<gpu id="{g.bus_id}">', template, count=1)
    for tag, value in (
        ("product_name", g.name),
        ("product_architecture", g.architecture),
        ("persistence_mode", "Enabled" if g.persistence else "Disabled"),
        ("serial", g.serial),
        ("uuid", g.uuid),
        ("minor_number", str(g.index)),
        ("pci_bus", bus),
        ("pci_device", device),
        ("pci_device_id", g.pci_device_id),
        ("pci_bus_id", g.bus_id),
        ("performance_state", g.perf),
        ("current_power_limit", f"{g.power_limit_w:.2f} W"),
        ("default_power_limit", f"{g.power_limit_w:.2f} W"),
        ("max_power_limit", f"{g.power_limit_w:.2f} W"),
    ):
        block = _set(block, tag, value)
    memory = re.search(r"<fb_memory_usage>.*?</fb_memory_usage>", block, re.S)
    assert memory is not None
    usage = memory.group(0)
    for tag, mib in (
        ("total", g.memory_total_mib),
        ("reserved", g.memory_reserved_mib),
        ("used", g.memory_used_mib),
        ("free", g.memory_free_mib),
    ):
        usage = _set(usage, tag, f"{mib} MiB")
    return block.replace(memory.group(0), usage)


def render_xml(host: Host, now: float) -> str:
    """`-q -x`: the real H200 document as the template, one <gpu> element per GPU."""
    template = (FIXTURES / "h200" / "nvidia-smi-q-x.xml").read_text()
    start, end = template.index("\t<gpu id="), template.index("\t</gpu>\n") + len("\t</gpu>\n")
    head = template[:start]
    for tag, value in (
        ("timestamp", time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now))),
        ("driver_version", host.driver_version),
        ("cuda_version", host.cuda_version),
        ("attached_gpus", str(len(host.gpus))),
    ):
        head = _set(head, tag, value)
    return head + "".join(_xml_gpu(template[start:end], g) for g in host.gpus) + template[end:]


def _select(host: Host, ids: str) -> Host | None:
    try:
        wanted = [int(i) for i in ids.split(",")]
    except ValueError:
        return None
    if any(i not in range(len(host.gpus)) for i in wanted):
        return None
    return replace(host, gpus=tuple(host.gpus[i] for i in wanted))


def answer(args: Sequence[str], variant: str, now: float) -> tuple[str, int]:
    """What nvidia-smi prints (stdout) and its exit code, for a command line and a host variant."""
    if variant == "none":
        return NO_DRIVER, EXIT_DRIVER_NOT_LOADED
    host = HOSTS.get(variant)
    if host is None:
        return f"{ENV_VAR}={variant!r}: not a sandbox GPU host (one of {', '.join(HOSTS)}, none)\n", 255
    rest = list(args)
    for flag in ("-i", "--id"):
        if flag in rest:
            at = rest.index(flag)
            selected = _select(host, rest[at + 1]) if at + 1 < len(rest) else None
            if selected is None:
                return "No devices were found\n", 6
            host, rest = selected, rest[:at] + rest[at + 2 :]
    options = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else None for a in rest}
    if not rest:
        return render_table(host, now), 0
    if rest in (["-L"], ["--list-gpus"]):
        return render_list(host), 0
    if sorted(rest) in (["-q", "-x"], ["--query", "--xml-format"], ["-q", "--xml-format"], ["--query", "-x"]):
        return render_xml(host, now), 0
    if rest == ["topo", "-m"]:
        return render_topology(host), 0
    if set(options) == {"--query-gpu", "--format"} and len(rest) == 2 and options["--format"] is not None:
        fields = [f.strip() for f in (options["--query-gpu"] or "").split(",")]
        formats = options["--format"].split(",")
        if formats[0] != "csv" or not set(formats[1:]) <= {"noheader", "nounits"}:
            return INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT
        for field in fields:
            if field not in QUERY_FIELDS:
                return f'Field "{field}" is not a valid field to query.\n\n', EXIT_INVALID_ARGUMENT
        return render_query(host, fields, "noheader" not in formats, "nounits" not in formats), 0
    return INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT


def main(argv: Sequence[str] | None = None) -> int:
    text, code = answer(sys.argv[1:] if argv is None else argv, os.environ.get(ENV_VAR, "h200"), time.time())
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
