"""`conformance baseline`: list the serving lineages of the history store and their pins, and promote a pinned
baseline deliberately (the median of the last N accepted runs). docs/results.md "Pinned serving baselines".

  conformance baseline list [--db FILE] [--pins FILE]
  conformance baseline promote --lineage LINEAGE --model MODEL [--runs N | --run RUN_ID ...] [--check ID]
                               [--note TEXT] [--db FILE] [--pins FILE]
  conformance baseline establish [--runs N] [--reports-dir DIR] [--note TEXT] [--db FILE] [--pins FILE]
                                 -- RUN OPTIONS (e.g. --cuda)

`establish` pins a machine's own serving figures and judges them once: N whole P2 runs on this machine (`conformance
run --tier p2 RUN OPTIONS`), each into the history store, their median and spread promoted (`promote --run` each),
then one more P2 judged against that pin; its exit status is the command's. A run that is no platform result
(narrowed, interrupted, refused) pins nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from env_checks import baselines, child

if TYPE_CHECKING:
    from reports.records import RunInfo

DEFAULT_DB = Path("reports") / "history.sqlite"
DEFAULT_RUNS = 3
# a pin of one run missed a level by 0.2 ms (an H100); two estimate a noisy host's spread poorly, so establish says
# where its judged run missed its own pin (docs/notebook/2026-12-measurements.md, the sessions of 2026-12-06)
ESTABLISH_RUNS = 2
DEFAULT_REPORTS = Path("reports") / "runs"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="conformance baseline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    for name, text in (("list", "the lineages, models and serving checks with accepted runs, and their pins"),
                       ("promote", "pin the median of the last N accepted runs as the baseline"),
                       ("establish", "run P2 N times on this machine, pin their median and spread, and judge one "
                                     "more P2 against that pin")):
        s = sub.add_parser(name, help=text, description=text)
        s.add_argument("--db", type=Path, default=DEFAULT_DB, help=f"history store (default {DEFAULT_DB})")
        s.add_argument("--pins", type=Path, help=f"pin file (default ${baselines.PINS_ENV}, else "
                                                 f"{baselines.PINS_FILE} beside the history store)")
        if name == "establish":
            s.add_argument("--runs", type=int, default=ESTABLISH_RUNS,
                           help=f"P2 runs to pin before the judged one (default {ESTABLISH_RUNS})")
            s.add_argument("--reports-dir", type=Path, default=DEFAULT_REPORTS,
                           help=f"where the runs are written (default {DEFAULT_REPORTS}), as `conformance run` "
                                "takes it")
            s.add_argument("--note", default="", help="why this baseline was established (kept in the pin)")
            s.epilog = ("Every other option goes to `conformance run --tier p2` (target, dtype, profile, model, "
                        "server), after `--` or not: `conformance baseline establish --runs 2 -- --rocm`.")
            continue
        s.add_argument("--check", action="append",
                       help="check id, or the id without its [parameter] for every level (repeatable; default: "
                            "the P2 serving checks at every concurrency and shape)")
        if name == "promote":
            s.add_argument("--lineage", required=True, help="lineage as `baseline list` prints it "
                                                            "(target, hardware and combination)")
            s.add_argument("--model", required=True, help="model name as `baseline list` prints it")
            s.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                           help=f"how many of the latest accepted runs the median takes (default {DEFAULT_RUNS})")
            s.add_argument("--run", action="append", dest="run_ids", metavar="RUN_ID",
                           help="pin the median of exactly these runs (repeatable; instead of --runs), whatever the "
                                "check's outcome in them, e.g. a run that failed only against the pin it joins; "
                                "each must still be evidence, measured without a kernel compile or failed request")
            s.add_argument("--note", default="", help="why this baseline was promoted (kept in the pin)")
    return p


def _matches(check_id: str, wanted: tuple[str, ...]) -> bool:
    return any(check_id == w or check_id.startswith(w + "[") for w in wanted)


def _check_ids(history, wanted: tuple[str, ...]) -> list[str]:  # noqa: ANN001 - reports.history.History
    ids = {row[0] for row in history.conn.execute("SELECT DISTINCT id FROM checks")}
    return sorted(i for i in ids if _matches(i, wanted))


def promote(db: Path, pins_file: Path, lineage: str, model: str, check: tuple[str, ...], runs: int,
            note: str = "", run_ids: list[str] | None = None) -> list[str]:
    """Pin the median of the last `runs` accepted runs of every check matching `check` (of the runs `run_ids`, all
    of them, when given); the lines to print. Raises SystemExit with one sentence when there is nothing (or too
    little) to promote."""
    from reports.history import History, HistoryError

    if run_ids:
        runs = len(set(run_ids))
    if runs < 1:
        raise SystemExit("--runs must be at least 1.")
    if not db.is_file():
        raise SystemExit(f"there is no history store at {db}: build it with `conformance dashboard` first.")
    try:
        pins = baselines.load(pins_file)
        with History.open(db) as history:
            chosen, dropped = {}, {}
            for check_id in _check_ids(history, check):
                accepted, out = baselines.screened(history, lineage, model, check_id, run_ids=run_ids or None)
                if accepted := [r for r in accepted if r.figures]:
                    chosen[check_id] = accepted
                if out:
                    dropped[check_id] = out
    except (baselines.PinError, HistoryError) as exc:
        raise SystemExit(str(exc)) from None
    left = {c: [f"left out {r.run_id} of {c}: {why}" for r, why in out] for c, out in sorted(dropped.items())}
    if not chosen:
        if left:
            raise SystemExit(f"nothing to promote for {lineage!r} {model!r}: "
                             + "; ".join(line for lines in left.values() for line in lines) + ".")
        raise SystemExit(f"no complete run of lineage {lineage!r} and model {model!r} in {db} has "
                         f"{' or '.join(check)} passed or skipped with figures: nothing to promote (see "
                         f"`conformance baseline list`).")
    short = {c: len(r) for c, r in chosen.items() if len(r) < runs}
    wanted = f"the {runs} named with --run" if run_ids else f"--runs {runs}"
    if len(short) == len(chosen):
        c = min(short, key=short.get)
        raise SystemExit(f"only {short[c]} accepted run(s) of {c} for {lineage!r} {model!r}, fewer than {wanted}"
                         + "".join(f"; {line}" for line in left.get(c, [])) + ": run again or promote with fewer runs.")
    lines = [line for c in sorted(left) for line in left[c]]
    lines += [f"not pinned {c}: each of its runs was left out" for c in sorted(left) if c not in chosen]
    lines += [f"not pinned {c}: only {n} accepted run(s), fewer than {wanted}" for c, n in sorted(short.items())]
    for check_id, accepted in sorted(chosen.items()):
        if check_id in short:
            continue
        pin = baselines.median_pin(check_id, lineage, model, accepted[-runs:], note)
        old = pins.get(*pin.key)
        pins.put(pin)
        lines.append(f"pinned {check_id} for {lineage!r} {model!r}: median of {', '.join(r.run_id for r in pin.runs)}"
                     f" ({len(pin.figures)} figures" + (f"; output_tok_s {pin.figures['output_tok_s']:.4g}" if
                                                          "output_tok_s" in pin.figures else "")
                     + (f", replacing the pin of {old.promoted_at})" if old else ")")
                     + (f"; its runs' hosts lay {pin.spread[baselines.HOST_FIGURE]:.0%} apart in single-thread speed"
                        if baselines.HOST_FIGURE in pin.spread else ""))
    pins.save()
    lines.append(f"wrote {pins_file}")
    return lines


def listing(db: Path, pins_file: Path, check: tuple[str, ...]) -> list[str]:
    from reports.history import History, HistoryError

    if not db.is_file():
        raise SystemExit(f"there is no history store at {db}: build it with `conformance dashboard` first.")
    try:
        pins = baselines.load(pins_file)
        with History.open(db) as history:
            combos = sorted({(baselines.serving_lineage(r.lineage, r.dtype, r.profile), r.model)
                             for r in history.runs() if r.complete and not r.not_evidence})
            lines = []
            for check_id in _check_ids(history, check):
                for lineage, model in combos:
                    n = len([r for r in baselines.accepted_runs(history, lineage, model, check_id) if r.figures])
                    pin = pins.get(check_id, lineage, model)
                    if n or pin:
                        lines.append(f"{check_id}  --lineage {lineage!r} --model {model!r}: {n} accepted run(s); "
                                     + (pin.describe() if pin else "no pinned baseline"))
    except (baselines.PinError, HistoryError) as exc:
        raise SystemExit(str(exc)) from None
    return lines or [f"no run in {db} has {' or '.join(check)} passed or skipped with figures"]


NARROWING = ("-k", "--tier", "--planted-fault")


def _p2(n: int, total: int, reports_dir: Path, run_args: list[str], env: dict[str, str]) -> tuple[int, Path]:
    """Run the `n`th of `total` P2 runs; (its exit status, its run directory). SystemExit when it wrote none."""
    print(f"conformance baseline establish: P2 run {n} of {total}"
          + (" (judged against the pin of the runs before)" if n == total else " (to pin)"), flush=True)
    before = set(reports_dir.iterdir()) if reports_dir.is_dir() else set()
    code = child.wait_recording(subprocess.Popen([sys.executable, "-m", "conformance", "run", "--tier", "p2",
                                                  "--reports-dir", str(reports_dir), *run_args], env=env))
    if code is None:
        raise SystemExit(f"interrupted during P2 run {n} of {total}: that run records itself incomplete; nothing "
                         "more is pinned or judged.")
    made = sorted(p for p in reports_dir.iterdir() if p not in before and (p / "results.json").is_file()) \
        if reports_dir.is_dir() else []
    if len(made) != 1:
        raise SystemExit(f"P2 run {n} of {total} exited with status {code} and wrote "
                         f"{'no run record' if not made else f'{len(made)} run records'} in {reports_dir}: nothing "
                         "more is pinned or judged.")
    return code, made[0]


def _ingested(n: int, total: int, db: Path, reports_dir: Path, run_args: list[str], env: dict[str, str]
              ) -> tuple[int, RunInfo, dict]:
    """The `n`th P2 run, run and stored in the history store: (its exit status, its entry there, its record).
    SystemExit, one sentence, where it is no platform result."""
    from reports.history import History, HistoryError
    from reports.results import ResultsError, load_run

    code, run_dir = _p2(n, total, reports_dir, run_args, env)
    try:
        record = load_run(run_dir)
        with History.open(db) as history:
            history.ingest_record(record, source=run_dir.name)
            (run,) = [r for r in history.runs() if r.run_id == record["run_id"]]
    except (ResultsError, HistoryError) as exc:
        raise SystemExit(str(exc)) from None
    if not run.complete or run.not_evidence:
        raise SystemExit(f"P2 run {n} ({run.run_id}) is no platform result "
                         f"({run.not_evidence or 'it did not complete'}): nothing more is pinned or judged.")
    return code, run, record


def missed_own_pin(record: dict) -> str | None:
    """What establish says where its judged run missed the pin just made of the same stack on the same machine at a
    serving level, as the stack's failure: nothing changed between those runs, so the pin is narrower than this
    machine's noise. None where no level did."""
    missed = [c["id"].rsplit("::", 1)[-1] for c in record.get("checks", [])
              if c.get("outcome") == "failed" and c.get("failure_class") == "new_failure"
              and c["id"].split("[")[0] in baselines.SERVING_CHECKS]
    if not missed:
        return None
    return (f"conformance baseline establish: the judged run missed the pin of its own stack, made minutes before on "
            f"this machine, at {len(missed)} serving level(s) ({', '.join(missed)}): nothing changed between these "
            "runs, so those figures move here more than the pinned runs showed. Pin more runs (--runs N) before an "
            "upgrade is judged by them (docs/results.md, \"Pinned serving baselines\").")


