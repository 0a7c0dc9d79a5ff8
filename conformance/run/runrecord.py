"""The run being recorded: per-check records built from pytest reports, and the results.json body."""

from __future__ import annotations

import datetime as dt
import inspect
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.run.tiers import TIERS

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class CheckRecord:
    id: str
    tier: str
    area: str
    reference: str
    outcome: str = "error"
    duration_s: float = 0.0
    figures: dict[str, float | None] = field(default_factory=dict)
    message: str = ""
    failure_class: str | None = None
    bug_link: str | None = None
    # figure -> {value, kind, source}: the limit each judged figure was held to, as this run judged it
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_id(node_id: str) -> str:
    """The same id for a check whatever rootdir pytest chose: conformance/checks/<module>::<name>."""
    return "conformance/checks/" + node_id.rsplit("/", 1)[-1]


def docstring_field(func: Any, name: str) -> str | None:
    """The text after `Name:` in a check's docstring (continuation lines are indented)."""
    doc = inspect.getdoc(func) or ""
    m = re.search(rf"^{name}:\s*(.+(?:\n[ \t]+.+)*)", doc, flags=re.MULTILINE)
    return " ".join(m.group(1).split()) if m else None


def check_metadata_problems(item: Any) -> list[str]:
    """A check needs one tier marker, a docstring with `Catches:`, a `Reference:` link and `Controls:`, and where it
    judges by data limits a `Limits:` line naming tables the data has (conformance/tooling/check_limits.py)."""
    problems = []
    tiers = [m.name for m in item.iter_markers() if m.name in TIERS]
    if len(tiers) != 1:
        problems.append(f"has {len(tiers)} tier markers (needs exactly one of p0..p3)")
    func = getattr(item, "function", None)
    if not docstring_field(func, "Catches"):
        problems.append("has no 'Catches:' line in its docstring (what failure does it catch?)")
    ref = docstring_field(func, "Reference")
    if not ref or "http" not in ref and "docs/" not in ref:
        problems.append("has no 'Reference:' line with a link")
    from conformance.run import controls

    problems += controls.problems(docstring_field(func, controls.FIELD), inspect.getsourcefile(func) if func else None)
    from conformance import datafiles
    from conformance.tooling import check_limits
    from conformance.tooling.check_catalogue import field_text

    takes = tuple(inspect.signature(func).parameters) if callable(func) else ()
    problems += check_limits.problems(field_text(inspect.getdoc(func) or "", check_limits.FIELD), takes,
                                      Path(datafiles.DATA))
    return problems


def tier_of_item(item: Any) -> str | None:
    """The tier marker of a collected check (None for an item without one)."""
    return next((m.name for m in item.iter_markers() if m.name in TIERS), None)


def area_of(item: Any) -> str:
    module = getattr(item, "module", None)
    area = getattr(module, "AREA", None)
    return area or Path(str(item.fspath)).stem.removeprefix("test_")


PYTEST_TIMEOUT = "Timeout (>"  # how pytest-timeout's own failure (pytest.fail) begins: its only mark


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """The exception and those it was raised from or while handling (a check's pytest.fail inside
    `except EngineError` keeps the engine's exception as its context)."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def classify(outcome: str, message: str, chain: list[BaseException] | None = None) -> str | None:
    """The failure class of a check's outcome: from the type of the exception it failed on (`failure_class` of
    EngineHung, EngineDied, DistributedTimeout, anywhere in its chain), not from its text; pytest-timeout's
    failure, a plain pytest.fail, is known by its own opening words."""
    if outcome == "xfailed":
        return "known_bug"
    if outcome == "failed":
        declared = [c for c in (getattr(e, "failure_class", None) for e in chain or []) if c]
        if declared:
            return declared[0]
        return "timeout" if message.lstrip().startswith(PYTEST_TIMEOUT) else "new_failure"
    if outcome == "error":
        return "could_not_run"
    return None


def summary_of(records: list[CheckRecord]) -> dict[str, int]:
    counts = dict.fromkeys(OUTCOMES, 0)
    for r in records:
        counts[r.outcome] += 1
    return counts
