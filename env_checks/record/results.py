"""One run's record: validate it against the results schema, name it, write it to disk, read it back.

This is the results contract shared by the suite (`conformance` writes runs) and the reports (`reports` reads
them); both may import `env_checks`, so it lives here. Standard library only at import: `jsonschema` is
imported the first time a record is validated.

The schema (`results.schema.json`) is the contract read by the dashboard, CI and outside tools, so
nothing is written that does not validate, and a run directory is never silently taken over by another run.
Files are written through a temporary file and `os.replace`, so a reader sees either the old file or the
new one, never half of one; `results.json` is written last and so marks a finished write.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterable
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

# A check's message when it failed with a verdict (the suite's CheckFailed, or an assertion), not an engine or
# harness error: how a planted fault's run shows that the fault was caught (conformance drill, the dashboard).
VERDICT_FAILURE = re.compile(r"^(?:[\w.]*\.)?(?:CheckFailed|AssertionError)\b")

try:  # fcntl is POSIX-only; without it two writers of one run dir are not serialised (rare, not fatal)
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

SCHEMA_PATH = Path(__file__).with_name("results.schema.json")
RESULTS_FILE = "results.json"
FINGERPRINT_FILE = "fingerprint.json"
JUNIT_FILE = "junit.xml"
CHECKS_LOG = "checks.jsonl"  # each check's entry, appended as it finished (what a run cut off keeps)
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
_SAFE_TARGET = re.compile(r"[^A-Za-z0-9._-]+")


class ResultsError(ValueError):
    """A results record (or a run directory) is not acceptable; the message is one sentence."""


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(path: Iterable[Any]) -> str:
    where = ""
    for part in path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where or "the top level"


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 timestamp; naive times are taken as UTC so runs from any host sort together."""
    # Python 3.10's fromisoformat does not take a trailing "Z".
    parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def validate(record: dict) -> None:
    """Raise ResultsError (one sentence naming the field) unless `record` is a valid results record."""
    if not isinstance(record, dict):
        raise ResultsError(f"a results record must be a JSON object, not {type(record).__name__}.")
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(record))
    if error is not None:
        raise ResultsError(f"results record is invalid at {_where(error.absolute_path)}: {error.message}.")
    # The schema's "format" is not enforced by jsonschema without extra packages, and the dashboard sorts
    # runs by these timestamps, so an unparsable one must be caught here.
    for key in ("started_at", "finished_at"):
        value = record.get(key)
        if value is not None:
            try:
                parse_time(value)
            except ValueError:
                raise ResultsError(f"results record is invalid at {key}: {value!r} is not an RFC 3339 "
                                   "date-time.") from None
    seen: set[str] = set()
    for check in record["checks"]:
        if check["id"] in seen:
            raise ResultsError(f"results record is invalid at checks: check id {check['id']!r} appears "
                               "twice.")
        seen.add(check["id"])


def summarize(checks: Iterable[dict]) -> dict[str, int]:
    """The `summary` block for a list of check entries (every outcome present, zero when absent)."""
    summary = dict.fromkeys(OUTCOMES, 0)
    for check in checks:
        summary[check["outcome"]] += 1
    return summary


def new_run_id(now: datetime, target: str) -> str:
    """A unique run id: UTC timestamp, target and a short random suffix, e.g. 20250101T120000Z-rocm-3f9a1c."""
    stamp = (now if now.tzinfo else now.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    safe_target = _SAFE_TARGET.sub("-", target).strip("-") or "unknown"
    return f"{stamp:%Y%m%dT%H%M%SZ}-{safe_target}-{secrets.token_hex(3)}"


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; runs are read by CI and other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _existing_run_id(results: Path) -> str | None:
    if not results.exists():
        return None
    try:
        return json.loads(results.read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        # A file we cannot identify may be another run's evidence: refuse rather than clobber it.
        raise ResultsError(f"{results} exists and is unreadable, so it is not overwritten; move it aside "
                           "first.") from None


def write_run(run_dir: Path, record: dict, junit_xml: str | None, fingerprint: dict) -> Path:
    """Validate `record` and write results.json, fingerprint.json (and junit.xml) into `run_dir`.

    Returns the path of results.json. Rewriting the same run id (e.g. a final write after a partial one) is
    allowed; a run dir holding another run's results is refused with ResultsError.
    """
    validate(record)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    results = run_dir / RESULTS_FILE
    # Locking the directory itself serialises two writers of one run dir without leaving a lock file.
    dir_fd = os.open(run_dir, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
        existing = _existing_run_id(results)
        if existing is not None and existing != record["run_id"]:
            raise ResultsError(f"{run_dir} already holds run {existing!r}, so run {record['run_id']!r} is "
                               "not written there; use a new run directory.")
        _atomic_write(run_dir / FINGERPRINT_FILE, json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")
        if junit_xml is not None:
            _atomic_write(run_dir / JUNIT_FILE, junit_xml)
        _atomic_write(results, json.dumps(record, indent=2) + "\n")
    finally:
        os.close(dir_fd)  # also releases the lock
    return results


def load_run(run_dir: Path) -> dict:
    """Read and validate `run_dir/results.json`; ResultsError (naming the file) when it is missing or bad."""
    path = Path(run_dir) / RESULTS_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path} is missing.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path} cannot be read: {exc}.") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path} is not valid JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno}, "
                           f"column {exc.colno}.") from None
    try:
        validate(record)
    except ResultsError as exc:
        raise ResultsError(f"{path}: {exc}") from None
    return record
