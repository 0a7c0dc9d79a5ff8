"""`update-alternatives --display rocm`, pasted: the ROCm in use (its path and version), the mode, every install."""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading


def is_update_alternatives(text: str) -> bool:
    return bool(re.search(r"^rocm - (auto|manual) mode\s*$", text, re.MULTILINE)) \
        or bool(re.search(r"^\s+link currently points to /\S*rocm", text, re.MULTILINE))


def read_update_alternatives(text: str) -> Reading:
    r = Reading("update-alternatives --display rocm")
    mode = re.search(r"^rocm - (auto|manual) mode", text, re.MULTILINE)
    r.put("rocm_alternative_mode", mode.group(1) if mode else None)
    current = re.search(r"^\s+link currently points to (\S+)", text, re.MULTILINE)
    if current:
        r.put("rocm_path", current.group(1))
        version = re.search(r"rocm-(\d+\.\d+(?:\.\d+)?)", current.group(1))
        r.put("rocm_version", version.group(1) if version else None)
    for path in re.findall(r"^(/\S+) - priority \d+", text, re.MULTILINE):
        r.add("rocm_installs", path)
    if not current:
        r.unread.append("The 'link currently points to' line is not in the paste, so the ROCm in use could not be "
                        "read.")
    return r
