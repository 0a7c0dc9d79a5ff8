"""A run is platform evidence only if every check of its tiers ran (conformance/run/runrecord.py), whatever narrowed
it: -k, --lf, --deselect, node ids, -x, --collect-only. Each narrowed run here is real (a P0 of the CPU default cut
down to its quickest checks): exit 4, `evidence: false`, the checks that did not run named in `not_run` and listed
as errors in junit.xml, so neither the dashboard nor a CI reading JUnit sees it as a pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.run import runrecord
from conformance.run.cli import CHECKS
from reports.results import validate

pytestmark = pytest.mark.slow

QUICK = "test_stack_identity.py::test_stack_versions_recorded"  # a P0 check that starts no engine


def _conformance(reports: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance", "run", "--tier", "p0", "--reports-dir", str(reports),
                           *args], capture_output=True, text=True, timeout=600, env=os.environ)


def _pytest(reports: Path, *args: str) -> subprocess.CompletedProcess:
    """The plugin under plain pytest, as a CI job or a developer may call it (node ids narrow the collection)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.run.plugin",
                           "--rootdir", str(CHECKS), "-o", f"cache_dir={reports.parent / '.pytest_cache'}",
                           "--tier", "p0", "--reports-dir", str(reports), *args],
                          capture_output=True, text=True, timeout=600, env=os.environ, cwd=CHECKS)


def _the_record(reports: Path) -> tuple[dict, ET.Element]:
    (run,) = [p for p in reports.iterdir() if p.is_dir()]
    record = json.loads((run / "results.json").read_text())
    validate(record)
    return record, ET.parse(run / "junit.xml").getroot()


def _assert_narrowed(proc: subprocess.CompletedProcess, reports: Path, code: int = 4) -> dict:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    record, junit = _the_record(reports)
    p0 = runrecord.tier_functions(("p0",))
    assert record["evidence"] is False and record["not_run"] and record["evidence_problems"], record["not_run"]
    ran = {c["id"].split("[", 1)[0] for c in record["checks"]}
    assert {runrecord.function_of(c) for c in record["not_run"]} | ran == set(p0)  # every check accounted for
    suite = junit if junit.tag == "testsuite" else junit.find("testsuite")
    errors = [case for case in suite.iter("testcase") if case.find("error") is not None]
    assert len(errors) >= len(record["not_run"]) and int(suite.get("errors")) >= len(record["not_run"])
    assert all(e.find("error").get("message").startswith("not run: ") for e in errors[-len(record["not_run"]):])
    assert "verdict: PASS" not in out
    return record


def test_the_tiers_checks_read_from_source_are_those_a_whole_collection_holds(tmp_path):
    """The source reader's control: it finds exactly the check functions that pytest collects for P0 (a reader that
    missed one would let a run that skipped it count as whole)."""
    proc = _conformance(tmp_path / "runs", "--", "--collect-only")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = {runrecord.CHECKS_PREFIX + line.split("[", 1)[0] for line in proc.stdout.splitlines()
                 if line.startswith("test_") and "::" in line}
    assert collected and collected == set(runrecord.tier_functions(("p0",)))
    # --collect-only is a listing: nothing ran, nothing is recorded, and it says so
    assert "nothing ran and no run was recorded" in proc.stdout and not (tmp_path / "runs").exists()


def test_a_run_narrowed_by_k_is_no_evidence_and_exits_4(tmp_path):
    reports = tmp_path / "runs"
    record = _assert_narrowed(_conformance(reports, "-k", "versions_recorded"), reports)
    assert record["exit_status"] == 4 and "-k 'versions_recorded'" in record["evidence_problems"][0]
    assert record["complete"] is True  # the run finished; it judged a part of its tier


def test_a_run_narrowed_by_last_failed_is_no_evidence(tmp_path):
    """`--lf` after a failing run: pytest skips whole files (never collected) and deselects the rest."""
    reports = tmp_path / "runs"
    cache = tmp_path / ".pytest_cache" / "v" / "cache"
    cache.mkdir(parents=True)
    (cache / "lastfailed").write_text(json.dumps({QUICK: True}))
    record = _assert_narrowed(_conformance(reports, "--", "--lf"), reports)
    assert [c["id"] for c in record["checks"]] == [runrecord.CHECKS_PREFIX + QUICK]
    assert any("never collected" in p for p in record["evidence_problems"])


def test_a_run_narrowed_by_deselect_is_no_evidence(tmp_path):
    reports = tmp_path / "runs"
    others = [f"--deselect={p.name}" for p in sorted(CHECKS.glob("test_*.py")) if p.name != "test_stack_identity.py"]
    record = _assert_narrowed(_conformance(reports, "--", *others,
                                           "--deselect=test_stack_identity.py::test_vllm_platform_matches_target"),
                              reports)
    assert any("deselected" in p for p in record["evidence_problems"]) and len(record["checks"]) == 3


def test_a_run_narrowed_by_a_node_id_is_no_evidence(tmp_path):
    reports = tmp_path / "runs"
    record = _assert_narrowed(_pytest(reports, str(CHECKS / QUICK)), reports, code=runrecord.NARROWED_STATUS)
    assert len(record["checks"]) == 1 and any("never collected" in p for p in record["evidence_problems"])


def test_the_ledger_names_checks_collected_but_never_executed():
    """-x, --maxfail, --sw or an interrupt: collected checks that never got an outcome are not run."""
    ledger = runrecord.Ledger(expected={"conformance/checks/test_a.py::test_x": "p0",
                                       "conformance/checks/test_a.py::test_y": "p0"},
                             collected=["conformance/checks/test_a.py::test_x", "conformance/checks/test_a.py::test_y"],
                             reported={"conformance/checks/test_a.py::test_x"})
    assert ledger.not_run() == ["conformance/checks/test_a.py::test_y"]
    assert ledger.problems() == ["1 check(s) of the run's tiers were collected but never executed: test_a.py::test_y"]
    assert ledger.reasons()["conformance/checks/test_a.py::test_y"].startswith("not run: the run stopped before it")
    whole = runrecord.Ledger(expected=dict(ledger.expected), collected=list(ledger.collected),
                            reported=set(ledger.collected))
    assert whole.not_run() == [] and whole.problems() == []
