"""Controls of conformance/checks/test_kv_accounting.py: its own bodies against scripted engines whose KV pool has
the wrong size, whose sliding group never frees, whose aborted requests keep blocks, or that leak slowly over
rounds; an asynchronous scheduler's one step of lag passes and no more."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conformance.checks import test_kv_accounting as kv_accounting
from conformance.engines.base import KVState
from conformance.engines.observations import (
    KVGroupLayout,
    KVLayout,
    RequestBlocks,
)
from tests.check_fakes import FAILED, PROMPTS, Figures, ScriptedEngine, ScriptedEngines, sequence, target_of


@pytest.fixture(scope="module")
def tiny_config(tiny) -> dict:
    return json.loads((tiny.path / "config.json").read_text())


def layout_of(config: dict, num_blocks: int, block_size: int = 16, budget: int | None = 64 << 20) -> KVLayout:
    page = 2 * block_size * int(config["num_key_value_heads"]) * int(config["head_dim"]) * 4
    kinds = ["SlidingWindowSpec" if "sliding" in t else "FullAttentionSpec" for t in config["layer_types"]]
    groups = [KVGroupLayout(kind, [f"model.layers.{i}.self_attn.attn" for i, k in enumerate(kinds) if k == kind],
                            int(config["sliding_window"]) if "Sliding" in kind else None, block_size,
                            int(config["num_key_value_heads"]), int(config["head_dim"]), 4, page)
              for kind in dict.fromkeys(kinds)]
    return KVLayout(num_blocks, block_size, block_size, budget, "kv_cache_memory_bytes", budget, None, groups)


def test_kv_block_count_check_fails_on_a_pool_of_the_wrong_size(tiny_config):
    engine = ScriptedEngine({"kv_layout": layout_of(tiny_config, num_blocks=7)})
    model = SimpleNamespace(config=tiny_config)
    with pytest.raises(FAILED, match="7 blocks allocated, the configuration implies"):
        kv_accounting.test_kv_block_count_matches_config(engine, ScriptedEngines(engine), target_of(), model, 1.0,
                                                         Figures())


def blocks_engine(config: dict, layout: KVLayout, held: list[int]) -> ScriptedEngine:
    computed = {"n": 0}

    def request_blocks(rid):
        computed["n"] += 1
        length = int(config["sliding_window"]) + 2 * layout.block_size + layout.block_size // 2
        return RequestBlocks(rid, length + computed["n"] - 1, length + computed["n"], held,
                             layout.num_blocks - 1 - sum(held))
    during = KVState(layout.num_blocks, layout.num_blocks - 1 - sum(held), layout.block_size)
    after = KVState(layout.num_blocks, layout.num_blocks - 1, layout.block_size)
    return ScriptedEngine({"kv_layout": layout, "scheduler_limits": {"max_model_len": 4096}, "add_request": "r1",
                           "step": None, "request_blocks": request_blocks, "kv_state": sequence(during, after)},
                          block_size=layout.block_size)


def test_request_blocks_check_fails_when_the_sliding_group_never_frees(tiny_config):
    engine = blocks_engine(tiny_config, layout_of(tiny_config, 256), held=[99, 99])
    with pytest.raises(FAILED, match="group holds 99 blocks"):
        kv_accounting.test_request_holds_blocks_per_group(engine, SimpleNamespace(config=tiny_config), 1.0, Figures())


def test_kv_abort_check_fails_when_aborted_requests_keep_blocks():
    during = KVState(num_blocks=100, free_blocks=80, block_size=16)
    kept = KVState(num_blocks=100, free_blocks=80, block_size=16, running_requests=3)
    engine = ScriptedEngine({"add_request": "r", "step": None, "abort": None, "kv_state": sequence(during, kept)})
    with pytest.raises(FAILED, match="19 of 100 blocks still in use"):
        kv_accounting.test_kv_blocks_free_after_abort(engine, PROMPTS, 1.0, Figures())


def test_kv_block_size_check_fails_on_wrong_counts(tiny_config):
    default = blocks_engine(tiny_config, layout_of(tiny_config, 256, block_size=16), held=[2, 4])
    other = blocks_engine(tiny_config, layout_of(tiny_config, 5, block_size=32), held=[2, 4])
    engines = ScriptedEngines(default, by_key=lambda o: other)
    with pytest.raises(FAILED, match="5 blocks allocated, the configuration implies"):
        kv_accounting.test_kv_accounting_at_block_size(32, engines, target_of(), SimpleNamespace(config=tiny_config),
                                                       1.0, Figures())
    assert engines.asked == [{}, {"block_size": 32}]


def test_kv_rounds_check_fails_on_a_slow_leak():
    states = [KVState(100, 99, 16)] + [KVState(100, 99 - n, 16) for n in range(1, 7)]
    engine = ScriptedEngine({"kv_state": sequence(*states), "run_stepwise": None, "add_request": "r", "step": None,
                             "abort": None})
    with pytest.raises(FAILED, match="after round 1: 1 blocks still used"):
        kv_accounting.test_kv_blocks_do_not_leak_over_rounds(engine, PROMPTS, 1.0, Figures())


def _lagging_engine(config: dict, layout: KVLayout, lag: int, async_scheduling: bool) -> ScriptedEngine:
    """A request whose sliding group frees the blocks behind the window `lag` decode steps late."""
    from conformance.reference import kv_model

    length = int(config["sliding_window"]) + 2 * layout.block_size + layout.block_size // 2
    computed = {"n": 0}

    def need(kind: str, c: int) -> int:
        window = int(config["sliding_window"]) if kind == "sliding" else None
        return kv_model.blocks_needed(kind, c, layout.block_size, window, after_decode=c > length)

    def request_blocks(rid):
        c = length + computed["n"]
        computed["n"] += 1
        held = [need("sliding", max(length, c - lag)) if "Sliding" in g.kind else need("full", c)
                for g in layout.groups]
        return RequestBlocks(rid, c, c + 1, held, layout.num_blocks - 1 - sum(held))
    during = KVState(layout.num_blocks, layout.num_blocks - 20, layout.block_size)
    after = KVState(layout.num_blocks, layout.num_blocks - 1, layout.block_size)
    return ScriptedEngine({"kv_layout": layout, "scheduler_limits": {"max_model_len": 4096}, "add_request": "r1",
                           "step": None, "request_blocks": request_blocks, "kv_state": sequence(during, after)},
                          block_size=layout.block_size, async_scheduling=async_scheduling)


def test_request_blocks_check_allows_an_async_scheduler_one_step_of_lag_and_no_more(tiny_config):
    """First contact with vLLM 0.26.0 on the H200 (asynchronous scheduling): with 169 of a 168-token prompt's tokens
    computed the sliding group still held 11 blocks where its length needs 9, and 9 from the next step on."""
    layout = layout_of(tiny_config, 256)
    model = SimpleNamespace(config=tiny_config)
    kv_accounting.test_request_holds_blocks_per_group(_lagging_engine(tiny_config, layout, 1, True), model, 1.0,
                                                     Figures())
    with pytest.raises(FAILED, match="sliding group holds"):  # the same lag where the engine schedules in step
        kv_accounting.test_request_holds_blocks_per_group(_lagging_engine(tiny_config, layout, 1, False), model, 1.0,
                                                         Figures())
    with pytest.raises(FAILED, match="sliding group holds"):  # two steps late is a fault even when asynchronous
        kv_accounting.test_request_holds_blocks_per_group(_lagging_engine(tiny_config, layout, 2, True), model, 1.0,
                                                         Figures())
