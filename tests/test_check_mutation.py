"""The machinery that proves every check able to fail: the `Controls:` lint, the mutation harness
(tests/check_mutation.py) and the run minimum that keeps an all-skipped run from passing; and, end to end,
the fail-open paths closed (a wrong vocabulary fails P0, a P0 whose checks all skip fails)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.checks import test_engine
from conformance.run import recorder, runrecord
from tests import check_mutation

ROOT = Path(__file__).resolve().parents[1]
CHECK_FILE = ROOT / "conformance" / "checks" / "test_engine.py"


def test_every_check_names_controls_that_exist():
    declared = runrecord.declared_controls(check_mutation.CHECKS)
    assert len(declared) >= 60
    missing = [check for check, pairs in declared.items() if not pairs]
    assert not missing, f"checks without a Controls: line: {missing}"
    broken = {check: problems for check, pairs in declared.items()
              if (problems := runrecord.controls_problems(", ".join(f"{f}::{fn}" for f, fn in pairs), CHECK_FILE))}
    assert not broken, broken


def test_controls_lint_names_what_is_wrong():
    assert runrecord.controls_problems(None, CHECK_FILE) == [
        "has no 'Controls:' line in its docstring (which tests prove it can fail?)"]
    assert "not tests/<file>.py::<test function>" in runrecord.controls_problems("tests/x.py", CHECK_FILE)[0]
    assert runrecord.controls_problems("tests/test_nothere.py::test_x", CHECK_FILE) == [
        "names the control tests/test_nothere.py::test_x, but tests/test_nothere.py does not exist"]
    assert runrecord.controls_problems("tests/test_check_mutation.py::test_gone", CHECK_FILE) == [
        "names the control tests/test_check_mutation.py::test_gone, but tests/test_check_mutation.py defines no "
        "test_gone"]
    entry = "tests/test_check_mutation.py::test_controls_lint_names_what_is_wrong"
    assert runrecord.controls_problems(entry, CHECK_FILE) == []


def test_the_plugin_lints_controls_like_catches_and_reference():
    from conformance.run.runrecord import check_metadata_problems

    def check():
        """Catches: x.
        Reference: https://example.org
        """
    item = SimpleNamespace(iter_markers=lambda: [SimpleNamespace(name="p0")], function=check)
    assert any("Controls:" in p for p in check_metadata_problems(item))


def test_mutant_replaces_the_body_with_pass_and_restores_it():
    func = test_engine.test_engine_starts_and_generates
    original = func.__code__
    with check_mutation.mutant("test_engine.py::test_engine_starts_and_generates"):
        assert func.__code__ is not original
        assert func(None, ([], 0.0), SimpleNamespace(prompts=[[1]], max_tokens=2), None, None) is None
        assert func.__doc__ and "Controls:" in func.__doc__
    assert func.__code__ is original
    with pytest.raises(AssertionError, match="0 completions for 1 prompts"):
        func(None, ([], 1.0), SimpleNamespace(prompts=[[1]], max_tokens=2), SimpleNamespace(config={"vocab_size": 9}),
             lambda *a: None)


def test_score_counts_a_check_killed_when_any_of_its_controls_kills_it():
    prop = check_mutation.PROP
    reports = [SimpleNamespace(user_properties=[(prop, ("a.py::test_a", False)), (prop, ("b.py::test_b", False))]),
               SimpleNamespace(user_properties=[(prop, ("a.py::test_a", True))])]
    killed, _ = check_mutation.score(reports)
    assert killed == {"a.py::test_a": True, "b.py::test_b": False}


def rec(check: str, tier: str, outcome: str) -> SimpleNamespace:
    return SimpleNamespace(id=f"conformance/checks/{check}", tier=tier, outcome=outcome)


P0_CORE = [rec(name, "p0", "passed") for name in recorder.minimum_table()["p0"]["required"]]


def test_run_minimum_accepts_a_p0_that_passed_its_core_checks_and_a_subset():
    assert recorder.shortfall(P0_CORE + [rec("test_device.py::test_gemm_numerics[tf32]", "p0", "skipped")]) is None
    assert recorder.shortfall([rec("test_stack_identity.py::test_torch_build_matches_target", "p0", "passed")]) \
        is None  # a -k subset that left the other core checks out


def test_run_minimum_rejects_an_all_skipped_run_and_a_p0_without_its_tokenizer():
    skipped = [rec("test_device.py::test_device_isa_in_build", "p0", "skipped")]
    assert "no check passed (1 selected, all skipped)" in recorder.shortfall(skipped)
    core = [r if "round_trip" not in r.id else rec(r.id.rsplit("/", 1)[-1], "p0", "skipped") for r in P0_CORE]
    why = recorder.shortfall(core)
    assert why.startswith("P0 requires test_tokenizer.py::test_tokenizer_round_trip_smoke (skipped) to pass")
    p1 = P0_CORE + [rec("test_scheduling.py::test_preemption_keeps_outputs", "p1", "skipped")]
    assert recorder.shortfall(p1).startswith("P1: 0 of 1 selected checks passed")


def conformance_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    reports = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--reports-dir", str(reports), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    runs = [p for p in reports.iterdir() if p.is_dir()] if reports.is_dir() else []
    record = json.loads((runs[0] / "results.json").read_text()) if runs else {}
    return proc, record


@pytest.mark.slow
def test_p0_with_a_vocab_one_byte_off_fails_naming_the_vocab(tmp_path):
    """Fail-open closed: a sha256 mismatch of the user's vocabulary was a skip (and P0 passed without its
    tokenizer checks); now the checks needing it fail with one sentence naming the file."""
    from conformance.checkpoints.tokenizer import vocab

    good = vocab.ensure_o200k().read_bytes()
    bad = tmp_path / "o200k_base.tiktoken"
    bad.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    proc, record = conformance_run(tmp_path, "--tier", "p0", "--tokenizer-vocab", str(bad), "-k", "tokenizer")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    checks = [c for c in record["checks"] if "tokenizer" in c["id"]]
    assert checks and all(c["outcome"] in ("failed", "error") for c in checks), checks
    message = checks[0]["message"]
    assert str(bad) in message and "it is not o200k_base" in message and "\n" not in message.strip()


@pytest.mark.slow
def test_p0_whose_selected_checks_all_skip_fails(tmp_path):
    """Fail-open closed: every selected check skipped (the exact-fp32 verdict of a float32 run) used to exit 0."""
    proc, record = conformance_run(tmp_path, "--tier", "p0", "-k", "test_exact_float32_logprobs_match_reference")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert [c["outcome"] for c in record["checks"]] == ["skipped"]
    assert "not a pass: no check passed (1 selected, all skipped)" in proc.stdout
    assert "verdict: FAIL" in proc.stdout


def test_a_crash_at_submission_is_not_a_clean_rejection():
    """Fail-open closed: any exception whose text held the expected word counted as a clean rejection."""
    from conformance.engines.vllm_offline import VllmOffline

    def engine(exc: Exception) -> SimpleNamespace:
        def add_request(prompt, max_tokens):
            raise exc
        return SimpleNamespace(add_request=add_request, abort=lambda ids: None)
    refused = VllmOffline.submit(engine(ValueError("prompt exceeds max_model_len")), "oversized", [1], 4)
    assert not refused.accepted and refused.error_type == "ValueError"
    with pytest.raises(IndexError, match="index 4096 is out of bounds for vocab"):
        VllmOffline.submit(engine(IndexError("index 4096 is out of bounds for vocab")), "token_id", [1], 4)


def test_a_tokenizer_crash_on_bad_unicode_is_not_a_refusal():
    """Fail-open closed: for replace_or_refuse cases any exception counted as a refusal."""
    from conformance.checkpoints.tokenizer import fidelity

    case = fidelity.CorpusCase("lone_high_surrogate", "a\ud800b", False, "replace_or_refuse")
    enc = SimpleNamespace(encode=lambda text, allowed_special=None: [1, 2])

    def tokenizer(exc: Exception) -> SimpleNamespace:
        def encode(text, add_special_tokens=False):
            raise exc
        return SimpleNamespace(encode=encode)
    assert fidelity.compare_corpus(tokenizer(TypeError("TextInputSequence must be str")), enc, [case]).refused
    crashed = fidelity.compare_corpus(tokenizer(RuntimeError("index out of range in the merges")), enc, [case])
    assert crashed.problems == ["lone_high_surrogate: HF tokenizer raised RuntimeError: index out of range in the "
                                "merges"]


def test_amx_is_detected_from_cpuinfo_and_keys_the_mxfp4_skip():
    """Fail-open closed: the MXFP4 skip said "without AMX" but applied to every CPU host."""
    from conformance.monitor import cpu_features
    from conformance.run import capabilities

    assert cpu_features.amx("processor : 0\nflags : fpu avx2 avx512f amx_bf16 amx_tile\n") is True
    assert cpu_features.amx("processor : 0\nflags : fpu avx2\n") is False
    assert cpu_features.amx("processor : 0\n") is None
    entry = next(e for e in capabilities.load_expectations()
                 if "mxfp4_checkpoint_matches_reference[under-test]" in e["check"])
    base = {"target": "cpu", "engine": "vllm"}
    assert capabilities.expectation_matches(entry["when"], base | {"cpu_amx": False})
    assert not capabilities.expectation_matches(entry["when"], base | {"cpu_amx": True})
