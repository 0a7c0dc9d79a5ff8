"""The one verdict type: every report a comparison helper returns derives from `Verdict`, so a check says no in
one way (`raise_if_failed`) and records its figures in one way (`figures()`, through `record_figures`).

A report lists what went wrong in `problems` and says whether it passed in `ok`; its failure message is
`failure_message()`, by default the problems joined with "; ". A report whose message needs a header or the
two sides printed below the problems overrides `failure_message`. This module imports nothing of the suite, so
any floor may use it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


class CheckFailed(AssertionError):
    """A conformance verdict: the stack disagrees with its reference beyond the tolerance."""


class Verdict:
    """Mixin for report dataclasses. Subclasses provide `problems` (a list of sentences) and `ok` (a property
    or a field: some verdicts carry a computed pass/fail of their own, which is why this base does not define
    it). `failure` is the exception raised; a few legacy verdicts raise a plain AssertionError."""

    failure: ClassVar[type[AssertionError]] = CheckFailed
    problems: list[str]
    ok: bool

    def failure_message(self) -> str:
        return "; ".join(self.problems)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise self.failure(self.failure_message())


@dataclass
class Problems(Verdict):
    """A verdict that is just its problems: fails with `headline`, the problems joined with "; ", then `note`.
    What a check judges inline (a floor, a list of mismatches) goes through this instead of a bare assert."""

    problems: list[str] = field(default_factory=list)
    headline: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def failure_message(self) -> str:
        return self.headline + "; ".join(self.problems) + self.note


def at_least(value: float, floor: float, sentence: str) -> Problems:
    """`value` at or above `floor`, else `sentence` is the problem; a NaN value fails (NaN >= x is false)."""
    return Problems([] if value >= floor else [sentence])


def figure_values(report: Any) -> dict[str, float]:
    """A report's figures: a mapping as it is, else its `figures` (a method or a dict field); none: empty."""
    if isinstance(report, Mapping):
        return dict(report)
    figures = getattr(report, "figures", None)
    if figures is None:
        return {}
    return dict(figures() if callable(figures) else figures)


def record_figures(record: Callable[[str, float], Any], report: Any, prefix: str = "") -> None:
    """The one way a check records a report's figures: each through the `record_figure` fixture, in order."""
    for name, value in figure_values(report).items():
        record(f"{prefix}{name}", value)
