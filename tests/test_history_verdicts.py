"""The history verdict (conformance/verdicts/history.py) on crafted answers: identical answers pass, a drift fails
naming both comparisons and their limits, bf16 widens to its twins while float32 holds fixed, and greedy tokens that
part are counted by the dtype's allowance or fail outside each other's top-k."""

from __future__ import annotations

import pytest

from conformance.engines.base import Completion, StepLogprobs
from conformance.verdicts.history import HistoryLimits, history_independent


def answer(shift: float = 0.0, tokens: tuple[int, ...] = (3, 4, 5), prefill: int = 4) -> list[Completion]:
    """One completion whose logprobs move by `shift` (the chosen token's) and by -shift (the runner-up's)."""
    def step(t: int) -> StepLogprobs:
        return StepLogprobs(t, {t: -0.5 + shift, t + 100: -1.5 - shift})
    return [Completion(list(range(10, 10 + prefill + 1)), list(tokens), [step(t) for t in tokens],
                       [step(20 + i) for i in range(prefill)])]


FP32 = HistoryLimits(1e-5, 1e-4, 0, None, 5)
BF16 = HistoryLimits(0.02, 0.02, 1, 3.0, 5)


def test_history_verdict_passes_identical_answers_and_fails_a_drift_naming_both_figures():
    same = history_independent(answer(), answer(), answer(), answer(), FP32, {"traffic_requests": 11.0})
    assert same.ok and same.figures()["max_abs_dlogprob_before_after"] == 0.0
    drift = history_independent(answer(), answer(), answer(), answer(0.01), FP32, {"traffic_requests": 11.0})
    assert not drift.ok
    message = drift.failure_message()
    assert "after 11 other requests" in message and "before vs after traffic 0.01 (limit 1e-05" in message
    assert "a fresh engine vs after traffic 0.01 (limit 0.0001" in message
    assert drift.limits()["max_abs_dlogprob_fresh_after"].value == 1e-4


def test_history_verdict_widens_bf16_to_its_twins_and_holds_float32_fixed():
    """An engine that is not bit-repeatable on its own (the probe repeated at once parts by 0.05; the fresh engine
    parts from the probe before traffic by 0.1) passes bf16 at 0.1 after traffic (limits 3 x 0.05 and 3 x 0.1) and
    fails 0.2; float32 has no ratio: 0.1 fails whatever the twins show."""
    noisy = answer(0.05)
    report = history_independent(answer(0.1), answer(), noisy, answer(0.1), BF16)
    assert report.ok and report.limit_of == {"before_after": pytest.approx(0.15), "fresh_after": pytest.approx(0.3)}
    far = history_independent(answer(), answer(), noisy, answer(0.2), BF16)
    assert not far.ok and "same_engine_max_abs, widened to 3 x its twin's" in \
        far.limits()["max_abs_dlogprob_before_after"].source
    assert not history_independent(answer(0.1), answer(), noisy, answer(0.1), FP32).ok


def test_history_verdict_counts_greedy_tokens_that_part():
    """A greedy token that parts within each other's top-k: none allowed in float32, one in bf16; outside it, a
    failure whatever the dtype."""
    def near_tie(chosen: int, other: int) -> list[Completion]:
        out = answer()
        out[0].token_ids[1] = chosen
        out[0].steps[1] = StepLogprobs(chosen, {chosen: -0.700, other: -0.705})
        return out

    tied, parted = near_tie(4, 104), near_tie(104, 4)  # the runner-up chosen, a near-tie apart
    assert "1 greedy token(s) parted within each other's top-k, 0 allowed" in \
        history_independent(tied, tied, tied, parted, FP32).failure_message()
    assert history_independent(tied, tied, tied, parted, BF16).ok
    elsewhere = answer()
    elsewhere[0].token_ids[1] = 77  # a token outside the other's top-k
    elsewhere[0].steps[1] = StepLogprobs(77, {77: -0.5, 177: -1.5})
    assert "chose 77" in history_independent(answer(), answer(), answer(), elsewhere, BF16).failure_message()
