"""What the dashboard says, computed from stored runs: the parity matrix and scores, ROCm-vs-CUDA
disagreements, pass rates, failure classes and the green-to-red transitions of each lineage.

Definitions (shown on the page too):

* a check **passes** when its outcome is `passed` or `xpassed`; it **ran** unless it was `skipped`
  (skipped = not applicable on that platform, e.g. a capability the hardware lacks);
* **pass rate** = passing / ran;
* **parity score** of a set of checks = share of the checks that ran on at least one platform which pass on
  every platform that ran them (wpt.fyi's interop score, with "platform" = the latest run of a lineage);
* a **ROCm-vs-CUDA disagreement** is a check that passes on every CUDA platform that ran it and ran but did
  not pass on at least one ROCm platform; passing on CUDA and not run on ROCm is counted apart.

Everything here is a pure function of `RunInfo` / `CheckRow` values, so it is tested on hand-made data.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from reports.records import CheckRow, RunInfo, diff_runs
from reports.stack import FingerprintChange

PASSING = frozenset({"passed", "xpassed"})
NOT_RUN = frozenset({"skipped"})
ALL = "all"
_TIMEOUT = re.compile(r"\btime(d)?[ -]?out\b|Timeout|deadline exceeded", re.IGNORECASE)
_CRASH = re.compile(r"SIGSEGV|SIGABRT|SIGILL|SIGBUS|core dumped|Segmentation fault|died unexpectedly|"
                    r"exit(ed)? (with )?(code|status) -?\d+|EngineDeadError|Memory access fault",
                    re.IGNORECASE)


@dataclass(frozen=True)
class Column:
    """One column of the parity matrix: the latest run of a lineage."""

    key: str
    label: str
    target: str
    run: RunInfo | None = None


@dataclass
class Matrix:
    """check × column; `cells[(check_id, column key)]` is absent when that column has no such check."""

    columns: list[Column]
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (tier, area, check id), sorted
    cells: dict[tuple[str, str], CheckRow] = field(default_factory=dict)

    def outcomes(self, check_id: str) -> dict[str, str]:
        return {c.key: self.cells[(check_id, c.key)].outcome for c in self.columns
                if (check_id, c.key) in self.cells}


def latest_per_lineage(runs: list[RunInfo]) -> dict[str, RunInfo]:
    """The newest run of each lineage (`RunInfo.series`; `runs` oldest first, as History.runs returns them)."""
    latest: dict[str, RunInfo] = {}
    for run in runs:
        latest[run.series] = run
    return latest


def latest_per_lineage_tier(runs: list[RunInfo]) -> dict[str, dict[str, RunInfo]]:
    """Per lineage, the newest run of each tier it ran (`runs` oldest first): a P1 run does not hide the
    lineage's latest P0 results."""
    latest: dict[str, dict[str, RunInfo]] = defaultdict(dict)
    for run in runs:
        for tier in run.tiers:
            latest[run.series][tier] = run
    return dict(latest)


def checks_of_latest_tiers(newest: RunInfo, by_tier: dict[str, RunInfo],
                           checks: dict[str, list[CheckRow]]) -> list[CheckRow]:
    """A lineage's checks, each tier's from the newest run of that tier (`checks` keyed by run id); a check
    whose tier none of the runs declared comes from the lineage's newest run."""
    out = [c for tier, run in sorted(by_tier.items()) for c in checks.get(run.run_id, []) if c.tier == tier]
    out += [c for c in checks.get(newest.run_id, []) if c.tier not in by_tier]
    return out


def build_matrix(columns: list[Column], results: dict[str, list[CheckRow]]) -> Matrix:
    """Lay out `results` (keyed by column key) as a matrix; rows sorted by tier, area, check id."""
    matrix = Matrix(columns=list(columns))
    rows: dict[str, tuple[str, str, str]] = {}
    for column in columns:
        for check in results.get(column.key, []):
            matrix.cells[(check.id, column.key)] = check
            rows.setdefault(check.id, (check.tier, check.area, check.id))
    matrix.rows = sorted(rows.values())
    return matrix


def passes_everywhere(outcomes: dict[str, str]) -> bool | None:
    """True/False for a check's outcomes across columns; None when no column ran it."""
    ran = [o for o in outcomes.values() if o not in NOT_RUN]
    return all(o in PASSING for o in ran) if ran else None


@dataclass(frozen=True)
class ParityScore:
    """Parity of one slice of checks: `passing` of `ran` pass on every platform that ran them."""

    tier: str
    area: str
    passing: int
    ran: int

    @property
    def score(self) -> float | None:
        return self.passing / self.ran if self.ran else None


def parity_scores(matrix: Matrix) -> list[ParityScore]:
    """Scores per (tier, area), per tier (area "all") and overall (tier and area "all"), sorted."""
    tallies: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for tier, area, check_id in matrix.rows:
        verdict = passes_everywhere(matrix.outcomes(check_id))
        if verdict is None:
            continue
        for key in ((tier, area), (tier, ALL), (ALL, ALL)):
            tallies[key][0] += int(verdict)
            tallies[key][1] += 1
    return [ParityScore(tier, area, passing, ran) for (tier, area), (passing, ran) in sorted(tallies.items())]


@dataclass(frozen=True)
class Disagreement:
    """A check that passes on CUDA and not on ROCm (`kind` "failed" or "not_run" on ROCm)."""

    check_id: str
    tier: str
    area: str
    kind: str
    cuda: dict[str, str]
    rocm: dict[str, str]


# What makes a CUDA column the like-for-like reference of a ROCm one (the profile names a SKU, so it differs).
LIKE_FOR_LIKE = ("engine", "model", "dtype")