def establish(db: Path, pins_file: Path, reports_dir: Path, runs: int, note: str, run_args: list[str]) -> int:
    """`baseline establish`: `runs` P2 runs pinned (their median and spread), then one judged against the pin; the
    judged run's exit status. SystemExit, one sentence, where a run is no platform result or the runs differ in
    lineage or model."""
    narrowing = [a for a in run_args if a.split("=")[0] in NARROWING]
    if narrowing:
        raise SystemExit(f"establish runs the whole P2 and pins only platform results: {' '.join(narrowing)} "
                         "would make its runs none.")
    if runs < 1:
        raise SystemExit("--runs must be at least 1.")
    env = os.environ | {baselines.HISTORY_ENV: str(db), baselines.PINS_ENV: str(pins_file)}  # where the run looks
    child.interrupt_on_sigterm()  # nox passes SIGTERM on: stop as on Ctrl-C
    pinned = [_ingested(n, runs + 1, db, reports_dir, run_args, env)[1] for n in range(1, runs + 1)]
    keys = {(baselines.serving_lineage(r.lineage, r.dtype, r.profile), r.model) for r in pinned}
    if len(keys) != 1:
        raise SystemExit(f"the P2 runs to pin differ in serving lineage or model ({sorted(keys)}): nothing pinned.")
    ((lineage, model),) = keys
    print("\n".join(promote(db, pins_file, lineage, model, tuple(baselines.SERVING_CHECKS), runs,
                            note or f"established from {runs} P2 run(s) on this machine",
                            [r.run_id for r in pinned])), flush=True)
    code, judged, record = _ingested(runs + 1, runs + 1, db, reports_dir, run_args, env)
    print(f"conformance baseline establish: {judged.run_id} judged against the pin of "
          f"{', '.join(r.run_id for r in pinned)}: exit status {code}", flush=True)
    if (noise := missed_own_pin(record)) is not None:
        print(noise, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["establish"]:  # the options it does not know are the runs'
        ns, run_args = _parser().parse_known_args(argv)
        if "--" in run_args:
            run_args.remove("--")
        return establish(ns.db, ns.pins or baselines.pins_path(ns.db), ns.reports_dir, ns.runs, ns.note, run_args)
    ns = _parser().parse_args(argv)
    pins_file = ns.pins or baselines.pins_path(ns.db)
    check = tuple(ns.check or baselines.SERVING_CHECKS)
    if ns.action == "promote":
        lines = promote(ns.db, pins_file, ns.lineage, ns.model, check, ns.runs, ns.note, ns.run_ids)
    else:
        lines = listing(ns.db, pins_file, check)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
