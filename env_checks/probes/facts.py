"""Shared plumbing of the probes: running a tool or reading a file, and turning failures into facts.

Every probe is split in two: an I/O half that runs the real tool (with a timeout) or reads the real file,
and a pure parser that takes the text. The I/O half never raises: a missing tool, a timeout, a non-zero
exit or an unreadable file becomes a `ProbeFailure` record, because on a machine under test "amd-smi is
not installed" is a finding to report, not a crash. Parsers raise `Unparseable` on text they cannot read;
`parse_with` turns that (and any slip of a parser on malformed input) into a `ProbeFailure` naming the tool.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Long enough for rocminfo/amd-smi on an 8-GPU node (a few seconds), short enough that a hung driver
# cannot stall the P0 gate.
DEFAULT_TIMEOUT_S = 20.0

NOT_INSTALLED = "not_installed"
UNPARSEABLE = "unparseable"
FAILED = "failed"
TIMEOUT = "timeout"
ABSENT = "absent"


class Unparseable(ValueError):
    """A parser met text it cannot read (truncated, garbled, or a format it does not know)."""


@dataclass(frozen=True)
class ProbeFailure:
    """Why a fact is missing: which tool or file, what kind of failure, and a one-line detail."""

    tool: str
    kind: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.kind, "tool": self.tool, "detail": self.detail}


def run_tool(argv: list[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> str | ProbeFailure:
    """Run `argv` and return its stdout, or a ProbeFailure saying why there is none."""
    tool = argv[0]
    exe = shutil.which(tool)
    if exe is None:
        return ProbeFailure(tool, NOT_INSTALLED, f"{tool} not installed (not on PATH)")
    try:
        done = subprocess.run(
            [exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        return ProbeFailure(tool, TIMEOUT, f"{' '.join(argv)} did not finish within {timeout_s:g} s")
    except OSError as exc:
        return ProbeFailure(tool, FAILED, f"{' '.join(argv)} could not start: {exc}")
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        return ProbeFailure(tool, FAILED, f"{' '.join(argv)} exited {done.returncode}: {last[0][:200]}")
    return done.stdout


def read_text(path: str | Path, what: str | None = None) -> str | ProbeFailure:
    """Read a small text file (/proc, /sys, /etc), or say why it could not be read."""
    name = what or str(path)
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ProbeFailure(name, ABSENT, f"{path} does not exist")
    except OSError as exc:
        return ProbeFailure(name, FAILED, f"{path} unreadable: {exc.strerror or exc}")


def parse_with(tool: str, parser: Callable[[str], T], text: str | ProbeFailure) -> T | ProbeFailure:
    """Apply a pure parser to a probe's text; any failure becomes an 'unparseable' fact naming the tool."""
    if isinstance(text, ProbeFailure):
        return text
    try:
        return parser(text)
    except Unparseable as exc:
        return ProbeFailure(tool, UNPARSEABLE, f"{tool} output unparseable: {exc}")
    # A parser tripping over garbled input (a missing key, a short line) must still give a fact,
    # never a traceback in the gate's report.
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return ProbeFailure(tool, UNPARSEABLE, f"{tool} output unparseable: {type(exc).__name__}: {exc}")


def to_plain(value: Any) -> Any:
    """A probe result as JSON-ready data: records gain status 'ok', failures keep their kind."""
    if isinstance(value, ProbeFailure):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"status": "ok", **dataclasses.asdict(value)}
    return {"status": "ok", "value": value}


def int_or_none(text: str | None) -> int | None:
    """'304' -> 304, '29857(0x74a1)' -> 29857, '0x80b8' -> 32952; None for N/A and the like."""
    if text is None:
        return None
    token = str(text).strip().split("(")[0].strip()
    try:
        return int(token, 16) if token.lower().startswith("0x") else int(token)
    except ValueError:
        return None
