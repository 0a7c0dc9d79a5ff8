"""AMD's own dmesg analyzer as an oracle for `conformance diagnose`: amd-node-scraper's DmesgAnalyzer (a pinned test
dependency) runs over every recorded kernel log in fixtures/tools, and each event class it reports must be caught by
diagnose on the same log, through the mapping env_checks/nodescraper_events.toml (analyzer message -> signature ids).

The controls: the cross-check fails on a recorded log when the mapping entry of one of its events is removed, and on
a one-line log of an event class the analyzer knows and diagnose does not.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from nodescraper.models import SystemInfo
from nodescraper.plugins.inband.dmesg.dmesg_analyzer import DmesgAnalyzer
from nodescraper.plugins.inband.dmesg.dmesgdata import DmesgData

from env_checks.diagnose import diagnose_text
from env_checks.signatures import default_signatures

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "fixtures" / "tools"
MAPPING_PATH = REPO / "env_checks" / "nodescraper_events.toml"
MAPPING: dict[str, tuple[str, ...]] = {
    e["message"]: tuple(e["signatures"]) for e in tomllib.loads(MAPPING_PATH.read_text())["event"]}


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


# every recording diagnose reads as a kernel log (dmesg, dmesg -T, journalctl -k), wherever it lies under fixtures/tools
KERNEL_LOGS = sorted(p for p in TOOLS.rglob("*") if p.is_file() and p.suffix in (".txt", ".log")
                     and "kernel log" in diagnose_text(_read(p)).kinds)


def analyzer_events(text: str) -> set[str]:
    """The event descriptions amd-node-scraper's dmesg analyzer reports on a log given as text (no live system)."""
    logging.getLogger("nodescraper").setLevel(logging.CRITICAL)
    analyzer = DmesgAnalyzer(system_info=SystemInfo(name="recorded-log"))
    result = analyzer.analyze_data(DmesgData(dmesg_content=text))
    return {event.description for event in result.events}


@dataclass
class Gap:
    message: str
    reason: str


def crosscheck(text: str, mapping: dict[str, tuple[str, ...]]) -> list[Gap]:
    """The analyzer's event classes on `text` that diagnose does not report: no mapping entry, or none of the mapped
    signatures matched by diagnose on the same text."""
    matched = {m.id for m in diagnose_text(text).matches}
    gaps = []
    for message in sorted(analyzer_events(text)):
        if message not in mapping:
            gaps.append(Gap(message, "no entry in nodescraper_events.toml"))
        elif not matched & set(mapping[message]):
            gaps.append(Gap(message, f"diagnose matched none of {list(mapping[message])} (it matched "
                                     f"{sorted(matched)})"))
    return gaps


def test_every_kernel_recording_is_checked() -> None:
    names = {p.name for p in KERNEL_LOGS}
    assert len(KERNEL_LOGS) >= 15, names
    assert "dmesg_vm-fault_qcm-fence_baco_legacy-1020.excerpt.txt" in names


@pytest.mark.parametrize("path", KERNEL_LOGS, ids=[str(p.relative_to(TOOLS)) for p in KERNEL_LOGS])
def test_diagnose_reports_every_event_class_the_analyzer_reports(path: Path) -> None:
    gaps = crosscheck(_read(path), MAPPING)
    assert not gaps, "\n".join(f"{g.message}: {g.reason}" for g in gaps)


def test_the_vm_fault_baco_log_shows_the_two_event_classes_diagnose_lacked() -> None:
    text = _read(TOOLS / "kernel_faults" / "dmesg_vm-fault_qcm-fence_baco_legacy-1020.excerpt.txt")
    assert {"QCM fence timeout", "Suspend of IP block failed", "GPU Reset"} <= analyzer_events(text)
    assert {"amdgpu-qcm-fence-timeout", "amdgpu-ip-suspend-failed"} <= {m.id for m in diagnose_text(text).matches}


def test_mapping_names_real_messages_and_signatures() -> None:
    messages = {regex.message for regex in DmesgAnalyzer.ERROR_REGEX}
    ids = {s.id for s in default_signatures()}
    for message, signatures in MAPPING.items():
        assert message in messages, f"{message!r} is not an event amd-node-scraper's dmesg analyzer reports"
        assert signatures and set(signatures) <= ids, (message, signatures)


def test_control_a_removed_mapping_entry_fails_the_crosscheck() -> None:
    text = _read(TOOLS / "kernel_faults" / "dmesg_vm-fault_qcm-fence_baco_legacy-1020.excerpt.txt")
    without = {k: v for k, v in MAPPING.items() if k != "QCM fence timeout"}
    assert [g.message for g in crosscheck(text, without)] == ["QCM fence timeout"]
    wrong = dict(MAPPING, **{"Suspend of IP block failed": ("amdgpu-bad-page-threshold",)})
    assert [g.message for g in crosscheck(text, wrong)] == ["Suspend of IP block failed"]


def test_control_an_event_class_diagnose_lacks_fails_the_crosscheck() -> None:
    # a one-line log of an event the analyzer knows (an ext4 error) and diagnose has no signature for
    text = "[  812.407353] EXT4-fs error (device nvme0n1p2): ext4_find_entry:1612: inode #2: comm ls: reading\n"
    assert analyzer_events(text) == {"Filesystem corrupted!"}
    assert [(g.message, g.reason) for g in crosscheck(text, MAPPING)] == [
        ("Filesystem corrupted!", "no entry in nodescraper_events.toml")]
