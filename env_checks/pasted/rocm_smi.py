"""rocm-smi, pasted: the concise table (both layouts), `GPU[n] : key: value` sections (`-a`, `--showproduct`,
`--showvoltage`), `--csv` and `--json` (whole, or a fragment cut so that it no longer opens with `{`).

Facts: models, gfx targets, device ids, driver version, MEC firmware, card SKU, partitions, the GPU count; then the PCI
BDFs, the VBIOS version, every `<block> firmware version` and the voltage rows; then the device ids of the concise
table (`[0x74a1 : 0x00]` of ROCm 6.0, `0x74a1,   48427` of the DID/GUID layout of ROCm 6.1+), the `Card Model` id,
`VRAM Total Memory (B)` and the target rocm-smi prints as `GFX Version`.

rocm-smi builds `GFX Version` from the KFD's decimal `gfx_target_version` (major*10000 + minor*100 + stepping), so
gfx90a (9.0.10) prints as `gfx9010` and gfx90c (9.0.12) as `gfx9012`: the printed name is kept as stated
(`gfx_version_as_printed`) and `gfx_targets` carries the ISA name it stands for.
"""

from __future__ import annotations

import re
from typing import Any

from env_checks.pasted.collect_env import is_collect_env_part
from env_checks.pasted.reading import BDF, Reading, add_firmware, add_gpu_firmware, json_pairs, load_json
from env_checks.tool_text import json_start, normalise_gfx

_CONCISE_MODEL = re.compile(r"^\d+\s+\[(0x[0-9a-fA-F]{4}) : 0x[0-9a-fA-F]{2}\]", re.MULTILINE)
_CONCISE_DID = re.compile(r"^(\d+)\s+\d+\s+(0x[0-9a-fA-F]{4}),\s+\d+\s", re.MULTILINE)
_CARD = re.compile(r'"(card\d+)"\s*:\s*\{')
_PRINTED_GFX = re.compile(r"^gfx9(\d)(1[0-5])$", re.IGNORECASE)


def is_rocm_smi(text: str) -> bool:
    """A rocm-smi output; not the rocm-smi topology a part of a collect_env embeds (read as part of it)."""
    return ("ROCm System Management Interface" in text or bool(re.search(r'"card\d+"\s*:', text))
            or bool(re.search(r"^GPU\[\d+\]\s*:", text, re.M)) or bool(re.search(r"^device,", text, re.M | re.I))
            or bool(re.search(r"^\d+\s+.*NPS\d+\s*,\s*[SDTQC]PX", text, re.M))) and not is_collect_env_part(text)


def read_rocm_smi(text: str) -> Reading:
    """rocm-smi concise table, `GPU[n] : key: value` sections, --csv, or --json."""
    r = Reading("rocm-smi")
    data = load_json(text, r)
    if isinstance(data, dict):
        _json_document(data, r)
    elif json_start(text) >= 0:
        _cut_json_document(text, r)
    else:
        _text_views(text, r)
    _bus_vbios_firmware_voltage(text, r)
    _device_ids_vram_gfx(text, r)
    return r


def _json_document(data: dict[str, Any], r: Reading) -> None:
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


def _cut_json_document(text: str, r: Reading) -> None:
    cards = {m for m in re.findall(r'"(card\d+)"\s*:', text)}
    for key, value in json_pairs(text):
        if key in ("card series", "device name"):
            r.add("gpu_models", value)
        elif key == "gfx version":
            r.add("gfx_targets", normalise_gfx(value))
    r.count(len(cards), False)


def _text_views(text: str, r: Reading) -> None:
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


