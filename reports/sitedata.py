"""Everything the dashboard page shows, gathered from the history store into one `SiteData` value.

Queries are few and set-based (latest run of each tier per lineage, grouped tier counts, one figures join), so a history
of a thousand runs renders in about a second; the HTML itself is built by `render` from this value alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

from reports import analysis, verdict
from reports.analysis import Column, Disagreement, Matrix, ParityScore, Transition
from reports.claims import CertifiedCombo, MatrixUnreadable, certified_combos
from reports.history import CheckRow, History, RunInfo
from reports.limits import Limit
from reports.signatures import Diagnosis, diagnose
from reports.svg import PALETTE

# Reference platform first: columns read left to right as "CUDA says, ROCm says, the CPU default says".
TARGET_ORDER = {"cuda": 0, "rocm": 1, "cpu": 2}


@dataclass(frozen=True)
class TransitionView:
    """A green → red step with the checks that flipped across it."""

    transition: Transition
    flipped: list[tuple[CheckRow | None, CheckRow]]


@dataclass(frozen=True)
class FigureTrend:
    """One figure of one check over time, per lineage, against the limits its runs recorded (oldest first, each once:
    a limit that moved shows as two lines); points of runs that recorded none are plotted without a line."""

    check_id: str
    name: str
    limits: tuple[Limit, ...]
    lineages: dict[str, list[tuple[str, float]]]


@dataclass
class SiteData:
    """The dashboard's content; built by `collect`, rendered by `render.render_page`."""

    generated_at: str
    runs: list[RunInfo]
    columns: list[Column]
    matrix: Matrix
    scores: list[ParityScore]
    disagreements: list[Disagreement]
    latest_checks: dict[str, list[CheckRow]]
    colors: dict[str, str]
    transitions: list[TransitionView] = field(default_factory=list)
    pass_trend: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    tier_trend: dict[tuple[str, str], list[tuple[str, float]]] = field(default_factory=dict)
    # figures some run recorded a limit for (reports/limits.py), evidence runs only; inputs and counts are left out
    figure_trends: list[FigureTrend] = field(default_factory=list)
    diagnoses: dict[tuple[str, str], Diagnosis] = field(default_factory=dict)
    skipped_inputs: list[tuple[str, str]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    # lineage -> tier -> the newest run of that tier: the source of that tier's checks in `latest_checks`
    tier_runs: dict[str, dict[str, RunInfo]] = field(default_factory=dict)
    # lineage (combo) -> (started_at, seconds) of each P0-only run's wall (results.json phases): P0 time over time
    p0_wall_trend: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    # run id -> (machine-health verdict, telemetry series) of each lineage's latest run (reports/telemetry_view.py)
    health: dict[str, tuple[str | None, dict]] = field(default_factory=dict)
    # runs that are no platform evidence (RunInfo.not_evidence says why): listed, never counted
    not_counted: list[RunInfo] = field(default_factory=list)
    # the release decision per lineage (reports/verdict.py), ROCm first, and tier -> every check id seen
    verdicts: list[verdict.Verdict] = field(default_factory=list)
    universe: dict[str, set[str]] = field(default_factory=dict)
    certified: tuple[CertifiedCombo, ...] = ()  # the combinations of ci/matrix.toml

    @property
    def tiers(self) -> list[str]:
        return sorted({tier for tier, _area, _id in self.matrix.rows})

    @property
    def areas(self) -> list[str]:
        return sorted({area for _tier, area, _id in self.matrix.rows})

    def diagnosis(self, check: CheckRow) -> Diagnosis | None:
        return self.diagnoses.get((check.run_id, check.id))

    def failure_class(self, check: CheckRow) -> str | None:
        found = self.diagnosis(check)
        return analysis.failure_class(check, found.signature.failure_class if found else None)


# Headline figures first: parity error, then throughput, then everything else by name.
FIGURE_PRIORITY = ("max_abs_dlogprob", "top1_agreement", "tflops", "tokens_per_s", "hbm_gbps", "ttft")


def _figure_order(check_id: str, name: str) -> tuple[int, str, str]:
    ranks = (i for i, prefix in enumerate(FIGURE_PRIORITY) if name.startswith(prefix))
    rank = next(ranks, len(FIGURE_PRIORITY))
    return rank, name, check_id


def collect(history: History, now: datetime | None = None,
            combos: tuple[CertifiedCombo, ...] | None = None) -> SiteData:
    """Read the history store and compute every view of the dashboard; `combos`: the combinations the decision lists
    (None: those of the checkout's ci/matrix.toml)."""
    every = history.runs()
    runs = [r for r in every if r.not_evidence is None]  # only platform evidence reaches parity, lineages, trends
    latest = analysis.latest_per_lineage(runs)
    tier_runs = analysis.latest_per_lineage_tier(runs)
    columns = sorted((Column(key, run.platform, run.target, run) for key, run in latest.items()),
                     key=lambda c: (TARGET_ORDER.get(c.target, 9), c.key))
    wanted = {run.run_id for run in latest.values()} | {r.run_id for t in tier_runs.values() for r in t.values()}
    by_run = history.checks(sorted(wanted))
    latest_checks = {c.key: analysis.checks_of_latest_tiers(c.run, tier_runs.get(c.key, {}), by_run)
                     for c in columns if c.run}
    matrix = analysis.build_matrix(columns, latest_checks)
    colors = {c.key: PALETTE[i % len(PALETTE)] for i, c in enumerate(columns)}
    data = SiteData(
        generated_at=(now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
        runs=runs, columns=columns, matrix=matrix, scores=analysis.parity_scores(matrix),
        disagreements=analysis.rocm_cuda_disagreements(matrix), latest_checks=latest_checks, colors=colors,
        tier_runs=tier_runs, not_counted=[r for r in every if r.not_evidence is not None])

    transitions = analysis.what_changed(runs)
    pair_checks = history.checks(r.run_id for t in transitions for r in (t.last_green, t.first_red))
    data.transitions = [TransitionView(t, analysis.flipped_checks(pair_checks[t.last_green.run_id],
                                                                   pair_checks[t.first_red.run_id]))
                        for t in transitions]

    for checks in list(latest_checks.values()) + list(pair_checks.values()):
        for check in checks:
            if check.outcome not in analysis.PASSING and check.message:
                found = diagnose(check.message)
                if found:
                    data.diagnoses[(check.run_id, check.id)] = found

    tiers = history.tier_counts()
    for run in runs:
        rate = analysis.pass_rate(run.summary)
        if rate is not None:
            data.pass_trend.setdefault(run.series, []).append((run.started_at, rate))
        for tier in run.tiers:
            tier_rate = analysis.pass_rate(tiers.get((run.run_id, tier), {}))
            if tier_rate is not None:
                data.tier_trend.setdefault((tier, run.series), []).append((run.started_at, tier_rate))
    data.figure_trends = figure_trends(history.figure_points(), {r.run_id: r for r in runs})
    for lineage, started_at, seconds in history.phase_points("wall", tier="p0"):
        data.p0_wall_trend.setdefault(lineage, []).append((started_at, seconds))
    data.health = history.health(run.run_id for run in latest.values())
    data.universe = verdict.universe_of(matrix)
    controls = history.checks(r.run_id for r in every if r.planted_fault)  # what each planted fault's run saw
    try:
        data.certified = certified_combos() if combos is None else combos
    except MatrixUnreadable as exc:
        data.notices.append(f"No combination of ci/matrix.toml is listed: {exc}")
    data.verdicts = verdict.verdicts(every, latest_checks, data.universe, controls, history.outcomes(),
                                     data.certified)
    return data


def figure_trends(points: list[tuple[str, str, str, str, float, Limit | None]],
                  runs: dict[str, RunInfo]) -> list[FigureTrend]:
    """`History.figure_points` of the runs in `runs` (the evidence) grouped into one trend per check and figure that
    some run recorded a limit for; a figure no run recorded a limit for (an input, a count, or runs written before
    limits were recorded) has no trend."""
    grouped: dict[tuple[str, str], dict[str, list[tuple[str, float]]]] = defaultdict(dict)
    limits: dict[tuple[str, str], list[Limit]] = defaultdict(list)
    for check_id, name, run_id, started_at, value, limit in points:
        run = runs.get(run_id)
        if run is None:
            continue
        grouped[(check_id, name)].setdefault(run.series, []).append((started_at, value))
        if limit is not None and limit not in limits[(check_id, name)]:
            limits[(check_id, name)].append(limit)
    ordered = sorted((key for key in grouped if limits[key]), key=lambda k: _figure_order(k[0], k[1]))
    return [FigureTrend(check_id, name, tuple(limits[(check_id, name)]), grouped[(check_id, name)])
            for check_id, name in ordered]
