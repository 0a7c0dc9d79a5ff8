"""Cross-checks of the facts read from several outputs of one machine (`conformance diagnose a.txt b.txt -`): the
firmware of every GPU is the same, rocminfo's gfx target agrees with the GPU model amd-smi/rocm-smi name, and the
amdgpu driver version modinfo states is the one amd-smi/rocm-smi report. Each disagreement is a `Contradiction`:
which check, which fact, the values with where each was read, and one sentence.

Firmware is also checked inside one output (an `amd-smi firmware` whose GPUs disagree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Instinct models and the gfx target their silicon has (AMD's ROCm hardware table); a model not listed is not checked.
GFX_BY_MODEL: tuple[tuple[str, str], ...] = (
    (r"\bMI30[08][AX]\b|\bMI325X\b", "gfx942"),
    (r"\bMI35[05]X\b", "gfx950"),
    (r"\bMI2[15]0X?\b", "gfx90a"),
    (r"\bMI100\b", "gfx908"),
    (r"\bMI50\b|\bMI60\b", "gfx906"),
)
# firmware blocks one tool names differently from another
_BLOCK_ALIASES = {"cp_mec1": "mec", "cp_mec": "mec", "sdma0": "sdma", "sdma engine": "sdma", "cp_pfp": "pfp",
                  "cp_me": "me", "cp_ce": "ce", "rlc_g": "rlc"}
_DRIVER_KINDS = ("modinfo amdgpu", "amd-smi", "rocm-smi")


@dataclass(frozen=True)
class Contradiction:
    check: str
    fact: str
    values: dict[str, str]
    sentence: str

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "fact": self.fact, "values": dict(self.values), "sentence": self.sentence}


def _number(version: str) -> int | str:
    """'166', '0x000000a6' -> 166; other version strings compare as text."""
    version = version.strip()
    if re.fullmatch(r"0x[0-9a-fA-F]+", version):
        return int(version, 16)
    if re.fullmatch(r"\d+", version):
        return int(version)
    return version.upper()


def _where(groups: dict[Any, list[str]]) -> str:
    parts = []
    for value, places in groups.items():
        shown = ", ".join(places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
        parts.append(f"{value} on {shown}")
    return "; ".join(parts)


def firmware(inputs: list[tuple[str, list[str], dict[str, Any]]]) -> list[Contradiction]:
    """Every firmware block has one version across all GPUs of all inputs (within one input too)."""
    seen: dict[str, dict[Any, list[str]]] = {}
    shown: dict[str, dict[Any, str]] = {}
    for source, _kinds, facts in inputs:
        per_gpu = facts.get("firmware_by_gpu")
        if not isinstance(per_gpu, dict) or not per_gpu:
            whole = facts.get("firmware")
            per_gpu = {"": whole} if isinstance(whole, dict) else {}
        for gpu, blocks in per_gpu.items():
            for block, version in (blocks or {}).items():
                name = _BLOCK_ALIASES.get(block, block)
                key = _number(str(version))
                where = f"{source} {gpu}".strip() if len(inputs) > 1 else (gpu or source)
                seen.setdefault(name, {}).setdefault(key, []).append(where)
                shown.setdefault(name, {}).setdefault(key, str(version))
    out = []
    for block, all_groups in seen.items():
        # a hex/decimal number and a dotted version string are different encodings, not different versions
        for kind in (int, str):
            groups = {k: v for k, v in all_groups.items() if isinstance(k, kind)}
            if len(groups) < 2:
                continue
            readable = {shown[block][k]: v for k, v in groups.items()}
            out.append(Contradiction("firmware-uniform", f"firmware.{block}",
                                     {w: shown[block][k] for k, places in groups.items() for w in places},
                                     f"Firmware {block} is not the same on every GPU: {_where(readable)}."))
    return out


def _expected_gfx(model: str) -> str | None:
    for pattern, gfx in GFX_BY_MODEL:
        if re.search(pattern, model):
            return gfx
    return None


def gfx_vs_model(inputs: list[tuple[str, list[str], dict[str, Any]]]) -> list[Contradiction]:
    """rocminfo's gfx target(s) against the model (SKU/market name) and gfx target amd-smi or rocm-smi states."""
    rocminfo = [(s, f) for s, kinds, f in inputs if any(k.startswith("rocminfo") for k in kinds)]
    smi = [(s, f) for s, kinds, f in inputs if any(k.startswith(("amd-smi", "rocm-smi")) for k in kinds)]
    out = []
    for r_source, r_facts in rocminfo:
        targets = set(r_facts.get("gfx_targets") or [])
        if not targets:
            continue
        for s_source, s_facts in smi:
            if s_source == r_source:
                continue
            for model in s_facts.get("gpu_models") or []:
                gfx = _expected_gfx(model)
                if gfx and gfx not in targets:
                    out.append(Contradiction(
                        "gfx-vs-model", "gfx_targets",
                        {r_source: ", ".join(sorted(targets)), s_source: model},
                        f"rocminfo ({r_source}) reports {', '.join(sorted(targets))}, but {s_source} names the GPU "
                        f"{model}, which is {gfx}."))
            stated = set(s_facts.get("gfx_targets") or [])
            if stated and not stated & targets:
                out.append(Contradiction(
                    "gfx-vs-model", "gfx_targets",
                    {r_source: ", ".join(sorted(targets)), s_source: ", ".join(sorted(stated))},
                    f"rocminfo ({r_source}) reports {', '.join(sorted(targets))}, but {s_source} reports "
                    f"{', '.join(sorted(stated))}."))
    return out


def driver(inputs: list[tuple[str, list[str], dict[str, Any]]]) -> list[Contradiction]:
    """The amdgpu driver version modinfo states against the one amd-smi/rocm-smi report."""
    found = [(s, str(f["driver_version"]).strip(), kinds) for s, kinds, f in inputs if f.get("driver_version")
             and any(k.startswith(_DRIVER_KINDS) for k in kinds)]
    if not any("modinfo amdgpu" in kinds for _, _, kinds in found) or len({v for _, v, _ in found}) < 2:
        return []
    values = {s: v for s, v, _ in found}
    groups: dict[str, list[str]] = {}
    for s, v, _ in found:
        groups.setdefault(v, []).append(s)
    return [Contradiction("driver-version", "driver_version", values,
                          f"The amdgpu driver version differs between the outputs: {_where(groups)}.")]


def contradictions(inputs: list[tuple[str, list[str], dict[str, Any]]]) -> list[Contradiction]:
    """All checks over (source name, kinds, facts) of each input."""
    return firmware(inputs) + gfx_vs_model(inputs) + driver(inputs)
