"""The scheduler changes when tokens are computed, never which: continuous batching, a small
max_num_seqs, chunked prefill and preemption all give the greedy tokens (and logprobs within the
tolerance) of each request served alone."""

import pytest

from conformance.engines.engine_configs import LIMITED_SCHEDULER, SMALL_KV_CACHE, preemptible_requests
from conformance.verdicts import compare
from conformance.verdicts.verdict import fail, record_figures

AREA = "scheduling"


def engines_ahead(engines):
    """The engines these checks ask for, in order: the factory starts each one ahead (conformance/run/fixtures.py)."""
    yield "test_max_num_seqs_is_respected", LIMITED_SCHEDULER
    yield "test_preemption_keeps_outputs", SMALL_KV_CACHE


def _mixed_requests(prompts) -> tuple[list[list[int]], list[int], list[int]]:
    """Twelve requests: the prompt set and cuts of it, mixed output lengths, arriving in waves."""
    base = prompts.prompts
    cuts = [p[: max(3, len(p) // 3)] for p in base] + [p[len(p) // 2:] or p for p in base]
    reqs = (base + cuts)[:12]
    budgets = [prompts.max_tokens, 4, 24, 8, 16, 2, 12, 20, 6, 16, 10, 3][: len(reqs)]
    arrivals = [0, 0, 0, 1, 1, 2, 3, 5, 8, 8, 13, 21][: len(reqs)]
    return reqs, budgets, arrivals


def _alone(proc, reqs, budgets, top_k, timeout_s, prompt_logprobs=False):
    return [proc.call("generate_greedy", [p], n, top_k, prompt_logprobs=prompt_logprobs,
                      timeout_s=timeout_s)[0] for p, n in zip(reqs, budgets)]


@pytest.mark.p1
@pytest.mark.needs("scheduler")
def test_concurrent_requests_match_each_alone(engine, prompts, tolerance, call_timeout_s, record_figure):
    """Twelve requests of mixed prompt and output lengths, arriving while others decode, give the
    same greedy tokens and logprobs as each request run alone.

    Catches: batch-dependent numerics beyond the tolerance, padding or slot-mapping bugs that let
    one sequence see another's KV, outputs routed to the wrong request, requests dropped from a batch.
    Reference: https://docs.vllm.ai/en/latest/design/arch_overview.html (continuous batching);
      vLLM tests/models/utils.py check_logprobs_close
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_scheduling_controls.py::test_concurrent_check_fails_when_batching_changes_tokens
    """
    tol, top_k = tolerance
    reqs, budgets, arrivals = _mixed_requests(prompts)
    batched = engine.call("run_stepwise", reqs, budgets, top_k, arrivals, timeout_s=call_timeout_s)
    alone = _alone(engine, reqs, budgets, top_k, call_timeout_s)
    report = compare.completions_equivalent(batched.completions, alone, tol, ("batched", "alone"))
    record_figures(record_figure, report)
    record_figure("max_running", batched.max_running)
    report.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("scheduler")
def test_max_num_seqs_is_respected(engines, prompts, call_timeout_s, record_figure):
    """With max_num_seqs=2, never more than two requests run in a step, the rest wait, and all finish.

    Catches: a scheduler that over-admits (memory blow-ups on GPUs sized for the limit), or one that
    never admits a waiting request again (a stuck queue).
    Reference: vLLM SchedulerConfig.max_num_seqs (https://docs.vllm.ai/en/latest/api/vllm/config/scheduler.html)
    Controls: tests/controls/test_scheduling_controls.py::test_max_num_seqs_check_fails_when_the_limit_is_exceeded
    """
    proc = engines.get(**LIMITED_SCHEDULER)
    # six short requests: the limit is about admission, long prompts would only add chunked-prefill steps
    reqs = [p[:24] for p in prompts.prompts]
    got = proc.call("run_stepwise", reqs, 8, 1, timeout_s=call_timeout_s)
    report = compare.concurrency_within(got, LIMITED_SCHEDULER["max_num_seqs"])
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("scheduler")
def test_chunked_prefill_matches_unchunked(engines, prompts, tolerance, call_timeout_s, record_figure):
    """Prompts prefilled in 32-token chunks give the same prompt logprobs, greedy tokens and logprobs
    as prompts prefilled in one step (the default engine's budget covers every prompt). Steps are counted as the
    engine schedules them: under async scheduling (vLLM on GPUs) a step returns the outputs of the step before.

    Catches: chunk-boundary bugs (positions, RoPE offsets, sliding-window masks or sinks applied per
    chunk instead of per sequence), prompt logprobs lost across chunks.
    Reference: https://docs.vllm.ai/en/latest/configuration/optimization.html#chunked-prefill
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_scheduling_controls.py::test_chunked_prefill_check_fails_when_chunking_changes_tokens,
      tests/controls/test_scheduling_controls.py::test_chunked_prefill_check_fails_when_an_async_engine_does_not_chunk
    """
    default = engines.get()
    tol, top_k = tolerance
    reqs, lens = prompts.prompts, [len(p) for p in prompts.prompts]
    budget = default.call("scheduler_limits", timeout_s=call_timeout_s)["max_num_batched_tokens"]
    if budget < sum(lens):
        fail(f"the default engine's token budget ({budget}) is below the prompt set "
             f"({sum(lens)} tokens): it is no unchunked baseline")
    whole = default.call("run_stepwise", reqs, prompts.max_tokens, top_k, prompt_logprobs=True,
                         timeout_s=call_timeout_s)
    chunked_engine = engines.get(**LIMITED_SCHEDULER)
    chunked = chunked_engine.call("run_stepwise", reqs, prompts.max_tokens, top_k, prompt_logprobs=True,
                                  timeout_s=call_timeout_s)
    lag = [1 if e.info.get("async_scheduling") else 0 for e in (default, chunked_engine)]  # outputs a step late
    steps = [compare.prefill_steps(whole, lens, budget, chunked=False, output_lag=lag[0]),
             compare.prefill_steps(chunked, lens, LIMITED_SCHEDULER["max_num_batched_tokens"], chunked=True,
                                   output_lag=lag[1])]
    report = compare.completions_equivalent(chunked.completions, whole.completions, tol,
                                            ("chunked", "unchunked"))
    record_figures(record_figure, report)
    record_figure("max_prefill_steps_chunked", steps[1].measured["max_prefill_steps"])
    for r in steps:
        r.raise_if_failed()
    report.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("scheduler")
def test_preemption_keeps_outputs(engines, prompts, tolerance, call_timeout_s, record_figure):
    """With a KV cache of 12 blocks, six long-running requests force preemptions (the counter proves
    it) and every output still equals the same request on a cache big enough never to preempt.

    Catches: recompute-after-preemption bugs (lost or duplicated tokens, stale KV reused, wrong
    positions on resume), a scheduler that deadlocks instead of preempting, and a preemption counter
    that does not count (a capacity dashboard blind to thrashing).
    Reference: https://docs.vllm.ai/en/latest/configuration/optimization.html#preemption ; docs/vllm-cpu.md
      "Capability map" (the preemption row: vllm:num_preemptions)
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_scheduling_controls.py::test_preemption_check_fails_when_no_preemption_happened
    """
    default = engines.get()
    tol, top_k = tolerance
    reqs, max_tokens = preemptible_requests(prompts.prompts)
    before_big = default.call("metrics", timeout_s=call_timeout_s)
    want = default.call("generate_greedy", reqs, max_tokens, top_k, timeout_s=call_timeout_s)
    unpreempted = compare.counter_delta("vllm:num_preemptions", before_big,
                                        default.call("metrics", timeout_s=call_timeout_s), maximum=0)
    small = engines.get(**SMALL_KV_CACHE)
    before = small.call("metrics", timeout_s=call_timeout_s)
    got = small.call("generate_greedy", reqs, max_tokens, top_k, timeout_s=call_timeout_s)
    after = small.call("metrics", timeout_s=call_timeout_s)
    preempted = compare.counter_delta("vllm:num_preemptions", before, after, minimum=1)
    report = compare.completions_equivalent(got, want, tol, ("preempted", "large cache"))
    for r in (preempted, report):
        record_figures(record_figure, r)
    record_figure("kv_blocks_small_cache", small.call("kv_layout", timeout_s=call_timeout_s).num_blocks)
    unpreempted.raise_if_failed()
    preempted.raise_if_failed()
    report.raise_if_failed()
