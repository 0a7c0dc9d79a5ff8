"""Fixtures of the report and dashboard tests: the sample runs in fixtures/runs and a record builder."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

import pytest

from reports.results import summarize

FIXTURE_RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
MALFORMED_RUN = "20250613T030000Z-rocm-0bad00"
GOOD_RUNS = sorted(p.name for p in FIXTURE_RUNS.iterdir() if p.is_dir() and p.name != MALFORMED_RUN)
ROCM_GREEN, ROCM_RED = "20250604T031512Z-rocm-a1f3c9", "20250612T031633Z-rocm-5e0d47"


DEVICE_RUNS = FIXTURE_RUNS.parent / "device_runs"
CPU_RUNS = FIXTURE_RUNS.parent / "cpu_runs"
CUDA_GREEN = "20250611T020044Z-cuda-e25b9f"  # the samples' real-model CUDA lineage: P0, P1, P2 pass, no P3
ACCURACY_CHECK = "conformance/checks/test_accuracy.py::test_accuracy_meets_published_figure[{}]"


def load_fixture(run_id: str, runs: Path = FIXTURE_RUNS) -> dict:
    return json.loads((runs / run_id / "results.json").read_text(encoding="utf-8"))


def with_accuracy(record: dict, outcome: str = "passed", message: str = "",
                  cases: tuple[str, ...] = ("gsm8k-medium", "gpqa_diamond-low")) -> dict:
    """`record` (a copy) with a P3 run of the accuracy checks (checks/test_accuracy.py) added, each `outcome`."""
    rec = copy.deepcopy(record)
    rec["tiers"] = sorted(set(rec["tiers"]) | {"p3"})
    rec["checks"] += [{"id": ACCURACY_CHECK.format(case), "tier": "p3", "area": "accuracy", "outcome": outcome,
                       "duration_s": 60.0, "figures": {"score": 0.93} if outcome == "passed" else {},
                       "message": message, "reference": "docs/figures.md", "failure_class": None,
                       "bug_link": None} for case in cases]
    rec["summary"] = summarize(rec["checks"])
    return rec


def make_record(run_id: str = "20250101T000000Z-cpu-000001", target: str = "cpu",
                checks: list[dict] | None = None, started_at: str = "2025-01-01T00:00:00Z",
                combo: str | None = None, fingerprint: dict | None = None) -> dict:
    """A small valid record; `checks` entries need only id and outcome."""
    full = []
    for check in checks if checks is not None else [{"id": "checks/test_a.py::test_ok", "outcome": "passed"}]:
        entry = {"tier": "p0", "area": "engine", "duration_s": 0.1, "figures": {}, "message": "",
                 "reference": "closed form"}
        entry.update(check)
        full.append(entry)
    return {
        "schema_version": 1, "run_id": run_id, "started_at": started_at, "finished_at": started_at,
        "complete": True, "target": target, "engine": "vllm", "combo": combo,
        "tiers": sorted({c["tier"] for c in full}) or ["p0"],
        "model": {"name": "tiny-gpt-oss", "content_hash": "sha256:00"},
        "fingerprint": fingerprint if fingerprint is not None else {"packages": {"torch": "2.13.0+cpu"}},
        "summary": summarize(full), "checks": full,
    }


def accuracy_run(base: dict, run_id: str, started: str, outcome: str = "passed", message: str = "") -> dict:
    """A P3 run of the accuracy checks alone, on `base`'s stack (its fingerprint, model, dtype, lineage)."""
    rec = with_accuracy({**copy.deepcopy(base), "checks": [], "tiers": []}, outcome, message)
    rec.update(run_id=run_id, started_at=started, finished_at=started, exit_status=0 if outcome == "passed" else 1)
    return rec


def drop_schema_8_columns(conn: sqlite3.Connection) -> None:
    """Undo history schema 8 (recorded limits, suite, test model) on a store, as an older schema left it."""
    conn.execute("ALTER TABLE checks DROP COLUMN limits")
    for column in ("suite", "test_model"):
        conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")


@pytest.fixture
def record() -> dict:
    return copy.deepcopy(load_fixture(ROCM_RED))


@pytest.fixture
def runs_copy(tmp_path: Path) -> Path:
    """A private copy of fixtures/runs (tests may add runs to it)."""
    dest = tmp_path / "runs"
    for run in FIXTURE_RUNS.iterdir():
        (dest / run.name).mkdir(parents=True)
        for f in run.iterdir():
            (dest / run.name / f.name).write_bytes(f.read_bytes())
    return dest
