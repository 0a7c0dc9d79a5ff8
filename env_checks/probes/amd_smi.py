"""amd-smi probes (static, firmware, bad pages) and the rocm-smi fallback.

amd-smi prints the same tree either as JSON (`--json`) or as indented `KEY: value` text, and its JSON
shape has moved between releases (a bare list of per-GPU objects in the 24.x tools, an object with a
`gpu_data` list in later ones). Both forms and both shapes are read into one list of per-GPU dicts with
lower-case keys, so each command has a single extractor. rocm-smi (deprecated in favour of amd-smi) is
kept as a fallback for older installs: its `--json` output is an object of `cardN` entries.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from env_checks.probes.facts import ProbeFailure, Unparseable, int_or_none, parse_with, run_tool
from env_checks.textforms import bad_page_count, json_start, normalise_gfx, smi_text_tree


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


def _leaf(value: Any) -> str | None:
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
        size = _leaf(vram.get("size"))
        gpus.append(AmdSmiGpu(
            gpu=int(g["gpu"]),
            market_name=_leaf(asic.get("market_name")),
            gfx_target=_leaf(asic.get("target_graphics_version")),
            compute_units=int_or_none(_leaf(asic.get("num_compute_units"))),
            device_id=_leaf(asic.get("device_id")),
            driver_version=_leaf(driver.get("version") or driver.get("driver_version")),
            vbios_version=_leaf(vbios.get("version")),
            compute_partition=_leaf(part.get("compute_partition") or part.get("accelerator_partition")),
            memory_partition=_leaf(part.get("memory_partition")),
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
            series=_leaf(fields.get("card series")),
            gfx_target=normalise_gfx(_leaf(fields.get("gfx version"))),
            mec=int_or_none(_leaf(fields.get("mec firmware version"))),
            vbios_version=_leaf(fields.get("vbios version")),
        ))
    if not cards:
        raise Unparseable("no cardN entries")
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    return RocmSmi(driver_version=_leaf(system.get("Driver version")), cards=cards)


def probe_amd_smi_static() -> AmdSmiStatic | ProbeFailure:
    return parse_with("amd-smi", parse_amd_smi_static, run_tool(["amd-smi", "static", "--json"]))


def probe_amd_smi_firmware() -> AmdSmiFirmware | ProbeFailure:
    return parse_with("amd-smi", parse_amd_smi_firmware, run_tool(["amd-smi", "firmware", "--json"]))


def probe_amd_smi_bad_pages() -> AmdSmiBadPages | ProbeFailure:
    return parse_with("amd-smi", parse_amd_smi_bad_pages, run_tool(["amd-smi", "bad-pages", "--json"]))


def probe_rocm_smi() -> RocmSmi | ProbeFailure:
    argv = ["rocm-smi", "--showproductname", "--showdriverversion", "--showfw", "--json"]
    return parse_with("rocm-smi", parse_rocm_smi, run_tool(argv))


# ---------------------------------------------------------------- pasted output: facts the text readers leave unread


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


def enrich_amd_smi_paste(text: str, r: Any) -> None:
    """Facts a pasted amd-smi output states that `textforms.read_amd_smi` leaves unread: compute units (`static
    --asic`, text and JSON), socket power per GPU (`metric --power`, text and JSON), the process ids and names of
    `process` (text), and the AMD SMI library and HSMP driver versions of `version`. `r` is a `textforms.Reading`."""
    for units in re.findall(r'^\s*NUM_COMPUTE_UNITS:\s*(\d+)\s*$|"num_compute_units"\s*:\s*(\d+)', text, re.M):
        r.add("compute_units", units[0] or units[1])
    for gpu in smi_text_tree(text) if json_start(text) < 0 else _json_gpus(text):
        power = gpu.get("power")  # metric's POWER section; static's LIMIT section states a cap, not a reading
        socket = power.get("socket_power") if isinstance(power, dict) else None
        unit = socket.get("unit", "W") if isinstance(socket, dict) else "W"
        found = re.fullmatch(r"(\d+(?:\.\d+)?)(?: W)?", _leaf(socket) or "")
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
