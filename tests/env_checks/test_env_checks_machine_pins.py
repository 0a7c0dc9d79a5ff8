"""Machine pins as data: manifests say which hardware they match (MI300X vs MI300A vs MI325X vs MI355X), RAS
and retired-page ceilings, the firmware bundle, partition mode against device count, VF vs bare metal."""

from __future__ import annotations

import shutil

import pytest

from env_checks.pins import PINS_DIR, PinManifestError, evaluate, failed, load_manifest, manifest_for
from env_checks.probes import amd, amd_smi, machine
from env_checks.record.fingerprint import derive_platform

MI300X = PINS_DIR / "mi300x.toml"


def verdicts(path, platform, env=None):
    fp = {"platform": platform, "env": env or {}, "packages": {}, "runtime": {}}
    return {v.name: v for v in evaluate(load_manifest(path), fp)}


def fp(platform):
    return {"platform": platform}


def mi300a_platform(recorded, probes):
    return derive_platform(probes(
        amd_smi_static=amd_smi.parse_amd_smi_static(recorded("amd-smi_static_mi300a_docs.txt")),
        amd_smi_firmware=amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.txt"))))


@pytest.mark.parametrize("name", ["mi325x.toml", "mi355x.toml"])
def test_new_sku_manifests_load(name):
    manifest = load_manifest(PINS_DIR / name)
    assert manifest.platform == name.removesuffix(".toml") and manifest.match["accelerator"] == "amd"


def test_recorded_mi300a_is_not_taken_for_an_mi300x(recorded, probes):
    platform = mi300a_platform(recorded, probes)
    assert platform["gfx_targets"] == ["gfx942"] and platform["device_ids"] == ["0x74a0"]
    assert manifest_for(fp(platform)) is None  # gfx942 alone used to pick mi300x.toml
    v = verdicts(MI300X, platform)
    assert v["gpu_model"].status == "violation" and "MI300A" in str(v["gpu_model"].found)
    assert v["device_id"].status == "violation" and v["device_id"].found == ["0x74a0"]
    assert v["vram_size"].status == "violation" and v["vram_size"].found == [96432]  # SPX, 96 GB < 180 GB


def test_recorded_mi300x_bare_metal_and_vf_match_mi300x(recorded, probes):
    for name in ("rocminfo_mi300x_8gpu_rocm6.2.3.txt", "rocminfo_mi300x_vf_rocm7.2.4.txt"):
        platform = derive_platform(probes(rocminfo=amd.parse_rocminfo(recorded(name))))
        assert manifest_for(fp(platform)) == MI300X, name
    assert platform["virtualization"] == "vf" and platform["device_ids"] == ["0x74b5"]
    v = verdicts(MI300X, platform)
    # what a VF cannot show is not applicable there, not a failure
    assert v["retired_pages_ceiling"].status == "n/a" and v["ras_uncorrectable_since_boot"].status == "n/a"
    assert v["iommu_passthrough"].status == "n/a" and v["device_id"].status == "ok"


def test_mi325x_and_mi355x_are_told_apart_by_data():
    mi325x = {"accelerator": "amd", "gfx_targets": ["gfx942"], "gpu_names": ["AMD Instinct MI325X"],
              "device_ids": ["0x74a5"], "vram_mib": [262128], "compute_partition": "SPX"}
    assert manifest_for(fp(mi325x)) == PINS_DIR / "mi325x.toml"
    assert verdicts(MI300X, mi325x)["gpu_model"].status == "violation"
    # no name at all: the device id alone decides; no name and no id: VRAM alone decides
    assert manifest_for(fp(mi325x | {"gpu_names": []})) == PINS_DIR / "mi325x.toml"
    assert manifest_for(fp(mi325x | {"gpu_names": [], "device_ids": []})) == PINS_DIR / "mi325x.toml"
    nothing_known = mi325x | {"gpu_names": [], "device_ids": [], "vram_mib": []}
    assert manifest_for(fp(nothing_known)) is None  # ambiguous gfx942: no manifest rather than a wrong one
    mi355x = {"accelerator": "amd", "gfx_targets": ["gfx950"], "gpu_names": ["AMD Instinct MI355X"]}
    assert manifest_for(fp(mi355x)) == PINS_DIR / "mi355x.toml"
    assert manifest_for(fp(mi355x | {"gpu_names": ["AMD Instinct MI350X"]})) is None


def test_a_new_retired_page_over_the_ceiling_fails_on_bare_metal():
    base = {"virtualization": "bare_metal"}
    assert verdicts(MI300X, base | {"bad_pages_retired": 64})["retired_pages_ceiling"].status == "ok"
    v = verdicts(MI300X, base | {"bad_pages_retired": 65})["retired_pages_ceiling"]
    assert v.status == "violation" and v.expected == "<= 64"
    assert verdicts(MI300X, base | {"ras_uncorrectable": 1})["ras_uncorrectable_since_boot"].status == "violation"
    # on bare metal an unreadable bad-page table is unknown, and blocks (fail closed)
    unknown = verdicts(MI300X, base)["retired_pages_ceiling"]
    assert unknown.status == "unknown" and unknown in failed([unknown])


def test_recorded_old_firmware_fails(recorded, probes):
    platform = mi300a_platform(recorded, probes)
    assert platform["firmware_min"]["CP_MEC1"] == 166 and platform["firmware_uniform"] is True
    v = verdicts(MI300X, platform)["mec_firmware"]
    assert (v.status, v.found) == ("violation", 166)
    fw = amd_smi.parse_amd_smi_firmware(recorded("amd-smi_firmware_mi300a_rocm6.3.3.txt"))
    fw.gpus[1].versions["PM"] = "04.85.100.0"  # one GPU left on an older bundle
    mixed = derive_platform(probes(amd_smi_firmware=fw))
    assert mixed["firmware_min"]["PM"] == "04.85.100.0"
    assert verdicts(MI300X, mixed)["firmware_uniform"].status == "violation"


def cpx_platform(probes, devices: int, physical: int = 8):
    static = amd_smi.AmdSmiStatic([amd_smi.AmdSmiGpu(i, "AMD Instinct MI300X", "gfx942", 38, "0x74a1", None, None,
                                                     "CPX", "NPS4", 24576) for i in range(devices)])
    found = machine.Machine([machine.PciGpu(f"0000:{i:02x}:00.0", "amd", "0x74a1", False) for i in range(physical)],
                            [], hypervisor=False)
    return derive_platform(probes(amd_smi_static=static, machine=found))


def test_cpx_partition_needs_eight_devices_per_gpu(probes):
    good = cpx_platform(probes, 64)
    assert (good["compute_partition"], good["devices_per_gpu"], good["virtualization"]) == ("CPX", 8, "bare_metal")
    assert manifest_for(fp(good)) == MI300X  # partitioned: VRAM per device is not the SKU's, names decide
    assert verdicts(MI300X, good)["partition_device_count"].status == "ok"
    bad = verdicts(MI300X, cpx_platform(probes, 8))["partition_device_count"]
    assert bad.status == "violation" and bad.found == 1 and "== 8 for platform.compute_partition = CPX" in bad.expected
    odd = verdicts(MI300X, {"devices_per_gpu": 3, "compute_partition": "TPX"})["partition_device_count"]
    assert odd.status == "unknown" and "no entry for it" in odd.expected


def test_amdgpu_boot_options(probes):
    assert verdicts(MI300X, {})["amdgpu_gpu_recovery"].status == "ok"  # not given: the default (-1) holds
    v = verdicts(MI300X, {"amdgpu_options": {"gpu_recovery": "0"}})["amdgpu_gpu_recovery"]
    assert v.status == "violation" and v.found == "0"
    off = verdicts(MI300X, {"amdgpu_options": {"ras_enable": "0"}, "virtualization": "bare_metal"})
    assert off["amdgpu_ras_enable"].status == "violation"


def test_adding_a_manifest_is_data_only(tmp_path):
    for bundled in PINS_DIR.glob("*.toml"):
        shutil.copy(bundled, tmp_path / bundled.name)
    mi308x = {"accelerator": "amd", "gfx_targets": ["gfx942"], "gpu_names": ["AMD Instinct MI308X"]}
    assert manifest_for(fp(mi308x), tmp_path) is None
    (tmp_path / "mi308x.toml").write_text(
        'schema_version = 1\nplatform = "mi308x"\n[match]\naccelerator = "amd"\ngfx_targets = ["gfx942"]\n'
        'names = ["MI308X"]\ndevice_ids = ["0x74a2"]\n[[pin]]\nname = "gfx_target"\nfact = "platform.gfx_targets"\n'
        'all_equal = "gfx942"\nreason = "MI308X is gfx942."\n')
    assert manifest_for(fp(mi308x), tmp_path) == tmp_path / "mi308x.toml"
    assert manifest_for(fp(mi308x)) is None  # the bundled directory is untouched


def test_a_bad_match_key_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('schema_version = 1\nplatform = "x"\n[match]\nname = ["MI300X"]\n[[pin]]\nname = "a"\n'
                    'fact = "platform.x"\nequals = 1\nreason = "r"\n')
    with pytest.raises(PinManifestError, match=r"\[match\] keys name; use accelerator, gfx_targets, names"):
        load_manifest(path)
