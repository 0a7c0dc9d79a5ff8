"""A kernel log, pasted (dmesg in any of its time formats, `journalctl -k`, a boot log with other drivers' lines).

Facts: the kernel release, the GPUs the log names, the NVIDIA driver and amdgpu DRM versions, the time span it covers;
then the faults of amdgpu per device (PCI BDF): GPU page faults (hub, process and the UTCL2 client that faulted), the
RAS/ACA uncorrectable-error events (event, ACA registers), probe failures (error code) and IP-discovery failures; then
the PCI device id amdgpu prints when it starts on a GPU (`initializing kernel modesetting (IP DISCOVERY 0x1002:0x74A1
...)`), the rings that timed out and whose reset failed (the hung IP a MES or ring reset was about), the MES messages
that went unanswered, the reset method (BACO, MODE1, MODE2), the IP blocks that failed to suspend and the KFD's
`qcm fence wait loop timeout` count. Every value is copied from the text as it stands; what a cut copy leaves unknown
is one sentence in `unread`.
"""

from __future__ import annotations

import re
from typing import Any

from env_checks.pasted.reading import BDF, Reading
from env_checks.probes.kernel_log import parse as parse_lines

_KERNEL_LINE = re.compile(r"^(\[\s*\d+\.\d+\]|\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]|\w{3} +\d+ [\d:]+ \S+ kernel:"
                          r"|\d{4}-\d\d-\d\dT[\d:.,]+\S* \S+ kernel:|kern +:\w+ *:)", re.MULTILINE)


def is_kernel_log(text: str) -> bool:
    return len(_KERNEL_LINE.findall(text)) >= 1 \
        and bool(re.search(r"amdgpu|NVRM|vfio|\[drm|kernel|^kern |segfault at", text, re.M))


def read_kernel_log(text: str) -> Reading:
    r = Reading("kernel log")
    lines = [line for line in text.splitlines() if line.strip()]
    r.put("lines", len(lines))
    release = re.search(r"Linux version (\S+)", text)
    r.put("kernel_release", release.group(1) if release else None)
    amdgpu = {m.lower() for m in re.findall(r"amdgpu (\d{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d)", text, re.IGNORECASE)}
    nvidia = {m.lower() for m in re.findall(r"NVRM: (?:Xid \()?(?:GPU at )?PCI:(\d{4}:[0-9a-f]{2}:[0-9a-f]{2})",
                                            text, re.IGNORECASE)}
    if amdgpu or nvidia:
        r.put("gpus_named_in_log", len(amdgpu | nvidia))
    nv = re.search(r"NVRM: loading NVIDIA UNIX \S+ Kernel Module\s+(\S+)", text)
    r.put("driver_version", nv.group(1) if nv else None)
    init = re.search(r"Initialized amdgpu (\S+)", text)
    r.put("amdgpu_drm_version", init.group(1) if init else None)
    try:  # the kernel-log probe's line parser gives the time span the paste covers
        stamps = [line.boot_s for line in parse_lines(text) if getattr(line, "boot_s", None) is not None]
        if stamps:
            r.put("span_s", round(max(stamps) - min(stamps), 3))
    except Exception:  # noqa: BLE001 - the span is optional; the signature scan does not need it
        pass
    _amdgpu_faults(text, r)
    _amdgpu_start_and_resets(text, r)
    return r


# ---------------------------------------------------------------- amdgpu faults: page faults, RAS/ACA, probe

# what precedes the message: "amdgpu 0000:c2:00.0: amdgpu: " (the second "amdgpu: " is absent on some kernels)
_DEV = rf"amdgpu ({BDF}): (?:amdgpu: )?"
_FAULT = re.compile(_DEV + r"\[(gfxhub|mmhub|vmhub)(\d*)\] (?:(no-retry|retry) )?page fault \(src_id:\d+ ring:\d+ "
                    r"vmid:(\d+) pasid:(\d+)(?:, for process (\S*) pid (\d+) thread \S* pid \d+)?\)")
_PROCESS = re.compile(_DEV + r"\s+(?:Process|for process|in process) (\S+) pid (\d+) thread \S+ pid \d+\)?\s*$")
_CLIENT = re.compile(_DEV + r"\s*Faulty UTCL2 client ID: (\S.*?)\s*$")
_UNCORRECTABLE = re.compile(_DEV + r"(?:\{\d+\})?uncorrectable hardware error\((\w+)\) detected")
_ACA = re.compile(_DEV + r"(?:\{\d+\})?\[Hardware Error\]: aca entry\[(\d+)\]\.(\w+)=(0x[0-9a-fA-F]*)\s*$")
_ACA_LOGGED = re.compile(_DEV + r"(?:\{\d+\})?\[Hardware Error\]: Accelerator Check Architecture events logged")
_PROBE = re.compile(rf"amdgpu: probe of ({BDF}) failed with error (-\d+)")
_DISCOVERY = re.compile(rf"(?:amdgpu ({BDF}): (?:amdgpu: )?)?((?:get )?invalid ip discovery binary "
                        r"(?:signature|checksum)(?: from vram)?|failed to read ip discovery binary from file"
                        r"|amdgpu_discovery_init failed|IP discovery init failed)")
ERRNO = {"-2": "ENOENT", "-5": "EIO", "-12": "ENOMEM", "-16": "EBUSY", "-19": "ENODEV", "-22": "EINVAL",
         "-62": "ETIME", "-110": "ETIMEDOUT"}


def _amdgpu_faults(text: str, r: Reading) -> None:
    """The faults of an amdgpu kernel log, per device (BDF): page faults, RAS/ACA events, probe and IP-discovery
    failures; `pci_bdfs` are the amdgpu devices the log names."""
    for bdf in re.findall(rf"amdgpu ({BDF}):", text):
        r.add("pci_bdfs", bdf)
    _page_faults(text, r)
    _ras(text, r)
    _probe(text, r)


