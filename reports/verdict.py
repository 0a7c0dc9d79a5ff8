"""The release decision the dashboard carries, per lineage (one ROCm × PyTorch × vLLM combo, or the installed stack
of a platform, with one engine, model, dtype and profile): **production-safe**, **not safe** or **not enough
evidence**, with its reasons and the coverage behind every pass rate.

Only platform evidence decides (`RunInfo.not_evidence` is None): refused, interrupted, narrowed and planted-fault
runs are named among the reasons and change nothing else. Of the evidence, each tier is judged on the newest run
that ran it (`analysis.checks_of_latest_tiers`).

* **not safe**: a check failed or errored (could not run, timed out, crashed: fail closed) in the newest evidence of
  its tier; the P0 gate's failures are named first;
* a measurement the check itself said was not like for like (`shared_gpu`: another job held the GPU; `unlike_pin`:
  a pin of another request mix; `slower_host`:
  a slower host than its pin's) is no verdict on the stack either way: it is named, and the lineage is at best
  **not enough evidence** until that tier is measured like for like;
* **not enough evidence**: nothing failed, but P0 (the gate) or P1 (production) has no judged check in an evidence
  run: it never ran, ran only in runs that do not count, or every one of its checks was skipped;
* **production-safe**: P0 and P1 judged and nothing failed in any tier. A known bug (xfail with its link) does not
  block; it is listed, as are the skips with their reasons and the tiers (P2, P3) that never ran.

The lineage's planted-fault runs (`conformance drill`, or `conformance run --planted-fault`) say whether the suite
sees a broken engine on it: a fault whose newest run failed a check with a verdict is caught; one whose newest run
completed with every check passed went unseen. A lineage on which a planted fault went unseen is never
production-safe: its passes would not have caught that fault either.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from env_checks.results import VERDICT_FAILURE
from reports import analysis
from reports.analysis import ALL
from reports.htmlbits import first_line, short_check
from reports.records import CheckRow, RunInfo

SAFE, NOT_SAFE, NOT_ENOUGH = "production-safe", "not safe", "not enough evidence"
REQUIRED_TIERS = ("p0", "p1")
TIERS = ("p0", "p1", "p2", "p3")  # as results.schema.json enumerates them
FAILING = frozenset({"failed", "error"})
# Failure classes of a measurement that could not be compared like for like: not the stack's verdict, nor a pass.
NOT_LIKE_FOR_LIKE = frozenset({"shared_gpu", "slower_host", "unlike_pin"})
DECISION_ORDER = {"rocm": 0, "cuda": 1, "cpu": 2}  # ROCm combos first, each with its CUDA counterpart beside it


@dataclass(frozen=True)
class Coverage:
    """What a pass rate stands on: checks passed (or xpassed), failed (or errored), known bugs (xfailed), skipped,
    and not run (checks of the tier that other lineages ran and this one did not)."""

    passed: int = 0
    failed: int = 0
    known: int = 0
    skipped: int = 0
    not_run: int = 0

    @property
    def judged(self) -> int:
        return self.passed + self.failed + self.known

    @property
    def rate(self) -> float | None:
        return self.passed / self.judged if self.judged else None

    def text(self) -> str:
        known = f" · {self.known} known bug{'s' * (self.known != 1)}" if self.known else ""
        return (f"{self.passed} passed · {self.failed} failed{known} · {self.skipped} skipped · "
                f"{self.not_run} not run")


def coverage(checks: list[CheckRow], universe: dict[str, set[str]]) -> dict[str, Coverage]:
    """Coverage per tier and for all tiers ("all") of `checks`, against `universe` (tier → every check id seen)."""
    out: dict[str, Coverage] = {}
    tiers = sorted(set(universe) | {c.tier for c in checks})
    for tier in [*tiers, ALL]:
        mine = [c for c in checks if tier in (ALL, c.tier)]
        every = set().union(*universe.values()) if tier == ALL else universe.get(tier, set())
        count = Counter(c.outcome for c in mine)
        out[tier] = Coverage(count["passed"] + count["xpassed"], count["failed"] + count["error"], count["xfailed"],
                             count["skipped"], len(every - {c.id for c in mine}))
    return out


@dataclass
class Verdict:
    """The decision on one lineage and everything it rests on."""

    key: str
    target: str
    combo: str | None
    state: str
    run: RunInfo | None  # the newest evidence run (None: no run of the lineage counts)
    reasons: list[str] = field(default_factory=list)
    failures: list[CheckRow] = field(default_factory=list)
    skipped: list[CheckRow] = field(default_factory=list)
    known: list[CheckRow] = field(default_factory=list)
    unjudged: list[CheckRow] = field(default_factory=list)  # failed as not like for like (NOT_LIKE_FOR_LIKE)
    missing_tiers: list[str] = field(default_factory=list)
    not_counted: list[RunInfo] = field(default_factory=list)
    coverage: dict[str, Coverage] = field(default_factory=dict)
    counterpart: Verdict | None = None
    counterpart_differs: list[str] = field(default_factory=list)
    caught: dict[str, str] = field(default_factory=dict)  # planted fault -> the newest run that caught it
    unseen: dict[str, str] = field(default_factory=dict)  # planted fault -> the newest run in which all passed

    @property
    def any_run(self) -> RunInfo:
        return self.run or self.not_counted[-1]


def _names(checks: list[CheckRow], limit: int = 6) -> str:
    shown = ", ".join(short_check(c.id) for c in checks[:limit])
    return shown + (f" and {len(checks) - limit} more" if len(checks) > limit else "")


def detection(not_counted: list[RunInfo], controls: dict[str, list[CheckRow]]) -> tuple[dict[str, str],
                                                                                      dict[str, str]]:
    """(caught, unseen): each planted fault, by the newest of its runs among `not_counted` (oldest first) that
    judged it, to that run's id; `controls`: run id -> its checks. A run that neither failed a check with a verdict
    nor completed with every check passed (an engine error, an interrupt) judges nothing."""
    caught: dict[str, str] = {}
    unseen: dict[str, str] = {}
    for run in not_counted:
        if not run.planted_fault:
            continue
        checks = controls.get(run.run_id, [])
        if any(c.outcome == "failed" and VERDICT_FAILURE.match(c.message) for c in checks):
            caught[run.planted_fault] = run.run_id
            unseen.pop(run.planted_fault, None)
        elif run.complete and checks and all(c.outcome in ("passed", "skipped") for c in checks) and any(
                c.outcome == "passed" for c in checks):
            unseen[run.planted_fault] = run.run_id
            caught.pop(run.planted_fault, None)
    return caught, unseen


def decide(key: str, checks: list[CheckRow], evidence: list[RunInfo], not_counted: list[RunInfo],
           universe: dict[str, set[str]], controls: dict[str, list[CheckRow]] | None = None) -> Verdict:
    """The verdict of lineage `key` from its newest checks per tier (`checks`), its evidence runs and the runs of it
    that do not count (each oldest first), with the checks of its planted-fault runs (`controls`, by run id)."""
    newest = evidence[-1] if evidence else None
    some = newest or not_counted[-1]
    verdict = Verdict(key, some.target, some.combo, NOT_ENOUGH, newest, not_counted=list(not_counted),
                      coverage=coverage(checks, universe))
    judged = {c.tier for c in checks if c.outcome != "skipped"}
    ran = {c.tier for c in checks}
    failing = sorted((c for c in checks if c.outcome in FAILING), key=lambda c: (c.tier, c.id))
    verdict.failures = [c for c in failing if c.failure_class not in NOT_LIKE_FOR_LIKE]
    verdict.unjudged = [c for c in failing if c.failure_class in NOT_LIKE_FOR_LIKE]
    verdict.skipped = [c for c in checks if c.outcome == "skipped"]
    verdict.known = [c for c in checks if c.outcome == "xfailed"]
    every_tier = sorted(set(universe) | set(TIERS))
    verdict.missing_tiers = [t for t in every_tier if t not in judged]
    reasons = verdict.reasons
    if newest is None:
        reasons.append("no run of this lineage counts as evidence")
    by_tier: dict[str, list[CheckRow]] = defaultdict(list)
    for check in verdict.failures:
        by_tier[check.tier].append(check)
    for tier, failed in sorted(by_tier.items()):
        what = "the gate" if tier == "p0" else "production" if tier == "p1" else "not passing"
        reasons.append(f"{tier.upper()} ({what}): {len(failed)} check{'s' * (len(failed) != 1)} failed or errored: "
                       f"{_names(failed)}")
    if verdict.unjudged:
        classes = ", ".join(sorted({str(c.failure_class) for c in verdict.unjudged}))
        reasons.append(f"{len(verdict.unjudged)} measurement{'s' * (len(verdict.unjudged) != 1)} not like for like "
                       f"({classes}: not a verdict on the stack; measure again like for like): "
                       f"{_names(verdict.unjudged)}")
    for tier in verdict.missing_tiers:
        how = "ran but every check was skipped" if tier in ran else "never ran in a counted run"
        reasons.append(f"{tier.upper()} {how}" + (" (needed for a decision)" if tier in REQUIRED_TIERS else ""))
    if verdict.known:
        reasons.append(f"{len(verdict.known)} known bug{'s' * (len(verdict.known) != 1)} (xfail, not blocking): "
                       f"{_names(verdict.known)}")
    if verdict.skipped:
        why = Counter(first_line(c.message, 120) or "no reason recorded" for c in verdict.skipped)
        listed = "; ".join(f"{n} × {text}" for text, n in why.most_common(4))
        more = f"; {len(why) - 4} other reasons" if len(why) > 4 else ""
        reasons.append(f"{len(verdict.skipped)} skipped: {listed}{more}")
    verdict.caught, verdict.unseen = detection(not_counted, controls or {})
    if verdict.unseen:
        reasons.append(f"planted fault{'s' * (len(verdict.unseen) != 1)} the suite did not see on this lineage: "
                       + ", ".join(f"{f} (run {r}: every check passed)" for f, r in sorted(verdict.unseen.items())))
    if verdict.caught:
        reasons.append(f"{len(verdict.caught)} planted fault{'s' * (len(verdict.caught) != 1)} caught: "
                       + ", ".join(sorted(verdict.caught)))
    if not_counted:
        runs = ", ".join(f"{r.run_id} ({r.not_evidence})" for r in not_counted[-3:])
        more = f" and {len(not_counted) - 3} more" if len(not_counted) > 3 else ""
        reasons.append(f"{len(not_counted)} run{'s' * (len(not_counted) != 1)} not counted: {runs}{more}")
    if verdict.failures:
        verdict.state = NOT_SAFE
    elif newest is not None and not any(t in verdict.missing_tiers for t in REQUIRED_TIERS) and not verdict.unseen \
            and not verdict.unjudged:
        verdict.state = SAFE
    return verdict


def _closest(verdict: Verdict, references: list[Verdict]) -> tuple[Verdict | None, list[str]]:
    """The reference verdict of the same engine, model and dtype (one with evidence first), or the nearest one and
    what differs."""
    ranked = sorted(references, key=lambda v: (len(analysis.differences(verdict.any_run, v.any_run)),
                                               v.run is None, v.key))
    if not ranked:
        return None, []
    return ranked[0], analysis.differences(verdict.any_run, ranked[0].any_run)


def verdicts(every: list[RunInfo], latest_checks: dict[str, list[CheckRow]],
             universe: dict[str, set[str]], controls: dict[str, list[CheckRow]] | None = None) -> list[Verdict]:
    """One verdict per lineage that has any run (`every`: all runs, oldest first; `latest_checks`: each lineage's
    newest evidence checks per tier), ROCm first, each non-CUDA one with its CUDA counterpart."""
    evidence: dict[str, list[RunInfo]] = defaultdict(list)
    partial: dict[str, list[RunInfo]] = defaultdict(list)
    for run in every:
        (evidence if run.not_evidence is None else partial)[run.series].append(run)
    keys = set(evidence) | set(partial)
    out = [decide(k, latest_checks.get(k, []), evidence.get(k, []), partial.get(k, []), universe, controls)
           for k in keys]
    out.sort(key=lambda v: (DECISION_ORDER.get(v.target, 9), v.combo is None, v.combo or "", v.key))
    cuda = [v for v in out if v.target == "cuda"]
    for verdict in out:
        if verdict.target != "cuda":
            verdict.counterpart, verdict.counterpart_differs = _closest(verdict, cuda)
    return out


def universe_of(matrix: analysis.Matrix) -> dict[str, set[str]]:
    """tier → every check id any lineage's latest evidence ran in it."""
    out: dict[str, set[str]] = defaultdict(set)
    for tier, _area, check_id in matrix.rows:
        out[tier].add(check_id)
    return dict(out)
