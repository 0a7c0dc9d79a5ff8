"""The results contract, as the reports read it: it lives in `env_checks.results` (shared with `conformance`,
which writes the runs); this module re-exports it for the history store, the dashboard and the job summary."""

from __future__ import annotations

from env_checks.record.results import (
    CHECKS_LOG,
    FINGERPRINT_FILE,
    JUNIT_FILE,
    OUTCOMES,
    RESULTS_FILE,
    SCHEMA_PATH,
    ResultsError,
    load_run,
    new_run_id,
    parse_time,
    summarize,
    validate,
    write_run,
)

__all__ = ["CHECKS_LOG", "FINGERPRINT_FILE", "JUNIT_FILE", "OUTCOMES", "RESULTS_FILE", "SCHEMA_PATH", "ResultsError",
           "load_run", "new_run_id", "parse_time", "summarize", "validate", "write_run"]
