"""AMD probes on recorded outputs: rocminfo, amd-smi (text and JSON), rocm-smi, version files.

Values asserted here can be read in the recordings themselves (fixtures/tools, sources in SOURCES.md).
"""

from __future__ import annotations

import pytest

from env_checks.probes import amd, amd_smi
from env_checks.probes.facts import (
    ABSENT,
    FAILED,
    NOT_INSTALLED,
    TIMEOUT,
    UNPARSEABLE,
    ProbeFailure,
    parse_with,
    run_tool,
)


def test_rocminfo_mi300x_vf_gpu_agent(recorded):
    info = amd.parse_rocminfo(recorded("rocminfo_mi300x_vf_rocm7.2.4.txt"))
    assert (info.runtime_version, info.kfd_version) == ("1.18", "6.16.13")
    assert [a.device_type for a in info.agents] == ["CPU", "GPU"]
    (gpu,) = info.gpus
    assert gpu.gfx_target == "gfx942"
    assert gpu.marketing_name == "AMD Instinct MI300X VF"
    assert (gpu.compute_units, gpu.chip_id, gpu.node, gpu.mec_firmware) == (304, 29877, 1, 189)
    # The generic ISA is listed too, but the flags come from the device's own target.
    assert gpu.isa == ["amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
                       "amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack-"]
    assert (gpu.sramecc, gpu.xnack) == (True, False)


def test_rocminfo_eight_mi300x(recorded):
    info = amd.parse_rocminfo(recorded("rocminfo_mi300x_8gpu_rocm6.2.3.txt"))
    assert info.kfd_version == "6.8.5"
    assert len(info.agents) == 10 and len(info.gpus) == 8
    assert {g.gfx_target for g in info.gpus} == {"gfx942"}
    assert [g.node for g in info.gpus] == list(range(2, 10))
    assert {g.compute_units for g in info.gpus} == {304}
    assert {g.mec_firmware for g in info.gpus} == {150}
    assert info.agents[0].name == "Intel(R) Xeon(R) Platinum 8470" and info.agents[0].compute_units == 104


def test_rocminfo_mi250x_is_gfx90a(recorded):
    info = amd.parse_rocminfo(recorded("rocminfo_mi250x_rocm5.7.txt"))
    assert info.kfd_version is None  # ROCm 5.7 prints "ROCk module is loaded" without a version
    assert len(info.agents) == 5
    (gpu,) = info.gpus
    assert (gpu.gfx_target, gpu.marketing_name, gpu.compute_units) == ("gfx90a", "AMD Instinct MI250X", 110)
    assert (gpu.mec_firmware, gpu.sramecc, gpu.xnack) == (63, True, False)


def test_isa_features():
    assert amd.isa_features("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-") == (
        "gfx942", {"sramecc": True, "xnack": False})
    assert amd.isa_features("amdgcn-amd-amdhsa--gfx1100") == ("gfx1100", {})


@pytest.mark.parametrize("text", ["", "garbage\n", "HSA Agents\n*** Done ***\n"])
def test_rocminfo_garbage_is_unparseable(text):
    fact = parse_with("rocminfo", amd.parse_rocminfo, text)
    assert isinstance(fact, ProbeFailure) and (fact.tool, fact.kind) == ("rocminfo", UNPARSEABLE)


def test_truncated_rocminfo_is_an_unparseable_fact(recorded):
    fact = parse_with("rocminfo", amd.parse_rocminfo, recorded("rocminfo_mi300x_vf_truncated.derived.txt"))
    assert isinstance(fact, ProbeFailure)
    assert (fact.tool, fact.kind) == ("rocminfo", UNPARSEABLE)
    assert "truncated" in fact.detail


def test_probes_read_missing_tools_as_not_installed(no_tools_on_path):
    for probe, tool in [(amd.probe_rocminfo, "rocminfo"), (amd_smi.probe_amd_smi_static, "amd-smi"),
                        (amd_smi.probe_amd_smi_firmware, "amd-smi"),
                        (amd_smi.probe_amd_smi_bad_pages, "amd-smi"), (amd_smi.probe_rocm_smi, "rocm-smi")]:
        fact = probe()
        assert isinstance(fact, ProbeFailure)
        assert (fact.tool, fact.kind) == (tool, NOT_INSTALLED)
        assert fact.detail.startswith(f"{tool} not installed")


def test_probe_runs_the_tool_and_parses_it(fake_tool, tools_dir):
    fake_tool("rocminfo", f'cat "{tools_dir / "rocminfo_mi300x_vf_rocm7.2.4.txt"}"')
    info = amd.probe_rocminfo()
    assert not isinstance(info, ProbeFailure) and info.gpus[0].gfx_target == "gfx942"
    fake_tool("rocminfo", f'cat "{tools_dir / "rocminfo_mi300x_vf_truncated.derived.txt"}"')
    assert amd.probe_rocminfo().kind == UNPARSEABLE


def test_failing_and_hanging_tools_become_facts(fake_tool):
    fake_tool("amd-smi", "echo 'AMDSMI_STATUS_NO_DRV' >&2; exit 3")
    fact = amd_smi.probe_amd_smi_static()
    assert (fact.kind, fact.tool) == (FAILED, "amd-smi") and "AMDSMI_STATUS_NO_DRV" in fact.detail
    fake_tool("slow-tool", "sleep 5")
    fact = run_tool(["slow-tool"], timeout_s=0.2)
    assert isinstance(fact, ProbeFailure) and fact.kind == TIMEOUT


