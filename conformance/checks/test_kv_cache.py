"""The paged KV cache is allocated while requests run and every block is released after."""

import math

import pytest

from conformance.verdicts import compare
from conformance.verdicts.verdict import record_figures

AREA = "kv-cache"


@pytest.mark.p0
@pytest.mark.needs("paged_kv")
def test_kv_blocks_released_after_requests(engine, engine_greedy, prompts, model_under_test, call_timeout_s,
                                           record_figure):
    """A running request holds the blocks its length needs (a model of sliding-window layers alone, such as a
    1-layer slice of gpt-oss, those of its window); after it and the prompt set finished,
    every KV-cache block the engine allocated is free again and nothing is left scheduled.

    Catches: block leaks in the allocator (a server that slowly runs out of KV cache and starts
    preempting or rejecting requests), requests stuck in the scheduler, or no cache allocated at all.
    Reference: https://docs.vllm.ai/en/latest/design/paged_attention.html ; vLLM v1 core/block_pool.py
    Controls: tests/test_check_bodies_engine.py::test_kv_released_check_fails_on_a_leaking_pool,
      tests/test_check_bodies_engine.py::test_kv_released_check_holds_a_sliding_only_model_to_its_window
    """
    prompt = max(prompts.prompts, key=len)
    engine.call("add_request", prompt, 4, timeout_s=call_timeout_s)
    engine.call("step", 1, timeout_s=call_timeout_s)
    during = engine.call("kv_state", timeout_s=call_timeout_s)
    engine.call("step", 8, timeout_s=call_timeout_s)  # 1 prefill + 4 decode steps are enough to finish
    after = engine.call("kv_state", timeout_s=call_timeout_s)
    cfg = model_under_test.config
    window = int(cfg.get("sliding_window") or 0)
    sliding_only = window and cfg.get("layer_types") and "full_attention" not in cfg["layer_types"]
    needed = min(len(prompt), window) if sliding_only else len(prompt)
    report = compare.kv_blocks_released(during, after, math.ceil(needed / during.block_size))
    record_figures(record_figure, report)
    report.raise_if_failed()
