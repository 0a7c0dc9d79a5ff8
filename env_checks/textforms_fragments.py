"""Tolerant readers for the last pasted forms of issue 39: `amd-smi process --csv` (raw or through `column -t`),
`amd-smi process --json`, `amd-smi static --json | jq ...` fragments (a sub-object or list of amd-smi's JSON without
its `gpu` index), KFD topology `mem_banks/N/properties`, and the `amd-smi xgmi` tables of ROCm 6.x-7.x (LINK METRIC
TABLE with full or short BDFs, XGMI LINK STATUS as a GPU-by-GPU matrix or U/D/X letters, GPU LINK PORT STATUS).

Same contract as `textforms`: a `Reading` of facts the text states and one sentence per thing that could not be read.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from typing import Any

from env_checks.textforms import ELIDED, Reading, json_pairs, json_start, normalise_gfx

BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
SHORT_BDF = r"[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_PROMPT = re.compile(r"^\s*(\S*[$#]\s|sudo\s)", re.MULTILINE)


def _body(text: str) -> str:
    """The text without shell prompt lines, dedented (changelogs and docs indent pasted outputs)."""
    return textwrap.dedent("\n".join(line for line in text.splitlines() if not _PROMPT.match(line)))


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


# ---------------------------------------------------------------- amd-smi ... --json | jq <filter>: a fragment

# amd-smi static/metric JSON sections by the keys only they have (amdsmi's JSON is the structure mapped to)
_SECTIONS: dict[str, set[str]] = {
    "vram": {"type", "vendor", "size"},
    "asic": {"market_name", "vendor_id", "device_id"},
    "driver": {"name", "version"},
    "vbios": {"part_number", "build_date"},
    "board": {"product_name", "manufacturer_name"},
    "bus": {"bdf", "max_pcie_width"},
    "partition": {"compute_partition", "memory_partition"},
    "limit": {"max_power", "socket_power"},
}


def _fragment(text: str) -> Any:
    start = json_start(text)
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError:
        return None


def _section(node: Any) -> str | None:
    if not isinstance(node, dict):
        return None
    keys = {k.lower() for k in node}
    best = [name for name, need in _SECTIONS.items() if need <= keys]
    return best[0] if best else None


def is_amd_smi_json_fragment(text: str) -> bool:
    start = json_start(text)
    if start < 0 or '"gpu"' in text or "process_list" in text or re.search(r'"card\d+"', text):
        return False
    data = _fragment(text)
    if data is not None:
        nodes = data if isinstance(data, list) else [data]
        return any(_section(n) for n in nodes) or any(isinstance(n, dict) and any(_section(v) for v in n.values())
                                                      for n in nodes)
    keys = {k.lower() for k in re.findall(r'"([^"\n]+)"\s*:', text)}
    return any(need <= keys for need in _SECTIONS.values())


def _leaf(node: Any) -> str | None:
    if isinstance(node, dict):
        node = node.get("value")
    return None if node is None or isinstance(node, (dict, list)) else str(node)


def read_amd_smi_json_fragment(text: str) -> Reading:
    """A jq selection of amd-smi's JSON: `.[0]["vram"]`, `.[].asic`, `map(.driver)` ..."""
    r = Reading("amd-smi JSON fragment (jq)")
    data = _fragment(text)
    expanded: list[tuple[str | None, Any]] = []
    if data is None:
        r.unread.append("The JSON fragment is cut or damaged, so only its complete key/value pairs were read.")
        keys = {k.lower() for k in re.findall(r'"([^"\n]+)"\s*:', text)}
        name = next((n for n, need in _SECTIONS.items() if need <= keys), None)
        expanded.append((name, dict(json_pairs(text))))
        data = []
    nodes = data if isinstance(data, list) else [data]
    for node in nodes:
        if isinstance(node, dict) and not _section(node):
            expanded += [(k.lower(), v) for k, v in node.items() if _section(v)]
        else:
            expanded.append((_section(node), node))
    for name, node in expanded:
        if not isinstance(node, dict):
            continue
        node = {k.lower(): v for k, v in node.items()}
        if name == "vram":
            r.put("vram_type", _leaf(node.get("type")))
            size, unit = node.get("size"), None
            if isinstance(size, dict):
                unit = str(size.get("unit", ""))
            value = _leaf(size)
            if value and value.isdigit() and unit == "MB":
                r.put("vram_total_mib", int(value))
        elif name == "asic":
            r.add("gpu_models", _leaf(node.get("market_name")))
            r.add("device_ids", _leaf(node.get("device_id")))
            r.add("gfx_targets", normalise_gfx(_leaf(node.get("target_graphics_version"))))
        elif name == "driver":
            r.put("driver_version", _leaf(node.get("version")))
        elif name == "vbios":
            r.put("vbios_version", _leaf(node.get("version")))
        elif name == "bus":
            bdf = _leaf(node.get("bdf"))
            if bdf and re.fullmatch(BDF, bdf):
                r.add("pci_bdfs", bdf)
        elif name == "partition":
            r.put("compute_partition", _leaf(node.get("compute_partition")))
            r.put("memory_partition", _leaf(node.get("memory_partition")))
        r.add("json_sections", name)
    r.unread.append("This is a fragment of amd-smi's JSON (a jq selection) without its 'gpu' index: the facts are "
                    "those of the keys shown, and which GPU they belong to is not stated.")
    return r