def differences(run: RunInfo | None, other: RunInfo | None) -> list[str]:
    """The like-for-like fields in which `other` differs from `run`: ``["dtype float32, not bfloat16"]``."""
    if run is None or other is None:
        return []
    return [f"{name} {getattr(other, name) or '?'}, not {getattr(run, name) or '?'}" for name in LIKE_FOR_LIKE
            if getattr(other, name) != getattr(run, name)]


def counterparts(matrix: Matrix, key: str, reference_target: str = "cuda") -> tuple[list[str], bool]:
    """The `reference_target` columns a column is compared with, and whether they are like for like: those of the
    same engine, model and dtype; where there is none, every `reference_target` column (False)."""
    runs = {c.key: c.run for c in matrix.columns}
    refs = [c.key for c in matrix.columns if c.target == reference_target and c.key != key]
    same = [k for k in refs if runs[k] is not None and runs[key] is not None and not differences(runs[key], runs[k])]
    return (same, True) if same else (refs, runs[key] is None)


def rocm_cuda_disagreements(matrix: Matrix) -> list[Disagreement]:
    """Checks passing on every CUDA column that ran them but not on ROCm, in matrix row order. Each ROCm column is
    held against its like-for-like CUDA columns (`counterparts`), or against every CUDA column where none is."""
    rocm_columns = [c.key for c in matrix.columns if c.target == "rocm"]
    refs = {k: counterparts(matrix, k)[0] for k in rocm_columns}
    out = []
    for tier, area, check_id in matrix.rows:
        outcomes = matrix.outcomes(check_id)
        cuda: dict[str, str] = {}
        rocm: dict[str, str] = {}
        for key in rocm_columns:
            ref = {k: outcomes[k] for k in refs[key] if k in outcomes}
            if passes_everywhere(ref) is not True:
                continue
            cuda.update(ref)
            if key in outcomes:
                rocm[key] = outcomes[key]
        if not cuda:
            continue
        if any(o not in PASSING and o not in NOT_RUN for o in rocm.values()):
            out.append(Disagreement(check_id, tier, area, "failed", cuda, rocm))
        elif not any(o in PASSING for o in rocm.values()):
            out.append(Disagreement(check_id, tier, area, "not_run", cuda, rocm))
    return out


def pass_rate(counts: dict[str, int]) -> float | None:
    """passing / ran for a dict of outcome counts; None when nothing ran."""
    ran = sum(n for outcome, n in counts.items() if outcome not in NOT_RUN)
    return sum(counts.get(o, 0) for o in PASSING) / ran if ran else None


def tier_counts(checks: list[CheckRow]) -> dict[str, dict[str, int]]:
    """Outcome counts per tier, plus the key "all"."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for check in checks:
        out[check.tier][check.outcome] += 1
        out[ALL][check.outcome] += 1
    return {tier: dict(counts) for tier, counts in out.items()}


def failure_class(check: CheckRow, hint: str | None = None) -> str | None:
    """The failure class recorded by the run, or one inferred; None if the check passed.

    skipped → capability_gap, xfailed → known_bug; otherwise `hint` (the class a known error signature
    implies) if given, then a timeout or crash in the message, then failed → new_failure and
    error → could_not_run.
    """
    if check.failure_class:
        return check.failure_class
    if check.outcome in PASSING:
        return None
    if check.outcome == "skipped":
        return "capability_gap"
    if check.outcome == "xfailed":
        return "known_bug"
    if hint:
        return hint
    if _TIMEOUT.search(check.message):
        return "timeout"
    if _CRASH.search(check.message):
        return "crash"
    return "new_failure" if check.outcome == "failed" else "could_not_run"


@dataclass(frozen=True)
class Transition:
    """The most recent green → red step of a lineage and how the fingerprint moved across it."""

    lineage: str
    last_green: RunInfo
    first_red: RunInfo
    still_red: bool
    changes: list[FingerprintChange]


def what_changed(runs: list[RunInfo]) -> list[Transition]:
    """For each lineage with a green run later followed by a red one, the latest such step.

    `runs` must be oldest first (as History.runs returns them)."""
    by_lineage: dict[str, list[RunInfo]] = defaultdict(list)
    for run in runs:
        by_lineage[run.series].append(run)
    out = []
    for lineage, series in sorted(by_lineage.items()):
        for index in range(len(series) - 1, 0, -1):
            before, after = series[index - 1], series[index]
            if before.green and not after.green:
                still_red = not any(r.green for r in series[index:])
                changes = diff_runs(before, after)
                out.append(Transition(lineage, before, after, still_red, changes))
                break
    return out


def flipped_checks(green: list[CheckRow], red: list[CheckRow]) -> list[tuple[CheckRow | None, CheckRow]]:
    """Checks that passed (or were absent) in the green run and did not pass in the red one."""
    before = {c.id: c for c in green}
    return [(before.get(c.id), c) for c in red
            if c.outcome not in PASSING | NOT_RUN and (c.id not in before or before[c.id].outcome in PASSING)]


def agreement(matrix: Matrix, column_key: str, reference_target: str = "cuda") -> tuple[int, int]:
    """(agreeing, compared): checks run on this column and on every `reference_target` column that ran
    them, where pass/not-pass is the same on both sides."""
    targets = {c.key: c.target for c in matrix.columns}
    agree = compared = 0
    for _tier, _area, check_id in matrix.rows:
        outcomes = matrix.outcomes(check_id)
        mine = outcomes.get(column_key)
        ref = passes_everywhere({k: o for k, o in outcomes.items() if targets[k] == reference_target
                                 and k != column_key})
        if mine is None or mine in NOT_RUN or ref is None:
            continue
        compared += 1
        agree += int((mine in PASSING) == ref)
    return agree, compared
