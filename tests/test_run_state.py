"""No module-level mutable run state in conformance/run/: what a run holds lives on its RunContext (and its
Phases, its server prestart) or on the plugin's RunSession, one per pytest session, so two sessions in one process
(tests call `conformance run` in-process) share nothing and every piece of state is declared in one place.

The rule, read with `ast` from the modules' source: no `global` statement; no module-level lock, event or other
threading object; no module-level container (dict, list, set, or a call making one) that any function of the
module changes (item assignment or deletion, or a changing method: append, update, setdefault, pop …). Constant
tables that nothing changes are data, not state. Each breach is named by file and line; the rule has a negative
control on a module written to `tmp_path`."""

from __future__ import annotations

import ast
from pathlib import Path

RUN = Path(__file__).resolve().parent.parent / "conformance" / "run"
THREADING = {"Lock", "RLock", "Event", "Condition", "Semaphore", "BoundedSemaphore", "Barrier", "local"}
CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter"}
CHANGES = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear", "remove",
           "discard", "appendleft", "popleft"}


def _made(value: ast.expr | None) -> str | None:
    """What a module-level value makes: 'threading', 'container', or None (a constant, a function's result)."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return "container"
    if isinstance(value, ast.Call):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        if name in THREADING:
            return "threading"
        if name in CONTAINERS:
            return "container"
    return None


def breaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = f"{path.parent.name}/{path.name}"
    found: list[str] = []
    containers: dict[str, int] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            made = _made(value)
            if made == "threading":
                found.append(f"{where}:{node.lineno}: {target.id} is a module-level threading object")
            elif made == "container":
                containers[target.id] = node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"{where}:{node.lineno}: global {', '.join(node.names)}")
    for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(func):
            name = None
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
                name = getattr(node.value, "id", None)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CHANGES:
                name = getattr(node.func.value, "id", None)
            if name in containers:
                found.append(f"{where}:{node.lineno}: {func.name} changes the module-level {name} "
                             f"(line {containers[name]})")
    return found


def test_run_holds_no_module_level_mutable_state():
    found = [b for path in sorted(RUN.glob("*.py")) for b in breaches(path)]
    assert found == [], "\n".join(found)


def test_the_rule_names_each_kind_of_module_state(tmp_path):
    module = tmp_path / "run" / "stateful.py"
    module.parent.mkdir()
    module.write_text(
        "import threading\n"
        "TABLE = {'p0': 1}  # a constant table: data\n"
        "_SEEN = {}\n"
        "_DONE = []\n"
        "_LOCK = threading.Lock()\n"
        "_state = None\n"
        "def note(key):\n"
        "    _SEEN[key] = TABLE.get(key)\n"
        "    _DONE.append(key)\n"
        "def reset():\n"
        "    global _state\n"
        "    _state = 1\n")
    assert breaches(module) == [
        "run/stateful.py:5: _LOCK is a module-level threading object",
        "run/stateful.py:11: global _state",
        "run/stateful.py:8: note changes the module-level _SEEN (line 3)",
        "run/stateful.py:9: note changes the module-level _DONE (line 4)",
    ]
