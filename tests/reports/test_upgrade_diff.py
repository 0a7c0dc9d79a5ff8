"""`conformance compare BEFORE AFTER`, the upgrade diff (reports/upgrade_diff.py, reports/upgrade_diff_report.py),
on kept runs of fixtures/device_runs: two clean runs of one lineage, a run against its planted-fault twin, figures
judged against limits added to a copy of a run, the three output formats, bad input and the real command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.run import cli
from reports.history import History
from reports.upgrade_diff import (
    AWAY,
    BREAKS,
    CHANGED,
    FIX,
    LIMIT_NOISE_BAND,
    NEW,
    NO_LIMIT,
    NOT_MEASURED,
    NOT_RUN_AFTER,
    REGRESSION,
    STILL_BEYOND,
    TOWARDS,
    WITHIN_BAND,
    CheckResult,
    compare,
    outcome_change,
    side_of_run_dir,
)
from reports.upgrade_diff_report import main, to_json, to_markdown

ROOT = Path(__file__).resolve().parents[2]
DEVICE_RUNS = ROOT / "fixtures" / "device_runs"
# Two whole P0 runs of one lineage (vLLM on an H200, the 8-layer real-dimension model, bf16), every check passed.
CLEAN_BEFORE = DEVICE_RUNS / "20261205T031816-bench-p0-L8-0"
CLEAN_AFTER = DEVICE_RUNS / "20261205T035251-bench-p0-L8-0"
# The same lineage with fault sinks_dropped planted in the engine (a negative control, narrowed to two checks).
PLANTED_TWIN = DEVICE_RUNS / "20261205T032839-cuda-85d30b"
# The same model on an H100: another lineage (profile h100-gpt-oss-120b), every check passed.
H100_RUN = DEVICE_RUNS / "20261206T064047-bench-p0-L8-0"
GREEDY = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"
ENGINE = "conformance/checks/test_engine.py::test_engine_starts_and_generates"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_two_clean_runs_of_one_lineage_have_no_regression(capsys: pytest.CaptureFixture[str]) -> None:
    before, after = side_of_run_dir(CLEAN_BEFORE), side_of_run_dir(CLEAN_AFTER)
    assert before.run.series == after.run.series
    assert before.run.not_evidence is None and after.run.not_evidence is None
    assert all(c.outcome == "passed" for c in [*before.checks.values(), *after.checks.values()])
    diff = compare(before, after)
    assert diff.regressions == [] and diff.outcome_changes == [] and diff.unlike == []
    # no limits recorded in these runs: their figures' moves are listed, never judged
    assert diff.figure_shifts and all(s.kind == NO_LIMIT and not s.regression for s in diff.figure_shifts)
    code, out, err = _run([str(CLEAN_BEFORE), str(CLEAN_AFTER)], capsys)
    assert code == 0 and err == ""
    assert out.startswith("conformance compare: no regression: 0 regressions")
    assert "not like for like" not in out and "not platform evidence" not in out


def test_planted_fault_twin_names_its_regressions(capsys: pytest.CaptureFixture[str]) -> None:
    diff = compare(side_of_run_dir(CLEAN_BEFORE), side_of_run_dir(PLANTED_TWIN))
    failing = {c.check_id: (c.before, c.after) for c in diff.outcome_changes if c.kind == REGRESSION}
    assert failing == {GREEDY: ("passed", "failed"),
                       "conformance/checks/test_logit_parity.py::test_layer_blocks_match_reference": ("passed",
                                                                                                      "error")}
    not_run = [c for c in diff.outcome_changes if c.kind == NOT_RUN_AFTER]
    assert len(not_run) == 25 and all(c.before == "passed" and c.after is None for c in not_run)
    assert diff.regressions[0].check_id in failing  # the failures lead, the checks not run follow
    code, out, _ = _run([str(CLEAN_BEFORE), str(PLANTED_TWIN)], capsys)
    assert code == 1
    head = out.splitlines()
    assert head[0].startswith("conformance compare: REGRESSION: 27 regressions (2 now failing, 25 not run)")
    assert any(line.startswith("! AFTER is not platform evidence") and "sinks_dropped" in line for line in head[:6])
    assert f"{GREEDY}  passed → failed  — conformance.verdicts.verdict.CheckFailed" in out
    assert "run.planted_fault: null → sinks_dropped" in out  # the stack diff names the option


def _copy_with_limit(tmp_path: Path, name: str, check_id: str, figure: str, value: float | None,
                     limit: dict | None) -> Path:
    """A copy of CLEAN_BEFORE with `figure` of `check_id` set to `value` and its recorded limit set to `limit`."""
    dest = tmp_path / name
    shutil.copytree(CLEAN_BEFORE, dest)
    record = json.loads((dest / "results.json").read_text(encoding="utf-8"))
    check = next(c for c in record["checks"] if c["id"] == check_id)
    if value is not None:
        check["figures"][figure] = value
    else:
        check["figures"].pop(figure)
    if limit is not None:
        check["limits"] = {figure: limit}
    (dest / "results.json").write_text(json.dumps(record), encoding="utf-8")
    return dest


MAX_LIMIT = {"value": 25.4, "kind": "max", "source": "tolerances.toml logprobs.bfloat16.max_abs"}
MIN_LIMIT = {"value": 10.0, "kind": "min", "source": "a floor"}
THRESHOLD = {"value": 1e-6, "kind": "min", "source": "a p-value floor", "headroom": False}  # passes or breaks
BAND_MAX = LIMIT_NOISE_BAND * 25.4
BAND_MIN = LIMIT_NOISE_BAND * 10.0


@pytest.mark.parametrize(("check_id", "figure", "before", "after", "limit", "kind", "regression"), [
    (GREEDY, "max_abs_dlogprob", 17.0, 26.0, MAX_LIMIT, BREAKS, True),
    (GREEDY, "max_abs_dlogprob", 17.0, 17.0 + 1.5 * BAND_MAX, MAX_LIMIT, TOWARDS, True),
    (GREEDY, "max_abs_dlogprob", 17.0, 17.0 + 0.5 * BAND_MAX, MAX_LIMIT, WITHIN_BAND, False),
    (GREEDY, "max_abs_dlogprob", 17.0, 12.0, MAX_LIMIT, AWAY, False),
    (GREEDY, "max_abs_dlogprob", 26.0, 26.5, MAX_LIMIT, STILL_BEYOND, False),
    (GREEDY, "max_abs_dlogprob", 26.0, 26.0 + 1.5 * BAND_MAX, MAX_LIMIT, TOWARDS, True),
    (GREEDY, "max_abs_dlogprob", 17.0, None, MAX_LIMIT, NOT_MEASURED, True),
    (ENGINE, "output_tokens_per_s", 18.0, 9.0, MIN_LIMIT, BREAKS, True),
    (ENGINE, "output_tokens_per_s", 18.0, 18.0 - 1.5 * BAND_MIN, MIN_LIMIT, TOWARDS, True),
    (ENGINE, "output_tokens_per_s", 18.0, 18.0 - 0.5 * BAND_MIN, MIN_LIMIT, WITHIN_BAND, False),
    # no recorded limit (an older run): a large move is listed and is no regression
    (GREEDY, "max_abs_dlogprob", 17.0, 40.0, None, NO_LIMIT, False),
    # a threshold only (headroom: false): a p-value from 0.6 to 0.02 is no regression; under the floor it is
    (ENGINE, "output_tokens_per_s", 0.6, 0.02, THRESHOLD, WITHIN_BAND, False),
    (ENGINE, "output_tokens_per_s", 0.6, 1e-9, THRESHOLD, BREAKS, True),
], ids=["breaks-max", "towards-max", "inside-band-max", "away", "still-beyond", "further-beyond", "lost",
        "breaks-min", "towards-min", "inside-band-min", "no-limit", "threshold-moves", "threshold-breaks"])
def test_figure_shifts_are_judged_against_the_recorded_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], check_id: str, figure: str, before: float,
        after: float | None, limit: dict | None, kind: str, regression: bool) -> None:
    before_dir = _copy_with_limit(tmp_path, "before", check_id, figure, before, limit)
    after_dir = _copy_with_limit(tmp_path, "after", check_id, figure, after, limit)
    diff = compare(side_of_run_dir(before_dir), side_of_run_dir(after_dir))
    shift = next(s for s in diff.figure_shifts if s.check_id == check_id and s.figure == figure)
    assert (shift.kind, shift.regression) == (kind, regression)
    assert diff.outcome_changes == []
    code, out, _ = _run([str(before_dir), str(after_dir)], capsys)
    assert code == int(regression)
    if regression:
        regressions = out.split("Regressions (", 1)[1].split("\n\n", 1)[0]
        assert f"{check_id}  {figure}" in regressions and kind in regressions


def test_a_limit_recorded_only_by_after_judges_an_older_before(tmp_path: Path) -> None:
    before_dir = _copy_with_limit(tmp_path, "before", GREEDY, "max_abs_dlogprob", 17.0, None)
    after_dir = _copy_with_limit(tmp_path, "after", GREEDY, "max_abs_dlogprob", 24.0, MAX_LIMIT)
    diff = compare(side_of_run_dir(before_dir), side_of_run_dir(after_dir))
    shift = next(s for s in diff.figure_shifts if s.figure == "max_abs_dlogprob")
    assert shift.kind == TOWARDS and shift.regression
    assert shift.shrink == pytest.approx(7.0 / 25.4)


def test_suites_with_different_data_say_the_limits_differ(tmp_path: Path) -> None:
    sides = []
    for name, data_hash in (("before", "sha256:aaa"), ("after", "sha256:bbb")):
        dest = _copy_with_limit(tmp_path, name, GREEDY, "max_abs_dlogprob", 17.0, MAX_LIMIT)
        record = json.loads((dest / "results.json").read_text(encoding="utf-8"))
        record["suite"] = {"version": "0.1.0", "commit": name, "data_hash": data_hash}
        (dest / "results.json").write_text(json.dumps(record), encoding="utf-8")
        sides.append(side_of_run_dir(dest))
    diff = compare(*sides)
    assert any("data differ (data_hash sha256:aaa → sha256:bbb)" in note for note in diff.notes)
    assert {(c.path, c.before, c.after) for c in diff.stack_changes} >= {
        ("suite.commit", "before", "after"), ("suite.data_hash", "sha256:aaa", "sha256:bbb")}
    assert not any("no suite version" in note for note in diff.notes)


def _result(outcome: str | None) -> CheckResult | None:
    return None if outcome is None else CheckResult("c", "p0", outcome)


@pytest.mark.parametrize(("before", "after", "kind"), [
    ("passed", "failed", REGRESSION), ("passed", "error", REGRESSION), ("passed", "xfailed", REGRESSION),
    ("passed", "skipped", NOT_RUN_AFTER), ("failed", None, NOT_RUN_AFTER), ("skipped", "failed", REGRESSION),
    (None, "failed", REGRESSION), (None, "passed", NEW), (None, "skipped", NEW),
    ("failed", "passed", FIX), ("xfailed", "xpassed", FIX), ("error", "passed", FIX),
    ("failed", "error", CHANGED), ("skipped", "passed", CHANGED), ("skipped", None, CHANGED),
    ("passed", "xpassed", CHANGED),
])
def test_outcome_changes_are_classified(before: str | None, after: str | None, kind: str) -> None:
    change = outcome_change("c", _result(before), _result(after))
    assert change is not None and change.kind == kind
    assert change.regression == (kind in (REGRESSION, NOT_RUN_AFTER))


def test_markdown_has_a_summary_a_regressions_table_and_the_stack_diff_folded() -> None:
    diff = compare(side_of_run_dir(CLEAN_BEFORE), side_of_run_dir(PLANTED_TWIN))
    text = to_markdown(diff)
    lines = text.splitlines()
    assert lines[0].startswith("**conformance compare: REGRESSION: 27 regressions") and lines[0].endswith(
        "(BEFORE `20261205T031816-bench-p0-L8-0` → AFTER `20261205T032839-cuda-85d30b`)")
    assert any(line.startswith("> ⚠️ AFTER is not platform evidence") for line in lines)
    table = lines.index("### Regressions")
    assert lines[table + 2] == "| check | what | before | after | detail |"
    assert lines[table + 4].startswith(f"| `{GREEDY}` | regression | passed | failed | ")
    assert text.index("### Regressions") < text.index("### Figure shifts") < text.index("<details>")
    assert "<details><summary>Stack diff (26 fields)</summary>" in text and text.rstrip().endswith("</details>")
    assert "| `run.planted_fault` | null | sinks_dropped |" in text


def test_json_has_the_documented_keys(tmp_path: Path) -> None:
    before_dir = _copy_with_limit(tmp_path, "before", GREEDY, "max_abs_dlogprob", 17.0, MAX_LIMIT)
    after_dir = _copy_with_limit(tmp_path, "after", GREEDY, "max_abs_dlogprob", 26.0, MAX_LIMIT)
    data = json.loads(to_json(compare(side_of_run_dir(before_dir), side_of_run_dir(after_dir))))
    assert set(data) == {"verdict", "regressions", "noise_band", "informational_shift", "before", "after",
                         "not_like_for_like", "notes", "outcome_changes", "figure_shifts", "stack_changes"}
    assert (data["verdict"], data["regressions"], data["noise_band"]) == ("regression", 1, LIMIT_NOISE_BAND)
    assert set(data["before"]) == {"label", "run_id", "runs_by_tier", "series", "tiers", "not_evidence", "suite"}
    assert data["before"]["runs_by_tier"] == {"p0": "20261205T031816-bench-p0-L8-0"}
    shift = next(s for s in data["figure_shifts"] if s["figure"] == "max_abs_dlogprob")
    assert shift == {"check": GREEDY, "figure": "max_abs_dlogprob", "before": 17.0, "after": 26.0,
                     "limit": MAX_LIMIT, "limit_before": None, "kind": BREAKS, "regression": True,
                     "shrink": pytest.approx(9.0 / 25.4)}
    planted = json.loads(to_json(compare(side_of_run_dir(CLEAN_BEFORE), side_of_run_dir(PLANTED_TWIN))))
    assert set(planted["outcome_changes"][0]) == {"check", "tier", "before", "after", "kind", "regression",
                                                  "message"}
    assert {"path": "run.planted_fault", "before": "null", "after": "sinks_dropped"} in planted["stack_changes"]
    assert planted["after"]["not_evidence"].startswith("a negative control")


def test_runs_not_like_for_like_are_said_so_at_the_top(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([str(CLEAN_BEFORE), str(H100_RUN)], capsys)
    assert out.splitlines()[3] == "! not like for like: profile: h200-gpt-oss-120b → h100-gpt-oss-120b."
    assert "platform.gpu_names.0: NVIDIA H200 → NVIDIA H100 80GB HBM3" in out
    assert code == 0


def _one_sentence(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compare: ")
    return lines[0]


def test_bad_input_exits_2_with_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([str(tmp_path / "missing"), str(CLEAN_AFTER)], capsys)
    assert code == 2 and out == "" and "missing is not a run directory" in _one_sentence(err)
    (tmp_path / "empty").mkdir()
    code, _, err = _run([str(CLEAN_BEFORE), str(tmp_path / "empty")], capsys)
    assert code == 2 and "holds no results.json" in _one_sentence(err)
    damaged = tmp_path / "damaged"
    shutil.copytree(CLEAN_AFTER, damaged)
    (damaged / "results.json").write_text('{"schema_version": 1, "run_id": ', encoding="utf-8")
    code, _, err = _run([str(CLEAN_BEFORE), str(damaged)], capsys)
    assert code == 2 and "is not valid JSON" in _one_sentence(err)
    code, _, err = _run(["--db", str(tmp_path / "none.sqlite"), "a", "b"], capsys)
    assert code == 2 and "does not exist" in _one_sentence(err)


def _history(tmp_path: Path, *run_dirs: Path) -> Path:
    runs = tmp_path / "runs"
    for run_dir in run_dirs:
        shutil.copytree(run_dir, runs / run_dir.name)
    db = tmp_path / "history.sqlite"
    with History.open(db) as history:
        history.ingest_dir(runs)
    return db


def test_lineages_of_a_history_store_compare_their_newest_evidence(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = _history(tmp_path, CLEAN_BEFORE, PLANTED_TWIN, H100_RUN)  # the planted twin is newer, and no evidence
    h200, h100 = side_of_run_dir(CLEAN_BEFORE).run.series, side_of_run_dir(H100_RUN).run.series
    code, out, _ = _run(["--db", str(db), "--json", h200, h100], capsys)
    data = json.loads(out)
    assert code == 0 and data["before"]["runs_by_tier"] == {"p0": CLEAN_BEFORE.name}
    assert data["after"]["run_id"] == H100_RUN.name
    assert data["not_like_for_like"] == ["profile: h200-gpt-oss-120b → h100-gpt-oss-120b"]
    code, _, err = _run(["--db", str(db), h200, h200.rsplit(" · ", 1)[0]], capsys)
    assert code == 2 and f"did you mean {h200!r}?" in _one_sentence(err)


def test_the_conformance_command_runs_compare(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "conformance", "compare", str(CLEAN_BEFORE), str(PLANTED_TWIN),
                           "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["verdict"] == "regression"
    assert cli.main(["compare", str(CLEAN_BEFORE), str(CLEAN_AFTER), "--markdown"]) == 0
    assert cli.main(["compare", str(tmp_path), str(CLEAN_AFTER)]) == 2
