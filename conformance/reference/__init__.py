"""The suite's independent fp64 gpt-oss reference and its deliberately wrong variants (mutants)."""

from conformance.reference.gpt_oss import MUTATIONS, Math, Reference

__all__ = ["MUTATIONS", "Math", "Reference"]
