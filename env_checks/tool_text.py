"""How the tools print: the text helpers both the strict probes (`env_checks.probes`) and the readers of pasted
outputs (`env_checks.pasted`) parse with — gfx target names, where a JSON document starts, `key: value` lines."""

from __future__ import annotations

import re

_GFX = re.compile(r"\bgfx([0-9]{2,4}[0-9a-f]?)\b", re.IGNORECASE)


def normalise_gfx(name: str | None) -> str | None:
    """'gfx942:sramecc+:xnack-' / 'amdgcn-amd-amdhsa--gfx90a:xnack+' / 'GFX942' -> 'gfx942'; None if no gfx name."""
    if not name:
        return None
    found = _GFX.search(name)
    return f"gfx{found.group(1).lower()}" if found else None


_BRACKET_PROMPT = re.compile(r"\[[^\]\s]+@[^\]\n]+\][$#] ")


def json_start(text: str) -> int:
    """Where a JSON document starts, if the first non-blank, non-warning line opens one; else -1."""
    for match in re.finditer(r"^[ \t]*(\S)", text, re.MULTILINE):
        end = text.find("\n", match.start(1))
        line = text[match.start(1):end if end >= 0 else None]
        if _BRACKET_PROMPT.match(line):  # `[user@host dir]$ amd-smi ...` is a shell prompt, not a JSON list
            continue
        if match.group(1) in "[{":
            return match.start(1)
        if not re.match(r"(WARNING|INFO|NOTE|\$|~\$|#|\S*[$#] |sudo |amd-smi|rocm-smi)", line):
            return -1
    return -1


def colon_pairs(text: str) -> list[tuple[int, str, str]]:
    """(indent, lower-case key, value) of every `key: value` line (also `key : value` and `key:: value`)."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^(\s*)([^:\n]{1,80}?)\s*::?\s(.*)$|^(\s*)([^:\n]{1,80}?)\s*:$", line)
        if match:
            if match.group(2) is not None:
                out.append((len(match.group(1)), match.group(2).strip().lower(), match.group(3).strip()))
            else:
                out.append((len(match.group(4)), match.group(5).strip().lower(), ""))
    return out
