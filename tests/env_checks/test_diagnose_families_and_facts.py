"""`conformance diagnose` on public outputs it once refused: families it used to refuse (the amd-smi default view,
amd-smi partition, part of a rocminfo agent block, rocm-smi --showvoltage, amdgpu_firmware_info,
update-alternatives --display rocm, vLLM's newer collect_env layout) and facts it used to leave unread (PCI BDFs,
chip/device ids, per-block firmware, VBIOS, MIOpen, full gfx target ids). Sources: fixtures/tools/SOURCES.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_checks.diagnose import diagnose_text

TOOLS = Path(__file__).resolve().parents[2] / "fixtures" / "tools"
FAMILIES = ("amd-smi_default", "amd-smi_partition", "rocminfo_fragment", "rocm-smi_voltage", "amdgpu_firmware_info",
            "update-alternatives", "collect_env")
NEW = sorted(p for family in FAMILIES for p in (TOOLS / family).iterdir() if p.is_file())
REFUSED = "not an output of a tool"


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def test_each_family_has_at_least_two_recordings() -> None:
    for family in FAMILIES:
        assert len(list((TOOLS / family).iterdir())) >= (1 if family == "update-alternatives" else 2), family


@pytest.mark.parametrize("path", NEW, ids=[str(p.relative_to(TOOLS)) for p in NEW])
def test_every_new_recording_is_read_not_refused(path: Path) -> None:
    report = diagnose_text(read(path))
    assert report.kinds and report.facts, (report.kinds, report.unread)
    assert not any(REFUSED in s for s in report.unread)


# facts whose every value (or dict value) must be stated verbatim in the text it was read from
VERBATIM = ("pci_bdfs", "device_ids", "firmware", "vbios_version", "miopen_version", "gfx_target_ids", "rocm_path",
            "platform", "amd_smi_version", "rocm_installs", "rocm_version", "driver_version", "gpu_models",
            "compute_partition", "memory_partition", "process_ids", "process_names", "vram_type", "xgmi_bit_rate",
            "xgmi_max_bandwidth", "gpu_links", "kfd_mem_bank", "torch_version", "torch_cuda_build",
            "cuda_runtime_version", "nvidia_driver_version")
ALL = sorted(p for p in TOOLS.rglob("*") if p.is_file() and p.name != "SOURCES.md" and "isa" not in p.parts)


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(TOOLS)) for p in ALL])
def test_new_facts_are_stated_verbatim(path: Path) -> None:
    text = read(path)
    if not text.strip():
        return
    facts = diagnose_text(text).facts
    for key in VERBATIM:
        value = facts.get(key)
        values = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for v in values:
            if v is not None:
                assert str(v).lower() in text.lower(), f"{key}={v!r} is not stated in {path.name}"


EXPECTED: dict[str, dict[str, object]] = {
    "amd-smi_default/amd-smi_default_mi300a-x4_amdsmi-docs.txt": {
        "gpu_models": ["AMD Instinct MI300A"], "gpu_count": 4, "amd_smi_version": "27.0.0", "driver_version": "6.19.4",
        "rocm_version": "7.14.0", "compute_partition": "SPX", "memory_partition": "NPS1", "vram_total_mib": 385728,
        "pci_bdfs": ["0000:01:00.0", "0001:01:00.0", "0002:01:00.0", "0003:01:00.0"]},
    "amd-smi_default/amd-smi_default_mi325x_rocm-install-on-linux-656.excerpt.txt": {
        "gpu_models": ["AMD Instinct MI325X"], "gpu_count": 1, "pci_bdfs": ["0000:09:00.0"],
        "vram_total_mib": 262128},
    "amd-smi_partition/amd-smi_partition_mi300a-x4_legacy-4477.excerpt.txt": {"memory_partition": "NPS1",
                                                                             "gpus_listed": 4},
    "amd-smi_partition/amd-smi_partition_mi300a-x4_newer_legacy-4477.excerpt.txt": {
        "memory_partition": "NPS1", "compute_partition": "SPX", "gpus_listed": 4},
    "rocminfo_fragment/rocminfo_agent-fragment_mi300x_rocm-systems-8263.excerpt.txt": {
        "compute_units": ["304"], "firmware": {"mec": "191", "sdma": "25"}, "gpu_count_at_least": 1},
    "rocminfo_fragment/rocminfo_agent-fragment_mi300a_amdgpu-186.excerpt.txt": {"device_ids": ["0x74a0"],
                                                                               "compute_units": ["228"]},
    "rocminfo_fragment/rocminfo_agent-fragment_mi100_amdgpu-173.excerpt.txt": {
        "gpu_models": ["AMD Instinct MI100"], "device_ids": ["0x738c"]},
    "rocminfo_fragment/rocminfo_agent-fragment_vega10_onnxruntime-12662.excerpt.txt": {"device_ids": ["0x687f"],
                                                                                      "compute_units": ["56"]},
    "rocm-smi_voltage/rocm-smi_showvoltage_mi300x-x8_legacy-4278.txt": {"gpu_count": 8},
    "rocm-smi_voltage/rocm-smi_a_voltage_legacy-1449.excerpt.txt": {"voltage_mv": {"0": 825},
                                                                    "pci_bdfs": ["0000:43:00.0"]},
    "rocm-smi_voltage/rocm-smi_a_voltage-firmware_legacy-1715.excerpt.txt": {
        "voltage_mv": {"0": 775}, "pci_bdfs": ["0000:2F:00.0"], "firmware": {"asd": "553648218", "ce": "36"}},
    "amdgpu_firmware_info/amdgpu_firmware_info_pop-os-2132.excerpt.txt": {
        "firmware": {"mec": "0x00000058", "sos": "0x0022020a", "smc": "0x00412a00", "sdma0": "0x00000045"}},
    "amdgpu_firmware_info/amdgpu_firmware_info_rdna4_legacy-6155.excerpt.txt": {
        "firmware": {"mec": "0x00000c44", "imu": "0x0c302b00", "ta ras": "0x1b3a0001"}},
    "update-alternatives/update-alternatives_display_rocm_legacy-419.txt": {
        "rocm_version": "6.3.1", "rocm_path": "/opt/rocm-6.3.1", "rocm_alternative_mode": "auto"},
    "collect_env/collect_env_vllm-new-format_gfx906_vllm-gfx906-30.excerpt.txt": {
        "torch_version": "2.7.0+rocm6.3", "torch_rocm_build": "6.3.42131-fa1d09cbd", "gfx_targets": ["gfx906"],
        "gfx_target_ids": ["gfx906:sramecc+:xnack-"], "kernel_release": "5.15.0-119-generic"},
    "collect_env/collect_env_mi300a_miopen_vllm-17875.excerpt.txt": {
        "miopen_version": "3.4.0", "hip_version": "6.4.43482", "gfx_target_ids": ["gfx942:sramecc+:xnack-"]},
    "collect_env/collect_env_mi308x_miopen_vllm-15928.excerpt.txt": {"miopen_version": "3.3.0",
                                                                     "gpu_models": ["AMD Instinct MI308X"]},
    # facts now read from recordings that were read before
    "amdsmi_changelog/amd-smi_list_changelog-L437.txt": {"pci_bdfs": ["0000:23:00.0", "0000:26:00.0"]},
    "amdsmi_changelog/amd-smi_topology_changelog-L1669.txt": {"pci_bdfs": [
        "0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0", "0000:9f:00.0", "0000:af:00.0",
        "0000:bf:00.0", "0000:df:00.0"]},
    "amd-smi_firmware_mi300a_rocm6.3.3.txt": {"firmware": {
        "mec": "166", "cp_mec1": "166", "rlc": "65", "sdma0": "22", "vcn": "06.11.30.0C", "psp_sosdrv": "00.36.01.50",
        "ta_ras": "1B.36.02.0F", "pm": "04.85.103.184"}},
    "amd-smi_firmware_mi300a_rocm6.3.3.derived.json": {"firmware": {"cp_mec2": "166", "ta_xgmi": "20.00.01.13"}},
    "thamada/MI300X_x4_smi_out_a.txt": {"vbios_version": "113-MI3SRIOV-001", "pci_bdfs": [
        "0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0"], "firmware": {
        "mec": "138", "smc": "00.85.91.00", "sos": "0x0036024b", "ta ras": "32.00.00.12"}},
    "rocm-smi_a_json_mi210_wandb.json": {"vbios_version": "113-D67301-063", "pci_bdfs": ["0000:63:00.0"],
                                         "firmware": {"smc": "00.68.56.00", "ta xgmi": "32.00.00.13"}},
    "rocminfo_mi300x_8gpu_rocm6.2.3.txt": {"device_ids": ["0x74a1"], "firmware": {"mec": "150", "sdma": "21"}},
    "amd-smi_static_mi300a_docs.txt": {"pci_bdfs": ["0000:01:00.0"], "device_ids": ["0x74a0"]},
    "issues/collect_env_mi300x_vllm-c-missing_vllm-7951.excerpt.txt": {
        "miopen_version": "3.1.0", "gfx_target_ids": ["gfx942:sramecc+:xnack-"]},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_facts_a_source_states_are_read(name: str) -> None:
    facts = diagnose_text(read(TOOLS / name)).facts
    for key, want in EXPECTED[name].items():
        got = facts.get(key)
        if isinstance(want, dict):
            assert isinstance(got, dict) and {k: got.get(k) for k in want} == want, (key, got)
        else:
            assert got == want, (key, got)


# a real excerpt or a cut copy: partial facts and one sentence naming what could not be read
DAMAGED: dict[str, tuple[str, dict[str, object]]] = {
    "amd-smi_default/amd-smi_default_mi325x_rocm-install-on-linux-656.excerpt.txt": (
        "version header", {"gpu_models": ["AMD Instinct MI325X"]}),
    "derived/amd-smi_default_mi300a-x4_cut.derived.txt": ("cut before its 'Processes'", {"gpu_count_at_least": 3}),
    "amd-smi_partition/amd-smi_partition_mi300a-x4_legacy-4477.excerpt.txt": (
        "printed N/A as every GPU's ACCELERATOR_TYPE", {"memory_partition": "NPS1"}),
    "derived/amd-smi_partition_newer_cut.derived.txt": ("fewer columns than its header", {"gpu_count_at_least": 2}),
    "rocminfo_fragment/rocminfo_agent-fragment_mi300x_rocm-systems-8263.excerpt.txt": (
        "without its 'Device Type' line", {"compute_units": ["304"]}),
    "rocminfo_fragment/rocminfo_agent-fragment_mi100_amdgpu-173.excerpt.txt": (
        "no 'Agent N' header", {"gpu_count_at_least": 1}),
    "rocm-smi_voltage/rocm-smi_showvoltage_mi300x-x8_legacy-4278.txt": ("voltage as not supported on 8 GPU(s)", {}),
    "derived/rocm-smi_showvoltage_cut.derived.txt": ("End of ROCm SMI Log", {"gpu_count_at_least": 2}),
    "amdgpu_firmware_info/amdgpu_firmware_info_rdna4_legacy-6155.excerpt.txt": ("'VBIOS version' line", {}),
    "derived/amdgpu_firmware_info_cut-midline.derived.txt": ("last line is cut", {"firmware": {
        "me": "0x0000003e", "pfp": "0x00000056", "ce": "0x00000024", "rlc": "0x00000042", "mec": "0x00000058"}}),
    "derived/update-alternatives_display_rocm_cut.derived.txt": ("currently points to", {
        "rocm_alternative_mode": "auto"}),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_partial_copy_reads_partially_with_one_sentence(name: str) -> None:
    phrase, want = DAMAGED[name]
    report = diagnose_text(read(TOOLS / name))
    hits = [s for s in report.unread if phrase in s]
    assert len(hits) == 1 and hits[0].endswith(".") and "\n" not in hits[0], report.unread
    for key, value in want.items():
        assert report.facts.get(key) == value, (key, report.facts.get(key))
    if "gpu_count_at_least" in want:
        assert "gpu_count" not in report.facts


def test_a_whole_rocminfo_is_not_also_read_as_a_fragment() -> None:
    report = diagnose_text(read(TOOLS / "rocminfo_mi300x_8gpu_rocm6.2.3.txt"))
    assert report.kinds == ["rocminfo"] and report.facts["gpu_count"] == 8
