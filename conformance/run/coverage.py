"""What a run judged against what its tiers hold, computed from what ran, never from how the run was asked.

The checks of the run's tiers are read from the check modules' source (every `test_*` function with a tier marker),
so a collection narrowed before pytest ever saw a check (node ids on the command line, `--lf` skipping whole files,
`--ignore`, a plugin) is still measured against the whole tier. Against that:

* **not collected**: a check function of the tiers with no collected item;
* **deselected**: an item of the tiers removed after collection (`-k`, `-m`, `--deselect`, `--lf`, a plugin: every
  one of them goes through pytest's `pytest_deselected` hook);
* **not executed**: an item collected but never run (`-x`, `--maxfail`, `--sw`, `--collect-only`, an interrupt).

A run is platform evidence only when all three are empty (conformance/run/recorder.py `evidence_of`); the record
names each check that did not run (`not_run`) and says why in `evidence_problems`."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from conformance.run.tiers import TIERS

CHECKS_DIR = Path(__file__).resolve().parent.parent / "checks"
# A run whose checks all passed but left checks of its tiers unrun: pytest's exit status for it (the plugin sets it)
# and the exit code of `conformance run` (never 0: it judged only part of its tiers)
NARROWED_STATUS, NARROWED_EXIT = 16, 4
PREFIX = "conformance/checks/"


def _tier_of(decorators: list[ast.expr]) -> str | None:
    """The tier of a `@pytest.mark.pN` among a function's decorators (None without one)."""
    for node in decorators:
        name = node.attr if isinstance(node, ast.Attribute) else None
        if name in TIERS and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            return name
    return None


def tier_functions(tiers: tuple[str, ...], checks_dir: Path = CHECKS_DIR) -> dict[str, str]:
    """Every check function of `tiers`, by id (`conformance/checks/test_x.py::test_y`) -> its tier, read from the
    source of the check modules (nothing is imported)."""
    out: dict[str, str] = {}
    for path in sorted(checks_dir.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                tier = _tier_of(node.decorator_list)
                if tier in tiers:
                    out[f"{PREFIX}{path.name}::{node.name}"] = tier
    return out


def checks_dir(rootdir: Path) -> Path:
    """Where the run's checks live: its rootdir where that holds check modules (`conformance run` sets it to the
    suite's checks; a test runs the plugin over checks of its own), else the suite's checks."""
    return rootdir if any(Path(rootdir).glob("test_*.py")) else CHECKS_DIR


def function_of(check_id: str) -> str:
    """conformance/checks/test_x.py::test_y[param] -> conformance/checks/test_x.py::test_y"""
    return check_id.split("[", 1)[0]


@dataclass
class Ledger:
    """The run's account of its tiers' checks: filled at collection and as reports come, read at the end."""

    expected: dict[str, str] = field(default_factory=dict)  # check function id -> tier
    collected: list[str] = field(default_factory=list)  # check ids of the items that were to run
    deselected: list[str] = field(default_factory=list)  # check ids of the tiers' items removed after collection
    reported: set[str] = field(default_factory=set)  # check ids that got an outcome from running

    def not_collected(self) -> list[str]:
        have = {function_of(c) for c in [*self.collected, *self.deselected]}
        return sorted(f for f in self.expected if f not in have)

    def not_executed(self) -> list[str]:
        return [c for c in self.collected if c not in self.reported]

    def not_run(self) -> list[str]:
        """Every check of the tiers that did not run, each once (a function never collected by its function id)."""
        return sorted({*self.not_collected(), *self.deselected, *self.not_executed()})

    def reasons(self, narrowed_by: str | None = None) -> dict[str, str]:
        """Each check that did not run -> why, in a few words (junit.xml's error message for it)."""
        how = f" ({narrowed_by})" if narrowed_by else ""
        out = {c: "not run: the run stopped before it (interrupted, -x/--maxfail or --sw)" for c in self.not_executed()}
        out |= {c: f"not run: deselected{how}" for c in self.deselected}
        return out | {c: f"not run: never collected{how}" for c in self.not_collected()}

    def problems(self, narrowed_by: str | None = None) -> list[str]:
        """Why the run is not evidence of its whole tiers, one sentence per way it fell short; [] when it is.
        `narrowed_by`: the options that narrowed the run, named beside what they left out."""
        how = f" ({narrowed_by})" if narrowed_by else ""
        out = []
        for what, ids in ((f"were never collected{how}", self.not_collected()),
                          (f"were deselected{how}", sorted(set(self.deselected))),
                          ("were collected but never executed", self.not_executed())):
            if ids:
                shown = ", ".join(i.removeprefix(PREFIX) for i in ids[:3]) + (" …" if len(ids) > 3 else "")
                out.append(f"{len(ids)} check(s) of the run's tiers {what}: {shown}")
        return out


def narrowing_options(option: object, args: list[str], checks_dir: Path = CHECKS_DIR) -> str | None:
    """The options of a run that narrow what it runs, as the user wrote them (for the record and its sentences;
    whether the run is evidence is decided by the Ledger, from what ran, whatever option or plugin narrowed it)."""
    parts = [f"{flag} {value!r}" for flag, value in (("-k", getattr(option, "keyword", "")),
                                                     ("-m", getattr(option, "markexpr", ""))) if value]
    flags = (("--lf", "lf"), ("--sw", "stepwise"), ("--collect-only", "collectonly"), ("-x/--maxfail", "maxfail"))
    parts += [flag for flag, dest in flags if getattr(option, dest, None)]
    parts += [f"--deselect {d}" for d in getattr(option, "deselect", None) or []]
    parts += [f"--ignore {d}" for d in [*(getattr(option, "ignore", None) or []),
                                         *(getattr(option, "ignore_glob", None) or [])]]
    root = str(checks_dir.resolve())
    parts += [a for a in args if str(Path(a.split("::", 1)[0]).resolve()) != root]  # node ids, single modules
    return " ".join(parts) or None
