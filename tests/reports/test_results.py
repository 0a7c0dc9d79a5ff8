"""The results record: schema validation, run ids and the atomic, non-clobbering run writer."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from env_checks.record import results
from env_checks.record.results import ResultsError, load_run, new_run_id, validate, write_run
from tests.reports.conftest import FIXTURE_RUNS, GOOD_RUNS, MALFORMED_RUN, load_fixture, make_record


@pytest.mark.parametrize("run_id", GOOD_RUNS)
def test_sample_runs_are_valid(run_id: str) -> None:
    validate(load_fixture(run_id))
    assert load_run(FIXTURE_RUNS / run_id)["run_id"] == run_id


def test_sample_runs_cover_the_three_targets() -> None:
    assert {load_fixture(r)["target"] for r in GOOD_RUNS} == {"cpu", "cuda", "rocm"}


def test_malformed_sample_is_rejected_naming_the_file() -> None:
    with pytest.raises(ResultsError, match=rf"{MALFORMED_RUN}/results.json is not valid JSON"):
        load_run(FIXTURE_RUNS / MALFORMED_RUN)


def test_missing_summary_is_named(record: dict) -> None:
    del record["summary"]
    with pytest.raises(ResultsError) as err:
        validate(record)
    assert "'summary' is a required property" in str(err.value)
    assert str(err.value).count(".") >= 1 and "\n" not in str(err.value)


def test_bad_outcome_names_its_path(record: dict) -> None:
    record["checks"][2]["outcome"] = "passed-ish"
    with pytest.raises(ResultsError, match=r"at checks\[2\]\.outcome: 'passed-ish' is not one of"):
        validate(record)


def test_summary_field_errors_name_the_field(record: dict) -> None:
    record["summary"]["failed"] = -1
    with pytest.raises(ResultsError, match=r"at summary\.failed"):
        validate(record)


def test_duplicate_check_ids_are_rejected(record: dict) -> None:
    record["checks"].append(dict(record["checks"][0]))
    with pytest.raises(ResultsError, match="appears twice"):
        validate(record)


def test_unparsable_timestamp_is_rejected(record: dict) -> None:
    record["started_at"] = "yesterday"
    with pytest.raises(ResultsError, match="started_at"):
        validate(record)


def test_non_object_is_rejected() -> None:
    with pytest.raises(ResultsError, match="JSON object"):
        validate([])  # type: ignore[arg-type]


def test_new_run_id_is_unique_and_fits_the_schema() -> None:
    now = datetime(2025, 6, 12, 3, 16, 33, tzinfo=timezone.utc)
    ids = {new_run_id(now, "rocm") for _ in range(500)}
    # a 24-bit random suffix: 500 draws in one second collide about once in 130 tries (the birthday
    # bound), never by the handful; a collision is refused by write_run rather than overwriting a run
    assert len(ids) >= 495
    for run_id in list(ids)[:5]:
        assert re.fullmatch(r"20250612T031633Z-rocm-[0-9a-f]{6}", run_id)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", new_run_id(now, "rocm gfx942/../x"))


def test_write_run_writes_all_files(tmp_path: Path) -> None:
    rec = make_record()
    path = write_run(tmp_path / rec["run_id"], rec, "<testsuite/>", {"k": 1})
    assert path == tmp_path / rec["run_id"] / "results.json"
    assert json.loads(path.read_text()) == rec
    assert json.loads((path.parent / "fingerprint.json").read_text()) == {"k": 1}
    assert (path.parent / "junit.xml").read_text() == "<testsuite/>"
    assert sorted(p.name for p in path.parent.iterdir()) == ["fingerprint.json", "junit.xml", "results.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_write_run_refuses_another_runs_directory(tmp_path: Path) -> None:
    first = make_record(run_id="run-a")
    run_dir = tmp_path / "run-a"
    write_run(run_dir, first, None, {})
    before = (run_dir / "results.json").read_bytes()
    with pytest.raises(ResultsError, match="already holds run 'run-a'"):
        write_run(run_dir, make_record(run_id="run-b"), None, {"other": True})
    assert (run_dir / "results.json").read_bytes() == before
    assert json.loads((run_dir / "fingerprint.json").read_text()) == {}


def test_write_run_may_rewrite_the_same_run(tmp_path: Path) -> None:
    partial = make_record(run_id="run-a")
    partial["complete"] = False
    write_run(tmp_path, partial, None, {})
    final = make_record(run_id="run-a")
    write_run(tmp_path, final, None, {})
    assert json.loads((tmp_path / "results.json").read_text())["complete"] is True


def test_write_run_refuses_an_unreadable_results_file(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ResultsError, match="unreadable"):
        write_run(tmp_path, make_record(), None, {})
    assert (tmp_path / "results.json").read_text() == "{not json"


def test_write_run_validates_before_writing_anything(tmp_path: Path) -> None:
    rec = make_record()
    del rec["summary"]
    with pytest.raises(ResultsError, match="summary"):
        write_run(tmp_path / "run", rec, "<x/>", {})
    assert not (tmp_path / "run").exists()


def test_write_run_is_atomic_when_the_final_rename_fails(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run-a"
    write_run(run_dir, make_record(run_id="run-a"), None, {})
    before = (run_dir / "results.json").read_bytes()
    real_replace = os.replace

    def failing_replace(src: str, dst: str | Path) -> None:
        if str(dst).endswith("results.json"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", failing_replace)
    changed = make_record(run_id="run-a", checks=[{"id": "x::y", "outcome": "failed"}])
    with pytest.raises(OSError, match="disk full"):
        write_run(run_dir, changed, None, {})
    # The old results are intact and no temporary file is left behind.
    assert (run_dir / "results.json").read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["fingerprint.json", "results.json"]


def test_every_failure_class_a_check_can_raise_is_one_the_record_accepts() -> None:
    """The classes the run declares from a check's exception (runrecord.classify) must validate, or a run that meets
    one could not be written."""
    from conformance.distributed import DistributedTimeout
    from conformance.engines.worker import EngineDied, EngineHung
    from conformance.verdicts.host_speed import SlowerHost
    from conformance.verdicts.shared_gpu import GpuShared

    for exc in (EngineHung, EngineDied, DistributedTimeout, GpuShared, SlowerHost):
        record = make_record(checks=[{"id": "checks/test_a.py::test_x", "outcome": "failed",
                                      "failure_class": exc.failure_class}])
        validate(record)
