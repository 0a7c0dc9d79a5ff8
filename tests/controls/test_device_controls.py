"""Controls of conformance/checks/test_device.py: its own bodies against a scripted device probe on an MI300X
whose build lacks gfx942 code objects (in torch's arch list, a library or AITER's raw code objects), whose GEMM is
1% off, whose floors are missed (also on a GPU shared with another job) or whose probe errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from conformance.checks import test_device as device_checks
from conformance.engines.worker import EngineError
from conformance.verdicts import device
from env_checks.probes import code_object_scan, isa
from tests.check_fakes import FAILED, Figures, ScriptedEngine, target_of

MI300X = {"platform": "rocm", "name": "AMD Instinct MI300X", "isa": "gfx942", "isa_full": "gfx942:sramecc+:xnack-",
          "arch_list": ["gfx942"]}


def probe_of(info: dict, **answers) -> ScriptedEngine:
    return ScriptedEngine(answers, **info)


def test_device_isa_check_fails_on_an_mi250_build_on_an_mi300x(monkeypatch):
    monkeypatch.setattr(device, "library_isa", lambda info, engine: isa.IsaVerdict())
    monkeypatch.setattr(code_object_scan, "installed", code_object_scan.CodeObjectScan)  # no raw code objects
    probe = probe_of(MI300X | {"arch_list": ["gfx90a"]})
    with pytest.raises(FAILED, match="without gfx942 code objects"):
        device_checks.test_device_isa_in_build(probe, target_of("rocm"), Figures())


AITER_WHEEL = Path(__file__).resolve().parents[2] / "fixtures" / "tools" / "isa" / "aiter"


def _aiter_scan(tmp_path: Path, arch: str | None) -> code_object_scan.CodeObjectScan:
    """The scan of an aiter installed in tmp_path from the amd-aiter wheel's real code objects: all of them, or
    only the hsa/<arch>/ set."""
    site = tmp_path / "site-packages"
    shutil.copytree(AITER_WHEEL / "aiter_meta", site / "aiter_meta",
                    ignore=None if arch is None else lambda d, names: [n for n in names if n.startswith("gfx")
                                                                       and n != arch])
    return code_object_scan.scan([code_object_scan.Root("aiter", str(site / "aiter_meta"), "package")])


def test_device_isa_check_fails_on_a_library_with_only_gfx950_code_objects(monkeypatch, tmp_path):
    """An MI300X (gfx942) whose AITER carries the wheel's gfx950 kernels only: the check names the library and both
    ISAs before any of its kernels is loaded (vllm-project/vllm#32895 found it as hipErrorNoBinaryForGpu)."""
    monkeypatch.setattr(device, "library_isa", lambda info, engine: isa.IsaVerdict())
    only_gfx950 = _aiter_scan(tmp_path, "gfx950")
    monkeypatch.setattr(code_object_scan, "installed", lambda: only_gfx950)
    figures = Figures()
    with pytest.raises(FAILED, match=r"aiter cannot run on gfx942:sramecc\+:xnack-: none of its 2 AMDGPU code "
                                     r"objects is for it, they are for gfx950 \(2\)"):
        device_checks.test_device_isa_in_build(probe_of(MI300X), target_of("rocm"), figures)
    assert figures.values["amdgpu_code_objects_for_device"] == 0


def test_device_isa_check_passes_with_gfx942_code_objects_beside_gfx950_ones(monkeypatch, tmp_path):
    monkeypatch.setattr(device, "library_isa", lambda info, engine: isa.IsaVerdict())
    both = _aiter_scan(tmp_path, None)
    monkeypatch.setattr(code_object_scan, "installed", lambda: both)
    figures = Figures()
    device_checks.test_device_isa_in_build(probe_of(MI300X), target_of("rocm"), figures)
    assert (figures.values["amdgpu_code_objects_for_device"], figures.values["amdgpu_code_objects_for_other_isas"],
            figures.values["amdgpu_code_object_libraries_mixed"]) == (4, 2, 1)


class _WrongGemm:
    """A device whose GEMM is 1% off on every entry (think: a broken kernel for the shape's tail tiles)."""

    info = {"platform": "cpu"}

    def call(self, method, m, k, n, dtype, seed, rows, cols, tf32=False, timeout_s=None):
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(len(rows), k, generator=gen).to(getattr(torch, dtype))
        w = torch.randn(len(cols), k, generator=gen).to(getattr(torch, dtype))
        c = (a.double() @ w.double().t() * 1.01).to(getattr(torch, dtype))
        return {"a": a, "w": w, "c": c}


def test_gemm_numerics_check_fails_on_a_gemm_off_by_one_percent():
    with pytest.raises(FAILED, match=r"(\d+) of \1 float32 GEMM shapes out of tolerance .*relative error 0.01"):
        device_checks.test_gemm_numerics("float32", _WrongGemm(), 1.0, Figures())


def test_gemm_throughput_check_fails_below_the_floor():
    probe = probe_of(MI300X, gemm_tflops=100.0)
    with pytest.raises(FAILED, match="bfloat16 GEMM 100 TFLOP/s is below the floor 552"):
        device_checks.test_gemm_throughput_floor("bfloat16", probe, 1.0, Figures())


def test_hbm_bandwidth_check_fails_below_the_floor():
    probe = probe_of(MI300X, copy_gbps=1000.0)
    with pytest.raises(FAILED, match="copy bandwidth 1000 GB/s is below the floor 3700"):
        device_checks.test_hbm_bandwidth_floor(probe, 1.0, Figures())


def _floor_on_a_shared_gpu(monkeypatch, floor):
    """The floor's own body with the GPU's listing showing the probe (this process) and a real process that is not
    the suite's: a missed floor fails as `shared_gpu` naming it; a floor met on the shared GPU stands (sharing only
    slows), and the measurement records the other process either way."""
    import os
    import subprocess

    from conformance.engines import gpu_sharers
    from conformance.engines.gpu_sharers import GpuProcess
    from conformance.run import runrecord
    from conformance.verdicts.shared_gpu import GpuShared

    stranger = int(subprocess.run(["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                  text=True, check=True).stdout)
    monkeypatch.setattr(gpu_sharers, "listed", lambda: [GpuProcess(0, os.getpid()), GpuProcess(0, stranger, 8192.0)])

    def check(value, figures):
        if floor == "gemm":
            device_checks.test_gemm_throughput_floor("bfloat16", probe_of(MI300X, gemm_tflops=value), 1.0, figures)
        else:
            device_checks.test_hbm_bandwidth_floor(probe_of(MI300X, copy_gbps=value), 1.0, figures)
    try:
        figures = Figures()
        with pytest.raises(GpuShared, match=f"below the floor .* another process held the GPU while this was "
                                            f"measured: pid {stranger} \\(sleep\\) on GPU 0 holding 8.0 GiB") as info:
            check(100.0, figures)
        assert figures.values["gpu_foreign_processes"] == 1.0
        assert runrecord.classify("failed", str(info.value), runrecord.exception_chain(info.value)) == "shared_gpu"
        figures = Figures()
        check(10_000.0, figures)
        assert figures.values["gpu_foreign_processes"] == 1.0
    finally:
        os.kill(stranger, 9)


def test_a_gemm_floor_missed_on_a_shared_gpu_fails_as_shared(monkeypatch):
    _floor_on_a_shared_gpu(monkeypatch, "gemm")


def test_an_hbm_floor_missed_on_a_shared_gpu_fails_as_shared(monkeypatch):
    _floor_on_a_shared_gpu(monkeypatch, "hbm")


def test_device_floors_fail_when_the_probe_errors():
    class Broken:
        info = MI300X

        def call(self, *args, **kwargs):
            raise EngineError("device probe died (signal 11)")
    with pytest.raises(FAILED, match="device probe died"):
        device_checks.test_hbm_bandwidth_floor(Broken(), 1.0, Figures())
