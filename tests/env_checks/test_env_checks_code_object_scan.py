"""The scan of installed libraries' raw AMDGPU code objects and its verdict, on the real code objects of the amd-aiter
wheel (fixtures/tools/isa/aiter, laid out as the wheel lays them out) copied into a site-packages, a cache and a
checkout built in tmp_path. Negative controls: an AITER with gfx950 code objects only on a gfx942 device, a gfx950
code object under hsa/gfx942/, a package whose code objects are all damaged; and what must not fail: per-arch
sets, another GPU's kernels in a cache, a library the engine does not load."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from env_checks.probes import code_object_scan as scan_mod
from env_checks.probes import code_object_verdict as verdict
from env_checks.probes.code_object_scan import Root

AITER = Path(__file__).resolve().parents[2] / "fixtures" / "tools" / "isa" / "aiter"
MI300X = "gfx942:sramecc+:xnack-"
GFX950 = ["aiter_meta/hsa/gfx950/bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co",
          "aiter_meta/hsa/gfx950/fmha_v3_bwd/bwd_hd128_dq_shuffle.co"]


def site_packages(tmp_path: Path, only: list[str] | None = None) -> Path:
    """A site-packages holding the fixture's aiter and aiter_meta trees (or only the files `only` names)."""
    site = tmp_path / "site-packages"
    if only is None:
        shutil.copytree(AITER, site)
    for name in only or []:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(AITER / name, site / name)
    (site / "aiter").mkdir(exist_ok=True)
    (site / "aiter" / "__init__.py").write_text("")
    return site


def aiter_roots(site: Path) -> list[Root]:
    return [Root("aiter", str(site / "aiter"), "package", jit_modules=True),
            Root("aiter", str(site / "aiter_meta"), "package", jit_modules=True)]


def test_the_scan_groups_the_real_aiter_code_objects_by_target(tmp_path):
    result = scan_mod.scan(aiter_roots(site_packages(tmp_path)))
    (aiter,) = result.libraries
    assert aiter.library == "aiter" and aiter.code_objects == 7
    assert aiter.targets == {"gfx942": 4, "gfx950": 3}
    assert aiter.examples["gfx942"].startswith("aiter_meta/hsa/gfx942/")
    assert not aiter.misplaced and not aiter.unreadable_count


def test_per_arch_sets_pass_on_gfx942_with_a_figure_and_a_note(tmp_path):
    v = verdict.judge(scan_mod.scan(aiter_roots(site_packages(tmp_path))), MI300X, ["aiter"])
    assert not v.problems and not v.advisories
    assert v.figures() == {"amdgpu_code_objects": 7, "amdgpu_code_objects_for_device": 4,
                           "amdgpu_code_objects_for_other_isas": 3, "amdgpu_code_objects_unreadable": 0,
                           "amdgpu_code_object_libraries": 1, "amdgpu_code_object_libraries_mixed": 1,
                           "amdgpu_code_object_advisories": 0}
    assert v.notes == [f"aiter: 4 of 7 code objects run on {MI300X}; 3 are for gfx950 (3)"]


def test_an_aiter_with_gfx950_code_objects_only_fails_on_gfx942_naming_both(tmp_path):
    v = verdict.judge(scan_mod.scan(aiter_roots(site_packages(tmp_path, GFX950))), MI300X, ["aiter", "vllm"])
    (problem,) = v.problems
    assert problem.startswith(f"aiter cannot run on {MI300X}: none of its 2 AMDGPU code objects is for it, they "
                              "are for gfx950 (2) (e.g. aiter_meta/hsa/gfx950/")
    assert problem.endswith("fails with hipErrorNoBinaryForGpu")


def test_a_library_the_engine_does_not_load_advises_instead(tmp_path):
    v = verdict.judge(scan_mod.scan(aiter_roots(site_packages(tmp_path, GFX950))), MI300X, [])
    assert not v.problems and v.advisories[0].startswith("aiter cannot run on")


def test_a_gfx950_code_object_under_hsa_gfx942_fails_on_gfx942(tmp_path):
    """AITER loads hsa/<gfx of this GPU>/: a file there built for another GPU fails when first loaded."""
    site = site_packages(tmp_path)
    shutil.copy(AITER / GFX950[0], site / "aiter_meta/hsa/gfx942/bf16gemm/late_kernel.co")
    v = verdict.judge(scan_mod.scan(aiter_roots(site)), MI300X, ["aiter"])
    assert v.problems == ["aiter_meta/hsa/gfx942/bf16gemm/late_kernel.co lies under gfx942/ but is built for "
                          "gfx950: loaded on a gfx942 GPU it fails with hipErrorNoBinaryForGpu"]
    on_gfx950 = verdict.judge(scan_mod.scan(aiter_roots(site)), "gfx950:sramecc+:xnack-", ["aiter"])
    assert not on_gfx950.problems and "lies under gfx942/" in on_gfx950.notes[-1]  # not loaded on a gfx950


