"""HIP and CUDA errors, pasted: a HIP runtime log (`AMD_LOG_LEVEL`, `hipErrorNoBinaryForGpu`, `No compatible code
objects found for`, ROCm 6's `Missing CO for these ISAs` / `Cannot find CO in the bundle`) and an error trace (a
Python traceback, a `...Error: ...` line of HIP or CUDA).

Facts of a HIP log: the gfx targets, with their feature suffixes, that HIP found no code object for and the libraries
that lack it, the targets the binary carries: the two sides of a NoBinaryForGpu mismatch. Of a trace: the last
exception, the number of frames, a gfx target it names and full target ids.
"""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading, add_target_ids
from env_checks.tool_text import normalise_gfx

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


# ---------------------------------------------------------------- an error trace


def is_error_trace(text: str) -> bool:
    return "Traceback (most recent call last)" in text or bool(re.search(r"\b[A-Z]\w*(Error|Exception): ", text))


def read_trace(text: str) -> Reading:
    r = Reading("error trace")
    errors = re.findall(r"\b([A-Z]\w*(?:Error|Exception)):\s*(.*)$", text, re.MULTILINE)
    if errors:
        kind, message = errors[-1]
        r.put("exception", f"{kind}: {message[:160]}")
    r.put("frames", len(re.findall(r'^\s*File "[^"]+", line \d+', text, re.MULTILINE)) or None)
    gfx = normalise_gfx(text) if re.search(r"gfx\d", text) else None
    if gfx:
        r.add("gfx_targets", gfx)
    add_target_ids(text, r)
    return r
