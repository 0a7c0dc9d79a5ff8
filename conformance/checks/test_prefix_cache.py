"""Automatic prefix caching: a repeated prefix is served from cached KV blocks (the request's own count of
cached prompt tokens) with outputs identical to computing it, and resetting the cache really forgets it.

The hits are judged by what the engine reports for each request (vLLM's RequestOutput.num_cached_tokens). vLLM's
hit counter is recorded beside them, not judged: before 0.32 its offline engine drops the counters of a step that
returns no request output, which async scheduling (vLLM's GPU default) makes common
(https://github.com/vllm-project/vllm/pull/48668; the H200's first P1 saw the counter stand still on hits)."""

import random

import pytest

from conformance.verdicts import compare
from conformance.verdicts.verdict import fail, record_figures, record_limit

AREA = "prefix-cache"
HITS = "vllm:prefix_cache_hits"  # in-process name; Prometheus adds _total (docs/vllm-cpu.md "Gotchas" 7)


def _caching_engine(engines, timeout_s: float):
    proc = engines.get()
    if not proc.call("scheduler_limits", timeout_s=timeout_s)["enable_prefix_caching"]:
        proc = engines.get(enable_prefix_caching=True)
    return proc


def _shared_prefix_prompts(vocab: int, block_size: int, seed: int) -> tuple[list[int], list[int]]:
    """Two prompts that share 2.5 blocks of prefix (fresh ids, so nothing is cached before the check)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab - 8) for _ in range(2 * block_size + block_size // 2)]
    first = prefix + [rng.randrange(vocab - 8) for _ in range(11)]
    return first, prefix + [rng.randrange(vocab - 8) for _ in range(7)]


def _generate(proc, prompt, top_k, timeout_s, record_figure, name: str):
    """One request alone; how far vLLM's hit counter moved for it is recorded as `counter_hits_<name>`."""
    before = proc.call("metrics", timeout_s=timeout_s)
    out = proc.call("generate_greedy", [prompt], 8, top_k, timeout_s=timeout_s)
    after = proc.call("metrics", timeout_s=timeout_s)
    record_figure(f"counter_hits_{name}", after.get(HITS, float("nan")) - before.get(HITS, 0.0))
    return out


def _record_as(record_figure, name: str, report, figure: str) -> None:
    """`report`'s `figure` recorded as `name` (-1 where it measured none), with the limit it was judged by."""
    record_figure(name, report.measured.get(figure, -1))
    if figure in report.limits():
        record_limit(record_figure, name, report.limits()[figure])


@pytest.mark.p1
@pytest.mark.needs("prefix_cache")
def test_repeated_prefix_hits_cache_with_identical_outputs(engines, model_under_test, tolerance,
                                                           call_timeout_s, record_figure):
    """A prompt seen before, and another prompt with the same prefix, are served with at least one
    cached block each (the request's count of cached prompt tokens), and their outputs equal the uncached ones.

    Catches: a prefix cache that never hits (hash or block-size mismatch: every request pays the full
    prefill), and one that hits the wrong blocks (hash collisions, sliding-window blocks reused after
    being freed), which shows as different tokens or logprobs.
    Reference: https://docs.vllm.ai/en/latest/design/prefix_caching.html
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls:
      tests/controls/test_prefix_cache_controls.py::test_prefix_hit_check_fails_when_cached_blocks_change_the_output
    """
    proc = _caching_engine(engines, call_timeout_s)
    tol, top_k = tolerance
    bs = proc.call("kv_layout", timeout_s=call_timeout_s).block_size
    first, second = _shared_prefix_prompts(int(model_under_test.config["vocab_size"]), bs, seed=101)
    cold = _generate(proc, first, top_k, call_timeout_s, record_figure, "fresh")
    warm = _generate(proc, first, top_k, call_timeout_s, record_figure, "same_prompt")
    shared = _generate(proc, second, top_k, call_timeout_s, record_figure, "shared_prefix")
    proc.call("reset_prefix_cache", timeout_s=call_timeout_s)  # the uncached baseline of `second`
    cold2 = proc.call("generate_greedy", [second], 8, top_k, timeout_s=call_timeout_s)
    reports = [compare.cached_tokens("a prompt of fresh ids", cold, maximum=0),        # nothing to hit
               compare.cached_tokens("the same prompt again", warm, minimum=bs),        # at least a block
               compare.cached_tokens("the same prefix, another suffix", shared, minimum=bs),
               compare.completions_equivalent(warm, cold, tol, ("cached", "uncached")),
               compare.completions_equivalent(shared, cold2, tol, ("cached prefix", "uncached"))]
    _record_as(record_figure, "prefix_hit_tokens_same_prompt", reports[1], "cached_tokens")
    _record_as(record_figure, "prefix_hit_tokens_shared_prefix", reports[2], "cached_tokens")
    record_figure("max_abs_dlogprob", max(reports[3].max_abs_dlogprob, reports[4].max_abs_dlogprob))
    if "max_abs_dlogprob" in reports[3].limits():
        record_limit(record_figure, "max_abs_dlogprob", reports[3].limits()["max_abs_dlogprob"])
    for r in reports:
        r.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("prefix_cache")
def test_prefix_cache_reset_forgets_blocks(engines, model_under_test, tolerance, call_timeout_s,
                                           record_figure):
    """reset_prefix_cache() succeeds on an idle engine, after it a cached prompt hits nothing, and
    the recomputed output equals the cached one.

    Catches: a reset that reports success but keeps serving old blocks (stale KV after a weight
    reload or LoRA swap), a reset that fails on an idle engine, and a cache that cannot warm again.
    Reference: vLLM LLM.reset_prefix_cache (https://docs.vllm.ai/en/latest/api/vllm/entrypoints/llm.html)
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls:
      tests/controls/test_prefix_cache_controls.py::test_prefix_reset_check_fails_when_the_reset_keeps_old_blocks
    """
    proc = _caching_engine(engines, call_timeout_s)
    tol, top_k = tolerance
    bs = proc.call("kv_layout", timeout_s=call_timeout_s).block_size
    prompt, _ = _shared_prefix_prompts(int(model_under_test.config["vocab_size"]), bs, seed=202)
    proc.call("generate_greedy", [prompt], 8, top_k, timeout_s=call_timeout_s)
    warm = _generate(proc, prompt, top_k, call_timeout_s, record_figure, "before_reset")
    reset_ok = proc.call("reset_prefix_cache", timeout_s=call_timeout_s)
    cold = _generate(proc, prompt, top_k, call_timeout_s, record_figure, "after_reset")
    reports = [compare.cached_tokens("the prompt again before the reset", warm, minimum=bs),
               compare.cached_tokens("the prompt again after the reset", cold, maximum=0),
               compare.completions_equivalent(cold, warm, tol, ("after reset", "cached"))]
    _record_as(record_figure, "prefix_hit_tokens_before_reset", reports[0], "cached_tokens")
    _record_as(record_figure, "prefix_hit_tokens_after_reset", reports[1], "cached_tokens")
    record_figures(record_figure, reports[2], prefix="after_reset_vs_cached_")
    if not reset_ok:
        fail("reset_prefix_cache() returned False on an idle engine")
    for r in reports:
        r.raise_if_failed()
