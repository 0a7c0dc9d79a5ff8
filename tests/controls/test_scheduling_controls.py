"""Controls of conformance/checks/test_scheduling.py: its own bodies against scripted engines whose batching or
chunking changes tokens, that exceed max_num_seqs, do not chunk, or never preempt; steps are counted as an
asynchronous engine schedules them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_scheduling as scheduling
from conformance.engines.engine_configs import LIMITED_SCHEDULER, SMALL_KV_CACHE
from conformance.engines.observations import (
    StepCounts,
)
from tests.check_fakes import (
    FAILED,
    PROMPTS,
    TOL,
    Figures,
    ScriptedEngine,
    ScriptedEngines,
    greedy,
    stepwise,
)


def test_concurrent_check_fails_when_batching_changes_tokens():
    reqs, _, _ = scheduling._mixed_requests(PROMPTS)
    batched = stepwise(greedy(reqs, lambda p: [7, 7, 7, 7]))
    engine = ScriptedEngine({"run_stepwise": batched,
                             "generate_greedy": lambda ps, *a, **k: greedy(ps, lambda p: [20, 20, 20, 20])})
    with pytest.raises(FAILED, match="batched chose 7"):
        scheduling.test_concurrent_requests_match_each_alone(engine, PROMPTS, TOL, 1.0, Figures())


def test_max_num_seqs_check_fails_when_the_limit_is_exceeded():
    limit = LIMITED_SCHEDULER["max_num_seqs"]
    run = stepwise(greedy(PROMPTS.prompts), trace=[StepCounts(0, limit + 3, 0)])
    engine = ScriptedEngine({"run_stepwise": run})
    with pytest.raises(FAILED, match=f"{limit + 3} requests ran at once, above max_num_seqs={limit}"):
        scheduling.test_max_num_seqs_is_respected(ScriptedEngines(engine), PROMPTS, 1.0, Figures())


def test_chunked_prefill_check_fails_when_chunking_changes_tokens():
    lens = [len(p) for p in PROMPTS.prompts]
    whole = stepwise(greedy(PROMPTS.prompts), first=[0, 0, 0])
    chunked = stepwise(greedy(PROMPTS.prompts, lambda p: [9, 9, 9, 9]),
                       first=[-(-n // LIMITED_SCHEDULER["max_num_batched_tokens"]) for n in lens])
    default = ScriptedEngine({"scheduler_limits": {"max_num_batched_tokens": 8192}, "run_stepwise": whole})
    small = ScriptedEngine({"run_stepwise": chunked})
    with pytest.raises(FAILED, match="chunked chose 9"):
        scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL,
                                                          1.0, Figures())


def _async_prefill(first_chunked: list[int]) -> tuple[ScriptedEngine, ScriptedEngine]:
    """Engines under async scheduling (vLLM on GPUs): a step returns the outputs of the step before it, so an
    unchunked first token is seen one step after the request's arrival step."""
    whole = stepwise(greedy(PROMPTS.prompts), first=[1] * len(PROMPTS.prompts))
    default = ScriptedEngine({"scheduler_limits": {"max_num_batched_tokens": 8192}, "run_stepwise": whole},
                             async_scheduling=True)
    small = ScriptedEngine({"run_stepwise": stepwise(greedy(PROMPTS.prompts), first=first_chunked)},
                           async_scheduling=True)
    return default, small


def test_chunked_prefill_check_counts_steps_as_an_async_engine_schedules_them():
    """First contact on the H200 (fixtures/device_runs/20261203T215707-cuda-f40b72): every unchunked first token
    was seen after 2 steps, the async scheduler's lag; taken off, the same engines pass."""
    lens = [len(p) for p in PROMPTS.prompts]
    default, small = _async_prefill([-(-n // LIMITED_SCHEDULER["max_num_batched_tokens"]) for n in lens])
    figures = Figures()
    scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL, 1.0,
                                                      figures)
    assert figures.values["max_prefill_steps_chunked"] == max(-(-n // LIMITED_SCHEDULER["max_num_batched_tokens"])
                                                              for n in lens)
    with pytest.raises(FAILED, match=r"after 2 step\(s\); exactly 1 expected"):  # the lag not taken off
        default.info["async_scheduling"] = False
        scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL,
                                                          1.0, Figures())


def test_chunked_prefill_check_fails_when_an_async_engine_does_not_chunk():
    """The lag taken off does not blind the check: an async engine that prefills a long prompt in one step (its
    first token seen one step late, as an unchunked one's) fails the chunked count."""
    default, small = _async_prefill([1] * len(PROMPTS.prompts))
    with pytest.raises(FAILED, match=r"chunked prefill: a \d+-token prompt gave its first token after 1 step\(s\); "
                                     r"at least \d+ expected"):
        scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL,
                                                          1.0, Figures())


def test_preemption_check_fails_when_no_preemption_happened():
    metrics = {"vllm:num_preemptions": 0.0}
    default = ScriptedEngine({"metrics": metrics, "generate_greedy": lambda ps, *a, **k: greedy(ps)})
    small = ScriptedEngine({"metrics": metrics, "generate_greedy": lambda ps, *a, **k: greedy(ps),
                            "kv_layout": SimpleNamespace(num_blocks=SMALL_KV_CACHE.get("num_gpu_blocks_override", 8))})
    with pytest.raises(FAILED, match="num_preemptions moved by 0, expected at least 1"):
        scheduling.test_preemption_keeps_outputs(ScriptedEngines(default, lambda o: small), PROMPTS, TOL, 1.0,
                                                 Figures())
