"""rocminfo, pasted: the whole output (`HSA System Attributes`, one block per agent, `*** Done ***`), or a part of one
agent block without its `Agent N` header.

From a whole output: CPU and GPU models, gfx targets, CUs, the MEC microcode, VF, the GPU count (a lower bound where
the paste is cut); each GPU agent's chip id (`29857(0x74a1)` -> 0x74a1) and MEC/SDMA microcode per agent; the KFD
(ROCk module) version of `ROCk module version 6.8.5 is loaded`, the runtime extension version, each GPU agent's full
ISA name (`amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`) with the target id it carries, and, where the paste elides
agents (`...`), the agent and KFD node counts the agents shown imply (Agent 16 and Node 15: at least 16 of each).
"""

from __future__ import annotations

import re

from env_checks.pasted.reading import ELIDED, Reading, add_firmware, add_gpu_firmware
from env_checks.tool_text import colon_pairs, normalise_gfx

_AGENT_HEADER = re.compile(r"^\*{5,}\s*\n\s*Agent (\d+)\s*\n\*{5,}\s*$", re.MULTILINE)
_ISA = re.compile(r"^\s*Name:\s*(amdgcn-amd-amdhsa--(gfx[0-9a-f]+)((?::(?:sramecc|xnack)[+-])*))\s*$", re.MULTILINE)
_AGENT_KEYS = ("Chip ID", "Device Type", "Compute Unit", "Marketing Name", "Cacheline Size", "BDFID",
               "Internal Node ID", "Queue Max Size", "Packet Processor uCode", "SIMDs per CU")


def is_rocminfo(text: str) -> bool:
    return "HSA Agents" in text or "HSA System Attributes" in text or "ROCk module" in text \
        or bool(re.search(r"^\*{5,}\s*\n\s*Agent \d+", text, re.MULTILINE))


def read_rocminfo(text: str) -> Reading:
    r = Reading("rocminfo")
    blocks = re.split(r"^\*{5,}\s*\n\s*Agent \d+\s*\n\*{5,}\s*$", text, flags=re.MULTILINE)
    runtime = re.search(r"^Runtime Version:\s*(\S+)", text, re.MULTILINE)
    r.put("hsa_runtime_version", runtime.group(1) if runtime else None)
    gpus, partial = 0, False
    for block in blocks[1:]:
        fields = {k: v for indent, k, v in colon_pairs(block) if indent <= 2}
        kind = fields.get("device type")
        if kind is None:
            partial = True
            continue
        if kind.upper() == "CPU":
            r.add("cpu_models", fields.get("marketing name"))
        elif kind.upper() == "GPU":
            gpus += 1
            market = fields.get("marketing name")
            r.add("gpu_models", market)
            r.add("gfx_targets", normalise_gfx(fields.get("name")))
            if fields.get("compute unit", "").isdigit():
                r.add("compute_units", fields["compute unit"])
            uc = fields.get("packet processor ucode")
            if uc:
                r.facts.setdefault("firmware", {}).setdefault("mec", uc)
            if market and re.search(r"\bVF\b", market):
                r.put("virtualization", "VF (SR-IOV guest)")
            isa = re.findall(r"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)(:\S*)?", block)
            for target, feats in isa:
                if target == normalise_gfx(fields.get("name")) and feats:
                    r.put("isa_features", feats.strip(":"))
    done = "*** Done ***" in text
    r.count(gpus, done and not partial)
    if not done:
        r.unread.append("The rocminfo output ends before '*** Done ***': agents after the last complete one, "
                        "and so the GPU count, could not be read.")
    elif partial:
        r.unread.append("An agent block has no 'Device Type' line, so it could not be classified.")
    if "ROCk module is loaded" in text:
        r.put("kfd", "loaded")
    failure = re.search(r"^Call returned (HSA_STATUS_\w+)", text, re.MULTILINE)
    if failure and len(blocks) == 1:
        r.unread = [f"rocminfo stopped with {failure.group(1)} before listing any agent, so no GPU facts exist."]
    _agent_firmware_and_chip_ids(text, r)
    _kfd_and_isa_names(text, r)
    return r


