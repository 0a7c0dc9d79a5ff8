"""Every check of conformance/checks read from its source, without importing it: id, tier, area, capabilities, the
parameters it is collected with where they are written out in the source, and the fields of its docstring.

A check is a `test_*` function of a `test_*.py` module there, marked `@pytest.mark.p0`..`p3`. Its docstring's first
paragraph says what it verifies; `Catches:`, `Reference:`, `Controls:` and `Limits:` lines (continued on indented
lines) say what failure it catches, what it is held to, which tests prove it can fail and which data limits judge
it. Parameters are resolved where they are static: literals in the module, a literal of a module it imports,
`sorted()` of a literal dict, `pytest.param(...)`, and `ids=` written out or computed from such literals; otherwise
the check is listed once with the expression it is parametrized over.

Standard library only: `conformance checks` reads the checks on a bare checkout and in CI."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHECKS_DIR = Path(__file__).resolve().parent.parent / "checks"
TIERS = ("p0", "p1", "p2", "p3")
FIELDS = ("Catches", "Reference", "Controls", "Limits")


def field_text(doc: str, name: str) -> str | None:
    """The text after `Name:` in a docstring (continuation lines are indented), on one line."""
    m = _field(name).search(doc)
    return " ".join(m.group(0).split(":", 1)[1].split()) if m else None


def _field(name: str) -> re.Pattern[str]:
    """`Name:` and its text up to a blank line or the next field (a dedented docstring loses the indent of
    continuation lines)."""
    return re.compile(rf"^{name}:[ \t]*(\S.*|\n[ \t]+\S.*)(?:\n(?!(?:{'|'.join(FIELDS)}):)[ \t]*\S.*)*",
                      flags=re.MULTILINE)


@dataclass(frozen=True)
class CheckEntry:
    """One check as its source declares it."""

    module: str  # test_device.py
    function: str  # test_gemm_numerics
    tier: str  # p0..p3, or "" when the check has no tier marker
    area: str  # the module's AREA, else its stem without test_
    summary: str  # the docstring's first paragraph: what is checked
    details: str  # the rest of the docstring before its fields
    fields: dict[str, str]  # Catches, Reference, Controls, Limits: those present
    params: tuple[str, ...] | None  # the parameter ids where static; None: not parametrized or not static
    parametrized_over: str  # "" or the argnames and the expression of a parametrization not resolved here
    needs: tuple[str, ...] = field(default=())  # capabilities (@pytest.mark.needs)

    @property
    def id(self) -> str:
        return f"conformance/checks/{self.module}::{self.function}"

    def ids(self) -> list[str]:
        """The node ids the check is collected as, where its parameters are static."""
        if self.params is None:
            return [self.id + (f"[{self.parametrized_over}]" if self.parametrized_over else "")]
        return [f"{self.id}[{p}]" for p in self.params]

    def controls(self) -> list[str]:
        text = self.fields.get("Controls", "")
        return [e.strip() for e in re.split(r"[,;]", text) if e.strip()]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "module": self.module, "function": self.function, "tier": self.tier,
                "area": self.area, "parameters": list(self.params) if self.params is not None else None,
                "parametrized_over": self.parametrized_over or None, "needs": list(self.needs),
                "checks": self.summary, "catches": self.fields.get("Catches"),
                "reference": self.fields.get("Reference"), "controls": self.controls(),
                "limits": self.fields.get("Limits")}


class _Unresolved(Exception):
    """A parametrization whose values are not written out in the source."""


def _mark(node: ast.expr) -> tuple[str, ast.Call | None] | None:
    """('p0', None) for `@pytest.mark.p0`, ('parametrize', call) for `@pytest.mark.parametrize(...)`."""
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) and target.value.attr == "mark":
        return target.attr, call
    return None


class _Module:
    """The module-level names of one source file, for static values."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.assigned: dict[str, ast.expr] = {}
        self.imported: dict[str, str] = {}  # local name -> dotted module
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned[node.targets[0].id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def literal(self, name: str) -> Any:
        """A module-level name bound to a literal here, or imported by name from a module of the repository."""
        if name in self.assigned:
            return self.value(self.assigned[name])
        module, _, attr = self.imported.get(name, "").rpartition(".")
        return self._other(module).literal(attr)

    def _other(self, module: str) -> _Module:
        path = self.root / (module.replace(".", "/") + ".py")
        if not module or not path.is_file():
            raise _Unresolved(module)
        return _Module(path, self.root)

    def bound(self, node: ast.expr) -> dict[str, Any]:
        """The literals a comprehension reads, by name (names it binds itself are left to it)."""
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        return {n: self.literal(n) for n in names if n in self.assigned or n in self.imported}

    def comprehension(self, node: ast.ListComp) -> Any:
        try:
            return eval(compile(ast.Expression(node), str(self.path), "eval"),  # noqa: S307 (the repository's source)
                        {"__builtins__": {}, **self.bound(node)})
        except _Unresolved:
            raise
        except Exception as exc:  # a comprehension that needs more than literals
            raise _Unresolved(ast.unparse(node)) from exc

    def value(self, node: ast.expr) -> Any:
        """The value of an expression written out in the source, or _Unresolved."""
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if isinstance(node, ast.Name):
            return self.literal(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.imported:
            return self._other(self.imported[node.value.id]).literal(node.attr)
        if isinstance(node, ast.ListComp):
            return self.comprehension(node)
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
            return {k.value: None for k in node.keys if isinstance(k, ast.Constant)}  # keys only: what ids need
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sorted" \
                and len(node.args) == 1 and not node.keywords:
            return sorted(self.value(node.args[0]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "param":
            ident = next((k.value for k in node.keywords if k.arg == "id"), None)
            return _Param(tuple(self.value(a) for a in node.args),
                          self.value(ident) if ident is not None else None)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e) for e in node.elts]
        raise _Unresolved(ast.unparse(node))

    def ids_from(self, node: ast.expr, count: int) -> list[str]:
        """`ids=`: a list written out, or a comprehension over literals of the module."""
        ids = self.value(node)
        if not isinstance(ids, list) or len(ids) != count:
            raise _Unresolved(ast.unparse(node))
        return [str(i) for i in ids]


@dataclass(frozen=True)
class _Param:
    values: tuple[Any, ...]
    id: str | None


def _idval(value: Any, argname: str, index: int) -> str:
    """pytest's id of one value: strings as they are, numbers, booleans and None by str(), else argname + index."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    return f"{argname}{index}"


def _parametrization(module: _Module, call: ast.Call) -> list[str]:
    """The ids of one `@pytest.mark.parametrize`, or _Unresolved."""
    names = module.value(call.args[0])
    argnames = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    values = module.value(call.args[1])
    values = list(values) if not isinstance(values, dict) else list(values)
    ids_node = next((k.value for k in call.keywords if k.arg == "ids"), None)
    explicit = module.ids_from(ids_node, len(values)) if ids_node is not None else None
    out = []
    for index, value in enumerate(values):
        if isinstance(value, _Param):
            own, value = value.id, value.values if len(argnames) > 1 else value.values[0]
        else:
            own = None
        row = value if len(argnames) > 1 else (value,)
        out.append(own or (explicit[index] if explicit else
                           "-".join(_idval(v, a, index) for v, a in zip(row, argnames))))
    return out


def _entry(module: _Module, node: ast.FunctionDef, area: str) -> CheckEntry:
    tier, needs, params, over = "", [], None, ""
    for deco in node.decorator_list:
        mark = _mark(deco)
        if mark is None:
            continue
        name, call = mark
        if name in TIERS:
            tier = name
        elif name == "needs" and call is not None:
            needs += [a.value for a in call.args if isinstance(a, ast.Constant)]
        elif name == "parametrize" and call is not None:
            try:
                ids = _parametrization(module, call)
                params = ids if params is None else [f"{a}-{b}" for b in params for a in ids]
            except _Unresolved:
                names = call.args[0]
                written = ", ".join(str(e.value) for e in names.elts if isinstance(e, ast.Constant)) \
                    if isinstance(names, (ast.Tuple, ast.List)) else ast.unparse(names).strip("'\"")
                over = f"{written} in {ast.unparse(call.args[1])}"
    doc = ast.get_docstring(node) or ""
    paragraphs = re.split(r"\n\s*\n", doc, maxsplit=1)
    summary = " ".join(paragraphs[0].split())
    rest = paragraphs[1] if len(paragraphs) > 1 else ""
    for name in FIELDS:  # what is left once the fields are out: the docstring's further explanation
        rest = _field(name).sub("", rest)
    details = " ".join(rest.split())
    fields = {name: text for name in FIELDS if (text := field_text(doc, name))}
    return CheckEntry(module.path.name, node.name, tier, area, summary, details, fields,
                      tuple(params) if params is not None and not over else None, over, tuple(needs))


def read_checks(checks_dir: Path = CHECKS_DIR, root: Path | None = None) -> list[CheckEntry]:
    """Every check of `checks_dir`, module by module in name order, each module's checks in source order."""
    root = root or checks_dir.resolve().parents[1]
    out = []
    for path in sorted(checks_dir.glob("test_*.py")):
        module = _Module(path, root)
        area_node = module.assigned.get("AREA")
        area = area_node.value if isinstance(area_node, ast.Constant) else path.stem.removeprefix("test_")
        out += [_entry(module, node, str(area)) for node in module.tree.body
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return out
