"""nvidia-smi, pasted: the table (`nvidia-smi`), `-q`, `-q -x` and `--query-gpu ... --format=csv`.

Facts: driver and CUDA versions, GPU models, VBIOS version, virtualization and MIG modes, ECC mode and uncorrectable
counts, compute capability, VRAM, the GPU count (a lower bound where the paste is cut).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from env_checks.pasted.reading import Reading
from env_checks.tool_text import colon_pairs


def is_nvidia_xml(text: str) -> bool:
    return "<nvidia_smi_log" in text


def is_nvidia_q(text: str) -> bool:
    return "NVSMI LOG" in text or bool(re.search(r"^Attached GPUs\s+:", text, re.M))


def is_nvidia_table(text: str) -> bool:
    return bool(re.search(r"NVIDIA-SMI \S+\s+(Driver|KMD) Version", text)) \
        or bool(re.search(r"^\|\s+\d+\s+NVIDIA .+\|", text, re.M))


def is_nvidia_csv(text: str) -> bool:
    return bool(re.search(r"^\s*(name|index|driver_version|pci\.bus_id)\s*,", text, re.M))


def read_nvidia_table(text: str) -> Reading:
    r = Reading("nvidia-smi")
    head = re.search(r"NVIDIA-SMI\s+(\S+)\s+(?:Driver|KMD) Version:\s*(\S+)\s+(?:CUDA(?: UMD)? Version:\s*(\S+))?",
                     text)
    if head:
        r.put("driver_version", head.group(2))
        r.put("cuda_version", head.group(3))
    rows = re.findall(r"^\|\s+(\d+)\s+(.+?)\s{2,}(On|Off)\s+\|\s+(\S+)\s", text, re.MULTILINE)
    for _index, name, _persistence, _bus in rows:
        r.add("gpu_models", name)
    totals = re.findall(r"\d+MiB\s*/\s*(\d+)MiB", text)
    if totals:
        r.put("vram_total_mib", int(totals[0]))
    complete = bool(re.search(r"Processes:|No running processes found", text))
    r.count(len({index for index, *_ in rows}), complete)
    if rows and not complete:
        r.unread.append("The nvidia-smi table is cut before its 'Processes' section, so GPUs after the last row "
                        "shown may be missing.")
    if not head:
        r.unread.append("The nvidia-smi header line is missing, so the driver and CUDA versions could not be read.")
    return r


def read_nvidia_q(text: str) -> Reading:
    r = Reading("nvidia-smi -q")
    pairs = colon_pairs(text)
    top = {k: v for indent, k, v in pairs if indent == 0}
    r.put("driver_version", top.get("driver version"))
    r.put("cuda_version", top.get("cuda version"))
    attached = top.get("attached gpus", "")
    gpus = re.findall(r"^GPU [0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*$", text, re.MULTILINE)
    parents: dict[int, str] = {}
    for indent, key, value in pairs:
        parent = parents.get(indent - 4, "")
        if not value:
            parents[indent] = key
        if key == "product name":
            r.add("gpu_models", value)
        elif key == "vbios version":
            r.put("vbios_version", value)
        elif key == "virtualization mode":
            r.put("virtualization", value)
        elif parent == "mig mode" and key == "current":
            r.put("mig_mode", value)
        elif parent == "ecc mode" and key == "current":
            r.put("ecc_mode", value)
        elif key in ("dram uncorrectable", "double bit ecc", "uncorrectable error") and value.isdigit():
            ecc = r.facts.setdefault("ecc", {})
            name = f"{parent.replace(' ', '_')}.{key.replace(' ', '_')}" if parent else key.replace(" ", "_")
            ecc[name] = ecc.get(name, 0) + int(value)
    if attached.isdigit():
        r.put("gpu_count", int(attached))
        if len(gpus) < int(attached):
            r.unread.append(f"The report states {attached} GPUs but shows {len(gpus)} GPU section(s): the rest "
                            "was cut off.")
    else:
        r.count(len(gpus), False)
        r.unread.append("The 'Attached GPUs' line is missing, so the GPU count is only what the paste shows.")
    return r


def read_nvidia_xml(text: str) -> Reading:
    r = Reading("nvidia-smi -q -x")
    start = text.find("<nvidia_smi_log")
    try:
        root = ET.fromstring(text[text.find("<?xml"):] if "<?xml" in text else text[start:])
    except ET.ParseError as exc:
        r.unread.append(f"The XML is cut or damaged ({exc}); facts were read from the complete elements before "
                        "that point.")
        root = None
    if root is not None:
        r.put("driver_version", root.findtext("driver_version"))
        r.put("cuda_version", root.findtext("cuda_version"))
        gpus = root.findall("gpu")
        for gpu in gpus:
            r.add("gpu_models", gpu.findtext("product_name"))
            r.put("vbios_version", gpu.findtext("vbios_version"))
            r.put("virtualization", gpu.findtext("gpu_virtualization_mode/virtualization_mode"))
            r.put("mig_mode", gpu.findtext("mig_mode/current_mig"))
        attached = root.findtext("attached_gpus")
        r.count(int(attached) if attached and attached.isdigit() else len(gpus), True)
        return r
    for tag in ("driver_version", "cuda_version"):
        found = re.search(rf"<{tag}>([^<]+)</{tag}>", text)
        r.put(tag, found.group(1) if found else None)
    for name in re.findall(r"<product_name>([^<]+)</product_name>", text):
        r.add("gpu_models", name)
    attached = re.search(r"<attached_gpus>(\d+)</attached_gpus>", text)
    if attached:
        r.put("gpu_count", int(attached.group(1)))
    return r


def read_nvidia_csv(text: str) -> Reading:
    r = Reading("nvidia-smi --query-gpu")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("$")]
    header = [re.sub(r"\s*\[.*?\]", "", h).strip().lower() for h in lines[0].split(",")] if lines else []
    if "name" not in header and "driver_version" not in header:
        r.unread.append("The CSV has no header line (--format=csv,noheader), so its columns could not be named.")
        return r
    rows = [[c.strip() for c in line.split(",")] for line in lines[1:]]
    whole = [row for row in rows if len(row) == len(header)]
    for row in whole:
        fields = dict(zip(header, row))
        r.add("gpu_models", fields.get("name"))
        r.put("driver_version", fields.get("driver_version"))
        r.put("vbios_version", fields.get("vbios_version"))
        r.put("mig_mode", fields.get("mig.mode.current"))
        r.put("compute_capability", fields.get("compute_cap"))
        total = re.match(r"^(\d+)", fields.get("memory.total", ""))
        if total:
            r.put("vram_total_mib", int(total.group(1)))
    r.count(len(whole), None if len(whole) == len(rows) else False)
    if not rows:
        r.unread.append("The CSV has a header but no data rows.")
    if len(whole) < len(rows):
        r.unread.append(f"{len(rows) - len(whole)} CSV row(s) have fewer fields than the header and were not read.")
    return r
