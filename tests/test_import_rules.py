"""The import rule of docs/architecture.md, held against the code.

Every import of `conformance/`, `env_checks/` and `reports/` is read with `ast`: at the top of a module, under
`if TYPE_CHECKING:`, or inside a function (a lazy import is an arrow all the same), and `importlib.import_module`
or `__import__` of a literal name too. The rules:

1. the wings of `conformance/` stand on the floors of `FLOORS`, ground floor first: a wing imports only wings on
   floors below its own;
2. no module imports one that imports it back, through any chain (no import cycle);
3. `env_checks/`, `conformance/datafiles.py` and `conformance/tooling/` import nothing beyond the standard library
   (and its own modules) when they are imported: they run on a bare runner and from a checkout not installed;
4. `env_checks` imports no other package of the repository; `reports` imports `env_checks` only; `conformance`
   imports `env_checks`, and `reports` only at its two doors (`DOORS`), lazily.

A breach is named by file and line. Each rule has a negative control on a small tree written to `tmp_path`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conformance", "env_checks", "reports")

# The wings of conformance/ (sub-packages, and its top-level modules), ground floor first; wings on one floor import
# none of each other. In words: docs/architecture.md "The wings of `conformance/`, ground floor first".
FLOORS: tuple[tuple[str, ...], ...] = (
    ("datafiles", "tooling"),
    ("engines",),
    ("monitor", "reference"),
    ("verdicts",),
    ("checkpoints",),
    ("distributed",),
    ("run",),
    ("checks", "lab"),
    ("__main__",),
)
# Which packages of the repository each one may import (docs/architecture.md "The import rule, and its two doors").
PACKAGE_IMPORTS = {"env_checks": set(), "reports": {"env_checks"}, "conformance": {"env_checks"}}
# The two doors from conformance to reports, each a lazy import: the CLI's dashboard and baseline commands, and the
# P2 serving check's reading of the history store.
DOORS = {("conformance/run/cli.py", "reports"), ("conformance/checks/test_serving_perf.py", "reports")}
# Modules that import the standard library only (and their own package) when they are imported.
STDLIB_ONLY = ("env_checks", "conformance.datafiles", "conformance.tooling")
BACKPORTS = {"tomli"}  # tomllib's backport, imported on Python 3.10 only
# Breaches that work under way removes, by file and what it imports;
# they are left out of the rules above, and an entry that names no import any more fails, so the list only shrinks.
PENDING: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    file: str  # relative to the root, with /
    line: int
    importer: str  # dotted name of the importing module
    target: str  # dotted name imported: the module where one of the walk is named, else what the code wrote
    lazy: bool  # inside a function: made when it runs, not when the module is imported
    typing_only: bool  # under `if TYPE_CHECKING:`

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _written(node: ast.AST, package: str) -> Iterator[str]:
    """The dotted names one node imports, as written (a relative import resolved against `package`)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        yield from (f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names)
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__"):
            yield node.args[0].value


