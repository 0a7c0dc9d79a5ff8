"""amd-smi, pasted: the per-GPU views (`static`, `metric`, `list`, `firmware`, `bad-pages`, `process`, text or
`--json`, whole or cut, also indented as a whole), `version`, `monitor` and `topology`, and a `jq` selection of
amd-smi's JSON without its `gpu` index. The table views (the default view, `partition`, `process --csv`, `xgmi`) are
read by `env_checks.pasted.amd_smi_tables`.

Facts: models, gfx targets, device ids, driver/VBIOS/ROCm/AMD SMI versions, partitions, virtualization, VRAM, ECC and
bad-page counts, the GPU count; then the PCI BDFs and every firmware block (`firmware`, and `firmware_by_gpu` per GPU);
then compute units, socket power per GPU (a POWER section; a LIMIT section's cap is not a reading), process ids and
names, and the AMD SMI library and HSMP driver versions; the render node of each GPU (`list -e`), the VRAM total of each
row of `monitor` (partitioned GPUs print one row per partition), and the VBIOS version of a `VBIOS:` block pasted
without its `GPU: n` line (`amd-smi static | grep -A 4 VBIOS`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from env_checks.pasted.amd_smi_tables import is_amd_smi_process_json, is_amd_smi_process_table, is_amd_smi_xgmi
from env_checks.pasted.reading import (
    BDF,
    ELIDED,
    Reading,
    add_firmware,
    add_gpu_firmware,
    is_version,
    json_pairs,
    load_json,
)
from env_checks.probes.amd_smi import bad_page_count, smi_text_tree, smi_value
from env_checks.tool_text import json_start, normalise_gfx


def is_amd_smi(text: str) -> bool:
    """amd-smi's per-GPU views, version, monitor or topology; not a process table or xgmi (their GPU rows are not
    GPU blocks)."""
    return _looks_like_amd_smi(text) and not (is_amd_smi_process_table(text) or is_amd_smi_process_json(text)
                                              or is_amd_smi_xgmi(text))


def _looks_like_amd_smi(text: str) -> bool:
    return "AMDSMI Tool:" in text or bool(re.search(r"^GPU: \d+\s*$", text, re.M)) \
        or bool(re.search(r'"gpu"\s*:\s*\d', text)) \
        or bool(re.search(r"^(ACCESS|WEIGHT|HOPS|LINK TYPE|LINK METRIC|LINK STATUS) TABLE:", text, re.M)) \
        or bool(re.search(r"^\s*GPU\s+(POWER|GPU_T|GFX_|VRAM_|PVIOL|XCP|MEM_)", text, re.M)) \
        or "amd-smi " in text[:200]


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
            _monitor_or_topology(text, r, complete)
    if not complete:
        r.unread.append("The output elides devices ('...'), so only a lower bound of the GPU count is known.")
    _bdfs_and_firmware(text, r)
    _units_power_processes_versions(text, r)
    _render_nodes([gpu for gpu in gpus if isinstance(gpu, dict)], r)
    _vbios_block(text, r)
    return r


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


def _monitor_or_topology(text: str, r: Reading, complete: bool) -> None:
    """monitor (a GPU-per-row table), topology/xgmi (BDF-per-row matrices)."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if re.match(r"^\s*GPU\s+[A-Z_]{3,}", line)), None)
    if header is not None:
        rows = [line for line in lines[header + 1:] if re.match(r"^\s*\d+\s+\S", line)]
        columns = lines[header].split()
        r.put("monitor_columns", columns)
        r.count(len({row.split()[0] for row in rows}), None if complete else False)
        totals = {}
        for row in rows:
            cells = dict(zip(columns, _MONITOR_CELL.findall(row)))
            usage = re.fullmatch(r"[\d.]+/\s*([\d.]+ [KMG]B)", cells.get("VRAM_USAGE", ""))
            total = usage.group(1) if usage else cells.get("VRAM_TOTAL", "")
            if re.fullmatch(r"[\d.]+ [KMG]B", total):
                totals.setdefault(row.split()[0], total)
        if totals:
            r.put("vram_total_by_gpu", totals)
            first = next(iter(totals.values()))
            if first.endswith(" MB") and first[:-3].isdigit():
                r.put("vram_total_mib", int(first[:-3]))
        return
    bdfs = {m for m in re.findall(r"^\s*(?:GPU\d+\s+)?([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f])\s",
                                  text, re.MULTILINE | re.IGNORECASE)}
    if bdfs:
        r.count(len(bdfs), None if complete else False)
        if re.search(r"\bXGMI\b", text):
            r.put("gpu_links", "XGMI")


# a monitor cell: `0.5/ 24.0 GB` (used/total), a value with its unit (`201 W`, `46 °C`, `16185 MB`), or one token
_MONITOR_CELL = re.compile(r"[\d.]+/\s*[\d.]+ [KMG]B|\S+(?: (?:W|°C|C|MHz|GHz|%|[KMG]B|B))?(?=\s|$)")


