"""Controls of conformance/checks/test_stack_identity.py: its own bodies against a vLLM built for another
platform, a fingerprint without versions or backends, a CPU torch on the ROCm target, and pins that cannot be
read or evaluated."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_stack_identity as identity
from conformance.checks.test_stack_identity import test_stack_versions_recorded as versions_check
from conformance.checks.test_stack_identity import test_vllm_platform_matches_target as platform_check
from conformance.run import run_target
from conformance.run.run_target import TargetReport
from tests.check_fakes import FAILED, Figures, target_of


def target_on(target: str) -> run_target.RunTarget:
    return run_target.build(target, report=TargetReport(target, target))


def engine_with(**info) -> SimpleNamespace:
    return SimpleNamespace(info={"engine": "vllm", "backends": {"attention": "X"}} | info)


def test_vllm_platform_check_rejects_a_cuda_vllm_on_the_rocm_target():
    platform_check(target_on("rocm"), engine_with(platform="rocm"))
    with pytest.raises(AssertionError, match="detected platform 'cuda'"):
        platform_check(target_on("rocm"), engine_with(platform="cuda"))


def test_versions_check_rejects_a_fingerprint_without_versions_or_backends():
    good = {"packages": {"torch": "2.13.0", "transformers": "5.19", "vllm": "0.32.0"}}
    versions_check(engine_with(), good)
    with pytest.raises(AssertionError, match="no version for vllm"):
        versions_check(engine_with(), {"packages": {"torch": "2.13.0", "transformers": "5.19"}})
    with pytest.raises(AssertionError):
        versions_check(engine_with(), good | {"error": "fingerprint collection failed"})
    with pytest.raises(AssertionError, match="no attention/MoE backends"):
        versions_check(engine_with(backends={}), good)


def test_torch_build_check_fails_on_a_cpu_torch_for_the_rocm_target():
    bad = TargetReport("rocm", "rocm", torch_flavour="cpu",
                       problems=["target rocm needs a ROCm build of torch, found a CPU build."])
    target = run_target.build("rocm", report=bad)
    with pytest.raises(FAILED, match="needs a ROCm build of torch"):
        identity.test_torch_build_matches_target(target, Figures())


def test_pins_check_fails_when_the_vllm_version_cannot_be_read():
    fp = {"platform": {"accelerator": "none", "python": "3.11.7", "cpu_flags": ["avx2"]},
          "packages": {"torch": "2.13.0+cpu", "vllm": None, "vllm_distribution": None}}
    with pytest.raises(FAILED, match="manifest cpu.toml: .*vllm_version unknown"):
        identity.test_stack_pins_hold(target_of("cpu"), fp, Figures())


def test_pins_check_names_the_missing_manifest_on_a_card_without_one():
    """The first H100 P0 (2026-12-05) failed with `manifest None: no pin was evaluated`; the sentence now says what
    is missing. (h100.toml exists since: the recorded H100 fingerprint passes below.)"""
    fp = {"platform": {"accelerator": "nvidia", "gpu_names": ["NVIDIA L4"], "compute_caps": ["8.9"]},
          "packages": {"torch": "2.11.0+cu130", "vllm": "0.26.0"}}
    with pytest.raises(FAILED, match="no pin manifest matches this platform: add one under env_checks/pins/"):
        identity.test_stack_pins_hold(target_of("cuda"), fp, Figures())


def test_the_recorded_h100_fingerprint_holds_the_h100_pins():
    import json
    from pathlib import Path

    fp = json.loads(Path("fixtures/device_runs/20261205T162601-bench-p0-L16-second-node-1/fingerprint.json")
                    .read_text())
    figures = Figures()
    identity.test_stack_pins_hold(target_of("cuda"), fp, figures)
    assert figures.values["pins_checked"] == 9 and figures.values["pins_failed"] == 0
