"""The upgrade diff: what changed between a run on today's stack (BEFORE) and a run on the candidate (AFTER), per
check, judged against the limits the runs recorded. `conformance compare` prints it (reports/upgrade_diff_report.py).

Each side is one run directory (its results.json), or a lineage of the history store (`RunInfo.series`): that
lineage's newest evidence run of each tier it ran, the checks of each tier taken from its own newest run.

Per check:

* **outcome changes**: passing (passed, xpassed) to not passing (failed, error, xfailed) is a regression; a check
  that ran in BEFORE and is skipped or absent in AFTER is a regression "not run"; a check new in AFTER that fails or
  errors is a regression; not passing to passing is a fix; the rest (failed to error, skipped to passed …) is listed;
* **figure shifts**: a figure with a recorded limit (results.json `checks[].limits`, AFTER's where it has one, else
  BEFORE's) is a regression when AFTER breaks the limit BEFORE held, or when its headroom (distance to the limit, on
  the side the limit allows) shrank by more than `LIMIT_NOISE_BAND` of the limit's value; a move inside that band is
  not, and neither is any move towards a limit recorded as a threshold only (`headroom: false`: a p-value floor, a
  count's or a time's bound), which regresses only when broken. A figure without a recorded limit (runs written
  before records carried limits) is listed when it moved by more than `INFORMATIONAL_SHIFT` of its BEFORE value, and
  is never a regression by itself;
* **stack**: every run option and fingerprint field that differs (`reports.records.diff_runs`), and the suite that
  judged each run (`suite`: version, commit, data_hash).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from reports.analysis import NOT_RUN, PASSING, checks_of_latest_tiers, latest_per_lineage_tier
from reports.history import History
from reports.limits import Limit
from reports.records import RunInfo, diff_runs, model_label
from reports.results import RESULTS_FILE, ResultsError, load_run
from reports.stack import FingerprintChange, diff_fingerprints

# A figure's move towards its limit is a regression only when its headroom shrank by more than this share of the
# limit's value: with a limit of 0.5, a move of 0.05 or less towards it is run-to-run noise.
LIMIT_NOISE_BAND = 0.10
# A figure without a recorded limit is listed when it moved by more than this share of its BEFORE value.
INFORMATIONAL_SHIFT = 0.10
FAILING = frozenset({"failed", "error"})
NOT_JUDGED = NOT_RUN | {"error"}  # no figure of such a check is compared: it measured nothing, or not all
# What makes two runs like for like: a difference here says the diff compares two different things.
LIKE_FOR_LIKE = ("target", "engine", "dtype", "model", "profile", "tiers")
_INPUT_FIGURE = re.compile(r"(^|_)seed$")  # inputs of a check (its random seed), not measurements

# Outcome change kinds, and figure shift kinds.
REGRESSION, NOT_RUN_AFTER, FIX, NEW, CHANGED = "regression", "not run", "fix", "new", "changed"
BREAKS, TOWARDS, STILL_BEYOND, WITHIN_BAND, AWAY = ("breaks its limit", "towards its limit", "still beyond its limit",
                                                    "within the noise band", "away from its limit")
NOT_MEASURED, NEWLY_MEASURED, NO_LIMIT = "not measured", "newly measured", "no recorded limit"


class CompareInputError(ValueError):
    """BEFORE or AFTER cannot be read (a missing directory, no results.json, a damaged record, an unknown lineage);
    the message is one sentence."""


@dataclass(frozen=True)
class CheckResult:
    """One check of one side: its outcome, figures (None: not measured) and the limits it recorded."""

    id: str
    tier: str
    outcome: str
    message: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)
    limits: dict[str, Limit] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSide:
    """BEFORE or AFTER: what the user named (`label`), the run it stands for (the newest one where a lineage names
    several; its `tiers` are the side's), the run of each tier, its checks by id and the suite that judged it."""

    label: str
    run: RunInfo
    runs_by_tier: dict[str, str]
    checks: dict[str, CheckResult]
    suite: dict | None = None


@dataclass(frozen=True)
class OutcomeChange:
    check_id: str
    tier: str
    before: str | None  # None: absent from that side
    after: str | None
    kind: str
    message: str = ""  # AFTER's message, where it has one

    @property
    def regression(self) -> bool:
        return self.kind in (REGRESSION, NOT_RUN_AFTER)


@dataclass(frozen=True)
class FigureShift:
    check_id: str
    figure: str
    before: float | None
    after: float | None
    limit: Limit | None
    kind: str
    regression: bool
    limit_before: Limit | None = None  # BEFORE's limit, where it differs from the one judged by

    @property
    def shrink(self) -> float | None:
        """How much of the limit's value the headroom lost (0.25: a quarter of the limit); None without one."""
        if self.limit is None or self.before is None or self.after is None or self.limit.value == 0:
            return None
        return (headroom(self.before, self.limit) - headroom(self.after, self.limit)) / abs(self.limit.value)


@dataclass(frozen=True)
class UpgradeDiff:
    before: RunSide
    after: RunSide
    outcome_changes: list[OutcomeChange]
    figure_shifts: list[FigureShift]
    stack_changes: list[FingerprintChange]
    unlike: list[str]  # "dtype: bfloat16 → float16": why the runs are not like for like
    notes: list[str]  # runs that are not evidence, suites whose data differ

    @property
    def regressions(self) -> list[OutcomeChange | FigureShift]:
        """Checks that now fail, then figures that regressed, then checks that no longer ran."""
        return ([c for c in self.outcome_changes if c.kind == REGRESSION]
                + [s for s in self.figure_shifts if s.regression]
                + [c for c in self.outcome_changes if c.kind == NOT_RUN_AFTER])

    @property
    def fixes(self) -> list[OutcomeChange]:
        return [c for c in self.outcome_changes if c.kind == FIX]


def headroom(value: float, limit: Limit) -> float:
    """The figure's distance to its limit on the side the limit allows (negative: beyond it)."""
    return limit.value - value if limit.kind == "max" else value - limit.value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _check_result(row_id: str, tier: str, outcome: str, message: str, figures: dict,
                  limits: dict[str, Limit] | None) -> CheckResult:
    return CheckResult(row_id, tier, outcome, message, {k: _number(v) for k, v in figures.items()}, limits or {})


def side_of_run_dir(path: Path | str) -> RunSide:
    """BEFORE or AFTER from a run directory (or its results.json); CompareInputError when it cannot be read."""
    path = Path(path)
    if path.name == RESULTS_FILE and path.is_file():
        path = path.parent
    if not path.is_dir():
        raise CompareInputError(f"{path} is not a run directory (no such directory).")
    if not (path / RESULTS_FILE).is_file():
        raise CompareInputError(f"{path} holds no {RESULTS_FILE}, so it is no finished run directory.")
    try:
        record = load_run(path)
    except ResultsError as exc:
        raise CompareInputError(str(exc)) from None
    # The history store's own reading of a record (lineage, options, whether it is evidence), in memory.
    with History.open(":memory:") as history:
        history.ingest_record(record, source=path.name)
        run = history.runs()[0]
        rows = history.checks([run.run_id])[run.run_id]
    checks = {r.id: _check_result(r.id, r.tier, r.outcome, r.message, r.figures, r.limits) for r in rows}
    return RunSide(str(path), run, dict.fromkeys(run.tiers, run.run_id), checks, run.suite)


def side_of_lineage(history: History, key: str) -> RunSide:
    """BEFORE or AFTER from a lineage of the history store: its newest evidence run of each tier, with the limits
    and the suite the store keeps from each run's record."""
    runs = history.runs()
    lineages = sorted({r.series for r in runs})
    if key not in lineages:
        near = difflib.get_close_matches(key, lineages, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"it holds {len(lineages)} lineages (the dashboard's names)."
        raise CompareInputError(f"{history.path} has no lineage {key!r}; {hint}")
    evidence = [r for r in runs if r.series == key and r.not_evidence is None]
    if not evidence:
        raise CompareInputError(f"lineage {key!r} of {history.path} has no run that is platform evidence "
                                "(each is interrupted, narrowed, refused or a planted fault).")
    by_tier = latest_per_lineage_tier(evidence)[key]
    newest = evidence[-1]
    selected = {r.run_id: r for r in (newest, *by_tier.values())}
    rows = checks_of_latest_tiers(newest, by_tier, history.checks(selected))
    checks = {row.id: _check_result(row.id, row.tier, row.outcome, row.message, row.figures, row.limits)
              for row in rows}
    run = replace(newest, tiers=tuple(sorted(by_tier)))
    return RunSide(key, run, {tier: r.run_id for tier, r in sorted(by_tier.items())}, checks, newest.suite)


def outcome_change(check_id: str, before: CheckResult | None, after: CheckResult | None) -> OutcomeChange | None:
    """How one check's outcome moved from BEFORE to AFTER (module docstring); None when it did not."""
    b, a = (before.outcome if before else None), (after.outcome if after else None)
    if b == a:
        return None
    ran_before = b is not None and b not in NOT_RUN
    if b is None:
        kind = REGRESSION if a in FAILING else NEW
    elif a is None or a in NOT_RUN:
        kind = NOT_RUN_AFTER if ran_before else CHANGED
    elif a in PASSING:
        kind = FIX if ran_before and b not in PASSING else CHANGED
    else:  # AFTER ran and did not pass
        kind = REGRESSION if b in PASSING or (b in NOT_RUN and a in FAILING) else CHANGED
    tier = (after or before).tier  # type: ignore[union-attr]
    return OutcomeChange(check_id, tier, b, a, kind, after.message if after else "")


def figure_shift(check_id: str, name: str, before: CheckResult, after: CheckResult) -> FigureShift | None:
    """How one figure of a check that ran on both sides moved (module docstring); None when it is not worth a line."""
    b, a = before.figures.get(name), after.figures.get(name)
    limit = after.limits.get(name) or before.limits.get(name)
    if b == a or (limit is None and _INPUT_FIGURE.search(name)):
        return None
    if limit is None:
        if b is not None and a is not None and abs(a - b) <= INFORMATIONAL_SHIFT * abs(b):
            return None
        return FigureShift(check_id, name, b, a, None, NO_LIMIT, False)
    limit_before = before.limits.get(name)
    changed = limit_before if limit_before is not None and limit_before != limit else None
    if a is None:
        kind, regression = NOT_MEASURED, True
    elif b is None:
        kind, regression = (NEWLY_MEASURED, False) if limit.holds(a) else (BREAKS, True)
    else:
        shrink = headroom(b, limit) - headroom(a, limit)
        if not limit.holds(a) and limit.holds(b):
            kind, regression = BREAKS, True
        elif limit.headroom and shrink > LIMIT_NOISE_BAND * abs(limit.value):
            kind, regression = TOWARDS, True
        elif not limit.holds(a):
            kind, regression = STILL_BEYOND, False
        else:
            kind, regression = (WITHIN_BAND if shrink > 0 else AWAY), False
    return FigureShift(check_id, name, b, a, limit, kind, regression, changed)


def _unlike(before: RunInfo, after: RunInfo) -> list[str]:
    out = []
    for name in LIKE_FOR_LIKE:
        b, a = getattr(before, name), getattr(after, name)
        if name == "model":
            b, a = model_label(b), model_label(a)
            if b == a and before.model_hash and after.model_hash and before.model_hash != after.model_hash:
                b, a = f"{b} ({before.model_hash[:12]})", f"{a} ({after.model_hash[:12]})"
        if name == "tiers":
            b, a = "+".join(b), "+".join(a)
        if b != a:
            out.append(f"{name}: {b or '?'} → {a or '?'}")
    return out


def _notes(before: RunSide, after: RunSide) -> list[str]:
    notes = [f"{name} is not platform evidence: {side.run.not_evidence} (compared all the same)."
             for name, side in (("BEFORE", before), ("AFTER", after)) if side.run.not_evidence]
    hashes = [(side.suite or {}).get("data_hash") for side in (before, after)]
    if all(hashes) and hashes[0] != hashes[1]:
        notes.append(f"the suite's data differ (data_hash {hashes[0]} → {hashes[1]}): the two runs were judged by "
                     "different limits; figures are measured against AFTER's recorded limits.")
    missing = [name for name, side in (("BEFORE", before), ("AFTER", after)) if not side.suite]
    if missing:
        notes.append(f"{' and '.join(missing)} record{'s' if len(missing) == 1 else ''} no suite version (written "
                     "before results.json carried one): whether the limits differ cannot be told.")
    return notes


def compare(before: RunSide, after: RunSide) -> UpgradeDiff:
    """The upgrade diff of two sides (module docstring)."""
    ids = list(dict.fromkeys([*before.checks, *after.checks]))
    order = {cid: ((after.checks.get(cid) or before.checks[cid]).tier, cid) for cid in ids}
    ids.sort(key=order.__getitem__)
    changes = [c for cid in ids if (c := outcome_change(cid, before.checks.get(cid), after.checks.get(cid)))]
    shifts = []
    for cid in ids:
        b, a = before.checks.get(cid), after.checks.get(cid)
        if b is None or a is None or {b.outcome, a.outcome} & NOT_JUDGED:
            continue  # an outcome change says it; figures of a check that did not run say nothing
        for name in sorted({*b.figures, *a.figures}):
            if shift := figure_shift(cid, name, b, a):
                shifts.append(shift)
    stack = diff_runs(before.run, after.run)
    if before.suite or after.suite:
        stack += diff_fingerprints({"suite": before.suite or {}}, {"suite": after.suite or {}})
    return UpgradeDiff(before, after, changes, shifts, stack, _unlike(before.run, after.run), _notes(before, after))
