"""Controls of the long-context checks: the real vLLM-CPU engine passes at depth, and mutants that are exact
below 4096 tokens and wrong past them (a sliding window lost, RoPE clamped at the original context) fail."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch

from conformance.checks import test_long_context as checks
from conformance.engines.base import Completion, StepLogprobs
from conformance.reference.longref import LongReference
from conformance.run import run_target
from conformance.verdicts import longctx, profiles
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines
from tests.conftest import start_cpu_engine

pytestmark = pytest.mark.slow
LIMITS = limits_for("float32")
FP32, TOP_K = LIMITS.depth  # what the long-context checks judge with
LONG = longctx.settings_()
LIMIT = longctx.limit_settings()


@pytest.fixture(scope="module")
def long_engine(tiny, tmp_path_factory):
    proc = start_cpu_engine(str(tiny.path), tmp_path_factory.mktemp("long") / "engine.log",
                            **profiles.profile("cpu").long_context)
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def deep(tiny):
    return longctx.deep_prompt(tiny.spec.vocab_size, LONG.prompt_tokens, LONG.seed)


@pytest.fixture(scope="module")
def engine_out(long_engine, deep):
    started = time.perf_counter()
    out = long_engine.call("generate_greedy", [deep], LONG.decode_tokens, TOP_K, prompt_logprobs=True, timeout_s=900)
    print(f"vLLM-CPU {len(deep)}-token prompt: {time.perf_counter() - started:.1f} s")
    return out


def _score(tiny, out, **mutant) -> tuple[list[Completion], float]:
    started = time.perf_counter()
    ref = LongReference(tiny.path, **mutant)
    want = [ref.score_from(c.prompt_ids, c.token_ids, TOP_K + 5, LONG.band_from) for c in out]
    return want, time.perf_counter() - started


@pytest.fixture(scope="module")
def good(tiny, engine_out):
    want, seconds = _score(tiny, engine_out)
    print(f"fp64 reference, {LONG.prompt_tokens} tokens: {seconds:.1f} s")
    return want


def _as_engine(mutant: list[Completion]) -> list[Completion]:
    """A mutant's band, front-padded to the shape an engine returns (prompt steps from position 0)."""
    pad = [StepLogprobs(0, {0: 0.0})] * LONG.band_from
    return [Completion(m.prompt_ids, m.token_ids, m.steps, pad + m.prompt_steps) for m in mutant]


def test_depth_parity_passes_on_real_vllm_cpu(engine_out, good, tiny):
    report = longctx.depth_parity(engine_out, good, FP32, LONG.band_from)
    report.raise_if_failed()
    bands = longctx.band_figures(engine_out[0], good[0], LONG.band_from)
    assert set(bands) == {"max_abs_dlogprob_4k_8k"} and bands["max_abs_dlogprob_4k_8k"] < FP32.max_abs
    assert report.compared_steps == LONG.prompt_tokens - 1 - LONG.band_from + LONG.decode_tokens


@pytest.mark.parametrize("depth", ["window_lost_past_4k", "rope_clamped_past_4k"])
def test_depth_mutants_are_exact_below_4k(tiny, depth):
    """What makes them depth bugs: on a 1024-token prompt they are the correct reference, so the P0 parity
    check (prompts of a few hundred tokens) cannot see them."""
    ids = longctx.deep_prompt(tiny.spec.vocab_size, 1024, 7)
    assert torch.equal(LongReference(tiny.path, depth=depth).logprobs(ids), LongReference(tiny.path).logprobs(ids))


SHORT_DEPTH = LONG.band_from + 512  # past 4096, where the mutants start; a third of the 8k reference's cost


@pytest.fixture(scope="module")
def short_deep(tiny):
    return longctx.deep_prompt(tiny.spec.vocab_size, SHORT_DEPTH, LONG.seed)


@pytest.fixture(scope="module")
def short_good(tiny, short_deep):
    return LongReference(tiny.path).score_from(short_deep, [], TOP_K + 5, LONG.band_from)


def _run_depth_check(tiny, short_deep, short_good, depth):
    """The check's own body, its engine output being a depth mutant's."""
    bad = LongReference(tiny.path, depth=depth).score_from(short_deep, [], TOP_K + 5, LONG.band_from)
    figures = Figures()
    with pytest.raises(FAILED, match="max_abs_dlogprob = .* exceeds the tolerance") as err:
        checks.test_long_prompt_matches_reference_at_depth((_as_engine([bad]), 1.0), ([short_good], 1.0),
                                                           LIMITS, LONG, figures)
    return err, figures


