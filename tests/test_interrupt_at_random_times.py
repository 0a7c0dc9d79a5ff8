"""Signals at random times across a real P0 under nox (`nox -s p0` as a terminal or a CI runner sends them): each
run exits 2 (the median within MEDIAN_S of its signal, none past HANG_S), writes results.json with
`complete: false` and a junit.xml that lists every check it did not run as an error, starts nothing after the
signal, and leaves no process behind.

The times are drawn (seeded, so a failure can be replayed) from the run's start, when its header names its folder,
to P0_SPAN_S past it, which covers a whole P0 of the CPU default here (~30 s on 2 cores): the fixture building, the
engine and server starts, the checks and the server checks at its end. A signal that comes after the run has written
its whole record interrupts nothing: that trial is drawn again, inside the time such a run took, until SIGNALS
signals have landed mid-run (at most EXTRA_TRIALS more runs). Even trials send Ctrl-C to the whole
process group, odd ones SIGTERM to nox alone (`kill`, a CI cancellation). The table of signal-to-exit times is
printed (pytest -s)."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.run import runrecord
from reports.results import validate
from tests.test_interrupt import _marked, _nox, read_in_background

pytestmark = pytest.mark.slow

SIGNALS = int(os.environ.get("CONFORMANCE_INTERRUPT_SIGNALS", "20"))
SEED = int(os.environ.get("CONFORMANCE_INTERRUPT_SEED", "20261207"))
P0_SPAN_S = 30.0
EXTRA_TRIALS = 10
# From the signal to the exit of nox, the run recorded. The goal is STOP_S (held by 19-20 of 20 signals on a quiet
# 2-core host); the time grows with CPU contention (median 7.3 s, max 20.8 s beside a whole second test suite), so
# the test holds the median to MEDIAN_S and each signal to HANG_S, past which it is a hang.
STOP_S = 5.0
MEDIAN_S = 10.0
HANG_S = 60.0
STARTED_BY = ("engine-", "vllm-server")  # the logs of what a run starts: one per engine, one per server


def _signal_once(work: Path, n: int, delay_s: float) -> dict:
    """One nox P0, signalled `delay_s` after its run began; what happened."""
    marker = f"CONFORMANCE_INTERRUPT_PROBE={uuid.uuid4().hex}"
    reports = work / "runs"
    work.mkdir(parents=True)
    proc = _nox(work, reports, marker)
    lines, begun, reader = read_in_background(proc)
    assert begun.wait(180), "".join(lines)[-3000:]
    time.sleep(delay_s)
    how = "Ctrl-C to the group" if n % 2 == 0 else "SIGTERM to nox"
    if proc.poll() is not None:
        return {"n": n, "delay": delay_s, "how": how, "finished_first": True, "span": delay_s, "out": "".join(lines)}
    started_before = _started(reports)  # the run's folder may not exist yet: a run makes it as it first writes
    if n % 2 == 0:
        os.killpg(proc.pid, 2)
    else:
        os.kill(proc.pid, 15)
    sent = time.monotonic()
    proc.wait(timeout=120)
    took = time.monotonic() - sent
    reader.join(30)
    deadline = time.monotonic() + 15  # a child's exit is reaped by its parent a moment after
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    if json.loads((run_dir / "results.json").read_text()).get("complete") is True:
        # the signal raced the end: the run had written its whole record (a signal during the run makes it
        # incomplete), and nox was exiting: it exits 0, or 2 where the signal reached nox before its child's exit
        return {"n": n, "delay": delay_s, "how": how, "finished_first": True, "span": delay_s, "out": "".join(lines)}
    started_after = _started(reports) - started_before
    return {"n": n, "delay": delay_s, "how": how, "finished_first": False, "code": proc.returncode, "took": took,
            "run_dir": run_dir, "left": _marked(marker), "started_after": sorted(started_after),
            "out": "".join(lines)}


def _started(reports: Path) -> set[str]:
    """The logs of every engine and server the run under `reports` has started so far."""
    return {p.name for p in reports.glob("*/*") if p.name.startswith(STARTED_BY)}


def _junit_not_run_errors(run_dir: Path) -> tuple[int, int]:
    root = ET.parse(run_dir / "junit.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = list(suite.iter("testcase"))
    errors = [c for c in cases if c.find("error") is not None and
              c.find("error").get("message", "").startswith("not run: ")]
    return len(cases), len(errors)


def test_signals_at_random_times_across_a_p0_under_nox_each_leave_an_incomplete_record_and_nothing_else(tmp_path):
    rng = random.Random(SEED)
    span = P0_SPAN_S
    trials: list[dict] = []
    while sum(not t["finished_first"] for t in trials) < SIGNALS and len(trials) < SIGNALS + EXTRA_TRIALS:
        n = len(trials)
        trials.append(_signal_once(tmp_path / f"signal-{n:02d}", n, rng.uniform(0.0, span)))
        if trials[-1]["finished_first"]:  # the run was over by then: draw inside the time it took
            span = min(span, 0.9 * trials[-1]["span"])
    interrupted = [t for t in trials if not t["finished_first"]]
    print(f"\n{'#':>2}  {'into the run':>12}  {'signal':20s}  {'exit':>4}  {'signal to exit':>14}")
    for t in trials:
        outcome = "  finished before the signal took effect (drawn again)" if t["finished_first"] else \
            f"{t['code']:4d}  {t['took']:12.2f} s"
        print(f"{t['n']:2d}  {t['delay']:10.1f} s  {t['how']:20s}  {outcome}")
    times = [t["took"] for t in interrupted]
    print(f"{len(interrupted)} of {len(trials)} signalled mid-run; signal to exit: median "
          f"{statistics.median(times):.2f} s, max {max(times):.2f} s")
    assert len(interrupted) == SIGNALS, f"only {len(interrupted)} of {len(trials)} signals landed inside the run"
    for t in interrupted:
        why = f"signal {t['n']} ({t['how']}, {t['delay']:.1f} s in): " + t["out"][-2500:]
        assert t["code"] == 2, why
        record = json.loads((t["run_dir"] / "results.json").read_text())
        validate(record)
        assert record["complete"] is False and record["exit_status"] == 2 and record["evidence"] is False, why
        cases, errors = _junit_not_run_errors(t["run_dir"])
        # a signal after the last check leaves nothing unrun: the record is still incomplete, never evidence
        # before collection the unrun checks are named by function (a parametrized one once)
        assert cases >= len(runrecord.tier_functions(("p0",))) and errors >= len(record["not_run"]), (cases, errors,
                                                                                                      why)
        assert t["left"] == [], f"{why}\nleft behind: {t['left']}"
        assert t["started_after"] == [], f"{why}\nstarted after the signal: {t['started_after']}"
        assert t["took"] < HANG_S, f"{why}\ntook {t['took']:.1f} s to exit"
    quick = sum(t["took"] < STOP_S for t in interrupted)
    print(f"{quick} of {len(interrupted)} exited within {STOP_S:.0f} s")
    assert statistics.median(times) < MEDIAN_S, f"signal to exit: median {statistics.median(times):.1f} s"
