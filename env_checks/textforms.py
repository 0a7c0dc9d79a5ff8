"""Tolerant readers for the text users paste: what each tool's output states, as plain facts.

Unlike the probes' parsers (which refuse anything incomplete, so a fingerprint never holds a guess), these
readers take whatever can be read from a truncated, wrapped or partial paste and say, in one sentence each,
what could not be read. A fact is only ever a value the text states; nothing is inferred from a device id.

A `Reading` is (kind, facts, unread). Facts use one vocabulary across tools: gpu_models, gpu_count (or
gpu_count_at_least when the paste elides devices), gfx_targets (normalised: `gfx942:sramecc+:xnack-` -> gfx942),
driver_version, rocm_version, hip_version, cuda_version, torch_version, vllm_version, kernel_release,
compute_partition, memory_partition, virtualization, firmware, ecc, vram_total_mib, device_ids.
The AMD tools live here; NVIDIA and the rest in `textforms_more`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_GFX = re.compile(r"\bgfx([0-9]{2,4}[0-9a-f]?)\b", re.IGNORECASE)
_VERSION = re.compile(r"^\d+(\.\d+)+([-+.~][\w.+~-]*)?$")
ELIDED = re.compile(r"^\s*(\.\.\.|…)\s*$", re.MULTILINE)


@dataclass
class Reading:
    kind: str
    facts: dict[str, Any] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)

    def put(self, key: str, value: Any) -> None:
        """Record a fact once (the first statement wins); empty and N/A values are not facts."""
        if value is None or value == [] or value == {} or key in self.facts:
            return
        if isinstance(value, str):
            value = value.strip()
            if not value or value.upper() in {"N/A", "NA", "NONE", "UNKNOWN", "COULD NOT COLLECT"}:
                return
        self.facts[key] = value

    def add(self, key: str, value: str | None) -> None:
        """Add a value to a list fact, keeping the order of first appearance and no duplicates."""
        if value is None:
            return
        value = value.strip()
        if not value or value.upper() in {"N/A", "NA", "NONE", "UNKNOWN"}:
            return
        values = self.facts.setdefault(key, [])
        if value not in values:
            values.append(value)

    def count(self, n: int, complete: bool | None) -> None:
        """The number of GPUs the text lists: exact when the text is known whole, a lower bound when it is known
        cut, and `gpus_listed` when the form has no end marker to tell (amd-smi text, CSV)."""
        if n > 0:
            key = {True: "gpu_count", False: "gpu_count_at_least", None: "gpus_listed"}[complete]
            self.put(key, n)


def normalise_gfx(name: str | None) -> str | None:
    """'gfx942:sramecc+:xnack-' / 'amdgcn-amd-amdhsa--gfx90a:xnack+' / 'GFX942' -> 'gfx942'; None if no gfx name."""
    if not name:
        return None
    found = _GFX.search(name)
    return f"gfx{found.group(1).lower()}" if found else None


def is_version(text: str | None) -> bool:
    return bool(text) and bool(_VERSION.match(text.strip()))


def json_start(text: str) -> int:
    """Where a JSON document starts, if the first non-blank, non-warning line opens one; else -1."""
    for match in re.finditer(r"^[ \t]*(\S)", text, re.MULTILINE):
        if match.group(1) in "[{":
            return match.start(1)
        line = text[match.start(1):text.find("\n", match.start(1)) if "\n" in text[match.start(1):] else None]
        if not re.match(r"(WARNING|INFO|NOTE|\$|~\$|#|\S*[$#] |sudo |amd-smi|rocm-smi)", line):
            return -1
    return -1


def load_json(text: str, reading: Reading) -> Any:
    """The JSON document in `text`, or None with a sentence saying where it breaks."""
    start = json_start(text)
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError as exc:
        reading.unread.append(f"The JSON breaks off or is damaged at character {exc.pos} ({exc.msg}); "
                              "facts were read from the complete key/value pairs before that point.")
        return None


def json_pairs(text: str) -> list[tuple[str, str]]:
    """`"key": "value"` / `"key": 123` pairs anywhere in (possibly broken) JSON, in order."""
    return [(k.lower(), n if n else v) for k, v, n in
            re.findall(r'"([^"\n]+)"\s*:\s*(?:"([^"\n]*)"|(-?\d+(?:\.\d+)?))', text)]


def colon_pairs(text: str) -> list[tuple[int, str, str]]:
    """(indent, lower-case key, value) of every `key: value` line (also `key : value` and `key:: value`)."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^(\s*)([^:\n]{1,80}?)\s*::?\s(.*)$|^(\s*)([^:\n]{1,80}?)\s*:$", line)
        if match:
            if match.group(2) is not None:
                out.append((len(match.group(1)), match.group(2).strip().lower(), match.group(3).strip()))
            else:
                out.append((len(match.group(4)), match.group(5).strip().lower(), ""))
    return out


