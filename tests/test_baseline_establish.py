"""`conformance baseline establish` on the CPU default, real vLLM-CPU: P2 run whole on this machine, its serving figures
pinned into a real history store and pin file, and one more P2 judged against that pin; and the refusals, each one
sentence with nothing pinned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from env_checks import baselines

ROOT = Path(__file__).resolve().parent.parent


def establish(tmp_path: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance", "baseline", "establish", "--db",
                           str(tmp_path / "history.sqlite"), "--reports-dir", str(tmp_path / "runs"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_establish_pins_this_machine_s_p2_and_judges_one_more_run_against_it(tmp_path):
    """One P2 to pin (its levels skip: no pin yet), its figures promoted, and a second P2 whose every serving level is
    judged against that pin (figures `*_vs_pinned`): the command's exit status is the judged run's (0 on a quiet
    host, where every level passes)."""
    proc = establish(tmp_path, "--runs", "1")
    out = proc.stdout + proc.stderr
    assert "P2 run 1 of 2 (to pin)" in out and "P2 run 2 of 2 (judged against the pin of the runs before)" in out, \
        out[-4000:]
    first, second = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    pins = baselines.load(tmp_path / baselines.PINS_FILE)
    record = json.loads((second / "results.json").read_text())
    serving = [c for c in record["checks"] if "test_serving_perf_a" in c["id"]]
    assert len(serving) == 12 and record["complete"] and record["evidence"]
    for check in serving:  # each level judged against the pin (a shared 2-core host may still move it past it)
        assert check["outcome"] in ("passed", "failed") and "output_tok_s_vs_pinned" in check["figures"], check
        pin = next(p for p in pins.pins.values() if p.check_id == check["id"])
        assert [r.run_id for r in pin.runs] == [first.name]
    assert proc.returncode == record["exit_status"], out[-4000:]
    assert f"{second.name} judged against the pin of {first.name}: exit status {record['exit_status']}" in out


@pytest.mark.parametrize(("args", "why"), [
    (["--", "-k", "serving"], "establish runs the whole P2 and pins only platform results: -k would make its runs "
                              "none"),
    (["--", "--tier", "p0"], "--tier would make its runs none"),
    (["--runs", "0"], "--runs must be at least 1."),
])
def test_establish_refuses_what_would_pin_no_platform_result(tmp_path, args, why):
    proc = establish(tmp_path, *args, timeout=120)
    assert proc.returncode != 0 and why in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / baselines.PINS_FILE).exists()


def test_a_refused_p2_run_stops_establish_with_nothing_pinned(tmp_path):
    """A P2 that cannot start (a model directory without a model) pins nothing, and says which run stopped it."""
    (tmp_path / "empty").mkdir()
    proc = establish(tmp_path, "--", "--model", str(tmp_path / "empty"), timeout=300)
    assert proc.returncode != 0
    assert "P2 run 1 of 3" in proc.stdout
    assert ("is no platform result" in proc.stderr or "wrote no run record" in proc.stderr), proc.stderr[-2000:]
    assert not (tmp_path / baselines.PINS_FILE).exists()


@pytest.mark.slow
def test_an_interrupted_establish_lets_its_run_record_itself_and_pins_nothing(tmp_path):
    """SIGTERM (nox passes Ctrl-C on so) to establish while its first P2 runs, started with SIGINT ignored as a
    background job is: the run is passed the interrupt and writes itself incomplete, and nothing is pinned."""
    from tests.background import interrupted_in_background

    runs = tmp_path / "runs"
    code, out, err = interrupted_in_background([sys.executable, "-m", "conformance", "baseline", "establish", "--db",
                                                str(tmp_path / "history.sqlite"), "--reports-dir", str(runs)],
                                               runs, cwd=ROOT)
    assert code != 0 and "interrupted during P2 run 1 of 3: that run records itself incomplete" in err, \
        out[-2000:] + err[-2000:]
    (record,) = [json.loads(p.read_text()) for p in runs.glob("*/results.json")]
    assert record["complete"] is False and record["tiers"] == ["p2"]
    assert not (tmp_path / baselines.PINS_FILE).exists()


def test_establish_names_the_levels_its_judged_run_missed_against_its_own_pin():
    """On an H100 on 2026-12-06, establish's judged run missed the pin of the two runs before it at 2 levels as
    the stack's failure, while nothing had changed. Establish says so of the kept record, naming the levels; a
    judged run whose misses are not the stack's (a shared GPU) or that missed nothing gets no such sentence."""
    from reports.baselines import missed_own_pin

    kept = ROOT / "fixtures" / "device_runs" / "20261206T123131-cuda-07b55e" / "results.json"
    record = json.loads(kept.read_text())
    said = missed_own_pin(record)
    assert said is not None and "at 2 serving level(s) (test_serving_perf_against_baseline[c32], " \
        "test_serving_perf_at_shape[1k8k-c64])" in said and "--runs N" in said
    shared = dict(record, checks=[dict(c, failure_class="shared_gpu") for c in record["checks"]])
    passed = dict(record, checks=[c for c in record["checks"] if c["outcome"] != "failed"])
    assert missed_own_pin(shared) is None and missed_own_pin(passed) is None
