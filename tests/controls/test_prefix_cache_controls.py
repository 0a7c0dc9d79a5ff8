"""Controls of conformance/checks/test_prefix_cache.py: its own bodies against scripted engines whose cached
blocks change the output, whose reset keeps old blocks, or whose cache never hits."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from conformance.checks import test_prefix_cache as prefix_cache
from tests.check_fakes import (
    FAILED,
    TOL,
    Figures,
    ScriptedEngine,
    ScriptedEngines,
    greedy,
)


def prefix_engine(hits_per_call: list[int], outputs_of, counter_moves: bool = True) -> ScriptedEngine:
    """Each call reports its hits on the request (cached_tokens) and, unless `counter_moves` is False (vLLM before
    0.32 under async scheduling, vllm#48668), on the hit counter too."""
    counter = {"hits": 0.0, "calls": 0}

    def metrics():
        return {prefix_cache.HITS: counter["hits"]}

    def generate(ps, *args, **kwargs):
        hits = hits_per_call[min(counter["calls"], len(hits_per_call) - 1)]
        counter["hits"] += hits if counter_moves else 0
        counter["calls"] += 1
        return [dataclasses.replace(c, cached_tokens=hits) for c in outputs_of(ps, counter["calls"])]
    return ScriptedEngine({"scheduler_limits": {"enable_prefix_caching": True},
                           "kv_layout": SimpleNamespace(block_size=16), "metrics": metrics,
                           "generate_greedy": generate, "reset_prefix_cache": True})


def test_prefix_hit_check_fails_when_cached_blocks_change_the_output():
    """Wrong blocks served from the cache: the counter moves as it should, but the cached run's tokens differ."""
    engine = prefix_engine([0, 48, 32, 0], lambda ps, n: greedy(ps, lambda p: [5, 6, 7, 8] if n == 2 else [1, 2, 3, 4]))
    with pytest.raises(FAILED, match="cached chose 5"):
        prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
            ScriptedEngines(engine), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())


def test_prefix_reset_check_fails_when_the_reset_keeps_old_blocks():
    engine = prefix_engine([0, 48, 48], lambda ps, n: greedy(ps))
    with pytest.raises(FAILED, match="after the reset: 48 prompt tokens served from the prefix cache, expected at"):
        prefix_cache.test_prefix_cache_reset_forgets_blocks(
            ScriptedEngines(engine), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())


def test_prefix_hit_check_fails_on_a_cache_that_never_hits_and_holds_where_only_the_counter_stands_still():
    """A cache that never hits fails on the requests' own counts; hits that vLLM's counter lost (vllm#48668) pass,
    the counter recorded as it moved; a request whose count the engine does not report fails: no blind pass."""
    never = prefix_engine([0], lambda ps, n: greedy(ps))
    with pytest.raises(FAILED, match="the same prompt again: 0 prompt tokens served from the prefix cache"):
        prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
            ScriptedEngines(never), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())
    figures = Figures()
    lost = prefix_engine([0, 48, 32, 0], lambda ps, n: greedy(ps), counter_moves=False)
    prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
        ScriptedEngines(lost), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, figures)
    assert figures.values["prefix_hit_tokens_same_prompt"] == 48 and figures.values["counter_hits_same_prompt"] == 0
    silent = ScriptedEngine({"scheduler_limits": {"enable_prefix_caching": True},
                             "kv_layout": SimpleNamespace(block_size=16), "metrics": lambda: {},
                             "generate_greedy": lambda ps, *a, **k: greedy(ps), "reset_prefix_cache": True})
    with pytest.raises(FAILED, match="reported no cached-token count for 1 of 1 requests"):
        prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
            ScriptedEngines(silent), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())
