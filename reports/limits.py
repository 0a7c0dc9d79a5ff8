"""The limit a measured figure was judged against, as the run recorded it, and nothing else.

Each check of results.json carries the limits it was judged by, ``limits: {figure: {"value": 16.0, "kind": "max",
"source": "tolerances.toml logprobs.bfloat16.max_abs"}}`` (`kind` "max": the figure must stay at or below the value;
"min": at or above). The dashboard shows those, never the suite's data files as they are today: a kept run reads
later exactly as it was judged, however the data have moved since. A check whose record carries no `limits` (a run
written before results.json recorded them) has its limits **not recorded**: its figures are shown without one and
trends plot no limit line for it. An empty `limits` ({}) says the check was judged by no limit on a figure (its
figures are inputs or counts).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

LIMIT_KINDS = ("max", "min")
NOT_RECORDED = "limit not recorded"


@dataclass(frozen=True)
class Limit:
    """A figure's limit: `value`, whether the figure must stay at or below it ("max") or at or above it ("min"), and
    where it came from when the run was judged."""

    value: float
    kind: str
    source: str
    headroom: bool = True  # False: a threshold only; a move towards it is no regression (reports/upgrade_diff.py)

    def holds(self, figure: float) -> bool:
        return figure <= self.value if self.kind == "max" else figure >= self.value

    def describe(self) -> str:
        return f"{'≤' if self.kind == 'max' else '≥'} {self.value:g} ({self.source})"

    def as_record(self) -> dict[str, object]:
        out: dict[str, object] = {"value": self.value, "kind": self.kind, "source": self.source}
        return out if self.headroom else out | {"headroom": False}


class HasLimits(Protocol):
    """A stored check (`records.CheckRow`): the limits its run recorded for it, None when it recorded none."""

    @property
    def limits(self) -> Mapping[str, Limit] | None: ...


def parse_limits(raw: object) -> dict[str, Limit] | None:
    """The limits of one check's record (its `limits` field): None when the record has none (not recorded); an entry
    that is not {value: number, kind: max|min, source} is left out rather than shown as a limit it was not."""
    if not isinstance(raw, Mapping):
        return None
    out: dict[str, Limit] = {}
    for figure, entry in raw.items():
        if not isinstance(entry, Mapping):
            continue
        value, kind = entry.get("value"), entry.get("kind")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or kind not in LIMIT_KINDS:
            continue
        out[str(figure)] = Limit(float(value), str(kind), str(entry.get("source") or "source not recorded"),
                                 entry.get("headroom") is not False)
    return out


def limits_json(raw: object) -> str | None:
    """What the history store keeps of a check's `limits` (JSON; NULL when not recorded)."""
    limits = parse_limits(raw)
    return None if limits is None else json.dumps({k: v.as_record() for k, v in sorted(limits.items())},
                                                  sort_keys=True)


def limits_from_json(text: str | None) -> dict[str, Limit] | None:
    return None if text is None else parse_limits(json.loads(text))


def limit_of(check: HasLimits, figure: str) -> Limit | None:
    """The limit `figure` of `check` was judged against, as its run recorded it; None where it recorded none (see
    `recorded` for whether the check recorded limits at all)."""
    return (check.limits or {}).get(figure)


def recorded(check: HasLimits) -> bool:
    """Whether the check's run recorded the limits it was judged by (False: written before results.json did)."""
    return check.limits is not None
