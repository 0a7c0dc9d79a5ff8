"""Failure diagnosis for the reports: the signature catalogue and matcher live in `env_checks.signatures`
(shared with `conformance diagnose` and the kernel-log scan); this module re-exports them."""

from __future__ import annotations

from env_checks.signatures import (
    SIGNATURES_PATH,
    Diagnosis,
    Match,
    Signature,
    SignatureError,
    default_signatures,
    diagnose,
    load_signatures,
    match,
)

__all__ = ["SIGNATURES_PATH", "Diagnosis", "Match", "Signature", "SignatureError", "default_signatures",
           "diagnose", "load_signatures", "match"]
