"""The CI helpers: one run as a Markdown job summary, and the merge of sharded JUnit files."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from reports.job_summary import job_summary, main
from reports.junit import JunitError, merge_junit
from reports.results import write_run
from tests.reports.conftest import FIXTURE_RUNS, ROCM_GREEN, ROCM_RED, load_fixture, make_record


def test_red_run_lists_failures_with_diagnosis() -> None:
    text = job_summary(load_fixture(ROCM_RED))
    assert text.startswith("## ❌ Conformance FAIL: rocm gfx942 / torch 2.8 / vllm 0.11")
    assert "| 17 | 3 | 2 | 0 | 0 | 1 |" in text
    assert text.count("| `conformance/checks/") == 5
    assert "Watchdog caught collective operation timeout" in text and "| timeout |" in text
    assert "[pytorch/pytorch#164346](https://github.com/pytorch/pytorch/issues/164346)" in text
    assert "[vllm-project/vllm#27722](https://github.com/vllm-project/vllm/issues/27722)" in text


def test_green_run_has_no_failure_table() -> None:
    text = job_summary(load_fixture(ROCM_GREEN))
    assert text.startswith("## ✅ Conformance PASS") and "### Failures" not in text


@pytest.mark.parametrize(("failed", "complete", "said"), [
    (True, True, "a check failed on it (see `conformance drill` for the verdict)"),
    (False, True, "**no check failed on it**"),
    (False, False, "**incomplete**"),
])
def test_a_negative_control_run_is_headed_as_one_not_as_a_failing_stack(failed, complete, said) -> None:
    """A planted-fault run (the drill's) is meant to fail: its CI summary says which fault was planted and whether
    a check failed on it, never "Conformance FAIL" as if the stack were broken."""
    checks = [{"id": "conformance/checks/test_sampling.py::test_seeded_requests_reproduce_alone_and_in_a_batch",
               "outcome": "failed" if failed else "passed",
               "message": "conformance.verdicts.verdict.CheckFailed: seed 7 sent twice" if failed else ""}]
    record = make_record(checks=checks)
    record.update(planted_fault="seed_dropped", complete=complete)
    heading = job_summary(record).splitlines()[0]
    assert heading.startswith("## 🧪 Negative control, fault `seed_dropped` planted: ") and said in heading
    assert "Conformance FAIL" not in heading


def test_run_text_is_escaped_for_markdown() -> None:
    rec = make_record(checks=[{"id": "c::t[a|b`]", "outcome": "failed",
                               "message": "<script>x</script> a|b\nnext"}])
    text = job_summary(rec)
    assert "&lt;script&gt;x&lt;/script&gt; a\\|b" in text and "<script>" not in text and "next" not in text
    assert "| `c::t[a\\|b']` |" in text


def test_cli_appends_to_the_step_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    assert main([str(FIXTURE_RUNS / ROCM_RED)]) == 0
    assert target.read_text().startswith("earlier step\n## ❌ Conformance FAIL")
    assert main([str(FIXTURE_RUNS / "20250613T030000Z-rocm-0bad00")]) == 2


def test_junit_shards_are_merged(tmp_path: Path) -> None:
    (tmp_path / "a.xml").write_text('<testsuites><testsuite name="p0" tests="3" failures="1" errors="0" '
                                    'skipped="1" time="1.5"><testcase name="x"/></testsuite></testsuites>')
    (tmp_path / "b.xml").write_text('<testsuite name="p1" tests="2" failures="0" errors="1" skipped="0" '
                                    'time="2.25"><testcase name="y"/></testsuite>')
    merged = ET.fromstring(merge_junit([tmp_path / "a.xml", tmp_path / "b.xml"]))
    assert merged.tag == "testsuites"
    assert [s.get("name") for s in merged] == ["p0", "p1"]
    assert {k: merged.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "5", "failures": "1", "errors": "1", "skipped": "1"}
    assert float(merged.get("time")) == 3.75  # junitparser writes "3.75", the stdlib merge wrote "3.750"


def test_junit_merge_names_a_bad_file(tmp_path: Path) -> None:
    (tmp_path / "bad.xml").write_text("<html>")
    with pytest.raises(JunitError, match="bad.xml is not readable JUnit XML"):
        merge_junit([tmp_path / "bad.xml"])
    (tmp_path / "other.xml").write_text("<report/>")
    with pytest.raises(JunitError, match="has root <report>"):
        merge_junit([tmp_path / "other.xml"])


def test_written_junit_survives_a_merge(tmp_path: Path) -> None:
    rec = make_record()
    write_run(tmp_path / "run", rec, '<testsuite name="s" tests="1"><testcase name="t"/></testsuite>', {})
    assert ET.fromstring(merge_junit([tmp_path / "run" / "junit.xml"])).get("tests") == "1"
