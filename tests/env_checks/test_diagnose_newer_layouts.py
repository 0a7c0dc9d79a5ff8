"""Newer layouts: `amd-smi process --csv/--json`, `amd-smi static --json | jq` fragments, a CUDA 13
torch's collect_env, KFD topology mem_banks properties, the newer `amd-smi xgmi` layouts; and the contradictions
diagnose reports when it reads several files of one machine. Sources: fixtures/tools/SOURCES.md (every fact asserted
here is stated verbatim in its recording; test_diagnose_families_and_facts.py checks that for the string facts of
every recording).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env_checks import crosscheck
from env_checks.diagnose import KNOWN, build_parser, diagnose_text, merge_reports

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "fixtures" / "tools"
FAMILIES = {"amd-smi_process": 3, "amd-smi_xgmi": 4, "collect_env_cuda13": 2, "amd-smi_static_jq": 1,
            "kfd_mem_banks": 2}
NEW = sorted(p for family in FAMILIES for p in (TOOLS / family).iterdir())


def read(name: str | Path) -> str:
    return (TOOLS / name).read_bytes().decode("utf-8", errors="replace")


def test_recordings_per_family() -> None:
    for family, count in FAMILIES.items():
        assert len(list((TOOLS / family).iterdir())) == count, family


@pytest.mark.parametrize("path", NEW, ids=[str(p.relative_to(TOOLS)) for p in NEW])
def test_every_recording_is_read_not_refused(path: Path) -> None:
    report = diagnose_text(read(path))
    assert report.kinds and report.facts, (report.kinds, report.unread)
    assert not any("not an output of a tool" in s for s in report.unread)


EXPECTED: dict[str, dict[str, object]] = {
    "amd-smi_process/amd-smi_process_csv_mi300x-x8_rocm-blog.txt": {
        "kinds": ["amd-smi process (--csv)"], "gpus_with_processes": 8, "process_names": ["pt_main_thread"],
        "process_ids": ["207590", "207591", "207589", "207588", "207595", "207597", "207593"]},
    "amd-smi_process/amd-smi_process_csv-column_mi300x-x8_rocm-blog.txt": {
        "kinds": ["amd-smi process (--csv)"], "gpus_with_processes": 8,
        "process_ids": ["207590", "207591", "207589", "207588", "207595", "207597", "207594", "207593"]},
    "amd-smi_process/amd-smi_process_json_amdsmi-changelog.json": {
        "kinds": ["amd-smi process (--json)"], "process_ids": ["420157", "420315"],
        "process_names": ["TransferBench", "rvs"], "gpus_with_process_list": ["0"]},
    "amd-smi_static_jq/amd-smi_static_json_jq-vram_rocm-blog.json": {
        "kinds": ["amd-smi JSON fragment (jq)"], "vram_type": "HBM", "vram_total_mib": 196592},
    "kfd_mem_banks/kfd_mem_banks_node3_mi300x-cpx_rocm-4750.txt": {
        "kfd_mem_bank": {"node": "3", "bank": "0", "heap_type": "1", "size_in_bytes": "25767706624", "flags": "0",
                         "width": "8192", "mem_clk_max": "1300"},
        "kfd_heap_type": "frame buffer, public", "vram_bytes": 25767706624},
    # lines of a checked-in MI350X KFD capture as quoted under its path in a PR description (no heap_type line)
    "kfd_mem_banks/kfd_mem_banks_node5_mi350x_rocm-systems-10274.excerpt.txt": {
        "kinds": ["KFD topology mem_banks properties"],
        "kfd_mem_bank": {"node": "5", "bank": "0", "size_in_bytes": "309220868096", "width": "8192",
                         "mem_clk_max": "1900"},
        "kfd_heap_type": None, "vram_bytes": None},
    "collect_env_cuda13/collect_env_torch2.9.0-cu13.0_h100_pytorch-165892.excerpt.txt": {
        "kinds": ["collect_env"], "torch_version": "2.9.0", "torch_cuda_build": "13.0",
        "cuda_runtime_version": "13.0.88", "nvidia_driver_version": "570.172.08",
        "gpu_models": ["NVIDIA H100 80GB HBM3"]},
    "collect_env_cuda13/collect_env_vllm_torch2.11.0-cu130_a100_vllm-42533.excerpt.txt": {
        "kinds": ["collect_env"], "torch_version": "2.11.0+cu130", "torch_cuda_build": "13.0",
        "nvidia_driver_version": "580.126.20", "gpu_models": ["NVIDIA A100-SXM4-40GB"]},
    "amd-smi_xgmi/amd-smi_xgmi_mi300x-x8_short-bdf_rocm-blog.txt": {
        "kinds": ["amd-smi xgmi"], "pci_bdfs": ["05:00.0", "26:00.0"], "gpu_links": "XGMI",
        "xgmi_bit_rate": "32 Gb/s", "xgmi_max_bandwidth": "512 Gb/s", "gpu_count_at_least": 2},
    "amd-smi_xgmi/amd-smi_xgmi_link-status_mi3x-mvf_amdsmi-changelog.txt": {
        "kinds": ["amd-smi xgmi"], "gpu_count_at_least": 8, "xgmi_link_states": {"SELF": 8, "N/A": 56}},
    "amd-smi_xgmi/amd-smi_xgmi_source-status_mi3x-mvf_amdsmi-changelog.txt": {
        "gpu_count_at_least": 8, "xgmi_link_states": {"N/A": 64}},
    "amd-smi_xgmi/amd-smi_xgmi_metric_navi-no-xgmi_amdsmi-changelog.txt": {
        "pci_bdfs": ["0000:08:00.0", "0000:44:00.0"], "gpu_count_at_least": 2},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_facts_a_source_states_are_read(name: str) -> None:
    report = diagnose_text(read(name))
    for key, want in EXPECTED[name].items():
        got = report.kinds if key == "kinds" else report.facts.get(key)
        assert got == want, (key, got)
    assert "gpu_links" not in report.facts or report.facts["gpu_links"] in read(name)


def test_link_rows_are_not_counted_as_gpus_by_the_base_reader() -> None:
    report = diagnose_text(read("amd-smi_xgmi/amd-smi_xgmi_source-status_mi3x-mvf_amdsmi-changelog.txt"))
    assert report.kinds == ["amd-smi xgmi"] and "monitor_columns" not in report.facts


DAMAGED: dict[str, tuple[str, dict[str, object]]] = {
    "derived/amd-smi_process_csv_cut.derived.txt": ("fewer columns than the header", {"gpus_with_processes": 5}),
    "derived/kfd_mem_banks_cut.derived.txt": ("lack size_in_bytes", {"kfd_heap_type": "frame buffer, public"}),
    "kfd_mem_banks/kfd_mem_banks_node5_mi350x_rocm-systems-10274.excerpt.txt": ("lack heap_type", {}),
    "derived/amd-smi_static_jq_vram_cut.derived.json": ("cut or damaged", {"vram_type": "HBM"}),
    "amd-smi_static_jq/amd-smi_static_json_jq-vram_rocm-blog.json": ("without its 'gpu' index", {}),
    "amd-smi_xgmi/amd-smi_xgmi_mi300x-x8_short-bdf_rocm-blog.txt": ("[output truncated]", {"gpu_links": "XGMI"}),
    "amd-smi_xgmi/amd-smi_xgmi_link-status_mi3x-mvf_amdsmi-changelog.txt": ("Every XGMI link is reported as N/A", {}),
    "amd-smi_xgmi/amd-smi_xgmi_metric_navi-no-xgmi_amdsmi-changelog.txt": ("no XGMI links reported", {}),
    "collect_env_cuda13/collect_env_vllm_torch2.11.0-cu130_a100_vllm-42533.excerpt.txt": ("library list", {}),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_partial_copy_reads_partially_with_one_sentence(name: str) -> None:
    phrase, want = DAMAGED[name]
    report = diagnose_text(read(name))
    hits = [s for s in report.unread if phrase in s]
    assert len(hits) == 1 and hits[0].endswith(".") and "\n" not in hits[0], report.unread
    for key, value in want.items():
        assert report.facts.get(key) == value, (key, report.facts.get(key))


def test_a_number_cut_mid_line_is_not_read_as_a_size() -> None:
    report = diagnose_text(read("derived/kfd_mem_banks_cut.derived.txt"))
    assert "vram_bytes" not in report.facts and "size_in_bytes" not in report.facts["kfd_mem_bank"]


# ---------------------------------------------------------------- several files: contradictions
# These recordings come from different machines: together they stand for a machine whose outputs disagree.

def merged(*names: str) -> list[crosscheck.Contradiction]:
    return merge_reports([(Path(n).name, diagnose_text(read(n))) for n in names]).contradictions


def test_firmware_not_uniform_across_gpus_is_a_contradiction() -> None:
    found = merged("rocminfo_mi300x_8gpu_rocm6.2.3.txt", "amd-smi_firmware_mi300a_rocm6.3.3.txt")
    mec = [c for c in found if c.fact == "firmware.mec"]
    assert len(mec) == 1 and mec[0].check == "firmware-uniform"
    assert mec[0].values["rocminfo_mi300x_8gpu_rocm6.2.3.txt agent 3"] == "150"
    assert mec[0].values["amd-smi_firmware_mi300a_rocm6.3.3.txt GPU 0"] == "166"
    assert "150 on" in mec[0].sentence and "166 on" in mec[0].sentence


def test_uniform_firmware_within_one_file_is_no_contradiction() -> None:
    for name in ("amd-smi_firmware_mi300a_rocm6.3.3.txt", "rocminfo_mi300x_8gpu_rocm6.2.3.txt",
                 "thamada/MI300X_x4_smi_out_a.txt"):
        assert diagnose_text(read(name)).contradictions == [], name


def test_a_number_and_a_dotted_version_are_not_compared() -> None:
    inputs = [("a", ["amdgpu_firmware_info"], {"firmware": {"smc": "0x00412a00"}}),
              ("b", ["rocm-smi"], {"firmware_by_gpu": {"GPU 0": {"smc": "00.68.56.00"}}})]
    assert crosscheck.firmware(inputs) == []


def test_rocminfo_gfx_against_the_amd_smi_model() -> None:
    found = merged("rocminfo_mi250x_rocm5.7.txt", "amd-smi_static_mi300a_docs.txt")
    gfx = [c for c in found if c.check == "gfx-vs-model"]
    assert gfx and "gfx90a" in gfx[0].sentence and "MI300A" in gfx[0].sentence and "gfx942" in gfx[0].sentence
    assert not [c for c in merged("rocminfo_mi300x_8gpu_rocm6.2.3.txt",
                                  "amd-smi_default/amd-smi_default_mi325x_rocm-install-on-linux-656.excerpt.txt")
                if c.check == "gfx-vs-model"]


def test_driver_version_between_modinfo_and_amd_smi() -> None:
    found = merged("issues/modinfo_amdgpu_dkms_legacy-1584.excerpt.txt",
                   "amd-smi_default/amd-smi_default_mi300a-x4_amdsmi-docs.txt")
    driver = [c for c in found if c.check == "driver-version"]
    assert len(driver) == 1 and set(driver[0].values.values()) == {"5.11.14", "6.19.4"}


def test_the_cli_reports_contradictions_in_text_and_json() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    files = [str(TOOLS / "issues/modinfo_amdgpu_dkms_legacy-1584.excerpt.txt"),
             str(TOOLS / "amd-smi_default/amd-smi_default_mi300a-x4_amdsmi-docs.txt")]
    text = subprocess.run([sys.executable, "-m", "conformance", "diagnose", *files], capture_output=True,
                          env=env, cwd=REPO, timeout=120, text=True)
    assert "Contradictions (1):" in text.stdout and "[driver-version]" in text.stdout, text.stdout + text.stderr
    assert text.returncode == 3  # a contradiction and no fault signature
    out = json.loads(subprocess.run([sys.executable, "-m", "conformance", "diagnose", "--json", *files],
                                    capture_output=True, env=env, cwd=REPO, timeout=120).stdout)
    assert [c["check"] for c in out["contradictions"]] == ["driver-version"]
    assert [i["input"] for i in out["inputs"]] == [Path(f).name for f in files]
    twice = subprocess.run([sys.executable, "-m", "conformance", "diagnose", "-", "-"], capture_output=True,
                           env=env, cwd=REPO, timeout=120, input=b"", text=False)
    assert twice.returncode == 2 and b"once" in twice.stderr


def test_refusal_and_help_name_the_families() -> None:
    refusal = diagnose_text("hello world\n").unread[-1]
    epilog = build_parser().epilog or ""
    for family in ("amd-smi", "process", "jq", "xgmi", "partition", "mem_banks", "amdgpu_firmware_info",
                   "update-alternatives", "collect_env"):
        assert family in refusal and family in epilog, family
    assert KNOWN in refusal


def test_exit_code_3_is_contradictions_without_a_fault_and_a_fault_still_wins() -> None:
    contradicting = ("issues/modinfo_amdgpu_dkms_legacy-1584.excerpt.txt",
                     "amd-smi_default/amd-smi_default_mi300a-x4_amdsmi-docs.txt")
    named = [(Path(n).name, diagnose_text(read(n))) for n in contradicting]
    assert [r.exit_code for _, r in named] == [0, 0]
    assert merge_reports(named).exit_code == 3 and merge_reports(named).as_dict()["exit_code"] == 3
    fault = "issues/dmesg_ring-timeout_mes_gpu-reset_legacy-6273.excerpt.txt"
    both = merge_reports([*named, (Path(fault).name, diagnose_text(read(fault)))])
    assert both.contradictions and both.faults and both.exit_code == 1
    agreeing = [(n, diagnose_text(read(n))) for n in ("rocminfo_mi300x_8gpu_rocm6.2.3.txt",
                "amd-smi_default/amd-smi_default_mi325x_rocm-install-on-linux-656.excerpt.txt")]
    assert merge_reports(agreeing).contradictions == [] and merge_reports(agreeing).exit_code == 0


def test_help_names_exit_code_3() -> None:
    assert "3 no fault signature but contradiction(s)" in (build_parser().epilog or "")
