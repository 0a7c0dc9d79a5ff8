"""What each engine under test can show, as data (data/engines.toml), and the `needs` marker of the checks.

A check that needs something only some engines have says so, `@pytest.mark.needs("paged_kv")`, instead of
`if target.engine != "vllm": pytest.skip(...)`; a fixture calls `require(target, "paged_kv")`. On an engine without
the capability the check is skipped, before any of its fixtures starts an engine, with the capability's
`absent` sentence. The plugin registers this module (`register`).

No check module compares the engine's or the target's name with a string (`name_comparisons`, a lint the plugin runs
at collection): what a check needs of the engine is a capability here, an environment gap (a GPU, an ISA, a module)
an expectation (data/expectations/*.toml)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA: Path = resources.files("conformance") / "data" / "engines.toml"  # type: ignore[assignment]
MARKER = "needs"
MARKER_LINE = f"{MARKER}(*capabilities): skipped unless the engine under test has them (data/engines.toml)"


class CapabilityError(ValueError):
    """engines.toml is malformed, or a check names a capability it does not declare."""


@dataclass(frozen=True)
class Capabilities:
    engines: dict[str, frozenset[str]]  # engine name -> the capabilities it has
    absent: dict[str, str]              # capability -> the skip sentence, with {engine}

    def has(self, engine: str, capability: str) -> bool:
        self._known(capability)
        return capability in self.engines.get(engine, frozenset())

    def missing(self, engine: str, *needed: str) -> str | None:
        """The skip sentence of the first capability `engine` lacks, or None when it has them all."""
        for capability in needed:
            if not self.has(engine, capability):
                return self.absent[capability].format(engine=engine)
        return None

    def _known(self, capability: str) -> None:
        if capability not in self.absent:
            raise CapabilityError(f"no capability {capability!r} in engines.toml (it declares "
                                  f"{', '.join(sorted(self.absent))}): add a [capabilities.{capability}] table.")


def parse(table: dict[str, Any], where: str = "engines.toml") -> Capabilities:
    """The declarations of one engines.toml; CapabilityError names the first fault in one sentence."""
    caps, engines = table.get("capabilities"), table.get("engines")
    if not isinstance(caps, dict) or not isinstance(engines, dict) or not engines:
        raise CapabilityError(f"{where} needs an [engines.NAME] table per engine and a [capabilities.NAME] table "
                              "per capability.")
    absent: dict[str, str] = {}
    for name, row in caps.items():
        if not isinstance(row, dict) or not isinstance(row.get("absent"), str) or not row["absent"]:
            raise CapabilityError(f"{where} [capabilities.{name}] has no absent sentence (the skip reason).")
        absent[name] = row["absent"]
    have: dict[str, frozenset[str]] = {}
    for name, row in engines.items():
        listed = row.get("capabilities") if isinstance(row, dict) else None
        if not isinstance(listed, list):
            raise CapabilityError(f"{where} [engines.{name}] has no capabilities list.")
        unknown = sorted(set(map(str, listed)) - set(absent))
        if unknown:
            raise CapabilityError(f"{where} [engines.{name}] lists {', '.join(unknown)}, which no "
                                  "[capabilities.NAME] table declares.")
        have[name] = frozenset(listed)
    return Capabilities(have, absent)


@cache
def declared() -> Capabilities:
    try:
        return parse(tomllib.loads(DATA.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise CapabilityError(f"{DATA} is not valid TOML ({exc}): fix that line and run again.") from None


def require(target: Any, capability: str) -> None:
    """Skip the check (from a fixture) when the run's engine (`target.engine`, the RunTarget's) lacks `capability`."""
    reason = declared().missing(target.engine, capability)
    if reason:
        pytest.skip(reason)


def skip_reason(item: Any, engine: str) -> str | None:
    """The skip sentence for a check whose `needs` markers name a capability `engine` lacks."""
    needed = [str(c) for mark in item.iter_markers(MARKER) for c in mark.args]
    return declared().missing(engine, *needed) if needed else None


def register(config: Any) -> None:
    """From the plugin's pytest_configure: the marker (strict markers) and this module's setup hook."""
    config.addinivalue_line("markers", MARKER_LINE)
    config.pluginmanager.register(sys.modules[__name__], "conformance-capabilities")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: Any) -> None:
    """Before the check's fixtures: a missing capability skips it; an undeclared one fails it (one sentence)."""
    from conformance.run.runcontext import ctx_of

    try:
        reason = skip_reason(item, ctx_of(item.config).engine)
    except CapabilityError as exc:
        pytest.fail(str(exc), pytrace=False)
    if reason:
        pytest.skip(reason)


