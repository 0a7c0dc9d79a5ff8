"""Files of /sys, pasted: `/sys/kernel/debug/dri/N/amdgpu_firmware_info` (every loaded firmware block's version, the
VBIOS version) and the KFD topology's `/sys/class/kfd/kfd/topology/nodes/N/mem_banks/M/properties` (the bank's heap
type, size, width and clock; the VRAM size where it is a frame-buffer heap)."""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading

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
