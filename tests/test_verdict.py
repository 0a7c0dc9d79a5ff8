"""The one verdict type: every Verdict subclass in conformance/ has the same shape (`ok` a property, `problems`
a list, `figures()` a method, `failure_message()`) and fails with CheckFailed; floors fail below (and on NaN);
`record_figures` records a verdict's figures or a mapping."""

import dataclasses
import importlib
import inspect
import math
import re
from pathlib import Path

import pytest

from conformance.checkpoints.fit import FitVerdict
from conformance.verdicts import compare
from conformance.verdicts.verdict import CheckFailed, Problems, Verdict, at_least, fail, record_figures

ROOT = Path(__file__).resolve().parents[1]
VERDICT_CLASS = re.compile(r"^class (\w+)\((?:\w+\.)?Verdict\)", re.M)


def declared_verdicts() -> dict[str, str]:
    """Every `class X(Verdict)` in conformance/, by name, with the module that declares it."""
    found = {}
    for path in sorted((ROOT / "conformance").rglob("*.py")):
        for name in VERDICT_CLASS.findall(path.read_text()):
            found[name] = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return found


def all_subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *all_subclasses(sub))]


def protocol_problems(cls: type) -> list[str]:
    problems = []
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if "ok" in fields or not isinstance(inspect.getattr_static(cls, "ok"), property):
        problems.append("ok is not a property")
    for method in ("figures", "failure_message"):
        if method in fields or not inspect.isfunction(inspect.getattr_static(cls, method, None)):
            problems.append(f"{method} is not a method")
    if cls.raise_if_failed is not Verdict.raise_if_failed:
        problems.append("overrides raise_if_failed (every verdict fails with CheckFailed)")
    if not isinstance(inspect.getattr_static(cls, "problems", None), property) and \
            str(getattr(fields.get("problems"), "type", None)) != "list[str]":
        problems.append("problems is neither a list[str] field nor a property")
    return problems


def test_every_verdict_in_conformance_has_the_one_shape():
    declared = declared_verdicts()
    for module in set(declared.values()):
        importlib.import_module(module)
    subclasses = {c.__name__: c for c in all_subclasses(Verdict) if c.__module__.startswith("conformance.")}
    assert set(declared) <= set(subclasses), f"declared but not found: {set(declared) - set(subclasses)}"
    assert len(subclasses) >= 16, sorted(subclasses)
    bad = {name: p for name, cls in subclasses.items() if (p := protocol_problems(cls))}
    assert not bad, bad


def test_the_protocol_check_refuses_a_field_ok_a_dict_figures_and_its_own_failure():
    @dataclasses.dataclass
    class Legacy(Verdict):
        ok: bool = True  # type: ignore[assignment]
        figures: dict[str, float] = dataclasses.field(default_factory=dict)  # type: ignore[assignment]

        def raise_if_failed(self) -> None:
            assert self.ok, "plain"

    assert protocol_problems(Legacy) == ["ok is not a property", "figures is not a method",
                                         "overrides raise_if_failed (every verdict fails with CheckFailed)",
                                         "problems is neither a list[str] field nor a property"]


def test_check_failed_is_re_exported_from_compare():
    assert compare.CheckFailed is CheckFailed


def test_a_floor_fails_below_it_and_on_nan_with_its_sentence():
    at_least(10.0, 10.0, "unused").raise_if_failed()
    with pytest.raises(CheckFailed, match=r"^copy bandwidth 9 GB/s is below the floor 10$"):
        at_least(9.0, 10.0, "copy bandwidth 9 GB/s is below the floor 10").raise_if_failed()
    assert not at_least(math.nan, 1.0, "nan").ok


def test_problems_fail_with_headline_joined_problems_and_note():
    Problems([]).raise_if_failed()
    with pytest.raises(CheckFailed, match=r"^x: a; b \(note\)$"):
        Problems(["a", "b"], headline="x: ", note=" (note)").raise_if_failed()


def test_fail_says_no_with_check_failed():
    with pytest.raises(CheckFailed, match="^the engine died$"):
        fail("the engine died")


def test_a_former_legacy_verdict_fails_with_check_failed_and_its_sentence():
    verdict = FitVerdict(False, "too big")
    assert verdict.problems == ["too big"] and not verdict.ok
    with pytest.raises(CheckFailed, match="^too big$"):
        verdict.raise_if_failed()


def test_record_figures_reads_a_verdict_and_a_mapping():
    got: list[tuple[str, float]] = []
    record = lambda name, value: got.append((name, value))  # noqa: E731
    record_figures(record, FitVerdict(True, "", measured={"a": 1.0}))
    record_figures(record, {"b": 2.0}, prefix="ref_")
    record_figures(record, compare.VerdictReport("w", measured={"c": 3.0}))
    assert got == [("a", 1.0), ("ref_b", 2.0), ("c", 3.0)]
