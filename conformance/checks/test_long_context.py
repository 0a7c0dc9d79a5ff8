"""Long context at depth (P1): prompts of 8k tokens and more on the model under test, the band past the
original 4096-token context compared with the fp64 reference (conformance/reference/longref.py, blockwise), and a
max_model_len that matches the serving profile."""

import time

import pytest

from conformance.engines.worker import EngineError
from conformance.run import capabilities
from conformance.verdicts import compare, longctx
from conformance.verdicts.verdict import Problems, fail, record_figures

AREA = "model-math"


@pytest.fixture(scope="module")
def long_settings():
    return longctx.settings_()


def _long_options(target) -> dict:
    capabilities.require(target, "long_context")
    extra = dict(target.profile.long_context)
    if not extra.get("max_model_len"):
        fail(f"profile {target.profile.label} names no long_context.max_model_len (data/profiles.toml)")
    return extra


def _chunked_options(long_options: dict, long_settings) -> dict:
    return long_options | {"max_num_batched_tokens": long_settings.chunk_tokens, "enable_chunked_prefill": True}


def _preemption_options(long_options: dict, deep: list[int], long_settings, config: dict, engines,
                        async_scheduling: bool) -> dict:
    window = int(config.get("sliding_window") or 0)
    return longctx.preemption_options(long_options, len(deep), long_settings.decode_tokens, window,
                                      longctx.preemption_settings(), engines.options().get("block_size"),
                                      batches_in_flight=2 if async_scheduling else 1)


def _deep_prompt(config: dict, long_settings) -> list[int]:
    return longctx.deep_prompt(int(config["vocab_size"]), long_settings.prompt_tokens, long_settings.seed)


def engines_ahead(engines):
    """The engines these checks ask for, in order: the factory starts each one ahead (conformance/run/fixtures.py)."""
    options, settings_ = _long_options(engines.target), longctx.settings_()
    yield "test_long_prompt_matches_reference_at_depth", options
    yield "test_chunked_prefill_of_long_prompt_matches_reference", _chunked_options(options, settings_)
    config = engines.model.config
    yield ("test_preempted_long_requests_match_alone_and_reference",  # the default engine's scheduling, where known
           _preemption_options(options, _deep_prompt(config, settings_), settings_, config, engines,
                               bool(engines.default_info().get("async_scheduling"))))


@pytest.fixture(scope="module")
def long_options(target):
    """The engine options of the profile's long-context engine (cpu: max_model_len 16384, 128 MiB of KV)."""
    return _long_options(target)


@pytest.fixture
def long_engine(engines, long_options):
    """Asked of the pool for each check: the pool closes its least recently used engine when another check
    starts one (the preemption and chunked checks do), so a module-held handle could be a stopped engine."""
    try:
        return engines.get(**long_options)
    except EngineError as exc:
        fail(str(exc))


@pytest.fixture(scope="module")
def deep(model_under_test, long_settings):
    return _deep_prompt(model_under_test.config, long_settings)


