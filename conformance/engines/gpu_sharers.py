"""Other jobs on the GPUs while the suite measures. A serving figure taken while another process shares the device
is that job's as much as the stack's (a CI runner that places two jobs on one GPU: every figure of each "regresses").
NVML (nvidia-ml-py) on CUDA and amdsmi on ROCm list the processes that hold
each GPU; a listed process is another's when it is neither this process nor one of its descendants (the server, its
engine core, the benchmark client).

In a container NVML reports the host's pids, which this process cannot tell apart from its own: a listing in which
none of the suite's own processes appears is of another pid namespace, and nothing is judged from it (None)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    used_mib: float | None = None
    name: str = ""

    def describe(self) -> str:
        held = f" holding {self.used_mib / 1024:.1f} GiB" if self.used_mib else ""
        return f"pid {self.pid} ({self.name or _comm(self.pid) or 'name unknown'}) on GPU {self.gpu}{held}"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _nvml() -> list[GpuProcess]:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
                used = p.usedGpuMemory  # None where the driver does not say (e.g. under some vGPUs)
                out.append(GpuProcess(i, int(p.pid), used / 2**20 if used else None))
        return out
    finally:
        pynvml.nvmlShutdown()


def _amdsmi() -> list[GpuProcess]:
    import amdsmi

    amdsmi.amdsmi_init()
    try:
        out = []
        for i, h in enumerate(amdsmi.amdsmi_get_processor_handles()):
            for item in amdsmi.amdsmi_get_gpu_process_list(h):
                info: Any = item if isinstance(item, dict) else amdsmi.amdsmi_get_gpu_process_info(h, item)  # ROCm 5.7
                vram = (info.get("memory_usage") or {}).get("vram_mem") or info.get("mem")
                name = info.get("name") if info.get("name") not in (None, "N/A") else ""
                out.append(GpuProcess(i, int(info["pid"]), vram / 2**20 if isinstance(vram, int | float) else None,
                                      str(name)))
        return out
    finally:
        amdsmi.amdsmi_shut_down()


def listed() -> list[GpuProcess] | None:
    """Every process holding a GPU now, by NVML or else amdsmi; None where neither can say (no library, no
    driver: the CPU default)."""
    for lister in (_nvml, _amdsmi):
        try:
            return lister()
        except Exception:  # noqa: BLE001 - ImportError, NVMLError_*, AmdSmiLibraryException: this lister cannot say
            continue
    return None


def own_pids() -> set[int]:
    """This process and its descendants (psutil comes with vLLM; without it, this process alone)."""
    try:
        import psutil
    except ImportError:
        return {os.getpid()}
    me = psutil.Process()
    pids = {me.pid}
    for child in me.children(recursive=True):
        pids.add(child.pid)
    return pids


def others(processes: list[GpuProcess] | None, own: set[int] | None = None) -> list[GpuProcess] | None:
    """The listed processes that are not the suite's, or None where that cannot be told: no listing, an empty one,
    or one in which none of the suite's own processes appears (another pid namespace, or a moment when the suite
    holds no GPU: then nothing is judged). Processes that have exited since the listing are left out."""
    if not processes:
        return None
    own = own_pids() if own is None else own
    if not any(p.pid in own for p in processes):
        return None
    return [p for p in processes if p.pid not in own and os.path.exists(f"/proc/{p.pid}")]


def now() -> list[GpuProcess] | None:
    """`others(listed())`."""
    return others(listed())


def merge(*readings: list[GpuProcess] | None) -> list[GpuProcess] | None:
    """The other processes seen in any reading (by GPU and pid), or None where no reading could tell."""
    told = [r for r in readings if r is not None]
    if not told:
        return None
    seen: dict[tuple[int, int], GpuProcess] = {}
    for reading in told:
        for p in reading:
            seen.setdefault((p.gpu, p.pid), p)
    return list(seen.values())
