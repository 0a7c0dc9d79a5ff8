"""The suite's independent fp64 gpt-oss reference and its deliberately wrong variants (mutants).

The names load gpt_oss (and torch) on first use: the verdict helpers import the light kv_model from this package,
and a run whose checks need no reference (platform checks, `--help`) should not pay for importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.reference.gpt_oss import MUTATIONS, Math, Reference

__all__ = ["MUTATIONS", "Math", "Reference"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from conformance.reference import gpt_oss

        return getattr(gpt_oss, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
