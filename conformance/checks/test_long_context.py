"""Long context at depth (P1): prompts of 8k tokens and more on the model under test, the band past the
original 4096-token context compared with the fp64 reference (conformance/reference/longref.py, blockwise), and
prompts that fill the serving profile's max_model_len (cpu: 32768; the gpt-oss-120b profiles: 131072), judged at
positions sampled over the whole length, prefilled in the engine's own chunks and in one step, and from the prefix
cache."""

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


def _unchunked_options(long_options: dict, limit_settings: longctx.LimitSettings) -> dict:
    """The long-context engine taking a whole max_model_len prompt in one step: no chunked prefill, a step budget of
    max_model_len. A fixed KV budget (kv_cache_memory_bytes) grows by `unchunked_kv_factor`: vLLM sizes the sliding
    window's share for a whole step in flight, a prompt's worth."""
    n = int(long_options["max_model_len"])
    out = long_options | {"max_num_batched_tokens": n, "enable_chunked_prefill": False}
    if long_options.get("kv_cache_memory_bytes"):
        out["kv_cache_memory_bytes"] = int(long_options["kv_cache_memory_bytes"]) * limit_settings.unchunked_kv_factor
    return out


def engines_ahead(engines):
    """The engines these checks ask for, in order: the factory starts each one ahead (conformance/run/fixtures.py)."""
    options, settings_ = _long_options(engines.target), longctx.settings_()
    yield "test_long_prompt_matches_reference_at_depth", options
    yield "test_unchunked_prefill_at_max_model_len_matches_reference", _unchunked_options(options,
                                                                                        longctx.limit_settings())
    yield "test_chunked_prefill_of_long_prompt_matches_reference", _chunked_options(options, settings_)
    config = engines.model.config
    yield ("test_preempted_long_requests_match_alone_and_reference",  # the default engine's scheduling, where known
           _preemption_options(options, _deep_prompt(config, settings_), settings_, config, engines,
                               bool(engines.default_info().get("async_scheduling"))))


@pytest.fixture(scope="module")
def long_options(target):
    """The engine options of the profile's long-context engine (cpu: max_model_len 32768, 128 MiB of KV)."""
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


@pytest.fixture(scope="module")
def limit_settings():
    return longctx.limit_settings()


@pytest.fixture(scope="module")
def limit_prompt(model_under_test, long_options, limit_settings):
    """Random ids that fill max_model_len but the tokens the request decodes (cpu: 32764 + 4)."""
    return longctx.limit_prompt(int(model_under_test.config["vocab_size"]), int(long_options["max_model_len"]),
                                limit_settings)


@pytest.fixture(scope="module")
def limit_positions(limit_prompt, limit_settings):
    return longctx.sampled_positions(len(limit_prompt), limit_settings)


def _judged_by_reference(model_under_test) -> bool:
    from conformance.run.fixtures import STREAMING_ABOVE_PARAMS

    return model_under_test.num_params <= STREAMING_ABOVE_PARAMS


