"""Machine-health snapshots and their diff: new kernel faults (by signature), new RAS errors, retired pages,
remapped rows, a GPU that left the bus, a probe lost during the run; and the sysfs / tool parsers."""

from __future__ import annotations

from env_checks import health
from env_checks.probes import amd_smi, kernel_log, machine

RESET = "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!"


def snap(lines=(), uptime=100.0, probes=None, found=None, **record):
    log = kernel_log.KernelLog("ok", "dmesg", lines=kernel_log.parse("\n".join(lines)))
    s = health.snapshot(probes=probes or {}, found=found or machine.Machine(hypervisor=False), log=log)
    s.record["uptime_s"] = uptime
    s.record.update(record)
    return s


def ids(findings):
    return sorted(f.id for f in findings)


def test_a_gpu_reset_during_the_run_is_a_fault_with_its_signature():
    before = snap(["[   50.000000] amdgpu: SMU is initialized"])
    after = snap(["[   50.000000] amdgpu: SMU is initialized", f"[  150.000000] {RESET}"], uptime=200.0)
    findings, during = health.diff(before, after)
    (reset,) = [f for f in findings if f.source == "kernel"]
    assert (reset.id, reset.severity, reset.detail) == ("amdgpu-gpu-reset", "fault", RESET)
    assert reset.remedy and [x["text"] for x in during] == [RESET]


def test_a_reset_before_the_run_is_since_boot_not_new():
    old = [f"[   20.000000] {RESET}"]
    before, after = snap(old), snap(old, uptime=200.0)
    findings, during = health.diff(before, after)
    assert findings == [] and during == []
    assert [m["id"] for m in after.record["kernel_signatures_since_boot"]] == ["amdgpu-gpu-reset"]


def test_unstamped_lines_count_once_when_new():
    before = snap(["plain line"])
    after = snap(["plain line", RESET], uptime=200.0)
    findings, during = health.diff(before, after)
    assert [x["text"] for x in during] == [RESET] and ids(findings) == ["amdgpu-gpu-reset"]


def test_new_ras_errors_retired_pages_and_remapped_rows():
    b = snap(ras_sysfs={"ue": 0, "ce": 2, "de": 0}, retired_pages=3,
             ecc_nvidia=[{"index": 0, "ecc.errors.uncorrected.volatile.total": 0, "remapped_rows.pending": 0,
                          "ecc.errors.corrected.volatile.total": 1}])
    a = snap(uptime=200.0, ras_sysfs={"ue": 1, "ce": 5, "de": 0}, retired_pages=4,
             ecc_nvidia=[{"index": 0, "ecc.errors.uncorrected.volatile.total": 0, "remapped_rows.pending": 1,
                          "ecc.errors.corrected.volatile.total": 1}])
    findings, _ = health.diff(b, a)
    by_id = {f.id: f for f in findings}
    assert set(by_id) == {"ras-uncorrectable-new", "ras-correctable-new", "retired-pages-new", "row-remap-new"}
    assert by_id["retired-pages-new"].severity == "fault" and by_id["retired-pages-new"].count == 1
    assert by_id["ras-correctable-new"].severity == "warning" and "2 before the run, 5 after" in \
        by_id["ras-correctable-new"].detail
    same = snap(ras_sysfs={"ue": 0, "ce": 2, "de": 0}, retired_pages=3)
    assert health.diff(same, snap(uptime=200.0, ras_sysfs={"ue": 0, "ce": 2, "de": 0}, retired_pages=3))[0] == []


def test_a_gpu_leaving_the_bus_and_a_lost_probe_are_faults():
    gpus = [machine.PciGpu(f"0000:{i:02x}:00.0", "nvidia", "0x2335", False) for i in range(2)]
    before = snap(found=machine.Machine(gpus, [], False))
    after = snap(found=machine.Machine(gpus[:1], [], False), uptime=200.0,
                 probes={"nvidia": {"status": "timeout", "tool": "nvidia-smi", "detail": "did not finish in 20 s"}})
    findings, _ = health.diff(before, after)
    assert ids(findings) == ["gpu-count-pci-changed", "health-probe-lost"]
    assert "2 before the run, 1 after" in findings[0].detail


def test_nvidia_health_query_parser():
    text = "0, 00000000:18:00.0, 96.00.A5.00.01, G520.0200.00.05, 0, 0, 0, 0, No, No\n"
    (gpu,) = health.parse_nvidia_health(text)
    assert gpu["firmware"] == {"vbios": "96.00.A5.00.01", "inforom_image": "G520.0200.00.05"}
    assert gpu["ecc.errors.uncorrected.volatile.total"] == 0 and gpu["remapped_rows.pending"] is None
    try:
        health.parse_nvidia_health("0, 00000000:18:00.0\n")
    except ValueError as exc:
        assert "expected 10 fields" in str(exc)
    else:
        raise AssertionError("a short row was accepted")


def test_amd_smi_ecc_parser_reads_json_and_text():
    js = ('[{"gpu": 0, "ecc": {"total_correctable_count": 3, "total_uncorrectable_count": 0, '
          '"total_deferred_count": 0, "cache_correctable_count": 1}}]')
    assert health.parse_amd_smi_ecc(js)[0] == {"gpu": 0, "correctable": 3, "uncorrectable": 0, "deferred": 0}
    text = "GPU: 0\n    ECC:\n        TOTAL_CORRECTABLE_COUNT: 0\n        TOTAL_UNCORRECTABLE_COUNT: 2\n"
    assert health.parse_amd_smi_ecc(text)[0]["uncorrectable"] == 2


def test_sysfs_machine_probe(tmp_path):
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    dev = sys_root / "bus" / "pci" / "devices" / "0000:c1:00.0"
    dev.mkdir(parents=True)
    for name, value in (("vendor", "0x1002"), ("device", "0x74a1"), ("class", "0x120000")):
        (dev / name).write_text(value + "\n")
    other = sys_root / "bus" / "pci" / "devices" / "0000:00:1f.0"
    other.mkdir()
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x060100\n")
    card = sys_root / "class" / "drm" / "card0"
    card.mkdir(parents=True)
    (card / "device").symlink_to(dev)
    (dev / "current_compute_partition").write_text("CPX\n")
    (dev / "ras").mkdir()
    (dev / "ras" / "umc_err_count").write_text("ue: 1\nce: 7\n")
    (dev / "ras" / "gfx_err_count").write_text("ue: 0\nce: 2\n")
    proc.mkdir()
    (proc / "cpuinfo").write_text("processor : 0\nflags : fpu sse2 avx2\n")
    found = machine.probe_machine(sys_root, proc)
    assert [(g.device_id, g.is_vf) for g in found.pci_gpus] == [("0x74a1", False)]
    assert found.cards[0].compute_partition == "CPX" and found.virtualization == "bare_metal"
    assert machine.ras_totals(found.cards) == {"ue": 1, "ce": 9, "de": 0}
    (dev / "physfn").mkdir()
    assert machine.probe_machine(sys_root, proc).virtualization == "vf_host"


def test_recorded_bad_pages_feed_the_snapshot(recorded):
    bad = amd_smi.parse_amd_smi_bad_pages(recorded("amd-smi_bad-pages_mi300x_blog.txt"))
    s = snap(probes={"amd_bad_pages": bad})
    assert s.record["retired_pages"] == sum(g.retired for g in bad.gpus)