def _walk(node: ast.AST, lazy: bool, typing_only: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
    for child in ast.iter_child_nodes(node):
        yield child, lazy, typing_only
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for part in child.body:
                yield part, lazy, True
                yield from _walk(part, lazy, True)
            for part in child.orelse:
                yield part, lazy, typing_only
                yield from _walk(part, lazy, typing_only)
        else:
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _walk(child, inner, typing_only)


def read_imports(root: Path, packages: Iterable[str] = PACKAGES) -> list[Import]:
    """Every import of the packages under `root`, each resolved to a module of theirs where it names one."""
    files = sorted(p for name in packages for p in (root / name).rglob("*.py") if "__pycache__" not in p.parts)
    modules = {module_name(p, root) for p in files}
    found = []
    for path in files:
        importer = module_name(path, root)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node, lazy, typing_only in _walk(ast.parse(path.read_text(), str(path)), False, False):
            for name in _written(node, package):
                # `from a import b`: b is a module of a, or a name defined in a
                target = name if name in modules or isinstance(node, ast.Import) else name.rpartition(".")[0] or name
                found.append(Import(path.relative_to(root).as_posix(), node.lineno, importer, target, lazy,
                                    typing_only))
    return found


def wing(module: str) -> str | None:
    """The wing of a module of conformance: its sub-package or top-level module (None: the package itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "conformance" and len(parts) > 1 else None


def floor_breaches(imports: Iterable[Import], floors: tuple[tuple[str, ...], ...] = FLOORS) -> list[str]:
    floor = {w: n for n, names in enumerate(floors) for w in names}
    breaches = []
    for imp in imports:
        src, dst = wing(imp.importer), wing(imp.target)
        if src is None or dst is None or src == dst:
            continue
        for name in (src, dst):
            if name not in floor:
                breaches.append(f"{imp.where()}: conformance/{name} stands on no floor: add it to FLOORS "
                                "and to docs/architecture.md")
        if src in floor and dst in floor and floor[dst] >= floor[src]:
            breaches.append(f"{imp.where()}: {src} (floor {floor[src]}) imports {imp.target} of {dst} "
                            f"(floor {floor[dst]}){' lazily' if imp.lazy else ''}")
    return breaches


def cycles(imports: Iterable[Import]) -> list[str]:
    """Each loop of modules that import each other (a strongly connected component), with its arrows."""
    edges: dict[str, dict[str, list[Import]]] = {}
    for imp in imports:
        edges.setdefault(imp.importer, {}).setdefault(imp.target, []).append(imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            loop = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                loop.append(member)
                if member == node:
                    break
            if len(loop) > 1 or node in edges.get(node, {}):
                loops.append(sorted(loop))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [", ".join(loop) + ": " + "; ".join(f"{i.where()} imports {i.target}" for a in loop
                                              for b in loop for i in edges.get(a, {}).get(b, []))
            for loop in loops]


def package_breaches(imports: Iterable[Import]) -> list[str]:
    breaches = []
    for imp in imports:
        src, dst = imp.importer.split(".")[0], imp.target.split(".")[0]
        if dst not in PACKAGE_IMPORTS or dst == src or dst in PACKAGE_IMPORTS[src]:
            continue
        if (imp.file, dst) in DOORS and imp.lazy:
            continue
        door = " outside a function" if (imp.file, dst) in DOORS else ""
        breaches.append(f"{imp.where()}: {src} imports {imp.target}{door}")
    return breaches


def stdlib_breaches(imports: Iterable[Import], stdlib_only: Iterable[str] = STDLIB_ONLY) -> list[str]:
    allowed = set(sys.stdlib_module_names) | BACKPORTS | {"__future__"}
    breaches = []
    for own in stdlib_only:
        for imp in imports:
            if imp.lazy or imp.typing_only or not (imp.importer == own or imp.importer.startswith(own + ".")):
                continue
            if imp.target.split(".")[0] not in allowed and not (imp.target == own or imp.target.startswith(own + ".")):
                breaches.append(f"{imp.where()}: {own} imports {imp.target} when it is imported")
    return breaches


ALL_IMPORTS = read_imports(ROOT)
IMPORTS = [i for i in ALL_IMPORTS if (i.file, i.target) not in PENDING]


def test_the_walk_reads_every_package_and_lazy_imports():
    assert {i.file.split("/")[0] for i in IMPORTS} == set(PACKAGES)
    assert any(i.lazy for i in IMPORTS) and any(i.typing_only for i in IMPORTS)


def test_pending_breaches_are_still_there():
    stale = sorted(set(PENDING) - {(i.file, i.target) for i in ALL_IMPORTS})
    assert not stale, f"these imports are gone: take them out of PENDING: {stale}"


RULES = {  # what the tree keeps, each rule naming its breaches by file and line
    "every_wing_imports_only_wings_on_floors_below_it": floor_breaches,
    "no_module_imports_one_that_imports_it_back": cycles,
    "env_checks_datafiles_and_tooling_import_the_standard_library_only": stdlib_breaches,
    "conformance_and_reports_meet_at_the_two_doors_only": package_breaches,
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_tree_keeps_the_rule(rule):
    breaches = RULES[rule](IMPORTS)
    assert not breaches, "\n".join(breaches)


def test_the_floors_are_every_wing_of_conformance_once():
    wings = {p.stem if p.is_file() else p.name for p in (ROOT / "conformance").iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    named = [w for names in FLOORS for w in names]
    assert sorted(named) == sorted(wings)


# Negative controls: a small tree with each breach, which the rules must name by file and line.

def _tree(tmp_path: Path, files: dict[str, str]) -> list[Import]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_imports(tmp_path)


def test_a_lazy_import_up_a_floor_is_named_by_file_and_line(tmp_path):
    imports = _tree(tmp_path, {
        "conformance/__init__.py": "",
        "conformance/engines/__init__.py": "",
        "conformance/engines/base.py": "import os\n\n\ndef f():\n    from conformance.verdicts import compare\n",
        "conformance/verdicts/__init__.py": "",
        "conformance/verdicts/compare.py": "from conformance.engines.base import f\n",
    })
    assert floor_breaches(imports) == [
        "conformance/engines/base.py:5: engines (floor 1) imports conformance.verdicts.compare of verdicts (floor 3)"
        " lazily"]
    assert cycles(imports) == [
        "conformance.engines.base, conformance.verdicts.compare: conformance/engines/base.py:5 imports "
        "conformance.verdicts.compare; conformance/verdicts/compare.py:1 imports conformance.engines.base"]


def test_a_string_import_and_a_wing_on_no_floor_are_named(tmp_path):
    imports = _tree(tmp_path, {
        "conformance/__init__.py": "",
        "conformance/engines/__init__.py": "",
        "conformance/engines/base.py": "import importlib\n\nimportlib.import_module('conformance.run.plugin')\n",
        "conformance/run/__init__.py": "",
        "conformance/run/plugin.py": "",
        "conformance/attic.py": "from . import engines\n",
    })
    assert floor_breaches(imports) == [
        "conformance/attic.py:1: conformance/attic stands on no floor: add it to FLOORS and to docs/architecture.md",
        "conformance/engines/base.py:3: engines (floor 1) imports conformance.run.plugin of run (floor 6)"]


def test_a_third_party_import_at_import_and_a_door_left_open_are_named(tmp_path):
    imports = _tree(tmp_path, {
        "env_checks/__init__.py": "",
        "env_checks/probe.py": "import json\nimport yaml\nfrom env_checks import facts\n\n\ndef f():\n"
                               "    import jsonschema\n",
        "env_checks/facts.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
        "conformance/__init__.py": "",
        "conformance/run/__init__.py": "",
        "conformance/run/cli.py": "from reports import dashboard\n",
        "conformance/run/plugin.py": "def f():\n    import reports.history\n",
        "reports/__init__.py": "",
        "reports/dashboard.py": "from conformance.run import cli\n",
        "reports/history.py": "",
    })
    assert stdlib_breaches(imports) == ["env_checks/probe.py:2: env_checks imports yaml when it is imported"]
    assert package_breaches(imports) == [
        "conformance/run/cli.py:1: conformance imports reports.dashboard outside a function",
        "conformance/run/plugin.py:2: conformance imports reports.history",
        "reports/dashboard.py:1: reports imports conformance.run.cli"]
