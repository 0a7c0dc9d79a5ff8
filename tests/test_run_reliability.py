"""Reliability of a run itself: an interrupted run is still written (marked incomplete), and planted
secrets never reach anything the suite writes."""

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

SECRETS = {"HF_TOKEN": "hf_plantedSecretValue0123456789", "MY_SERVICE_API_KEY": "sk-plantedSecretValue0123456789"}


def start_run(reports: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "conformance", "run", "--reports-dir", str(reports), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=(os.environ | (env or {})), start_new_session=True)


def test_sigterm_mid_run_writes_an_incomplete_run(tmp_path):
    proc = start_run(tmp_path, "--tier", "p0")
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


def test_planted_secrets_reach_no_output(tmp_path):
    proc = start_run(tmp_path, "--tier", "p0", "-k", "versions or torch_build or pins", env=SECRETS)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "fingerprint.json" for p in written) and any(p.suffix == ".log" for p in written)
    for path in written:
        text = path.read_text(errors="replace")
        for name, value in SECRETS.items():
            assert value not in text, f"{name}'s value leaked into {path.name}"
    for value in SECRETS.values():
        assert value not in out
    # ... nor the dashboard built from the run
    from reports.dashboard import main as dashboard

    site = tmp_path / "site"
    assert dashboard(["--runs", str(tmp_path), "--db", str(tmp_path / "h.sqlite"), "--out", str(site)]) == 0
    for page in site.rglob("*"):
        if page.is_file():
            text = page.read_text(errors="replace")
            assert not any(value in text for value in SECRETS.values()), f"a secret leaked into {page.name}"


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