@pytest.fixture(scope="module")
def limit_fresh(engines, long_options, model_under_test, limit_prompt, limit_settings, limits, call_timeout_s):
    """The prompt at max_model_len prefilled from nothing (prefix cache reset) in the long-context engine's own
    scheduling, greedy; with prompt logprobs where the reference judges them (a real checkpoint's would be hours of
    fp64, and its vocabulary's logits at every prompt position a large transfer). The completions, the seconds and the
    engine's scheduler limits."""
    _, top_k = limits.depth_at_limit
    try:
        engine = engines.get(**long_options)
        engine.call("reset_prefix_cache")
        scheduler = engine.call("scheduler_limits")
        started = time.perf_counter()
        out = engine.call("generate_greedy", [limit_prompt], limit_settings.decode_tokens, top_k,
                          prompt_logprobs=_judged_by_reference(model_under_test), timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    return out, time.perf_counter() - started, scheduler


@pytest.fixture(scope="module")
def limit_reference(model_under_test, limit_fresh, limit_positions, limits):
    """The fp64 reference along the engine's greedy path at max_model_len, at the sampled positions and every decode
    step; and its seconds."""
    from conformance.reference.longref import LongReference

    if not _judged_by_reference(model_under_test):
        pytest.skip(f"a {len(limit_fresh[0][0].prompt_ids)}-token fp64 reference of a real checkpoint takes hours on "
                    "the host: the parity checks at max_model_len run on the tiny model (the engine-only one still "
                    "runs)")
    _, top_k = limits.depth_at_limit
    ref = LongReference(model_under_test.path)
    started = time.perf_counter()
    want = [ref.score_at(c.prompt_ids, c.token_ids, top_k + 5, limit_positions) for c in limit_fresh[0]]
    return want, time.perf_counter() - started


def _judge_sampled(got, want, positions, depth, record_figure, names=("engine", "reference")):
    tol, _ = depth
    report = longctx.sampled_parity(got, want, positions, tol, names)
    record_figures(record_figure, report)
    if got and len(got[0].prompt_steps) == len(got[0].prompt_ids) - 1:
        record_figures(record_figure, longctx.sampled_band_figures(got[0], want[0], positions))
    report.raise_if_failed()


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
def test_prompt_at_max_model_len_matches_reference_at_sampled_positions(limit_fresh, limit_reference, limit_positions,
                                                                        limits, record_figure):
    """A prompt that fills the profile's max_model_len (cpu: 32764 tokens and 4 decoded), prefilled in the
    engine's own chunks (vLLM-CPU: 4096 tokens a step) and decoded greedily: its prompt logprobs at a few hundred
    positions sampled over the whole length (one at random in each equal stratum, and both sides of 4096, 8192,
    16384 …) and every decode step agree with the fp64 reference. The reference runs its last layer at those
    positions alone, the layers below it at every position: what the sampled queries attend to.

    Catches: what goes wrong only past the depth the other checks reach (vllm-project/vllm#40018: a prefill that
    returns garbage above ~20K prompt tokens, short prompts fine): RoPE/YaRN tables built, cached or indexed for a
    shorter context (clamped, wrapped or recomputed past a length), position ids or block tables that overflow
    deep into a sequence, attention kernels that switch path or lose the sinks at long key counts, KV cache
    blocks past some count read from the wrong place, chunked prefill that misplaces the chunks of a long prompt.
    Reference: https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json (max_position_embeddings 131072,
      YaRN factor 32 from 4096); https://github.com/vllm-project/vllm/issues/40018
    Limits: tolerances.toml [depth_at_limit.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context at
      max_model_len, measured")
    Controls:
      tests/controls/test_long_context_controls.py::test_limit_parity_fails_on_rope_clamped_past_16k_in_vllm_cpu
    """
    out, engine_s, scheduler = limit_fresh
    want, ref_s = limit_reference
    step = int(scheduler.get("max_num_batched_tokens") or 0)
    record_figure("engine_seconds", engine_s)
    record_figure("reference_seconds", ref_s)
    record_figure("prompt_tokens", float(len(out[0].prompt_ids)))
    record_figure("sampled_positions", float(len(limit_positions)))
    record_figure("prefill_steps_of_prompt", float(-(-len(out[0].prompt_ids) // step)) if step else float("nan"))
    _judge_sampled(out, want, limit_positions, limits.depth_at_limit, record_figure)


@pytest.mark.p1
def test_prefix_cache_hit_at_max_model_len_matches_reference(long_engine, limit_prompt, limit_fresh, limit_reference,
                                                             limits, limit_settings, call_timeout_s, record_figure):
    """The prompt at max_model_len sent again is served from the prefix cache (all but its last block counted as
    cached) and decodes the same greedy tokens with the reference's logprobs, every decode step at the limit.

    Catches: prefix-cache hits that return wrong or evicted blocks when the cached prefix spans the whole KV budget
    of a max_model_len request, block hashes or block tables that break past some number of blocks, a hit whose
    decode reads positions or RoPE rows of a shorter context.
    Reference: https://docs.vllm.ai/en/latest/design/prefix_caching.html
    Limits: tolerances.toml [depth_at_limit.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context at
      max_model_len, measured")
    Controls:
      tests/controls/test_long_context_controls.py::test_limit_prefix_hit_check_fails_on_a_cache_that_never_hits;
      tests/controls/test_long_context_controls.py::test_limit_prefix_hit_check_fails_on_a_hit_that_decodes_wrong
    """
    tol, top_k = limits.depth_at_limit
    try:
        # warm the cache without prompt logprobs (requests that ask for them skip reading the cache)
        long_engine.call("generate_greedy", [limit_prompt], 1, 1, timeout_s=call_timeout_s)
        started = time.perf_counter()
        hit = long_engine.call("generate_greedy", [limit_prompt], limit_settings.decode_tokens, top_k,
                               timeout_s=call_timeout_s)
        seconds = time.perf_counter() - started
        block = int(long_engine.call("kv_state").block_size)
    except EngineError as exc:
        fail(str(exc))
    counted = compare.cached_tokens("the prompt at max_model_len again", hit, minimum=len(limit_prompt) - 2 * block)
    record_figures(record_figure, counted)
    record_figure("cached_request_seconds", seconds)
    record_figure("fresh_request_seconds", limit_fresh[1])
    counted.raise_if_failed()
    want, _ = limit_reference
    report = compare.logprobs_close(hit, [longctx.without_prompt_steps(w) for w in want], tol,
                                    ("cache hit", "reference"), bands=compare.POSITION_BANDS + longctx.LIMIT_BANDS)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
def test_prompt_at_max_model_len_is_served(long_engine, long_options, limit_prompt, limit_fresh, limit_settings,
                                           record_figure):
    """The long-context engine runs the profile's max_model_len (cpu: 32768), serves a prompt that fills
    it (max_model_len - 4 prompt tokens, 4 decoded) with finite logprobs and a full KV accounting, and
    refuses one token more in one clear error. On every profile, the real checkpoints' included (where the
    reference cannot judge the logprobs at that length).

    Catches: a max_model_len silently lowered by the engine (KV budget, model config), requests at the
    limit that crash or hang the prefill, position or block tables sized one short of the limit, limits
    enforced only after minutes of queuing.
    Reference: https://docs.vllm.ai/en/latest/configuration/engine_args.html (--max-model-len)
    Controls:
      tests/controls/test_long_context_controls.py::test_max_model_len_check_fails_on_a_lowered_limit_in_the_check_body
    """
    want_len = int(long_options["max_model_len"])
    out, seconds, _ = limit_fresh
    try:
        limits = long_engine.call("scheduler_limits")
        over = limit_prompt + list(range(1, want_len + 2 - len(limit_prompt)))  # max_model_len + 1 tokens
        refused = long_engine.call("submit", "over_max_model_len", over, limit_settings.decode_tokens)
    except EngineError as exc:
        fail(str(exc))
    record_figure("max_model_len", float(limits["max_model_len"]))
    record_figure("prompt_tokens", float(len(limit_prompt)))
    record_figure("seconds", seconds)
    Problems(longctx.max_len_problems(limits, want_len, out, limit_settings.decode_tokens)).raise_if_failed()
    compare.rejected_clearly(refused, 5.0, ("maximum context length", "max_model_len", "longer than")).raise_if_failed()


@pytest.mark.p1
def test_unchunked_prefill_at_max_model_len_matches_reference(engines, long_options, limit_prompt, limit_fresh,
                                                              limit_reference, limit_positions, limits,
                                                              limit_settings, call_timeout_s, record_figure):
    """The same prompt at max_model_len prefilled in one step (chunked prefill off, max_num_batched_tokens =
    max_model_len): the attention of every query over the whole prompt in one forward, not over the KV of earlier
    chunks in the cache. Its sampled prompt logprobs and decode steps agree with the fp64 reference.

    Catches: the single-pass prefill kernel (the varlen path without a cached context) wrong at long lengths where
    the chunked path is right: score tiles or softmax accumulation that overflow at tens of thousands of keys,
    sliding-window or sink metadata built for a whole long sequence at once, a one-step prefill that drops tokens past
    the kernel's largest tile count.
    Reference: https://docs.vllm.ai/en/latest/configuration/optimization.html (chunked prefill)
    Limits: tolerances.toml [depth_at_limit.<dtype>] (measured: docs/notebook/2026-12-measurements.md "Long context at
      max_model_len, measured")
    Controls:
      tests/controls/test_long_context_controls.py::test_unchunked_check_fails_when_the_prompt_was_chunked;
      tests/controls/test_long_context_controls.py::test_unchunked_check_fails_on_a_prefill_wrong_past_16k
    """
    _, top_k = limits.depth_at_limit
    options = _unchunked_options(long_options, limit_settings)
    try:
        engine = engines.get(**options)
        scheduler = engine.call("scheduler_limits")
        started = time.perf_counter()
        out = engine.call("generate_greedy", [limit_prompt], limit_settings.decode_tokens, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
        seconds = time.perf_counter() - started
    except EngineError as exc:
        fail(str(exc))
    if scheduler["enable_chunked_prefill"] or int(scheduler["max_num_batched_tokens"]) < len(limit_prompt):
        fail(f"the one-step engine reports {scheduler}: the {len(limit_prompt)}-token prompt was prefilled in chunks, "
             "so the single-step prefill at max_model_len was not tested")
    want, _ = limit_reference
    if out[0].token_ids != want[0].token_ids:  # its own greedy path: score that one
        from conformance.reference.longref import LongReference

        want = [LongReference(engines.model.path).score_at(c.prompt_ids, c.token_ids, top_k + 5, limit_positions)
                for c in out]
    record_figure("engine_seconds", seconds)
    record_figure("chunked_engine_seconds", limit_fresh[1])
    _judge_sampled(out, want, limit_positions, limits.depth_at_limit, record_figure)


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
