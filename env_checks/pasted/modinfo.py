"""`modinfo amdgpu`, pasted: the driver version, the kernel it was built for (`vermagic`), whether it is the DKMS
driver or the in-tree module, and how many firmware files it names."""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading, first_values, is_version


def is_modinfo(text: str) -> bool:
    return bool(re.search(r"^filename:\s+\S*amdgpu\.ko", text, re.M))


def read_modinfo(text: str) -> Reading:
    r = Reading("modinfo amdgpu")
    fields = first_values(text)
    r.put("driver_version", fields.get("version") if is_version(fields.get("version")) else None)
    vermagic = fields.get("vermagic", "").split()
    r.put("kernel_release", vermagic[0] if vermagic else None)
    filename = fields.get("filename", "")
    r.put("driver_source", "DKMS (amdgpu-dkms)" if "/dkms/" in filename or "/updates/" in filename
          else ("in-tree kernel module" if filename else None))
    r.put("firmware_files", len(re.findall(r"^firmware:", text, re.MULTILINE)) or None)
    if not vermagic:
        r.unread.append("The modinfo output has no 'vermagic' line, so the kernel it was built for is unknown.")
    return r
