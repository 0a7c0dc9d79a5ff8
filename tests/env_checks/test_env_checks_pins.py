"""Pin manifests: the bundled ones load, the negative controls fail, a bad manifest is a clear error."""

from __future__ import annotations

import json

import pytest

from env_checks.__main__ import main
from env_checks.pins import PINS_DIR, PinManifestError, evaluate, failed, load_manifest
from env_checks.probes import amd
from env_checks.record.fingerprint import derive_platform

MI300X = PINS_DIR / "mi300x.toml"


def verdict(manifest_path, fingerprint, name):
    return next(v for v in evaluate(load_manifest(manifest_path), fingerprint) if v.name == name)


def fingerprint(platform=None, env=None, packages=None, runtime=None):
    return {"platform": platform or {}, "env": env or {}, "packages": packages or {},
            "runtime": runtime or {}}


@pytest.mark.parametrize("name", ["mi300x.toml", "h200.toml", "cpu.toml"])
def test_bundled_manifests_load(name):
    manifest = load_manifest(PINS_DIR / name)
    assert manifest.platform == name.removesuffix(".toml") and manifest.pins
    assert all(p.reason for p in manifest.pins) and all(b.link for b in manifest.known_bad)


def test_gfx90a_where_gfx942_is_pinned_is_a_violation(recorded, probes):
    platform = derive_platform(probes(rocminfo=amd.parse_rocminfo(recorded("rocminfo_mi250x_rocm5.7.txt"))))
    v = verdict(MI300X, fingerprint(platform), "gfx_target")
    assert (v.status, v.found) == ("violation", ["gfx90a"])


def test_gfx942_recording_passes_the_target_pin(recorded, probes):
    info = amd.parse_rocminfo(recorded("rocminfo_mi300x_vf_rocm7.2.4.txt"))
    platform = derive_platform(probes(rocminfo=info))
    assert verdict(MI300X, fingerprint(platform), "gfx_target").status == "ok"
    assert verdict(MI300X, fingerprint(platform), "mec_firmware").status == "ok"  # 189 >= 177


def test_rocm_below_the_pinned_range_is_a_violation():
    assert verdict(MI300X, fingerprint({"rocm_version": "6.3.3"}), "rocm_version").status == "violation"
    assert verdict(MI300X, fingerprint({"rocm_version": "6.4.1"}), "rocm_version").status == "ok"


@pytest.mark.parametrize("env, status", [({}, "violation"), ({"HSA_NO_SCRATCH_RECLAIM": "1"}, "ok"),
                                         ({"HSA_NO_SCRATCH_RECLAIM": "0"}, "violation")])
def test_old_mec_firmware_needs_no_scratch_reclaim(env, status):
    v = verdict(MI300X, fingerprint({"mec_firmware_min": 170}, env=env), "mec_firmware")
    assert (v.status, v.found) == (status, 170)
    assert "HSA_NO_SCRATCH_RECLAIM=1" in v.expected


def test_recorded_mec_150_fails_closed_without_the_variable(recorded, probes):
    info = amd.parse_rocminfo(recorded("rocminfo_mi300x_8gpu_rocm6.2.3.txt"))
    platform = derive_platform(probes(rocminfo=info))
    assert verdict(MI300X, fingerprint(platform), "mec_firmware").status == "violation"


def test_missing_fact_is_unknown_and_blocks(probes):
    platform = derive_platform(probes())  # nothing installed
    verdicts = evaluate(load_manifest(MI300X), fingerprint(platform))
    gfx = next(v for v in verdicts if v.name == "gfx_target")
    assert gfx.status == "unknown" and "rocminfo not installed" in gfx.reason
    assert gfx in failed(verdicts)
    mec = next(v for v in verdicts if v.name == "mec_firmware")
    assert mec.status == "unknown"


