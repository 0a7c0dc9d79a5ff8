"""Facts of the faults a pasted kernel log or HIP runtime log states (issue 39): the GPU page faults (hub, device,
process and the UTCL2 client that faulted), the RAS/ACA uncorrectable-error events (device, event, ACA registers),
the probe failures (device and error code) and IP-discovery failures of amdgpu; the gfx target, with its feature
suffixes, that HIP found no code object for (`hipErrorNoBinaryForGpu`, `No compatible code objects found for`,
ROCm 6's `Missing CO for these ISAs` / `Cannot find CO in the bundle`) and the libraries that lack it;
and the paths `hipconfig` prints.

Same contract as `textforms`: every value is copied from the text as it stands; what a cut copy leaves unknown is
one sentence in `unread`.
"""

from __future__ import annotations

import re
from typing import Any

from env_checks.textforms import Reading

BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
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


def enrich_kernel_log(text: str, r: Reading) -> None:
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


# ---------------------------------------------------------------- HIP runtime log (AMD_LOG_LEVEL, NoBinaryForGpu)

_HIP_LINE = re.compile(r"^:\d:[\w.]+\.cpp\s*:\s*\d+\s*:", re.MULTILINE)
_NO_CODE_OBJECT = re.compile(r"No compatible code objects found for: (gfx[0-9a-z]+(?::(?:sramecc|xnack)[+-])*)")
_DEVICE_NOT_FOUND = re.compile(r"amdgcn-amd-amdhsa--(gfx[0-9a-z]+(?::(?:sramecc|xnack)[+-])*) - \[Not Found\]")
# ROCm 6's hip_fatbin.cpp: "Cannot find CO in the bundle <library> for ISA: amdgcn-amd-amdhsa--<target>", then
# "Missing CO for these ISAs - " with one target per following log line
_TARGET = r"gfx[0-9a-z]+(?::(?:sramecc|xnack)[+-])*"
_CANNOT_FIND = re.compile(rf"Cannot find CO in the bundle (\S+) for ISA: amdgcn-amd-amdhsa--({_TARGET})")
_MISSING_HEAD = re.compile(r"Missing CO for these ISAs -\s*$")
_MISSING_ITEM = re.compile(rf"^(?:.*\]|\s*:\d:\S+\s*:\s*\d+\s*:[^:]*:)?\s+amdgcn-amd-amdhsa--({_TARGET})\s*$")
_BUNDLED = re.compile(r"\b(?:hipv4|hip|openmp)-amdgcn-amd-amdhsa-[\w.-]*?-(gfx[0-9a-z]+(?::(?:sramecc|xnack)[+-])*)"
                      r" - \[")


def is_hip_log(text: str) -> bool:
    return bool(_HIP_LINE.search(text)) or "hipErrorNoBinaryForGpu" in text or bool(_NO_CODE_OBJECT.search(text))


def _missing_co(text: str) -> list[str]:
    """The targets of ROCm 6's 'Cannot find CO in the bundle ... for ISA:' lines and of the lines listed under
    'Missing CO for these ISAs -'."""
    targets = [target for _bundle, target in _CANNOT_FIND.findall(text)]
    listing = False
    for line in text.splitlines():
        item = _MISSING_ITEM.match(line) if listing else None
        if item:
            targets.append(item.group(1))
        listing = bool(item) or bool(_MISSING_HEAD.search(line))
    return targets


def read_hip_log(text: str) -> Reading:
    """The targets HIP found no code object for (with their xnack/sramecc suffixes) and the targets the binary
    carries: the two sides of a NoBinaryForGpu mismatch."""
    r = Reading("HIP runtime log")
    for target in _DEVICE_NOT_FOUND.findall(text) + _NO_CODE_OBJECT.findall(text) + _missing_co(text):
        r.add("hip_targets_without_code_object", target)
        if ":" in target:
            r.add("gfx_target_ids", target)
        r.add("gfx_targets", target.split(":")[0])
    for target in _BUNDLED.findall(text):
        r.add("bundled_code_object_targets", target)
    for bundle, _target in _CANNOT_FIND.findall(text):
        r.add("hip_bundles_without_code_object", bundle)
    if "hipErrorNoBinaryForGpu" in text:
        r.put("hip_error", "hipErrorNoBinaryForGpu")
        if "hip_targets_without_code_object" not in r.facts:
            r.unread.append("The NoBinaryForGpu error is shown without its 'Devices:' list (rerun with "
                            "AMD_LOG_LEVEL=1 or higher to see it), so the GPU target it failed for is not named.")
    missing = r.facts.get("hip_targets_without_code_object", [])
    bundled = r.facts.get("bundled_code_object_targets", [])
    near = sorted({b for b in bundled for m in missing if b.split(":")[0] == m.split(":")[0] and b != m})
    if near:
        r.put("bundled_with_other_features", near)
    return r


# ---------------------------------------------------------------- hipconfig --full: the paths it prints


def enrich_hipconfig(text: str, r: Reading) -> None:
    for fact, label in (("hip_path", "HIP_PATH"), ("rocm_path", "ROCM_PATH"), ("hip_clang_path", "HIP_CLANG_PATH"),
                        ("hip_runtime", "HIP_RUNTIME"), ("hip_compiler", "HIP_COMPILER")):
        found = re.search(rf"^{label}\s*:\s*(\S.*?)\s*$", text, re.MULTILINE)
        r.put(fact, found.group(1) if found else None)
    kernel = re.search(r"^Linux \S+ (\d+\.\d+\.\d+\S*) #", text, re.MULTILINE)
    r.put("kernel_release", kernel.group(1) if kernel else None)
