"""The release decision the dashboard carries, per lineage (one ROCm × PyTorch × vLLM combo, or the installed stack
of a platform, with one engine, model, dtype and profile), and per combination of ci/matrix.toml that never ran.
Four levels, worst first, each with its reasons and the coverage behind every pass rate:

* **not safe**: a check failed or errored (could not run, timed out, crashed: fail closed) in the newest evidence of
  its tier, the P0 gate's named first; or a check is **flaky** on the lineage (it passed, failed and passed again
  across the counted runs, reports/flaky.py): the newest run alone must not decide, so a flaky check blocks;
* **no evidence**: nothing failed, but what a decision needs is missing: no run of the lineage counts (or the
  combination never ran); P0 (the gate) or P1 (production) is not complete: a check of it that other lineages' counted
  runs ran was not run here (each named), or the tier never ran, or every check of it was skipped; a measurement its
  check said was not like for like (`shared_gpu`, `unlike_pin`, `slower_host`), which is no verdict either way; a
  planted fault went unseen on the lineage (its passes would not have caught that fault either); or, for the real
  model, P3 accuracy was not judged (no accuracy check passed in the newest counted P3 run);
* **stack conformant (test model)**: P0 and P1 complete and nothing failed or flipped, on a test model (the suite's
  tiny gpt-oss, random weights at the real dimensions: `records.why_test_model`). The stack computes what the
  reference does, but a test model says nothing of the real model's answers: such a lineage is never production-safe;
* **production-safe**: all of that on the real model, and P3 accuracy judged: the accuracy checks of the newest
  counted P3 run (checks/test_accuracy.py) passed, none failed, at least one passed. A known bug (xfail with its link)
  does not block; it is listed, as are the skips with their reasons and the tiers (P2) that never ran.

Only platform evidence decides (`RunInfo.not_evidence` is None): refused, interrupted, narrowed, contradicted and
planted-fault runs are named among the reasons and change nothing else. Of the evidence, each tier is judged on the
newest run that ran it (`analysis.checks_of_latest_tiers`); flips are read across every counted run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from env_checks.record.results import VERDICT_FAILURE
from reports import analysis
from reports.analysis import ALL
from reports.claims import CertifiedCombo, combo_by_id, cuda_pair
from reports.flaky import NOT_LIKE_FOR_LIKE, Flaky, flaky_checks
from reports.htmlbits import first_line, short_check
from reports.records import CheckRow, RunInfo, why_test_model

NOT_SAFE, NO_EVIDENCE, TEST_MODEL, SAFE = ("not safe", "no evidence", "stack conformant (test model)",
                                           "production-safe")
LEVELS = (NOT_SAFE, NO_EVIDENCE, TEST_MODEL, SAFE)  # worst first
REQUIRED_TIERS = ("p0", "p1")
TIERS = ("p0", "p1", "p2", "p3")  # as results.schema.json enumerates them
FAILING = frozenset({"failed", "error"})
PASSING = frozenset({"passed", "xpassed"})
ACCURACY_AREA = "accuracy"  # the area of checks/test_accuracy.py: P3's lm-eval scores against published figures
DECISION_ORDER = {"rocm": 0, "cuda": 1, "cpu": 2}  # ROCm combos first, each with its CUDA counterpart beside it
NEVER_RAN = "never run: no run was recorded under this combination"


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
    certified: CertifiedCombo | None = None  # its combination of ci/matrix.toml, where it is one
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
    flaky: list[Flaky] = field(default_factory=list)
    not_run: dict[str, list[str]] = field(default_factory=dict)  # P0, P1 -> the check ids other lineages ran
    test_model: str | None = None  # why the lineage's model is a test model
    accuracy: list[CheckRow] = field(default_factory=list)  # the P3 accuracy checks of the newest counted P3 run

    @property
    def any_run(self) -> RunInfo | None:
        """The newest evidence run, else the newest run that does not count; None for a combination never run."""
        return self.run or (self.not_counted[-1] if self.not_counted else None)


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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _short_ids(ids: list[str], limit: int = 6) -> str:
    shown = ", ".join(short_check(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _accuracy_problem(verdict: Verdict) -> str | None:
    """Why P3 accuracy is not judged on the lineage (None: judged: at least one accuracy check passed in the newest
    counted P3 run and none failed)."""
    checks = verdict.accuracy
    if not checks:
        return "P3 accuracy not judged: no accuracy check in a counted P3 run (needed for production-safe)"
    if not any(c.outcome in PASSING for c in checks):
        why = first_line(checks[0].message, 120) or "no reason recorded"
        return (f"P3 accuracy not judged: none of its {_plural(len(checks), 'check')} passed "
                f"({', '.join(sorted({c.outcome for c in checks}))}; {why})")
    return None


def _level(verdict: Verdict, newest: RunInfo | None) -> str:
    if newest is None:
        return NO_EVIDENCE
    if verdict.failures or verdict.flaky:
        return NOT_SAFE
    if verdict.unjudged or verdict.unseen or any(t in verdict.missing_tiers or verdict.not_run.get(t)
                                                 for t in REQUIRED_TIERS):
        return NO_EVIDENCE
    if verdict.test_model:
        return TEST_MODEL
    return SAFE if _accuracy_problem(verdict) is None else NO_EVIDENCE


def decide(key: str, checks: list[CheckRow], evidence: list[RunInfo], not_counted: list[RunInfo],
           universe: dict[str, set[str]], controls: dict[str, list[CheckRow]] | None = None,
           outcomes: dict[str, list[tuple[str, str, str, str | None]]] | None = None) -> Verdict:
    """The verdict of lineage `key` from its newest checks per tier (`checks`), its evidence runs and the runs of it
    that do not count (each oldest first), with the checks of its planted-fault runs (`controls`, by run id) and
    every run's outcomes (`outcomes`, `History.outcomes`: the flips across its evidence runs)."""
    newest = evidence[-1] if evidence else None
    some = newest or not_counted[-1]
    verdict = Verdict(key, some.target, some.combo, NO_EVIDENCE, newest, not_counted=list(not_counted),
                      coverage=coverage(checks, universe))
    verdict.test_model = some.test_model or why_test_model({"name": some.model})
    judged = {c.tier for c in checks if c.outcome != "skipped"}
    ran = {c.tier for c in checks}
    failing = sorted((c for c in checks if c.outcome in FAILING), key=lambda c: (c.tier, c.id))
    verdict.failures = [c for c in failing if c.failure_class not in NOT_LIKE_FOR_LIKE]
    verdict.unjudged = [c for c in failing if c.failure_class in NOT_LIKE_FOR_LIKE]
    verdict.skipped = [c for c in checks if c.outcome == "skipped"]
    verdict.known = [c for c in checks if c.outcome == "xfailed"]
    verdict.accuracy = [c for c in checks if c.tier == "p3" and (c.area == ACCURACY_AREA or "test_accuracy" in c.id)]
    verdict.missing_tiers = [t for t in sorted(set(universe) | set(TIERS)) if t not in judged]
    verdict.flaky = flaky_checks([r.run_id for r in evidence], outcomes or {})
    mine = {c.id for c in checks}
    verdict.not_run = {t: sorted(universe.get(t, set()) - mine) for t in REQUIRED_TIERS if t in ran}
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
    if verdict.flaky:
        reasons.append(f"flaky: {_plural(len(verdict.flaky), 'check')} flipped between passed and failed across "
                       "the counted runs (the newest run alone does not decide): "
                       + "; ".join(f"{short_check(f.check_id)} ({f.describe()})" for f in verdict.flaky[:4])
                       + (f"; and {len(verdict.flaky) - 4} more" if len(verdict.flaky) > 4 else ""))
    if verdict.unjudged:
        classes = ", ".join(sorted({str(c.failure_class) for c in verdict.unjudged}))
        reasons.append(f"{len(verdict.unjudged)} measurement{'s' * (len(verdict.unjudged) != 1)} not like for like "
                       f"({classes}: not a verdict on the stack; measure again like for like): "
                       f"{_names(verdict.unjudged)}")
    for tier, missing in verdict.not_run.items():
        if missing:
            reasons.append(f"{tier.upper()} incomplete: {len(missing)} of {len(universe.get(tier, ()))} checks not run "
                           f"in its newest counted run (needed for a decision): {_short_ids(missing)}")
    for tier in verdict.missing_tiers:
        how = "ran but every check was skipped" if tier in ran else "never ran in a counted run"
        reasons.append(f"{tier.upper()} {how}" + (" (needed for a decision)" if tier in REQUIRED_TIERS else ""))
    if verdict.test_model:
        reasons.append(f"test model ({verdict.test_model}): at best stack conformant; production-safe needs the "
                       "real model and P3 accuracy")
    elif newest is not None and _accuracy_problem(verdict):
        reasons.append(str(_accuracy_problem(verdict)))
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
    verdict.state = _level(verdict, newest)
    return verdict


