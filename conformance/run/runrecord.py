"""The run being recorded: per-check records built from pytest reports, and the results.json body.

The `Controls:` line of a check's docstring: the negative controls in tests/ that run the check's own
body against known-bad input and see it fail. The plugin lints it like `Catches:` and `Reference:`;
the suite's tests replace each check body with `pass` and require its controls to fail then.

What a run judged against what its tiers hold, computed from what ran, never from how the run was asked.

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
import datetime as dt
import functools
import inspect
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.run.run_target import TIERS

# -- controls --------------------------------------------------------------------------------------------------------


CONTROLS_FIELD = "Controls"
_ENTRY = re.compile(r"^(tests/[\w/]+\.py)::(test_\w+)$")


def parse_controls(text: str | None) -> list[tuple[str, str]] | str:
    """The (file, function) pairs of a `Controls:` value, or one sentence saying what is wrong with it."""
    if not text:
        return f"has no '{CONTROLS_FIELD}:' line in its docstring (which tests prove it can fail?)"
    pairs = []
    for entry in (e.strip() for e in re.split(r"[,;]", text)):
        if not entry:
            continue
        m = _ENTRY.match(entry)
        if not m:
            return f"has a '{CONTROLS_FIELD}:' entry {entry!r} that is not tests/<file>.py::<test function>"
        pairs.append((m.group(1), m.group(2)))
    return pairs or f"has an empty '{CONTROLS_FIELD}:' line"


def checkout_root(check_file: str | Path) -> Path | None:
    """The source checkout holding a check module (conformance/checks/x.py), when its tests/ are there;
    None for an installed package, where the controls cannot be looked up."""
    root = Path(check_file).resolve().parents[2]
    return root if (root / "tests").is_dir() and (root / "pyproject.toml").is_file() else None


@functools.cache
def _functions_in(path: Path) -> frozenset[str]:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    return frozenset(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def controls_problems(text: str | None, check_file: str | Path | None) -> list[str]:
    """Why a check's `Controls:` value does not name controls that exist (empty when it does)."""
    pairs = parse_controls(text)
    if isinstance(pairs, str):
        return [pairs]
    root = checkout_root(check_file) if check_file else None
    if root is None:
        return []
    out = []
    for file, func in pairs:
        if not (root / file).is_file():
            out.append(f"names the control {file}::{func}, but {file} does not exist")
        elif func not in _functions_in(root / file):
            out.append(f"names the control {file}::{func}, but {file} defines no {func}")
    return out


@functools.cache
def declared_controls(checks_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Every check of conformance/checks read from source (no import): 'module.py::check' -> its controls."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(checks_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = ast.get_docstring(node) or ""
                m = re.search(rf"^{CONTROLS_FIELD}:\s*(.+(?:\n[ \t]+.+)*)", doc, flags=re.MULTILINE)
                pairs = parse_controls(" ".join(m.group(1).split()) if m else None)
                out[f"{path.name}::{node.name}"] = pairs if isinstance(pairs, list) else []
    return out


# -- coverage --------------------------------------------------------------------------------------------------------


CHECKS_DIR = Path(__file__).resolve().parent.parent / "checks"
# A run whose checks all passed but left checks of its tiers unrun: pytest's exit status for it (the plugin sets it)
# and the exit code of `conformance run` (never 0: it judged only part of its tiers)
NARROWED_STATUS, NARROWED_EXIT = 16, 4
CHECKS_PREFIX = "conformance/checks/"


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
                    out[f"{CHECKS_PREFIX}{path.name}::{node.name}"] = tier
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
                shown = ", ".join(i.removeprefix(CHECKS_PREFIX) for i in ids[:3]) + (" …" if len(ids) > 3 else "")
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


# -- runrecord -------------------------------------------------------------------------------------------------------


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

    problems += controls_problems(docstring_field(func, CONTROLS_FIELD), inspect.getsourcefile(func) if func else None)
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
