"""The history store: every ingested run, its checks and figures, in one SQLite file.

Several CI runners may ingest into one file at once, so the store uses WAL journaling, a generous busy
timeout and one `BEGIN IMMEDIATE` transaction per run (a run is stored whole or not at all); ingest is
idempotent by run id. The schema version lives in `PRAGMA user_version` and is raised by the ordered
`MIGRATIONS`. The file is a cache of `reports/runs/*`: a damaged one is reported and left untouched for the
user to move aside, never deleted or rewritten by this module.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path
from typing import Any

from reports.history_schema import MIGRATIONS, SCHEMA_VERSION
from reports.limits import Limit, limits_from_json, limits_json
from reports.records import CheckRow, RunInfo, log_mismatch, not_evidence, why_test_model
from reports.results import CHECKS_LOG, OUTCOMES, RESULTS_FILE, ResultsError, load_run, parse_time
from reports.stack import identify

# Re-exported: the reports and env_checks.baselines import these from here.
__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "CheckRow", "History", "HistoryError", "IngestReport", "RunInfo",
           "history_error", "not_evidence"]

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000



def _retry_locked(step: Any) -> Any:
    """Run a set-up step, retrying while another process holds the lock. Switching a fresh file to WAL
    needs an exclusive lock and SQLite may answer "locked" at once, without its busy handler, when
    several processes create the store together."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class HistoryError(RuntimeError):
    """The history database cannot be used; the message names the file and what to do."""


@dataclass
class IngestReport:
    """What one ingest pass did: stored, already there, skipped (with one sentence of why per path)."""

    ingested: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _broken(path: Path, why: str) -> HistoryError:
    return HistoryError(f"{path} is not a usable history database ({why}); move it aside and run the "
                        "dashboard again, which rebuilds it from reports/runs/*.")


def history_error(path: Path | str, exc: sqlite3.Error) -> HistoryError:
    """The one-sentence HistoryError for an SQLite error: a lock held too long is not damage."""
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
        return HistoryError(f"{path} stayed locked by another process for over {BUSY_TIMEOUT_MS // 1000} s "
                            f"({exc}); run the dashboard again when the other ingest has finished.")
    return _broken(Path(str(path)), str(exc))


