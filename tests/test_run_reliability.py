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


def _forkserver_of(pid: int) -> bool:
    """Whether process `pid` has a forkserver child (Linux /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid and \
                    b"multiprocessing.forkserver" in (stat.parent / "cmdline").read_bytes():
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def test_sigterm_mid_run_writes_an_incomplete_run(tmp_path):
    """Cancelled as CI cancels a job, while the forkserver still imports vLLM for the engine checks (the run's
    folder exists, no check has finished): exit 2, an incomplete record, and the run gone at once (the forkserver
    is killed, not waited for). Waiting for the engine's own start cost ~12 s more here."""
    proc = start_run(tmp_path, "--tier", "p0", "-k", "engine_starts or greedy_logprobs_match")
    deadline = time.time() + 180
    while time.time() < deadline and not _forkserver_of(proc.pid) and proc.poll() is None:
        time.sleep(0.1)
    assert _forkserver_of(proc.pid), "the run never started its forkserver (its checks are collected by then)"
    os.killpg(proc.pid, signal.SIGTERM)
    cancelled = time.time()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]
    assert time.time() - cancelled < 60, "the run outlived its cancellation (a forkserver left importing?)"
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
