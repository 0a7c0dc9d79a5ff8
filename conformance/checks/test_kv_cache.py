"""The paged KV cache is allocated while requests run and every block is released after."""

import pytest

from conformance.reference import kv_model
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
    Controls: tests/controls/test_kv_cache_controls.py::test_kv_released_check_fails_on_a_leaking_pool,
      tests/controls/test_kv_cache_controls.py::test_kv_released_check_holds_a_sliding_only_model_to_its_window
    """
    prompt = max(prompts.prompts, key=len)
    engine.call("add_request", prompt, 4, timeout_s=call_timeout_s)
    engine.call("step", 1, timeout_s=call_timeout_s)
    during = engine.call("kv_state", timeout_s=call_timeout_s)
    engine.call("step", 8, timeout_s=call_timeout_s)  # 1 prefill + 4 decode steps are enough to finish
    after = engine.call("kv_state", timeout_s=call_timeout_s)
    cfg = model_under_test.config  # what each kind of layer must hold (a full layer: the whole prompt)
    kinds = {"sliding" if "sliding" in t else "full" for t in cfg.get("layer_types") or ["full_attention"]}
    needed = max(kv_model.blocks_needed(kind, len(prompt), during.block_size, cfg.get("sliding_window"),
                                        after_decode=True) for kind in kinds)
    report = compare.kv_blocks_released(during, after, needed)
    record_figures(record_figure, report)
    report.raise_if_failed()
