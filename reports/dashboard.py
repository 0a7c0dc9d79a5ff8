"""Build the parity dashboard: ingest `reports/runs/*` into the history store, render `reports/site/`.

`main` is the command behind `conformance dashboard`, `nox -s dashboard` and `python -m reports`. A run
directory that cannot be read or fails the schema is named and skipped (and left where it is); a damaged
history file is named, left untouched, and the site is still rendered from the run files through a
temporary in-memory store, with exit status 2 so CI notices.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from reports.history import History, HistoryError, IngestReport, history_error
from reports.pages import write_pages
from reports.render import render_page
from reports.sitedata import collect

DEFAULT_RUNS = Path("reports/runs")
DEFAULT_DB = Path("reports/history.sqlite")
DEFAULT_OUT = Path("reports/site")
EXIT_OK, EXIT_BAD_INPUT = 0, 2


@dataclass
class BuildResult:
    """What one build did."""

    index: Path
    ingest: IngestReport
    errors: list[str] = field(default_factory=list)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the site is meant to be served and read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _ingest_all(history: History, runs_dirs: list[Path]) -> IngestReport:
    report = IngestReport()
    for runs_dir in runs_dirs:
        one = history.ingest_dir(runs_dir)
        report.ingested += one.ingested
        report.already += one.already
        report.skipped += one.skipped
    return report


def build(runs_dir: Path | Sequence[Path], db_path: Path | str, out_dir: Path,
          now: datetime | None = None) -> BuildResult:
    """Ingest `runs_dir` (one directory of runs, or several) into `db_path` and write `out_dir/index.html`.
    Raises HistoryError only when even an in-memory store cannot be built; a damaged `db_path` is reported
    in `BuildResult.errors`."""
    runs_dirs = [Path(runs_dir)] if isinstance(runs_dir, (str, Path)) else [Path(d) for d in runs_dir]
    errors: list[str] = []
    try:
        history = History.open(db_path)
    except HistoryError as exc:
        errors.append(str(exc))
        history = History.open(":memory:")
    with history:
        try:
            report = _ingest_all(history, runs_dirs)
        except sqlite3.DatabaseError as exc:  # damage deeper in the file than its header, or a long lock
            errors.append(str(history_error(db_path, exc)))
            history.close()
            history = History.open(":memory:")
            report = _ingest_all(history, runs_dirs)
        data = collect(history, now=now)
        data.skipped_inputs = report.skipped
        data.notices = [f"History store not used: {msg} This page was built from the run files alone."
                        for msg in errors]
        index = Path(out_dir) / "index.html"
        _write_atomic(index, render_page(data))
        write_pages(history, data, runs_dirs, Path(out_dir))
    return BuildResult(index, report, errors)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conformance dashboard",
        description="Ingest conformance runs (RUNS/<run-id>/results.json) into the SQLite history store and "
                    "render the parity dashboard as one self-contained HTML file (OUT/index.html: no network "
                    "fetches, plots embedded as SVG). Ingest is idempotent by run id and safe to run from "
                    "several runners at once. Run directories that fail the results schema are reported and "
                    "skipped, never deleted. A damaged history file is reported and left untouched (move it "
                    "aside; it is rebuilt from the run files).",
        epilog="Exit status: 0 built; 2 bad inputs (missing runs directory, damaged history store, or, with "
               "--strict, any skipped run directory).")
    parser.add_argument("run_dirs", nargs="*", type=Path, metavar="RUNS",
                        help="directories of runs to ingest (each holding one sub-directory per run, e.g. "
                             "runs copied from a fleet's reports/runs); the same as --runs, repeatable")
    parser.add_argument("--runs", type=Path, action="append", metavar="DIR",
                        help=f"directory holding one sub-directory per run (default: {DEFAULT_RUNS})")
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, metavar="FILE",
                        help=f"SQLite history store, created if absent (default: {DEFAULT_DB})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"where index.html is written (default: {DEFAULT_OUT})")
    parser.add_argument("--strict", action="store_true",
                        help="exit 2 when any run directory was skipped as unreadable or invalid")
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    runs_dirs = [*args.run_dirs, *(args.runs or [])] or [DEFAULT_RUNS]
    for runs_dir in runs_dirs:
        if not runs_dir.is_dir():
            print(f"dashboard: runs directory {runs_dir} does not exist; run the suite first or pass "
                  "--runs DIR.", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        result = build(runs_dirs, args.db, args.out)
    except (HistoryError, OSError) as exc:
        print(f"dashboard: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path, why in result.ingest.skipped:
        print(f"dashboard: skipped {path}: {why}", file=sys.stderr)
    for error in result.errors:
        print(f"dashboard: {error}", file=sys.stderr)
    report = result.ingest
    print(f"dashboard: {len(report.ingested)} runs ingested, {len(report.already)} already stored, "
          f"{len(report.skipped)} skipped; wrote {result.index}")
    if result.errors or (args.strict and report.skipped):
        return EXIT_BAD_INPUT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