# ---------------------------------------------------------------- KFD topology nodes/N/mem_banks/M/properties

_MEM_KEYS = ("heap_type", "size_in_bytes", "flags", "width", "mem_clk_max")
# HSA_HEAPTYPE (hsakmttypes.h): what each heap_type number names
HEAP_TYPES = {"0": "system", "1": "frame buffer, public", "2": "frame buffer, private", "3": "GPU GDS",
              "4": "GPU LDS", "5": "GPU scratch", "6": "device SVM", "7": "MMIO remap"}


def is_kfd_mem_banks(text: str) -> bool:
    keys = set(re.findall(r"^[ \t]*(" + "|".join(_MEM_KEYS) + r") \d+[ \t]*$", text, re.MULTILINE))
    named = bool(re.search(r"/mem_banks/\d+/properties", text))
    return (len(keys) >= 2 or (named and len(keys) == 1)) and ("heap_type" in keys or "size_in_bytes" in keys)


def read_kfd_mem_banks(text: str) -> Reading:
    r = Reading("KFD topology mem_banks properties")
    if text and not text.endswith("\n") and re.search(r"\n[ \t]*[a-z_]+ \d+$", text):
        text = text[: text.rfind("\n") + 1]  # a last line without its line end may be a number cut short
        r.unread.append("The paste ends without a line end, so its last line (whose number may be cut short) was "
                        "not read.")
    # indented lines too: people quote the file under its path, as in a PR description
    values = {k: v for k, v in re.findall(r"^[ \t]*(" + "|".join(_MEM_KEYS) + r") (\d+)[ \t]*$", text,
                                          re.MULTILINE)}
    path = re.search(r"topology/nodes/(\d+)/mem_banks/(\d+)/properties", text)
    bank = {k: values[k] for k in _MEM_KEYS if k in values}
    if path:
        bank = {"node": path.group(1), "bank": path.group(2), **bank}
    r.put("kfd_mem_bank", bank)
    heap = values.get("heap_type")
    if heap is not None:
        r.put("kfd_heap_type", HEAP_TYPES.get(heap, f"unknown ({heap})"))
    if heap in ("1", "2") and values.get("size_in_bytes"):
        r.put("vram_bytes", int(values["size_in_bytes"]))
    missing = [k for k in ("heap_type", "size_in_bytes") if k not in values]
    if missing:
        r.unread.append(f"The properties lack {' and '.join(missing)} (the paste is cut or shows only some lines), so "
                        "the bank's kind or size could not be read.")
    elif heap not in ("1", "2"):
        r.unread.append("This bank is not a frame-buffer heap (heap_type 1 or 2), so its size is not the GPU's VRAM.")
    if not path:
        r.unread.append("The paste does not name the file it came from, so which KFD node (GPU) this bank belongs "
                        "to is unknown.")
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


DETECTORS: list[tuple[str, Callable[[str], bool], Callable[[str], Reading]]] = [
    ("amd-smi process (--csv)", is_amd_smi_process_table, read_amd_smi_process_table),
    ("amd-smi process (--json)", is_amd_smi_process_json, read_amd_smi_process_json),
    ("amd-smi JSON fragment (jq)", is_amd_smi_json_fragment, read_amd_smi_json_fragment),
    ("KFD topology mem_banks properties", is_kfd_mem_banks, read_kfd_mem_banks),
    ("amd-smi xgmi", is_amd_smi_xgmi, read_amd_smi_xgmi),
]
# The base amd-smi reader is not run on a text one of these reads (it would count processes or link rows as GPUs).
SUPERSEDE_AMD_SMI = (is_amd_smi_process_table, is_amd_smi_process_json, is_amd_smi_xgmi)
