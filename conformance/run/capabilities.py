"""What each engine under test can show, as data (data/engines.toml), and the `needs` marker of the checks.

A check that needs something only some engines have says so, `@pytest.mark.needs("paged_kv")`, instead of
`if target.engine != "vllm": pytest.skip(...)`; a fixture calls `require(target, "paged_kv")`. On an engine without
the capability the check is skipped, before any of its fixtures starts an engine, with the capability's
`absent` sentence. The plugin registers this module (`register`).

No check module compares the engine's or the target's name with a string (`name_comparisons`, a lint the plugin runs
at collection): what a check needs of the engine is a capability here, an environment gap (a GPU, an ISA, a module)
an expectation (data/expectations/*.toml).

Known failures per platform, as data (expectations/*.toml), applied at collection.

An entry names a check id (a prefix for a skip; the exact id, parameters included, for an xfail), conditions on the
run info (target, engine, dtype, torch_flavour, gcn_arch, cpu_isa, cpu_amx, the serving profile's `sku` and
`model` (profiles.toml: H200, MI300X, cpu; tiny, gpt-oss-120b), `needs_device`: the target's fact in
targets.toml, `missing_modules`: those of the modules the entries name there that this environment cannot import,
and `versions`: distribution -> version specifier, e.g. `{ vllm = "<0.32" }`, which holds when that distribution is
installed at a version the specifier contains) and a status: `xfail` (a known bug: needs a link) or `skip` (an
environment gap or a platform's capability absent: needs a reason). What only some engines can show is no
expectation but a capability (conformance/run/capabilities.py). Entries that match no collected check are reported,
as array-api-tests does, so stale expectations do not linger.

An xfail may carry `match` (a text, or a list of texts): the known bug's failure message contains one of
them. Any other failure of that check (a crash, a hang, another verdict) is then no xfail but a failure,
whose message says so (the hook below): the known bug never hides an unknown one."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from conformance import datafiles
from conformance.verdicts.settings import release_within

# -- expectations ----------------------------------------------------------------------------------------------------


EXPECTATIONS_DIR = resources.files("conformance") / "data" / "expectations"  # package data
NARROWED = pytest.StashKey[tuple[list[str], str]]()  # on an item: (texts its xfail's failure must hold, entry)


def load_expectations(directory: Path = EXPECTATIONS_DIR) -> list[dict[str, Any]]:
    entries = []
    for f in sorted(directory.glob("*.toml")):
        for e in datafiles.load_toml(f).get("expect", []):
            if e.get("status") not in ("xfail", "skip") or "check" not in e:
                raise datafiles.DataError(f"{f}: entry {e} needs `check` and `status` = xfail|skip.")
            if e["status"] == "xfail" and "link" not in e:
                raise datafiles.DataError(f"{f}: xfail entry for {e['check']} needs a bug `link`.")
            for dist, spec in e.get("when", {}).get("versions", {}).items():
                try:
                    SpecifierSet(spec)
                except (InvalidSpecifier, TypeError):
                    raise datafiles.DataError(f"{f}: `versions` of {e['check']}: {dist} = {spec!r} is no version "
                                              f"specifier (such as \"<0.32\").") from None
            if "match" in e and not _texts(e["match"]):
                raise datafiles.DataError(f"{f}: `match` of {e['check']} must be a non-empty text or list of texts.")
            entries.append(e | {"file": f.name})
    return entries


def missing_modules(entries: list[dict[str, Any]] | None = None) -> list[str]:
    """The modules that entries condition on (`when.missing_modules`) which this environment cannot import: an
    optional package a loader needs (transformers' GPTQ loader needs optimum). Found without importing them."""
    entries = load_expectations() if entries is None else entries
    named = {m for e in entries for m in _texts(e.get("when", {}).get("missing_modules", []))}
    return sorted(m for m in named if importlib.util.find_spec(m) is None)


def installed_versions(entries: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """The installed versions of the distributions that entries condition on (`when.versions`); one that is not
    installed is left out, so an entry that names it matches nothing."""
    entries = load_expectations() if entries is None else entries
    named = {d for e in entries for d in e.get("when", {}).get("versions", {})}
    out = {}
    for dist in sorted(named):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _versions_hold(want: dict[str, str], have: dict[str, str]) -> bool:
    """Every named distribution is installed at a version its specifier contains (a local build such as
    0.26.0+hopper counts as its release)."""
    return all(dist in have and release_within(have[dist], spec) for dist, spec in want.items())


def expectation_matches(when: dict[str, Any], run_info: dict[str, Any]) -> bool:
    for key, want in when.items():
        if key == "versions":
            if not _versions_hold(want, run_info.get("versions", {})):
                return False
            continue
        have = run_info.get(key)
        wants = want if isinstance(want, list) else [want]
        haves = have if isinstance(have, list) else [have]
        if not any(w in haves for w in wants):
            return False
    return True


def apply_expectations(items: list[pytest.Item], run_info: dict[str, Any],
                       entries: list[dict] | None = None) -> list[str]:
    """Mark matching items; return descriptions of entries that matched nothing collected."""
    entries = load_expectations() if entries is None else entries
    unmatched = []
    for e in entries:
        if not expectation_matches(e.get("when", {}), run_info):
            continue
        want = _short(e["check"])  # a skip covers a check id prefix; an xfail (a known bug) one exact check id
        hit = [i for i in items if (_short(i.nodeid) == want if e["status"] == "xfail" else
                                    _short(i.nodeid).startswith(want))]
        if not hit:
            unmatched.append(f"{e['file']}: {e['check']}")
        for item in hit:
            if e["status"] == "xfail":
                item.add_marker(pytest.mark.xfail(reason=f"{e.get('reason', 'known bug')} [{e['link']}]",
                                                  strict=False))
                if "match" in e:
                    item.stash[NARROWED] = (_texts(e["match"]), f"{e['file']}: {e['check']}")
            else:
                item.add_marker(pytest.mark.skip(reason=e.get("reason", "not applicable here")))
    return unmatched


def _texts(match: Any) -> list[str]:
    texts = [match] if isinstance(match, str) else list(match) if isinstance(match, list) else []
    return texts if texts and all(isinstance(t, str) and t for t in texts) else []


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: sees the report after pytest's xfail handling
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A narrowed xfail whose failure does not hold its `match` text is reported failed, not xfailed."""
    outcome = yield
    narrowed = item.stash.get(NARROWED, None)
    report = outcome.get_result()
    if narrowed is None or call.excinfo is None or not hasattr(report, "wasxfail"):
        return
    texts, entry = narrowed
    failure = f"{call.excinfo.typename}: {call.excinfo.value}"
    if any(t in failure for t in texts):
        return
    del report.wasxfail
    report.outcome = "failed"
    report.longrepr = (f"not the known bug ({entry}, whose failure holds {' or '.join(map(repr, texts))}), so no "
                       f"xfail: {failure}\n{report.longrepr}")


def _short(node_id: str) -> str:
    """Ids relative to the checks directory, whatever rootdir pytest chose."""
    return node_id.rsplit("/", 1)[-1]


def link_of(message: str) -> str | None:
    m = re.search(r"\[(https?://[^\]]+)\]", message)
    return m.group(1) if m else None


# -- capabilities ----------------------------------------------------------------------------------------------------


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
    """From the plugin's pytest_configure: the marker (strict markers) and this module's hooks (the `needs` skip,
    and the known-failure report: a narrowed xfail hides no other failure)."""
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