def test_a_waiver_covers_an_unknown_firmware():
    v = verdict(MI300X, fingerprint({}, env={"HSA_NO_SCRATCH_RECLAIM": "1"}), "mec_firmware")
    assert v.status == "ok" and v.reason.startswith("waived")


def test_recommended_pins_do_not_block():
    verdicts = evaluate(load_manifest(MI300X), fingerprint({"numa_balancing": 1}))
    numa = next(v for v in verdicts if v.name == "numa_balancing_off")
    assert (numa.status, numa.severity) == ("violation", "recommended") and numa not in failed(verdicts)


@pytest.mark.parametrize("hip, status", [("6.4.43482-0f2d60242", "ok"), ("6.3.42131-fa1d09cbd", "violation"),
                                         (None, "unknown")])
def test_torch_hip_must_match_rocm_major_minor(hip, status):
    # A CUDA build of torch has torch.version.hip = None: unknown, so a --rocm run fails closed.
    fp = fingerprint({"rocm_version": "6.4.1"}, runtime={"torch_hip_version": hip})
    assert verdict(MI300X, fp, "torch_hip_matches_rocm").status == status


@pytest.mark.parametrize("vllm, status", [("0.11.0", "violation"), ("0.10.2", "violation"),
                                          ("0.32.0", "ok"), (None, "unknown")])
def test_known_bad_vllm_yarn_rounding(vllm, status):
    v = verdict(MI300X, fingerprint(packages={"vllm": vllm}), "vllm_yarn_correction_rounded")
    assert v.status == status and v.link.endswith("/27722")


def test_malformed_toml_is_a_one_line_error(tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text('schema_version = 1\nplatform = "x"\n[[pin]\nname = "a"\n')
    with pytest.raises(PinManifestError) as err:
        load_manifest(bad)
    message = str(err.value)
    assert "\n" not in message and "broken.toml" in message and "line 3" in message


@pytest.mark.parametrize("body, needle", [
    ('[[pin]]\nname = "a"\nfact = "platform.x"\nequals = 1\n', "'reason'"),
    ('[[pin]]\nname = "a"\nfact = "platform.x"\nreason = "r"\n', "exactly one of"),
    ('[[pin]]\nname = "a"\nfact = "platform.x"\nreason = "r"\nrange = ">=1"\nmin = 2\n', "exactly one of"),
    ('[[pin]]\nname = "a"\nfact = "platform.x"\nreason = "r"\nrange = "about 6"\n', "bad range"),
    ('[[known_bad]]\nname = "a"\nfact = "packages.x"\nversions = "<1"\nreason = "r"\n', "'link'"),
])
def test_manifest_missing_keys_is_a_one_line_error(tmp_path, body, needle):
    path = tmp_path / "pins.toml"
    path.write_text('schema_version = 1\nplatform = "x"\n' + body)
    with pytest.raises(PinManifestError) as err:
        load_manifest(path)
    assert "\n" not in str(err.value) and "pins.toml" in str(err.value) and needle in str(err.value)


def test_cli_exit_codes(tmp_path, capsys, no_tools_on_path):
    good = tmp_path / "good.toml"
    good.write_text('schema_version = 1\nplatform = "t"\n[[pin]]\nname = "py"\nfact = "platform.python"\n'
                    'range = ">=3.10"\nreason = "r"\n')
    assert main(["--no-torch", "--pins", str(good)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["verdicts"][0]["status"] == "ok"
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('schema_version = 1\nplatform = "t"\n[[pin]]\nname = "gfx"\n'
                       'fact = "platform.gfx_targets"\nall_equal = "gfx942"\nreason = "r"\n')
    assert main(["--no-torch", "--pins", str(unknown)]) == 1
    broken = tmp_path / "broken.toml"
    broken.write_text("schema_version = [\n")
    assert main(["--no-torch", "--pins", str(broken)]) == 2
    assert "broken.toml" in capsys.readouterr().err
    assert main(["--no-torch"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "env_checks.fingerprint/1"
