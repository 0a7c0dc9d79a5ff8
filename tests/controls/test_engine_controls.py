"""Controls of conformance/checks/test_engine.py: its own body accepts well-formed outputs and rejects malformed
ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks.test_engine import test_engine_starts_and_generates as engine_check
from conformance.engines.base import Completion, StepLogprobs

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