@pytest.fixture(scope="module")
def deep_fresh(engines, long_options, deep, long_settings, limits, call_timeout_s):
    """The deep prompt prefilled from nothing (prefix cache reset), greedy, with prompt logprobs; seconds."""
    _, top_k = limits.depth
    try:
        long_engine = engines.get(**long_options)
        long_engine.call("reset_prefix_cache")
        started = time.perf_counter()
        out = long_engine.call("generate_greedy", [deep], long_settings.decode_tokens, top_k, prompt_logprobs=True,
                               timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    return out, time.perf_counter() - started


@pytest.fixture(scope="module")
def deep_reference(model_under_test, deep_fresh, long_settings, limits):
    """The fp64 reference along the engine's greedy path, scored from band_from on; and its seconds."""
    from conformance.reference.longref import LongReference
    from conformance.run.fixtures import STREAMING_ABOVE_PARAMS

    if model_under_test.num_params > STREAMING_ABOVE_PARAMS:
        pytest.skip("an 8k-token fp64 reference of a real checkpoint takes hours on the host: the long-context "
                    "parity checks run on the tiny model (the engine-only ones still run)")
    _, top_k = limits.depth
    ref = LongReference(model_under_test.path)
    started = time.perf_counter()
    want = [ref.score_from(c.prompt_ids, c.token_ids, top_k + 5, long_settings.band_from) for c in deep_fresh[0]]
    return want, time.perf_counter() - started


def _judge(got, want, depth, band_from, record_figure, names=("engine", "reference")):
    tol, _ = depth
    report = longctx.depth_parity(got, want, tol, band_from, names)
    record_figures(record_figure, report)
    if got and got[0].prompt_steps:
        record_figures(record_figure, longctx.band_figures(got[0], want[0], band_from))
    report.raise_if_failed()


@pytest.mark.p1
def test_long_prompt_matches_reference_at_depth(deep_fresh, deep_reference, limits, long_settings,
                                                record_figure):
    """An 8192-token prompt, prefilled in the engine's default chunks and decoded greedily: the prompt
    logprobs from position 4096 on and every decode step agree with the fp64 reference — past the original
    4096-token YaRN context and 32x past the 128-token sliding window, where the sinks carry the mass the
    window drops.

    Catches: sliding-window masks or block tables that go wrong deep into a sequence (a window lost or
    shifted past some position), sinks dropped in the long-sequence kernel path, RoPE/YaRN tables built for
    the original 4096-token context and clamped or wrapped beyond it, position ids overflowing, fp32
    accumulation that drifts over thousands of keys.
    Reference: https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json (YaRN factor 32 from 4096,
      window 128); https://arxiv.org/abs/2309.00071 (YaRN)
    Limits: tolerances.toml [depth.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context, measured")
    Controls: tests/controls/test_long_context_controls.py::test_depth_parity_fails_on_a_window_lost_past_4k;
      tests/controls/test_long_context_controls.py::test_depth_parity_fails_on_rope_clamped_past_4k
    """
    out, engine_s = deep_fresh
    want, ref_s = deep_reference
    record_figure("engine_seconds", engine_s)
    record_figure("reference_seconds", ref_s)
    record_figure("prompt_tokens", float(len(out[0].prompt_ids)))
    _judge(out, want, limits.depth, long_settings.band_from, record_figure)


@pytest.mark.p1
def test_prefix_cache_hit_at_depth_matches_reference(long_engine, deep, deep_fresh, deep_reference, limits,
                                                     long_settings, call_timeout_s, record_figure):
    """The 8192-token prompt sent again is served from the prefix cache (the request's count of cached prompt
    tokens: all but the last block of it) and decodes the same greedy tokens with the reference's logprobs.
    vLLM's hit counter is recorded, not judged (conformance/checks/test_prefix_cache.py says why:
    vllm-project/vllm#48668).

    Catches: prefix-cache hits deep into a sequence that return another request's blocks, sliding-window
    blocks freed by the first request but still marked cached, hashes that collide on long prompts.
    Reference: https://docs.vllm.ai/en/latest/design/prefix_caching.html
    Limits: tolerances.toml [depth.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context, measured")
    Controls: tests/controls/test_long_context_controls.py::test_prefix_hit_check_fails_on_a_cache_that_never_hits
    """
    _, top_k = limits.depth
    tol, _ = limits.depth
    try:
        # warm the cache without prompt logprobs (requests that ask for them skip reading the cache)
        long_engine.call("generate_greedy", [deep], 1, 1, timeout_s=call_timeout_s)
        before = long_engine.call("metrics")
        started = time.perf_counter()
        hit = long_engine.call("generate_greedy", [deep], long_settings.decode_tokens, top_k, timeout_s=call_timeout_s)
        seconds = time.perf_counter() - started
        after = long_engine.call("metrics")
        block = int(long_engine.call("kv_state").block_size)
    except EngineError as exc:
        fail(str(exc))
    counted = compare.cached_tokens("the deep prompt again", hit, minimum=len(deep) - 2 * block)
    record_figures(record_figure, counted)
    # vLLM's counters beside the request's own count (the H200's P1 on vLLM 0.26.0 saw them stand still on a hit)
    for counter in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"):
        record_figures(record_figure, compare.counter_delta(counter, before, after))
    record_figure("cached_request_seconds", seconds)
    record_figure("fresh_request_seconds", deep_fresh[1])
    counted.raise_if_failed()
    want, _ = deep_reference
    report = compare.logprobs_close(hit, [longctx.Completion(w.prompt_ids, w.token_ids, w.steps) for w in want], tol,
                                    ("cache hit", "reference"))
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
def test_prompt_at_max_model_len_is_served(long_engine, long_options, model_under_test, long_settings, call_timeout_s,
                                           record_figure):
    """The long-context engine runs the profile's max_model_len (cpu: 16384), serves a prompt that fills
    it (max_model_len - 4 prompt tokens, 4 decoded) with finite logprobs and a full KV accounting, and
    refuses one token more in one clear error.

    Catches: a max_model_len silently lowered by the engine (KV budget, model config), requests at the
    limit that crash or hang the prefill, position or block tables sized one short of the limit, limits
    enforced only after minutes of queuing.
    Reference: https://docs.vllm.ai/en/latest/configuration/engine_args.html (--max-model-len)
    Controls:
      tests/controls/test_long_context_controls.py::test_max_model_len_check_fails_on_a_lowered_limit_in_the_check_body
    """
    want_len = int(long_options["max_model_len"])
    try:
        limits = long_engine.call("scheduler_limits")
        prompt = longctx.deep_prompt(int(model_under_test.config["vocab_size"]), want_len - 4, long_settings.seed + 1)
        started = time.perf_counter()
        out = long_engine.call("generate_greedy", [prompt], 4, 1, timeout_s=call_timeout_s)
        seconds = time.perf_counter() - started
        refused = long_engine.call("submit", "over_max_model_len", prompt + [1, 2, 3, 4, 5], 4)
    except EngineError as exc:
        fail(str(exc))
    record_figure("max_model_len", float(limits["max_model_len"]))
    record_figure("prompt_tokens", float(len(prompt)))
    record_figure("seconds", seconds)
    Problems(longctx.max_len_problems(limits, want_len, out, 4)).raise_if_failed()
    compare.rejected_clearly(refused, 5.0, ("maximum context length", "max_model_len", "longer than")).raise_if_failed()


@pytest.mark.p1
def test_chunked_prefill_of_long_prompt_matches_reference(engines, long_options, deep, deep_reference, limits,
                                                          long_settings, call_timeout_s, record_figure):
    """The same 8192-token prompt prefilled in 1024-token chunks (max_num_batched_tokens 1024: eight
    steps, each attending to the KV the earlier chunks left in the cache) gives the reference's logprobs
    at depth.

    Catches: chunked prefill that loses or misplaces the earlier chunks' KV, sliding-window or sink
    metadata computed per chunk instead of per sequence, RoPE positions restarting at each chunk.
    Reference: https://docs.vllm.ai/en/latest/configuration/optimization.html (chunked prefill)
    Limits: tolerances.toml [depth.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context, measured")
    Controls:
      tests/controls/test_long_context_controls.py::test_chunked_prefill_check_fails_when_the_prompt_was_not_chunked
    """
    _, top_k = limits.depth
    chunked = _chunked_options(long_options, long_settings)
    try:
        engine = engines.get(**chunked)
        scheduler = engine.call("scheduler_limits")
        out = engine.call("generate_greedy", [deep], long_settings.decode_tokens, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    if scheduler["max_num_batched_tokens"] != long_settings.chunk_tokens or not scheduler["enable_chunked_prefill"]:
        fail(f"the chunked engine reports {scheduler}: the prompt was not prefilled in "
             f"{long_settings.chunk_tokens}-token chunks, so chunked prefill was not tested")
    want, _ = deep_reference
    if out[0].token_ids != want[0].token_ids:  # its own greedy path: score that one
        from conformance.reference.longref import LongReference

        want = [LongReference(engines.model.path).score_from(
            c.prompt_ids, c.token_ids, top_k + 5, long_settings.band_from) for c in out]
    record_figure("chunks", float(-(-len(deep) // long_settings.chunk_tokens)))
    _judge(out, want, limits.depth, long_settings.band_from, record_figure)


@pytest.mark.p1
def test_preempted_long_requests_match_alone_and_reference(engines, long_options, model_under_test, deep, deep_fresh,
                                                           deep_reference, limits, long_settings, call_timeout_s,
                                                           record_figure):
    """Three requests of 4352-8192 prompt tokens sent at once to an engine whose KV pool holds one of them
    (admitted on their first 1024-token chunk): vLLM preempts and recomputes (the preemption counter proves
    it), and every request still gives the greedy tokens and logprobs of the same request run alone; the
    8192-token one also the fp64 reference's from position 4096 on.

    Catches: recompute-after-preemption bugs that only long sequences reach (a resumed prefill that skips or
    repeats a chunk, stale KV blocks reused past the sliding window, positions restarting on resume, block
    tables rebuilt short), outputs mixed up between preempted requests, a scheduler that deadlocks instead of
    preempting, a preemption counter that does not count.
    Reference: https://docs.vllm.ai/en/latest/configuration/optimization.html#preemption ; vLLM SchedulerConfig
      scheduler_reserve_full_isl (https://docs.vllm.ai/en/latest/api/vllm/config/scheduler.html)
    Limits: tolerances.toml [depth.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context, measured")
    Controls:
      tests/controls/test_long_context_controls.py::test_long_preemption_check_fails_when_no_preemption_happened;
      tests/controls/test_long_context_controls.py::test_long_preemption_check_fails_when_a_resumed_request_changes
    """
    tol, top_k = limits.depth
    ps = longctx.preemption_settings()
    try:
        reqs = longctx.preemption_requests(deep, ps)
    except ValueError as exc:
        fail(str(exc))
    try:  # how the default engine schedules (async on GPUs) sizes the pool's sliding-window share
        async_scheduling = bool(engines.get().info.get("async_scheduling"))
    except EngineError as exc:
        fail(str(exc))
    options = _preemption_options(long_options, deep, long_settings, model_under_test.config, engines,
                                  async_scheduling)
    try:
        engine = engines.get(**options)
        before = engine.call("metrics")
        started = time.perf_counter()
        got = engine.call("generate_greedy", reqs, long_settings.decode_tokens, top_k, timeout_s=call_timeout_s)
        seconds = time.perf_counter() - started
        after = engine.call("metrics")
        alone = [engine.call("generate_greedy", [r], long_settings.decode_tokens, top_k,
                             timeout_s=call_timeout_s)[0] for r in reqs[1:]]
        after_alone = engine.call("metrics")
    except EngineError as exc:
        fail(str(exc))
    record_figure("batched_seconds", seconds)
    record_figure("prompt_tokens_total", float(sum(len(r) for r in reqs)))
    record_figure("kv_blocks", float(options["num_gpu_blocks_override"]))
    preempted = compare.counter_delta("vllm:num_preemptions", before, after, minimum=1)
    unpreempted = compare.counter_delta("vllm:num_preemptions", after, after_alone, maximum=0)
    want_alone = [longctx.without_prompt_steps(deep_fresh[0][0])] + alone
    same = compare.completions_equivalent(got, want_alone, tol, ("preempted", "alone"))
    want_ref, _ = deep_reference
    ref = compare.logprobs_close(got[:1], [longctx.without_prompt_steps(w) for w in want_ref[:1]], tol,
                                 ("preempted", "reference"))
    record_figures(record_figure, preempted)
    record_figure("identical_requests", float(sum(g.token_ids == w.token_ids for g, w in zip(got, want_alone))))
    record_figures(record_figure, same)
    if not preempted.ok:
        fail(f"no preemption: {'; '.join(preempted.problems)} while {len(reqs)} long requests shared a "
             f"{options['num_gpu_blocks_override']}-block KV pool, so recompute after preemption was not tested")
    unpreempted.raise_if_failed()
    same.raise_if_failed()
    ref.raise_if_failed()