def first_values(text: str) -> dict[str, str]:
    """Each lower-case key's first value among the `key: value` lines (colon_pairs), at any indent."""
    fields: dict[str, str] = {}
    for _indent, key, value in colon_pairs(text):
        fields.setdefault(key, value)
    return fields


# ---------------------------------------------------------------- rocminfo


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
    return r


# ---------------------------------------------------------------- amd-smi


def _amd_smi_gpu(r: Reading, gpu: dict[str, Any]) -> None:
    def leaf(*path: str) -> str | None:
        node: Any = gpu
        for key in path:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        if isinstance(node, dict):
            node = node.get("value")
        return None if node is None or isinstance(node, (dict, list)) else str(node)

    r.add("gpu_models", leaf("asic", "market_name") or leaf("board", "product_name"))
    r.add("gfx_targets", normalise_gfx(leaf("asic", "target_graphics_version")))
    r.add("device_ids", leaf("asic", "device_id"))
    r.put("driver_version", leaf("driver", "version") or leaf("driver", "driver_version"))
    r.put("kernel_release", leaf("driver", "os_kernel_version"))
    r.put("vbios_version", leaf("vbios", "version") or leaf("ifwi", "version"))
    r.put("compute_partition", leaf("partition", "compute_partition") or leaf("partition", "accelerator_partition")
          or leaf("current_compute_partition"))
    r.put("memory_partition", leaf("partition", "memory_partition") or leaf("current_memory_partition"))
    mode = leaf("virtualization_mode") or leaf("vf_mode")
    if mode:
        r.put("virtualization", mode)
    size = leaf("vram", "size")
    if size and re.match(r"^\d+", size):
        r.put("vram_total_mib", int(re.match(r"^\d+", size).group(0)))
    ecc = gpu.get("ecc") if isinstance(gpu.get("ecc"), dict) else {}
    for key in ("total_correctable_count", "total_uncorrectable_count", "total_deferred_count",
                "cache_correctable_count", "cache_uncorrectable_count"):
        value = leaf("ecc", key) if ecc else None
        if value is not None and value.isdigit():
            totals = r.facts.setdefault("ecc", {})
            totals[key] = totals.get(key, 0) + int(value)
    blocks = gpu.get("ecc_blocks") if isinstance(gpu.get("ecc_blocks"), dict) else {}
    for counts in blocks.values():
        if isinstance(counts, dict):
            for key in ("correctable_count", "uncorrectable_count", "deferred_count"):
                value = counts.get(key)
                if value is not None and str(value).isdigit():
                    totals = r.facts.setdefault("ecc", {})
                    totals["blocks_" + key] = totals.get("blocks_" + key, 0) + int(value)
    for fw in gpu.get("fw_list", []) if isinstance(gpu.get("fw_list"), list) else []:
        if isinstance(fw, dict) and str(fw.get("fw_id", fw.get("fw_name", ""))).upper() in {"CP_MEC1", "MEC"}:
            r.facts.setdefault("firmware", {}).setdefault("mec", str(fw.get("fw_version")))
    firmware = gpu.get("fw_list") if isinstance(gpu.get("fw_list"), dict) else gpu.get("firmware")
    if isinstance(firmware, dict):
        for block in firmware.values():
            if isinstance(block, dict) and str(block.get("fw_id", "")).upper() == "CP_MEC1":
                r.facts.setdefault("firmware", {}).setdefault("mec", str(block.get("fw_version")))


def smi_top_indent(indent: int, key: str, value: str, top: int | None) -> int | None:
    """The indent of amd-smi's top-level `GPU: n` lines: 0 as the tool prints them, more where a paste indents the
    whole output (a markdown list item, a quoted block). The first `GPU: n` line sets it; a later one at a smaller
    indent lowers it."""
    if key == "gpu" and value.strip().isdigit() and (top is None or indent < top):
        return indent
    return top


def count_page_record(parent: dict[str, Any], key: str) -> None:
    """amd-smi's text prints a list of bad-page records as a YAML list with the dashes dropped, so each record is a
    repeated PAGE_ADDRESS line under RETIRED/PENDING/UN_RES: count them (the tree keeps one value per key)."""
    if key == "page_address":
        parent["page_records"] = parent.get("page_records", 0) + 1