def _agent_firmware_and_chip_ids(text: str, r: Reading) -> None:
    """Chip ID of each GPU agent ('29857(0x74a1)' -> 0x74a1), the SDMA microcode version, each agent's firmware."""
    agents = _AGENT_HEADER.split(text)
    for agent, block in zip(agents[1::2], agents[2::2]):
        if not re.search(r"^\s*Device Type:\s*GPU\b", block, re.MULTILINE):
            continue
        for label, block_name in (("Packet Processor uCode", "mec"), ("SDMA engine uCode", "sdma")):
            found = re.search(rf"^\s*{label}::?\s*(\S+)", block, re.MULTILINE)
            if found:
                add_gpu_firmware(r, f"agent {agent}", block_name, found.group(1))
        chip = re.search(r"^\s*Chip ID:\s*\d+\((0x[0-9a-fA-F]+)\)", block, re.MULTILINE)
        if chip and int(chip.group(1), 16):
            r.add("device_ids", chip.group(1))
        sdma = re.search(r"^\s*SDMA engine uCode::?\s*(\S+)", block, re.MULTILINE)
        if sdma:
            add_firmware(r, "sdma", sdma.group(1))


def _kfd_and_isa_names(text: str, r: Reading) -> None:
    kfd = re.search(r"^ROCk module version (\S+) is loaded", text, re.MULTILINE)
    r.put("kfd_version", kfd.group(1) if kfd else None)
    ext = re.search(r"^Runtime Ext Version:\s*(\S+)", text, re.MULTILINE)
    r.put("hsa_runtime_ext_version", ext.group(1) if ext else None)
    for name, gfx, features in _ISA.findall(text):
        r.add("isa_names", name)
        if features:
            r.add("gfx_target_ids", gfx + features)
    if not ELIDED.search(text):
        return
    agents = [int(n) for n in re.findall(r"^\s*Agent (\d+)\s*$", text, re.MULTILINE)]
    nodes = [int(n) for n in re.findall(r"^\s*Node:\s*(\d+)\s*$", text, re.MULTILINE)]
    if agents:
        r.put("hsa_agents_at_least", max(agents))
    if nodes:
        r.put("kfd_nodes_at_least", max(nodes) + 1)
    if agents or nodes:
        r.unread.append(f"The listing elides agents ('...'): the agents shown (highest Agent {max(agents or [0])}, "
                        f"Node {max(nodes or [0])}) give lower bounds of the agent and node counts, and the elided "
                        "agents' models, targets and GPU count could not be read.")


# ---------------------------------------------------------------- a part of one agent block


def is_rocminfo_fragment(text: str) -> bool:
    """Lines of one agent block (three of its keys at its indent) in a text that is not a whole rocminfo."""
    keys = {m for m in re.findall(r"^ {2}(" + "|".join(re.escape(k) for k in _AGENT_KEYS) + r"):", text, re.M)}
    return len(keys) >= 3 and not is_rocminfo(text)


def read_rocminfo_fragment(text: str) -> Reading:
    """Lines of one rocminfo agent, pasted without the 'Agent N' header (the head or tail of the block cut)."""
    r = Reading("rocminfo (part of an agent block)")
    fields: dict[str, str] = {}
    for key, value in re.findall(r"^ {2}([A-Za-z][^:\n]*?):{1,2}\s*(.*?)\s*$", text, re.MULTILINE):
        fields.setdefault(key.lower(), value)
    kind = fields.get("device type", "").upper()
    gpu_only = any(k in fields for k in ("packet processor ucode", "sdma engine ucode", "wavefront size"))
    if kind == "CPU":
        r.add("cpu_models", fields.get("marketing name"))
    elif kind == "GPU" or gpu_only:
        r.add("gpu_models", fields.get("marketing name"))
        r.add("gfx_targets", normalise_gfx(fields.get("name")))
        chip = re.match(r"^\d+\((0x[0-9a-fA-F]+)\)$", fields.get("chip id", ""))
        if chip and int(chip.group(1), 16):
            r.add("device_ids", chip.group(1))
        if fields.get("compute unit", "").isdigit():
            r.add("compute_units", fields["compute unit"])
        if fields.get("packet processor ucode"):
            r.facts.setdefault("firmware", {}).setdefault("mec", fields["packet processor ucode"])
        if fields.get("sdma engine ucode"):
            r.facts.setdefault("firmware", {}).setdefault("sdma", fields["sdma engine ucode"])
        r.put("gpu_count_at_least", 1)
    for target in re.findall(r"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)", text):
        r.add("gfx_targets", target)
    if not kind:
        r.unread.append("This is part of a rocminfo agent block without its 'Device Type' line; it was read as a "
                        "GPU only because it shows GPU-only fields." if gpu_only else
                        "This is part of a rocminfo agent block without its 'Device Type' line, so the agent "
                        "could not be classified.")
    r.unread.append("The paste has no 'Agent N' header or '*** Done ***' line: only the lines shown were read, and "
                    "how many GPUs the machine has is unknown.")
    return r
