"""Second recordings per family and the fault facts: amdgpu page faults (hub, device, process, UTCL2 client),
RAS/ACA uncorrectable errors, probe and IP-discovery failures with their error code, HIP's NoBinaryForGpu with the
target's xnack suffix, hipconfig's paths; and a second real recording of amd-smi list/firmware/version, hipconfig and
modinfo. Sources: fixtures/tools/SOURCES.md ("second recordings"); every value asserted here is stated verbatim in
its file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_checks.diagnose import diagnose_text
from tests.env_checks.test_diagnose_newer_layouts import TOOLS, read

FAMILIES = {"kernel_faults": 8, "hip_errors": 2, "second": 5}
NEW = sorted(p for family in FAMILIES for p in (TOOLS / family).iterdir())


def test_recordings_per_family() -> None:
    for family, count in FAMILIES.items():
        assert len(list((TOOLS / family).iterdir())) == count, family


@pytest.mark.parametrize("path", NEW, ids=[str(p.relative_to(TOOLS)) for p in NEW])
def test_every_recording_is_read_and_its_string_facts_are_verbatim(path: Path) -> None:
    text = read(path)
    report = diagnose_text(text)
    assert report.kinds and report.facts and not any("not an output of a tool" in s for s in report.unread)
    for key in ("pci_bdfs", "page_fault_hubs", "page_fault_processes", "page_fault_clients", "probe_error_codes",
                "ip_discovery_errors", "ras_uncorrectable_events", "aca_devices", "hip_targets_without_code_object",
                "bundled_code_object_targets", "hip_bundles_without_code_object", "hip_path", "rocm_path",
                "hip_clang_path"):
        value = report.facts.get(key)
        for v in value if isinstance(value, list) else [value] if value else []:
            assert v in text, (key, v)


EXPECTED: dict[str, dict[str, object]] = {
    # ---- page faults: the device, the hub, the process and the UTCL2 client
    "kernel_faults/dmesg_page-fault_gfx1150_therock-1271.excerpt.txt": {
        "pci_bdfs": ["0000:c2:00.0"], "page_fault_hubs": ["gfxhub"], "page_fault_processes": ["python pid 5578"],
        "page_fault_clients": ["TCP (0x8)"],
        "page_faults": [{"device": "0000:c2:00.0", "hub": "gfxhub", "count": 3, "processes": ["python pid 5578"],
                         "clients": ["TCP (0x8)"]}]},
    "kernel_faults/dmesg_no-retry-page-fault_gfxhub0_amdgpu-172.excerpt.txt": {
        "page_fault_hubs": ["gfxhub0"], "page_fault_processes": ["pt_main_thread pid 12924"],
        "page_fault_clients": ["TCP (0x8)", "CB (0x0)"],
        "page_faults": [{"device": "0000:c6:00.0", "hub": "gfxhub0", "count": 2, "retry": "no-retry",
                         "processes": ["pt_main_thread pid 12924"], "clients": ["TCP (0x8)", "CB (0x0)"]}]},
    "kernel_faults/journal_page-fault_rx6800xt_linux-cachyos-960.excerpt.txt": {
        "pci_bdfs": ["0000:0d:00.0"], "page_fault_processes": ["kwin_wayland pid 1671"],
        "page_fault_clients": ["TCP (0x8)"]},
    "issues/dmesg_ring-reset_page-fault_gfx1201_legacy-6127.excerpt.txt": {
        "pci_bdfs": ["0000:03:00.0"], "page_fault_hubs": ["gfxhub"], "page_fault_processes": None},
    # ---- RAS / ACA: the devices, the event, the registers
    "kernel_faults/dmesg_aca-uncorrectable_mi300x_legacy-4021-comment.excerpt.txt": {
        "ras_uncorrectable_devices": ["0000:68:00.0"], "ras_uncorrectable_events": ["ERREVENT_ATHUB_INTERRUPT"],
        "aca_devices": ["0000:9e:00.0", "0000:d4:00.0"]},
    "issues/dmesg_aca-uncorrectable_mi300x_legacy-4021.excerpt.txt": {
        "ras_uncorrectable_devices": ["0000:1c:00.0"], "aca_devices": ["0000:42:00.0", "0000:55:00.0"]},
    # ---- probe / IP discovery: the device and the error code
    "kernel_faults/dmesg_ip-discovery-failed_mi300x_legacy-3856.txt": {
        "probe_failures": [{"device": "0000:05:00.0", "error": "-22", "errno": "EINVAL"}],
        "probe_error_codes": ["-22"],
        "ip_discovery_errors": ["get invalid ip discovery binary signature", "amdgpu_discovery_init failed"]},
    "kernel_faults/journal_ip-discovery-failed_legacy-1896.excerpt.txt": {
        "pci_bdfs": ["0000:03:00.0"], "probe_error_codes": None, "ip_discovery_errors": [
            "get invalid ip discovery binary signature from vram", "failed to read ip discovery binary from file",
            "amdgpu_discovery_init failed"]},
    "kernel_faults/dmesg_probe-failed-12_mi210_rocm-install-on-linux-615.txt": {
        "probe_failures": [{"device": "0000:83:00.0", "error": "-12", "errno": "ENOMEM"}], "ip_discovery_errors": None},
    # ---- HIP NoBinaryForGpu: the target with its xnack suffix, and what the binary carries
    "hip_errors/hip_nobinaryforgpu_gfx902-xnack_rocm-1587.txt": {
        "kinds": ["HIP runtime log"], "hip_error": "hipErrorNoBinaryForGpu",
        "hip_targets_without_code_object": ["gfx902:xnack-"], "gfx_target_ids": ["gfx902:xnack-"],
        "gfx_targets": ["gfx902"], "bundled_code_object_targets": [
            "gfx1030", "gfx803", "gfx900:xnack-", "gfx906:xnack-", "gfx908:xnack-", "gfx90a:xnack+", "gfx90a:xnack-"]},
    # ROCm 6.2.1's hip_fatbin.cpp form on an MI250X: "Missing CO for these ISAs -" with the target on the next line
    "hip_errors/hip_missing-co_gfx90a-sramecc-xnack_mi250x_legacy-4208.excerpt.txt": {
        "kinds": ["HIP runtime log"], "hip_error": "hipErrorNoBinaryForGpu",
        "hip_targets_without_code_object": ["gfx90a:sramecc+:xnack-"], "gfx_target_ids": ["gfx90a:sramecc+:xnack-"],
        "gfx_targets": ["gfx90a"], "hip_bundles_without_code_object": ["/opt/rocm-6.2.1/lib/libMIOpen.so.1.0.60201"],
        "bundled_code_object_targets": None},
    # ---- amd-smi bad-pages: none found on two MI300X GPUs; one retired page (the changelog's --hex example, pasted
    # indented as a markdown list item), PENDING and UN_RES N/A, so unknown
    "amd-smi_bad-pages_mi300x_blog.txt": {
        "kinds": ["amd-smi"], "gpus_listed": 2, "bad_pages_retired": 0, "bad_pages_pending": 0,
        "bad_pages_unreservable": 0},
    "amd-smi_bad-pages_hex_amdsmi-changelog.txt": {
        "kinds": ["amd-smi"], "gpus_listed": 1, "bad_pages_retired": 1, "bad_pages_pending": None,
        "bad_pages_unreservable": None},
    # ---- second recordings of amd-smi list / firmware / version, hipconfig, modinfo
    "second/amd-smi_list_mi210-x2_rocm-5480.txt": {"pci_bdfs": ["0000:03:00.0", "0000:83:00.0"], "gpus_listed": 2},
    "second/amd-smi_firmware_mi300x-vf_rocm-5231.txt": {"firmware": {
        "cp_mec1": "32959", "cp_mec2": "32959", "rlc": "69", "sdma0": "25", "vcn": "09.11.80.15",
        "ta_ras": "1B.36.02.1A", "ta_xgmi": "20.00.00.14", "pm": "00.85.129.03", "pldm_bundle": "01.25.03.12"}},
    "second/amd-smi_version_mi300x-vf_rocm-5231.txt": {
        "amd_smi_version": "26.2.0+021c61fc", "rocm_version": "7.1.1", "driver_version": "6.16.6"},
    "second/hipconfig_full_rocm6.3.2_rocm-4369.txt": {
        "hip_version": "6.3.42134-a9a80e791", "rocm_version": "6.3.2", "hip_path": "/opt/rocm-6.3.2",
        "rocm_path": "/opt/rocm-6.3.2", "hip_clang_path": "/opt/rocm-6.3.2/lib/llvm/bin", "hip_runtime": "rocclr",
        "hip_platform": "amd", "kernel_release": "6.11.0-17-generic"},
    "issues/hipconfig_rocm6.2.0_hip-3521.excerpt.txt": {
        "hip_path": "/opt/rocm-6.2.0", "rocm_path": "/opt/rocm-6.2.0",
        "hip_clang_path": "/opt/rocm-6.2.0/lib/llvm/bin"},
    "second/modinfo_amdgpu_dkms-19.10_legacy-667.excerpt.txt": {
        "driver_version": "19.10.0.418", "driver_source": "DKMS (amdgpu-dkms)", "firmware_files": 29},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_facts_a_source_states_are_read(name: str) -> None:
    report = diagnose_text(read(name))
    for key, want in EXPECTED[name].items():
        got = report.kinds if key == "kinds" else report.facts.get(key)
        if isinstance(want, dict):
            assert isinstance(got, dict) and {k: got.get(k) for k in want} == want, (key, got)
        else:
            assert got == want, (key, got)


def test_aca_registers_are_read_whole_and_a_cut_one_is_left_out() -> None:
    whole = diagnose_text(read("kernel_faults/dmesg_aca-uncorrectable_mi300x_legacy-4021-comment.excerpt.txt"))
    assert whole.facts["aca_entries"][0] == {
        "device": "0000:9e:00.0", "entry": "00", "status": "0x98000800003e0000", "addr": "0x0000000000000000",
        "misc0": "0xd008000000000000", "ipid": "0x0001200136430401", "synd": "0x0000000000000000"}
    assert whole.unread == []
    cut = diagnose_text(read("issues/dmesg_aca-uncorrectable_mi300x_legacy-4021.excerpt.txt"))
    assert "synd" not in cut.facts["aca_entries"][1] and cut.facts["aca_entries"][1]["ipid"] == "0x0001300136430400"


DAMAGED: dict[str, str] = {
    "kernel_faults/dmesg_page-fault_gfx1150_therock-1271.excerpt.txt": "2 page fault report(s) end before",
    "issues/dmesg_ring-reset_page-fault_gfx1201_legacy-6127.excerpt.txt": "1 page fault report(s) end before",
    "issues/dmesg_aca-uncorrectable_mi300x_legacy-4021.excerpt.txt": "shorter than 16 hex digits",
    "kernel_faults/journal_ip-discovery-failed_legacy-1896.excerpt.txt": "no 'probe of ... failed with error' line",
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_cut_fault_report_reads_partially_with_one_sentence(name: str) -> None:
    report = diagnose_text(read(name))
    hits = [s for s in report.unread if DAMAGED[name] in s]
    assert len(hits) == 1 and hits[0].endswith(".") and "\n" not in hits[0], report.unread


def test_a_process_line_of_a_ring_timeout_is_not_given_to_a_later_page_fault() -> None:
    # legacy-6127: "Process gst-plugin-scan pid 4087" follows the ring timeout, not the page fault after it
    facts = diagnose_text(read("issues/dmesg_ring-reset_page-fault_gfx1201_legacy-6127.excerpt.txt")).facts
    assert facts["page_faults"][0]["processes"] == [] and "page_fault_processes" not in facts


def test_no_binary_for_gpu_names_the_bundled_targets_that_differ_only_in_features() -> None:
    line = "hip_fatbin.cpp: No compatible code objects found for: gfx1201\n"
    report = diagnose_text(line)
    assert report.kinds == ["HIP runtime log"] and report.facts["hip_targets_without_code_object"] == ["gfx1201"]
    assert "gfx_target_ids" not in report.facts  # no feature suffix stated, none invented
    bare = diagnose_text('rocclr/hip_code_object.cpp:486: "hipErrorNoBinaryForGpu: Unable to find code object for '
                         'all current devices!"\n')
    assert bare.facts["hip_error"] == "hipErrorNoBinaryForGpu"
    assert [s for s in bare.unread if "'Devices:' list" in s]


def test_missing_co_lists_only_the_lines_under_its_heading() -> None:
    # the ROCm 6 listing names each target on its own line; a "Found CO" line elsewhere is not a missing target
    text = read("hip_errors/hip_missing-co_gfx90a-sramecc-xnack_mi250x_legacy-4208.excerpt.txt")
    found = "hip_fatbin.cpp: Found CO for device  amdgcn-amd-amdhsa--gfx1030, file: /opt/rocm/lib/librocblas.so\n"
    report = diagnose_text(found + text)
    assert report.facts["hip_targets_without_code_object"] == ["gfx90a:sramecc+:xnack-"]
    head = [line for line in text.splitlines() if "Missing CO" in line][0]
    alone = diagnose_text(head + "\n" + "      amdgcn-amd-amdhsa--gfx1101\n")  # the item line without its log prefix
    assert alone.facts["hip_targets_without_code_object"] == ["gfx1101"] and "gfx_target_ids" not in alone.facts