def _render_nodes(gpus: list[dict[str, Any]], r: Reading) -> None:
    """`amd-smi list -e`: each GPU's DRM render node (RENDER: renderD128); N/A leaves it unstated."""
    unmapped: list[tuple[str, str]] = []
    for gpu in gpus:
        node = gpu.get("render")
        if isinstance(node, dict):
            node = node.get("value")
        if node is None or "gpu" not in gpu:
            continue
        if re.fullmatch(r"renderD\d+", str(node).strip()):
            r.facts.setdefault("render_nodes", {}).setdefault(str(gpu["gpu"]), str(node).strip())
        else:
            unmapped.append((str(gpu["gpu"]), str(node).strip()))
    if unmapped:
        printed = " or ".join(sorted({value for _, value in unmapped}))
        gpus_shown = ", ".join(index for index, _ in unmapped)
        r.unread.append(f"RENDER is {printed} for GPU {gpus_shown}, so "
                        f"{'its render node is' if len(unmapped) == 1 else 'their render nodes are'} not stated.")


def _vbios_block(text: str, r: Reading) -> None:
    """A `VBIOS:` block pasted without its `GPU: n` line (`amd-smi static | grep -A 4 VBIOS`)."""
    if "vbios_version" in r.facts or re.search(r"^\s*GPU: \d+\s*$", text, re.MULTILINE):
        return
    block = re.search(r"^\s*VBIOS:\s*\n((?:[ \t]+[A-Z_]+:.*\n?)+)", text, re.MULTILINE)
    version = re.search(r"^\s*VERSION:\s*(\S.*?)\s*$", block.group(1), re.MULTILINE) if block else None
    if version:
        r.put("vbios_version", version.group(1))
        r.unread.append("The VBIOS block is pasted without its 'GPU: n' line, so which GPU it belongs to (and how many "
                        "GPUs there are) is not stated.")


def _bdfs_and_firmware(text: str, r: Reading) -> None:
    """BDFs (list, static --bus, topology and xgmi tables, JSON) and every FW_ID/FW_VERSION pair of `firmware`."""
    for bdf in re.findall(rf"^\s*BDF:\s*({BDF})\s*$", text, re.MULTILINE):
        r.add("pci_bdfs", bdf)
    for bdf in re.findall(rf"^\s*(?:GPU\d+\s+)?({BDF})\s", text, re.MULTILINE):
        r.add("pci_bdfs", bdf)
    if json_start(text) >= 0:
        pairs = json_pairs(text)
        for key, value in pairs:
            if key in ("bdf", "gpu_bdf") and re.fullmatch(BDF, value):
                r.add("pci_bdfs", value)
        for (key, value), (key2, value2) in zip(pairs, pairs[1:]):
            if key in ("fw_id", "fw_name") and key2 == "fw_version":
                add_firmware(r, value, value2)
    for block, version in re.findall(r"^\s*FW_ID:\s*(\S+)\s*\n\s*FW_VERSION:\s*(\S+)", text, re.MULTILINE):
        add_firmware(r, block, version)
    for gpu, body in zip(*[iter(re.split(r"^GPU: (\d+)\s*$", text, flags=re.MULTILINE)[1:])] * 2):
        for block, version in re.findall(r"^\s*FW_ID:\s*(\S+)\s*\n\s*FW_VERSION:\s*(\S+)", body, re.MULTILINE):
            add_gpu_firmware(r, f"GPU {gpu}", block, version)
    if json_start(text) >= 0:
        gpu = None
        pairs = json_pairs(text)
        for (key, value), (key2, value2) in zip(pairs, pairs[1:]):
            if key == "gpu":
                gpu = value
            if gpu is not None and key in ("fw_id", "fw_name") and key2 == "fw_version":
                add_gpu_firmware(r, f"GPU {gpu}", value, value2)


def _json_gpus(text: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text[json_start(text):])
    except json.JSONDecodeError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    return [g for g in data if isinstance(g, dict) and "gpu" in g] if isinstance(data, list) else []


def _number(value: str) -> int | float:
    return float(value) if "." in value else int(value)


def _units_power_processes_versions(text: str, r: Reading) -> None:
    """Compute units (`static --asic`, text and JSON), socket power per GPU (`metric --power`, text and JSON), the
    process ids and names of `process` (text), and the AMD SMI library and HSMP driver versions of `version`."""
    for units in re.findall(r'^\s*NUM_COMPUTE_UNITS:\s*(\d+)\s*$|"num_compute_units"\s*:\s*(\d+)', text, re.M):
        r.add("compute_units", units[0] or units[1])
    for gpu in smi_text_tree(text) if json_start(text) < 0 else _json_gpus(text):
        power = gpu.get("power")  # metric's POWER section; static's LIMIT section states a cap, not a reading
        socket = power.get("socket_power") if isinstance(power, dict) else None
        unit = socket.get("unit", "W") if isinstance(socket, dict) else "W"
        found = re.fullmatch(r"(\d+(?:\.\d+)?)(?: W)?", smi_value(socket) or "")
        if found and unit == "W":
            r.facts.setdefault("socket_power_w", {}).setdefault(str(gpu.get("gpu")), _number(found.group(1)))
    blocks = re.split(r"^\s*GPU: (\d+)\s*$", text, flags=re.MULTILINE)
    for _gpu, body in zip(blocks[1::2], blocks[2::2]):
        for name, pid in re.findall(r"^\s*PROCESS_INFO:\s*\n\s*NAME:\s*(.*?)\s*\n\s*PID:\s*(\d+)", body, re.M):
            r.add("process_ids", pid)
            r.add("process_names", name)
    library = re.search(r"AMDSMI Library version:\s*([^|\s]+)", text)
    r.put("amdsmi_library_version", library.group(1) if library else None)
    hsmp = re.search(r"amd_hsmp version:\s*([^|\n]+?)\s*(?:\||$)", text, re.MULTILINE)
    r.put("amd_hsmp_version", hsmp.group(1) if hsmp else None)


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
