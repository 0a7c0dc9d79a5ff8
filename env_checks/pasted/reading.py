"""What a reader of a pasted output returns (`Reading`), and the helpers the readers of several tools share.

A `Reading` is (kind, facts, unread). Facts use one vocabulary across tools: gpu_models, gpu_count (or
gpu_count_at_least when the paste elides devices), gfx_targets (normalised: `gfx942:sramecc+:xnack-` -> gfx942),
driver_version, rocm_version, hip_version, cuda_version, torch_version, vllm_version, kernel_release,
compute_partition, memory_partition, virtualization, firmware, ecc, vram_total_mib, device_ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from env_checks.tool_text import colon_pairs, json_start

_VERSION = re.compile(r"^\d+(\.\d+)+([-+.~][\w.+~-]*)?$")
ELIDED = re.compile(r"^\s*(\.\.\.|…)\s*$", re.MULTILINE)
BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_TARGET_ID = re.compile(r"\b(gfx[0-9a-f]{3,5}(?::(?:sramecc|xnack)[+-])+)")


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


def is_version(text: str | None) -> bool:
    return bool(text) and bool(_VERSION.match(text.strip()))


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


def first_values(text: str) -> dict[str, str]:
    """Each lower-case key's first value among the `key: value` lines (colon_pairs), at any indent."""
    fields: dict[str, str] = {}
    for _indent, key, value in colon_pairs(text):
        fields.setdefault(key, value)
    return fields


def _loaded(version: str) -> bool:
    """A firmware version that names loaded firmware: not empty, N/A, 0 or 0x00000000."""
    return bool(version) and version.upper() != "N/A" and not re.fullmatch(r"(0x)?0+", version)


def add_firmware(r: Reading, block: str, version: str) -> None:
    """One firmware block's version in `firmware` (the first statement wins)."""
    version = version.strip()
    if _loaded(version):
        r.facts.setdefault("firmware", {}).setdefault(block.strip().lower(), version)


def add_gpu_firmware(r: Reading, gpu: str, block: str, version: str) -> None:
    """The firmware of one GPU (`firmware_by_gpu`), kept apart so that a check can see GPUs disagree."""
    version = version.strip()
    if _loaded(version):
        r.facts.setdefault("firmware_by_gpu", {}).setdefault(gpu, {}).setdefault(block.strip().lower(), version)


def add_target_ids(text: str, r: Reading) -> None:
    """Full target ids with their feature suffixes ('gfx90a:sramecc+:xnack-'), as collect_env and HIP's
    NoBinaryForGpu/code-object lines print them: the bare gfx name alone hides an xnack mismatch."""
    for target in _TARGET_ID.findall(text):
        r.add("gfx_target_ids", target)
