"""Meta tests of the comparison helpers: each must pass on agreement and raise on every kind of
disagreement, naming both sides and the tolerance."""

from __future__ import annotations

import pytest

from conformance.engines.base import Completion, KVState, StepLogprobs
from conformance.verdicts import compare

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


# --- fail closed: NaN anywhere, a missing prefill side, disjoint top-k, a fault in one band ---


def _with_prefill(n: int, value: float = -0.5) -> Completion:
    steps = [StepLogprobs(7, {7: value, 8: -2.0}) for _ in range(n)]
    return Completion(list(range(n + 1)), [7], [StepLogprobs(7, {7: -0.1, 8: -2.0})], steps)


def test_a_nan_that_is_not_the_first_value_fails():
    got = completion([5, 6, 7], [{5: -0.1}, {6: float("nan")}, {7: -0.2}])
    want = completion([5, 6, 7], [{5: -0.1}, {6: -0.1}, {7: -0.2}])
    report = compare.logprobs_close([got], [want], TOL)
    assert not report.ok and any("NaN" in p for p in report.problems)
    assert report.max_abs_dlogprob != report.max_abs_dlogprob  # the figure itself is NaN, not 0


def test_a_side_without_prefill_steps_fails():
    want = _with_prefill(10)
    got = Completion(want.prompt_ids, want.token_ids, want.steps, [])
    report = compare.logprobs_close([got], [want], TOL)
    assert not report.ok and any("prefill steps" in p and "decode-only" in p for p in report.problems)


def test_fewer_prefill_steps_on_one_side_fail():
    want = _with_prefill(10)
    got = Completion(want.prompt_ids, want.token_ids, want.steps, want.prompt_steps[:4])
    assert not compare.logprobs_close([got], [want], TOL).ok


def test_top_k_sets_that_share_no_token_fail():
    got = completion([5], [{5: -0.1, 6: -1.0}])
    want = completion([5], [{5: -0.1, 6: -1.0}])
    want.steps[0] = StepLogprobs(5, {5: -0.1})
    got.steps[0] = StepLogprobs(5, {9: -0.1, 5: -0.2})
    assert compare.logprobs_close([got], [want], compare.LogprobTolerance(1.0)).ok  # share token 5
    got.steps[0] = StepLogprobs(9, {9: -0.1, 10: -0.2})
    want.steps[0] = StepLogprobs(9, {11: -0.1, 12: -0.3})
    report = compare.logprobs_close([got], [want], compare.LogprobTolerance(1.0))
    assert not report.ok and any("share no token" in p for p in report.problems)


def test_a_fault_in_one_position_band_fails_though_the_global_median_passes():
    # 300 prefill positions: the first 256 agree to 0.01, the last 44 are off by 0.5
    n = 300
    want = _with_prefill(n)
    got = Completion(want.prompt_ids, want.token_ids, want.steps,
                     [StepLogprobs(7, {7: -0.5 + (0.01 if t + 1 < 256 else 0.5), 8: -2.0}) for t in range(n)])
    tol = compare.LogprobTolerance(max_abs=10.0, p99=2.0, median=0.15, stratum_median=0.15)
    report = compare.logprobs_close([got], [want], tol)
    assert report.figures()["median_abs_dlogprob"] < 0.15
    assert not report.ok and any("prefill positions 256-1023" in p for p in report.problems)
    assert report.figures()["median_abs_dlogprob_prefill_256-1023"] > 0.15 > report.figures()["median_abs_dlogprob"]


def test_two_noisy_engines_may_part_greedy_paths_without_the_greedy_rule():
    """pairwise_greedy = false (bf16/fp16 engine against engine): disjoint top-k sets and tokens outside each other's
    top-k end the sequence as a counted divergence; a NaN and the distribution limits still fail."""
    got = completion([5, 9, 4], [{5: -0.1, 6: -2.0}, {9: -1.5, 8: -2.4}, {4: -0.1}])
    want = completion([5, 1, 4], [{5: -0.1, 6: -2.0}, {1: -2.2, 3: -2.5}, {4: -0.1}])
    strict = compare.logprobs_close([got], [want], TOL)
    assert not strict.ok and any("share no token" in p for p in strict.problems)
    loose = compare.logprobs_close([got], [want], TOL, greedy_rule=False)
    assert loose.ok and loose.divergences == 1 and loose.compared_steps == 2
    nan = completion([5], [{5: float("nan"), 6: -2.0}])
    assert not compare.logprobs_close([nan], [want], TOL, greedy_rule=False).ok
    off = completion([5, 9], [{5: -0.5, 6: -2.0}, {9: -1.5}])
    report = compare.logprobs_close([off], [want], TOL, greedy_rule=False)
    assert not report.ok and any("max_abs_dlogprob = 0.4 exceeds" in p for p in report.problems)
