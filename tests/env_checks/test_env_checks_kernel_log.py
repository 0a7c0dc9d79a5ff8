"""The kernel-log reader: every stamp form users paste, since-boot / since-start filtering, and a log that may not
be read is said to be so (never an empty log)."""

from __future__ import annotations

from datetime import datetime, timezone

from env_checks.probes import kernel_log

DMESG = """\
[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)
[   12.345678] amdgpu 0000:c1:00.0: amdgpu: SMU is initialized successfully!
[ 4242.500001] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!
                 continuation without a stamp
"""


def test_dmesg_monotonic_stamps_and_continuations():
    lines = kernel_log.parse(DMESG)
    assert [x.boot_s for x in lines] == [0.0, 12.345678, 4242.500001, 4242.500001]
    assert lines[2].text == "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!"
    assert lines[3].text == "continuation without a stamp" and lines[3].wall is None


def test_iso_journal_ctime_and_level_prefixed_forms():
    iso = kernel_log.parse_line("2026-12-01T10:08:11,123456+01:00 amdgpu 0000:c1:00.0: ring gfx timeout")
    assert iso.wall == "2026-12-01T09:08:11.123456+00:00" and iso.text.endswith("ring gfx timeout")
    journal = kernel_log.parse_line("2026-12-01T10:08:11.5+0000 node7 kernel: amdgpu: GPU reset begin!")
    assert journal.text == "amdgpu: GPU reset begin!" and journal.wall.startswith("2026-12-01T10:08:11.5")
    short = kernel_log.parse_line("Dec 01 10:08:11 node7 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1", year=2026)
    assert short.wall == "2026-12-01T10:08:11+00:00" and short.text.startswith("NVRM: Xid")
    # journalctl -o short-monotonic
    mono = kernel_log.parse_line("[  101.000001] node7 kernel: amdgpu: GPU reset begin!")
    assert (mono.boot_s, mono.text) == (101.000001, "amdgpu: GPU reset begin!")
    levelled = kernel_log.parse_line("kern  :err   : [   55.100000] amdgpu: ring sdma0 timeout")
    assert (levelled.level, levelled.boot_s, levelled.text) == ("err", 55.1, "amdgpu: ring sdma0 timeout")
    ctime = kernel_log.parse_line("[Tue Dec  1 10:08:11 2026] amdgpu: GPU reset begin!")
    assert ctime.wall is not None and ctime.text == "amdgpu: GPU reset begin!"
    assert kernel_log.parse_line("no stamp at all") is None
    assert kernel_log.parse("-- No entries --\n") == []


def test_since_start_keeps_what_came_after_and_unstamped_lines():
    lines = kernel_log.parse(DMESG) + [kernel_log.KernelLine("planted, no stamp")]
    after = kernel_log.since(lines, boot_s=1000.0)
    assert [x.text for x in after] == ["amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
                                       "continuation without a stamp", "planted, no stamp"]
    walls = kernel_log.parse("2026-12-01T10:00:00+00:00 old\n2026-12-01T11:00:00+00:00 new\n")
    start = datetime(2026, 12, 1, 10, 30, tzinfo=timezone.utc)
    assert [x.text for x in kernel_log.since(walls, wall=start)] == ["new"]
    assert len(kernel_log.since(kernel_log.parse(DMESG))) == 4  # since boot: everything


def test_a_denied_kernel_log_is_reported_as_denied(fake_tool):
    fake_tool("dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    fake_tool("journalctl", 'echo "No journal files were opened due to insufficient permissions."; exit 0')
    log = kernel_log.read()
    assert log.status == "denied" and log.lines == []
    assert "Operation not permitted" in log.detail and "CAP_SYSLOG" in log.detail


def test_a_missing_tool_is_unavailable_and_extra_lines_are_read(no_tools_on_path, tmp_path):
    extra = tmp_path / "planted.txt"
    extra.write_text("[ 9999.000000] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!\n")
    log = kernel_log.read(extra)
    assert log.status == "unavailable" and "not installed" in log.detail
    assert [x.boot_s for x in log.lines] == [9999.0] and log.extra_source == str(extra)
    missing = kernel_log.read(tmp_path / "absent.txt")
    assert "unreadable" in missing.detail and missing.extra_source.endswith("(unreadable)")


def test_dmesg_that_answers_is_read(fake_tool):
    fake_tool("dmesg", "printf '[    1.000000] hello\\n[    2.500000] amdgpu: GPU reset begin!\\n'")
    log = kernel_log.read()
    assert (log.status, log.source, len(log.lines)) == ("ok", "dmesg", 2)
