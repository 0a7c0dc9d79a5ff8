"""amd-smi's table views, pasted: the default view (`amd-smi` with no subcommand, ROCm 7.x, with the versions on
separate header lines or on one, and the VBIOS version line), `amd-smi partition`
(`--current`, `--memory`, `--accelerator`; the ROCm 6.3/6.4 layout and the later one), `amd-smi process --csv` (raw
or through `column -t -s,`) and `--json`, and the `amd-smi xgmi` tables of ROCm 6.1-7.x (LINK METRIC TABLE with full
or short BDFs, XGMI LINK STATUS as a GPU-by-GPU matrix or U/D/X letters, GPU LINK PORT STATUS). The per-GPU views are
read by `env_checks.pasted.amd_smi`.
"""

from __future__ import annotations

import json
import re
import textwrap

from env_checks.pasted.reading import BDF, ELIDED, Reading, is_version, json_pairs
from env_checks.tool_text import json_start

SHORT_BDF = r"[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_PROMPT = re.compile(r"^\s*(\S*[$#]\s|sudo\s)", re.MULTILINE)


def _body(text: str) -> str:
    """The text without shell prompt lines, dedented (changelogs and docs indent pasted outputs)."""
    return textwrap.dedent("\n".join(line for line in text.splitlines() if not _PROMPT.match(line)))


# ---------------------------------------------------------------- amd-smi (no subcommand): the summary table

_DEFAULT_COLUMNS = re.compile(r"^\|\s*BDF\s+GPU-Name\s*\|", re.MULTILINE)


def is_amd_smi_default(text: str) -> bool:
    return bool(_DEFAULT_COLUMNS.search(text)) or bool(re.search(r"^\|\s*AMD-SMI\s+\S+\s*\|", text, re.MULTILINE))


def read_amd_smi_default(text: str) -> Reading:
    """`amd-smi` with no subcommand (ROCm 7.x): a version header, two table rows per GPU, then Processes."""
    r = Reading("amd-smi (default view)")
    header = {key.lower(): value for key, value in re.findall(
        r"^\|\s*(AMD-SMI|amdgpu Version:|ROCm Version:|VBIOS Version:|Platform:)\s+(.+?)\s*\|\s*$", text,
        re.MULTILINE | re.IGNORECASE)}
    # ROCm 7.1/7.2 put three fields on the first line: `| AMD-SMI 26.2.0+021c61fc  amdgpu version: 6.16.6  ROCm
    # version: 7.1.1 |`, then `| VBIOS version: ... |`
    one_line = re.match(r"(\S+)\s+amdgpu version:\s*(.*?)\s+ROCm version:\s*(\S+)$", header.get("amd-smi", ""))
    if one_line:
        header["amd-smi"], header["amdgpu version:"], header["rocm version:"] = one_line.groups()
    r.put("amd_smi_version", header.get("amd-smi"))
    amdgpu = header.get("amdgpu version:", "")
    if is_version(amdgpu):
        r.put("driver_version", amdgpu)
    elif amdgpu and amdgpu.upper() != "N/A":
        r.unread.append(f"The 'amdgpu version' field reads '{amdgpu}', not a version number (the tool printed the "
                        "start of the kernel's build string), so the driver version could not be read.")
    r.put("rocm_version", header.get("rocm version:"))
    r.put("vbios_version", header.get("vbios version:"))
    r.put("platform", header.get("platform:"))
    first = re.findall(rf"^\|\s*({BDF})\s+(.+?)\s*\|", text, re.MULTILINE)
    second = re.findall(r"^\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*\|.*?(?:(\d+)/(\d+) MB)?\s*\|\s*$", text, re.MULTILINE)
    for bdf, name in first:
        r.add("pci_bdfs", bdf)
        r.add("gpu_models", name)
    for _index, _hip, _oam, mode, _used, total in second:
        if "/" in mode and mode.upper() != "N/A":
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


# ---------------------------------------------------------------- amd-smi process --csv (and | column -t -s,)

_PROCESS_HEADER = re.compile(r"^gpu(,|\s+)name\1+pid\b.*$", re.MULTILINE)


def is_amd_smi_process_table(text: str) -> bool:
    return bool(_PROCESS_HEADER.search(_body(text)))


def read_amd_smi_process_table(text: str) -> Reading:
    r = Reading("amd-smi process (--csv)")
    body = _body(text)
    header_match = _PROCESS_HEADER.search(body)
    assert header_match is not None
    comma = header_match.group(1) == ","
    split = (lambda line: [c.strip() for c in line.split(",")]) if comma else (lambda line: line.split())
    header = split(header_match.group(0))
    rows, short = [], 0
    for line in body[header_match.end():].splitlines():
        if not line.strip():
            continue
        cells = split(line)
        if not cells[0].isdigit():
            break
        if len(cells) < len(header):
            short += 1
        rows.append(dict(zip(header, cells)))
    gpus = []
    for row in rows:
        if row.get("gpu") not in gpus:
            gpus.append(row["gpu"])
        if row.get("pid", "").isdigit():
            r.add("process_ids", row["pid"])
        r.add("process_names", row.get("name"))
        vram = row.get("vram_mem", "")
        if vram.isdigit():
            per_gpu = r.facts.setdefault("process_vram_bytes", {})
            per_gpu[row["gpu"]] = per_gpu.get(row["gpu"], 0) + int(vram)
    r.put("gpus_with_processes", len(gpus))
    if short:
        r.unread.append(f"{short} process row(s) have fewer columns than the header (the paste is cut), so their "
                        "later columns could not be read.")
    if not rows:
        r.unread.append("The process table has a header but no rows, so no process could be read.")
    return r


# ---------------------------------------------------------------- amd-smi process --json

def is_amd_smi_process_json(text: str) -> bool:
    return json_start(text) >= 0 and '"process_list"' in text


def read_amd_smi_process_json(text: str) -> Reading:
    r = Reading("amd-smi process (--json)")
    pairs = json_pairs(text)
    for key, value in pairs:
        if key == "pid" and str(value).isdigit():
            r.add("process_ids", str(value))
        elif key == "name" and value:
            r.add("process_names", value)
        elif key == "gpu" and str(value).isdigit():
            r.add("gpus_with_process_list", str(value))
    try:
        json.loads(text[json_start(text):])
    except json.JSONDecodeError as exc:
        r.unread.append(f"The JSON breaks off or is damaged at character {exc.pos} ({exc.msg}); processes were read "
                        "from the complete key/value pairs before that point.")
    return r


# ---------------------------------------------------------------- amd-smi xgmi (ROCm 6.1 - 7.x layouts)

_XGMI_TITLE = re.compile(r"^(LINK METRIC TABLE|XGMI LINK STATUS|GPU LINK PORT STATUS):\s*$", re.MULTILINE)


def is_amd_smi_xgmi(text: str) -> bool:
    return bool(_XGMI_TITLE.search(_body(text)))


def read_amd_smi_xgmi(text: str) -> Reading:
    r = Reading("amd-smi xgmi")
    body = _body(text)
    rows = re.findall(rf"^GPU(\d+)\s+({BDF}|{SHORT_BDF})\s*(.*)$", body, re.MULTILINE)
    titles = _XGMI_TITLE.findall(body)
    gpus: list[str] = []
    link_states: dict[str, int] = {}
    for index, bdf, rest in rows:
        if index not in gpus:
            gpus.append(index)
        r.add("pci_bdfs", bdf)
        metric = re.match(r"^(\S+ Gb/s|N/A)\s*(\S+ Gb/s|N/A)\s*(\S+)\s*$", rest)
        if metric and "LINK METRIC TABLE" in titles:
            rate, bandwidth, link = metric.groups()
            if link != "N/A":
                r.put("gpu_links", link)
                r.put("xgmi_bit_rate", rate)
                r.put("xgmi_max_bandwidth", bandwidth)
            continue
        for cell in rest.split():
            if cell in ("U", "D", "X", "N/A", "SELF") or cell.lower() in ("up", "down", "disabled"):
                link_states[cell] = link_states.get(cell, 0) + 1
    elided = bool(ELIDED.search(body)) or "[output truncated]" in body
    r.count(len(gpus), False if elided else None)
    if link_states:
        r.put("xgmi_link_states", link_states)
    if link_states and set(link_states) <= {"N/A", "SELF"}:
        r.unread.append("Every XGMI link is reported as N/A (the driver does not expose link status here, e.g. under "
                        "mVF), so whether the links are up could not be read.")
    if "LINK METRIC TABLE" in titles and "gpu_links" not in r.facts and rows:
        r.unread.append("The link metric table gives N/A as every link's type, bit rate and bandwidth (no XGMI links "
                        "reported), so no XGMI link was read.")
    if elided:
        r.unread.append("The xgmi output is cut ('...' or '[output truncated]'), so GPUs after the last row shown "
                        "could not be read.")
    if not rows:
        r.unread.append("The xgmi table has its title but no GPU rows, so no link could be read.")
    return r
