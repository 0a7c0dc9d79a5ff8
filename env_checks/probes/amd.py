"""AMD/ROCm probes that need no SMI tool: rocminfo, the ROCm version file and the amdgpu driver version.

rocminfo is the source of truth for what the HSA runtime exposes: one agent per CPU socket and per GPU
(or GPU partition), each GPU with its gfx target (gfx942 on MI300X/MI300A/MI325X, gfx90a on MI250X),
compute-unit count, the ISA names whose feature suffix says SRAMECC/XNACK
(`amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`), and the "Packet Processor uCode" line, which is the MEC
firmware version the KFD reports (the one that decides whether HSA_NO_SCRATCH_RECLAIM=1 is needed).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from env_checks.probes.facts import (
    ABSENT,
    ProbeFailure,
    Unparseable,
    int_or_none,
    parse_with,
    read_text,
    run_tool,
)

_AGENT_LINE = re.compile(r"^Agent (\d+)$")
_FIELD = re.compile(r"^(\s*)([^:]+?):(.*)$")
_KFD_LINE = re.compile(r"ROCk module version (\S+) is loaded")


@dataclass
class RocmAgent:
    """One HSA agent as rocminfo prints it (a CPU socket, or a GPU / GPU partition)."""

    index: int
    name: str
    marketing_name: str | None
    device_type: str
    gfx_target: str | None = None
    compute_units: int | None = None
    node: int | None = None
    chip_id: int | None = None
    mec_firmware: int | None = None
    isa: list[str] = field(default_factory=list)
    sramecc: bool | None = None
    xnack: bool | None = None


@dataclass
class Rocminfo:
    """The parsed rocminfo report: runtime version, the KFD version line, and every agent."""

    runtime_version: str | None
    kfd_version: str | None
    agents: list[RocmAgent]

    @property
    def gpus(self) -> list[RocmAgent]:
        return [a for a in self.agents if a.device_type == "GPU"]


def isa_features(isa_name: str) -> tuple[str, dict[str, bool]]:
    """'amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-' -> ('gfx942', {'sramecc': True, 'xnack': False})."""
    target = isa_name.rsplit("--", 1)[-1]
    processor, *features = target.split(":")
    flags = {f[:-1].lower(): f.endswith("+") for f in features if f[-1:] in "+-" and len(f) > 1}
    return processor, flags


def _agent_blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    blocks: list[tuple[int, list[str]]] = []
    for i, line in enumerate(lines):
        match = _AGENT_LINE.match(line.strip())
        # An agent header is "*******" / "Agent N" / "*******"; requiring the stars avoids matching
        # a field value that happens to read "Agent 3".
        if match and i > 0 and lines[i - 1].strip().startswith("*******"):
            blocks.append((int(match.group(1)), []))
        elif blocks and not line.strip().startswith("*******"):
            blocks[-1][1].append(line)
    return blocks


def _parse_agent(index: int, lines: list[str]) -> RocmAgent:
    top: dict[str, str] = {}
    isa: list[str] = []
    for line in lines:
        match = _FIELD.match(line)
        if not match:
            continue
        indent, key, value = len(match.group(1)), match.group(2).strip(), match.group(3)
        # rocminfo prints a few keys with a doubled colon ("Packet Processor uCode:: 189").
        value = value.lstrip(":").strip()
        if indent == 2:
            top.setdefault(key, value)
        elif key == "Name" and value.startswith("amdgcn-"):
            isa.append(value)
    if "Name" not in top or "Device Type" not in top:
        raise Unparseable(f"agent {index} has no Name or Device Type line")
    agent = RocmAgent(
        index=index,
        name=top["Name"],
        marketing_name=top.get("Marketing Name") or None,
        device_type=top["Device Type"],
        compute_units=int_or_none(top.get("Compute Unit")),
        node=int_or_none(top.get("Node")),
        chip_id=int_or_none(top.get("Chip ID")),
        isa=isa,
    )
    if agent.device_type == "GPU":
        if not agent.name.startswith("gfx"):
            raise Unparseable(f"GPU agent {index} is named {agent.name!r}, not a gfx target")
        agent.gfx_target = agent.name
        agent.mec_firmware = int_or_none(top.get("Packet Processor uCode"))
        # The generic ISA (gfx9-4-generic) is listed too; the features of the device's own target count.
        own = [name for name in isa if isa_features(name)[0] == agent.name]
        if own:
            flags = isa_features(own[0])[1]
            agent.sramecc, agent.xnack = flags.get("sramecc"), flags.get("xnack")
    return agent


def parse_rocminfo(text: str) -> Rocminfo:
    """Parse `rocminfo` output; raises Unparseable if it is truncated or has no agents."""
    if "HSA Agents" not in text:
        raise Unparseable("no 'HSA Agents' section")
    # rocminfo always ends with this line; its absence means the output was cut off.
    if "*** Done ***" not in text:
        raise Unparseable("no '*** Done ***' line: output truncated")
    lines = text.splitlines()
    blocks = _agent_blocks(lines)
    if not blocks:
        raise Unparseable("no agents listed")
    runtime = re.search(r"^Runtime Version:\s*(\S+)", text, re.MULTILINE)
    kfd = _KFD_LINE.search(text)
    return Rocminfo(
        runtime_version=runtime.group(1) if runtime else None,
        kfd_version=kfd.group(1) if kfd else None,
        agents=[_parse_agent(index, block) for index, block in blocks],
    )


@dataclass
class RocmVersion:
    """ROCm release from the install's .info/version file ('6.4.1-103' -> version '6.4.1')."""

    version: str
    raw: str
    path: str