def test_depth_parity_fails_on_a_window_lost_past_4k(tiny, short_deep, short_good):
    _, figures = _run_depth_check(tiny, short_deep, short_good, "window_lost_past_4k")
    assert figures.values["max_abs_dlogprob"] > 3 * FP32.max_abs  # the 3x margin over the depth limit
    assert figures.values["max_abs_dlogprob_4k_8k"] > 3 * FP32.max_abs  # the 3x margin over the depth limit


def test_depth_parity_fails_on_rope_clamped_past_4k(tiny, short_deep, short_good):
    _, figures = _run_depth_check(tiny, short_deep, short_good, "rope_clamped_past_4k")
    assert figures.values["max_abs_dlogprob"] > 3 * FP32.max_abs  # the 3x margin over the depth limit


def test_chunked_prefill_check_fails_when_the_prompt_was_not_chunked(short_deep, short_good):
    """An engine whose scheduler takes the whole prompt in one step: chunked prefill was not tested."""
    unchunked = ScriptedEngine({"scheduler_limits": {"max_num_batched_tokens": 8192, "enable_chunked_prefill": False},
                                "generate_greedy": lambda *a, **k: _as_engine([short_good])})
    with pytest.raises(FAILED, match="was not prefilled in 1024-token chunks"):
        checks.test_chunked_prefill_of_long_prompt_matches_reference(
            ScriptedEngines(unchunked), {"max_model_len": 32768}, short_deep, ([short_good], 1.0), LIMITS,
            LONG, 300.0, Figures())


def test_prefix_hit_check_fails_on_a_cache_that_never_hits(long_engine, deep, short_good):
    """Real vLLM-CPU: the prefix cache reset between the warm-up and the measured request, as a cache that
    never hits would behave; the check body sees the request served with no cached prompt token."""
    metrics = []

    def measured(*args, **kwargs):
        metrics.append(long_engine.call("metrics"))
        return metrics[-1]

    def greedy(prompts, n, top_k, **kwargs):
        out = long_engine.call("generate_greedy", prompts, n, top_k, timeout_s=900)
        assert long_engine.call("reset_prefix_cache")
        return out

    engine = ScriptedEngine({"generate_greedy": greedy, "metrics": measured,
                             "kv_state": lambda: long_engine.call("kv_state")})
    with pytest.raises(FAILED, match="the deep prompt again: 0 prompt tokens served from the prefix cache"):
        checks.test_prefix_cache_hit_at_depth_matches_reference(engine, deep, ([], 1.0), ([short_good], 1.0),
                                                                LIMITS, LONG, 900.0, Figures())


def test_max_model_len_check_fails_on_a_lowered_limit_in_the_check_body(tiny):
    """An engine that lowered max_model_len to 16384 (its KV budget, say) while the profile asks for 32768."""
    lowered = ScriptedEngine({"scheduler_limits": {"max_model_len": 16384}, "submit": lambda *a: None})
    prompt = longctx.limit_prompt(tiny.spec.vocab_size, 32768, LIMIT)
    n = LIMIT.decode_tokens
    fresh = ([Completion(prompt, [1] * n, [StepLogprobs(1, {1: -0.1})] * n)], 1.0, {})
    with pytest.raises(FAILED, match="the engine runs max_model_len 16384, the profile asks for 32768"):
        checks.test_prompt_at_max_model_len_is_served(lowered, {"max_model_len": 32768}, prompt, fresh, LIMIT,
                                                      Figures())


def test_max_model_len_check_fails_on_a_lowered_limit():
    good = [Completion([1], [2, 3, 4, 5], [StepLogprobs(t, {t: -0.1}) for t in (2, 3, 4, 5)])]
    assert longctx.max_len_problems({"max_model_len": 32768}, 32768, good, 4) == []
    lowered = longctx.max_len_problems({"max_model_len": 16384}, 32768, good, 4)
    assert lowered == ["the engine runs max_model_len 16384, the profile asks for 32768"]
    short = [Completion([1], [2], [StepLogprobs(2, {2: -0.1})])]
    assert "decoded 1 of 4 tokens" in longctx.max_len_problems({"max_model_len": 32768}, 32768, short, 4)[0]
    nan = [Completion([1], [2, 3, 4, 5], [StepLogprobs(t, {t: float("nan")}) for t in (2, 3, 4, 5)])]
    assert "non-finite" in longctx.max_len_problems({"max_model_len": 32768}, 32768, nan, 4)[0]


