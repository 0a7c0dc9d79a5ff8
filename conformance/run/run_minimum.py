"""The least a run must have passed to count as a pass (data/run_minimum.toml): a run whose selected checks
all skipped judged nothing, and a P0 run without its identity, engine, parity and tokenizer verdicts is no
gate. The plugin turns a shortfall into a failed run with one sentence."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conformance import datafiles


def minimum() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "run_minimum.toml")


def _name(check_id: str) -> str:
    """conformance/checks/test_x.py::test_y[param] -> test_x.py::test_y"""
    return check_id.rsplit("/", 1)[-1].split("[", 1)[0]


def shortfall(records: Iterable[Any], table: dict[str, Any] | None = None) -> str | None:
    """One sentence saying what the run lacks, or None. records: CheckRecord-like (id, tier, outcome)."""
    table = table if table is not None else minimum()
    records = list(records)
    if records and not any(r.outcome == "passed" for r in records):
        outcomes = sorted({r.outcome for r in records})
        return (f"no check passed ({len(records)} selected, all {'/'.join(outcomes)}): a run that judged nothing "
                "is not a pass.")
    for tier in sorted({r.tier for r in records}):
        rule = table.get(tier, {})
        mine = [r for r in records if r.tier == tier]
        passed = sum(r.outcome == "passed" for r in mine)
        if passed < int(rule.get("min_passed", 0)):
            return (f"{tier.upper()}: {passed} of {len(mine)} selected checks passed, at least "
                    f"{rule['min_passed']} must (data/run_minimum.toml): a tier that judged nothing is not a pass.")
        by_name: dict[str, list[str]] = {}
        for r in mine:
            by_name.setdefault(_name(r.id), []).append(r.outcome)
        unmet = [f"{name} ({'/'.join(sorted(set(by_name[name])))})" for name in rule.get("required", [])
                 if name in by_name and not all(o in ("passed", "xfailed") for o in by_name[name])]
        if unmet:
            return (f"{tier.upper()} requires {', '.join(unmet)} to pass (data/run_minimum.toml): without "
                    "them the tier is no verdict.")
    return None
