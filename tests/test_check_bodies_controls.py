"""Negative controls for the checks whose verdict lives in the check body: each is called with a
known-bad observation (a wrong platform, a fingerprint missing versions, truncated or out-of-vocab
outputs, non-finite logprobs) and must fail."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks.test_engine import test_engine_starts_and_generates as engine_check
from conformance.checks.test_stack_identity import test_stack_versions_recorded as versions_check
from conformance.checks.test_stack_identity import test_vllm_platform_matches_target as platform_check
from conformance.engines.base import Completion, StepLogprobs
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


PROMPTS = SimpleNamespace(prompts=[[1, 2, 3], [4, 5]], max_tokens=2)
MODEL = SimpleNamespace(config={"vocab_size": 100})


def outputs(tokens: list[list[int]], logprob: float = -0.5) -> tuple[list[Completion], float]:
    done = [Completion(p, t, [StepLogprobs(x, {x: logprob}) for x in t]) for p, t in zip(PROMPTS.prompts, tokens)]
    return done, 1.0


def check(result: tuple[list[Completion], float]) -> None:
    engine_check(None, result, PROMPTS, MODEL, lambda *a: None)


def test_engine_check_accepts_well_formed_outputs():
    check(outputs([[7, 8], [9, 10]]))


@pytest.mark.parametrize("bad", [
    outputs([[7, 8]]),  # a completion missing
    outputs([[7], [9, 10]]),  # fewer tokens than asked
    outputs([[7, 800], [9, 10]]),  # a token outside the vocabulary
    outputs([[7, 8], [9, 10]], logprob=float("nan")),  # non-finite logprobs
    outputs([[7, 8], [9, 10]], logprob=0.5),  # a "probability" above 1
], ids=["missing", "short", "out-of-vocab", "nan", "positive"])
def test_engine_check_rejects_malformed_outputs(bad):
    with pytest.raises(AssertionError):
        check(bad)