def _page_faults(text: str, r: Reading) -> None:
    faults: dict[tuple[str, str], dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}  # the most recent fault of each device: the lines after it describe it
    since: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines()):
        header = _FAULT.search(line)
        if header:
            bdf, hub, index, retry, _vmid, _pasid, process, pid = header.groups()
            fault = faults.setdefault((bdf, hub + index), {"device": bdf, "hub": hub + index, "count": 0,
                                                            "processes": [], "clients": []})
            fault["count"] += 1
            if retry:
                fault["retry"] = retry
            if process:
                _add(fault["processes"], f"{process} pid {pid}")
            fault["_reported"] = fault.get("_reported", 0) + 1
            last[bdf], since[bdf] = fault, lineno
            continue
        process_line = _PROCESS.search(line)
        if process_line and process_line.group(1) in last and lineno - since[process_line.group(1)] <= 2:
            _add(last[process_line.group(1)]["processes"], f"{process_line.group(2)} pid {process_line.group(3)}")
            continue
        client = _CLIENT.search(line)
        if client and client.group(1) in last:
            fault = last.pop(client.group(1))  # one client line per fault report
            _add(fault["clients"], client.group(2))
            fault["_described"] = fault.get("_described", 0) + 1
    if not faults:
        return
    unclear = sum(f.pop("_reported", 0) - f.pop("_described", 0) for f in faults.values())
    listed = list(faults.values())
    r.put("page_faults", listed)
    for fault in listed:
        r.add("page_fault_hubs", fault["hub"])
        for process in fault["processes"]:
            r.add("page_fault_processes", process)
        for client in fault["clients"]:
            r.add("page_fault_clients", client)
    if unclear > 0:
        r.unread.append(f"{unclear} page fault report(s) end before their 'Faulty UTCL2 client ID' line (the paste "
                        "is cut there), so the client that faulted is not known for them.")


def _add(values: list[str], value: str) -> None:
    if value and value not in values:
        values.append(value)


def _ras(text: str, r: Reading) -> None:
    for bdf, event in _UNCORRECTABLE.findall(text):
        r.add("ras_uncorrectable_devices", bdf)
        r.add("ras_uncorrectable_events", event)
    for bdf in _ACA_LOGGED.findall(text):
        r.add("aca_devices", bdf)
    entries: dict[tuple[str, str], dict[str, str]] = {}
    cut = 0
    for line in text.splitlines():
        aca = _ACA.search(line)
        if not aca:
            continue
        bdf, entry, register, value = aca.groups()
        if len(value) != 18:  # ACA registers are 64-bit, printed as 0x and 16 hex digits: a shorter one is cut
            cut += 1
            continue
        entries.setdefault((bdf, entry), {"device": bdf, "entry": entry})[register.lower()] = value
    if entries:
        r.put("aca_entries", list(entries.values()))
    if cut:
        r.unread.append(f"{cut} ACA register value(s) are shorter than 16 hex digits (the paste is cut there) and "
                        "were not read.")


def _probe(text: str, r: Reading) -> None:
    failures = [{"device": bdf, "error": code, **({"errno": ERRNO[code]} if code in ERRNO else {})}
                for bdf, code in _PROBE.findall(text)]
    if failures:
        r.put("probe_failures", failures)
        for failure in failures:
            r.add("probe_error_codes", failure["error"])
    discovery = _DISCOVERY.findall(text)
    if discovery:
        for _bdf, message in discovery:
            r.add("ip_discovery_errors", message)
        if not failures:
            r.unread.append("The log shows the IP discovery failure but no 'probe of ... failed with error' line, "
                            "so the probe error code is not in the text.")


# ---------------------------------------------------------------- amdgpu start, ring and MES resets, IP suspend

_IP_DISCOVERY = re.compile(r"initializing kernel modesetting \(IP DISCOVERY (0x[0-9a-fA-F]{4}):(0x[0-9a-fA-F]{4}) "
                           r"(0x[0-9a-fA-F]{4}):(0x[0-9a-fA-F]{4}) (0x[0-9a-fA-F]{2})\)")
_RING_TIMEOUT = re.compile(r"ring (\S+) timeout, signaled seq=\d+, emitted seq=\d+")
_RING_RESET = re.compile(r"Ring (\S+) reset (succeeded|failed)")
_MES = re.compile(r"MES failed to respon\w* (?:to )?msg=(\w+)")
_RESET_METHOD = re.compile(r"(?:GPU |amdgpu: )(BACO|MODE1|MODE2) reset\b")
_SUSPEND = re.compile(r"suspend of IP block <(\w+)> failed (-?\d+)")


def _amdgpu_start_and_resets(text: str, r: Reading) -> None:
    for _vendor, device, _sub_vendor, _sub_device, _revision in _IP_DISCOVERY.findall(text):
        r.add("device_ids", device)
    for ring in _RING_TIMEOUT.findall(text):
        r.add("timed_out_rings", ring)
    for ring, outcome in _RING_RESET.findall(text):
        r.add("ring_resets_failed" if outcome == "failed" else "ring_resets_succeeded", ring)
    for message in _MES.findall(text):
        r.add("mes_unanswered_messages", message)
    for method in _RESET_METHOD.findall(text):
        r.add("gpu_reset_methods", method)
    for block, code in _SUSPEND.findall(text):
        r.add("ip_suspend_failures", f"{block} {code}")
    fences = len(re.findall(r"qcm fence wait loop timeout expired", text))
    r.put("qcm_fence_timeouts", fences or None)
