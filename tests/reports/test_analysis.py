"""Parity scores, ROCm-vs-CUDA disagreements, pass rates, failure classes and "what changed", on hand-made
data with numbers worked out by hand, and on the sample runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports import analysis
from reports.analysis import ALL, Column, ParityScore
from reports.history import CheckRow, History
from tests.reports.conftest import FIXTURE_RUNS, ROCM_GREEN, ROCM_RED

# check id → (tier, area, {column: outcome}); columns: A = CUDA, B = ROCm, C = CPU.
HAND_MADE = {
    "c1": ("p0", "math", {"A": "passed", "B": "passed", "C": "passed"}),  # passes everywhere
    "c2": ("p0", "math", {"A": "passed", "B": "failed", "C": "passed"}),  # ROCm fails: disagreement
    # A skip does not count against parity; for ROCm vs CUDA it is "not run on ROCm".
    "c3": ("p0", "engine", {"A": "passed", "B": "skipped", "C": "passed"}),
    "c4": ("p1", "engine", {"A": "skipped", "B": "skipped", "C": "skipped"}),  # nobody ran it: left out
    "c5": ("p1", "engine", {"A": "failed", "B": "failed", "C": "xpassed"}),  # CUDA fails too: no disagreement
    "c6": ("p1", "math", {"A": "passed", "B": "xfailed"}),  # a known bug on ROCm is a disagreement
    "c7": ("p1", "math", {"C": "passed"}),  # one platform ran it and passed
}


def hand_made_matrix(extra_rocm: dict[str, str] | None = None) -> analysis.Matrix:
    columns = [Column("A", "cuda H200", "cuda"), Column("B", "rocm gfx942", "rocm"),
               Column("C", "cpu", "cpu")]
    results: dict[str, list[CheckRow]] = {"A": [], "B": [], "C": []}
    for check_id, (tier, area, outcomes) in HAND_MADE.items():
        for column, outcome in outcomes.items():
            results[column].append(CheckRow(column, check_id, tier, area, outcome))
    if extra_rocm:
        columns.append(Column("D", "rocm gfx950", "rocm"))
        results["D"] = [CheckRow("D", cid, HAND_MADE[cid][0], HAND_MADE[cid][1], outcome)
                        for cid, outcome in extra_rocm.items()]
    return analysis.build_matrix(columns, results)


def test_parity_scores_on_a_hand_made_matrix() -> None:
    scores = {(s.tier, s.area): s for s in analysis.parity_scores(hand_made_matrix())}
    assert scores == {
        ("p0", "math"): ParityScore("p0", "math", 1, 2),      # c1 yes, c2 no
        ("p0", "engine"): ParityScore("p0", "engine", 1, 1),  # c3 yes (the skip is not counted)
        ("p0", ALL): ParityScore("p0", ALL, 2, 3),
        ("p1", "engine"): ParityScore("p1", "engine", 0, 1),  # c5 no; c4 ran nowhere
        ("p1", "math"): ParityScore("p1", "math", 1, 2),      # c6 no, c7 yes
        ("p1", ALL): ParityScore("p1", ALL, 1, 3),
        (ALL, ALL): ParityScore(ALL, ALL, 3, 6),
    }
    assert scores[(ALL, ALL)].score == 0.5
    assert scores[("p0", ALL)].score == pytest.approx(2 / 3)


def test_rocm_cuda_disagreements_on_a_hand_made_matrix() -> None:
    found = analysis.rocm_cuda_disagreements(hand_made_matrix())
    assert [(d.check_id, d.kind) for d in found] == [("c3", "not_run"), ("c2", "failed"), ("c6", "failed")]
    assert sum(d.kind == "failed" for d in found) == 2
    assert found[1].cuda == {"A": "passed"} and found[1].rocm == {"B": "failed"}


def test_disagreement_with_two_rocm_platforms() -> None:
    # A second ROCm platform passing c2 does not hide the first one's failure; c3 passing there is agreement.
    found = analysis.rocm_cuda_disagreements(hand_made_matrix({"c2": "passed", "c3": "passed"}))
    assert [(d.check_id, d.kind) for d in found] == [("c2", "failed"), ("c6", "failed")]


def test_no_rocm_column_means_no_disagreement() -> None:
    matrix = hand_made_matrix()
    matrix.columns = [c for c in matrix.columns if c.target != "rocm"]
    assert analysis.rocm_cuda_disagreements(matrix) == []


def test_agreement_with_cuda() -> None:
    matrix = hand_made_matrix()
    # ROCm ran c1, c2, c5, c6 where CUDA ran too: c1 and c5 agree (pass/pass, fail/fail).
    assert analysis.agreement(matrix, "B") == (2, 4)
    assert analysis.agreement(matrix, "C") == (3, 4)  # c1, c2, c3 agree; c5 xpassed vs CUDA failed


def test_pass_rate_ignores_skips_and_counts_xpass() -> None:
    assert analysis.pass_rate({"passed": 3, "failed": 1, "skipped": 2, "xpassed": 1}) == 0.8
    assert analysis.pass_rate({"xfailed": 1, "passed": 1}) == 0.5
    assert analysis.pass_rate({"skipped": 4}) is None


@pytest.mark.parametrize("outcome, message, recorded, hint, expected", [
    ("passed", "", None, None, None),
    ("skipped", "no FP8 on this GPU", None, None, "capability_gap"),
    ("xfailed", "known", None, None, "known_bug"),
    ("failed", "max |Δlogprob| 0.8 > 0.3", None, None, "new_failure"),
    ("failed", "Failed: Timeout >300.0s", None, None, "timeout"),
    ("error", "engine exited with code -11 (SIGSEGV)", None, None, "crash"),
    ("error", "fixture setup failed", None, None, "could_not_run"),
    ("failed", "Timeout >1s", None, "capability_gap", "capability_gap"),
    ("failed", "whatever", "known_bug", "timeout", "known_bug"),
])
def test_failure_class(outcome: str, message: str, recorded: str | None, hint: str | None,
                       expected: str | None) -> None:
    check = CheckRow("r", "c", "p0", "engine", outcome, message=message, failure_class=recorded)
    assert analysis.failure_class(check, hint) == expected


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory: pytest.TempPathFactory) -> History:
    history = History.open(tmp_path_factory.mktemp("h") / "h.sqlite")
    history.ingest_dir(FIXTURE_RUNS)
    yield history
    history.close()


def test_what_changed_finds_the_rocm_upgrade(sample_runs: History) -> None:
    transitions = analysis.what_changed(sample_runs.runs())
    assert [(t.lineage, t.last_green.run_id, t.first_red.run_id, t.still_red) for t in transitions] == [
        ("rocm gfx942 · vllm · rocm-latest · gpt-oss-120b · bfloat16", ROCM_GREEN, ROCM_RED, True)]
    changes = {c.path: (c.before, c.after) for c in transitions[0].changes}
    assert changes["platform.rocm_version"] == ("6.4.1", "7.0.0")
    assert changes["packages.torch"] == ("2.7.1+rocm6.4", "2.8.0+rocm7.0")
    assert changes["packages.triton_kernels"] == ("1.0.0", "null")
    assert changes["runtime.target.hip_version"] == ("6.4.43483", "7.0.51831")
    assert "collected_at" not in changes and "duration_s" not in changes  # volatile keys are not "changes"
    assert "platform.kernel_release" not in changes  # unchanged keys are not listed
    assert changes["run.exit_status"] == ("0", "1")  # the run's options are diffed too
    assert len(changes) == 11


def test_what_changed_reports_recovery_and_ignores_all_green() -> None:
    from reports.history import RunInfo

    def run(run_id: str, green: bool, rocm: str) -> RunInfo:
        summary = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0)
        summary["passed" if green else "failed"] = 1
        return RunInfo(run_id, run_id, "rocm", "vllm", None, ("p0",), True, "m", "p", "L", {"rocm": rocm},
                       summary)

    series = [run("1", True, "6.4"), run("2", False, "7.0"), run("3", True, "7.0.1")]
    [step] = analysis.what_changed(series)
    assert (step.last_green.run_id, step.first_red.run_id, step.still_red) == ("1", "2", False)
    assert analysis.what_changed([run("1", True, "6.4"), run("2", True, "7.0")]) == []
    assert analysis.what_changed([run("1", False, "6.4")]) == []


def test_flipped_checks_between_green_and_red(sample_runs: History) -> None:
    pair = sample_runs.checks([ROCM_GREEN, ROCM_RED])
    flipped = {red.id.split("::")[1]: (old.outcome if old else None, red.outcome)
               for old, red in analysis.flipped_checks(pair[ROCM_GREEN], pair[ROCM_RED])}
    assert flipped == {
        "test_gemm_matches_fp64[fp8_e4m3]": ("passed", "error"),
        "test_greedy_logprobs_match_reference": ("passed", "failed"),
        "test_window_boundary_at_depth": ("passed", "failed"),
        "test_mxfp4_moe_matches_dequantized": ("passed", "error"),
        "test_all_reduce_tp8": ("passed", "failed"),
    }


def test_sample_parity_and_disagreements(sample_runs: History) -> None:
    runs = sample_runs.runs()
    latest = analysis.latest_per_lineage(runs)
    columns = [Column(k, r.platform, r.target, r) for k, r in latest.items()]
    checks = sample_runs.checks(r.run_id for r in latest.values())
    matrix = analysis.build_matrix(columns, {c.key: checks[c.run.run_id] for c in columns})
    overall = next(s for s in analysis.parity_scores(matrix) if (s.tier, s.area) == (ALL, ALL))
    assert (overall.passing, overall.ran) == (18, 23)
    failed = [d.check_id.split("::")[1] for d in analysis.rocm_cuda_disagreements(matrix)
              if d.kind == "failed"]
    assert sorted(failed) == sorted([
        "test_gemm_matches_fp64[fp8_e4m3]", "test_greedy_logprobs_match_reference",
        "test_window_boundary_at_depth", "test_mxfp4_moe_matches_dequantized", "test_all_reduce_tp8"])


def test_hand_made_matrix_rows_are_sorted(tmp_path: Path) -> None:
    matrix = hand_made_matrix()
    assert [r[2] for r in matrix.rows] == ["c3", "c1", "c2", "c4", "c5", "c6", "c7"]
