"""The stdlib version parser on the version strings the stack actually reports."""

from __future__ import annotations

import pytest

from env_checks.versions import InvalidVersion, Version, compare, in_range


@pytest.mark.parametrize("text, release, local", [
    ("2.13.0+cpu", (2, 13, 0), "cpu"),
    ("2.9.0+rocm6.4", (2, 9, 0), "rocm6.4"),
    ("6.4.1", (6, 4, 1), None),
    ("0.32.0", (0, 32, 0), None),
    ("6.8.0-79-generic", (6, 8, 0), "generic"),
    ("580.159.04", (580, 159, 4), None),
    ("0.10.1.1+gptoss", (0, 10, 1, 1), "gptoss"),
    ("6.4.43482-0f2d60242", (6, 4, 43482), "0f2d60242"),
])
def test_parse(text, release, local):
    v = Version.parse(text)
    assert (v.release, v.local) == (release, local)


@pytest.mark.parametrize("older, newer", [
    ("0.11.0rc1", "0.11.0"), ("1.0.dev3", "1.0a1"), ("1.0a1", "1.0b2"), ("1.0", "1.0.post1"),
    ("6.4.1", "6.4.1-103"), ("6.4.1-103", "6.4.2"), ("0.9.9", "0.10.0"), ("2.12.1", "2.13.0+cpu"),
])
def test_ordering(older, newer):
    assert compare(older, newer) == -1 and compare(newer, older) == 1


def test_local_labels_and_trailing_zeros_do_not_count():
    assert compare("2.13.0+cpu", "2.13") == 0 and compare("6.4", "6.4.0") == 0


@pytest.mark.parametrize("version, spec, ok", [
    ("2.13.0+cpu", ">=2.13,<2.14", True), ("6.3.3", ">=6.4.0,<8", False), ("7.2.4", ">=6.4.0,<8", True),
    ("0.11.0", "<=0.11.0", True), ("0.11.1", "<=0.11.0", False), ("0.32.0", "!=0.32.0", False),
    ("6.18.44-fc-v657-gpu", ">=5.15", True), ("580.159.04", ">=550", True),
])
def test_in_range(version, spec, ok):
    assert in_range(version, spec) is ok


@pytest.mark.parametrize("bad", ["", "latest", "N/A", "v"])
def test_invalid_versions(bad):
    with pytest.raises(InvalidVersion):
        Version.parse(bad)


@pytest.mark.parametrize("spec", ["", "~=1.0", "about 6", ">="])
def test_invalid_ranges(spec):
    with pytest.raises(InvalidVersion):
        in_range("1.0", spec)
