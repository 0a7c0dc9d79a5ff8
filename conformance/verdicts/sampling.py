"""Sampled requests judged against the distribution the request asks for.

vLLM's sampler applies, in this order: temperature (logits / T), min_p (drop tokens whose probability is below
min_p times the largest), top_k (keep the k largest logits, ties kept), top_p (on what is left, renormalised: drop
the tokens whose mass, summed from the least likely up, is at most 1 - top_p), then draws. `expected` computes that
distribution from the engine's own raw top-k logprobs of the position (vLLM's default `raw_logprobs`, which the
check holds against the fp64 reference), so the verdict on the sampler is exact in every dtype: the noise of bf16
logits is in both sides alike. Without a truncation the whole vocabulary is in play, and the test is conditional on
the draw landing in the top-k the engine returned.

`judge` is a Pearson goodness-of-fit test with tokens of expected count under MIN_EXPECTED pooled into one bin
(rare tokens), and a count of impossible draws (a token outside a truncated support: one is a failure)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from conformance.verdicts.verdict import FigureLimit, Verdict

ALPHA = 1e-6          # false-failure rate of the goodness-of-fit test per case
MIN_EXPECTED = 10.0   # expected count under which tokens are pooled (the chi-square tail holds from there)


@dataclass(frozen=True)
class Case:
    """One request's sampling parameters (0 / 1.0 / 0.0: not applied), named for the report."""

    name: str
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def truncated(self) -> bool:
        return self.top_k > 0 or self.min_p > 0.0

    def params(self) -> dict[str, float | int]:
        params: dict[str, float | int] = {"temperature": self.temperature}
        if self.top_k:
            params["top_k"] = self.top_k
        if self.top_p < 1.0:
            params["top_p"] = self.top_p
        if self.min_p:
            params["min_p"] = self.min_p
        return params


