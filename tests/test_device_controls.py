"""Negative controls of the device and pin checks: wrong ISA, a GEMM that is really tf32 or NaN,
gfx90a where gfx942 is required, and facts that could not be read."""

from __future__ import annotations

import torch

from conformance import device
from conformance.pins_check import pin_report
from env_checks.pins import PINS_DIR


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


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(128, 1024, generator=gen), torch.randn(1024, 128, generator=gen)


def test_gemm_numerics_accepts_fp32_and_rejects_tf32():
    a, b = _inputs()
    assert device.gemm_verdict("float32", a, b, a @ b).ok

    def tf32(x: torch.Tensor) -> torch.Tensor:  # keep 10 mantissa bits, as tensor cores do
        return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)

    verdict = device.gemm_verdict("float32", a, b, tf32(a) @ tf32(b))
    assert not verdict.ok and "tolerance" in verdict.message()


def test_gemm_numerics_rejects_nan_and_low_precision_output():
    a, b = _inputs()
    c = a @ b
    c[0, 0] = float("nan")
    assert not device.gemm_verdict("bfloat16", a, b, c).ok
    fp8ish = (a @ b).to(torch.float8_e4m3fn).float()  # output rounded to 3 mantissa bits
    assert not device.gemm_verdict("float16", a, b, fp8ish).ok


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