def bad_page_count(value: Any) -> int | None:
    """Pages `amd-smi bad-pages` lists under RETIRED / PENDING / UN_RES: a list of page records (JSON), one record
    (the tool drops the brackets of a one-page list; in text, one per PAGE_ADDRESS line), or 'No bad pages found.';
    None for N/A (the query failed) or anything else."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict) and "page_address" in value:
        return int(value.get("page_records", 1))
    if isinstance(value, str) and "no bad pages" in value.lower():
        return 0
    return None


def smi_text_tree(text: str, first_wins: bool = True) -> list[dict[str, Any]]:
    """amd-smi's indented `KEY: value` text as per-GPU dicts with lower-case keys ("GPU: n" opens a block, n kept as
    an int; other top-level blocks such as "CPU: n" are skipped). Tolerant: a cut-off block keeps what it has. A key
    repeated within a node keeps its first value, or its last where `first_wins` is False."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    top: int | None = None
    for indent, key, value in colon_pairs(text):
        key = re.sub(r"[\s-]+", "_", key)
        top = smi_top_indent(indent, key, value, top)
        if indent <= (top or 0):
            stack = [(indent, {"gpu": int(value)})] if key == "gpu" and value.strip().isdigit() else []
            gpus.extend(node for _, node in stack)
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        count_page_record(parent, key)
        if not value:
            parent[key] = {}
            stack.append((indent, parent[key]))
        elif first_wins:
            parent.setdefault(key, value)
        else:
            parent[key] = value
    return gpus


