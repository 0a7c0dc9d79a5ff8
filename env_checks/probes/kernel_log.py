"""The kernel log: read it (dmesg, else `journalctl -k`), parse its lines, keep those since boot or since a run began.

Lines come in the forms users and tools print:

    [  123.456789] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!          dmesg (seconds since boot)
    kern  :err   : [  123.456789] amdgpu ...                              dmesg -x (facility and level first)
    [Tue Dec  1 10:08:11 2026] amdgpu ...                                 dmesg -T (wall clock, local time)
    2026-12-01T10:08:11,123456+00:00 amdgpu ...                           dmesg --time-format iso
    2026-12-01T10:08:11.123456+0000 host kernel: amdgpu ...               journalctl -k -o short-iso(-precise)
    Dec 01 10:08:11 host kernel: amdgpu ...                               journalctl -k (no year: this year)

A line's stamp is kept as seconds since boot (`boot_s`) or as a UTC wall time (`wall`), whichever the form
gives; continuation lines without a stamp inherit the previous line's stamp. Reading the log is often not
permitted (kernel.dmesg_restrict=1, no systemd-journal group): that is reported as status "denied" with the
tool's own words, never as an empty log.

`extra` names a file of lines to add to what the kernel printed, read through the same parser: a test plants
a known fault there (the run reads it through CONFORMANCE_KERNEL_LOG_EXTRA, see conformance.monitor.machine_health).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

TIMEOUT_S = 20.0
MAX_LINES = 20000  # a kernel ring buffer holds ~10^4 lines; a runaway log must not fill results.json

_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_LEVEL_PREFIX = re.compile(r"^(\w+)\s*:\s*(\w+)\s*:\s?(.*)$")  # dmesg -x: "kern  :err   : ..."
_CTIME = re.compile(r"^\[(\w{3} \w{3}\s+\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s?(.*)$")
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:[.,](\d+))?(Z|[+-]\d{2}:?\d{2})?\s(.*)$")
_SYSLOG = re.compile(r"^(\w{3}\s+\d{1,2} \d{2}:\d{2}:\d{2})\s(.*)$")
_HOST_KERNEL = re.compile(r"^\S+ kernel: ?(.*)$")  # journal forms name the host and "kernel:"

DENIED_HINTS = ("operation not permitted", "permission denied", "insufficient permissions",
                "no journal files were opened")


@dataclass
class KernelLine:
    text: str
    boot_s: float | None = None
    wall: str | None = None  # ISO 8601, UTC
    level: str | None = None

    def after(self, boot_s: float | None, wall: datetime | None) -> bool | None:
        """Whether this line was printed after a moment given as seconds since boot and/or a wall time;
        None when the line's stamp and the moment share no clock."""
        if self.boot_s is not None and boot_s is not None:
            return self.boot_s >= boot_s
        if self.wall is not None and wall is not None:
            return datetime.fromisoformat(self.wall) >= wall
        return None


@dataclass
class KernelLog:
    status: str  # "ok" | "denied" | "unavailable"
    source: str  # "dmesg" | "journalctl -k" | "none"
    detail: str = ""
    lines: list[KernelLine] = field(default_factory=list)
    extra_source: str | None = None

    def as_dict(self, with_lines: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "source": self.source, "detail": self.detail,
                               "line_count": len(self.lines)}
        if self.extra_source:
            out["extra_source"] = self.extra_source
        if with_lines:
            out["lines"] = [asdict(x) for x in self.lines]
        return out


def _iso_utc(stamp: str, fraction: str | None, zone: str | None) -> str:
    zone = zone or "+00:00"
    if zone == "Z":
        zone = "+00:00"
    elif ":" not in zone:
        zone = zone[:3] + ":" + zone[3:]
    micro = (fraction or "0")[:6].ljust(6, "0")
    when = datetime.fromisoformat(f"{stamp}.{micro}{zone}")
    return when.astimezone(timezone.utc).isoformat()


