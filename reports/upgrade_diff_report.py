"""`conformance compare BEFORE AFTER`: the upgrade diff (reports/upgrade_diff.py) as text for a terminal, Markdown
for a pull-request comment or JSON for a tool, and the exit status a CI step reads (0 no regression, 1 a regression,
2 bad input)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from reports.history import History, HistoryError, history_error
from reports.limits import Limit
from reports.upgrade_diff import (
    FIX,
    INFORMATIONAL_SHIFT,
    LIMIT_NOISE_BAND,
    NEW,
    NO_LIMIT,
    NOT_RUN_AFTER,
    REGRESSION,
    CompareInputError,
    FigureShift,
    OutcomeChange,
    RunSide,
    UpgradeDiff,
    compare,
    side_of_lineage,
    side_of_run_dir,
)

EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT = 0, 1, 2
MESSAGE_CHARS = 160  # of a regressed check's message, on its line

DESCRIPTION = f"""\
Compare two runs: BEFORE (today's stack) and AFTER (the candidate), and say what changed per check.

BEFORE and AFTER are run directories (reports/runs/<run-id>, each holding results.json). With --db FILE they are
two lineage keys of that history store (the dashboard's lineage names, e.g. 'cuda H200 · vllm · installed ·
tiny-gpt-oss · bfloat16 · profile h200-tiny'): each side is its lineage's newest evidence run of each tier it ran,
each tier's checks from its own newest run, with the limits and suite the store keeps from their records.

Regressions:
  outcome  a check that passed (passed, xpassed) and now fails, errors or is a known bug (xfailed); a check that
           ran in BEFORE and is skipped or absent in AFTER ("not run"); a check new in AFTER that fails or errors.
  figure   a figure with a limit recorded in the run (results.json checks[].limits; AFTER's, else BEFORE's)
           that AFTER breaks while BEFORE held it, that AFTER no longer measures, or whose headroom (its
           distance to the limit) shrank by more than the noise band, LIMIT_NOISE_BAND = {LIMIT_NOISE_BAND:.0%}
           of the limit's value. A move inside the band is listed, not a regression; so is a figure
           beyond its limit in both runs that moved less than the band further. Figures without a
           recorded limit (older runs) are listed as "no recorded limit" shifts when they moved by more
           than INFORMATIONAL_SHIFT = {INFORMATIONAL_SHIFT:.0%} of their BEFORE value: never a regression by
           themselves. Figures of a check that errored or was skipped on either side are not compared.
           E.g. a limit "max 0.5" has a band of 0.05: 0.30 → 0.36 is a regression, 0.30 → 0.34 is not.
Also: fixes, new checks, every run option and fingerprint field that differs (the stack diff), and at the top
whether the runs are like for like (target, engine, dtype, model, profile, tiers), whether each is platform
evidence, and whether the suites' data (and so their limits) differ."""
EPILOG = """\
Exit status: 0 no regression; 1 a regression; 2 bad input (a missing directory, no results.json, a damaged
record, an unknown lineage or history store), said in one sentence on stderr.
JSON keys: verdict, regressions (count), noise_band, informational_shift, before/after {label, run_id,
runs_by_tier, series, tiers, not_evidence, suite}, not_like_for_like, notes, outcome_changes [{check, tier,
before, after, kind, regression, message}], figure_shifts [{check, figure, before, after, limit {value, kind,
source}, limit_before, kind, regression, shrink}], stack_changes [{path, before, after}]."""


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _field(value: str | None) -> str:
    return "absent" if value is None else value


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 1] + "…"


def _outcome_words(change: OutcomeChange) -> str:
    before, after = change.before or "absent", change.after or "absent"
    return f"not run ({before} → {after})" if change.kind == NOT_RUN_AFTER else f"{before} → {after}"


def _shift_words(shift: FigureShift) -> str:
    words = f"{shift.figure} {_num(shift.before)} → {_num(shift.after)}: {shift.kind}"
    if shift.limit is not None:
        words += f", limit {shift.limit.describe()}"
        if shift.shrink is not None and shift.shrink > 0:
            words += f"; headroom lost {shift.shrink:.0%} of the limit (band {LIMIT_NOISE_BAND:.0%})"
        if shift.limit_before is not None:
            words += f"; BEFORE's limit was {shift.limit_before.describe()}"
    return words


def _side_words(name: str, side: RunSide) -> str:
    runs = sorted(set(side.runs_by_tier.values()))
    return (f"{name}: {side.label}  (run {', '.join(runs) or side.run.run_id}; {side.run.series}; "
            f"{'+'.join(side.run.tiers)})")


def _summary(diff: UpgradeDiff) -> str:
    regressions, fixes = diff.regressions, len(diff.fixes)
    kinds = {"now failing": sum(isinstance(r, OutcomeChange) and r.kind == REGRESSION for r in regressions),
             "figures": sum(isinstance(r, FigureShift) for r in regressions),
             "not run": sum(isinstance(r, OutcomeChange) and r.kind == NOT_RUN_AFTER for r in regressions)}
    split = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n)
    verdict = "REGRESSION" if regressions else "no regression"
    return (f"{verdict}: {len(regressions)} regression{'s' * (len(regressions) != 1)}"
            + (f" ({split})" if split else "") + f", {fixes} fix{'es' * (fixes != 1)}, "
            f"{len(diff.stack_changes)} stack field{'s' * (len(diff.stack_changes) != 1)} changed")


