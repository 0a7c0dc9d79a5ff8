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
    """`conformance run` as a terminal starts it: its own session, SIGINT at its default even where these tests were
    started with it ignored (a background job of a non-interactive shell is), since the run keeps an ignored one."""
    return subprocess.Popen([sys.executable, "-m", "conformance", "run", "--reports-dir", str(reports), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=(os.environ | (env or {})), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


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


def _session_members(sid: int) -> list[int]:
    """The live processes of session `sid` (Linux /proc), zombies aside."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return members


def test_sigterm_during_an_engine_start_leaves_no_engine_behind(tmp_path):
    """Cancelled while the first vLLM engine starts (its log exists, no check has finished): exit 2, an incomplete
    record, and nothing of the run's session left alive (the engine child and the forkserver are killed with it)."""
    proc = start_run(tmp_path, "--tier", "p0", "-k", "engine_starts")
    deadline = time.time() + 180
    while time.time() < deadline and not list(tmp_path.glob("*/engine-vllm-*.log")) and proc.poll() is None:
        time.sleep(0.05)
    assert list(tmp_path.glob("*/engine-vllm-*.log")), "the run never started a vLLM engine"
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]
    (results,) = tmp_path.glob("*/results.json")
    record = json.loads(results.read_text())
    validate(record)
    assert record["complete"] is False and record["checks"][0]["message"].startswith("did not run")
    deadline = time.time() + 30
    while _session_members(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert _session_members(proc.pid) == [], "a process of the cancelled run outlived it"


def test_concurrent_runs_into_one_reports_dir_stay_separate(tmp_path):
    procs = [start_run(tmp_path, "--tier", "p0", "-k", "torch_build") for _ in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 4, out[-2000:]  # passed, narrowed by -k
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 2
    for run_dir in runs:
        record = json.loads((run_dir / "results.json").read_text())
        validate(record)
        assert record["run_id"] == run_dir.name and record["complete"]
