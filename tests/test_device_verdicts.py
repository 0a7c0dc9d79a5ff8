"""Negative controls of the device and pin checks: wrong ISA, a library without the device's code objects, a
GEMM that is really tf32, wrong by 1e-2, wrong in one tail entry or NaN, gfx90a where gfx942 is required, and
facts that could not be read."""

from __future__ import annotations

import random

import pytest
import torch

from conformance.engines.device_probe import DeviceProbe
from conformance.verdicts import device
from conformance.verdicts.pins_check import pin_report
from env_checks.pins import PINS_DIR
from env_checks.probes import code_object_scan, isa

MI300X_INFO = {"platform": "rocm", "name": "AMD Instinct MI300X", "isa": "gfx942",
               "isa_full": "gfx942:sramecc+:xnack-", "arch_list": ["gfx942"]}
H200_INFO = {"platform": "cuda", "name": "NVIDIA H200", "isa": "sm_90", "isa_full": "sm_90", "arch_list": ["sm_90"]}


def test_sku_lookup():
    assert device.sku_for("AMD Instinct MI300X")["isa"] == "gfx942"
    assert device.sku_for("NVIDIA H200")["isa"] == "sm_90"
    assert device.sku_for("Some Laptop GPU") is None


def test_isa_check_rejects_gfx90a_and_missing_code_objects():
    assert not device.isa_problems("gfx942", ["gfx90a", "gfx942"], "gfx942")
    assert not device.isa_problems("sm_90", ["sm_80", "sm_90"], "sm_90")
    wrong_gpu = device.isa_problems("gfx90a", ["gfx90a", "gfx942"], "gfx942")
    assert wrong_gpu and "requires gfx942" in wrong_gpu[0]
    no_code = device.isa_problems("gfx942", ["gfx90a", "gfx908"], "gfx942")
    assert no_code and "without gfx942 code objects" in no_code[0]
    assert device.isa_problems(None, ["gfx942"], "gfx942")


def _scan_of(targets: dict[str, dict[str, int]]):
    """A stand-in for env_checks.isa.scan_installed: library label -> the targets it was read to carry."""
    def scan(kind, timeout_s):
        out = []
        for label, found in targets.items():
            package = label.split("/")[0]
            lib = isa.Library(package, label, f"/site-packages/{label}", True)
            out.append((lib, isa.CodeObjects(label, kind, "offload-bundle scan", found, sum(found.values()))))
        return out, []
    return scan


def test_library_isa_rejects_a_gfx90a_build_on_mi300x():
    good = _scan_of({"torch/lib/libtorch_hip.so": {"gfx90a": 10, "gfx942": 10}, "vllm/_C.abi3.so": {"gfx942": 3}})
    verdict = device.library_isa(MI300X_INFO, "vllm", scan=good)
    assert not verdict.problems and verdict.figures()["isa_from_scan"] == 2
    bad = _scan_of({"torch/lib/libtorch_hip.so": {"gfx942": 10}, "vllm/_C.abi3.so": {"gfx90a": 3}})
    verdict = device.library_isa(MI300X_INFO, "vllm", scan=bad)
    assert len(verdict.problems) == 1 and "vllm/_C.abi3.so carries code for gfx90a" in verdict.problems[0]
    # vLLM's build only advises when another engine is under test
    verdict = device.library_isa(MI300X_INFO, "transformers", scan=bad)
    assert not verdict.problems and verdict.advisories


def test_library_isa_rejects_an_sm80_only_cuda_build():
    verdict = device.library_isa(H200_INFO, "vllm", scan=_scan_of({"torch/lib/libtorch_cuda.so": {"sm_80": 5}}))
    assert verdict.problems and "none that runs on sm_90" in verdict.problems[0]


