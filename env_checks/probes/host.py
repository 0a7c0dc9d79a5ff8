"""Host probes: kernel command line, NUMA balancing, device-node access, CPU, memory, OS, Python.

These are the host settings a GPU stack silently depends on: `iommu=pt` and NUMA auto-balancing off are
AMD's recommendations for MI300X, a user outside the `video`/`render` groups cannot open /dev/kfd or the
render nodes, and the CPU backend of vLLM needs AVX2/AVX-512 (AMX speeds up bf16 on Sapphire Rapids).
"""

from __future__ import annotations

import grp
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from env_checks.probes.facts import ProbeFailure, Unparseable, parse_with, read_text

# The CPU features that decide which kernels the CPU backends can use; the full flag list is noise.
CPU_FLAGS_OF_INTEREST = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "avx512_vnni",
    "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16",
)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


@dataclass
class KernelCmdline:
    """The boot parameters that matter to GPU work, with any secret-looking value redacted."""

    params: list[str]
    iommu: str | None
    amd_iommu: str | None
    amdgpu_options: dict[str, str] = field(default_factory=dict)


def parse_cmdline(text: str) -> KernelCmdline:
    params, iommu, amd_iommu, amdgpu = [], None, None, {}
    # Everything after a lone "--" goes to init, not the kernel.
    kernel_part = f" {text} ".split(" -- ", 1)[0]
    for token in kernel_part.split():
        key, _, value = token.partition("=")
        if value and is_secret_name(key):
            token = f"{key}=<redacted>"
        params.append(token)
        if key == "iommu":
            iommu = value
        elif key == "amd_iommu":
            amd_iommu = value
        elif key.startswith("amdgpu."):
            amdgpu[key.removeprefix("amdgpu.")] = value
    return KernelCmdline(params=params, iommu=iommu, amd_iommu=amd_iommu, amdgpu_options=amdgpu)


def parse_int_file(text: str) -> int:
    value = text.strip()
    if not re.fullmatch(r"-?\d+", value):
        raise Unparseable(f"not an integer: {value[:40]!r}")
    return int(value)


@dataclass
class CpuInfo:
    model: str | None
    logical_cpus: int
    flags: list[str]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model and interesting flags of the first CPU; x86 says 'flags', Arm says 'Features'."""
    model, flags, count = None, None, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            count += 1
        elif key in ("model name", "Model", "CPU part") and model is None:
            model = value.strip() or None
        elif key in ("flags", "Features") and flags is None:
            flags = set(value.split())
    if count == 0 or flags is None:
        raise Unparseable("no 'processor' entries with a flags/Features line")
    return CpuInfo(model=model, logical_cpus=count, flags=[f for f in CPU_FLAGS_OF_INTEREST if f in flags])


def parse_meminfo_total_kib(text: str) -> int:
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", text, re.MULTILINE)
    if not match:
        raise Unparseable("no MemTotal line")
    return int(match.group(1))


def parse_os_release(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "VERSION_ID", "PRETTY_NAME", "ID_LIKE"):
            fields[key.strip().lower()] = value.strip().strip('"')
    if "id" not in fields:
        raise Unparseable("no ID= line")
    return fields


@dataclass
class DeviceAccess:
    """Whether this process can open the GPU device nodes, and the groups that normally grant it."""

    uid: int
    groups: list[str]
    kfd: str
    render_nodes: dict[str, str]
    nvidia_nodes: dict[str, str]


def _access(path: Path) -> str:
    if not path.exists():
        return "absent"
    if os.access(path, os.R_OK | os.W_OK):
        return "rw"
    return "r" if os.access(path, os.R_OK) else "denied"


def _group_names() -> list[str]:
    names = set()
    for gid in {*os.getgroups(), os.getegid()}:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.add(str(gid))  # a gid without a name in this container's /etc/group
    return sorted(names)


def probe_device_access(dev: Path = Path("/dev")) -> DeviceAccess:
    dri = dev / "dri"
    renders = sorted(dri.glob("renderD*")) if dri.is_dir() else []
    nvidia = sorted(p for p in dev.glob("nvidia*") if not p.is_dir())
    return DeviceAccess(
        uid=os.geteuid(),
        groups=_group_names(),
        kfd=_access(dev / "kfd"),
        render_nodes={p.name: _access(p) for p in renders},
        nvidia_nodes={p.name: _access(p) for p in nvidia},
    )


def probe_cmdline() -> KernelCmdline | ProbeFailure:
    return parse_with("/proc/cmdline", parse_cmdline, read_text("/proc/cmdline"))


def probe_numa_balancing() -> int | ProbeFailure:
    path = "/proc/sys/kernel/numa_balancing"
    return parse_with(path, parse_int_file, read_text(path))


def probe_cpuinfo() -> CpuInfo | ProbeFailure:
    return parse_with("/proc/cpuinfo", parse_cpuinfo, read_text("/proc/cpuinfo"))


def probe_mem_total_kib() -> int | ProbeFailure:
    return parse_with("/proc/meminfo", parse_meminfo_total_kib, read_text("/proc/meminfo"))


def probe_os_release() -> dict[str, str] | ProbeFailure:
    return parse_with("/etc/os-release", parse_os_release, read_text("/etc/os-release"))


def _steps(n: int) -> int:
    table: dict[int, int] = {}
    acc = 0
    for i in range(n):
        table[i & 1023] = i
        acc += table.get((i * 7) & 1023, 0) & 3
    return acc


def single_thread_mops(n: int = 100_000, repeats: int = 7) -> float:
    """The host's speed on one core: million steps a second of a fixed pure-Python loop (dict and integer work, the
    kind of code an inference server's scheduler runs per step), the best of `repeats` timings of about 10 ms (the
    least disturbed). Hosts that fingerprint alike (CPU model string, cores, flags) can differ here; where a model is
    small for its GPU, serving figures follow it (conformance/verdicts/host_speed.py)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _steps(n)
        best = min(best, time.perf_counter() - start)
    return n / best / 1e6


def copy_gbs(mib: int = 64, repeats: int = 5) -> float:
    """The host's memory-copy speed: GB a second of one core copying a `mib` MiB buffer (a memcpy, larger than the
    caches), the best of `repeats` copies. Two H100 nodes that ran the single-thread probe alike (7.83 and 7.97) ran
    every host phase of P0 apart by about 1.5x, and copied a layer's weights on the host at 30 and 56 GB/s: a
    single-thread figure alone does not tell such hosts apart."""
    source, target = bytearray(os.urandom(1 << 20)) * mib, bytearray(mib << 20)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target[:] = source
        best = min(best, time.perf_counter() - start)
    return len(source) / best / 1e9


def host_speeds() -> dict[str, float]:
    """Both host probes, by the names a serving level records and pins them under (env_checks/baselines.py
    HOST_FIGURES; the run's fingerprint records the same two)."""
    return {"host_single_thread_mops": single_thread_mops(), "host_copy_gbs": copy_gbs()}


def kernel_release() -> str:
    return platform.release()


def python_version() -> str:
    impl = sys.implementation.name
    return platform.python_version() + ("" if impl == "cpython" else f" ({impl})")
