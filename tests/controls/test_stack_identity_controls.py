"""Controls of conformance/checks/test_stack_identity.py: its own bodies against a vLLM built for another
platform, a fingerprint without versions or backends, a CPU torch on the ROCm target, and pins that cannot be
read or evaluated."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks.test_stack_identity import test_stack_versions_recorded as versions_check
from conformance.checks.test_stack_identity import test_vllm_platform_matches_target as platform_check
from conformance.run import run_target
from conformance.run.targets import TargetReport


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