def test_amd_smi_firmware_text(recorded):
    fw = amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.txt"))
    assert [g.gpu for g in fw.gpus] == [0, 1, 2, 3]
    assert {g.mec for g in fw.gpus} == {166}
    assert fw.gpus[0].versions["PM"] == "04.85.103.184"
    assert fw.gpus[3].versions["TA_XGMI"] == "20.00.01.13"


def test_amd_smi_firmware_json_reads_like_text(recorded):
    text = amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.txt"))
    as_json = amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.derived.json"))
    assert as_json == text
    # amd-smi can print a warning line before its JSON.
    warned = "WARNING: banner\n" + recorded("amd-smi_firmware_mi300a_rocm6.3.3.derived.json")
    assert amd_smi.parse_amd_smi_firmware(warned) == text


def test_truncated_amd_smi_json_is_an_unparseable_fact(recorded):
    text = recorded("amd-smi_firmware_truncated.derived.json")
    fact = parse_with("amd-smi", amd_smi.parse_amd_smi_firmware, text)
    assert isinstance(fact, ProbeFailure) and (fact.tool, fact.kind) == ("amd-smi", UNPARSEABLE)
    assert "invalid JSON" in fact.detail


def test_amd_smi_static_text(recorded):
    (gpu,) = amd_smi.parse_amd_smi_static(recorded("amd-smi_static_mi300a_docs.txt")).gpus
    assert (gpu.market_name, gpu.gfx_target, gpu.compute_units) == ("AMD Instinct MI300A", "gfx942", 228)
    assert (gpu.device_id, gpu.driver_version, gpu.vbios_version) == ("0x74a0", "6.14.4", None)
    assert (gpu.compute_partition, gpu.memory_partition, gpu.vram_mb) == ("SPX", "NPS1", 96432)


def test_amd_smi_static_gpu_data_json_reads_like_text(recorded):
    text = amd_smi.parse_amd_smi_static(recorded("amd-smi_static_mi300a_docs.txt"))
    assert amd_smi.parse_amd_smi_static(recorded("amd-smi_static_mi300a_docs.derived.json")) == text


def test_amd_smi_bad_pages(recorded):
    pages = amd_smi.parse_amd_smi_bad_pages(recorded("amd-smi_bad-pages_mi300x_blog.txt"))
    assert [(g.gpu, g.retired, g.pending, g.unreservable) for g in pages.gpus] == [(0, 0, 0, 0), (1, 0, 0, 0)]


def test_amd_smi_bad_pages_one_retired_page_in_an_indented_paste(recorded):
    # the amdsmi CHANGELOG's `amd-smi bad-pages --hex` (a markdown list item: every line indented by 2); amd-smi
    # drops the list brackets of a one-page list, so RETIRED holds the record itself; N/A is unknown, not 0
    text = recorded("amd-smi_bad-pages_hex_amdsmi-changelog.txt")
    pages = amd_smi.parse_amd_smi_bad_pages(text)
    assert [(g.gpu, g.retired, g.pending, g.unreservable) for g in pages.gpus] == [(0, 1, None, None)]
    # several records print as a YAML list with the dashes dropped (amdsmi_logger): one PAGE_ADDRESS line each
    lines = text.splitlines()
    record = [line for line in lines if line.strip().startswith(("PAGE_", "STATUS"))]
    two = "\n".join(lines[:6] + record + lines[6:]) + "\n"
    assert [g.retired for g in amd_smi.parse_amd_smi_bad_pages(two).gpus] == [2]
    # the JSON of a one-page list is the record object itself
    one = '[{"gpu": 0, "retired": {"page_address": "0x7f8000", "page_size": "0x1000", "status": "RESERVED"}, ' \
          '"pending": "No bad pages found.", "un_res": "N/A"}]'
    assert [(g.retired, g.pending, g.unreservable) for g in amd_smi.parse_amd_smi_bad_pages(one).gpus] == [(1, 0, None)]


def test_rocm_smi_json(recorded):
    smi = amd_smi.parse_rocm_smi(recorded("rocm-smi_a_json_mi210_wandb.json"))
    assert smi.driver_version == "5.18.13"
    (card,) = smi.cards
    assert (card.card, card.series, card.mec) == ("card0", "GENERIC RM IMAGE", 70)
    assert card.vbios_version == "113-D67301-063"
    assert card.gfx_target is None  # this rocm-smi release prints no "GFX Version"


def test_truncated_rocm_smi_is_an_unparseable_fact(recorded):
    fact = parse_with("rocm-smi", amd_smi.parse_rocm_smi, recorded("rocm-smi_a_json_mi210_wandb.json")[:400])
    assert isinstance(fact, ProbeFailure) and (fact.tool, fact.kind) == ("rocm-smi", UNPARSEABLE)


def test_rocm_version_file():
    assert amd.parse_rocm_version("6.4.1-103\n") == amd.RocmVersion("6.4.1", "6.4.1-103", "")
    fact = parse_with("rocm-version-file", amd.parse_rocm_version, "not a version\n")
    assert fact.kind == UNPARSEABLE


def test_rocm_not_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    fact = amd.probe_rocm_version()
    assert (fact.tool, fact.kind) == ("rocm", ABSENT) and "ROCm not installed" in fact.detail


def test_amdgpu_version_from_sysfs(tmp_path):
    module = tmp_path / "amdgpu"
    assert amd.probe_amdgpu_version(module).detail == "amdgpu kernel module not loaded"
    module.mkdir()
    in_tree = amd.probe_amdgpu_version(module)
    assert in_tree.kind == ABSENT and "in-tree" in in_tree.detail
    (module / "version").write_text("6.16.13\n")
    assert amd.probe_amdgpu_version(module) == amd.AmdgpuDriver("6.16.13")