def _warnings(diff: UpgradeDiff) -> list[str]:
    unlike = [f"not like for like: {'; '.join(diff.unlike)}."] if diff.unlike else []
    return unlike + diff.notes


def to_text(diff: UpgradeDiff) -> str:
    lines = [f"conformance compare: {_summary(diff)}", _side_words("BEFORE", diff.before),
             _side_words("AFTER", diff.after)]
    lines += [f"! {warning}" for warning in _warnings(diff)]

    def section(title: str, items: list[str]) -> None:
        if items:
            lines.extend(["", f"{title} ({len(items)})", *(f"  {item}" for item in items)])

    section("Regressions", [f"{r.check_id}  {_shift_words(r)}" if isinstance(r, FigureShift) else
                            f"{r.check_id}  {_outcome_words(r)}" + (f"  — {_first_line(r.message)}"
                                                                    if r.message else "")
                            for r in diff.regressions])
    section("Fixes", [f"{c.check_id}  {_outcome_words(c)}" for c in diff.fixes])
    section("New checks", [f"{c.check_id}  {c.after}" for c in diff.outcome_changes if c.kind == NEW])
    section("Other outcome changes", [f"{c.check_id}  {_outcome_words(c)}" for c in diff.outcome_changes
                                      if not c.regression and c.kind not in (FIX, NEW)])
    section("Figure shifts, not regressions", [f"{s.check_id}  {_shift_words(s)}" for s in diff.figure_shifts
                                                if not s.regression])
    section("Stack diff", [f"{c.path}: {_field(c.before)} → {_field(c.after)}" for c in diff.stack_changes])
    return "\n".join(lines) + "\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(diff: UpgradeDiff) -> str:
    before, after = diff.before.run.run_id, diff.after.run.run_id
    lines = [f"**conformance compare: {_summary(diff)}** (BEFORE `{before}` → AFTER `{after}`)", ""]
    lines += [f"> ⚠️ {_cell(warning)}" for warning in _warnings(diff)]
    regressions = diff.regressions
    if regressions:
        lines += ["", "### Regressions", "", "| check | what | before | after | detail |", "|---|---|---|---|---|"]
        for item in regressions:
            if isinstance(item, OutcomeChange):
                lines.append(f"| `{_cell(item.check_id)}` | {item.kind} | {item.before or 'absent'} | "
                             f"{item.after or 'absent'} | {_cell(_first_line(item.message))} |")
            else:
                limit = f"limit {item.limit.describe()}" if item.limit else ""
                lines.append(f"| `{_cell(item.check_id)}` | {item.figure}: {item.kind} | {_num(item.before)} | "
                             f"{_num(item.after)} | {_cell(limit)} |")
    if diff.fixes:
        lines += ["", "### Fixes", ""] + [f"- `{c.check_id}`: {_outcome_words(c)}" for c in diff.fixes]
    others = [c for c in diff.outcome_changes if not c.regression and c.kind != FIX]
    if others:
        lines += ["", "### New checks and other outcome changes", ""]
        lines += [f"- `{c.check_id}`: {c.kind}, {_outcome_words(c)}" for c in others]
    shifts = [s for s in diff.figure_shifts if not s.regression]
    if shifts:
        lines += ["", f"### Figure shifts (not regressions; noise band {LIMIT_NOISE_BAND:.0%} of the limit)", "",
                  "| check | figure | before | after | limit | verdict |", "|---|---|---|---|---|---|"]
        lines += [f"| `{_cell(s.check_id)}` | {s.figure} | {_num(s.before)} | {_num(s.after)} | "
                  f"{_cell(s.limit.describe()) if s.limit else NO_LIMIT} | {s.kind} |" for s in shifts]
    lines += ["", f"<details><summary>Stack diff ({len(diff.stack_changes)} fields)</summary>", ""]
    if diff.stack_changes:
        lines += ["| field | before | after |", "|---|---|---|"]
        lines += [f"| `{_cell(c.path)}` | {_cell(_field(c.before))} | {_cell(_field(c.after))} |"
                  for c in diff.stack_changes]
    else:
        lines.append("No option or fingerprint field differs.")
    return "\n".join([*lines, "", "</details>"]) + "\n"


