"""What the history store hands out: a stored run (`RunInfo`) and a stored check (`CheckRow`), and the rule that says
whether a run is platform evidence (`not_evidence`).

A run belongs to two series. Its **platform lineage** (`RunInfo.lineage`: platform, engine under test and combo,
``cuda H200 · vllm · installed``) is what the serving baselines key on, together with the model. The dashboard's
**lineage** (`RunInfo.series`) adds what else makes two runs comparable: the model, the dtype the verdicts were
judged in and the serving profile (``cuda H200 · vllm · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny``).
Parity columns, trends, verdicts and "what changed" follow `series`, so a bf16 run is never compared as if it were
the fp32 run before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reports.stack import FingerprintChange, diff_fingerprints

TORCH_BUILD_CHECK = "test_torch_build_matches_target"
UNKNOWN_DTYPE = "dtype ?"  # rows stored before schema 7 and not read again since


def not_evidence(record: dict) -> str | None:
    """Why a run may not count towards a release decision, in a few words; None when it may. Records written before
    results.json said so (`evidence`) are judged from what they hold."""
    if not record["complete"]:
        return "interrupted (complete: false)"
    if record.get("planted_fault"):
        return f"a negative control: fault {record['planted_fault']} planted in the engine"
    if record.get("narrowed_by"):
        return f"narrowed by {record['narrowed_by']}"
    refused = [c for c in record["checks"]
               if c["id"].endswith(TORCH_BUILD_CHECK) and c["outcome"] in ("failed", "error")]
    if refused:
        return f"refused: the installed torch is no {record['target']} build (a usage mistake, not a platform result)"
    if record.get("exit_status") not in (None, 0, 1):
        return f"stopped (exit {record['exit_status']})"
    if record.get("evidence") is False:
        return "not evidence (its results.json says so)"
    return None


def model_label(name: str) -> str:
    """A model as lineages name it: a checkpoint path by its last component (``/models/gpt-oss-120b/``)."""
    return name.rstrip("/").rsplit("/", 1)[-1] or name


def series_key(lineage: str, model: str, dtype: str | None, profile: str | None) -> str:
    """The dashboard's lineage of a run: its platform lineage, model, dtype and profile (records.py docstring)."""
    profile_part = [f"profile {profile}"] if profile else []
    return " · ".join([lineage, model_label(model), dtype or UNKNOWN_DTYPE, *profile_part])


@dataclass(frozen=True)
class RunInfo:
    """One stored run (the `runs` row), with its summary counts."""

    run_id: str
    started_at: str
    target: str
    engine: str
    combo: str | None
    tiers: tuple[str, ...]
    complete: bool
    model: str
    platform: str
    lineage: str
    fingerprint: dict
    summary: dict[str, int]
    not_evidence: str | None = None  # why the run is no platform result (None: it is one)
    dtype: str | None = None
    profile: str | None = None
    planted_fault: str | None = None
    narrowed_by: str | None = None
    exit_status: int | None = None
    model_hash: str | None = None
    source: str | None = None  # the run directory's name it was read from

    @property
    def green(self) -> bool:
        """Complete and nothing failed or errored (known bugs, xfailed, do not make a run red)."""
        return self.complete and self.summary["failed"] == 0 and self.summary["error"] == 0

    @property
    def series(self) -> str:
        return series_key(self.lineage, self.model, self.dtype, self.profile)

    @property
    def options(self) -> dict[str, object]:
        """How the run was asked for, beside the fingerprint of what it ran on: "what changed" diffs both."""
        return {"engine": self.engine, "dtype": self.dtype, "profile": self.profile, "model": self.model,
                "model_hash": self.model_hash, "combo": self.combo, "tiers": list(self.tiers),
                "planted_fault": self.planted_fault, "narrowed_by": self.narrowed_by, "complete": self.complete,
                "exit_status": self.exit_status}


def diff_runs(before: RunInfo, after: RunInfo) -> list[FingerprintChange]:
    """Every field that differs between two runs: their options (`run.engine`, `run.dtype` …) first, then the
    fingerprint's key paths. Never empty when the engine, dtype, model or profile changed."""
    return (diff_fingerprints({"run": before.options}, {"run": after.options})
            + diff_fingerprints(before.fingerprint, after.fingerprint))


@dataclass(frozen=True)
class CheckRow:
    """One stored check result."""

    run_id: str
    id: str
    tier: str
    area: str
    outcome: str
    duration: float = 0.0
    message: str = ""
    failure_class: str | None = None
    bug_link: str | None = None
    reference: str = ""
    figures: dict = field(default_factory=dict)