# ---- preemption of long requests: the check's own body on scripted engines, then on real vLLM-CPU ----
PREEMPT = longctx.preemption_settings()


def _greedy_of(prompt: list[int], n: int, changed_at: int | None = None) -> Completion:
    """A deterministic completion of `prompt`; `changed_at` swaps the greedy token there for one outside
    the top-k (what a resumed request that lost or misplaced KV decodes)."""
    tokens = [(sum(prompt[-7:]) + 31 * i) % 997 + 1 for i in range(n)]
    if changed_at is not None:
        tokens[changed_at] = 999
    return Completion(list(prompt), tokens, [StepLogprobs(t, {t: -0.25, t + 1000: -1.75}) for t in tokens])


def _preemption_engine(deep, preemptions: float, changed: int | None = None) -> ScriptedEngine:
    counter = iter([0.0, preemptions, preemptions])

    def greedy(prompts, n, top_k, **kw):
        batched = len(prompts) > 1
        return [_greedy_of(p, n, 3 if batched and i == changed else None) for i, p in enumerate(prompts)]

    return ScriptedEngine({"metrics": lambda: {"vllm:num_preemptions": next(counter)}, "generate_greedy": greedy})


def _run_preemption_check(deep, engine) -> Figures:
    fresh = _greedy_of(deep, LONG.decode_tokens)
    figures = Figures()
    checks.test_preempted_long_requests_match_alone_and_reference(
        ScriptedEngines(engine, lambda o: engine), {"max_model_len": 32768},
        SimpleNamespace(config={"sliding_window": 128}), deep, ([fresh], 1.0),
        ([Completion(deep, fresh.token_ids, fresh.steps)], 1.0), LIMITS, LONG, 300.0, figures)
    return figures


def test_long_preemption_check_fails_when_no_preemption_happened(tiny):
    """A pool that held every request at once (the counter stands still): recompute was not tested."""
    deep = longctx.deep_prompt(tiny.spec.vocab_size, LONG.prompt_tokens, LONG.seed)
    with pytest.raises(FAILED, match="no preemption: vllm:num_preemptions moved by 0, expected at least 1"):
        _run_preemption_check(deep, _preemption_engine(deep, 0.0))


@pytest.mark.parametrize("changed", [0, 2])
def test_long_preemption_check_fails_when_a_resumed_request_changes(tiny, changed):
    """Preempted (the counter moved) and one request's fourth token differs from the same request alone:
    the 8192-token one (also against the reference) or a shorter one."""
    deep = longctx.deep_prompt(tiny.spec.vocab_size, LONG.prompt_tokens, LONG.seed)
    with pytest.raises(FAILED, match=r"preempted.*alone"):
        _run_preemption_check(deep, _preemption_engine(deep, 3.0, changed))


def test_long_preemption_check_passes_on_matching_scripted_outputs(tiny):
    """The same scripted engine without the fault passes: the controls above fail for their fault alone."""
    deep = longctx.deep_prompt(tiny.spec.vocab_size, LONG.prompt_tokens, LONG.seed)
    figures = _run_preemption_check(deep, _preemption_engine(deep, 3.0))
    assert figures.values["num_preemptions_delta"] == 3.0 and figures.values["identical_requests"] == 3.0