def never_run(combo: CertifiedCombo) -> Verdict:
    """The row of a combination of ci/matrix.toml no run was recorded under."""
    return Verdict(combo.id, combo.target, combo.id, NO_EVIDENCE, None, certified=combo, reasons=[NEVER_RAN])


def _closest(verdict: Verdict, references: list[Verdict]) -> tuple[Verdict | None, list[str]]:
    """The reference verdict of the same engine, model and dtype (one with evidence first), or the nearest one and
    what differs."""
    ranked = sorted(references, key=lambda v: (len(analysis.differences(verdict.any_run, v.any_run)),
                                               v.run is None, v.key))
    if not ranked:
        return None, []
    return ranked[0], analysis.differences(verdict.any_run, ranked[0].any_run)


def _counterpart(verdict: Verdict, cuda: list[Verdict], combos: tuple[CertifiedCombo, ...]) -> tuple[Verdict | None,
                                                                                                   list[str]]:
    """A certified combination's CUDA counterpart is its paired CUDA combination of the matrix (its lineages, or its
    never-run row); any other lineage's is the nearest CUDA lineage with runs."""
    pair = cuda_pair(verdict.certified, combos) if verdict.certified else None
    if pair is not None:
        paired = [v for v in cuda if v.certified == pair]
        if verdict.any_run is None or all(v.any_run is None for v in paired):
            return (paired[0] if paired else None), []
        return _closest(verdict, [v for v in paired if v.any_run is not None])
    return _closest(verdict, [v for v in cuda if v.any_run is not None])