def read_amd_smi(text: str) -> Reading:
    """amd-smi static/metric/list/firmware/bad-pages/process (text or JSON), version, monitor, topology, xgmi."""
    r = Reading("amd-smi")
    version = re.search(r"AMDSMI Tool:\s*(\S+)\s*\|\s*AMDSMI Library version:\s*(\S+)\s*\|\s*ROCm version:\s*(\S+)"
                        r"(?:\s*\|\s*amdgpu version:\s*([^|\n]+))?", text)
    if version:
        r.put("amd_smi_version", version.group(1))
        r.put("rocm_version", version.group(3))
        amdgpu = (version.group(4) or "").strip()
        if is_version(amdgpu):
            r.put("driver_version", amdgpu)
        elif amdgpu and amdgpu.upper() != "N/A":
            r.unread.append("The 'amdgpu version' field is not a version number (the tool printed the kernel's "
                            "build string), so the driver version could not be read.")
    data = load_json(text, r)
    complete = not ELIDED.search(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    if isinstance(data, list) and data and all(isinstance(g, dict) for g in data):
        gpus = [{k.lower(): v for k, v in g.items()} for g in data if "gpu" in g]
        for gpu in gpus:
            _amd_smi_gpu(r, gpu)
        _bad_pages(r, gpus)
        r.count(len(gpus), complete)
    elif json_start(text) >= 0 and data is None:
        pairs = json_pairs(text)
        gpus = [v for k, v in pairs if k == "gpu"]
        for key, value in pairs:
            if key == "market_name":
                r.add("gpu_models", value)
            elif key == "target_graphics_version":
                r.add("gfx_targets", normalise_gfx(value))
            elif key in ("compute_partition", "accelerator_partition"):
                r.put("compute_partition", value)
            elif key == "memory_partition":
                r.put("memory_partition", value)
        r.count(len(gpus), False)
    else:
        gpus = smi_text_tree(text)
        for gpu in gpus:
            _amd_smi_gpu(r, gpu)
        _bad_pages(r, gpus)
        # amd-smi's text has no end marker: a paste cut at a block boundary looks whole
        r.count(len(gpus), None if complete else False)
        if not gpus:
            _amd_smi_tables(text, r, complete)
    if not complete:
        r.unread.append("The output elides devices ('...'), so only a lower bound of the GPU count is known.")
    return r


def _bad_pages(r: Reading, gpus: list[dict[str, Any]]) -> None:
    """`amd-smi bad-pages`: the pages retired, pending retirement and unreservable, summed over the GPU blocks. A
    count is a fact only where every block states it (N/A, a failed query, leaves that count unknown)."""
    if not any(key in gpu for gpu in gpus for key in ("retired", "pending", "un_res")):
        return
    for key, fact in (("retired", "bad_pages_retired"), ("pending", "bad_pages_pending"),
                      ("un_res", "bad_pages_unreservable")):
        counts = [bad_page_count(gpu.get(key)) for gpu in gpus]
        if all(count is not None for count in counts):
            r.put(fact, sum(c for c in counts if c is not None))


def _amd_smi_tables(text: str, r: Reading, complete: bool) -> None:
    """monitor (a GPU-per-row table), topology/xgmi (BDF-per-row matrices)."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if re.match(r"^\s*GPU\s+[A-Z_]{3,}", line)), None)
    if header is not None:
        rows = [line for line in lines[header + 1:] if re.match(r"^\s*\d+\s+\S", line)]
        columns = lines[header].split()
        r.put("monitor_columns", columns)
        r.count(len({row.split()[0] for row in rows}), None if complete else False)
        if "VRAM_TOTAL" in columns and rows:
            total = re.findall(r"(\d+)\s*MB\s*$", rows[0])
            if total:
                r.put("vram_total_mib", int(total[0]))
        return
    bdfs = {m for m in re.findall(r"^\s*(?:GPU\d+\s+)?([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f])\s",
                                  text, re.MULTILINE | re.IGNORECASE)}
    if bdfs:
        r.count(len(bdfs), None if complete else False)
        if re.search(r"\bXGMI\b", text):
            r.put("gpu_links", "XGMI")


# ---------------------------------------------------------------- rocm-smi


def read_rocm_smi(text: str) -> Reading:
    """rocm-smi concise table, `GPU[n] : key: value` sections, --csv, or --json."""
    r = Reading("rocm-smi")
    data = load_json(text, r)
    if isinstance(data, dict):
        cards = {k: v for k, v in data.items() if k.lower().startswith("card") and isinstance(v, dict)}
        for card in cards.values():
            fields = {k.lower().strip(): str(v) for k, v in card.items()}
            r.add("gpu_models", fields.get("card series") or fields.get("device name") or fields.get("card model"))
            r.add("gfx_targets", normalise_gfx(fields.get("gfx version")))
            r.add("device_ids", fields.get("device id"))
            if fields.get("mec firmware version"):
                r.facts.setdefault("firmware", {}).setdefault("mec", fields["mec firmware version"])
        system = data.get("system") if isinstance(data.get("system"), dict) else {}
        r.put("driver_version", system.get("Driver version"))
        r.count(len(cards), True)
        return r
    if json_start(text) >= 0:
        cards = {m for m in re.findall(r'"(card\d+)"\s*:', text)}
        for key, value in json_pairs(text):
            if key in ("card series", "device name"):
                r.add("gpu_models", value)
            elif key == "gfx version":
                r.add("gfx_targets", normalise_gfx(value))
        r.count(len(cards), False)
        return r
    driver = re.search(r"Driver version:\s*(\S+)", text)
    r.put("driver_version", driver.group(1) if driver else None)
    indices: set[str] = set()
    for index, key, value in re.findall(r"^GPU\[(\d+)\]\s*:\s*([^:\n]+?):\s*(.*?)\s*$", text, re.MULTILINE):
        indices.add(index)
        key = key.strip().lower()
        if key in ("card series", "device name", "card model") and not value.startswith("0x"):
            r.add("gpu_models", value)
        elif key == "card sku":
            r.put("card_sku", value)
        elif key == "gfx version":
            r.add("gfx_targets", normalise_gfx(value))
        elif key == "device id":
            r.add("device_ids", value)
        elif key == "mec firmware version":
            r.facts.setdefault("firmware", {}).setdefault("mec", value)
        elif key in ("compute partition", "current compute partition"):
            r.put("compute_partition", value)
        elif key in ("memory partition", "current memory partition"):
            r.put("memory_partition", value)
    concise = _rocm_smi_concise(text, r)
    _rocm_smi_csv(text, r)
    ended = "End of ROCm SMI Log" in text
    if indices or concise:
        r.count(len(indices) or concise, ended)
    if not ended and ("ROCm System Management Interface" in text or indices):
        r.unread.append("The rocm-smi output has no 'End of ROCm SMI Log' line, so devices after the last "
                        "line shown may be missing.")
    return r


def _rocm_smi_concise(text: str, r: Reading) -> int:
    """The concise table's rows (one per visible device or partition); returns how many."""
    rows = re.findall(r"^(\d+)\s+.*?(NPS\d+)\s*,\s*(SPX|DPX|TPX|QPX|CPX)\b", text, re.MULTILINE)
    for _index, memory, compute in rows:
        r.put("memory_partition", memory)
        r.put("compute_partition", compute)
    for name in re.findall(r"^\s{6,}(AMD Instinct [^\n]*?|AMD Radeon [^\n]*?)\s*$", text, re.MULTILINE):
        r.add("gpu_models", name)
    if rows and "Concise Info" not in text:
        r.unread.append("The concise table's header is not in the paste, so only the rows shown were read.")
    return len({index for index, _, _ in rows})


def _rocm_smi_csv(text: str, r: Reading) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].lower().startswith("device,"):
        return
    header = [h.strip().lower() for h in lines[0].split(",")]
    rows = [dict(zip(header, (c.strip() for c in line.split(",")))) for line in lines[1:]
            if line.lower().startswith("card")]
    for row in rows:
        r.add("gpu_models", row.get("card series") or row.get("device name"))
        r.add("gfx_targets", normalise_gfx(row.get("gfx version")))
        r.add("device_ids", row.get("device id"))
    short = [row for row in rows if len(row) < len(header)]
    r.count(len(rows), None if not short else False)
    if short:
        r.unread.append("A CSV row has fewer fields than the header, so its later columns could not be read.")
