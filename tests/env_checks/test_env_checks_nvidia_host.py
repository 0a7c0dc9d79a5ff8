"""NVIDIA and host probes on recorded outputs (the H200 recordings were taken on the lent H200 machine)."""

from __future__ import annotations

import pytest

from env_checks.probes import host, nvidia
from env_checks.probes.facts import NOT_INSTALLED, UNPARSEABLE, ProbeFailure, parse_with


def test_query_csv_h200(recorded):
    smi = nvidia.parse_query_csv(recorded("nvidia-smi_query-gpu_h200.csv"))
    (gpu,) = smi.gpus
    assert (gpu.name, gpu.driver_version) == ("NVIDIA H200", "580.159.04")
    assert gpu.vbios_version == "96.00.A5.00.1A"
    assert (gpu.memory_total_mib, gpu.ecc_mode, gpu.mig_mode) == (143771, "Enabled", "Disabled")
    assert (gpu.compute_cap, gpu.pci_bus_id) == ("9.0", "00000000:00:06.0")
    assert smi.driver_version == "580.159.04"
    assert gpu.uuid is None  # recorded before the query asked for it
    with_uuid = recorded("nvidia-smi_query-gpu_h200.csv").replace(
        "pci.bus_id", "pci.bus_id, uuid", 1).replace("00000000:00:06.0", "00000000:00:06.0, GPU-0000", 1)
    assert nvidia.parse_query_csv(with_uuid).gpus[0].uuid == "GPU-0000"


def test_query_xml_h200(recorded):
    smi = nvidia.parse_query_xml(recorded("nvidia-smi_q_x_h200.xml"))
    assert (smi.driver_version, smi.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = smi.gpus
    assert (gpu.name, gpu.memory_total_mib) == ("NVIDIA H200", 143771)
    assert (gpu.ecc_mode, gpu.mig_mode) == ("Enabled", "Disabled")
    assert gpu.vbios_version == "96.00.A5.00.1A"
    assert gpu.compute_cap is None  # driver 580's -q -x report has no compute capability
    assert gpu.uuid == "GPU-REDACTED"  # which physical GPU (redacted in the recording): runs on two nodes differ


def test_merge_takes_compute_cap_from_csv_and_cuda_from_xml(recorded):
    merged = nvidia.merge(nvidia.parse_query_csv(recorded("nvidia-smi_query-gpu_h200.csv")),
                          nvidia.parse_query_xml(recorded("nvidia-smi_q_x_h200.xml")))
    assert (merged.cuda_version, merged.gpus[0].compute_cap) == ("13.0", "9.0")
    assert merged.gpus[0].uuid == "GPU-REDACTED"  # from the report: the recorded query did not ask for it


@pytest.mark.parametrize("name, parser", [
    ("nvidia-smi_q_x_h200_truncated.derived.xml", nvidia.parse_query_xml),
    ("nvidia-smi_query-gpu_h200_truncated.derived.csv", nvidia.parse_query_csv),
])
def test_truncated_nvidia_smi_is_an_unparseable_fact(recorded, name, parser):
    fact = parse_with("nvidia-smi", parser, recorded(name))
    assert isinstance(fact, ProbeFailure) and (fact.tool, fact.kind) == ("nvidia-smi", UNPARSEABLE)


def test_missing_nvidia_smi_is_not_installed(no_tools_on_path):
    fact = nvidia.probe_nvidia_smi()
    assert (fact.tool, fact.kind) == ("nvidia-smi", NOT_INSTALLED)
    assert fact.detail == "nvidia-smi not installed (not on PATH)"


def test_nvidia_probe_with_a_stand_in_tool(fake_tool, tools_dir):
    csv, xml = tools_dir / "nvidia-smi_query-gpu_h200.csv", tools_dir / "nvidia-smi_q_x_h200.xml"
    fake_tool("nvidia-smi", f'case "$1" in -q) cat "{xml}";; *) cat "{csv}";; esac')
    smi = nvidia.probe_nvidia_smi()
    assert (smi.cuda_version, smi.gpus[0].compute_cap, smi.gpus[0].name) == ("13.0", "9.0", "NVIDIA H200")


def test_cpuinfo_h200_host(recorded):
    cpu = host.parse_cpuinfo(recorded("proc_cpuinfo_h200.txt"))
    assert (cpu.model, cpu.logical_cpus) == ("Intel(R) Xeon(R) Processor", 16)
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"} <= set(cpu.flags)


def test_arm_cpuinfo_uses_features():
    text = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm sve bf16\nCPU part\t: 0xd4f\n"
    cpu = host.parse_cpuinfo(text)
    assert (cpu.model, cpu.flags) == ("0xd4f", ["asimd", "sve", "bf16"])


def test_os_release(recorded):
    assert host.parse_os_release(recorded("os-release_h200.txt")) == {
        "pretty_name": "Ubuntu 24.04.3 LTS", "id": "ubuntu", "version_id": "24.04", "id_like": "debian"}


def test_cmdline_iommu_amdgpu_options_and_secrets():
    line = ("BOOT_IMAGE=/vmlinuz-6.8.0-79-generic root=UUID=1234 ro iommu=pt amd_iommu=on "
            "amdgpu.noretry=0 amdgpu.gpu_recovery=1 api_token=hunter2 quiet -- init-arg=1\n")
    cmd = host.parse_cmdline(line)
    assert (cmd.iommu, cmd.amd_iommu) == ("pt", "on")
    assert cmd.amdgpu_options == {"noretry": "0", "gpu_recovery": "1"}
    assert "api_token=<redacted>" in cmd.params and "hunter2" not in " ".join(cmd.params)
    assert "init-arg=1" not in cmd.params


def test_small_proc_files():
    assert host.parse_int_file("1\n") == 1
    assert parse_with("/proc/sys/kernel/numa_balancing", host.parse_int_file, "yes\n").kind == UNPARSEABLE
    assert host.parse_meminfo_total_kib("MemTotal:       131981020 kB\nMemFree: 1 kB\n") == 131981020


def test_device_access(tmp_path):
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    absent = host.probe_device_access(dev)
    assert (absent.kfd, absent.render_nodes) == ("absent", {})
    (dev / "kfd").write_text("")
    (dev / "dri" / "renderD128").write_text("")
    present = host.probe_device_access(dev)
    assert present.kfd in {"rw", "r", "denied"} and list(present.render_nodes) == ["renderD128"]
    assert present.uid >= 0 and present.groups
