"""Machine health before and after a run: a snapshot of what can go wrong below the stack, and the diff.

A snapshot holds the kernel log (see env_checks.probes.kernel_log; "denied" is recorded as such), the kernel-log
signatures since boot (env_checks.signatures, `source = "kernel"`), the GPUs on the PCI bus and the count a
vendor tool sees, virtualization, partition modes, amdgpu boot options, RAS/ECC counters (amdgpu sysfs,
`amd-smi metric --ecc`, `nvidia-smi` ECC and row-remapping counters), retired pages (`amd-smi bad-pages`)
and firmware versions. Every fact a probe could not read is explained under `why_missing`.

`diff(before, after)` lists what happened during the run, each as a `Finding` with an id: kernel-log lines
printed after the first snapshot that match a kernel signature (fault or warning, as the catalogue says), new
uncorrectable errors, retired pages or remapped rows (faults), new correctable errors (warnings), a GPU count
or partition that changed, a health probe that answered before and not after (a hung GPU often shows so).
Whether faults fail the run is the caller's policy (per target, as data).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from env_checks import signatures
from env_checks.probes import amd_smi, host, kernel_log, machine
from env_checks.probes.facts import ProbeFailure, int_or_none, parse_with, run_tool

NVIDIA_FIELDS = ("index", "pci.bus_id", "vbios_version", "inforom.img", "ecc.errors.corrected.volatile.total",
                 "ecc.errors.uncorrected.volatile.total", "remapped_rows.correctable",
                 "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure")
MAX_DURING_RUN_LINES = 200


@dataclass
class Finding:
    id: str
    severity: str  # "fault" | "warning" | "info"
    title: str
    detail: str
    source: str  # "kernel" | "ras" | "devices" | "probe"
    cause: str = ""
    remedy: str = ""
    link: str | None = None
    count: int = 1


@dataclass
class Snapshot:
    record: dict[str, Any]
    kernel: kernel_log.KernelLog = field(repr=False)


def parse_nvidia_health(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=<NVIDIA_FIELDS> --format=csv,noheader,nounits` as one dict per GPU."""
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    if not rows or any(len(r) != len(NVIDIA_FIELDS) for r in rows):
        raise ValueError(f"expected {len(NVIDIA_FIELDS)} fields per line")
    out = []
    for row in rows:
        cell = dict(zip(NVIDIA_FIELDS, (c.strip() for c in row), strict=True))
        counts = {k: int_or_none(cell[k]) for k in NVIDIA_FIELDS[4:]}
        out.append({"index": int(cell["index"]), "pci_bus_id": cell["pci.bus_id"],
                    "firmware": {"vbios": cell["vbios_version"], "inforom_image": cell["inforom.img"]}, **counts})
    return out


def parse_amd_smi_ecc(text: str) -> list[dict[str, Any]]:
    """`amd-smi metric --ecc --json` (JSON or text): per GPU the total correctable / uncorrectable / deferred."""
    out = []
    for g in amd_smi.parse_smi_tree(text):
        ecc = g.get("ecc") or {}
        if not isinstance(ecc, dict):
            raise ValueError(f"GPU {g.get('gpu')}: ecc is not a table")
        counts: dict[str, Any] = {"gpu": int(g["gpu"])}
        totals = {k: v for k, v in ecc.items() if k.startswith("total_")}  # the per-block counts add up to these
        for key, value in (totals or ecc).items():
            for kind in ("uncorrectable", "correctable", "deferred"):
                if kind in key and (kind != "correctable" or "uncorrectable" not in key):
                    counts[kind] = int_or_none(str(value.get("value") if isinstance(value, dict) else value))
        out.append(counts)
    return out


def _tool(argv: list[str], parser: Any) -> Any:
    result = parse_with(argv[0], parser, run_tool(argv))
    return result.as_dict() if isinstance(result, ProbeFailure) else result


