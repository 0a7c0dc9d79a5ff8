"""Reliability of a run itself: an interrupted run is still written (marked incomplete), and concurrent runs
into one reports folder stay separate. (Planted secrets: tests/test_run_end_to_end.py, on the whole P0.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reports.results import validate

pytestmark = pytest.mark.slow


def start_run(reports: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "conformance", "run", "--reports-dir", str(reports), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=(os.environ | (env or {})), start_new_session=True)


def test_sigterm_mid_run_writes_an_incomplete_run(tmp_path):
    proc = start_run(tmp_path, "--tier", "p0", "-k", "engine_starts or greedy_logprobs_match")
    deadline = time.time() + 180
    # wait until the engine is being started (its log exists), then cancel as CI would
    while time.time() < deadline and not list(tmp_path.glob("*/engine-*.log")):
        time.sleep(0.2)
    assert list(tmp_path.glob("*/engine-*.log")), "the run never started an engine"
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]
    (results,) = tmp_path.glob("*/results.json")
    record = json.loads(results.read_text())
    validate(record)
    assert record["complete"] is False
    assert any(c["message"].startswith("did not run") for c in record["checks"])


def test_concurrent_runs_into_one_reports_dir_stay_separate(tmp_path):
    procs = [start_run(tmp_path, "--tier", "p0", "-k", "torch_build") for _ in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-2000:]
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 2
    for run_dir in runs:
        record = json.loads((run_dir / "results.json").read_text())
        validate(record)
        assert record["run_id"] == run_dir.name and record["complete"]
