"""Facts each recorded output states plainly and `conformance diagnose` reads: rocminfo's KFD version, full ISA names
and the counts an elided listing implies; amd-smi's compute units, socket power, process ids and library version;
rocm-smi's device ids (concise table, Card Model), VRAM totals (text, --csv, --json) and the `gfx9010` it prints for
gfx90a; collect_env parts and topology tails; the device id, ring, MES and reset facts of amdgpu kernel logs. Every
value is checked against its recording (fixtures/tools/SOURCES.md names each source), and so is the sentence a cut
copy gives for what it could not read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_checks.diagnose import diagnose_text

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "fixtures" / "tools"
# string facts (or their list items / dict values) that must appear verbatim, case aside, in their recording
VERBATIM = ("kfd_version", "hsa_runtime_ext_version", "isa_names", "amdsmi_library_version", "amd_hsmp_version",
            "timed_out_rings", "ring_resets_failed", "ring_resets_succeeded", "mes_unanswered_messages",
            "gpu_reset_methods", "gfx_version_as_printed", "collect_env_sections", "gpu_link_weights",
            "gpu_link_hops", "device_ids", "process_ids", "process_names", "compute_units", "vllm_version",
            "render_nodes", "vbios_version", "vram_total_by_gpu")
ALL = sorted(p for p in TOOLS.rglob("*") if p.is_file() and p.name != "SOURCES.md" and "isa" not in p.parts)


def read(name: str | Path) -> str:
    return (TOOLS / name).read_bytes().decode("utf-8", errors="replace")


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(TOOLS)) for p in ALL])
def test_new_facts_are_stated_verbatim(path: Path) -> None:
    text = read(path)
    if not text.strip():
        return
    lowered = text.lower()
    facts = diagnose_text(text).facts
    for key in VERBATIM:
        value = facts.get(key)
        values = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for v in values:
            if v is not None:
                assert str(v).lower() in lowered, f"{key}={v!r} is not stated in {path.name}"
    for gpu, watts in facts.get("socket_power_w", {}).items():
        assert f"{watts}" in text, (gpu, watts)
    for card, size in facts.get("vram_total_bytes", {}).items():
        assert str(size) in text, (card, size)


EXPECTED: dict[str, dict[str, object]] = {
    # rocminfo: the KFD version, the runtime extension version, full ISA names and the target ids they carry
    "rocminfo_mi300x_8gpu_rocm6.2.3.txt": {
        "kfd_version": "6.8.5", "hsa_runtime_ext_version": "1.6", "device_ids": ["0x74a1"],
        "isa_names": ["amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"], "gfx_target_ids": ["gfx942:sramecc+:xnack-"]},
    "rocminfo_mi300x_vf_rocm7.2.4.txt": {"kfd_version": "6.16.13", "hsa_runtime_ext_version": "1.15"},
    "rocminfo_mi250x_rocm5.7.txt": {"isa_names": ["amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"],
                                    "gfx_target_ids": ["gfx90a:sramecc+:xnack-"]},
    "thamada/MI300X_x4_rocminfo_out.txt": {"gfx_target_ids": ["gfx942:sramecc+:xnack-"], "device_ids": ["0x74a1"]},
    # a listing that elides agents 1-15: Agent 16 / Node 15 are lower bounds
    "rocminfo_elided/rocminfo_elided_mi250x-agent16_aiter-179.excerpt.txt": {
        "kfd_version": "6.10.5", "hsa_agents_at_least": 16, "kfd_nodes_at_least": 16, "gpu_count_at_least": 1,
        "device_ids": ["0x740c"], "gpu_models": ["AMD Instinct MI250X/MI250"]},
    # amd-smi static --asic (text), static (JSON and text), metric --power (text and JSON), process (text), version
    "amdsmi_changelog/amd-smi_static-asic_changelog-L457.txt": {"compute_units": ["20"]},
    "amdsmi_changelog/amd-smi_static-asic_changelog-L492.txt": {"compute_units": ["20"]},
    "issues/amd-smi_static_mi350x_rocm-systems-2987.excerpt.txt": {"compute_units": ["128"]},
    "amd-smi_static_mi300a_docs.txt": {"compute_units": ["228"]},
    "amdsmi_changelog/amd-smi_metric-power_changelog-L1015.txt": {"socket_power_w": {"0": 11, "1": 17}},
    "amdsmi_changelog/amd-smi_metric-p-json_changelog-L1635.txt": {"socket_power_w": {"0": 10}},
    "amdsmi_changelog/amd-smi_process_changelog-L767.txt": {"process_ids": ["1693982"]},
    "amdsmi_changelog/amd-smi_process_changelog-L783.txt": {"process_ids": ["1693982"],
                                                            "process_names": ["TransferBench"]},
    "second/amd-smi_version_mi300x-vf_rocm-5231.txt": {"amdsmi_library_version": "26.2.0"},
    "issues/amd-smi_version_mi300x_k8s-device-plugin-157.txt": {"amdsmi_library_version": "25.3.0"},
    "issues/rocm-smi_i_mi300x_rocm6.4.1_legacy-4759.excerpt.txt": {"amdsmi_library_version": "25.4.0"},
    # rocm-smi: concise tables of both layouts, --showproduct, --csv and --json (incl. the MI250X gfx9010 quirk)
    "rocm-smi_concise/rocm-smi_concise_did-guid_navi-x2_rocm-smi-lib-changelog-L184.txt": {
        "device_ids": ["0x73bf", "0x73a3"], "gpu_count": 2},
    "rocm-smi_concise/rocm-smi_concise_model-revision_mi300a_rocm-smi-lib-changelog-L357.txt": {
        "device_ids": ["0x74a0"], "gpu_count": 1},
    "thamada/MI300X_smi_out.txt": {"device_ids": ["0x74a1"]},
    "issues/rocm-smi_concise_mi300x_cpx_legacy-4750.excerpt.txt": {"device_ids": ["0x74a1"]},
    "rocm-smi_product/rocm-smi_showproduct_mi300a-tpx_rocm-smi-lib-changelog-L281.txt": {
        "device_ids": ["0x74a0"], "gfx_targets": ["gfx942"], "gpu_models": ["Aqua Vanjaram [Instinct MI300A]"],
        "gpu_count": 4},
    "rocm-smi_csv/rocm-smi_productname-use-vram_csv_rx7900xt_marimo-9237.txt": {
        "gpu_models": ["Radeon RX 7900 XT"], "gfx_targets": ["gfx1100"], "device_ids": ["0x744c"],
        "vram_total_bytes": {"card0": 21458059264}},
    "rocm-smi_csv/rocm-smi_productname-vram-uniqueid_csv_rx6800-raphael_localai-7761.txt": {
        "gfx_targets": ["gfx1030", "gfx1036"], "device_ids": ["0x73bf", "0x164e"],
        "vram_total_bytes": {"card0": 17163091968, "card1": 67108864}},
    "rocm-smi_json/rocm-smi_productname-use-vram_json_rx7900xt_marimo-9237.json": {
        "gpu_models": ["Radeon RX 7900 XT"], "gfx_targets": ["gfx1100"], "device_ids": ["0x744c"],
        "vram_total_bytes": {"card0": 21458059264}, "gpu_count": 1},
    "rocm-smi_json/rocm-smi_showproductname_json_mi250x-gfx9010_rocm-smi-lib-159.json": {
        "gpu_models": ["AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2"], "gfx_targets": ["gfx90a"],
        "gfx_version_as_printed": ["gfx9010"], "device_ids": ["0x7408"], "gpu_count": 1},
    # collect_env: a tail inside the GPU topology section (two), and a tail from the libraries list on ROCm 7.2
    "collect_env_tail/collect_env_rocm-tail_topology_mi-x8_vllm-53900.excerpt.txt": {
        "kinds": ["collect_env (tail: GPU topology)"], "gpu_count": 8, "gpu_link_weights": ["15"],
        "gpu_link_hops": ["1"]},
    "collect_env_tail/collect_env_rocm-tail_topology_mi-x8_vllm-38498.excerpt.txt": {
        "kinds": ["collect_env (tail: GPU topology)"], "gpu_count": 8, "gpu_link_weights": ["15"],
        "gpu_link_hops": ["1"]},
    "collect_env_tail/collect_env_rocm7.2_vllm-info-tail_mi-x8_vllm-45752.excerpt.txt": {
        "kinds": ["collect_env (part)"], "rocm_version": "7.2.53211-35e8c7bf89", "vllm_version": "0.1.dev0",
        "torch_version": "2.10.0+git8514f05", "collect_env_sections": ["Versions of relevant libraries", "vLLM Info"]},
    # kernel logs: the device id of a boot log interleaved with other drivers' lines, the hung ring of a MES reset,
    # the process of a gfxhub page fault, and the VM-fault/BACO log of the node-scraper cross-check
    "kernel_boot/dmesg_boot_interleaved_mi300x_legacy-4454.excerpt.txt": {"device_ids": ["0x74A1"]},
    "kernel_boot/dmesg_boot_rx7900_cachyos-643.excerpt.txt": {"device_ids": ["0x744C"], "pci_bdfs": ["0000:2f:00.0"]},
    "kernel_faults/dmesg_ip-discovery-failed_mi300x_legacy-3856.txt": {"device_ids": ["0x74A1"]},
    "kernel_resets/dmesg_mes-reset_gfx-ring_navi33_steamos-2802.excerpt.txt": {
        "timed_out_rings": ["gfx_0.0.0"], "ring_resets_failed": ["gfx_0.0.0"],
        "mes_unanswered_messages": ["RESET", "REMOVE_QUEUE"]},
    "issues/dmesg_ring-timeout_mes_gpu-reset_legacy-6273.excerpt.txt": {
        "timed_out_rings": ["gfx_0.0.0"], "ring_resets_failed": ["gfx_0.0.0"],
        "mes_unanswered_messages": ["REMOVE_QUEUE"], "gpu_reset_methods": ["MODE2"]},
    "kernel_faults/dmesg_vm-fault_qcm-fence_baco_legacy-1020.excerpt.txt": {
        "page_fault_processes": ["gpuowl pid 4376"], "page_fault_hubs": ["gfxhub0"], "qcm_fence_timeouts": 1,
        "ip_suspend_failures": ["powerplay -5"], "gpu_reset_methods": ["BACO"]},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_states_these_facts(name: str) -> None:
    report = diagnose_text(read(name))
    for key, want in EXPECTED[name].items():
        got = report.kinds if key == "kinds" else report.facts.get(key)
        assert got == want, f"{name}: {key} is {got!r}, the recording states {want!r}"


# cut or damaged copies: what they still state, and the one sentence on what they could not
CUT: dict[str, tuple[dict[str, object], str]] = {
    "derived/collect_env_vllm_cu130_cut-before-pytorch-version.derived.txt": (
        {"os": "Ubuntu 22.04.5 LTS (x86_64)", "collect_env_sections": ["System Info", "PyTorch Info"]},
        "This is part of a collect_env output (System Info, PyTorch Info shown)"),
    "derived/collect_env_vllm_cu130_from-python-environment.derived.txt": (
        {"nvidia_driver_version": "580.126.20", "gpu_models": ["NVIDIA A100-SXM4-40GB"]},
        "what its System Info, PyTorch Info"),
    "derived/rocm-smi_showproductname_json_no-outer-brace.derived.json": (
        {"gfx_targets": ["gfx90a"], "device_ids": ["0x7408"], "gpu_count_at_least": 1},
        "The rocm-smi JSON is a fragment"),
    "rocminfo_elided/rocminfo_elided_mi250x-agent16_aiter-179.excerpt.txt": (
        {"hsa_agents_at_least": 16}, "The listing elides agents ('...')"),
    "collect_env_tail/collect_env_rocm-tail_topology_mi-x8_vllm-53900.excerpt.txt": (
        {"gpu_link_hops": ["1"]}, "The 'Hops between two GPUs' matrix is cut after 1 of its 8 rows."),
}


@pytest.mark.parametrize("name", sorted(CUT))
def test_cut_copy_reads_what_it_can_and_says_what_it_could_not(name: str) -> None:
    facts, sentence = CUT[name]
    report = diagnose_text(read(name))
    for key, want in facts.items():
        assert report.facts.get(key) == want, (key, report.facts.get(key))
    assert any(sentence in s for s in report.unread), report.unread
    assert not any("not an output of a tool" in s for s in report.unread)


def test_rocm_smi_decodes_only_a_decimal_stepping() -> None:
    from env_checks.pasted.rocm_smi import isa_name

    assert (isa_name("gfx9010"), isa_name("gfx9012"), isa_name("gfx942"), isa_name("gfx1030")) == (
        "gfx90a", "gfx90c", None, None)
