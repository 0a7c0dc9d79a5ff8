"""amd-smi probes (static, firmware, bad pages) and the rocm-smi fallback.

amd-smi prints the same tree either as JSON (`--json`) or as indented `KEY: value` text, and its JSON
shape has moved between releases (a bare list of per-GPU objects in the 24.x tools, an object with a
`gpu_data` list in later ones). Both forms and both shapes are read into one list of per-GPU dicts with
lower-case keys, so each command has a single extractor. rocm-smi (deprecated in favour of amd-smi) is
kept as a fallback for older installs: its `--json` output is an object of `cardN` entries. The reading of
amd-smi's indented text into per-GPU dicts (`smi_text_tree`) is shared with the reader of pasted amd-smi output
(`env_checks.pasted.amd_smi`), which keeps what a cut block has where this probe refuses it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from env_checks.probes.facts import ProbeFailure, Unparseable, int_or_none, parse_with, run_tool
from env_checks.tool_text import colon_pairs, json_start, normalise_gfx


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


def parse_smi_tree(text: str) -> list[dict[str, Any]]:
    """amd-smi output (JSON or text) as a list of per-GPU dicts with lower-case keys."""
    # JSON only when the first line that is not a warning or a prompt opens a document: text reports carry
    # brackets too (topology tables, "[0 %, N/A]" lists), which are not JSON.
    start = json_start(text)
    if start >= 0:
        try:
            data = json.loads(text[start:])
        except json.JSONDecodeError as exc:
            raise Unparseable(f"invalid JSON ({exc.msg} at char {exc.pos})") from None
        if isinstance(data, dict):
            data = data.get("gpu_data", [data])
        if not isinstance(data, list) or not all(isinstance(g, dict) and "gpu" in g for g in data):
            raise Unparseable("JSON is not a list of per-GPU objects")
        return data
    gpus = smi_text_tree(text, first_wins=False)
    if not gpus:
        raise Unparseable("no 'GPU: n' blocks (a table such as `amd-smi topology` or `monitor` is not per-GPU blocks)")
    return gpus


def smi_value(value: Any) -> str | None:
    """A scalar as text; amd-smi wraps some as {"value": .., "unit": ..} and writes N/A for unknowns."""
    if isinstance(value, dict):
        value = value.get("value")
    if value is None or str(value).strip().upper() in {"", "N/A", "NA"}:
        return None
    return str(value).strip()


@dataclass
class AmdSmiGpu:
    """Static facts of one GPU from `amd-smi static`."""

    gpu: int
    market_name: str | None
    gfx_target: str | None
    compute_units: int | None
    device_id: str | None
    driver_version: str | None
    vbios_version: str | None
    compute_partition: str | None
    memory_partition: str | None
    vram_mb: int | None


@dataclass
class AmdSmiStatic:
    gpus: list[AmdSmiGpu]


def parse_amd_smi_static(text: str) -> AmdSmiStatic:
    gpus = []
    for g in parse_smi_tree(text):
        asic, driver = g.get("asic") or {}, g.get("driver") or {}
        # The VBIOS section was renamed IFWI in later amd-smi releases.
        vbios = g.get("vbios") or g.get("ifwi") or {}
        part = g.get("partition") or {}
        vram = g.get("vram") or {}
        size = smi_value(vram.get("size"))
        gpus.append(AmdSmiGpu(
            gpu=int(g["gpu"]),
            market_name=smi_value(asic.get("market_name")),
            gfx_target=smi_value(asic.get("target_graphics_version")),
            compute_units=int_or_none(smi_value(asic.get("num_compute_units"))),
            device_id=smi_value(asic.get("device_id")),
            driver_version=smi_value(driver.get("version") or driver.get("driver_version")),
            vbios_version=smi_value(vbios.get("version")),
            compute_partition=smi_value(part.get("compute_partition") or part.get("accelerator_partition")),
            memory_partition=smi_value(part.get("memory_partition")),
            vram_mb=int_or_none(size.split()[0]) if size else None,
        ))
    return AmdSmiStatic(gpus=gpus)


@dataclass
class AmdGpuFirmware:
    """Firmware of one GPU; `mec` is CP_MEC1, the version the HSA_NO_SCRATCH_RECLAIM rule is about."""

    gpu: int
    mec: int | None
    versions: dict[str, str] = field(default_factory=dict)


@dataclass
class AmdSmiFirmware:
    gpus: list[AmdGpuFirmware]


def parse_amd_smi_firmware(text: str) -> AmdSmiFirmware:
    gpus = []
    for g in parse_smi_tree(text):
        entries = g.get("fw_list")
        # Text output nests "FW 0: {FW_ID, FW_VERSION}" sections; JSON gives a list of the same objects.
        if isinstance(entries, dict):
            entries = list(entries.values())
        if not isinstance(entries, list):
            raise Unparseable(f"GPU {g.get('gpu')} has no fw_list")
        versions = {}
        for entry in entries:
            name = entry.get("fw_id") or entry.get("fw_name")
            if name is None or "fw_version" not in entry:
                raise Unparseable(f"GPU {g.get('gpu')}: firmware entry without id or version: {entry}")
            versions[str(name).upper()] = str(entry["fw_version"])
        mec = versions.get("CP_MEC1") or versions.get("MEC")
        gpus.append(AmdGpuFirmware(gpu=int(g["gpu"]), mec=int_or_none(mec), versions=versions))
    return AmdSmiFirmware(gpus=gpus)


@dataclass
class AmdGpuBadPages:
    """Retired / pending / unreservable page counts of one GPU (None where amd-smi gave no count)."""

    gpu: int
    retired: int | None
    pending: int | None
    unreservable: int | None


@dataclass
class AmdSmiBadPages:
    gpus: list[AmdGpuBadPages]


def parse_amd_smi_bad_pages(text: str) -> AmdSmiBadPages:
    return AmdSmiBadPages(gpus=[
        AmdGpuBadPages(
            gpu=int(g["gpu"]),
            retired=bad_page_count(g.get("retired")),
            pending=bad_page_count(g.get("pending")),
            unreservable=bad_page_count(g.get("un_res")),
        )
        for g in parse_smi_tree(text)
    ])


@dataclass
class RocmSmiCard:
    card: str
    series: str | None
    gfx_target: str | None
    mec: int | None
    vbios_version: str | None


@dataclass
class RocmSmi:
    driver_version: str | None
    cards: list[RocmSmiCard]


def parse_rocm_smi(text: str) -> RocmSmi:
    """Parse `rocm-smi ... --json`; key spelling ('Card series' / 'Card Series') varies by release."""
    try:
        data = json.loads(text[text.find("{"):]) if "{" in text else None
    except json.JSONDecodeError as exc:
        raise Unparseable(f"invalid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise Unparseable("expected a JSON object of cardN entries")
    cards = []
    for name, card in sorted(data.items()):
        if not name.startswith("card") or not isinstance(card, dict):
            continue
        fields = {k.lower(): v for k, v in card.items()}
        cards.append(RocmSmiCard(
            card=name,
            series=smi_value(fields.get("card series")),
            gfx_target=normalise_gfx(smi_value(fields.get("gfx version"))),
            mec=int_or_none(smi_value(fields.get("mec firmware version"))),
            vbios_version=smi_value(fields.get("vbios version")),
        ))
    if not cards:
        raise Unparseable("no cardN entries")
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    return RocmSmi(driver_version=smi_value(system.get("Driver version")), cards=cards)


def probe_amd_smi_static() -> AmdSmiStatic | ProbeFailure:
    return parse_with("amd-smi", parse_amd_smi_static, run_tool(["amd-smi", "static", "--json"]))


def probe_amd_smi_firmware() -> AmdSmiFirmware | ProbeFailure:
    return parse_with("amd-smi", parse_amd_smi_firmware, run_tool(["amd-smi", "firmware", "--json"]))


def probe_amd_smi_bad_pages() -> AmdSmiBadPages | ProbeFailure:
    return parse_with("amd-smi", parse_amd_smi_bad_pages, run_tool(["amd-smi", "bad-pages", "--json"]))


def probe_rocm_smi() -> RocmSmi | ProbeFailure:
    argv = ["rocm-smi", "--showproductname", "--showdriverversion", "--showfw", "--json"]
    return parse_with("rocm-smi", parse_rocm_smi, run_tool(argv))
