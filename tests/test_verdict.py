"""The one verdict type: `raise_if_failed` raises the class's own message and type, floors fail below (and on
NaN), and `record_figures` records a report's figures whether they are a method, a field or a mapping."""

import math

import pytest

from conformance.run.fit import FitVerdict
from conformance.verdicts import compare
from conformance.verdicts.verdict import CheckFailed, Problems, at_least, record_figures


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


def test_a_legacy_verdict_keeps_its_plain_assertion_error():
    with pytest.raises(AssertionError, match="^too big$") as info:
        FitVerdict(False, "too big").raise_if_failed()
    assert not isinstance(info.value, CheckFailed)


def test_record_figures_reads_a_method_a_field_and_a_mapping():
    got: list[tuple[str, float]] = []
    record = lambda name, value: got.append((name, value))  # noqa: E731
    record_figures(record, FitVerdict(True, "", figures={"a": 1.0}))
    record_figures(record, {"b": 2.0}, prefix="ref_")
    record_figures(record, compare.VerdictReport("w", figures={"c": 3.0}))

    class Method:
        def figures(self) -> dict[str, float]:
            return {"d": 4.0}

    record_figures(record, Method())
    assert got == [("a", 1.0), ("ref_b", 2.0), ("c", 3.0), ("d", 4.0)]
