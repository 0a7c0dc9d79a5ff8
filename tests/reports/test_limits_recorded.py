"""Limits as judged: the dashboard shows the limits each check's record carries and the suite that judged the run,
kept in the history store (schema 8), never the suite's data files as they are today; a run that recorded none shows
"limit not recorded", and trends draw no limit line for it."""

from __future__ import annotations

import copy
import shutil
import sqlite3
from importlib import resources
from pathlib import Path

import pytest

from reports.dashboard import build
from reports.history import History
from reports.limits import NOT_RECORDED, Limit, limit_of, limits_json, parse_limits, recorded
from reports.results import write_run
from reports.sitedata import collect
from tests.reports.conftest import DEVICE_RUNS, drop_schema_8_columns, load_fixture

KEPT = "20261201T112918-cuda-45f576"  # fp32 on the H200: tolerances.toml's [logprobs.float32] max_abs is 2e-3
PARITY = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"
SUITE = {"version": "0.9.0", "commit": "0123abc+dirty", "data_hash": "sha256:5eed"}
JUDGED_BY = {"max_abs_dlogprob": {"value": 0.002, "kind": "max", "source": "tolerances.toml logprobs.float32.max_abs"},
             "compared_steps": {"value": 500, "kind": "min", "source": "the parity check's least steps"}}


def judged(run_id: str = "20261201T112919-cuda-judged", limits: dict | None = None) -> dict:
    """The kept fp32 run as results.json now writes it: each check with the limits it was judged by, the suite."""
    rec = load_fixture(KEPT, DEVICE_RUNS)
    rec.update(run_id=run_id, started_at="2026-12-01T11:29:19+00:00", suite=SUITE)
    for check in rec["checks"]:
        check["limits"] = copy.deepcopy(limits or JUDGED_BY) if check["id"] == PARITY else {}
    return rec


def test_limits_are_read_from_the_record_and_malformed_ones_are_left_out() -> None:
    assert parse_limits(None) is None and parse_limits("16") is None  # not recorded
    assert parse_limits({}) == {}  # recorded: judged by no limit on a figure
    assert parse_limits({"a": {"value": 1, "kind": "max", "source": "s"}, "b": {"value": True, "kind": "max"},
                         "c": {"value": float("nan"), "kind": "min"}, "d": {"value": 2.0, "kind": "below"},
                         "e": 3.0, "f": {"value": 4.5, "kind": "min"}}) == {
        "a": Limit(1.0, "max", "s"), "f": Limit(4.5, "min", "source not recorded")}
    assert limits_json(None) is None and limits_json({"x": {"value": 2, "kind": "min", "source": "t"}}) == \
        '{"x": {"kind": "min", "source": "t", "value": 2.0}}'