def parse_rocm_version(text: str, path: str = "") -> RocmVersion:
    raw = next((line.strip() for line in text.splitlines() if line.strip()), "")
    match = re.match(r"^(\d+\.\d+(?:\.\d+)?)", raw)
    if not match:
        raise Unparseable(f"no version number in {raw[:60]!r}")
    return RocmVersion(version=match.group(1), raw=raw, path=path)


@dataclass
class AmdgpuDriver:
    """Version of the amdgpu kernel module (the DKMS driver publishes it; the in-tree one does not)."""

    version: str


def parse_amdgpu_version(text: str) -> AmdgpuDriver:
    raw = text.strip()
    if not re.match(r"^\d+\.\d+", raw):
        raise Unparseable(f"not a version: {raw[:60]!r}")
    return AmdgpuDriver(version=raw)


def rocm_root() -> Path:
    """Where ROCm is installed: $ROCM_PATH if set, else the conventional /opt/rocm."""
    return Path(os.environ.get("ROCM_PATH") or "/opt/rocm")


def probe_rocminfo() -> Rocminfo | ProbeFailure:
    return parse_with("rocminfo", parse_rocminfo, run_tool(["rocminfo"]))


def probe_rocm_version() -> RocmVersion | ProbeFailure:
    path = rocm_root() / ".info" / "version"
    text = read_text(path, "rocm-version-file")
    if isinstance(text, ProbeFailure) and text.kind == ABSENT:
        return ProbeFailure("rocm", ABSENT, f"ROCm not installed ({path} does not exist)")
    return parse_with("rocm-version-file", lambda t: parse_rocm_version(t, str(path)), text)


def probe_amdgpu_version(sys_module: Path = Path("/sys/module/amdgpu")) -> AmdgpuDriver | ProbeFailure:
    if not sys_module.exists():
        return ProbeFailure("amdgpu", ABSENT, "amdgpu kernel module not loaded")
    text = read_text(sys_module / "version", "amdgpu")
    if isinstance(text, ProbeFailure) and text.kind == ABSENT:
        return ProbeFailure(
            "amdgpu", ABSENT,
            "amdgpu is loaded but publishes no version (in-tree kernel driver rather than the ROCm DKMS one)",
        )
    return parse_with("amdgpu", parse_amdgpu_version, text)
