"""What the history store hands out: a stored run (`RunInfo`) and a stored check (`CheckRow`), and the rule that says
whether a run is platform evidence (`not_evidence`): complete, whole (its checks add up to its own summary), judged,
of the target and combination its fingerprint shows (reports/claims.py), every check of its tiers run; and whether
its model is a test model (`why_test_model`).

A run belongs to two series. Its **platform lineage** (`RunInfo.lineage`: platform, engine under test and combo,
``cuda H200 · vllm · installed``) is what the serving baselines key on, together with the model. The dashboard's
**lineage** (`RunInfo.series`) adds what else makes two runs comparable: the model, the dtype the verdicts were
judged in and the serving profile (``cuda H200 · vllm · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny``).
Parity columns, trends, verdicts and "what changed" follow `series`, so a bf16 run is never compared as if it were
the fp32 run before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reports.claims import CertifiedCombo, certified_combos, combo_contradiction, target_contradiction
from reports.limits import Limit
from reports.results import summarize
from reports.stack import FingerprintChange, diff_fingerprints

TORCH_BUILD_CHECK = "test_torch_build_matches_target"
UNKNOWN_DTYPE = "dtype ?"  # rows stored before schema 7 and not read again since
# The suite's own generated model: 3 million parameters, the real architecture's features, no meaningful answers.
TEST_MODEL_NAMES = frozenset({"tiny-gpt-oss"})
# Below this many parameters no checkpoint is the real gpt-oss (gpt-oss-20b has 21 billion).
REAL_MODEL_MIN_PARAMS = 1_000_000_000
# `model` fields by which a record may say its checkpoint is a test model (e.g. {"test_model": true}).
TEST_MODEL_FLAGS = ("test_model", "tiny")
TEST_MODEL_KINDS = frozenset({"test", "tiny", "random", "synthetic"})


def _problems(record: dict) -> str | None:
    problems = [str(p) for p in record.get("evidence_problems") or [] if str(p).strip()]
    return "; ".join(problems) if problems else None


def not_evidence(record: dict, combos: tuple[CertifiedCombo, ...] | None = None) -> str | None:
    """Why a run may not count towards a release decision, in a few words; None when it may. Records written before
    results.json said so (`evidence`) are judged from what they hold, and every record is held against its own
    fingerprint (reports/claims.py) and the combinations of ci/matrix.toml (`combos`; None: the checkout's)."""
    if not record["complete"]:
        return "interrupted (complete: false)"
    mismatch = summary_mismatch(record)
    if mismatch:
        return mismatch
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
    not_run = [str(c) for c in record.get("not_run") or []]
    if not_run:
        shown = ", ".join(not_run[:3]) + (f" and {len(not_run) - 3} more" if len(not_run) > 3 else "")
        return _problems(record) or f"{len(not_run)} check{'s' * (len(not_run) != 1)} of its tiers did not run: {shown}"
    if record.get("evidence") is False:
        return _problems(record) or "not evidence (its results.json says so)"
    contradiction = target_contradiction(record)
    if contradiction:
        return contradiction
    try:
        matrix = certified_combos() if combos is None else combos
    except ValueError as exc:  # an unreadable matrix: a record filed under a combo cannot be checked against it
        return f"combo {record['combo']} cannot be checked: {exc}" if record.get("combo") else None
    return combo_contradiction(record, matrix)


def summary_mismatch(record: dict) -> str | None:
    """Why a record's checks do not add up to its own summary, or None: the writer counts the summary from the very
    checks it lists, so a record whose list is shorter or other was cut short or edited, and its checks are not the
    run's (a dropped check would read as never run, or a failure as never happened)."""
    summary = record.get("summary") or {}
    listed = summarize(record["checks"])
    differ = [f"{outcome} {summary.get(outcome, 0)} in its summary, {listed.get(outcome, 0)} listed"
              for outcome in sorted(set(summary) | set(listed)) if summary.get(outcome, 0) != listed.get(outcome, 0)]
    return ("its checks do not add up to its own summary (" + "; ".join(differ) + "): the record was cut short or "
            "edited") if differ else None


def log_mismatch(record: dict, logged: list[dict]) -> str | None:
    """Why a record's checks are not what its run logged as each check ended (`logged`: its checks.jsonl), or None:
    a check the log names that the record lacks, or one the log has failing that the record has passing, means the
    record was cut short or edited after the run."""
    listed = {c["id"]: c["outcome"] for c in record["checks"]}
    lacking = sorted({str(c.get("id")) for c in logged} - set(listed))
    turned = sorted(str(c.get("id")) for c in logged if c.get("outcome") in ("failed", "error")
                    and listed.get(c.get("id")) in ("passed", "xpassed"))
    problems = ([f"{len(lacking)} check(s) its checks.jsonl logged are missing from it ({lacking[0]} …)"] if lacking
                else []) + ([f"{len(turned)} check(s) logged failing read passed ({turned[0]} …)"] if turned else [])
    return "; ".join(problems) + ": the record was cut short or edited" if problems else None


def why_test_model(model: dict) -> str | None:
    """Why the record's model is a test model and not the real gpt-oss (the suite's tiny model, random weights at the
    real dimensions, too few parameters, or the record says so); None when nothing says it is one."""
    name = str(model.get("name") or "")
    label = model_label(name) if name else "the model"
    if label in TEST_MODEL_NAMES:
        params = model.get("num_params")
        size = f", {params / 1e6:.0f} million parameters" if isinstance(params, int) else ""
        return f"{label}: the suite's generated test model{size}"
    if any(model.get(flag) is True for flag in TEST_MODEL_FLAGS) or model.get("kind") in TEST_MODEL_KINDS:
        return f"{label}: its record says it is a test model"
    if "realdim" in name.lower():
        return f"{label}: random weights at the real model's dimensions (a test model)"
    params = model.get("num_params")
    if isinstance(params, int) and not isinstance(params, bool) and params < REAL_MODEL_MIN_PARAMS:
        return f"{label}: {params:,} parameters, too few for the real model"
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
    suite: dict | None = None  # the suite that judged it: {version, commit, data_hash}; None: not recorded
    test_model: str | None = None  # why its model is a test model (`why_test_model`); None: nothing says so

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
    limits: dict[str, Limit] | None = None  # the limits it was judged by, as recorded; None: not recorded
