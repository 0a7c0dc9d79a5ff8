"""The SQLite history store: idempotent ingest, WAL, migrations, concurrent runners, damaged files."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from reports.history import MIGRATIONS, SCHEMA_VERSION, History, HistoryError
from reports.results import summarize, write_run
from reports.stack import identify
from tests.reports.conftest import (
    FIXTURE_RUNS,
    GOOD_RUNS,
    MALFORMED_RUN,
    drop_schema_8_columns,
    load_fixture,
    make_record,
)

CHECKS_IN_FIXTURES = sum(len(load_fixture(r)["checks"]) for r in GOOD_RUNS)
FIGURES_IN_FIXTURES = sum(len(c["figures"]) for r in GOOD_RUNS for c in load_fixture(r)["checks"])


def test_ingest_stores_runs_checks_and_figures(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as history:
        report = history.ingest_dir(FIXTURE_RUNS)
        assert sorted(report.ingested) == GOOD_RUNS
        assert [path for path, _ in report.skipped] == [str(FIXTURE_RUNS / MALFORMED_RUN)]
        assert "not valid JSON" in report.skipped[0][1]
        assert history.counts() == {"runs": len(GOOD_RUNS), "checks": CHECKS_IN_FIXTURES,
                                    "figures": FIGURES_IN_FIXTURES}


def test_ingest_twice_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    with History.open(db) as history:
        history.ingest_dir(FIXTURE_RUNS)
        first = history.counts()
    with History.open(db) as history:
        again = history.ingest_dir(FIXTURE_RUNS)
        assert again.ingested == [] and sorted(again.already) == GOOD_RUNS
        assert history.counts() == first
        # Re-ingesting a record directly (e.g. from a dir with another name) is ignored as well.
        assert history.ingest_record(load_fixture(GOOD_RUNS[0])) is False
        assert history.counts() == first


def test_invalid_run_dirs_are_skipped_and_left_in_place(runs_copy: Path, tmp_path: Path) -> None:
    schema_bad = make_record(run_id="20250101T000000Z-cpu-nosumm")
    del schema_bad["summary"]
    (runs_copy / schema_bad["run_id"]).mkdir()
    (runs_copy / schema_bad["run_id"] / "results.json").write_text(json.dumps(schema_bad))
    (runs_copy / "20250101T000000Z-cpu-empty0").mkdir()
    before = {p: p.read_bytes() for p in runs_copy.rglob("*") if p.is_file()}
    with History.open(tmp_path / "h.sqlite") as history:
        report = history.ingest_dir(runs_copy)
    reasons = dict(report.skipped)
    assert "'summary' is a required property" in reasons[str(runs_copy / schema_bad["run_id"])]
    assert "has no results.json" in reasons[str(runs_copy / "20250101T000000Z-cpu-empty0")]
    assert len(report.ingested) == len(GOOD_RUNS)
    assert {p: p.read_bytes() for p in runs_copy.rglob("*") if p.is_file()} == before


def test_store_uses_wal_and_the_current_schema_version(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as history:
        assert history.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert history.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert history.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000


def test_old_schema_is_migrated_keeping_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
    conn.execute("INSERT INTO runs VALUES ('old', '2024-01-01T00:00:00Z', NULL, 'cpu', 'vllm', NULL, "
                 "'[\"p0\"]', 1, 'tiny-gpt-oss', NULL, '{}', 'cpu', 1, 0, 0, 0, 0, 0)")
    conn.commit()
    conn.close()
    with History.open(db) as history:
        assert history.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [r.run_id for r in history.runs()] == ["old"]
        history.ingest_dir(FIXTURE_RUNS)
        assert history.counts()["runs"] == len(GOOD_RUNS) + 1


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(HistoryError, match="newer than this tool"):
        History.open(db)


@pytest.mark.parametrize("garbage", [b"this is not a database\n" * 40,
                                     b"SQLite format 3\x00" + b"\xff" * 4080])
def test_damaged_file_is_reported_and_left_untouched(tmp_path: Path, garbage: bytes) -> None:
    db = tmp_path / "history.sqlite"
    db.write_bytes(garbage)
    with pytest.raises(HistoryError) as err:
        History.open(db)
    message = str(err.value)
    assert str(db) in message and "move it aside" in message and "reports/runs" in message
    assert db.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.sqlite"]


def _ingest_worker(db: str, runs: str, extra: str, start: object, queue: multiprocessing.Queue) -> None:
    try:
        start.wait(timeout=30)  # type: ignore[attr-defined] - all workers create and migrate the file at once
        with History.open(db) as history:
            history.ingest_dir(Path(runs))
            history.ingest_dir(Path(extra))
        queue.put("ok")
    except Exception as exc:  # report the failure to the parent instead of dying silently
        queue.put(f"{type(exc).__name__}: {exc}")


def test_concurrent_ingest_from_several_processes(tmp_path: Path) -> None:
    """Four runners ingest the shared runs and their own runs into one file at once."""
    extras = []
    for worker in range(4):
        extra = tmp_path / f"extra{worker}"
        for n in range(5):
            checks = [{"id": f"c::t{i}", "outcome": "passed", "figures": {"x": i}} for i in range(20)]
            rec = make_record(run_id=f"20250701T00000{n}Z-cpu-w{worker}n{n}",
                              started_at=f"2025-07-01T00:00:0{n}Z", checks=checks)
            write_run(extra / rec["run_id"], rec, None, {})
        extras.append(extra)
    db = tmp_path / "shared.sqlite"
    ctx = multiprocessing.get_context("spawn")
    queue, start = ctx.Queue(), ctx.Barrier(len(extras))
    procs = [ctx.Process(target=_ingest_worker, args=(str(db), str(FIXTURE_RUNS), str(e), start, queue))
             for e in extras]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    outcomes = [queue.get(timeout=5) for _ in procs]
    assert outcomes == ["ok"] * 4
    with History.open(db) as history:
        assert history.counts() == {"runs": len(GOOD_RUNS) + 20, "checks": CHECKS_IN_FIXTURES + 400,
                                    "figures": FIGURES_IN_FIXTURES + 400}


def test_platform_labels_and_lineages(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as history:
        history.ingest_dir(FIXTURE_RUNS)
        runs = {r.run_id: r for r in history.runs()}
    assert runs["20250611T020044Z-cuda-e25b9f"].platform == "cuda H200 / torch 2.8 / vllm 0.11"
    assert runs["20250604T031512Z-rocm-a1f3c9"].platform == "rocm gfx942 / torch 2.7 / vllm 0.10"
    assert runs["20250612T031633Z-rocm-5e0d47"].platform == "rocm gfx942 / torch 2.8 / vllm 0.11"
    assert runs["20250610T061133Z-cpu-d07a52"].platform == "cpu avx2 / torch 2.13 / vllm 0.32"
    # An upgrade keeps the lineage: trends and "what changed" follow it.
    assert runs["20250604T031512Z-rocm-a1f3c9"].lineage == runs["20250612T031633Z-rocm-5e0d47"].lineage \
        == "rocm gfx942 · vllm · rocm-latest"


@pytest.mark.parametrize("fingerprint, device", [
    ({"rocminfo": {"agents": [{"name": "AMD EPYC"}, {"isa": "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"}]}},
     "gfx942"),
    ({"gpu": {"arch": "gfx90a"}, "env": {"HSA_OVERRIDE_GFX_VERSION": "gfx1030"}}, "gfx90a"),
    ({}, "gfx?"),
])
def test_rocm_device_is_read_from_several_layouts(fingerprint: dict, device: str) -> None:
    assert identify("rocm", fingerprint).device == device


def test_a_finished_run_replaces_its_incomplete_record(tmp_path: Path) -> None:
    run_id = "20250801T000000Z-cpu-part01"
    partial = make_record(run_id=run_id, checks=[{"id": "c::a", "outcome": "passed"}])
    partial["complete"], partial["finished_at"] = False, None
    final = make_record(run_id=run_id, checks=[{"id": "c::a", "outcome": "passed"},
                                               {"id": "c::b", "outcome": "failed", "figures": {"x": 1.0}}])
    runs = tmp_path / "runs"
    write_run(runs / run_id, partial, None, {})
    with History.open(tmp_path / "h.sqlite") as history:
        assert history.ingest_dir(runs).ingested == [run_id]
        assert history.counts() == {"runs": 1, "checks": 1, "figures": 0}
        assert history.ingest_record(partial) is False  # the same partial record again: nothing to do
        write_run(runs / run_id, final, None, {})
        assert history.ingest_dir(runs).ingested == [run_id]
        assert history.counts() == {"runs": 1, "checks": 2, "figures": 1}
        assert history.runs()[0].complete and history.runs()[0].summary["failed"] == 1
        # Once complete, it is never replaced again.
        assert history.ingest_dir(runs).already == [run_id]
        assert history.ingest_record(partial) is False
        assert history.counts() == {"runs": 1, "checks": 2, "figures": 1}


ENV_CHECKS_ROCM = {  # the layout env_checks.fingerprint writes (trimmed)
    "schema": "env_checks.fingerprint/1", "collected_at": "2025-06-12T03:16:34+00:00", "duration_s": 1.2,
    "packages": {"torch": "2.9.0+rocm7.0", "vllm": "0.11.1+rocm700", "vllm_distribution": "vllm"},
    "platform": {"rocm_version": "7.0.2", "gfx_targets": ["gfx942"] * 8, "cpu_flags": ["avx2", "avx512f"],
                 "nvidia_gpu_names": None, "why_missing": {"nvidia_gpu_names": "nvidia-smi not installed"}},
    "runtime": {"target": {"hip_version": "7.0.51831", "gcn_arch": ["gfx942:sramecc+:xnack-"]}},
}
ENV_CHECKS_CUDA = {
    "packages": {"torch": "2.8.0+cu128", "vllm": "0.11.0"},
    "platform": {"rocm_version": None, "nvidia_gpu_names": ["NVIDIA H200"] * 8, "compute_caps": ["9.0"] * 8,
                 "why_missing": {"rocm_version": "rocm: ROCm not installed (/opt/rocm/.info/version absent)",
                                 "gfx_targets": "rocminfo: rocminfo not installed"}},
    "runtime": {"target": {"cuda_version": "12.8"}},
}


@pytest.mark.parametrize("target, fingerprint, label, runtime", [
    ("rocm", ENV_CHECKS_ROCM, "rocm gfx942 / torch 2.9 / vllm 0.11", "7.0.2"),
    ("cuda", ENV_CHECKS_CUDA, "cuda H200 / torch 2.8 / vllm 0.11", "12.8"),
    ("cpu", {"platform": {"cpu_flags": ["avx2", "fma"]},
             "packages": {"torch": "2.13.0+cpu", "vllm": "0.32.0"}},
     "cpu avx2 / torch 2.13 / vllm 0.32", None),
    ("cpu", {"platform": {"cpu_flags": ["avx512f", "amx_tile"]}}, "cpu amx", None),
])
def test_labels_from_the_env_checks_layout(target: str, fingerprint: dict, label: str,
                                           runtime: str | None) -> None:
    ident = identify(target, fingerprint)
    assert (ident.label, ident.runtime_version) == (label, runtime)


def test_fingerprint_diff_ignores_volatile_keys_and_groups_lists() -> None:
    from reports.stack import diff_fingerprints

    later = json.loads(json.dumps(ENV_CHECKS_ROCM))
    later.update(collected_at="2025-06-13T00:00:00+00:00", duration_s=3.4)
    later["platform"]["rocm_version"] = "7.1.0"
    later["platform"]["gfx_targets"] = ["gfx950"] * 8
    later["platform"]["cpu_flags"] = ["avx2", "avx512f", "amx_tile"]
    later["platform"]["host_single_thread_mops"] = 6.5  # measured, noisy: not a change of the stack
    later["platform"]["gpu_uuids"] = ["GPU-1111"]  # another physical GPU: a change
    assert [(c.path, c.before, c.after) for c in diff_fingerprints(ENV_CHECKS_ROCM, later)] == [
        ("platform.cpu_flags.2", None, "amx_tile"),
        ("platform.gfx_targets.*", "gfx942", "gfx950"),
        ("platform.gpu_uuids.0", None, "GPU-1111"),
        ("platform.rocm_version", "7.0.2", "7.1.0")]


def test_the_engine_under_test_parts_lineages_and_an_old_store_migrates(tmp_path: Path) -> None:
    """A transformers run and a vLLM run of one platform are two series; a store written before the engine joined
    the lineage (schema 4) gets the engine added to every stored lineage when it is opened."""
    import sqlite3

    from reports import history as history_module

    db = tmp_path / "h.sqlite"
    with History.open(db) as history:
        history.ingest_dir(FIXTURE_RUNS)
        before = {r.run_id: (r.engine, r.lineage) for r in history.runs()}
    assert all(f" · {engine} · " in lineage for engine, lineage in before.values())
    with sqlite3.connect(db) as conn:  # as schema 4 stored them: no engine in the lineage, no not_evidence
        conn.execute("UPDATE runs SET lineage = replace(lineage, ' · ' || engine || ' · ', ' · ')")
        conn.execute("ALTER TABLE runs DROP COLUMN not_evidence")
        conn.execute("DROP INDEX runs_by_derivation")
        for column in ("dtype", "profile", "planted_fault", "narrowed_by", "exit_status", "derived_by"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        drop_schema_8_columns(conn)
        conn.execute("PRAGMA user_version = 4")
    assert history_module.SCHEMA_VERSION >= 6
    with History.open(db) as history:
        assert {r.run_id: (r.engine, r.lineage) for r in history.runs()} == before


@pytest.mark.parametrize(("change", "reason"), [
    ({"complete": False}, "interrupted (complete: false)"),
    ({"planted_fault": "sinks_dropped"}, "a negative control: fault sinks_dropped planted in the engine"),
    ({"narrowed_by": "-k 'tokenizer'"}, "narrowed by -k 'tokenizer'"),
    ({"exit_status": 2}, "stopped (exit 2)"),
    ({"evidence": False}, "not evidence (its results.json says so)"),
    ({}, None),
])
def test_only_whole_judged_runs_of_the_stack_as_installed_are_evidence(change, reason) -> None:
    from reports.history import not_evidence

    record = json.loads(next(p for p in sorted(FIXTURE_RUNS.glob("*/results.json"))).read_text())
    record |= {"complete": True, "exit_status": 0, "evidence": True} | change
    record["checks"] = [c for c in record["checks"] if not c["id"].endswith("test_torch_build_matches_target")]
    record["summary"] = summarize(record["checks"])  # as the run writes it: counted from the checks it lists
    assert not_evidence(record) == reason