def _limit_json(limit: Limit | None) -> dict | None:
    return None if limit is None else {"value": limit.value, "kind": limit.kind, "source": limit.source}


def _side_json(side: RunSide) -> dict:
    return {"label": side.label, "run_id": side.run.run_id, "runs_by_tier": side.runs_by_tier,
            "series": side.run.series, "tiers": list(side.run.tiers), "not_evidence": side.run.not_evidence,
            "suite": side.suite}


def to_json(diff: UpgradeDiff) -> str:
    data = {
        "verdict": "regression" if diff.regressions else "no regression",
        "regressions": len(diff.regressions),
        "noise_band": LIMIT_NOISE_BAND, "informational_shift": INFORMATIONAL_SHIFT,
        "before": _side_json(diff.before), "after": _side_json(diff.after),
        "not_like_for_like": diff.unlike, "notes": diff.notes,
        "outcome_changes": [{"check": c.check_id, "tier": c.tier, "before": c.before, "after": c.after,
                             "kind": c.kind, "regression": c.regression, "message": c.message}
                            for c in diff.outcome_changes],
        "figure_shifts": [{"check": s.check_id, "figure": s.figure, "before": s.before, "after": s.after,
                           "limit": _limit_json(s.limit), "limit_before": _limit_json(s.limit_before),
                           "kind": s.kind, "regression": s.regression, "shrink": s.shrink}
                          for s in diff.figure_shifts],
        "stack_changes": [{"path": c.path, "before": c.before, "after": c.after} for c in diff.stack_changes],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conformance compare", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", metavar="BEFORE", help="run directory of today's stack (or, with --db, a lineage)")
    parser.add_argument("after", metavar="AFTER", help="run directory of the candidate (or, with --db, a lineage)")
    style = parser.add_mutually_exclusive_group()
    style.add_argument("--markdown", action="store_true", help="Markdown for a pull-request comment")
    style.add_argument("--json", action="store_true", help="JSON (keys below)")
    parser.add_argument("--db", type=Path, metavar="FILE",
                        help="BEFORE and AFTER are lineage keys of this history store (conformance dashboard "
                             "builds it)")
    return parser


def _sides(args: argparse.Namespace) -> tuple[RunSide, RunSide]:
    if args.db is None:
        return side_of_run_dir(args.before), side_of_run_dir(args.after)
    if not args.db.is_file():
        raise CompareInputError(f"history store {args.db} does not exist; build it with `conformance dashboard`, "
                                "or compare two run directories.")
    with History.open(args.db) as history:
        try:
            return side_of_lineage(history, args.before), side_of_lineage(history, args.after)
        except sqlite3.DatabaseError as exc:
            raise history_error(args.db, exc) from None


def main(argv: list[str] | None = None) -> int:
    """The `conformance compare` command; returns its exit status."""
    args = _parser().parse_args(argv)
    try:
        before, after = _sides(args)
    except (CompareInputError, HistoryError, OSError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    diff = compare(before, after)
    render = to_json if args.json else to_markdown if args.markdown else to_text
    sys.stdout.write(render(diff))
    return EXIT_REGRESSION if diff.regressions else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
