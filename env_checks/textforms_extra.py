"""Tolerant readers for more pasted outputs (issue 39): the `amd-smi` default view, `amd-smi partition`, a part of a
rocminfo agent block, `/sys/kernel/debug/dri/N/amdgpu_firmware_info` and `update-alternatives --display rocm`.

Same contract as `textforms`: a `Reading` of facts the text states (never a guess) and one sentence for each thing
that could not be read. `DETECTORS` lists (kind, detector, reader) in the form `env_checks.diagnose` uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from env_checks.textforms import Reading, normalise_gfx

BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"

# ---------------------------------------------------------------- amd-smi (no subcommand): the summary table

_DEFAULT_COLUMNS = re.compile(r"^\|\s*BDF\s+GPU-Name\s*\|", re.MULTILINE)


def is_amd_smi_default(text: str) -> bool:
    return bool(_DEFAULT_COLUMNS.search(text)) or bool(re.search(r"^\|\s*AMD-SMI\s+\S+\s*\|", text, re.MULTILINE))


def read_amd_smi_default(text: str) -> Reading:
    """`amd-smi` with no subcommand (ROCm 7.x): a version header, two table rows per GPU, then Processes."""
    r = Reading("amd-smi (default view)")
    header = {key.lower(): value for key, value in re.findall(
        r"^\|\s*(AMD-SMI|amdgpu Version:|ROCm Version:|Platform:)\s+(.+?)\s*\|\s*$", text, re.MULTILINE)}
    r.put("amd_smi_version", header.get("amd-smi"))
    r.put("driver_version", header.get("amdgpu version:"))
    r.put("rocm_version", header.get("rocm version:"))
    r.put("platform", header.get("platform:"))
    first = re.findall(rf"^\|\s*({BDF})\s+(.+?)\s*\|", text, re.MULTILINE)
    second = re.findall(r"^\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*\|.*?(?:(\d+)/(\d+) MB)?\s*\|\s*$", text, re.MULTILINE)
    for bdf, name in first:
        r.add("pci_bdfs", bdf)
        r.add("gpu_models", name)
    for _index, _hip, _oam, mode, _used, total in second:
        if "/" in mode:
            compute, memory = mode.split("/", 1)
            r.put("compute_partition", compute)
            r.put("memory_partition", memory)
        if total:
            r.put("vram_total_mib", int(total))
    columns = bool(_DEFAULT_COLUMNS.search(text))
    ended = bool(re.search(r"^\|\s*Processes:", text, re.MULTILINE))
    r.count(len(first), True if columns and ended else False)
    if not header:
        r.unread.append("The version header (AMD-SMI, amdgpu and ROCm versions) is not in the paste, so those "
                        "versions could not be read.")
    if not ended:
        r.unread.append("The table is cut before its 'Processes' section, so GPUs after the last row shown may be "
                        "missing.")
    if len(second) < len(first):
        r.unread.append(f"{len(first) - len(second)} GPU(s) lack their second row (partition mode, VRAM), which "
                        "could not be read.")
    return r


# ---------------------------------------------------------------- amd-smi partition (--current, --memory, ...)

_SECTION = re.compile(r"^(CURRENT_PARTITION|MEMORY_PARTITION|ACCELERATOR_PARTITION_PROFILES|"
                      r"ACCELERATOR_PARTITION_RESOURCES):\s*$", re.MULTILINE)


def is_amd_smi_partition(text: str) -> bool:
    return bool(re.search(r"^(CURRENT_PARTITION|ACCELERATOR_PARTITION_PROFILES):\s*$\n^GPU_ID\s", text, re.M)) \
        or bool(re.search(r"^MEMORY_PARTITION:\s*$\n^GPU_ID\s+MEMORY_PARTITION_CAPS", text, re.MULTILINE))


def _tables(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each `NAME:` section followed by a `GPU_ID ...` header: (header, rows), rows split on whitespace."""
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    for match in _SECTION.finditer(text):
        lines = text[match.end():].lstrip("\n").splitlines()
        if not lines or not lines[0].startswith("GPU_ID"):
            continue
        header, rows = lines[0].split(), []
        for line in lines[1:]:
            if not line.strip() or _SECTION.match(line) or re.match(r"^GPU: \d", line):
                break
            rows.append(line.split() if not line[:1].isspace() else [""] + line.split())
        out[match.group(1)] = (header, rows)
    return out


