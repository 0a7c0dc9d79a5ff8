"""CPU features that decide which vLLM-CPU kernels exist on a host, read from /proc/cpuinfo. AMX (amx_tile) is
what vLLM-CPU's MXFP4 MoE backend needs: expectations key the MXFP4 skip on `cpu_amx = false`, not on
"any CPU"."""

from __future__ import annotations

from pathlib import Path


def flags(cpuinfo: str | None = None) -> set[str] | None:
    """The first CPU's flags (x86 `flags`, Arm `Features`); None when /proc/cpuinfo cannot be read or has none."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def amx(cpuinfo: str | None = None) -> bool | None:
    """Whether the host has AMX tiles (Sapphire Rapids and later); None when unknown."""
    found = flags(cpuinfo)
    return None if found is None else "amx_tile" in found


def vector_isa(cpuinfo: str | None = None) -> str:
    """The widest x86 vector ISA of the host, as vLLM-CPU chooses its kernel library by it."""
    found = flags(cpuinfo)
    if found is None:
        return "unknown"
    if {"avx512f", "avx512_bf16"} <= found:
        return "avx512_bf16"
    return "avx512" if "avx512f" in found else "avx2" if "avx2" in found else "other"
