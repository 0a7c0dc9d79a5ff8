"""The machine's health around a run: a snapshot when the session starts, GPU telemetry sampled during it, a
second snapshot and the diff when it ends (env_checks.health, conformance.monitor.telemetry). What the findings do is
per target, as data (conformance/data/health.toml, or `--health-policy FILE`): on GPU targets a new fault
(a GPU reset in the kernel log, a new uncorrectable error or retired page, a GPU that left the bus, a thermal
limit crossed) fails the run even when every check passed; the CPU default records what it can read.

CONFORMANCE_KERNEL_LOG_EXTRA names a file of kernel-log lines that the closing snapshot reads as printed
during the run, through the same reader and signatures: the planted-fault control of the suite's tests.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance import datafiles
from conformance.monitor.telemetry import Sampler, judge
from env_checks import health

EXTRA_ENV = "CONFORMANCE_KERNEL_LOG_EXTRA"
POLICY_ENV = "CONFORMANCE_HEALTH_POLICY"


@dataclass
class HealthRun:
    target: str
    policy: dict[str, Any]
    limits: list[dict[str, Any]]
    before: health.Snapshot | None = None
    sampler: Sampler | None = None
    thread: threading.Thread | None = None
    error: str | None = None
    record: dict[str, Any] = field(default_factory=dict)


_RUN: dict[str, HealthRun] = {}  # one session per process: the current run under "run"


def load_policy(target: str, path: str | Path | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    table = datafiles.load_toml(Path(path) if path else datafiles.DATA / "health.toml")
    if target not in table:
        raise datafiles.DataError(f"health policy {path or 'health.toml'} has no [{target}] table: add one.")
    return dict(table[target]), list(table.get("telemetry_limits", []))


def start(target: str, policy_path: str | None = None) -> HealthRun:
    """Take the opening snapshot (in a thread: the first checks need not wait) and start telemetry."""
    policy, limits = load_policy(target, policy_path or os.environ.get(POLICY_ENV))
    run = HealthRun(target, policy, limits)
    _RUN["run"] = run

    def take() -> None:
        try:
            run.before = health.snapshot()
        except Exception as exc:  # noqa: BLE001 - recorded and shown; a broken probe must not lose the run
            run.error = f"opening health snapshot failed: {type(exc).__name__}: {exc}"

    run.thread = threading.Thread(target=take, name="conformance-health", daemon=True)
    run.thread.start()
    if policy.get("telemetry") == "gpu":
        run.sampler = Sampler(target, float(policy.get("sample_interval_s", 1.0))).start()
    return run


def finish() -> dict[str, Any] | None:
    """Stop telemetry, take the closing snapshot, diff; the record for results.json (None if never started)."""
    run = _RUN.get("run")
    if run is None:
        return None
    if run.thread is not None:
        run.thread.join(timeout=120)
    telemetry = run.sampler.stop() if run.sampler is not None else {"status": f"off on the {run.target} target"}
    faults: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    during: list[dict[str, Any]] = []
    after = None
    if run.before is None:
        run.error = run.error or "opening health snapshot did not finish within 120 s"
    else:
        try:
            after = health.snapshot(extra_kernel_lines=os.environ.get(EXTRA_ENV) or None)
            findings, during = health.diff(run.before, after)
            for f in findings:
                (faults if f.severity == "fault" else warnings).append(asdict(f))
        except Exception as exc:  # noqa: BLE001
            run.error = f"closing health snapshot failed: {type(exc).__name__}: {exc}"
    for f in judge(telemetry, run.limits):
        (faults if f["severity"] == "fault" else warnings).append(f)
    kernel = (after.record if after else run.before.record if run.before else {}).get("kernel_log", {})
    if kernel and kernel.get("status") != "ok":
        entry = {"id": "kernel-log-unreadable", "severity": "warning", "source": "probe",
                 "title": f"the kernel log could not be read ({kernel.get('status')})", "detail": kernel.get("detail")}
        if run.policy.get("kernel_log_unreadable") == "fault":
            entry["severity"] = "fault"
            faults.append(entry)
        else:
            warnings.append(entry)
    if run.error:
        faults.append({"id": "health-snapshot-failed", "severity": "fault", "source": "probe",
                       "title": "the machine-health snapshot could not be taken", "detail": run.error})
    fails = bool(faults) and bool(run.policy.get("fail_on_faults"))
    run.record = {
        "verdict": "fail" if fails else "pass" if not faults else "recorded",
        "policy": run.policy,
        "faults": faults,
        "warnings": warnings,
        "kernel_lines_during_run": during,
        "before": run.before.record if run.before else None,
        "after": after.record if after else None,
        "telemetry": telemetry,
    }
    return run.record


def results_fields() -> dict[str, Any]:
    """results.json's `machine_health` and `telemetry` fields ({} when no health run was started)."""
    run = _RUN.get("run")
    if run is None or not run.record:
        return {}
    record = dict(run.record)
    return {"machine_health": record, "telemetry": record.pop("telemetry")}


def failed() -> bool:
    run = _RUN.get("run")
    return run is not None and run.record.get("verdict") == "fail"


def summary_lines() -> list[tuple[str, bool]]:
    """(line, is_problem) for the closing summary."""
    run = _RUN.get("run")
    record = run.record if run is not None else None
    if not record:
        return []
    before, tel = record.get("before") or {}, record.get("telemetry") or {}
    kernel = before.get("kernel_log") or {}
    lines = [(f"machine health: {record['verdict'].upper()}; kernel log {kernel.get('status', '?')} via "
              f"{kernel.get('source', '?')}; {before.get('gpu_count_pci', '?')} GPU(s) on PCI, "
              f"{before.get('virtualization', '?')}; telemetry: {tel.get('status', '?')}"
              + (f", {len(tel.get('samples', []))} samples" if tel.get("samples") else ""), False)]
    for f in record["faults"]:
        lines.append((f"  machine fault {f['id']}: {f['title']}: {str(f.get('detail', ''))[:200]}"
                      + (f" Remedy: {f['remedy']}" if f.get("remedy") else ""), True))
    for w in record["warnings"]:
        lines.append((f"  machine warning {w['id']}: {w['title']}", False))
    return lines
