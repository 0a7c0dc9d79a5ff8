"""Merge sharded JUnit XML files (one per CI shard or tier) into one report with `junitparser`.

Every <testsuite> of every input goes, unchanged, under one <testsuites> whose counts are the sums of the suites'
declared counts. junitparser's `+=` is not used on purpose: it recounts every suite from its <testcase>s (dropping
the declared counts and the suite's own time) and folds suites of the same name and host into one. A suite that
declares no counts gets them from its test cases (junitparser's rule).
junitparser is a `test`-extra dependency: only the tests and CI import this module, never the dashboard build.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

from junitparser import JUnitXml, JUnitXmlError, TestSuite

COUNTED = ("tests", "failures", "errors", "skipped")


class JunitError(ValueError):
    """An input is not JUnit XML; the message names the file."""


def _suites(path: Path) -> list[TestSuite]:
    try:
        document = JUnitXml.fromfile(str(path))
    except (SyntaxError, OSError) as exc:  # xml.etree's and lxml's ParseError are both SyntaxErrors
        raise JunitError(f"{path} is not readable JUnit XML ({exc}).") from None
    except JUnitXmlError:
        root = ET.parse(path).getroot().tag
        raise JunitError(f"{path} has root <{root}>, not <testsuites> or <testsuite>.") from None
    return list(document)


def merge_junit(paths: list[Path], name: str = "conformance") -> str:
    """One <testsuites> document holding every suite of `paths`, with summed counts and time."""
    merged = JUnitXml(name)
    totals = dict.fromkeys(COUNTED, 0)
    seconds = 0.0
    for path in paths:
        for suite in _suites(Path(path)):
            merged.append(suite)
            for key in COUNTED:
                totals[key] += getattr(suite, key) or 0
            seconds += suite.time or 0.0
    for key, value in totals.items():
        setattr(merged, key, value)
    merged.time = round(seconds, 3)
    buffer = io.BytesIO()
    merged.write(buffer)  # UTF-8 with an XML declaration
    return buffer.getvalue().decode("utf-8")
