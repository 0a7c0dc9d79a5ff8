"""Mutation testing of the checks' bodies, as a pytest plugin of the suite's own tests.

Every check in conformance/checks/ names its controls (`Controls: tests/test_x.py::test_y` in its
docstring). After a control passes, the plugin runs it again once per check that names it, with that
check's body replaced by `pass` at the AST level (the function's code object is swapped in place, so
every alias the control imported sees the mutant). The control must now fail: a control that still
passes does not exercise the check's own verdict, and fails with a sentence that says so. The terminal
summary prints the mutation score over the checks whose controls ran.

`--no-check-mutation` turns the reruns off (a quick local run)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.run import runrecord

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "conformance" / "checks"
PROP = "check-mutation"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-check-mutation", action="store_true",
                     help="do not rerun each check's controls against the check with its body replaced by pass")


def checks_by_control() -> dict[tuple[str, str], list[str]]:
    """(tests/file.py, control function) -> the checks ('module.py::check') that name it."""
    out: dict[tuple[str, str], list[str]] = {}
    for check, pairs in runrecord.declared_controls(CHECKS).items():
        for pair in pairs:
            out.setdefault(pair, []).append(check)
    return out


def mutated_code(module_file: Path, name: str) -> types.CodeType:
    """The code of `name` in `module_file` with its body replaced by `pass` (the docstring kept)."""
    tree = ast.parse(module_file.read_text(), filename=str(module_file))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            doc = node.body[:1] if ast.get_docstring(node) is not None else []
            node.body = [*doc, ast.Pass()]
            break
    else:
        raise LookupError(f"{module_file.name} defines no function {name}")
    tree = ast.fix_missing_locations(tree)
    code = compile(tree, str(module_file), "exec")
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == name:
            return const
    raise LookupError(f"no code object for {name} in {module_file.name}")


@contextlib.contextmanager
def mutant(check: str) -> Iterator[None]:
    """The check ('module.py::name') with its body replaced by `pass` while the block runs."""
    module_name, func_name = check.split("::")
    module = importlib.import_module(f"conformance.checks.{module_name.removesuffix('.py')}")
    func = getattr(module, func_name)
    original = func.__code__
    func.__code__ = mutated_code(CHECKS / module_name, func_name)
    try:
        yield
    finally:
        func.__code__ = original


_MAP: dict[tuple[str, str], list[str]] = {}


def _checks_for(item: pytest.Item) -> list[str]:
    if not _MAP:
        _MAP.update(checks_by_control())
    path = Path(str(item.path)).resolve()
    try:
        rel = path.relative_to(ROOT).as_posix()
    except ValueError:
        return []
    return _MAP.get((rel, getattr(item, "originalname", item.name)), [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield  # the control itself, unmutated: it raises here when it fails
    if item.config.getoption("--no-check-mutation"):
        return result
    survived = []
    for check in _checks_for(item):
        with mutant(check):
            try:
                item.runtest()
            except pytest.skip.Exception:
                killed = False
            except (Exception, pytest.fail.Exception):
                killed = True
            else:
                killed = False
        item.user_properties.append((PROP, (check, killed)))
        if not killed:
            survived.append(check)
    if survived:
        pytest.fail(f"with the body of {', '.join(survived)} replaced by `pass` this control still passes: it does "
                    "not exercise that check's own verdict", pytrace=False)
    return result


def score(reports: list[pytest.TestReport]) -> tuple[dict[str, bool], set[str]]:
    """Per check whose controls ran: killed by at least one; and the checks none of whose controls ran."""
    killed: dict[str, bool] = {}
    for report in reports:
        for key, value in getattr(report, "user_properties", ()):
            if key == PROP:
                check, dead = value
                killed[check] = killed.get(check, False) or bool(dead)
    return killed, set(runrecord.declared_controls(CHECKS)) - set(killed)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if config.getoption("--no-check-mutation"):
        return
    reports = [r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])
               if getattr(r, "when", "") == "call"]
    killed, not_run = score(reports)
    if not killed:
        return
    dead = sum(killed.values())
    terminalreporter.write_sep("-", "check mutation score")
    terminalreporter.write_line(f"check mutation score: {dead}/{len(killed)} checks killed "
                                f"({100 * dead / len(killed):.0f}%) with each body replaced by `pass`; "
                                f"{len(not_run)} checks whose controls did not run in this session")
    for check in sorted(c for c, k in killed.items() if not k):
        terminalreporter.write_line(f"  survived: {check}")