def test_another_gpus_kernels_in_a_cache_are_a_note_and_suffixless_code_objects_are_found(tmp_path):
    cache = tmp_path / "triton-cache"
    (cache / "3f2a").mkdir(parents=True)
    shutil.copy(AITER / GFX950[1], cache / "3f2a" / "kernel")            # no suffix: found by its ELF header
    (cache / "3f2a" / "NOTES").write_text("not a code object")           # no suffix, not ELF: left alone
    result = scan_mod.scan([Root("triton cache", str(cache), "cache")])
    assert result.libraries[0].targets == {"gfx950": 1}
    v = verdict.judge(result, MI300X, ["triton cache"])
    assert not v.problems and v.notes[0].startswith("triton cache holds 1 code objects for gfx950 (1), none for")


def test_a_package_whose_code_objects_are_all_damaged_fails_closed(tmp_path):
    site = site_packages(tmp_path, [GFX950[0]])
    damaged = site / GFX950[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    v = verdict.judge(scan_mod.scan(aiter_roots(site)), MI300X, ["aiter"])
    (problem,) = v.problems
    assert problem.startswith(f"none of aiter's 1 code object(s) could be read, so whether it runs on {MI300X} is "
                              "unknown: aiter_meta/hsa/gfx950/bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co is not a "
                              "readable AMDGPU code object: ")


def test_no_device_isa_cannot_be_judged(tmp_path):
    assert verdict.judge(scan_mod.CodeObjectScan(), "", ["aiter"]).problems[0].startswith("the device reported no ISA")


def test_the_header_names_the_library_a_gpu_cannot_run(tmp_path):
    result = scan_mod.scan(aiter_roots(site_packages(tmp_path)))
    lines = verdict.summary(result, ["gfx90a:sramecc+:xnack-"], ["aiter"])
    assert lines[0].startswith("AMDGPU code objects: aiter 7 (gfx942 (4), gfx950 (3))")
    assert lines[1].startswith("aiter cannot run on gfx90a:sramecc+:xnack-") and "gfx942 (4), gfx950 (3)" in lines[1]
    assert verdict.summary(result, [MI300X], ["aiter"]) == lines[:1]


def test_package_roots_follow_aiter_to_its_checkout_hsa_for_an_editable_install(tmp_path):
    (tmp_path / "aiter").mkdir()
    (tmp_path / "hsa" / "gfx942").mkdir(parents=True)

    def find_spec(name):
        found = {"aiter": [str(tmp_path / "aiter")]}.get(name)
        return SimpleNamespace(submodule_search_locations=found) if found else None

    roots, facts = scan_mod.package_roots(find_spec)
    assert [r.path for r in roots] == [str(tmp_path / "aiter"), str(tmp_path / "hsa")]
    assert facts == ["triton not installed", "vllm not installed"]


@pytest.mark.parametrize("env, triton", [
    ({}, "/home/u/.triton/cache"),
    ({"TRITON_HOME": "/data"}, "/data/.triton/cache"),
    ({"TRITON_CACHE_DIR": "/scratch/tc", "TRITON_HOME": "/data"}, "/scratch/tc"),
])
def test_cache_roots_are_where_triton_aiter_inductor_and_vllm_put_them(env, triton):
    roots = {r.library: r.path for r in scan_mod.cache_roots(env, "/home/u", "/tmp", "u")}
    assert roots == {"triton cache": triton, "aiter jit": "/home/u/.aiter/jit",
                     "inductor cache": "/tmp/torchinductor_u", "vllm cache": "/home/u/.cache/vllm"}
    moved = {r.library: r.path for r in scan_mod.cache_roots(
        {"AITER_JIT_DIR": "/j", "TORCHINDUCTOR_CACHE_DIR": "/i", "VLLM_CACHE_ROOT": "/v"}, "/home/u", "/tmp", "u")}
    assert (moved["aiter jit"], moved["inductor cache"], moved["vllm cache"]) == ("/j", "/i", "/v")


def test_the_installed_scan_is_read_once_and_kept(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(scan_mod, "installed_roots", lambda environ=None: ([], ["aiter not installed"]))
    monkeypatch.setattr(scan_mod, "_MEMO", {})
    real_scan = scan_mod.scan
    monkeypatch.setattr(scan_mod, "scan", lambda roots, facts=None: calls.append(1) or real_scan(roots, facts))
    first = scan_mod.installed()
    assert scan_mod.installed() is first and len(calls) == 1 and first.facts == ["aiter not installed"]


def test_the_fingerprint_records_each_librarys_targets(tmp_path, probes):
    from env_checks.record.fingerprint import derive_platform

    result = scan_mod.scan(aiter_roots(site_packages(tmp_path)))
    platform = derive_platform(probes(amdgpu_code_objects=result, machine=None))
    assert platform["amdgpu_code_object_targets"] == {"aiter": ["gfx942", "gfx950"]}
