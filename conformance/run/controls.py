"""The `Controls:` line of a check's docstring: the negative controls in tests/ that run the check's own
body against known-bad input and see it fail. The plugin lints it like `Catches:` and `Reference:`;
the suite's tests replace each check body with `pass` and require its controls to fail then."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

FIELD = "Controls"
_ENTRY = re.compile(r"^(tests/[\w/]+\.py)::(test_\w+)$")


def parse(text: str | None) -> list[tuple[str, str]] | str:
    """The (file, function) pairs of a `Controls:` value, or one sentence saying what is wrong with it."""
    if not text:
        return f"has no '{FIELD}:' line in its docstring (which tests prove it can fail?)"
    pairs = []
    for entry in (e.strip() for e in re.split(r"[,;]", text)):
        if not entry:
            continue
        m = _ENTRY.match(entry)
        if not m:
            return f"has a '{FIELD}:' entry {entry!r} that is not tests/<file>.py::<test function>"
        pairs.append((m.group(1), m.group(2)))
    return pairs or f"has an empty '{FIELD}:' line"


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


def problems(text: str | None, check_file: str | Path | None) -> list[str]:
    """Why a check's `Controls:` value does not name controls that exist (empty when it does)."""
    pairs = parse(text)
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
def declared(checks_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Every check of conformance/checks read from source (no import): 'module.py::check' -> its controls."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(checks_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = ast.get_docstring(node) or ""
                m = re.search(rf"^{FIELD}:\s*(.+(?:\n[ \t]+.+)*)", doc, flags=re.MULTILINE)
                pairs = parse(" ".join(m.group(1).split()) if m else None)
                out[f"{path.name}::{node.name}"] = pairs if isinstance(pairs, list) else []
    return out