def read_amd_smi_partition(text: str) -> Reading:
    """`amd-smi partition [--current|--memory|--accelerator]`, the ROCm 6.3/6.4 layout and the later one."""
    r = Reading("amd-smi partition")
    tables = _tables(text)
    cut = False
    if "CURRENT_PARTITION" in tables:
        header, rows = tables["CURRENT_PARTITION"]
        gpus = [dict(zip(header, row)) for row in rows if row and row[0].isdigit()]
        cut |= any(len(row) < len(header) for row in rows if row and row[0].isdigit())
        for gpu in gpus:
            r.put("memory_partition", gpu.get("MEMORY"))
            r.put("compute_partition", gpu.get("ACCELERATOR_TYPE"))
        short = any(len(row) < len(header) for row in rows if row and row[0].isdigit())
        r.count(len(gpus), False if short else None)
        if gpus and all(g.get("ACCELERATOR_TYPE", "N/A") == "N/A" for g in gpus):
            r.unread.append("The tool printed N/A as every GPU's ACCELERATOR_TYPE, so the compute partition is not "
                            "stated.")
    if "MEMORY_PARTITION" in tables:
        header, rows = tables["MEMORY_PARTITION"]
        for row in rows:
            r.put("memory_partition", dict(zip(header, row)).get("CURRENT_MEMORY_PARTITION"))
    for block in re.findall(r"^\s+MEMORY_PARTITION:\s*\n(?:\s+CAPS:.*\n)?\s+CURRENT:\s*(\S+)", text, re.MULTILINE):
        r.put("memory_partition", block)
    if "ACCELERATOR_PARTITION_PROFILES" in tables:
        header, rows = tables["ACCELERATOR_PARTITION_PROFILES"]
        for row in rows:
            fields = dict(zip(header, row))
            if fields.get("ACCELERATOR_TYPE", "").endswith("*"):
                r.put("compute_partition", fields["ACCELERATOR_TYPE"].rstrip("*"))
        cut |= bool(rows) and 0 < len(rows[-1]) < len(header) and rows[-1][0] != ""
    if cut:
        r.unread.append("A table row has fewer columns than its header (the paste is cut), so its later columns "
                        "could not be read.")
    if not tables:
        r.unread.append("No partition table with a GPU_ID header is in the paste, so no partition was read.")
    return r


# ---------------------------------------------------------------- a part of a rocminfo agent block

_AGENT_KEYS = ("Chip ID", "Device Type", "Compute Unit", "Marketing Name", "Cacheline Size", "BDFID",
               "Internal Node ID", "Queue Max Size", "Packet Processor uCode", "SIMDs per CU")


def is_rocminfo_fragment(text: str) -> bool:
    keys = {m for m in re.findall(r"^ {2}(" + "|".join(re.escape(k) for k in _AGENT_KEYS) + r"):", text, re.M)}
    return len(keys) >= 3


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


# ---------------------------------------------------------------- /sys/kernel/debug/dri/N/amdgpu_firmware_info

_FW_LINE = re.compile(r"^([A-Z][A-Z0-9_ ]*?) feature version: (\S+), firmware version: (0x[0-9a-fA-F]+)\s*$",
                      re.MULTILINE)


def is_amdgpu_firmware_info(text: str) -> bool:
    return len(_FW_LINE.findall(text)) >= 2


def read_amdgpu_firmware_info(text: str) -> Reading:
    r = Reading("amdgpu_firmware_info")
    blocks = _FW_LINE.findall(text)
    firmware = r.facts.setdefault("firmware", {})
    for name, _feature, version in blocks:
        if int(version, 16):
            firmware.setdefault(name.lower(), version)
    vbios = re.search(r"^VBIOS version:\s*(\S+)", text, re.MULTILINE)
    r.put("vbios_version", vbios.group(1) if vbios else None)
    loaded = sum(1 for *_, version in blocks if int(version, 16))
    r.put("firmware_blocks_loaded", loaded)
    last = text.rstrip("\n").splitlines()[-1] if text.strip() else ""
    if last and not (_FW_LINE.match(last) or last.startswith("VBIOS")):
        r.unread.append("The last line is cut, so its firmware block could not be read.")
    if not vbios:
        r.unread.append("The paste ends before the 'VBIOS version' line the file ends with, so firmware blocks "
                        "after the last line shown could not be read.")
    return r


# ---------------------------------------------------------------- update-alternatives --display rocm


def is_update_alternatives(text: str) -> bool:
    return bool(re.search(r"^rocm - (auto|manual) mode\s*$", text, re.MULTILINE)) \
        or bool(re.search(r"^\s+link currently points to /\S*rocm", text, re.MULTILINE))


def read_update_alternatives(text: str) -> Reading:
    r = Reading("update-alternatives --display rocm")
    mode = re.search(r"^rocm - (auto|manual) mode", text, re.MULTILINE)
    r.put("rocm_alternative_mode", mode.group(1) if mode else None)
    current = re.search(r"^\s+link currently points to (\S+)", text, re.MULTILINE)
    if current:
        r.put("rocm_path", current.group(1))
        version = re.search(r"rocm-(\d+\.\d+(?:\.\d+)?)", current.group(1))
        r.put("rocm_version", version.group(1) if version else None)
    for path in re.findall(r"^(/\S+) - priority \d+", text, re.MULTILINE):
        r.add("rocm_installs", path)
    if not current:
        r.unread.append("The 'link currently points to' line is not in the paste, so the ROCm in use could not be "
                        "read.")
    return r


DETECTORS: list[tuple[str, Callable[[str], bool], Callable[[str], Reading]]] = [
    ("amd-smi (default view)", is_amd_smi_default, read_amd_smi_default),
    ("amd-smi partition", is_amd_smi_partition, read_amd_smi_partition),
    ("amdgpu_firmware_info", is_amdgpu_firmware_info, read_amdgpu_firmware_info),
    ("update-alternatives --display rocm", is_update_alternatives, read_update_alternatives),
]
# Only when the rocminfo detector of `diagnose` does not fire (a whole block has its own reader).
FRAGMENTS: list[tuple[str, Callable[[str], bool], Callable[[str], Reading]]] = [
    ("rocminfo (part of an agent block)", is_rocminfo_fragment, read_rocminfo_fragment),
]
