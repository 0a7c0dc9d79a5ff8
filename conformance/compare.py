"""Named comparison helpers. Each returns a report that prints both sides, the error figure and
the tolerance, and raises only through `raise_if_failed` — never a bare == on floats in a check."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from conformance.engines.base import Completion, KVState, StepLogprobs


class CheckFailed(AssertionError):
    """A conformance verdict: the stack disagrees with its reference beyond the tolerance."""


@dataclass(frozen=True)
class LogprobTolerance:
    """Limits on |Δlogprob| over the tokens both sides rank in their top-k (data: tolerances.toml)."""

    max_abs: float
    p99: float | None = None
    median: float | None = None


@dataclass
class ParityReport:
    tolerance: LogprobTolerance
    names: tuple[str, str]
    deltas: list[float] = field(default_factory=list)
    compared_steps: int = 0
    divergences: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def max_abs_dlogprob(self) -> float:
        return max(self.deltas, default=float("nan"))

    def _quantile(self, q: float) -> float:
        if not self.deltas:
            return float("nan")
        ordered = sorted(self.deltas)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared_steps > 0

    def figures(self) -> dict[str, float]:
        return {
            "max_abs_dlogprob": self.max_abs_dlogprob,
            "p99_abs_dlogprob": self._quantile(0.99),
            "median_abs_dlogprob": statistics.median(self.deltas) if self.deltas else float("nan"),
            "compared_steps": float(self.compared_steps),
            "greedy_divergences": float(self.divergences),
        }

    def finish(self) -> ParityReport:
        tol, figs = self.tolerance, self.figures()
        if self.compared_steps == 0:
            self.problems.append("nothing was compared: no steps came back")
        limits = (("max_abs_dlogprob", tol.max_abs), ("p99_abs_dlogprob", tol.p99),
                  ("median_abs_dlogprob", tol.median))
        for name, limit in limits:
            if limit is not None and not figs[name] <= limit:  # NaN fails too
                self.problems.append(f"{name} = {figs[name]:.3g} exceeds the tolerance {limit:.3g}")
        return self

    def summary(self) -> str:
        a, b = self.names
        f = self.figures()
        return (f"{a} vs {b}: {self.compared_steps} steps, max |Δlogprob| {f['max_abs_dlogprob']:.3g} "
                f"(p99 {f['p99_abs_dlogprob']:.3g}, median {f['median_abs_dlogprob']:.3g}; tolerance "
                f"{self.tolerance.max_abs:.3g}), {self.divergences} greedy divergence(s) within top-k")

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise CheckFailed(self.summary() + "\n  " + "\n  ".join(self.problems[:10]))


def _step_deltas(got: StepLogprobs, want: StepLogprobs) -> list[float]:
    return [abs(got.top[t] - want.top[t]) for t in got.top if t in want.top]


def logprobs_close(got: list[Completion], want: list[Completion], tol: LogprobTolerance,
                   names: tuple[str, str] = ("engine", "reference")) -> ParityReport:
    """vLLM's check_logprobs_close rule plus figures: greedy tokens may differ only where each side's
    token is in the other's top-k, and comparison of a sequence stops at its first divergence.
    Prompt (prefill) steps are compared too, position by position."""
    report = ParityReport(tol, names)
    if len(got) != len(want):
        report.problems.append(f"{names[0]} returned {len(got)} completions, {names[1]} {len(want)}")
    for n, (g, w) in enumerate(zip(got, want)):
        for gs, ws in zip(g.prompt_steps, w.prompt_steps):
            report.deltas.extend(_step_deltas(gs, ws))
            report.compared_steps += 1
        if len(g.steps) != len(w.steps):
            report.problems.append(f"prompt {n}: {len(g.steps)} vs {len(w.steps)} generated steps")
        for t, (gs, ws) in enumerate(zip(g.steps, w.steps)):
            report.compared_steps += 1
            report.deltas.extend(_step_deltas(gs, ws))
            if gs.token != ws.token:
                if gs.token in ws.top and ws.token in gs.top:
                    report.divergences += 1
                else:
                    report.problems.append(
                        f"prompt {n} step {t}: {names[0]} chose {gs.token} (rank {ws.rank_of(gs.token)} in "
                        f"{names[1]}'s top-{len(ws.top)}), {names[1]} chose {ws.token} (rank "
                        f"{gs.rank_of(ws.token)} in {names[0]}'s top-{len(gs.top)})")
                break
    return report.finish()


@dataclass
class KVReport:
    during: KVState
    after: KVState
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def figures(self) -> dict[str, float]:
        return {"kv_blocks_total": float(self.after.num_blocks),
                "kv_blocks_used_during": float(self.during.used_blocks),
                "kv_blocks_used_after": float(self.after.used_blocks)}

    def raise_if_failed(self) -> None:
        if self.problems:
            raise CheckFailed("KV cache check failed: " + "; ".join(self.problems))


def kv_blocks_released(during: KVState, after: KVState, min_used_during: int) -> KVReport:
    """Blocks were allocated while a request ran, and all are free again once it finished."""
    report = KVReport(during, after)
    if after.num_blocks <= after.reserved_blocks:
        report.problems.append(f"the engine reports {after.num_blocks} KV blocks: no cache was allocated")
    if during.used_blocks < min_used_during:
        report.problems.append(f"a running request held {during.used_blocks} blocks, fewer than the "
                               f"{min_used_during} its length needs")
    if after.num_blocks != during.num_blocks:
        report.problems.append(f"the pool changed size from {during.num_blocks} to {after.num_blocks} blocks")
    if after.used_blocks != 0:
        report.problems.append(f"{after.used_blocks} of {after.num_blocks} blocks still in use after every "
                               f"request finished ({after.free_blocks} free, {after.reserved_blocks} reserved)")
    if after.running_requests:
        report.problems.append(f"{after.running_requests} request(s) still running or waiting")
    return report
