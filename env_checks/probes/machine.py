"""The machine below the stack, read from sysfs and /proc without any vendor tool (so it works when amd-smi or
nvidia-smi are missing or hung): the GPUs on the PCI bus, virtual functions, partition modes and the amdgpu
RAS error counters.

- PCI: every function of vendor 0x1002 (AMD) or 0x10de (NVIDIA) whose class is display (0x03) or processing
  accelerator (0x12): its device id, and whether it is an SR-IOV virtual function seen from the host (a
  `physfn` link). Inside a guest a VF looks like any device; the CPU's `hypervisor` flag says a VM, the device
  id (listed per SKU in the pin manifests as `vf_device_ids`) or a product name ending in "VF" says a VF.
- Partitions: amdgpu publishes `current_compute_partition` (SPX, DPX, QPX, CPX) and
  `current_memory_partition` (NPS1, NPS4) per card under /sys/class/drm/card*/device.
- RAS: amdgpu publishes `ras/<block>_err_count` ("ue: N" / "ce: N") per card when RAS is enabled; a VF and a
  driver without RAS publish none (recorded as such, not as zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

GPU_VENDORS = {"0x1002": "amd", "0x10de": "nvidia"}
GPU_CLASSES = ("0x03", "0x12")


@dataclass
class PciGpu:
    address: str
    vendor: str
    device_id: str
    is_vf: bool  # an SR-IOV virtual function as the host sees it (has a physfn link)
    driver: str | None = None


@dataclass
class DrmCard:
    card: str
    pci_address: str | None
    compute_partition: str | None = None
    memory_partition: str | None = None
    # block -> {"ue": n, "ce": n}; None when the card publishes no RAS counters
    ras: dict[str, dict[str, int]] | None = None


@dataclass
class Machine:
    pci_gpus: list[PciGpu] = field(default_factory=list)
    cards: list[DrmCard] = field(default_factory=list)
    hypervisor: bool | None = None

    @property
    def virtualization(self) -> str:
        """"bare_metal", "vm" (a guest, passthrough or VF: see the device ids) or "vf_host" (VFs on a host)."""
        if any(g.is_vf for g in self.pci_gpus):
            return "vf_host"
        if self.hypervisor:
            return "vm"
        return "bare_metal" if self.hypervisor is False else "unknown"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def pci_gpus(root: Path = Path("/sys/bus/pci/devices")) -> list[PciGpu]:
    out = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    for dev in entries:
        vendor, cls = _read(dev / "vendor"), _read(dev / "class")
        if vendor not in GPU_VENDORS or not cls or not cls.startswith(GPU_CLASSES):
            continue
        driver = (dev / "driver").resolve().name if (dev / "driver").exists() else None
        out.append(PciGpu(dev.name, GPU_VENDORS[vendor], _read(dev / "device") or "", (dev / "physfn").exists(),
                          driver))
    return out


def parse_err_count(text: str) -> dict[str, int]:
    """amdgpu's `ras/*_err_count`: 'ue: 0\\nce: 3' -> {'ue': 0, 'ce': 3} (lines it cannot read are skipped)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("ue", "ce", "de") and value.strip().isdigit():
            out[key.strip()] = int(value.strip())
    return out


def drm_cards(root: Path = Path("/sys/class/drm")) -> list[DrmCard]:
    out = []
    try:
        cards = sorted(p for p in root.iterdir() if p.name.startswith("card") and p.name[4:].isdigit())
    except OSError:
        return out
    for card in cards:
        dev = card / "device"
        ras_dir = dev / "ras"
        ras = None
        if ras_dir.is_dir():
            ras = {p.name.removesuffix("_err_count"): parse_err_count(_read(p) or "")
                   for p in sorted(ras_dir.glob("*_err_count"))}
        out.append(DrmCard(card.name, dev.resolve().name if dev.exists() else None,
                           _read(dev / "current_compute_partition"), _read(dev / "current_memory_partition"), ras))
    return out


def has_hypervisor(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    text = _read(cpuinfo)
    if text is None:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return None if flags is None else "hypervisor" in flags


def probe_machine(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> Machine:
    return Machine(pci_gpus(sys_root / "bus" / "pci" / "devices"), drm_cards(sys_root / "class" / "drm"),
                   has_hypervisor(proc_root / "cpuinfo"))


def ras_totals(cards: list[DrmCard]) -> dict[str, int] | None:
    """Uncorrectable / correctable / deferred counts summed over every card and block; None without RAS."""
    with_ras = [c.ras for c in cards if c.ras is not None]
    if not with_ras:
        return None
    totals = {"ue": 0, "ce": 0, "de": 0}
    for ras in with_ras:
        for counts in ras.values():
            for key, value in counts.items():
                totals[key] += value
    return totals
