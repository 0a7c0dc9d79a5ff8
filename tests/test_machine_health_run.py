"""Machine health in a real `conformance run`: a planted kernel-log line of a GPU reset, fed through the same
reader (CONFORMANCE_KERNEL_LOG_EXTRA), fails the run with its signature even though every check passed, when the
target's policy fails on faults; the CPU default's own policy records it without failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import datafiles
from conformance.monitor import machine_health
from env_checks.signatures import match
from reports.results import validate

RESET = "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!"


def run(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    planted = tmp_path / "kernel-extra.txt"
    planted.write_text(RESET + "\n")
    env = os.environ | {machine_health.EXTRA_ENV: str(planted)}
    reports = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--reports-dir", str(reports), "--tier", "p0",
                           "-k", "torch_build", *args], capture_output=True, text=True, timeout=600, env=env)
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "results.json").read_text())
    validate(record)
    return proc, record


@pytest.mark.slow
def test_a_planted_gpu_reset_fails_the_run_with_its_signature(tmp_path):
    (expected,) = [m.id for m in match(RESET, source="kernel")]
    strict = tmp_path / "strict.toml"
    strict.write_text((datafiles.DATA / "health.toml").read_text().replace(
        "fail_on_faults = false", "fail_on_faults = true"))
    proc, record = run(tmp_path, "strict", "--health-policy", str(strict))
    assert record["summary"]["failed"] == record["summary"]["error"] == 0 and record["summary"]["passed"] >= 1
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    health = record["machine_health"]
    assert health["verdict"] == "fail" and [f["id"] for f in health["faults"]] == [expected]
    assert health["faults"][0]["detail"] == RESET and health["faults"][0]["source"] == "kernel"
    assert [x["text"] for x in health["kernel_lines_during_run"]] == [RESET]
    assert f"machine fault {expected}" in proc.stdout and "verdict: FAIL" in proc.stdout
    assert record["telemetry"]["status"] == "off on the cpu target"
    kernel = health["before"]["kernel_log"]
    assert kernel["status"] in ("ok", "denied", "unavailable") and kernel["detail"]  # said, never silent

    # the same planted line under the CPU default's own policy: recorded, shown, not a failure
    proc, record = run(tmp_path, "default")
    assert proc.returncode == 4, proc.stdout[-3000:]  # what ran passed; narrowed by -k, so no pass (exit 4)
    assert record["machine_health"]["verdict"] == "recorded" and "verdict: NOT A PASS (narrowed" in proc.stdout
    assert "were deselected (-k 'torch_build')" in proc.stdout and not record["evidence"]
    assert f"machine fault {expected}" in proc.stdout
