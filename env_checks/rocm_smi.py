"""Facts of a pasted `rocm-smi` output that its base reader (`textforms.read_rocm_smi`) leaves unread: the device ids
of the concise table (`[0x74a1 : 0x00]` of ROCm 6.0, `0x74a1,   48427` of the DID/GUID layout of ROCm 6.1+), the
`Card Model` id, `VRAM Total Memory (B)` (text, `--csv`, `--json`), the target rocm-smi prints as `GFX Version`, and
a `--json` paste cut so that it no longer opens with `{`.

rocm-smi builds `GFX Version` from the KFD's decimal `gfx_target_version` (major*10000 + minor*100 + stepping), so
gfx90a (9.0.10) prints as `gfx9010` and gfx90c (9.0.12) as `gfx9012`: the printed name is kept as stated
(`gfx_version_as_printed`) and `gfx_targets` carries the ISA name it stands for.
"""

from __future__ import annotations

import re

from env_checks.textforms import Reading, json_pairs, json_start

_CONCISE_MODEL = re.compile(r"^\d+\s+\[(0x[0-9a-fA-F]{4}) : 0x[0-9a-fA-F]{2}\]", re.MULTILINE)
_CONCISE_DID = re.compile(r"^(\d+)\s+\d+\s+(0x[0-9a-fA-F]{4}),\s+\d+\s", re.MULTILINE)
_CARD = re.compile(r'"(card\d+)"\s*:\s*\{')
_PRINTED_GFX = re.compile(r"^gfx9(\d)(1[0-5])$", re.IGNORECASE)


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


def _csv(text: str, r: Reading) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    head = next((i for i, line in enumerate(lines) if line.lower().startswith("device,")), None)
    if head is None:
        return
    header = [h.strip().lower() for h in lines[head].split(",")]
    unread_by_base = head > 0  # the base reader takes a header on the first line only (a prompt line before it)
    cards = [line for line in lines[head + 1:] if line.lower().startswith("card")]
    for line in cards:
        fields = dict(zip(header, (c.strip() for c in line.split(","))))
        _card_fields(r, fields.get("device", ""), fields, unread_by_base)
    if unread_by_base and cards:
        r.count(len(cards), None)


def enrich_rocm_smi(text: str, r: Reading) -> None:
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
    _csv(text, r)