def test_the_history_store_keeps_each_checks_limits_and_the_runs_suite(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as history:
        assert history.ingest_record(judged())
        assert history.ingest_record(load_fixture(KEPT, DEVICE_RUNS))
        runs = {r.run_id: r for r in history.runs()}
        checks = history.checks(runs)
    assert runs["20261201T112919-cuda-judged"].suite == SUITE and runs[KEPT].suite is None
    [parity] = [c for c in checks["20261201T112919-cuda-judged"] if c.id == PARITY]
    assert limit_of(parity, "max_abs_dlogprob") == Limit(0.002, "max", "tolerances.toml logprobs.float32.max_abs")
    assert limit_of(parity, "compared_steps").holds(1001.0) and limit_of(parity, "p99_abs_dlogprob") is None
    others = [c for c in checks["20261201T112919-cuda-judged"] if c.id != PARITY]
    assert all(recorded(c) and c.limits == {} for c in others)
    assert not any(recorded(c) for c in checks[KEPT])  # written before records carried limits


def test_a_store_of_schema_7_reads_limits_and_suite_again_from_the_run_files(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs / "20261201T112919-cuda-judged", judged(), None, {})
    db = tmp_path / "h.sqlite"
    with History.open(db) as history:
        history.ingest_dir(runs)
    with sqlite3.connect(db) as conn:  # as schema 7 left it: no limits, no suite, no test model
        drop_schema_8_columns(conn)
        conn.execute("UPDATE runs SET derived_by = 7")
        conn.execute("PRAGMA user_version = 7")
    with History.open(db) as history:
        assert history.runs()[0].suite is None
        history.ingest_dir(runs)
        [run] = history.runs()
        [parity] = [c for c in history.checks([run.run_id])[run.run_id] if c.id == PARITY]
    assert run.suite == SUITE and run.test_model and limit_of(parity, "max_abs_dlogprob").value == 0.002


def change_the_suites_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The suite's data tables as a later commit might have them: every logprob `max_abs` a hundred times looser,
    in a copy that `importlib.resources` and `conformance.datafiles` hand out for the `conformance` package."""
    package = tmp_path / "conformance-later"
    shutil.copytree(Path(str(resources.files("conformance") / "data")), package / "data")
    tolerances = package / "data" / "tolerances.toml"
    tolerances.write_text(tolerances.read_text(encoding="utf-8").replace("max_abs = 2e-3", "max_abs = 0.2"),
                          encoding="utf-8")
    real = resources.files
    monkeypatch.setattr(resources, "files", lambda anchor: package if anchor == "conformance" else real(anchor))
    from conformance import datafiles

    monkeypatch.setattr(datafiles, "DATA", package / "data")
    return tolerances


def _page(tmp_path: Path, runs: Path, name: str, run_id: str) -> str:
    build(runs, tmp_path / f"{name}.sqlite", tmp_path / name)
    return (tmp_path / name / "runs" / f"{run_id}.html").read_text(encoding="utf-8")


def _limit_row(page: str, check_id: str, figure: str) -> str:
    section = page[page.index(f'data-check="{check_id}"'):]
    row = section[section.index(f'<tr data-figure="{figure}"'):]
    return row[:row.index("</tr>")]


def test_a_kept_run_reads_as_judged_after_the_suites_limits_change(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose record carries its limits, rendered; then the suite's data table moves (tolerances.toml's fp32
    max_abs from 2e-3 to 0.2) and the site is rendered again: the run page still shows the limit it was judged by,
    and a run that recorded none still shows "limit not recorded", never today's value."""
    runs = tmp_path / "runs"
    write_run(runs / "20261201T112919-cuda-judged", judged(), None, {})
    shutil.copytree(DEVICE_RUNS / KEPT, runs / KEPT)
    before = _page(tmp_path, runs, "before", "20261201T112919-cuda-judged")
    row = _limit_row(before, PARITY, "max_abs_dlogprob")
    assert 'data-limit="0.002" data-limit-kind="max"' in row and "≤ 0.002 (tolerances.toml logprobs.float32" in row
    assert 'data-limit="500" data-limit-kind="min"' in _limit_row(before, PARITY, "compared_steps")
    assert "version <code>0.9.0</code> · commit <code>0123abc+dirty</code> · data hash <code>sha256:5eed</code>" \
        in before

    tolerances = change_the_suites_data(tmp_path, monkeypatch)
    assert "max_abs = 0.2" in tolerances.read_text(encoding="utf-8")
    assert (Path(str(resources.files("conformance"))) / "data" / "tolerances.toml") == tolerances
    after = _page(tmp_path, runs, "after", "20261201T112919-cuda-judged")
    assert _limit_row(after, PARITY, "max_abs_dlogprob") == row
    old = _page(tmp_path, runs, "after-old", KEPT)
    assert NOT_RECORDED in _limit_row(old, PARITY, "max_abs_dlogprob") and "0.2" not in _limit_row(
        old, PARITY, "max_abs_dlogprob")


def test_trends_draw_the_limits_as_recorded_and_none_for_runs_without(tmp_path: Path) -> None:
    """Two runs of one lineage judged by different recorded limits: the trend draws both lines; the fixture run
    that recorded none adds its point without a line; a figure no run recorded a limit for has no trend."""
    runs = tmp_path / "runs"
    write_run(runs / "20261201T112919-cuda-judged", judged(), None, {})
    looser = {**JUDGED_BY, "max_abs_dlogprob": {**JUDGED_BY["max_abs_dlogprob"], "value": 0.004}}
    later = judged("20261201T112920-cuda-looser", looser)
    later["started_at"] = "2026-12-01T11:29:20+00:00"
    write_run(runs / later["run_id"], later, None, {})
    shutil.copytree(DEVICE_RUNS / KEPT, runs / KEPT)
    with History.open(tmp_path / "h.sqlite") as history:
        history.ingest_dir(runs)
        trends = {(t.check_id, t.name): t for t in collect(history).figure_trends}
    trend = trends[(PARITY, "max_abs_dlogprob")]
    assert [limit.value for limit in trend.limits] == [0.002, 0.004]
    [points] = trend.lineages.values()
    assert len(points) == 3  # the run that recorded no limit is plotted too, under no line of its own
    assert (PARITY, "p99_abs_dlogprob") not in trends and set(trends) == {(PARITY, "max_abs_dlogprob"),
                                                                         (PARITY, "compared_steps")}