def top(raw: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of a logprob dict, most likely first (vLLM adds the drawn token to its top-k)."""
    return sorted(raw.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def expected(raw: list[tuple[int, float]], case: Case) -> dict[int, float]:
    """The distribution `case` asks for over the tokens of `raw` (most likely first): exact where the case truncates
    inside them, else conditional on drawing one of them."""
    if case.top_p < 1.0 and not case.truncated:
        raise ValueError(f"case {case.name}: top_p without top_k or min_p needs the whole vocabulary; add a top_k")
    scaled = [(t, lp / case.temperature) for t, lp in raw]
    best = scaled[0][1]
    if case.min_p:
        scaled = [(t, s) for t, s in scaled if s - best >= math.log(case.min_p)]
    if case.top_k:
        kth = scaled[min(case.top_k, len(scaled)) - 1][1]
        scaled = [(t, s) for t, s in scaled if s >= kth]
    weights = [(t, math.exp(s - best)) for t, s in scaled]
    total = sum(w for _, w in weights)
    probs = [(t, w / total) for t, w in weights]
    if case.top_p < 1.0:
        kept, below = [], 0.0
        for t, p in reversed(probs):  # least likely first, as vLLM's ascending sort
            below += p
            if below > 1.0 - case.top_p:
                kept.append((t, p))
        kept = kept or [probs[0]]
        total = sum(p for _, p in kept)
        probs = [(t, p / total) for t, p in kept]
    return dict(probs)


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square(dof): the regularised upper incomplete gamma (torch's, in float64)."""
    import torch

    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


@dataclass
class SamplingReport(Verdict):
    case: Case
    samples: int = 0               # draws the test used
    outside_top: int = 0           # untruncated: draws outside the engine's top-k (conditioned out)
    impossible: int = 0            # truncated: draws outside the support
    support_unseen: int = 0        # truncated: draws whose support reached past the returned top-k (conditioned out)
    chi2: float = 0.0
    dof: int = 0
    p_value: float = 1.0
    bins: list[tuple[str, int, float]] = field(default_factory=list)   # (token or "rare", observed, expected)
    problems: list[str] = field(default_factory=list)
    alpha: float = ALPHA           # the p-value under which the draws fail
    min_samples: int = 0           # the usable draws (plus impossible ones) a verdict needs

    def figures(self) -> dict[str, float]:
        c = self.case.name
        return {f"{c}_chi2": self.chi2, f"{c}_dof": float(self.dof), f"{c}_p_value": self.p_value,
                f"{c}_samples": float(self.samples), f"{c}_impossible": float(self.impossible),
                f"{c}_support_unseen": float(self.support_unseen)}

    def limits(self) -> dict[str, FigureLimit]:
        c = self.case.name
        judged = {f"{c}_p_value": FigureLimit(self.alpha, "min", "the goodness-of-fit test's false-failure rate per "
                                                                 "case (verdicts/sampling.py ALPHA)", headroom=False),
                  f"{c}_samples": FigureLimit(float(self.min_samples), "min", "the usable draws a verdict needs",
                                              headroom=False)}
        if self.case.truncated:
            judged[f"{c}_impossible"] = FigureLimit(0.0, "max", "a draw outside a truncated support", headroom=False)
        return judged

    def failure_message(self) -> str:
        table = ", ".join(f"{tok}: {o} seen / {e:.1f} expected" for tok, o, e in self.bins[:8])
        return "; ".join(self.problems) + f" [{table}]"


def judge(draws: list[tuple[int, dict[int, float]]], case: Case, k: int = 20, min_samples: int = 500,
          alpha: float = ALPHA) -> SamplingReport:
    """Goodness of fit of `draws` (each: the token drawn and the raw top-k logprobs it was drawn from)."""
    report = SamplingReport(case, alpha=alpha, min_samples=min_samples)
    observed: Counter[int] = Counter()
    want: dict[int, float] = defaultdict(float)
    memo: dict[tuple, dict[int, float]] = {}  # the draws of one position share their logprobs
    for token, raw in draws:
        key = tuple(sorted(raw.items()))
        listed = top(raw, k)
        dist = memo[key] if key in memo else memo.setdefault(key, expected(listed, case))
        if case.truncated and not 0 < case.top_k <= len(listed) and len(dist) >= len(listed):
            # the support reaches past the tokens returned: whether the draw is in it cannot be told from them
            report.support_unseen += 1
            continue
        if token not in dist:
            if case.truncated:
                report.impossible += 1
            else:
                report.outside_top += 1
            continue
        report.samples += 1
        observed[token] += 1
        for t, p in dist.items():
            want[t] += p
    if report.impossible:
        report.problems.append(f"{case.name} ({_describe(case)}): {report.impossible} of {len(draws)} draws fell "
                               "outside the support the request allows")
    if report.samples + report.impossible < min_samples:
        unseen = (f"; {report.support_unseen} drawn where the support reached past the top-{k} returned"
                  if report.support_unseen else "")
        report.problems.append(f"{case.name}: only {report.samples} usable draws of {len(draws)} (at least "
                               f"{min_samples} needed to judge){unseen}")
        return report
    rare_o, rare_e = 0, 0.0
    for t, e in sorted(want.items(), key=lambda kv: -kv[1]):
        if e >= MIN_EXPECTED:
            report.bins.append((str(t), observed[t], e))
        else:
            rare_o, rare_e = rare_o + observed[t], rare_e + e
    if rare_e > 0:
        report.bins.append(("rare", rare_o, rare_e))
    report.chi2 = sum((o - e) ** 2 / e for _, o, e in report.bins if e > 0)
    report.dof = len(report.bins) - 1
    report.p_value = chi2_sf(report.chi2, report.dof)
    if report.p_value < alpha:
        report.problems.append(f"{case.name} ({_describe(case)}): {report.samples} draws do not follow the "
                               f"requested distribution: chi-square {report.chi2:.1f} on {report.dof} degrees of "
                               f"freedom, p {report.p_value:.2g} < {alpha:g}")
    return report


def _describe(case: Case) -> str:
    return ", ".join(f"{k} {v}" for k, v in case.params().items())


# The min_p cut stays this many nats above the last of the top logprobs it is chosen from: a batch of draws computes
# the position's logits otherwise than the lone greedy request (at 16 of gpt-oss-120b's layers on an H100 the draws'
# top-20 were flatter by about a nat), and a cut deep in a flat tail let the support reach past the top-20 returned.
MIN_P_COVER = 2.0


def cases_for(raw: list[tuple[int, float]]) -> list[Case]:
    """The P0 cases for one position, truncations placed in the widest gaps of its top logprobs so that the support
    does not hinge on a near-tie: temperature alone, top_k, min_p (its cut MIN_P_COVER above the last of them, the
    widest such gap; under the top token where none is) and top_p (on top_k 20)."""
    lps = [lp for _, lp in raw]
    k = max(range(2, min(8, len(lps) - 1) + 1), key=lambda i: (lps[i - 1] - lps[i], -i))
    covered = [i for i in range(2, min(8, len(lps) - 1) + 1) if (lps[i - 1] + lps[i]) / 2 - lps[-1] >= MIN_P_COVER]
    m = max(covered, key=lambda i: (lps[i - 1] - lps[i], -i)) if covered else 1
    gap_mid = (lps[m - 1] + lps[m]) / 2 - lps[0]
    probs = [math.exp(lp - lps[0]) for lp in lps]
    total = sum(probs)
    cum = [sum(probs[: i + 1]) / total for i in range(len(probs))]
    n = max(range(1, min(6, len(probs) - 1) + 1), key=lambda i: (probs[i] / total, -i))  # the largest step
    return [Case("temperature", 0.7), Case("top_k", 1.0, top_k=k), Case("min_p", 1.0, min_p=math.exp(gap_mid)),
            Case("top_p", 1.0, top_k=len(lps), top_p=round((cum[n - 1] + cum[n]) / 2, 4))]


def flip_explained(alone: dict, other: dict, temperature: float, noise: float) -> str | None:
    """None when two outputs of one seeded request agree, or part only where the logits moved enough to flip that
    draw; else why not. With one seed the draws' noise is the same on both sides, so where `alone` chose a and
    `other` chose b at the first step they differ, the gap l_a - l_b must have shrunk from one run to the other
    (by more than nothing, by no more than `noise`): unchanged logits cannot flip a seeded draw."""
    a_ids, b_ids = alone["token_ids"], other["token_ids"]
    step = _parting(alone, other)
    if step is None:
        return None if len(a_ids) == len(b_ids) else f"{len(a_ids)} tokens against {len(b_ids)}"
    a, b = a_ids[step], b_ids[step]
    moved = flip_move(alone, other, temperature)
    if moved is None:
        return f"at step {step} the draws {a} and {b} are not both among each other's top logprobs"
    if not 0.0 < moved <= noise:
        return (f"at step {step} the draw flipped from {a} to {b} while their logprob gap moved by {moved:.3g} "
                f"(a seeded draw flips only if it moves by more than 0 and, within the dtype's noise, at most "
                f"{noise:g})")
    return None


def _parting(alone: dict, other: dict) -> int | None:
    """The first step at which two outputs of one seeded request draw different tokens; None where they do not."""
    return next((i for i, (a, b) in enumerate(zip(alone["token_ids"], other["token_ids"])) if a != b), None)


def flip_noise(tol: Any) -> tuple[float, FigureLimit]:
    """The most a seeded draw's logprob gap may move for a flip to be the dtype's noise (`tol`, a LogprobTolerance:
    its p99, else its max_abs), and that bound as the limit of a check's largest flip move (`largest_flip_move`)."""
    noise = tol.p99 or tol.max_abs
    return noise, FigureLimit(noise, "max", f"{tol.source} {'p99' if tol.p99 else 'max_abs'}: the most a seeded "
                                            "draw's logprob gap may move for a flip on noise", headroom=False)


def largest_flip_move(pairs: list[tuple[dict, dict]], temperature: float) -> float:
    """The largest `flip_move` over pairs of outputs of one seeded request (0.0 where none part); a pair whose move
    cannot be told is left out here, and `flip_explained` fails it."""
    return max((m for a, b in pairs if (m := flip_move(a, b, temperature)) is not None), default=0.0)


def flip_move(alone: dict, other: dict, temperature: float) -> float | None:
    """How far the logprob gap l_a - l_b of the tokens a (`alone`'s) and b (`other`'s) drawn at the first step where
    two outputs of one seeded request part shrank from one to the other, over the temperature: the figure
    `flip_explained` holds to the dtype's noise. 0.0 where they do not part; None where a or b is missing from
    either side's top logprobs."""
    step = _parting(alone, other)
    if step is None:
        return 0.0
    a, b = alone["token_ids"][step], other["token_ids"][step]
    la, lb = alone["logprobs"][step], other["logprobs"][step]
    if not all(t in lp for t in (a, b) for lp in (la, lb)):
        return None
    return ((la[a] - la[b]) - (lb[a] - lb[b])) / temperature