def verdicts(every: list[RunInfo], latest_checks: dict[str, list[CheckRow]], universe: dict[str, set[str]],
             controls: dict[str, list[CheckRow]] | None = None,
             outcomes: dict[str, list[tuple[str, str, str, str | None]]] | None = None,
             combos: tuple[CertifiedCombo, ...] = ()) -> list[Verdict]:
    """One verdict per lineage that has any run (`every`: all runs, oldest first; `latest_checks`: each lineage's
    newest evidence checks per tier) and one per combination of `combos` (ci/matrix.toml) no run was recorded under:
    the certified combinations first, in the matrix's order, then the other lineages, ROCm first; each non-CUDA one
    with its CUDA counterpart."""
    evidence: dict[str, list[RunInfo]] = defaultdict(list)
    partial: dict[str, list[RunInfo]] = defaultdict(list)
    for run in every:
        (evidence if run.not_evidence is None else partial)[run.series].append(run)
    out = [decide(k, latest_checks.get(k, []), evidence.get(k, []), partial.get(k, []), universe, controls, outcomes)
           for k in set(evidence) | set(partial)]
    certified = combo_by_id(combos)
    for verdict in out:
        verdict.certified = certified.get(verdict.combo or "")
    ran = {v.combo for v in out}
    out += [never_run(c) for c in combos if c.id not in ran]
    order = {c.id: i for i, c in enumerate(combos)}
    out.sort(key=lambda v: (v.certified is None, order.get(v.combo or "", 0), DECISION_ORDER.get(v.target, 9),
                            v.combo is None, v.combo or "", v.run is None and v.not_counted == [], v.key))
    cuda = [v for v in out if v.target == "cuda"]
    for verdict in out:
        if verdict.target != "cuda":
            verdict.counterpart, verdict.counterpart_differs = _counterpart(verdict, cuda, combos)
    return out


def universe_of(matrix: analysis.Matrix) -> dict[str, set[str]]:
    """tier → every check id any lineage's latest evidence ran in it."""
    out: dict[str, set[str]] = defaultdict(set)
    for tier, _area, check_id in matrix.rows:
        out[tier].add(check_id)
    return dict(out)
