"""Meta tests of the comparison helpers: each must pass on agreement and raise on every kind of
disagreement, naming both sides and the tolerance."""

from __future__ import annotations

import pytest

from conformance import compare
from conformance.engines.base import Completion, KVState, StepLogprobs

TOL = compare.LogprobTolerance(max_abs=1e-3)


def completion(tokens: list[int], tops: list[dict[int, float]]) -> Completion:
    return Completion([1, 2, 3], tokens, [StepLogprobs(t, top) for t, top in zip(tokens, tops)])


def test_identical_completions_pass():
    c = completion([5, 6], [{5: -0.1, 6: -2.0}, {6: -0.2, 7: -1.9}])
    report = compare.logprobs_close([c], [c], TOL)
    assert report.ok and report.max_abs_dlogprob == 0 and report.compared_steps == 2
    report.raise_if_failed()


def test_logprob_error_beyond_tolerance_fails_and_names_it():
    got = completion([5], [{5: -0.1, 6: -2.0}])
    want = completion([5], [{5: -0.1 - 5e-3, 6: -2.0}])
    report = compare.logprobs_close([got], [want], TOL)
    assert not report.ok
    with pytest.raises(compare.CheckFailed, match=r"max_abs_dlogprob = 0.005 exceeds the tolerance 0.001"):
        report.raise_if_failed()


def test_divergence_inside_both_top_k_is_allowed_and_stops_comparison():
    got = completion([5, 9], [{5: -0.69, 6: -0.70}, {9: -0.1}])
    want = completion([6, 1], [{6: -0.69, 5: -0.70}, {1: -0.1}])
    report = compare.logprobs_close([got], [want], compare.LogprobTolerance(max_abs=0.02))
    assert report.ok and report.divergences == 1 and report.compared_steps == 1


def test_divergence_outside_top_k_fails():
    got = completion([5], [{5: -0.1, 6: -3.0}])
    want = completion([7], [{7: -0.1, 6: -3.0}])
    report = compare.logprobs_close([got], [want], TOL)
    assert not report.ok and "chose 5" in report.problems[0]


def test_nothing_compared_fails_closed():
    assert not compare.logprobs_close([], [], TOL).ok
    empty = Completion([1], [], [])
    assert not compare.logprobs_close([empty], [empty], TOL).ok


def test_missing_completion_fails():
    c = completion([5], [{5: -0.1}])
    assert not compare.logprobs_close([c], [c, c], TOL).ok


def test_bf16_distribution_limits_apply():
    tol = compare.LogprobTolerance(max_abs=4.0, p99=2.0, median=0.15)
    steps = [{5: -0.1 - 0.5, 6: -2.0}] * 10
    got = completion([5] * 10, steps)
    want = completion([5] * 10, [{5: -0.1, 6: -2.0}] * 10)
    report = compare.logprobs_close([got], [want], tol)
    assert not report.ok and any("median" in p for p in report.problems)


def kv(free: int, running: int = 0, num: int = 100) -> KVState:
    return KVState(num_blocks=num, free_blocks=free, block_size=16, running_requests=running)


def test_kv_released_passes_when_all_blocks_free():
    report = compare.kv_blocks_released(kv(free=90, running=1), kv(free=99), min_used_during=5)
    assert report.ok, report.problems


def test_kv_leaked_block_fails():
    report = compare.kv_blocks_released(kv(free=90, running=1), kv(free=98), min_used_during=5)
    with pytest.raises(compare.CheckFailed, match="1 of 100 blocks still in use"):
        report.raise_if_failed()


def test_kv_stuck_request_fails():
    assert not compare.kv_blocks_released(kv(free=90, running=1), kv(free=99, running=1), 5).ok


def test_kv_no_allocation_while_running_fails():
    assert not compare.kv_blocks_released(kv(free=99, running=1), kv(free=99), min_used_during=5).ok


def test_kv_no_cache_at_all_fails():
    assert not compare.kv_blocks_released(kv(free=0, num=1), kv(free=0, num=1), 0).ok
