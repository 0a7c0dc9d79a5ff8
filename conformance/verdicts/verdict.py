"""The one verdict type: every report a comparison helper returns derives from `Verdict`, so a check says no in
one way (`raise_if_failed`, which raises `CheckFailed`) and records its figures in one way (`figures()`, through
`record_figures`).

Every verdict has the same shape: `problems` (the sentences of what went wrong), `ok` (a property: by default no
problems; a verdict that also fails on having compared nothing says so in its own `ok`), `figures()` (what it
measured, by name) and `failure_message()` (by default the problems joined with "; "; a report whose message
needs a header or the two sides printed below the problems overrides it). This module imports nothing of the
suite, so any floor may use it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn


class CheckFailed(AssertionError):
    """A conformance verdict: the stack disagrees with its reference beyond the tolerance."""


@dataclass(frozen=True)
class FigureLimit:
    """The limit a figure was judged against, as the run judged it: `kind` "max" (the figure must stay at or below
    `value`) or "min" (at or above), and where the value came from. Recorded beside the figure (results.json
    `checks[].limits`), so a kept run reads later exactly as it was judged. `headroom` False: a threshold (a p-value
    floor, a count's or a time's bound) that the figure passes or breaks, whose distance to the figure says nothing of
    the stack (`conformance compare` then calls only a broken limit a regression, never a figure that moved closer)."""

    value: float
    kind: str
    source: str
    headroom: bool = True

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": float(self.value), "kind": self.kind, "source": self.source}
        return out if self.headroom else out | {"headroom": False}


class Verdict:
    """Base of every report dataclass. Subclasses hold `problems` (a list of sentences, or a property that
    derives them) and override `ok`, `figures` or `failure_message` where theirs differ from the default."""

    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def figures(self) -> dict[str, float]:
        return {}

    def limits(self) -> dict[str, FigureLimit]:
        """The limit each judged figure was held to (figure name -> FigureLimit); figures that are counts or inputs
        have none."""
        return {}

    def failure_message(self) -> str:
        return "; ".join(self.problems)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise CheckFailed(self.failure_message())


@dataclass
class Problems(Verdict):
    """A verdict that is just its problems: fails with `headline`, the problems joined with "; ", then `note`.
    What a check judges inline (a floor, a list of mismatches) goes through this instead of a bare assert."""

    problems: list[str] = field(default_factory=list)
    headline: str = ""
    note: str = ""
    judged_by: dict[str, FigureLimit] = field(default_factory=dict)  # figure -> the limit it was held to

    def limits(self) -> dict[str, FigureLimit]:
        return dict(self.judged_by)

    def failure_message(self) -> str:
        return self.headline + "; ".join(self.problems) + self.note


def at_least(value: float, floor: float, sentence: str, figure: str | None = None, source: str = "") -> Problems:
    """`value` at or above `floor`, else `sentence` is the problem; a NaN value fails (NaN >= x is false). With
    `figure`, the verdict's limits() name the floor that figure was held to (and `source`, where it comes from)."""
    judged = {figure: FigureLimit(float(floor), "min", source)} if figure else {}
    return Problems([] if value >= floor else [sentence], judged_by=judged)


def fail(sentence: str) -> NoReturn:
    """A check that cannot reach its verdict (its engine failed, its data is missing) says no in one sentence,
    failing as any verdict does, with `CheckFailed`."""
    __tracebackhide__ = True  # pytest shows the check's line, not this one
    raise CheckFailed(sentence)


def raise_all(*verdicts: Verdict) -> None:
    """Every failed verdict's message in one failure, each under its own header, so a check that judges two
    comparisons (against its twin and against the reference) never hides the second behind the first."""
    __tracebackhide__ = True
    failures = [v.failure_message() for v in verdicts if not v.ok]
    if failures:
        raise CheckFailed("\n".join(failures))


def record_limit(record: Callable[[str, float], Any], name: str, limit: FigureLimit) -> None:
    """The limit a hand-recorded figure was judged by, through the `record_figure` fixture's `limit` (a stand-in
    recorder without one records nothing)."""
    record_limit_of = getattr(record, "limit", None)
    if record_limit_of is not None:
        record_limit_of(name, limit)


def figure_values(report: Verdict | Mapping[str, float]) -> dict[str, float]:
    """A report's figures: a mapping as it is, else the verdict's `figures()`."""
    return dict(report) if isinstance(report, Mapping) else report.figures()


def record_figures(record: Callable[[str, float], Any], report: Verdict | Mapping[str, float],
                   prefix: str = "") -> None:
    """The one way a check records a report's figures: each through the `record_figure` fixture, in order, and
    the limit each was judged by (`Verdict.limits`) through the fixture's `limit` where it has one."""
    for name, value in figure_values(report).items():
        record(f"{prefix}{name}", value)
    if isinstance(report, Verdict):
        for name, limit in report.limits().items():
            record_limit(record, f"{prefix}{name}", limit)