def test_a_library_built_for_another_generation_only_advises_and_others_still_fail():
    """First contact with vLLM 0.26.0 on the H200: `_qutlass_C` carries sm_100 code only (Blackwell FP4 GEMMs), which
    data/devices.toml names; the same build's `_C` without sm_90 code still fails the check."""
    scan = _scan_of({"torch/lib/libtorch_cuda.so": {"sm_90": 5}, "vllm/_qutlass_C.abi3.so": {"sm_100": 2},
                     "vllm/_C_stable_libtorch.abi3.so": {"sm_90": 9}})
    verdict = device.library_isa(H200_INFO, "vllm", scan=scan)
    assert not verdict.problems and "vllm/_qutlass_C.abi3.so carries code for sm_100" in verdict.advisories[0]
    bad = _scan_of({"torch/lib/libtorch_cuda.so": {"sm_90": 5}, "vllm/_qutlass_C.abi3.so": {"sm_100": 2},
                    "vllm/_C_stable_libtorch.abi3.so": {"sm_100": 9}})
    verdict = device.library_isa(H200_INFO, "vllm", scan=bad)
    assert len(verdict.problems) == 1 and "_C_stable_libtorch.abi3.so carries code for sm_100" in verdict.problems[0]


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(128, 1024, generator=gen), torch.randn(1024, 128, generator=gen)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to TF32 (10 mantissa bits, nearest even), as tensor cores read fp32 inputs."""
    bits = x.view(torch.int32)
    rounded = bits + 0xFFF + ((bits >> 13) & 1)
    return (rounded & ~0x1FFF).view(torch.float32)


def test_gemm_numerics_accepts_fp32_and_rejects_tf32():
    a, b = _inputs()
    assert device.gemm_verdict("float32", a, b, a @ b).ok
    tf32 = device.gemm_verdict("float32", a, b, _tf32(a) @ _tf32(b))
    assert not tf32.ok and "tolerance" in tf32.failure_message()
    assert tf32.rel_err > 10 * device.gemm_tolerance("float32").rel_fro
    # the same product is within the tolerance of the tf32 check
    assert device.gemm_verdict("tf32", a, b, _tf32(a) @ _tf32(b)).ok


@pytest.mark.parametrize("dtype", ["float32", "tf32", "bfloat16", "float16", "float8"])
def test_gemm_wrong_by_1e_2_fails_in_every_dtype(dtype):
    a, b = _inputs(1)
    verdict = device.gemm_verdict(dtype, a, b, (a.double() @ b.double() * (1 + 1e-2)).float())
    assert not verdict.ok and verdict.rel_err == pytest.approx(1e-2, rel=1e-3)


def test_gemm_numerics_rejects_nan_inf_and_low_precision_output():
    a, b = _inputs()
    for bad in (float("nan"), float("inf")):
        c = a @ b
        c[0, 0] = bad
        verdict = device.gemm_verdict("bfloat16", a, b, c)
        assert not verdict.ok and verdict.nonfinite == 1
    fp8ish = (a @ b).to(torch.float8_e4m3fn).float()  # output rounded to 3 mantissa bits
    assert not device.gemm_verdict("float16", a, b, fp8ish).ok


def test_gemm_one_wrong_tail_entry_fails_through_the_entry_figure():
    a, b = _inputs(2)
    c = (a.double() @ b.double()).float()
    c[-1, -1] += 0.2 * c.pow(2).mean().sqrt()  # one bad tail entry barely moves the Frobenius norm
    verdict = device.gemm_verdict("bfloat16", a, b, c)
    assert verdict.rel_err < device.gemm_tolerance("bfloat16").rel_fro
    assert not verdict.ok and verdict.entry_err > device.gemm_tolerance("bfloat16").entry


def test_sample_keeps_edges_and_is_full_for_small_dimensions():
    rng = random.Random(0)
    cols = device.sample_indices(201088, 256, 4, rng)
    assert len(cols) == len(set(cols)) == 256 and cols == sorted(cols)
    assert cols[:4] == [0, 1, 2, 3] and cols[-4:] == [201084, 201085, 201086, 201087]
    assert device.sample_indices(17, 256, 4, rng) == list(range(17))
    rows, cols = device.gemm_sample((4096, 2880, 201088), 7)
    assert (len(rows), len(cols)) == (64, 256) and device.gemm_sample((4096, 2880, 201088), 7) == (rows, cols)


def test_gemm_plans_follow_the_data():
    cpu = device.gemm_plan("float32", {"platform": "cpu"})
    assert (1, 2880, 2880) in cpu.shapes and (129, 2880, 5760) in cpu.shapes and (3, 2881, 17) in cpu.shapes
    assert all(n != 201088 and m != 4096 for m, _, n in cpu.shapes)
    assert device.gemm_plan("tf32", {"platform": "cpu"}).skip
    assert device.gemm_plan("float8", {"platform": "cpu"}).skip
    gpu = device.gemm_plan("bfloat16", H200_INFO)
    assert len([s for s in gpu.shapes if s[1] == 2880 and s[2] in (2880, 5760, 201088)]) >= 15
    tf32 = device.gemm_plan("tf32", H200_INFO)
    assert (tf32.probe_dtype, tf32.tf32) == ("float32", True)
    fp8 = device.gemm_plan("float8", H200_INFO)
    assert fp8.probe_dtype == "float8_e4m3fn" and all(k % 16 == 0 and n % 16 == 0 for _, k, n in fp8.shapes)
    assert (4096, 2880, 201088) in fp8.shapes and (3, 2881, 17) in fp8.not_applicable
    assert device.gemm_plan("float8", MI300X_INFO).probe_dtype == "float8_e4m3fnuz"
    assert device.gemm_plan("float8", {"platform": "cuda", "name": "Some Laptop GPU"}).skip


def test_gemm_report_names_failing_shapes_and_seed():
    a, b = _inputs(3)
    good = device.gemm_verdict("float16", a, b, a @ b, shape=(128, 1024, 128))
    bad = device.gemm_verdict("float16", a, b, a @ b * 1.01, shape=(129, 2880, 201088))
    report = device.GemmReport("float16", 12345, [good, bad])
    message = report.failure_message()
    assert not report.ok and "seed 12345" in message and "M=129 K=2880 N=201088" in message
    assert report.figures()["entries_checked"] == 2 * 128 * 128 and report.figures()["gemm_rel_err"] > 9e-3
    assert not device.GemmReport("float16", 1, []).ok


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cpu_probe_returns_the_sampled_block(dtype):
    probe = DeviceProbe("-", {"device": "cpu"})
    shape, rows, cols = (33, 96, 300), [0, 5, 32], [0, 7, 299]
    out = probe.gemm_sample(*shape, dtype, 11, rows, cols)
    assert out["a"].shape == (3, 96) and out["w"].shape == (3, 96) and out["c"].shape == (3, 3)
    verdict = device.gemm_verdict(dtype, out["a"], out["w"].t(), out["c"], shape=shape)
    assert verdict.ok, verdict.failure_message()
    again = probe.gemm_sample(*shape, dtype, 11, rows, cols)
    assert torch.equal(out["c"], again["c"])  # the seed fixes the inputs


def test_each_probe_call_hands_the_device_memory_back(monkeypatch):
    """The probe's process lives through the run: on the H200 the caching allocator kept 6 GB of its GEMMs from the
    vLLM engine and the fp64 reference started after them (the reference then ran out of memory). Each call, also
    one that fails, ends by emptying the cache (torch.cuda.empty_cache on a GPU, counted here)."""
    closed = []
    monkeypatch.setattr(DeviceProbe, "close", lambda self: closed.append(1))
    probe = DeviceProbe("-", {"device": "cpu"})
    probe.gemm_sample(33, 96, 300, "float32", 11, [0], [0])
    with pytest.raises(AttributeError):
        probe.gemm_sample(33, 96, 300, "no_such_dtype", 11, [0], [0])
    assert len(closed) == 2
    assert all(getattr(DeviceProbe, m).__wrapped__ for m in ("gemm_sample", "gemm_tflops", "copy_gbps"))


def test_tf32_switch_is_restored(monkeypatch):
    probe = DeviceProbe("-", {"device": "cpu"})
    probe.gpu = True  # the switch is a flag of torch.backends: settable on a CPU build too
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with probe._fp32_matmul(True):
        assert matmul.fp32_precision == "tf32"
    with pytest.raises(RuntimeError), probe._fp32_matmul(False):
        assert matmul.fp32_precision == "ieee"
        raise RuntimeError("a GEMM that failed")
    assert matmul.fp32_precision == before


def test_pin_check_rejects_gfx90a_on_the_mi300x_manifest():
    fp = {"platform": {"accelerator": "amd", "gfx_targets": ["gfx90a"], "rocm_version": "6.4.1"},
          "packages": {"torch": "2.7.0+rocm6.4", "vllm": "0.10.2"}, "runtime": {"torch_hip_version": "6.4.1"}}
    report = pin_report(fp, PINS_DIR / "mi300x.toml")
    assert report.manifest == "mi300x.toml"
    assert any(p.startswith("gfx_target violation") for p in report.problems), report.problems
    assert any(" unknown" in p for p in report.problems)  # unread facts fail closed


def test_pin_check_without_a_manifest_fails():
    assert pin_report({"platform": {"accelerator": "quantum"}}).problems


def test_vllm_pins_are_advisory_when_the_engine_is_not_vllm():
    fp = {"platform": {"accelerator": "none", "python": "3.11.7", "cpu_flags": ["avx2"]},
          "packages": {"torch": "2.13.0+cpu", "vllm": None, "vllm_distribution": None}}
    with_vllm = pin_report(fp, PINS_DIR / "cpu.toml", engine="vllm")
    assert any(p.startswith("vllm_version unknown") for p in with_vllm.problems)
    other = pin_report(fp, PINS_DIR / "cpu.toml", engine="transformers")
    assert not any("vllm_version" in p for p in other.problems)
    assert any("vllm_version" in a for a in other.advisories)


def test_the_raw_code_object_scan_is_not_applicable_on_cuda(monkeypatch):
    monkeypatch.setattr(code_object_scan, "installed", lambda: pytest.fail("scanned on CUDA"))
    raw = device.raw_code_object_isa({"platform": "cuda", "isa": "sm_90"}, "vllm")
    assert not raw.problems and raw.figures() == {"amdgpu_code_objects_applicable": 0.0}
    assert raw.not_applicable.startswith("raw AMDGPU code objects: not applicable on cuda")
