"""Lineages are keyed on what makes runs comparable (platform, engine, combo, model, dtype, profile), history schema 7
migrates stored rows, and "what changed" diffs the run's options as well as its fingerprint."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from reports import analysis
from reports.history import History
from reports.records import RunInfo, diff_runs, series_key
from reports.results import write_run
from tests.reports.conftest import FIXTURE_RUNS, drop_schema_8_columns, make_record

DEVICE_RUNS = FIXTURE_RUNS.parent / "device_runs"
REFUSED = "20261129T102148-rocm-bcf9b7"


def _run(run_id: str, **options: object) -> RunInfo:
    summary = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0)
    summary["passed" if options.pop("green", True) else "failed"] = 1
    fields = {"dtype": "bfloat16", "profile": None} | options
    engine = fields.pop("engine", "vllm")
    return RunInfo(run_id, run_id, "rocm", engine, None, ("p0",), True, "tiny-gpt-oss", "p", "rocm gfx942 · vllm · x",
                   {"rocm": "7.0"}, summary, **fields)


def test_series_key_names_platform_model_dtype_and_profile() -> None:
    assert series_key("cuda H200 · vllm · installed", "/models/gpt-oss-120b/", "bfloat16", "h200-120b") == \
        "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16 · profile h200-120b"
    assert series_key("cpu avx2 · vllm · installed", "tiny-gpt-oss", None, None) == \
        "cpu avx2 · vllm · installed · tiny-gpt-oss · dtype ?"


def test_a_dtype_or_engine_change_is_a_change_never_identical_fingerprints() -> None:
    before, after = _run("1"), _run("2", dtype="float32", engine="transformers")
    changes = {c.path: (c.before, c.after) for c in diff_runs(before, after)}
    assert changes == {"run.dtype": ("bfloat16", "float32"), "run.engine": ("vllm", "transformers")}
    planted = _run("3", planted_fault="sinks_dropped", narrowed_by="-k parity", profile="mi300x-tiny")
    changes = {c.path for c in diff_runs(before, planted)}
    assert changes == {"run.planted_fault", "run.narrowed_by", "run.profile"}
    assert before.series != after.series  # and they are two lineages


def test_runs_of_another_dtype_are_another_lineage(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for n, dtype in enumerate(("bfloat16", "float32", "bfloat16")):
        rec = make_record(run_id=f"2025010{n + 1}T000000Z-cpu-00000{n}", started_at=f"2025-01-0{n + 1}T00:00:00Z")
        rec["dtype"] = dtype
        write_run(runs / rec["run_id"], rec, None, {})
    with History.open(tmp_path / "h.sqlite") as history:
        history.ingest_dir(runs)
        latest = analysis.latest_per_lineage(history.runs())
    assert {k: r.run_id[-1] for k, r in latest.items()} == {"cpu · vllm · installed · tiny-gpt-oss · bfloat16": "2",
                                                            "cpu · vllm · installed · tiny-gpt-oss · float32": "1"}


def test_schema_6_rows_are_read_again_from_their_files(tmp_path: Path) -> None:
    """A store written by schema 6 holds no dtype or profile, and a refused run stored before schema 6 as evidence;
    after the migration the next ingest reads those rows again from their run directories."""
    runs = tmp_path / "runs"
    for name in (REFUSED, "20261203T073609-cuda-0d10ac"):
        shutil.copytree(DEVICE_RUNS / name, runs / name)
    db = tmp_path / "h.sqlite"
    with History.open(db) as history:
        history.ingest_dir(runs)
    with sqlite3.connect(db) as conn:  # as schema 6 (written by schema 5's rules) left them
        conn.execute("DROP INDEX runs_by_derivation")
        for column in ("dtype", "profile", "planted_fault", "narrowed_by", "exit_status", "derived_by"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        drop_schema_8_columns(conn)
        conn.execute("UPDATE runs SET not_evidence = NULL")
        conn.execute("PRAGMA user_version = 6")
    with History.open(db) as history:
        stale = {r.run_id: (r.dtype, r.not_evidence) for r in history.runs()}
        assert stale == {REFUSED: (None, None), "20261203T073609-cuda-0d10ac": (None, None)}
        report = history.ingest_dir(runs)
        assert report.ingested == [] and sorted(report.already) == sorted(stale)
        fresh = {r.run_id: r for r in history.runs()}
    assert fresh[REFUSED].dtype == "bfloat16" and fresh[REFUSED].not_evidence.startswith("refused")
    assert fresh["20261203T073609-cuda-0d10ac"].series.endswith("tiny-gpt-oss · bfloat16 · profile h200-tiny")
    with History.open(db) as history:  # read again once only
        assert history.has_run(REFUSED, complete_only=True, current=True)