def test_preemption_options_hold_one_request_and_not_all():
    opts = longctx.preemption_options({"max_model_len": 32768, "kv_cache_memory_bytes": 1 << 28}, 8192, 8, 128,
                                      PREEMPT)
    assert opts["max_model_len"] == 8224 and opts["num_gpu_blocks_override"] == 257 + 36 + PREEMPT.spare_blocks
    need = sum(-(-(b - a) // PREEMPT.block_size) for a, b in PREEMPT.requests)
    assert need > opts["num_gpu_blocks_override"], "the requests fit the pool together: nothing would be preempted"
    on_64 = longctx.preemption_options({"max_model_len": 131072}, 8192, 8, 128, PREEMPT, 64)  # MI300X profiles
    assert (on_64["block_size"], on_64["max_model_len"], on_64["num_gpu_blocks_override"]) == (64, 8256, 151)
    with pytest.raises(ValueError, match="must start with the whole deep prompt"):
        longctx.preemption_requests(list(range(100)), longctx.PreemptionSettings(((1, 50),), 1024, 32, 4, {}))


def _vllm_admits(opts: dict, window: int, batches_in_flight: int) -> bool:
    """vLLM 0.26's start-up admission for one max_model_len request of gpt-oss's two groups (full attention and
    sliding window): full blocks cdiv(max_model_len, block) plus SlidingWindowSpec.max_admission_blocks_per_request
    cdiv(min(window - 1 + in-flight tokens, max_model_len), block) + 1, in-flight tokens = batches in flight x
    max_num_batched_tokens (VllmConfig.max_in_flight_tokens: 2 batches under async scheduling)."""
    bs, max_len = opts["block_size"], opts["max_model_len"]
    in_flight = batches_in_flight * opts["max_num_batched_tokens"]
    need = -(-max_len // bs) + -(-min(window - 1 + in_flight, max_len) // bs) + 1
    return need <= opts["num_gpu_blocks_override"]


def test_preemption_pool_starts_where_vllm_schedules_asynchronously():
    """First contact on the H200 (P1, vLLM 0.26.0, async scheduling): the pool sized for one chunk in flight (297
    blocks) was refused at start (326 needed); sized for the batches in flight it starts, and still cannot hold the
    three requests together, so vLLM must preempt. The CPU's pool (one batch in flight) is unchanged."""
    one = longctx.preemption_options({"max_model_len": 32768}, 8192, 8, 128, PREEMPT)
    two = longctx.preemption_options({"max_model_len": 32768}, 8192, 8, 128, PREEMPT, batches_in_flight=2)
    assert one["num_gpu_blocks_override"] == 297 and _vllm_admits(one, 128, 1) and not _vllm_admits(one, 128, 2)
    assert two["num_gpu_blocks_override"] == 329 and _vllm_admits(two, 128, 2)
    need = sum(-(-(b - a) // PREEMPT.block_size) for a, b in PREEMPT.requests)
    assert need > two["num_gpu_blocks_override"], "the requests fit the pool together: nothing would be preempted"


def test_long_preemption_passes_on_real_vllm_cpu(tiny, engine_out, good, tmp_path):
    """The check on real vLLM-CPU: the preemption engine started for it, the 8192-token completion and
    reference shared with the depth-parity control above."""
    engines = _RealEngines(tiny, tmp_path)
    figures = Figures()
    config = json.loads((tiny.path / "config.json").read_text())
    started = time.perf_counter()
    try:
        checks.test_preempted_long_requests_match_alone_and_reference(
            engines, dict(profiles.profile("cpu").long_context), SimpleNamespace(config=config),
            longctx.deep_prompt(tiny.spec.vocab_size, LONG.prompt_tokens, LONG.seed), (engine_out, 1.0),
            (good, 1.0), LIMITS, LONG, 900.0, figures)
    finally:
        engines.close()
    print(f"long preemption check: {time.perf_counter() - started:.1f} s, figures {figures.values}")
    assert figures.values["num_preemptions_delta"] >= 1 and figures.values["identical_requests"] == 3.0


class _RealEngines:
    def __init__(self, tiny, tmp_path) -> None:
        self.tiny, self.tmp_path, self.procs = tiny, tmp_path, []

    def options(self, **overrides):
        return dict(run_target.data()["cpu"]["vllm"]) | overrides  # the cpu profile adds nothing

    def get(self, **overrides):
        self.procs.append(start_cpu_engine(str(self.tiny.path), self.tmp_path / "preempt.log", **overrides))
        return self.procs[-1]

    def close(self) -> None:
        for p in self.procs:
            p.close()


# ---- requests at max_model_len: a RoPE table clamped past 16384 in real vLLM-CPU, judged at sampled positions ----
LIMIT_OPTIONS = dict(profiles.profile("cpu").long_context)
AT_LIMIT, _ = LIMITS.depth_at_limit


@pytest.fixture(scope="module")
def limit_prompt(tiny):
    return longctx.limit_prompt(tiny.spec.vocab_size, int(LIMIT_OPTIONS["max_model_len"]), LIMIT)


@pytest.fixture(scope="module")
def limit_positions(limit_prompt):
    return longctx.sampled_positions(len(limit_prompt), LIMIT)


def test_sampled_positions_spread_over_the_whole_prompt_and_both_sides_of_each_boundary(limit_prompt,
                                                                                         limit_positions):
    """Every stratum of 1/256 of the prompt holds a sampled position (no gap of two strata: a fault that starts
    anywhere and lasts 256 tokens or more is sampled), 4095/4096 … 16383/16384 are sampled, and the positions vary
    against the block size."""
    last = len(limit_prompt) - 1
    assert limit_positions == sorted(set(limit_positions)) and 0 <= limit_positions[0] and limit_positions[-1] < last
    width = -(-last // LIMIT.sampled_positions)
    gaps = [b - a for a, b in zip([-1, *limit_positions], [*limit_positions, last])]
    assert max(gaps) <= 2 * width and len(limit_positions) >= LIMIT.sampled_positions
    assert {4095, 4096, 8191, 8192, 16383, 16384} <= set(limit_positions) and 32767 not in limit_positions
    assert len({p % 128 for p in limit_positions}) > 64
    assert longctx.sampled_positions(len(limit_prompt), LIMIT) == limit_positions  # seeded: the same every run


@pytest.fixture(scope="module")
def clamped_engine(tiny, tmp_path_factory):
    """Real vLLM-CPU at the profile's max_model_len whose RoPE rows from 16384 on repeat row 16383
    (faults.rope_clamped_past_16k): exact below 16384 tokens, so every other long-context check passes on it."""
    proc = start_cpu_engine(str(tiny.path), tmp_path_factory.mktemp("clamped") / "engine.log",
                            planted_fault="rope_clamped_past_16k", **LIMIT_OPTIONS)
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def clamped_fresh(clamped_engine, limit_prompt):
    """What the check's limit_fresh fixture gives, from the clamped engine."""
    scheduler = clamped_engine.call("scheduler_limits")
    started = time.perf_counter()
    out = clamped_engine.call("generate_greedy", [limit_prompt], LIMIT.decode_tokens, TOP_K, prompt_logprobs=True,
                              timeout_s=1800)
    return out, time.perf_counter() - started, scheduler


@pytest.fixture(scope="module")
def clamped_reference(tiny, clamped_fresh, limit_positions):
    """The fp64 reference along the clamped engine's own greedy path (what the check's limit_reference scores)."""
    started = time.perf_counter()
    want = [LongReference(tiny.path).score_at(c.prompt_ids, c.token_ids, TOP_K + 5, limit_positions)
            for c in clamped_fresh[0]]
    print(f"fp64 reference at {len(clamped_fresh[0][0].prompt_ids)} tokens, {len(limit_positions)} sampled "
          f"positions: {time.perf_counter() - started:.1f} s")
    return want, time.perf_counter() - started


def test_limit_parity_fails_on_rope_clamped_past_16k_in_vllm_cpu(clamped_fresh, clamped_reference, limit_positions):
    """The check's own body on the clamped engine fails on its logprobs, and for the right reason: the sampled
    positions below 16384 stay within the depth limit (the engine is exact there), those past it and the decode
    steps at the limit exceed it 3x over. The 8k-token checks and the old engine-only 16k check cannot see it."""
    figures = Figures()
    with pytest.raises(FAILED, match=r"(?s)max_abs_dlogprob = .* exceeds the tolerance.*by position band: .*16k_32k"):
        checks.test_prompt_at_max_model_len_matches_reference_at_sampled_positions(
            clamped_fresh, clamped_reference, limit_positions, LIMITS, figures)
    v = figures.values
    print({k: round(x, 4) for k, x in v.items() if isinstance(x, float)})
    below = max(v["max_abs_dlogprob_0k_4k"], v["max_abs_dlogprob_4k_8k"], v["max_abs_dlogprob_8k_16k"])
    assert below < AT_LIMIT.max_abs  # the engine is exact there: what is left is fp32's RoPE drift
    assert min(v["max_abs_dlogprob_16k_32k"], v["max_abs_dlogprob_decode"]) > 3 * AT_LIMIT.max_abs
    assert v["sampled_positions"] == len(limit_positions) and v["prefill_steps_of_prompt"] > 1  # chunked


def test_limit_prefix_hit_check_fails_on_a_hit_that_decodes_wrong(clamped_engine, limit_prompt, clamped_fresh,
                                                                  clamped_reference):
    """The prefix-cache check at max_model_len on the clamped engine: the hit is a real hit (its cached-token count
    passes), and its decode steps at positions 32764 on are judged wrong."""
    figures = Figures()
    with pytest.raises(FAILED, match=r"(?s)cache hit vs reference: .*max_abs_dlogprob = .* exceeds the tolerance"):
        checks.test_prefix_cache_hit_at_max_model_len_matches_reference(
            clamped_engine, limit_prompt, clamped_fresh, clamped_reference, LIMITS, LIMIT, 900.0, figures)
    assert figures.values["cached_tokens"] >= len(limit_prompt) - 2 * 128


def test_limit_prefix_hit_check_fails_on_a_cache_that_never_hits(limit_prompt, clamped_fresh, clamped_reference):
    """An engine that prefills the prompt again each time (no cached token counted): the hit was not tested."""
    out, _, _ = clamped_fresh
    missed = ScriptedEngine({"generate_greedy": lambda ps, n, k, **kw: [dataclasses.replace(
        longctx.without_prompt_steps(out[0]), cached_tokens=0)], "kv_state": SimpleNamespace(block_size=128)})
    with pytest.raises(FAILED, match="the prompt at max_model_len again: 0 prompt tokens served from the prefix cache"):
        checks.test_prefix_cache_hit_at_max_model_len_matches_reference(
            missed, limit_prompt, clamped_fresh, clamped_reference, LIMITS, LIMIT, 900.0, Figures())


def _unchunked_engines(out, scheduler: dict) -> ScriptedEngines:
    engine = ScriptedEngine({"scheduler_limits": scheduler, "generate_greedy": lambda *a, **k: out})
    return ScriptedEngines(engine, lambda o: engine)


def test_unchunked_check_fails_when_the_prompt_was_chunked(limit_prompt, clamped_fresh, clamped_reference,
                                                           limit_positions):
    """An engine that kept chunked prefill on (4096-token steps): the one-step prefill was not tested."""
    chunked = _unchunked_engines(clamped_fresh[0], {"max_num_batched_tokens": 4096, "enable_chunked_prefill": True})
    with pytest.raises(FAILED, match="was prefilled in chunks, so the single-step prefill at max_model_len"):
        checks.test_unchunked_prefill_at_max_model_len_matches_reference(
            chunked, LIMIT_OPTIONS, limit_prompt, clamped_fresh, clamped_reference, limit_positions, LIMITS, LIMIT,
            900.0, Figures())


def test_unchunked_check_fails_on_a_prefill_wrong_past_16k(limit_prompt, clamped_fresh, clamped_reference,
                                                           limit_positions):
    """The one-step check's body given the clamped engine's logprobs from an engine that reports one step: it fails
    on them past 16384 as the check at sampled positions does."""
    one_step = _unchunked_engines(clamped_fresh[0], {"max_num_batched_tokens": 32768, "enable_chunked_prefill": False})
    figures = Figures()
    with pytest.raises(FAILED, match="max_abs_dlogprob = .* exceeds the tolerance"):
        checks.test_unchunked_prefill_at_max_model_len_matches_reference(
            one_step, LIMIT_OPTIONS, limit_prompt, clamped_fresh, clamped_reference, limit_positions, LIMITS, LIMIT,
            900.0, figures)
    assert figures.values["max_abs_dlogprob_8k_16k"] < AT_LIMIT.max_abs < figures.values["max_abs_dlogprob_16k_32k"]


def test_unchunked_options_hold_a_whole_prompt_in_one_step():
    opts = checks._unchunked_options(LIMIT_OPTIONS, LIMIT)
    assert opts["max_num_batched_tokens"] == LIMIT_OPTIONS["max_model_len"] and opts["enable_chunked_prefill"] is False
    assert opts["kv_cache_memory_bytes"] == LIMIT.unchunked_kv_factor * LIMIT_OPTIONS["kv_cache_memory_bytes"]
    assert "kv_cache_memory_bytes" not in checks._unchunked_options({"max_model_len": 131072}, LIMIT)  # GPU profiles