def parse_line(raw: str, year: int | None = None) -> KernelLine | None:
    """One kernel-log line in any of the module's forms; None for a line with no stamp (a continuation)."""
    line = raw.rstrip("\n")
    level = None
    prefixed = _LEVEL_PREFIX.match(line)
    if prefixed and prefixed.group(1) in ("kern", "user", "daemon", "syslog"):
        level, line = prefixed.group(2), prefixed.group(3)
    if m := _MONO.match(line):
        host = _HOST_KERNEL.match(m.group(2))  # journalctl -o short-monotonic names the host
        return KernelLine(host.group(1) if host else m.group(2), boot_s=float(m.group(1)), level=level)
    if m := _ISO.match(line):
        text = m.group(4)
        host = _HOST_KERNEL.match(text)
        return KernelLine(host.group(1) if host else text, wall=_iso_utc(m.group(1), m.group(2), m.group(3)),
                          level=level)
    if m := _CTIME.match(line):
        when = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").astimezone(timezone.utc)
        return KernelLine(m.group(2), wall=when.isoformat(), level=level)
    if m := _SYSLOG.match(line):
        host = _HOST_KERNEL.match(m.group(2))
        if host:
            stamp = f"{year or datetime.now(timezone.utc).year} {m.group(1)}"
            when = datetime.strptime(" ".join(stamp.split()), "%Y %b %d %H:%M:%S").replace(tzinfo=timezone.utc)
            return KernelLine(host.group(1), wall=when.isoformat(), level=level)
    return None


def parse(text: str, year: int | None = None) -> list[KernelLine]:
    """Every line of a kernel log; unstamped lines inherit the stamp before them (or have none)."""
    out: list[KernelLine] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("-- "):  # journalctl's "-- No entries --", "-- Boot ... --"
            continue
        parsed = parse_line(raw, year)
        if parsed is None:
            prev = out[-1] if out else KernelLine("")
            parsed = KernelLine(raw.strip(), boot_s=prev.boot_s, wall=prev.wall, level=prev.level)
        out.append(parsed)
    return out[-MAX_LINES:]


def since(lines: list[KernelLine], boot_s: float | None = None, wall: datetime | None = None) -> list[KernelLine]:
    """The lines printed at or after a moment (seconds since boot and/or wall time); lines whose stamp shares
    no clock with the moment are kept (better a line too many than a fault missed)."""
    return [x for x in lines if x.after(boot_s, wall) is not False]


def uptime_s(proc_uptime: Path = Path("/proc/uptime")) -> float | None:
    try:
        return float(proc_uptime.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _run(argv: list[str]) -> tuple[int | None, str, str]:
    exe = shutil.which(argv[0])
    if exe is None:
        return None, "", f"{argv[0]} not installed (not on PATH)"
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                              errors="replace")
    except subprocess.TimeoutExpired:
        return None, "", f"{' '.join(argv)} did not finish within {TIMEOUT_S:g} s"
    except OSError as exc:
        return None, "", f"{' '.join(argv)} could not start: {exc}"
    return done.returncode, done.stdout, done.stderr.strip()


def _denied(text: str) -> bool:
    return any(h in text.lower() for h in DENIED_HINTS)


def read(extra: str | Path | None = None) -> KernelLog:
    """The kernel log since boot: dmesg, else `journalctl -k -b`; status says when neither may be read."""
    reasons: list[str] = []
    denied = False
    for source, argv in (("dmesg", ["dmesg"]), ("journalctl -k", ["journalctl", "-k", "-b", "--no-pager",
                                                                   "-o", "short-monotonic", "-q"])):
        rc, out, err = _run(argv)
        first = (err.splitlines() or [""])[0][:200]
        if rc == 0 and out.strip() and not _denied(out[:300]):
            log = KernelLog("ok", source, f"{' '.join(argv)}: {len(out.splitlines())} lines", parse(out))
            break
        denied = denied or _denied(err) or _denied(out[:300])
        reasons.append(f"{' '.join(argv)}: {first or (out.strip().splitlines() or ['no output'])[0][:200]}"
                       + (f" (exit {rc})" if rc not in (0, None) else ""))
    else:
        status = "denied" if denied else "unavailable"
        log = KernelLog(status, "none", "; ".join(reasons) + (
            " (reading the kernel log needs root, CAP_SYSLOG or kernel.dmesg_restrict=0; the journal needs the "
            "systemd-journal or adm group)" if denied else ""))
    if extra:
        try:
            log.lines.extend(parse(Path(extra).read_text(errors="replace")))
            log.extra_source = str(extra)
        except OSError as exc:
            log.detail += f"; extra kernel-log file {extra} unreadable: {exc.strerror or exc}"
            log.extra_source = f"{extra} (unreadable)"
    return log
