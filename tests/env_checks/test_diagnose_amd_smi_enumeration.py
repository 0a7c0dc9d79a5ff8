"""amd-smi facts read from the recordings found last (fixtures/tools/SOURCES.md, "amd-smi render nodes, partitioned
monitor rows, VBIOS versions and the HSMP version"): the render node of each GPU in `list -e`, the VRAM total of each
row of a partitioned `monitor`, the VBIOS version of `static` (also a grepped VBIOS block without its `GPU: n` line)
and of the ROCm 7.1/7.2 default view, and a non-N/A HSMP driver version in `version`. Every value asserted is stated
verbatim in its recording, and so is each sentence on what a recording does not state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_checks.diagnose import diagnose_text, merge_reports

TOOLS = Path(__file__).resolve().parents[2] / "fixtures" / "tools"


def read(name: str) -> str:
    return (TOOLS / name).read_text(encoding="utf-8")


CPX_192 = {str(i): "192.0 GB" for i in range(9)}
EXPECTED: dict[str, dict[str, object]] = {
    # amd-smi list -e: RENDER of every GPU block (a partition's N/A before the 6.4.1 fix is no fact)
    "amd-smi_list-e/amd-smi_list-e_mi325x-vf_device-metrics-exporter.excerpt.txt": {
        "render_nodes": {"0": "renderD185", "1": "renderD177"}, "pci_bdfs": ["0000:83:00.0", "0000:8b:00.0"]},
    "amd-smi_list-e/amd-smi_list-e_amdsmi-changelog-6.4.0.txt": {"render_nodes": {"0": "renderD128"}},
    "amd-smi_list-e/amd-smi_list-e_mi3x-cpx_previous_amdsmi-changelog-6.4.1.txt": {
        "render_nodes": {"0": "renderD128"}, "gpu_count_at_least": 2},
    "amd-smi_list-e/amd-smi_list-e_mi3x-cpx_corrected_amdsmi-changelog-6.4.1.txt": {
        "render_nodes": {"0": "renderD128", "1": "renderD129"}, "gpu_count_at_least": 2},
    # amd-smi monitor, one row per partition: the total of VRAM_USAGE (`0.5/ 24.0 GB`) or VRAM_TOTAL, per row
    "amd-smi_monitor_cpx/amd-smi_monitor_mi3x-cpx_previous_amdsmi-changelog-6.4.1.txt": {
        "vram_total_by_gpu": CPX_192, "gpu_count_at_least": 9},
    "amd-smi_monitor_cpx/amd-smi_monitor_mi3x-cpx_corrected_amdsmi-changelog-6.4.1.txt": {
        "vram_total_by_gpu": {**{str(i): "24.0 GB" for i in range(1, 8)}, "0": "192.0 GB", "8": "192.0 GB"},
        "gpu_count_at_least": 9},
    "amdsmi_changelog/amd-smi_monitor-p-t-v_changelog-L611.txt": {
        "vram_total_by_gpu": {str(i): "196300 MB" for i in range(32)}, "vram_total_mib": 196300, "gpus_listed": 32},
    "amdsmi_changelog/amd-smi_monitor-q_changelog-L728.txt": {
        "vram_total_by_gpu": {"0": "16335 MB"}, "vram_total_mib": 16335},
    # amd-smi static: the VBIOS block, with its GPU line or grepped without it
    "amd-smi_vbios/amd-smi_static-vbios_w7800_rocm-4226-c27.txt": {"vbios_version": "113-D7071100-101"},
    "amd-smi_vbios/amd-smi_static-vbios_w7800_rocm-4226-c30.txt": {"vbios_version": "022.001.002.030.000001"},
    "amd-smi_vbios/amd-smi_static_grep-vbios_mi300x-vf_amd-gpu-lab_before.txt": {
        "vbios_version": "022.040.003.041.000001"},
    "amd-smi_vbios/amd-smi_static_grep-vbios_mi300x-vf_amd-gpu-lab_after.txt": {
        "vbios_version": "022.040.003.043.000001"},
    # the default view of ROCm 7.1/7.2: three versions on the first header line, then `VBIOS version:`
    "amd-smi_default/amd-smi_default_rx9070xt-x2_rocm-5812.txt": {
        "amd_smi_version": "26.2.0+021c61fc", "driver_version": "6.16.6", "rocm_version": "7.1.1",
        "vbios_version": "00131162", "gpu_models": ["AMD Radeon RX 9070 XT"], "gpu_count": 2, "vram_total_mib": 16304},
    "amd-smi_default/amd-smi_default_rx9070xt_rocm-5812-c2.txt": {
        "amd_smi_version": "26.2.0+021c61fc", "driver_version": "6.16.6-061606", "rocm_version": "7.1.1",
        "vbios_version": "023.008.000.068.000001", "gpu_count_at_least": 1},
    "amd-smi_default/amd-smi_default_gfx1151_rocm-5902.txt": {
        "amd_smi_version": "26.2.1+fc0010cf6a", "rocm_version": "7.2.0", "vbios_version": "023.011.000.039.000001",
        "gpu_models": ["AMD Radeon Graphics"], "gpu_count": 1, "vram_total_mib": 98304},
    # amd-smi version with the amd_hsmp driver loaded
    "amd-smi_version_hsmp/amd-smi_version-g-c_mi300a-x4_amdsmi-86.txt": {
        "amd_hsmp_version": "2.2", "amdsmi_library_version": "25.3.0", "driver_version": "6.10.5"},
    "amd-smi_version_hsmp/amd-smi_version-g-c_mi300a-x4_rocm-4477-c5.txt": {
        "amd_hsmp_version": "2.2", "rocm_version": "6.4.0"},
    "amd-smi_version_hsmp/amd-smi_version_hsmp_amdsmi-changelog-6.4.0.txt": {
        "amd_hsmp_version": "2.2", "amdsmi_library_version": "24.7.2.0", "driver_version": "6.10.10"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_states_these_facts(name: str) -> None:
    text = read(name)
    facts = diagnose_text(text).facts
    for key, want in EXPECTED[name].items():
        assert facts.get(key) == want, f"{name}: {key} is {facts.get(key)!r}, the recording states {want!r}"
        values = want.values() if isinstance(want, dict) else want if isinstance(want, list) else [want]
        assert all(v in text for v in values if isinstance(v, str)), (name, key)  # counts are not printed


# what a recording does not state, in one sentence each
ABSENT: dict[str, tuple[tuple[str, ...], str]] = {
    "amd-smi_list-e/amd-smi_list-e_mi3x-cpx_previous_amdsmi-changelog-6.4.1.txt": (
        (), "RENDER is N/A for GPU 1, so its render node is not stated."),
    "amd-smi_vbios/amd-smi_static_grep-vbios_mi300x-vf_amd-gpu-lab_after.txt": (
        ("gpus_listed", "gpu_count", "gpu_count_at_least"),
        "The VBIOS block is pasted without its 'GPU: n' line"),
    "amd-smi_default/amd-smi_default_gfx1151_rocm-5902.txt": (
        ("driver_version", "compute_partition", "memory_partition"),
        "The 'amdgpu version' field reads 'Linuxver', not a version number"),
    "amd-smi_default/amd-smi_default_rx9070xt-x2_rocm-5812.txt": (("compute_partition", "memory_partition"), ""),
    "second/amd-smi_version_mi300x-vf_rocm-5231.txt": (("amd_hsmp_version",), ""),
}


@pytest.mark.parametrize("name", sorted(ABSENT))
def test_what_a_recording_does_not_state_is_no_fact(name: str) -> None:
    keys, sentence = ABSENT[name]
    report = diagnose_text(read(name))
    assert not set(keys) & set(report.facts), {k: report.facts[k] for k in set(keys) & set(report.facts)}
    assert not sentence or any(sentence in s for s in report.unread), report.unread
    assert not any("JSON" in s for s in report.unread), report.unread


def test_a_bracketed_shell_prompt_is_not_json() -> None:
    from env_checks.tool_text import json_start

    text = read("amd-smi_vbios/amd-smi_static_grep-vbios_mi300x-vf_amd-gpu-lab_after.txt")
    assert json_start(text) == -1
    assert json_start("[root@node ~]# amd-smi list --json\n[{\"gpu\": 0}]\n") > 0


def test_merged_with_list_e_the_monitor_rows_keep_their_gpu_index() -> None:
    names = ("amd-smi_list-e/amd-smi_list-e_mi3x-cpx_corrected_amdsmi-changelog-6.4.1.txt",
             "amd-smi_monitor_cpx/amd-smi_monitor_mi3x-cpx_corrected_amdsmi-changelog-6.4.1.txt")
    merged = merge_reports([(n.split("/")[1], diagnose_text(read(n))) for n in names])
    assert merged.facts["render_nodes"]["1"] == "renderD129"
    assert merged.facts["vram_total_by_gpu"]["1"] == "24.0 GB"