def _vendor_probes() -> dict[str, Any]:
    jobs = {
        "nvidia": (["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"],
                   parse_nvidia_health),
        "amd_ecc": (["amd-smi", "metric", "--ecc", "--json"], parse_amd_smi_ecc),
        "amd_bad_pages": (["amd-smi", "bad-pages", "--json"], amd_smi.parse_amd_smi_bad_pages),
        "amd_firmware": (["amd-smi", "firmware", "--json"], amd_smi.parse_amd_smi_firmware),
    }
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {k: pool.submit(_tool, argv, parser) for k, (argv, parser) in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def _ok(value: Any) -> bool:
    return not (isinstance(value, dict) and "status" in value and "tool" in value)


def snapshot(extra_kernel_lines: str | Path | None = None, probes: dict[str, Any] | None = None,
             found: machine.Machine | None = None, log: kernel_log.KernelLog | None = None) -> Snapshot:
    """Take a snapshot of this machine (the arguments replace the real probes in tests)."""
    uptime = kernel_log.uptime_s()
    taken = datetime.now(timezone.utc)
    log = log if log is not None else kernel_log.read(extra_kernel_lines)
    found = found if found is not None else machine.probe_machine()
    probes = probes if probes is not None else _vendor_probes()
    why: dict[str, str] = {}
    nv, ecc, bad, fw = (probes.get(k) for k in ("nvidia", "amd_ecc", "amd_bad_pages", "amd_firmware"))
    for name, value in probes.items():
        if not _ok(value):
            why[name] = value["detail"]
    if log.status != "ok":
        why["kernel_log"] = log.detail
    firmware: dict[str, Any] = {}
    if _ok(fw) and fw is not None:
        firmware = {f"gpu{g.gpu}": g.versions for g in fw.gpus}
    elif _ok(nv) and nv is not None:
        firmware = {f"gpu{g['index']}": g["firmware"] for g in nv}
    retired = None
    if _ok(bad) and bad is not None and all(g.retired is not None for g in bad.gpus):
        retired = sum(g.retired for g in bad.gpus)
    cmdline = host.probe_cmdline()
    record = {
        "taken_at": taken.isoformat(timespec="seconds"),
        "uptime_s": uptime,
        "kernel_log": log.as_dict(),
        "kernel_signatures_since_boot": [m.as_dict() for m in _kernel_matches(log.lines)],
        "pci_gpus": [asdict(g) for g in found.pci_gpus],
        "gpu_count_pci": sum(1 for g in found.pci_gpus if not g.is_vf),
        "gpu_count_tool": len(nv) if _ok(nv) and nv else len(fw.gpus) if _ok(fw) and fw else None,
        "virtualization": found.virtualization,
        "compute_partitions": [c.compute_partition for c in found.cards if c.compute_partition],
        "memory_partitions": [c.memory_partition for c in found.cards if c.memory_partition],
        "amdgpu_options": {} if isinstance(cmdline, ProbeFailure) else cmdline.amdgpu_options,
        "ras_sysfs": machine.ras_totals(found.cards),
        "ecc_amd_smi": ecc if _ok(ecc) else None,
        "ecc_nvidia": [{k: v for k, v in g.items() if k != "firmware"} for g in nv] if _ok(nv) and nv else None,
        "retired_pages": retired,
        "firmware": firmware,
        "why_missing": why,
    }
    return Snapshot(record, log)


def _kernel_matches(lines: list[kernel_log.KernelLine]) -> list[signatures.Match]:
    if not lines:
        return []
    return signatures.match("\n".join(x.text for x in lines), source="kernel")


def lines_during(before: Snapshot, after: Snapshot) -> list[kernel_log.KernelLine]:
    """Lines of the second log printed after the first snapshot; unstamped ones count when they are new."""
    started = datetime.fromisoformat(before.record["taken_at"])
    seen = Counter((x.text, x.boot_s, x.wall) for x in before.kernel.lines)
    out = []
    for line in after.kernel.lines:
        when = line.after(before.record["uptime_s"], started)
        key = (line.text, line.boot_s, line.wall)
        if when is None and seen[key] > 0:
            seen[key] -= 1
            continue
        if when is not False:
            out.append(line)
    return out


def _count_findings(before: dict, after: dict) -> list[Finding]:
    out: list[Finding] = []

    def grew(what: str, b: Any, a: Any, fid: str, severity: str, title: str, remedy: str) -> None:
        if isinstance(b, int) and isinstance(a, int) and a > b:
            out.append(Finding(fid, severity, title, f"{what}: {b} before the run, {a} after", "ras",
                               remedy=remedy, count=a - b))

    rma = "Drain the node; amd-smi bad-pages / nvidia-smi -q -d ECC,ROW_REMAPPER show the pages; open a support case."
    b_ras, a_ras = before.get("ras_sysfs") or {}, after.get("ras_sysfs") or {}
    grew("amdgpu RAS uncorrectable (sysfs ue)", b_ras.get("ue"), a_ras.get("ue"), "ras-uncorrectable-new", "fault",
         "new uncorrectable memory errors", rma)
    grew("amdgpu RAS correctable (sysfs ce)", b_ras.get("ce"), a_ras.get("ce"), "ras-correctable-new", "warning",
         "new correctable memory errors", "Watch the counter; a rising rate precedes page retirement.")
    grew("retired pages (amd-smi bad-pages)", before.get("retired_pages"), after.get("retired_pages"),
         "retired-pages-new", "fault", "pages retired during the run", rma)
    for key, label in (("ecc_amd_smi", "gpu"), ("ecc_nvidia", "index")):
        b_by = {g[label]: g for g in before.get(key) or []}
        for g in after.get(key) or []:
            b = b_by.get(g[label], {})
            for field_name, value in g.items():
                if field_name in (label, "pci_bus_id"):
                    continue
                hard = "uncorrect" in field_name or field_name.endswith(("pending", "failure"))
                fid = ("ras-uncorrectable-new" if "uncorrect" in field_name and "remapped" not in field_name
                       else "row-remap-new" if "remapped" in field_name and hard
                       else "ras-correctable-new")
                grew(f"GPU {g[label]} {field_name}", b.get(field_name), value, fid,
                     "fault" if hard else "warning", fid.replace("-", " "), rma)
    return out


def diff(before: Snapshot, after: Snapshot) -> tuple[list[Finding], list[dict[str, Any]]]:
    """(findings, kernel-log lines printed during the run, as dicts) between two snapshots."""
    during = lines_during(before, after)
    findings = [Finding(m.id, m.severity, m.title, m.line, "kernel", m.cause, m.remedy, m.link, m.count)
                for m in _kernel_matches(during) if m.severity in ("fault", "warning")]
    b, a = before.record, after.record
    findings += _count_findings(b, a)
    for key, title in (("gpu_count_pci", "GPU count on the PCI bus"), ("gpu_count_tool", "GPU count the tool sees"),
                       ("compute_partitions", "compute partition mode"),
                       ("memory_partitions", "memory partition mode")):
        if b.get(key) is not None and a.get(key) is not None and b[key] != a[key]:
            findings.append(Finding(f"{key.replace('_', '-')}-changed", "fault", f"{title} changed",
                                    f"{title}: {b[key]} before the run, {a[key]} after", "devices",
                                    remedy="A GPU fell off the bus or was reset/repartitioned; see the kernel log."))
    for name in ("nvidia", "amd_ecc", "amd_bad_pages", "amd_firmware"):
        if name not in b["why_missing"] and name in a["why_missing"]:
            findings.append(Finding("health-probe-lost", "fault", f"{name} answered before the run, not after",
                                    a["why_missing"][name], "probe",
                                    remedy="A GPU that hangs after a run stops answering its SMI tool; check dmesg."))
    if b.get("firmware") and a.get("firmware") and b["firmware"] != a["firmware"]:
        findings.append(Finding("firmware-changed", "warning", "firmware versions changed during the run",
                                "the firmware table differs between the snapshots", "devices"))
    lines = [asdict(x) for x in during[-MAX_DURING_RUN_LINES:]]
    return findings, lines
