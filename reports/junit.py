"""Merge sharded JUnit XML files (one per CI shard or tier) into one report, standard library only.

The issue asked for junitparser; `reports/` may import only the standard library, and a merge is small:
every <testsuite> of every input goes under one <testsuites> whose counts are the sums.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

COUNTED = ("tests", "failures", "errors", "skipped")


class JunitError(ValueError):
    """An input is not JUnit XML; the message names the file."""


def _suites(path: Path) -> list[ET.Element]:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise JunitError(f"{path} is not readable JUnit XML ({exc}).") from None
    if root.tag == "testsuite":
        return [root]
    if root.tag == "testsuites":
        return list(root.iter("testsuite"))
    raise JunitError(f"{path} has root <{root.tag}>, not <testsuites> or <testsuite>.")


def merge_junit(paths: list[Path], name: str = "conformance") -> str:
    """One <testsuites> document holding every suite of `paths`, with summed counts and time."""
    merged = ET.Element("testsuites", {"name": name})
    totals = dict.fromkeys(COUNTED, 0)
    seconds = 0.0
    for path in paths:
        for suite in _suites(Path(path)):
            merged.append(suite)
            for key in COUNTED:
                totals[key] += int(suite.get(key, "0") or 0)
            seconds += float(suite.get("time", "0") or 0)
    for key, value in totals.items():
        merged.set(key, str(value))
    merged.set("time", f"{seconds:.3f}")
    return ET.tostring(merged, encoding="unicode", xml_declaration=True)