class History:
    """An open history database. Use `History.open(path)` (or `":memory:"`) as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path | str) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path | str) -> History:
        in_memory = str(path) == ":memory:"
        if not in_memory:
            path = Path(path)
            # Check the header ourselves before SQLite touches the file, so garbage is never written over.
            if path.exists() and path.stat().st_size > 0:
                with open(path, "rb") as handle:
                    if handle.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                        raise _broken(path, "it does not start with the SQLite header")
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except sqlite3.Error as exc:
            raise history_error(path, exc) from None
        history = cls(conn, path)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if not in_memory:
                _retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
                # NORMAL is corruption-safe with WAL; a power cut may drop the last ingests, which the next
                # build re-reads from reports/runs, and a commit without fsync keeps 1,000 ingests fast.
                conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            _retry_locked(history._migrate)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise history_error(path, exc) from None
        except HistoryError:
            conn.close()
            raise
        return history

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _user_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        if self._user_version() == SCHEMA_VERSION:
            return
        # Re-read the version inside the write lock: another process may have migrated meanwhile.
        self.conn.execute("BEGIN IMMEDIATE")  # outside the try: a failed BEGIN has nothing to roll back
        try:
            version = self._user_version()
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{self.path} has history schema version {version}, newer than this "
                                   f"tool's {SCHEMA_VERSION}; update the suite or move the file aside.")
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {number + 1}")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    # -- writing -------------------------------------------------------------------------------------

    def has_run(self, run_id: str, complete_only: bool = False, current: bool = False) -> bool:
        """Whether the run is stored (complete, with `complete_only`; its derived columns written by this schema's
        rules, with `current`: a row stored by an older schema is read again from its files)."""
        row = self.conn.execute("SELECT complete, derived_by FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return (row is not None and (bool(row[0]) or not complete_only)
                and (not current or row[1] >= SCHEMA_VERSION))

    def ingest_record(self, record: dict, source: str | None = None) -> bool:
        """Store one validated record; False (and nothing written) when its run id is already stored.

        The one exception: a stored *incomplete* run is replaced by a newer write of the same run id (a run
        interrupted and then finished, or written before its last check), so a partial record never hides
        the final one.
        """
        ident = identify(record["target"], record["fingerprint"])
        summary = record["summary"]
        self.conn.execute("BEGIN IMMEDIATE")  # one run, one transaction: stored whole or not at all
        try:
            stored = self.conn.execute("SELECT complete, finished_at, passed + failed + error + skipped + "
                                       "xfailed + xpassed FROM runs WHERE run_id = ?",
                                       (record["run_id"],)).fetchone()
            newer = (int(record["complete"]), record["finished_at"], len(record["checks"]))
            if stored is not None and not stored[0] and tuple(stored) != newer:
                for table in ("run_health", "phases", "figures", "checks", "runs"):
                    self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (record["run_id"],))
            derived = _derived(record)
            cursor = self.conn.execute(
                "INSERT OR IGNORE INTO runs (run_id, started_at, finished_at, target, engine, combo, "
                "tiers, complete, model, model_hash, fingerprint, platform, passed, failed, error, skipped, "
                f"xfailed, xpassed, source, {', '.join(derived)}) "
                f"VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?{',?' * len(derived)})",
                (record["run_id"], _utc(record["started_at"]), record["finished_at"], record["target"],
                 record["engine"], record["combo"], json.dumps(record["tiers"]), int(record["complete"]),
                 record["model"]["name"], record["model"].get("content_hash"),
                 json.dumps(record["fingerprint"], sort_keys=True), ident.label,
                 summary["passed"], summary["failed"], summary["error"], summary["skipped"],
                 summary["xfailed"], summary["xpassed"], source, *derived.values()))
            if cursor.rowcount == 0:
                # a run stored by an older suite is read again: its lineage, options, whether it is evidence, and
                # the limits and suite it was judged by
                self.conn.execute(f"UPDATE runs SET {', '.join(f'{k} = ?' for k in derived)} WHERE run_id = ?",
                                  (*derived.values(), record["run_id"]))
                self.conn.executemany("UPDATE checks SET limits = ? WHERE run_id = ? AND id = ?",
                                      [(limits_json(c.get("limits")), record["run_id"], c["id"])
                                       for c in record["checks"]])
                self.conn.execute("COMMIT")
                return False
            self.conn.executemany(
                "INSERT INTO checks (run_id, id, tier, area, outcome, duration, message, failure_class, "
                "bug_link, reference, limits) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [(record["run_id"], c["id"], c["tier"], c["area"], c["outcome"], c["duration_s"],
                  c["message"], c.get("failure_class"), c.get("bug_link"), c["reference"], limits_json(c.get("limits")))
                 for c in record["checks"]])
            self.conn.executemany(
                "INSERT INTO figures (run_id, check_id, name, value) VALUES (?,?,?,?)",
                [(record["run_id"], c["id"], name, value) for c in record["checks"]
                 for name, value in sorted(c["figures"].items())])
            self.conn.executemany(
                "INSERT INTO phases (run_id, name, seconds) VALUES (?,?,?)",
                [(record["run_id"], name, float(value))
                 for name, value in sorted((record.get("phases") or {}).items())])
            if "machine_health" in record or "telemetry" in record:
                self.conn.execute("INSERT INTO run_health (run_id, verdict, telemetry) VALUES (?,?,?)",
                                  (record["run_id"], (record.get("machine_health") or {}).get("verdict"),
                                   json.dumps(record.get("telemetry") or {}, sort_keys=True)))
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        return True

    def ingest_dir(self, runs_dir: Path) -> IngestReport:
        """Ingest every `runs_dir/*/results.json`; bad ones are reported in `skipped`, never removed."""
        report = IngestReport()
        # Hidden entries are editors' and tools' scratch space, not runs.
        run_dirs = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir() and not p.name.startswith("."))
        for run_dir in run_dirs:
            name = run_dir.name
            # Run dirs are named by run id, so a stored complete run is not parsed and validated again.
            if self.has_run(name, complete_only=True, current=True):
                report.already.append(name)
                continue
            if not (run_dir / RESULTS_FILE).exists():
                why = f"{run_dir} has no {RESULTS_FILE} (an unfinished run?)."
                report.skipped.append((str(run_dir), why))
                continue
            try:
                record = load_run(run_dir)
            except ResultsError as exc:
                report.skipped.append((str(run_dir), str(exc)))
                continue
            mismatch = log_mismatch(record, _logged(run_dir / CHECKS_LOG)) if record["complete"] else None
            if mismatch:  # held as the run said it is not evidence; its files are left as they are
                record = record | {"evidence": False,
                                   "evidence_problems": [*(record.get("evidence_problems") or []), mismatch]}
            stored = self.ingest_record(record, source=name)
            (report.ingested if stored else report.already).append(record["run_id"])
        return report

    # -- reading -------------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return {table: self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("runs", "checks", "figures")}

    def runs(self) -> list[RunInfo]:
        """Every run, oldest first."""
        rows = self.conn.execute(
            "SELECT run_id, started_at, target, engine, combo, tiers, complete, model, platform, lineage, "
            "fingerprint, passed, failed, error, skipped, xfailed, xpassed, not_evidence, dtype, profile, "
            "planted_fault, narrowed_by, exit_status, model_hash, source, suite, test_model FROM runs "
            "ORDER BY started_at, run_id")
        return [RunInfo(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])), bool(r[6]), r[7], r[8], r[9],
                        json.loads(r[10]), dict(zip(OUTCOMES, r[11:17], strict=True)), *r[17:25],
                        suite=json.loads(r[25]) if r[25] else None, test_model=r[26])
                for r in rows]

    def checks(self, run_ids: Iterable[str]) -> dict[str, list[CheckRow]]:
        """The checks (with figures) of the given runs, keyed by run id."""
        ids = list(dict.fromkeys(run_ids))
        out: dict[str, list[CheckRow]] = {run_id: [] for run_id in ids}
        figures: dict[tuple[str, str], dict[str, float | None]] = {}
        for chunk in _chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            for run_id, check_id, name, value in self.conn.execute(
                    f"SELECT run_id, check_id, name, value FROM figures WHERE run_id IN ({marks}) "
                    "ORDER BY name", chunk):
                figures.setdefault((run_id, check_id), {})[name] = value
            for row in self.conn.execute(
                    "SELECT run_id, id, tier, area, outcome, duration, message, failure_class, bug_link, "
                    f"reference, limits FROM checks WHERE run_id IN ({marks}) ORDER BY id", chunk):
                out[row[0]].append(CheckRow(*row[:10], figures=figures.get((row[0], row[1]), {}),
                                            limits=limits_from_json(row[10])))
        return out

    def outcomes(self) -> dict[str, list[tuple[str, str, str, str | None]]]:
        """Every stored check's (check id, tier, outcome, failure class), by run id: the flips of a check across a
        lineage's runs (reports/flaky.py) without loading messages and figures."""
        out: dict[str, list[tuple[str, str, str, str | None]]] = {}
        for run_id, check_id, tier, outcome, failure_class in self.conn.execute(
                "SELECT run_id, id, tier, outcome, failure_class FROM checks ORDER BY run_id, id"):
            out.setdefault(run_id, []).append((check_id, tier, outcome, failure_class))
        return out

    def tier_counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """Outcome counts per (run id, tier), for pass rates over time without loading every check."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        for run_id, tier, outcome, count in self.conn.execute(
                "SELECT run_id, tier, outcome, COUNT(*) FROM checks GROUP BY run_id, tier, outcome"):
            out.setdefault((run_id, tier), {})[outcome] = count
        return out

    def phase_points(self, name: str = "wall", tier: str | None = "p0") -> list[tuple[str, str, float]]:
        """(lineage, started_at, seconds) of phase `name` for every run that recorded it, oldest first; with
        `tier`, only runs of that tier alone (a P0 run's wall, not that of a P0+P1 run)."""
        rows = self.conn.execute(
            "SELECT r.lineage, r.started_at, p.seconds, r.tiers FROM phases p JOIN runs r ON r.run_id = p.run_id "
            "WHERE p.name = ? ORDER BY r.lineage, r.started_at", (name,))
        return [(lineage, started, seconds) for lineage, started, seconds, tiers in rows
                if tier is None or json.loads(tiers) == [tier]]

    def health(self, run_ids: Iterable[str]) -> dict[str, tuple[str | None, dict]]:
        """{run id: (machine-health verdict, telemetry series)} of the given runs that recorded them."""
        ids, out = list(dict.fromkeys(run_ids)), {}
        for chunk in _chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            for run_id, verdict, tel in self.conn.execute(
                    f"SELECT run_id, verdict, telemetry FROM run_health WHERE run_id IN ({marks})", chunk):
                out[run_id] = (verdict, json.loads(tel))
        return out

    def figure_points(self) -> list[tuple[str, str, str, str, float, Limit | None]]:
        """(check id, figure name, run id, started_at, value, the limit the run recorded for it or None) for every
        numeric figure, oldest first."""
        rows = self.conn.execute(
            "SELECT f.check_id, f.name, r.run_id, r.started_at, f.value, c.limits FROM figures f JOIN runs r "
            "ON r.run_id = f.run_id LEFT JOIN checks c ON c.run_id = f.run_id AND c.id = f.check_id "
            "WHERE f.value IS NOT NULL ORDER BY f.check_id, f.name, r.started_at")
        parsed: dict[str | None, dict[str, Limit] | None] = {}
        out = []
        for check_id, name, run_id, started_at, value, limits in rows:
            if limits not in parsed:
                parsed[limits] = limits_from_json(limits)
            out.append((check_id, name, run_id, started_at, value, (parsed[limits] or {}).get(name)))
        return out


def _logged(path: Path) -> list[dict]:
    """The entries of a run's checks.jsonl that can be read (none where it has no log: runs kept without it)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut off as the node went down: the record itself decides
        if isinstance(entry, dict) and "id" in entry:
            out.append(entry)
    return out


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _derived(record: dict) -> dict[str, Any]:
    """The columns derived from a record by this schema's rules: written on ingest, rewritten when a run stored by an
    older schema is read again."""
    ident = identify(record["target"], record["fingerprint"])
    return {"lineage": ident.lineage(record["combo"], record.get("engine")), "not_evidence": not_evidence(record),
            "dtype": record.get("dtype"), "profile": record.get("profile"),
            "planted_fault": record.get("planted_fault"), "narrowed_by": record.get("narrowed_by"),
            "exit_status": record.get("exit_status"), "derived_by": SCHEMA_VERSION,
            "suite": json.dumps(record["suite"], sort_keys=True) if isinstance(record.get("suite"), dict) else None,
            "test_model": why_test_model(record["model"])}


def _utc(stamp: str) -> str:
    # Stored in one UTC spelling so that ORDER BY started_at is chronological across hosts' time zones.
    return parse_time(stamp).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