_NAME_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def run_names() -> frozenset[str]:
    """The names a check must not compare with: the engines of engines.toml and the targets of targets.toml."""
    from conformance.run import run_target

    return frozenset(declared().engines) | frozenset(run_target.names())


def name_comparisons(source: str, where: str, names: Iterable[str] | None = None) -> list[str]:
    """One sentence, naming `where`:line, per comparison of a value with an engine or target name in `source`."""
    names = run_names() if names is None else frozenset(names)
    found = []
    compares = (n for n in ast.walk(ast.parse(source, where)) if isinstance(n, ast.Compare))
    for node in sorted(compares, key=lambda n: (n.lineno, n.col_offset)):
        if not all(isinstance(op, _NAME_OPS) for op in node.ops):
            continue
        sides = [node.left, *node.comparators]
        named = sorted({c for side in sides for c in _constants(side)} & names)
        if named and any(not _constants(side) for side in sides):
            found.append(f"{where}:{node.lineno}: `{ast.unparse(node)}` compares with the engine or target name "
                         f"{named[0]!r}: declare a capability the check needs (@pytest.mark.needs, data/engines.toml) "
                         "or an environment gap as an expectation (data/expectations/*.toml) instead "
                         "(docs/adding-a-check.md).")
    return found


def _constants(node: ast.expr) -> list[str]:
    """The string constants `node` is (a literal, or a tuple, list or set of literals); [] for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        values = [v.value for v in node.elts if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        return values if len(values) == len(node.elts) else []
    return []


def other_ways_to_fail(source: str, where: str) -> list[str]:
    """One sentence, naming `where`:line, per bare assert, pytest.fail or raise of a new exception in a check module:
    a check says no through a verdict (`raise_if_failed()`, or `fail(sentence)`), so that its failure is a
    CheckFailed and its class comes from the exception chain (runrecord.classify)."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Assert):
            found.append((node.lineno, "a bare assert"))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.fail":
            found.append((node.lineno, "pytest.fail"))
        elif isinstance(node, ast.Raise) and node.exc is not None:
            found.append((node.lineno, f"raise {ast.unparse(node.exc)}"[:60]))
    return [f"{where}:{line}: {what} says no outside the verdict protocol: use a verdict's raise_if_failed() or "
            "fail(sentence) (conformance/verdicts/verdict.py)." for line, what in sorted(found)]


def run_taken(source: str, where: str) -> list[str]:
    """One sentence, naming `where`:line, per function of a check module (a check, a fixture, an engines_ahead plan)
    that takes the `run` fixture: what a run tests is the frozen `target`; where it writes, `run_dir`; the default
    engine's options, `engine_options`; the perf lineage, `run_lineage` (conformance/run/fixtures.py)."""
    found = [node.lineno for node in ast.walk(ast.parse(source, where))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and any(a.arg == "run" for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs))]
    return [f"{where}:{line}: a check takes `target` (what the run tests), `run_dir`, `engine_options` or "
            "`run_lineage`, not the mutable `run` (docs/adding-a-check.md)." for line in found]


def lint(items: Iterable[Any]) -> list[str]:
    """Over the modules of the collected checks, each named as in the checks' node ids: `name_comparisons` (not
    applicable is a capability or an expectation), `other_ways_to_fail` (a check says no through a verdict) and
    `run_taken` (a check reads the frozen target, not the run's mutable state)."""
    modules = {item.nodeid.split("::", 1)[0]: Path(item.path) for item in items if Path(item.path).suffix == ".py"}
    return [problem for where, path in sorted(modules.items())
            for source in (path.read_text(),)
            for problem in (*name_comparisons(source, where), *other_ways_to_fail(source, where),
                            *run_taken(source, where))]