def _bus_vbios_firmware_voltage(text: str, r: Reading) -> None:
    """PCI Bus, VBIOS version, every '<block> firmware version' and the voltage rows (text and --json)."""
    rows = re.findall(r"^GPU\[(\d+)\]\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    pairs = [(i, *(p.strip() for p in rest.split(":", 1))) for i, rest in rows if ":" in rest]
    if json_start(text) >= 0:
        pairs += [("", k, v) for k, v in json_pairs(text)]
    for _index, key, value in pairs:
        low = key.lower()
        if low == "pci bus" and re.fullmatch(BDF, value):
            r.add("pci_bdfs", value)
        elif low == "vbios version":
            r.put("vbios_version", value)
        elif low.endswith(" firmware version"):
            add_firmware(r, low[: -len(" firmware version")], value)
            if _index:
                add_gpu_firmware(r, f"GPU {_index}", low[: -len(" firmware version")], value)
        elif low == "voltage (mv)" and value.isdigit():
            r.facts.setdefault("voltage_mv", {}).setdefault(_index or "0", int(value))
    unsupported = {i for i, rest in rows if re.search(r"volt\w*, Not supported", rest, re.IGNORECASE)}
    if unsupported:
        r.unread.append(f"rocm-smi reports the voltage as not supported on {len(unsupported)} GPU(s) "
                        "(get_volt_metric), so no voltage was read for them.")
    if rows and "gpu_count" not in r.facts and "gpu_count_at_least" not in r.facts:
        r.count(len({i for i, _ in rows}), "End of ROCm SMI Log" in text)


# ---------------------------------------------------------------- device ids, VRAM totals, the printed GFX version

def isa_name(printed: str) -> str | None:
    """The ISA name a rocm-smi `GFX Version` stands for when rocm-smi printed the stepping in decimal
    ('gfx9010' -> 'gfx90a'); None when the printed name already is the ISA name."""
    found = _PRINTED_GFX.match(printed.strip())
    return f"gfx9{found.group(1)}{int(found.group(2)):x}" if found else None


def _gfx(r: Reading, printed: str) -> None:
    decoded = isa_name(printed)
    if decoded is None:
        return
    r.add("gfx_version_as_printed", printed)
    targets = r.facts.get("gfx_targets", [])
    r.facts["gfx_targets"] = [decoded if t.lower() == printed.lower() else t for t in targets]
    r.add("gfx_targets", decoded)


def _vram(r: Reading, card: str, value: str) -> None:
    if value.isdigit():
        r.facts.setdefault("vram_total_bytes", {}).setdefault(card, int(value))


def _card_fields(r: Reading, card: str, fields: dict[str, str], fragment: bool) -> None:
    model = fields.get("card model", "")
    if re.fullmatch(r"0x[0-9a-fA-F]{4}", model):
        r.add("device_ids", model)
    if re.fullmatch(r"0x[0-9a-fA-F]{4}", fields.get("device id", "")):
        r.add("device_ids", fields["device id"])
    _vram(r, card, fields.get("vram total memory (b)", ""))
    if fragment:
        r.add("gpu_models", fields.get("card series") or fields.get("device name"))
        if fields.get("gfx version"):
            r.add("gfx_targets", fields["gfx version"])
    if fields.get("gfx version"):
        _gfx(r, fields["gfx version"])


def _json_cards(text: str, r: Reading) -> None:
    """`--json` cards, whole or cut: each `"cardN": {` opens the pairs that follow it."""
    marks = list(_CARD.finditer(text))
    fragment = json_start(text) < 0
    for mark, after in zip(marks, marks[1:] + [None]):
        body = text[mark.end():after.start() if after else len(text)]
        _card_fields(r, mark.group(1), dict(json_pairs(body)), fragment)
    if fragment and marks:
        r.count(len(marks), False)
        r.unread.append("The rocm-smi JSON is a fragment (it does not open with '{'), so only the key/value pairs "
                        "shown were read and cards outside it are unknown.")


def _csv_device_ids_and_vram(text: str, r: Reading) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    head = next((i for i, line in enumerate(lines) if line.lower().startswith("device,")), None)
    if head is None:
        return
    header = [h.strip().lower() for h in lines[head].split(",")]
    # _rocm_smi_csv reads a header on the first line only: this reads one after a prompt line, models and targets too
    after_prompt = head > 0
    cards = [line for line in lines[head + 1:] if line.lower().startswith("card")]
    for line in cards:
        fields = dict(zip(header, (c.strip() for c in line.split(","))))
        _card_fields(r, fields.get("device", ""), fields, after_prompt)
    if after_prompt and cards:
        r.count(len(cards), None)


def _device_ids_vram_gfx(text: str, r: Reading) -> None:
    """Device ids, VRAM totals and the printed GFX version of every rocm-smi layout."""
    for did in _CONCISE_MODEL.findall(text):
        r.add("device_ids", did)
    rows = _CONCISE_DID.findall(text)
    for _index, did in rows:
        r.add("device_ids", did)
    if rows and "gpu_count" not in r.facts and "gpu_count_at_least" not in r.facts:
        r.count(len({index for index, _ in rows}), "End of ROCm SMI Log" in text)
    for index, key, value in re.findall(r"^GPU\[(\d+)\]\s*:\s*([^:\n]+?):\s*(.*?)\s*$", text, re.MULTILINE):
        key = key.strip().lower()
        if key == "card model" and re.fullmatch(r"0x[0-9a-fA-F]{4}", value):
            r.add("device_ids", value)
        elif key == "vram total memory (b)":
            _vram(r, f"GPU[{index}]", value)
        elif key == "gfx version":
            _gfx(r, value)
    if _CARD.search(text):
        _json_cards(text, r)
    _csv_device_ids_and_vram(text, r)
