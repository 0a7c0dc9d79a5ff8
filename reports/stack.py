"""What stack a run tested, read from its fingerprint: it lives in `env_checks.stack` (shared with
`conformance`, which files its serving baselines by lineage); this module re-exports it for the reports."""

from __future__ import annotations

from env_checks.record.stack import (
    FingerprintChange,
    StackIdentity,
    diff_fingerprints,
    flatten,
    identify,
    lookup,
    major_minor,
)

__all__ = ["FingerprintChange", "StackIdentity", "diff_fingerprints", "flatten", "identify", "lookup", "major_minor"]
