"""History independence: one greedy request (the probe) answered by one engine before and after other traffic, and by
a second engine of the target started apart, must agree — an engine's answer depends on the request, never on what
it served before (vllm-project/vllm#57493).

Two comparisons judge, each against its twin, the same pair without the traffic between: the probe after traffic
against the probe before (its twin: the probe sent twice in a row, the engine's own repeat noise), and the probe after
traffic against the fresh engine's (its twin: the probe before traffic against the fresh engine's, what the two
engines' starts and configurations part by alone). Each limit is the dtype's floor (tolerances.toml [history.<dtype>]),
raised to noise_ratio x the twin's figure where the dtype has a ratio: float32 has none, so its answers must be the
same within the floor and with the same tokens, whatever the twins show."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.datafiles import DataError
from conformance.engines.base import Completion
from conformance.verdicts.compare import LogprobTolerance, ParityReport, logprobs_close
from conformance.verdicts.verdict import FigureLimit, Verdict

# the comparisons: (figure prefix, what is compared with what), judged and twin
BEFORE_AFTER = ("before_after", "after traffic", "before traffic")
FRESH_AFTER = ("fresh_after", "after traffic", "a fresh engine")
REPEAT_TWIN = ("repeat_twin", "the probe again", "before traffic")
ENGINE_TWIN = ("engine_twin", "before traffic", "a fresh engine")


@dataclass(frozen=True)
class HistoryLimits:
    """The limits of one dtype (tolerances.toml [history.<dtype>]): the largest |Δlogprob| between the probe before
    and after traffic on one engine (`same_engine`) and between a fresh engine's probe and the probe after traffic
    (`fresh_engine`), how many greedy tokens may part within each other's top-k (`max_divergences`), the ratio to the
    twins the limits widen by (`noise_ratio`; None: fixed) and the top-k compared."""

    same_engine: float
    fresh_engine: float
    max_divergences: int
    noise_ratio: float | None
    top_k: int
    source: str = ""
    table: str = "tolerances.toml [history]"  # where they were read: the record names it beside each limit

    @classmethod
    def from_row(cls, row: Mapping[str, Any], where: str) -> HistoryLimits:
        try:
            ratio = row.get("noise_ratio")
            return cls(float(row["same_engine_max_abs"]), float(row["fresh_engine_max_abs"]),
                       int(row["max_divergences"]), float(ratio) if ratio else None, int(row["top_k"]),
                       str(row.get("source", "")), where)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where} needs same_engine_max_abs, fresh_engine_max_abs, max_divergences and top_k "
                            f"(noise_ratio optional): {exc!r}") from exc

    def widened(self, floor: float, twin_max: float) -> float:
        """The limit of a comparison whose twin reached `twin_max`: the floor, or noise_ratio x the twin if larger."""
        if self.noise_ratio is None or not math.isfinite(twin_max):
            return floor
        return max(floor, self.noise_ratio * twin_max)


@dataclass
class HistoryReport(Verdict):
    """The probe's comparisons, each a ParityReport; `traffic` says what ran between the probes (counts)."""

    bounds: HistoryLimits
    judged: dict[str, ParityReport]
    twins: dict[str, ParityReport]
    limit_of: dict[str, float]
    traffic: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        out: dict[str, float] = {}
        kept = ("max_abs_dlogprob", "p99_abs_dlogprob", "median_abs_dlogprob", "greedy_divergences", "compared_steps")
        for name, report in self.judged.items():
            f = report.figures()
            out |= {f"{figure}_{name}": f[figure] for figure in kept}
        for name, report in self.twins.items():
            out[f"max_abs_dlogprob_{name}"] = report.figures()["max_abs_dlogprob"]
        return out | dict(self.traffic)

    def limits(self) -> dict[str, FigureLimit]:
        table = self.bounds.table
        floors = {BEFORE_AFTER[0]: "same_engine_max_abs", FRESH_AFTER[0]: "fresh_engine_max_abs"}
        how = (f", widened to {self.bounds.noise_ratio:g} x its twin's where larger" if self.bounds.noise_ratio
               else " (fixed)")
        out = {f"max_abs_dlogprob_{name}": FigureLimit(limit, "max", f"{table} {floors[name]}{how}")
               for name, limit in self.limit_of.items()}
        out |= {f"greedy_divergences_{name}": FigureLimit(float(self.bounds.max_divergences), "max",
                                                           f"{table} max_divergences") for name in self.judged}
        return out

    def failure_message(self) -> str:
        f, limit = self.figures(), self.limit_of
        requests = int(self.traffic.get("traffic_requests", 0))
        head = (f"the same greedy request answered differently after {requests} other requests (engine history "
                f"drift): max |Δlogprob| before vs after traffic {f['max_abs_dlogprob_before_after']:.3g} (limit "
                f"{limit['before_after']:.3g}; repeated without traffic {f['max_abs_dlogprob_repeat_twin']:.3g}), "
                f"a fresh engine vs after traffic {f['max_abs_dlogprob_fresh_after']:.3g} (limit "
                f"{limit['fresh_after']:.3g}; fresh vs before traffic {f['max_abs_dlogprob_engine_twin']:.3g})")
        return head + "\n  " + "\n  ".join(self.problems[:10])


def _compare(pair: tuple[str, str, str], got: list[Completion], want: list[Completion], limit: float) -> ParityReport:
    return logprobs_close(got, want, LogprobTolerance(limit), pair[1:])


def history_independent(fresh: list[Completion], before: list[Completion], repeat: list[Completion],
                        after: list[Completion], bounds: HistoryLimits,
                        traffic: Mapping[str, float] | None = None) -> HistoryReport:
    """The probe's answers compared: after vs before on one engine (limit: `same_engine`, widened by the repeat twin)
    and after vs a fresh engine (limit: `fresh_engine`, widened by the engine twin); greedy tokens that part within
    each other's top-k count against `max_divergences`, outside it they fail (vLLM's top-k rule)."""
    twins = {REPEAT_TWIN[0]: _compare(REPEAT_TWIN, repeat, before, math.inf),
             ENGINE_TWIN[0]: _compare(ENGINE_TWIN, before, fresh, math.inf)}
    limit_of = {BEFORE_AFTER[0]: bounds.widened(bounds.same_engine, twins[REPEAT_TWIN[0]].max_abs_dlogprob),
                FRESH_AFTER[0]: bounds.widened(bounds.fresh_engine, twins[ENGINE_TWIN[0]].max_abs_dlogprob)}
    judged = {BEFORE_AFTER[0]: _compare(BEFORE_AFTER, after, before, limit_of[BEFORE_AFTER[0]]),
              FRESH_AFTER[0]: _compare(FRESH_AFTER, after, fresh, limit_of[FRESH_AFTER[0]])}
    report = HistoryReport(bounds, judged, twins, limit_of, dict(traffic or {}))
    for (name, a, b) in (BEFORE_AFTER, FRESH_AFTER, REPEAT_TWIN, ENGINE_TWIN):
        parity = judged.get(name) or twins[name]
        # a twin judges nothing by its size, but a twin that could not be compared (no steps, a NaN) widens nothing
        problems = parity.problems if name in judged else [p for p in parity.problems if "exceeds" not in p]
        report.problems += [f"{a} vs {b}: {p}" for p in problems]
        if name in judged and parity.divergences > bounds.max_divergences:
            report.problems.append(f"{a} vs {b}: {parity.divergences} greedy token(s) parted within each other's "
                                   f"top-k, {bounds.max_divergences} allowed")
    return report
