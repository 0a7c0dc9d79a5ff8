"""`conformance diagnose` on every recorded tool output in fixtures/tools (sources in its SOURCES.md).

Three properties: every file is read or cleanly refused (never an exception); every fact read is stated by
the text itself (no value is invented or guessed from another field); the facts each source states are the
ones read (the table below, values checked by eye against the recordings).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_checks.diagnose import diagnose_text
from env_checks.pasted import rocm_smi

TOOLS = Path(__file__).resolve().parents[2] / "fixtures" / "tools"
FILES = sorted(p for p in TOOLS.rglob("*") if p.is_file() and p.name != "SOURCES.md" and "isa" not in p.parts)
# facts whose value must appear verbatim (case-insensitively) in the text they were read from
VERBATIM = ("gpu_models", "device_ids", "driver_version", "cuda_version", "rocm_version", "hip_version",
            "torch_version", "vllm_version", "vbios_version", "compute_partition", "memory_partition",
            "kernel_release", "amd_smi_version", "nvidia_driver_version", "torch_rocm_build", "torch_cuda_build")


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def test_there_are_enough_recordings() -> None:
    real = [p for p in FILES if ".derived." not in p.name]
    derived = [p for p in FILES if ".derived." in p.name]
    assert len(real) >= 60 and len(derived) >= 15, (len(real), len(derived))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(TOOLS)) for p in FILES])
def test_every_recording_is_read_or_refused_with_only_stated_facts(path: Path) -> None:
    text = read(path)
    report = diagnose_text(text) if text.strip() else None
    if report is None:
        return  # the empty file: the CLI answers it (see test_diagnose_cli)
    assert report.kinds or report.unread, "neither read nor refused with a sentence"
    for sentence in report.unread:
        assert sentence.endswith(".") and "\n" not in sentence and "Traceback" not in sentence
    lowered = text.lower()
    for key in VERBATIM:
        values = report.facts.get(key)
        for value in values if isinstance(values, list) else [values] if values else []:
            assert str(value).lower() in lowered, f"{key}={value!r} is not stated in {path.name}"
    # rocm-smi prints gfx90a as gfx9010 (env_checks/rocm_smi.py): the ISA name stands for a stated printed name
    printed = {rocm_smi.isa_name(name): name.lower() for name in report.facts.get("gfx_version_as_printed", [])}
    for gfx in report.facts.get("gfx_targets", []):
        assert (gfx in lowered or printed.get(gfx, "\0") in lowered) and gfx.startswith("gfx") and ":" not in gfx
    count = report.facts.get("gpu_count")
    assert count is None or isinstance(count, int) and count > 0


# file -> facts the recording states (a subset of what diagnose reads)
EXPECTED: dict[str, dict[str, object]] = {
    "rocminfo_mi300x_8gpu_rocm6.2.3.txt": {"gpu_models": ["AMD Instinct MI300X"], "gfx_targets": ["gfx942"],
                                           "gpu_count": 8, "firmware": {"mec": "150"}},
    "rocminfo_mi300x_vf_rocm7.2.4.txt": {"gpu_models": ["AMD Instinct MI300X VF"], "gpu_count": 1,
                                         "virtualization": "VF (SR-IOV guest)", "firmware": {"mec": "189"}},
    "rocminfo_mi250x_rocm5.7.txt": {"gfx_targets": ["gfx90a"], "gpu_count": 1, "compute_units": ["110"]},
    "thamada/MI300X_x4_rocminfo_out.txt": {"gfx_targets": ["gfx942"], "gpu_count": 4, "compute_units": ["304"]},
    "amd-smi_static_mi300a_docs.txt": {"gpu_models": ["AMD Instinct MI300A"], "gfx_targets": ["gfx942"],
                                       "compute_partition": "SPX", "memory_partition": "NPS1"},
    "amd-smi_firmware_mi300a_rocm6.3.3.txt": {"firmware": {"mec": "166"}, "gpus_listed": 4},
    "amdsmi_changelog/amd-smi_static-asic_changelog-L457.txt": {"gpu_models": ["MI308X"],
                                                                "gfx_targets": ["gfx942"], "device_ids": ["0x74a2"]},
    "amdsmi_changelog/amd-smi_static-partition_changelog-L564.txt": {"compute_partition": "CPX",
                                                                     "memory_partition": "NPS4"},
    "amdsmi_changelog/amd-smi_list_changelog-L437.txt": {"gpus_listed": 2},
    "amdsmi_changelog/amd-smi_monitor-p-t-v_changelog-L611.txt": {"gpus_listed": 32, "vram_total_mib": 196300},
    "amdsmi_changelog/amd-smi_monitor-violation_changelog-L79.txt": {"gpu_count_at_least": 16},
    "amdsmi_changelog/amd-smi_topology_changelog-L1669.txt": {"gpus_listed": 8, "gpu_links": "XGMI"},
    "amdsmi_changelog/amd-smi_xgmi_changelog-L1599.txt": {"gpus_listed": 8},
    "amdsmi_changelog/amd-smi_topology-json_changelog-L1190.txt": {"gpu_count": 2},
    "amdsmi_changelog/amd-smi_metric-p-json_changelog-L1635.txt": {"gpu_count": 1},
    "amdsmi_changelog/amd-smi_metric-ecc-block_changelog-L972.txt": {
        "ecc": {"blocks_correctable_count": 0, "blocks_uncorrectable_count": 0}},
    "amdsmi_changelog/amd-smi_static_mi300a_cli-readme-L694.txt": {"gpu_models": ["MI300A"], "gpus_listed": 4,
                                                                   "device_ids": ["0x74a0"]},
    "issues/amd-smi_static_mi350x_rocm-systems-2987.excerpt.txt": {
        "gpu_models": ["AMD Instinct MI350X"], "gfx_targets": ["gfx950"], "driver_version": "6.18.3",
        "kernel_release": "5.15.0-164-generic"},
    "issues/amd-smi_version_mi300x_k8s-device-plugin-157.txt": {"rocm_version": "6.4.0",
                                                                "amd_smi_version": "25.3.0+ede62f2"},
    "issues/rocm-smi_i_mi300x_rocm6.4.1_legacy-4759.excerpt.txt": {
        "gpu_models": ["AMD Instinct MI300X"], "rocm_version": "6.4.1", "driver_version": "6.10.5",
        "gpu_count_at_least": 6},
    "issues/rocm-smi_concise_mi300x_cpx_legacy-4750.excerpt.txt": {"compute_partition": "CPX",
                                                                   "memory_partition": "NPS1"},
    "issues/rocm-smi_pcibus_mi300_tpx_legacy-4261.txt": {"gpu_count": 3},
    "thamada/MI300X_smi_out.txt": {"gpu_models": ["AMD Instinct MI300X"], "gpu_count": 1,
                                   "compute_partition": "SPX", "memory_partition": "NPS1"},
    "thamada/MI300X_x4_smi_out.txt": {"gpu_count": 4},
    "thamada/MI300X_x4_smi_out_a.txt": {"driver_version": "6.7.0", "device_ids": ["0x74a1"], "gpu_count": 4,
                                        "firmware": {"mec": "138"}},
    "rocm-smi_a_json_mi210_wandb.json": {"driver_version": "5.18.13", "gpu_count": 1, "firmware": {"mec": "70"}},
    "thamada/H100SXMx8_smi_out.txt": {"gpu_models": ["NVIDIA H100 80GB HBM3"], "gpu_count": 8,
                                      "driver_version": "565.57.01", "cuda_version": "12.7"},
    "thamada/H100SXMx8_smi_out_a.txt": {"gpu_models": ["NVIDIA H100 80GB HBM3"], "gpu_count": 8,
                                        "driver_version": "565.57.01"},
    "thamada/H100NVLx2_smi_out.txt": {"gpu_models": ["NVIDIA H100 NVL"], "gpu_count": 2,
                                      "vram_total_mib": 95830},
    "thamada/A100SXMx4_smi_out_a.txt": {"gpu_count": 4, "driver_version": "555.42.02"},
    "issues/nvidia-smi_b200_sglang-27487.excerpt.txt": {"gpu_models": ["NVIDIA B200"], "driver_version": "610.43.02",
                                                        "cuda_version": "13.3", "gpu_count_at_least": 2},
    "nvidia-smi_q_x_h200.xml": {"gpu_models": ["NVIDIA H200"], "gpu_count": 1, "driver_version": "580.159.04",
                                "cuda_version": "13.0", "virtualization": "Pass-Through"},
    "nvidia-smi_query-gpu_h200.csv": {"gpu_models": ["NVIDIA H200"], "driver_version": "580.159.04",
                                      "compute_capability": "9.0", "vram_total_mib": 143771},
    "issues/collect_env_mi250x_vllm-10663.excerpt.txt": {
        "gpu_models": ["AMD Instinct MI250X/MI250"], "gfx_targets": ["gfx90a"], "hip_version": "6.2.41133",
        "torch_version": "2.6.0.dev20240918+rocm6.2", "kernel_release": "4.18.0-553.22.1.el8_10.x86_64"},
    "issues/collect_env_cuda_rtx4070_vllm-9293.excerpt.txt": {
        "torch_version": "2.4.0+cu121", "torch_cuda_build": "12.1", "nvidia_driver_version": "551.88",
        "kernel_release": "5.15.153.1-microsoft-standard-WSL2"},
    "issues/collect_env_mi300x_rocm-vllm-397.excerpt.txt": {"torch_rocm_build": "6.1.40093"},
    "issues/hipconfig_rocm6.2.0_hip-3521.excerpt.txt": {"hip_version": "6.2.41133-dd7f95766",
                                                        "hip_platform": "amd", "rocm_version": "6.2.0"},
    "issues/modinfo_amdgpu_dkms_legacy-1584.excerpt.txt": {"driver_version": "5.11.14",
                                                           "driver_source": "DKMS (amdgpu-dkms)"},
    "issues/dmesg_aca-uncorrectable_mi300x_legacy-4021.excerpt.txt": {"gpus_named_in_log": 3},
    "issues/vllm-server_startup_cuda_tp2_vllm-24162.excerpt.txt": {
        "vllm_version": "0.10.2.dev378+g4d7fe40fc.d20250829", "platform": "cuda", "tensor_parallel_size": 2,
        "max_model_len": 32768},
    "issues/vllm-server_startup_rocm_triton-gfx906-1.excerpt.txt": {"platform": "rocm", "tensor_parallel_size": 4},
    "issues/vllm-server_kv-cache_vllm-20707.excerpt.txt": {"kv_cache_tokens": 922496},
    "issues/collect_env_mi300x_vllm-c-missing_vllm-7951.excerpt.txt": {
        "gpu_models": ["AMD Instinct MI300X"], "gfx_targets": ["gfx942"], "hip_version": "6.1.40093",
        "kernel_release": "5.15.0-119-generic"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_facts_a_source_states_are_read(name: str) -> None:
    report = diagnose_text(read(TOOLS / name))
    for key, want in EXPECTED[name].items():
        got = report.facts.get(key)
        if isinstance(want, dict):
            assert isinstance(got, dict) and {k: got.get(k) for k in want} == want, (key, got)
        else:
            assert got == want, (key, got)


# a cut or damaged copy: partial facts, a sentence naming what is missing, and no exact count
DAMAGED = {
    "rocminfo_mi300x_vf_truncated.derived.txt": ("*** Done ***", {"gfx_targets": ["gfx942"]}),
    "derived/rocminfo_mi300x_x4_truncated.derived.txt": ("*** Done ***", {"gpu_models": ["AMD Instinct MI300X"]}),
    "derived/rocm-smi_concise_mi300x_x4_truncated.derived.txt": ("End of ROCm SMI Log", {"gpu_count_at_least": 3}),
    "derived/nvidia-smi_h100x8_table_truncated.derived.txt": ("Processes", {"gpu_count_at_least": 3,
                                                                           "driver_version": "565.57.01"}),
    "derived/nvidia-smi_q_h100x8_truncated.derived.txt": ("states 8 GPUs but shows 2", {"gpu_count": 8}),
    "derived/nvidia-smi_b200_no-header.derived.txt": ("header line is missing", {"gpu_models": ["NVIDIA B200"]}),
    "nvidia-smi_q_x_h200_truncated.derived.xml": ("XML is cut", {"driver_version": "580.159.04"}),
    "derived/nvidia-smi_q_x_h200_cut-in-tag.derived.xml": ("XML is cut", {"cuda_version": "13.0"}),
    "nvidia-smi_query-gpu_h200_truncated.derived.csv": ("fewer fields", {}),
    "derived/nvidia-smi_query-gpu_h200_header-only.derived.csv": ("no data rows", {}),
    "amd-smi_firmware_truncated.derived.json": ("JSON breaks off", {}),
    "derived/amd-smi_topology_json_truncated.derived.txt": ("JSON breaks off", {"gpu_count_at_least": 1}),
    "derived/amd-smi_list_json-garbage.derived.txt": ("JSON breaks off", {}),
    "derived/collect_env_mi250x_garbled.derived.txt": ("not UTF-8", {"gfx_targets": ["gfx90a"]}),
    "derived/rocm-smi_a_mi300x_x4_truncated.derived.txt": ("End of ROCm SMI Log", {"driver_version": "6.7.0"}),
    "issues/modinfo_amdgpu_dkms_legacy-1584.excerpt.txt": ("vermagic", {"driver_version": "5.11.14"}),
    "issues/amd-smi_version_mi300x_k8s-device-plugin-157.txt": ("not a version number", {"rocm_version": "6.4.0"}),
    "issues/rocminfo_hsa-out-of-resources_legacy-1070.txt": ("HSA_STATUS_ERROR_OUT_OF_RESOURCES", {}),
    "derived/binary-noise.derived.bin": ("not an output of a tool", {}),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_copy_gives_partial_facts_and_says_what_is_missing(name: str) -> None:
    phrase, want = DAMAGED[name]
    report = diagnose_text(read(TOOLS / name))
    assert any(phrase in sentence for sentence in report.unread), report.unread
    for key, value in want.items():
        assert report.facts.get(key) == value, (key, report.facts.get(key))
    if "gpu_count_at_least" in want:
        assert "gpu_count" not in report.facts  # a cut paste never claims an exact count


def test_a_cut_amd_smi_text_never_claims_an_exact_count() -> None:
    whole = diagnose_text(read(TOOLS / "amdsmi_changelog/amd-smi_static_mi300a_cli-readme-L694.txt"))
    cut = diagnose_text(read(TOOLS / "derived/amd-smi_static_mi300a_readme_truncated.derived.txt"))
    assert whole.facts["gpus_listed"] == 4 and cut.facts["gpus_listed"] == 2
    assert "gpu_count" not in whole.facts and "gpu_count" not in cut.facts


def test_crlf_line_ends_read_like_unix_ones() -> None:
    unix = diagnose_text(read(TOOLS / "amdsmi_changelog/amd-smi_monitor-ptumv_changelog-L1389.txt"))
    crlf = diagnose_text(read(TOOLS / "derived/amd-smi_monitor-ptumv_crlf.derived.txt"))
    assert crlf.facts == unix.facts and crlf.facts["gpus_listed"] == 8


def test_fault_signatures_in_recorded_kernel_logs() -> None:
    def ids(name: str) -> list[str]:
        return [m.id for m in diagnose_text(read(TOOLS / name)).faults]

    assert ids("issues/dmesg_ring-timeout_mes_gpu-reset_legacy-6273.excerpt.txt") == [
        "amdgpu-ring-timeout", "amdgpu-mes-timeout", "amdgpu-gpu-reset"]
    assert ids("issues/dmesg_aca-uncorrectable_mi300x_legacy-4021.excerpt.txt") == ["amdgpu-ras-uncorrectable"]
    assert ids("issues/dmesg_nvidia-xid-119_gpud.log") == ["nvidia-xid-gsp"]
    assert "amdgpu-page-fault" in ids("issues/dmesg_ring-reset_page-fault_gfx1201_legacy-6127.excerpt.txt")
    assert ids("issues/journal_sdma-timeout_mes_legacy-2533.excerpt.txt") == [
        "amdgpu-ring-timeout", "amdgpu-mes-timeout", "amdgpu-gpu-reset"]
    assert ids("issues/dmesg_nccl-segfault_gpud.log") == ["nccl-segfault"]
    assert ids("issues/collect_env_mi300x_vllm-c-missing_vllm-7951.excerpt.txt") == ["vllm-c-missing"]
    assert ids("issues/vllm-log_hip-oom_gfx1151_lemonade-vllm-rocm-5.excerpt.txt") == ["device-oom"]
    oom = diagnose_text(read(TOOLS / "issues/vllm-log_hip-oom_gfx1151_lemonade-vllm-rocm-5.excerpt.txt"))
    assert oom.kinds == ["error trace"] and oom.facts["exception"].startswith("OutOfMemoryError: HIP out of memory.")
    # the cut copy keeps the faults before the cut and loses the MES line
    assert ids("derived/dmesg_ring-timeout_cut-midline.derived.txt") == ["amdgpu-ring-timeout", "amdgpu-gpu-reset"]


def test_healthy_recordings_match_no_fault_signature() -> None:
    for name in ("rocminfo_mi300x_8gpu_rocm6.2.3.txt", "thamada/H100SXMx8_smi_out_a.txt",
                 "thamada/MI300X_x4_smi_out_a.txt", "issues/collect_env_mi250x_vllm-10663.excerpt.txt",
                 "amdsmi_changelog/amd-smi_metric-ecc-block_changelog-L972.txt",
                 # its traceback only warns about vllm._version: not the missing vllm._C extension
                 "issues/trace_vllm-c-missing_vllm-15592.excerpt.txt"):
        report = diagnose_text(read(TOOLS / name))
        assert report.faults == [] and report.exit_code == 0, (name, [m.id for m in report.faults])
