"""Facts the readers of `textforms`/`textforms_more` left unread although the text states them plainly (issue 39),
added after the base reader ran: PCI BDFs, chip/device ids, per-block firmware versions, VBIOS versions, the MIOpen
version, rocm-smi voltage rows; and `extend`, which composes `env_checks.diagnose`'s reader registry with the
readers of `textforms_extra`.

Every value is copied from the text as it stands (a verbatim check in the tests holds it to that).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from env_checks import amdgpu_log, collect_env, rocm_smi, rocminfo
from env_checks import textforms_extra as extra
from env_checks import textforms_faults as faults
from env_checks import textforms_fragments as fragments
from env_checks.probes import amd_smi
from env_checks.textforms import Reading, json_pairs, json_start

Detector = tuple[str, Callable[[str], bool], Callable[[str], Reading]]
BDF = extra.BDF


def _firmware(r: Reading, block: str, version: str) -> None:
    version = version.strip()  # 0 / 0x00000000: a block with no firmware loaded
    if version and version.upper() != "N/A" and not re.fullmatch(r"(0x)?0+", version):
        r.facts.setdefault("firmware", {}).setdefault(block.strip().lower(), version)


def _gpu_firmware(r: Reading, gpu: str, block: str, version: str) -> None:
    """The firmware of one GPU (`firmware_by_gpu`), kept apart so that a check can see GPUs disagree."""
    version = version.strip()
    if version and version.upper() != "N/A" and not re.fullmatch(r"(0x)?0+", version):
        r.facts.setdefault("firmware_by_gpu", {}).setdefault(gpu, {}).setdefault(block.strip().lower(), version)


def enrich_rocminfo(text: str, r: Reading) -> None:
    """Chip ID of each GPU agent ('29857(0x74a1)' -> 0x74a1), the SDMA microcode version."""
    agents = re.split(r"^\*{5,}\s*\n\s*Agent (\d+)\s*\n\*{5,}\s*$", text, flags=re.MULTILINE)
    for agent, block in zip(agents[1::2], agents[2::2]):
        if not re.search(r"^\s*Device Type:\s*GPU\b", block, re.MULTILINE):
            continue
        for label, block_name in (("Packet Processor uCode", "mec"), ("SDMA engine uCode", "sdma")):
            found = re.search(rf"^\s*{label}::?\s*(\S+)", block, re.MULTILINE)
            if found:
                _gpu_firmware(r, f"agent {agent}", block_name, found.group(1))
        chip = re.search(r"^\s*Chip ID:\s*\d+\((0x[0-9a-fA-F]+)\)", block, re.MULTILINE)
        if chip and int(chip.group(1), 16):
            r.add("device_ids", chip.group(1))
        sdma = re.search(r"^\s*SDMA engine uCode::?\s*(\S+)", block, re.MULTILINE)
        if sdma:
            _firmware(r, "sdma", sdma.group(1))


def enrich_amd_smi(text: str, r: Reading) -> None:
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
                _firmware(r, value, value2)
    for block, version in re.findall(r"^\s*FW_ID:\s*(\S+)\s*\n\s*FW_VERSION:\s*(\S+)", text, re.MULTILINE):
        _firmware(r, block, version)
    for gpu, body in zip(*[iter(re.split(r"^GPU: (\d+)\s*$", text, flags=re.MULTILINE)[1:])] * 2):
        for block, version in re.findall(r"^\s*FW_ID:\s*(\S+)\s*\n\s*FW_VERSION:\s*(\S+)", body, re.MULTILINE):
            _gpu_firmware(r, f"GPU {gpu}", block, version)
    if json_start(text) >= 0:
        gpu = None
        pairs = json_pairs(text)
        for (key, value), (key2, value2) in zip(pairs, pairs[1:]):
            if key == "gpu":
                gpu = value
            if gpu is not None and key in ("fw_id", "fw_name") and key2 == "fw_version":
                _gpu_firmware(r, f"GPU {gpu}", value, value2)


def enrich_rocm_smi(text: str, r: Reading) -> None:
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
            _firmware(r, low[: -len(" firmware version")], value)
            if _index:
                _gpu_firmware(r, f"GPU {_index}", low[: -len(" firmware version")], value)
        elif low == "voltage (mv)" and value.isdigit():
            r.facts.setdefault("voltage_mv", {}).setdefault(_index or "0", int(value))
    unsupported = {i for i, rest in rows if re.search(r"volt\w*, Not supported", rest, re.IGNORECASE)}
    if unsupported:
        r.unread.append(f"rocm-smi reports the voltage as not supported on {len(unsupported)} GPU(s) "
                        "(get_volt_metric), so no voltage was read for them.")
    if rows and "gpu_count" not in r.facts and "gpu_count_at_least" not in r.facts:
        r.count(len({i for i, _ in rows}), "End of ROCm SMI Log" in text)


def enrich_collect_env(text: str, r: Reading) -> None:
    """MIOpen and the CUDA runtime version (both in the PyTorch and in vLLM's padded `key   : value` layouts)."""
    for fact, label in (("miopen_version", "MIOpen runtime version"), ("cuda_runtime_version", "CUDA runtime version")):
        found = re.search(rf"^{label}\s*:\s*(\S.*?)\s*$", text, re.MULTILINE)
        if found and re.match(r"^\d+(\.\d+)+", found.group(1)):
            r.put(fact, found.group(1))


_TARGET_ID = re.compile(r"\b(gfx[0-9a-f]{3,5}(?::(?:sramecc|xnack)[+-])+)")


def enrich_target_ids(text: str, r: Reading) -> None:
    """Full target ids with their feature suffixes ('gfx90a:sramecc+:xnack-'), as collect_env and HIP's
    NoBinaryForGpu/code-object lines print them: the bare gfx name alone hides an xnack mismatch."""
    for target in _TARGET_ID.findall(text):
        r.add("gfx_target_ids", target)


def _both(*fns: Callable[[str, Reading], None]) -> Callable[[str, Reading], None]:
    def enrich(text: str, r: Reading) -> None:
        for fn in fns:
            fn(text, r)

    return enrich


ENRICHERS: dict[str, Callable[[str, Reading], None]] = {
    "rocminfo": _both(enrich_rocminfo, rocminfo.enrich_rocminfo),
    "amd-smi": _both(enrich_amd_smi, amd_smi.enrich_amd_smi_paste),
    "rocm-smi": _both(enrich_rocm_smi, rocm_smi.enrich_rocm_smi),
    "collect_env": _both(enrich_collect_env, enrich_target_ids), "error trace": enrich_target_ids,
    "kernel log": _both(faults.enrich_kernel_log, amdgpu_log.enrich_amdgpu_log), "hipconfig": faults.enrich_hipconfig,
}


def _enriched(read: Callable[[str], Reading], enrich: Callable[[str, Reading], None]) -> Callable[[str], Reading]:
    def reader(text: str) -> Reading:
        reading = read(text)
        enrich(text, reading)
        return reading

    reader.__name__ = getattr(read, "__name__", "reader")
    return reader


# Parts of a collect_env the whole-output detector does not recognise (cut before `PyTorch version`, or a tail).
COLLECT_ENV_PARTS: list[Detector] = [
    ("collect_env (part)", collect_env.is_collect_env_part,
     _enriched(collect_env.read_collect_env_part, _both(enrich_collect_env, enrich_target_ids))),
    ("collect_env (tail: GPU topology)", collect_env.is_topology_tail, collect_env.read_topology_tail),
]


def extend(detectors: list[Detector]) -> list[Detector]:
    """`detectors` with the readers of `textforms_extra` put first and the base readers enriched; a rocminfo
    fragment is only read when no other reader for rocminfo fires."""
    rocminfo = next((detect for kind, detect, _ in detectors if kind == "rocminfo"), None)
    out: list[Detector] = list(extra.DETECTORS) + list(fragments.DETECTORS)
    out.append(("HIP runtime log", faults.is_hip_log, faults.read_hip_log))
    out += COLLECT_ENV_PARTS
    for kind, detect, read in extra.FRAGMENTS:
        out.append((kind, _unless(detect, rocminfo), read))
    for kind, detect, read in detectors:
        if kind == "amd-smi":
            detect = _unless_any(detect, fragments.SUPERSEDE_AMD_SMI)
        elif kind == "rocm-smi":  # the rocm-smi topology a collect_env part embeds is read as part of it
            detect = _unless_any(detect, (collect_env.is_collect_env_part,))
        elif kind == "collect_env":
            detect = _either(detect, _NEW_COLLECT_ENV)
        out.append((kind, detect, _enriched(read, ENRICHERS[kind]) if kind in ENRICHERS else read))
    return out


# collect_env of torch 2.10+ names the ROCm build "ROCm SDK used to build PyTorch" / "HIP used to build PyTorch"
_NEW_COLLECT_ENV = re.compile(r"^(ROCm SDK|HIP|CUDA) used to build PyTorch\s*:", re.MULTILINE)


def _either(detect: Callable[[str], bool], pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: detect(text) or bool(pattern.search(text))


def _unless_any(detect: Callable[[str], bool], others: tuple[Callable[[str], bool], ...]) -> Callable[[str], bool]:
    return lambda text: detect(text) and not any(other(text) for other in others)


def _unless(detect: Callable[[str], bool], other: Callable[[str], bool] | None) -> Callable[[str], bool]:
    return lambda text: detect(text) and not (other is not None and other(text))
