"""Pinned serving baselines: the figures a P2 serving check is judged against, per check, lineage (target,
hardware and combination) and model. A pin is the per-figure median of accepted runs (complete, the check
passed or was measured without a baseline, and no kernel compiled while it was measured), promoted deliberately
with `conformance baseline promote`; a run never becomes the baseline by itself. The pins live in one JSON file
(default `baselines.json` beside the history store), kept apart from the history store, which is a cache rebuilt
from the runs.

Standard library only: the suite (which judges against a pin) and the reports (which promote one) share it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA = 2  # 2: a pin's lineage names the run's dtype and serving profile too (serving_lineage)
PINS_ENV = "CONFORMANCE_BASELINES"
HISTORY_ENV = "CONFORMANCE_HISTORY_DB"  # the history store a run reads its drift since the pin from
PINS_FILE = "baselines.json"
SERVING_CHECK = "conformance/checks/test_serving_perf.py::test_serving_perf_against_baseline"
# The checks judged against pins, each at every parameter (concurrency, bench shape): `baseline promote`'s default.
SERVING_CHECKS = (SERVING_CHECK, "conformance/checks/test_serving_perf.py::test_serving_perf_at_shape")
# A stored check outcome whose figures may be promoted: passed, or skipped for want of a baseline (the first
# measurement of a lineage). A failed check, a regression, never becomes the new normal.
ACCEPTED_OUTCOMES = ("passed", "skipped")
# A measured run during which the server compiled a Triton kernel (perf.toml jit_log_marker, counted by the check)
# has a latency outlier that is the compiler's, not the stack's: never a baseline. vLLM 0.26.0 on the H200, c8 of the
# 1k/1k mix after its warm-up: one compile, TTFT p99 1669 ms against a p50 of 47 ms (run 20261204T124307-cuda-7af75f).
JIT_FIGURE = "jit_compiles_during_run"
FAILED_FIGURE = "failed"  # requests of the measured run that failed: such a measurement is never a baseline
SHARED_FIGURE = "gpu_foreign_processes"  # other processes on the GPU while it was measured: never a baseline either
# The host's speed as the level started (env_checks.probes.host.host_speeds): pinned like any figure, so a later miss
# on a slower host is told apart (conformance/verdicts/host_speed.py); each figure with what its probe measures and its
# unit.
HOST_FIGURE = "host_single_thread_mops"
HOST_FIGURES = {HOST_FIGURE: ("single-thread probe", "million steps a second"),
                "host_copy_gbs": ("memory-copy probe", "GB a second")}
# Figures the check derives from a baseline; never part of a baseline themselves.
DERIVED_SUFFIXES = ("_vs_baseline", "_vs_pinned", "_vs_floor", "_drift_since_pin")
DERIVED_NAMES = ("runs_since_pin",)


def serving_lineage(lineage: str, dtype: str | None, profile: str | None) -> str:
    """What a run's serving figures compare with: its platform lineage (target, hardware, engine, combo), its dtype
    and its serving profile with the backend row. A bf16 run on FlashAttention is no baseline for an fp16 one on
    Triton, nor a run that says no dtype for one that does."""
    return " · ".join([lineage, dtype or "dtype unknown", *([f"profile {profile}"] if profile else [])])


class PinError(ValueError):
    """The pin file cannot be used; the message is one sentence naming the file and what to do."""


@dataclass(frozen=True)
class AcceptedRun:
    run_id: str
    started_at: str
    figures: dict[str, float]


@dataclass(frozen=True)
class Pin:
    check_id: str
    lineage: str
    model: str
    figures: dict[str, float]
    runs: tuple[AcceptedRun, ...]  # the runs the median came from, their own figures dropped
    promoted_at: str
    note: str = ""
    # per figure, how far its runs lay apart: (largest - smallest) / median; none from a single run
    spread: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.check_id, self.lineage, self.model)

    def describe(self) -> str:
        ids = ", ".join(r.run_id for r in self.runs)
        return f"pinned baseline promoted {self.promoted_at}, median of {len(self.runs)} run(s): {ids}"

    def to_json(self) -> dict[str, Any]:
        return {"check_id": self.check_id, "lineage": self.lineage, "model": self.model, "figures": self.figures,
                "runs": [{"run_id": r.run_id, "started_at": r.started_at} for r in self.runs],
                "promoted_at": self.promoted_at, "note": self.note} | ({"spread": self.spread} if self.spread else {})


@dataclass
class Pins:
    path: Path
    pins: dict[tuple[str, str, str], Pin] = field(default_factory=dict)

    def get(self, check_id: str, lineage: str, model: str) -> Pin | None:
        return self.pins.get((check_id, lineage, model))

    def put(self, pin: Pin) -> None:
        self.pins[pin.key] = pin

    def save(self) -> None:
        """Write the file whole (a temporary file renamed over it), pins sorted so diffs stay small."""
        body = {"schema": SCHEMA, "baselines": [self.pins[k].to_json() for k in sorted(self.pins)]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.path)


def pins_path(history_db: Path) -> Path:
    """$CONFORMANCE_BASELINES, else `baselines.json` beside the history store."""
    return Path(os.environ.get(PINS_ENV) or history_db.parent / PINS_FILE)


def _bad(path: Path, why: str) -> PinError:
    return PinError(f"the pinned-baseline file {path} is unusable ({why}); fix it or move it aside and promote "
                    f"again with `conformance baseline promote`.")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load(path: Path) -> Pins:
    """The pins in `path` (none when the file does not exist); PinError, one sentence, when it is damaged."""
    if not path.exists():
        return Pins(path)
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, f"not readable JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    if isinstance(body, dict) and body.get("schema") == 1:
        raise _bad(path, "its pins are of schema 1, keyed by the platform lineage alone, so a bf16 pin would judge an "
                         "fp16 run; since schema 2 a pin's lineage names the dtype and serving profile too")
    if not isinstance(body, dict) or body.get("schema") != SCHEMA or not isinstance(body.get("baselines"), list):
        raise _bad(path, f"not a schema-{SCHEMA} object with a `baselines` list")
    pins = Pins(path)
    for n, row in enumerate(body["baselines"]):
        where = f"entry {n}"
        if not isinstance(row, dict):
            raise _bad(path, f"{where} is not an object")
        for name in ("check_id", "lineage", "model", "promoted_at"):
            if not isinstance(row.get(name), str) or not row[name]:
                raise _bad(path, f"{where} has no `{name}` string")
        figures, runs = row.get("figures"), row.get("runs")
        if not isinstance(figures, dict) or not figures:
            raise _bad(path, f"{where} ({row['check_id']}) has no figures")
        bad = sorted(k for k, v in figures.items() if not _finite(v))
        if bad:
            raise _bad(path, f"{where} ({row['check_id']}) has non-finite or non-numeric figures {', '.join(bad)}")
        if not isinstance(runs, list) or not runs or not all(
                isinstance(r, dict) and isinstance(r.get("run_id"), str) for r in runs):
            raise _bad(path, f"{where} ({row['check_id']}) does not name the runs it came from")
        spread = row.get("spread", {})
        if not isinstance(spread, dict) or not all(_finite(v) and float(v) >= 0 for v in spread.values()):
            raise _bad(path, f"{where} ({row['check_id']}) has a `spread` that is not figures of non-negative numbers")
        pin = Pin(row["check_id"], row["lineage"], row["model"], {k: float(v) for k, v in figures.items()},
                  tuple(AcceptedRun(r["run_id"], str(r.get("started_at", "")), {}) for r in runs),
                  row["promoted_at"], str(row.get("note") or ""), {k: float(v) for k, v in spread.items()})
        if pin.key in pins.pins:
            raise _bad(path, f"{where} pins {row['check_id']} for {row['lineage']!r} {row['model']!r} a second time")
        pins.put(pin)
    return pins


def _measured(figures: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in figures.items() if _finite(v) and not k.endswith(DERIVED_SUFFIXES)
            and k not in DERIVED_NAMES}


def runs_of(history: Any, lineage: str, model: str, check_id: str, outcomes: Iterable[str] | None = None,
            since: str | None = None) -> list[AcceptedRun]:
    """The complete runs that are platform evidence (not narrowed, planted or refused) of this serving lineage
    (serving_lineage) and model that stored `check_id` (with one of `outcomes`, when given; started after `since`,
    when given), oldest first, with the figures they measured. `history` is a `reports.history.History` (read
    through its `runs()` and `checks()`)."""
    wanted = tuple(outcomes) if outcomes is not None else None
    candidates = [r for r in history.runs() if serving_lineage(r.lineage, r.dtype, r.profile) == lineage
                  and r.model == model and r.complete and not r.not_evidence
                  and (since is None or r.started_at > since)]
    checks = history.checks(r.run_id for r in candidates) if candidates else {}
    out = []
    for run in candidates:  # runs() is oldest first
        for row in checks.get(run.run_id, []):
            if row.id == check_id and (wanted is None or row.outcome in wanted):
                out.append(AcceptedRun(run.run_id, run.started_at, _measured(row.figures)))
    return out


def unpinnable_because(run: AcceptedRun, names: Iterable[str] = ()) -> str | None:
    """Why a measurement may not be a baseline, in a few words, or None where it may: it must have every figure in
    `names`, no kernel compiled while it was measured (JIT_FIGURE), none of its requests failed (FAILED_FIGURE) and
    no other process held the GPU (SHARED_FIGURE)."""
    f = run.figures
    if missing := [n for n in names if n not in f]:
        return f"it lacks {', '.join(missing)}"
    if f.get(JIT_FIGURE, 0) > 0:
        return (f"a kernel compiled while it was measured ({JIT_FIGURE} {f[JIT_FIGURE]:g}): its latency is the "
                "compiler's")
    if f.get(FAILED_FIGURE, 0) > 0:
        return f"{f[FAILED_FIGURE]:g} of its requests failed"
    if f.get(SHARED_FIGURE, 0) > 0:
        return f"another process held the GPU while it was measured ({SHARED_FIGURE} {f[SHARED_FIGURE]:g})"
    return None


def _candidates(history: Any, lineage: str, model: str, check_id: str,
                run_ids: Iterable[str] | None) -> list[AcceptedRun]:
    """The measurements promotion considers, oldest first: the check passed or skipped, or, for runs named in
    `run_ids` (which the operator vouches for: a run that failed only against the pin it is to join), any outcome."""
    if run_ids is None:
        return runs_of(history, lineage, model, check_id, ACCEPTED_OUTCOMES)
    wanted = set(run_ids)
    return [r for r in runs_of(history, lineage, model, check_id) if r.run_id in wanted]


def screened(history: Any, lineage: str, model: str, check_id: str, names: Iterable[str] = (),
             run_ids: Iterable[str] | None = None) -> tuple[list[AcceptedRun], list[tuple[AcceptedRun, str]]]:
    """Promotion's `_candidates` in one read: those whose figures may be promoted (`unpinnable_because` has nothing
    against them), and those it may not pin, with why (runs that measured nothing are not listed)."""
    names = list(names)
    accepted, left_out = [], []
    for run in _candidates(history, lineage, model, check_id, run_ids):
        why = unpinnable_because(run, names)
        if why is None:
            accepted.append(run)
        elif run.figures:
            left_out.append((run, why))
    return accepted, left_out


def accepted_runs(history: Any, lineage: str, model: str, check_id: str,
                  names: Iterable[str] = (), run_ids: Iterable[str] | None = None) -> list[AcceptedRun]:
    """The runs whose figures may be promoted (`screened`'s first list)."""
    return screened(history, lineage, model, check_id, names, run_ids)[0]


def median_pin(check_id: str, lineage: str, model: str, runs: list[AcceptedRun], note: str = "",
               now: datetime | None = None) -> Pin:
    """The per-figure median of `runs`, over the figures every one of them measured, with each figure's spread
    over them (from two runs or more): what the same stack measured apart on the same machine, which a later run's
    verdict does not call a regression (conformance/verdicts/perf.py regression_verdict)."""
    if not runs:
        raise ValueError("a pin needs at least one accepted run")
    common = set(runs[0].figures).intersection(*(r.figures for r in runs[1:]))
    figures = {name: float(statistics.median(r.figures[name] for r in runs)) for name in sorted(common)}
    spread = {} if len(runs) < 2 else {
        name: (max(r.figures[name] for r in runs) - min(r.figures[name] for r in runs)) / abs(figures[name])
        for name in sorted(common) if figures[name]}
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Pin(check_id, lineage, model, figures, tuple(AcceptedRun(r.run_id, r.started_at, {}) for r in runs),
               stamp, note, spread)
