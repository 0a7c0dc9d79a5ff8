"""The closed-form KV expectation (conformance/reference/kv_model.py) on hand-computed cases: the tiny model,
a gpt-oss-20b-shaped config, an uneven layer pattern, and the blocks a request needs per group."""

from __future__ import annotations

import pytest

from conformance.checkpoints.models import TinySpec, hf_config
from conformance.reference import kv_model


def test_tiny_model_layout_by_hand():
    want = kv_model.expected_kv(hf_config(TinySpec()), block_size=128, dtype_bytes=4, budget_bytes=64 << 20)
    # page = 2 (K,V) x 128 tokens x 2 kv heads x 64 dims x 4 bytes; a pool block spans the 2 layers of a group
    assert want.page_size_bytes == 131072 and want.bytes_per_block == 262144 and want.num_blocks == 256
    assert {(g.kind, g.layers, g.sliding_window) for g in want.groups} == {("sliding", (0, 2), 128),
                                                                           ("full", (1, 3), None)}


def test_gpt_oss_20b_shaped_layout_and_override():
    config = hf_config(TinySpec(num_hidden_layers=24, num_key_value_heads=8))
    want = kv_model.expected_kv(config, 16, 2, budget_bytes=None, num_blocks_override=12)
    assert want.group_size == 12 and want.num_blocks == 12
    assert want.bytes_per_block == 12 * 2 * 16 * 8 * 64 * 2  # 12 layers per group, bf16
    assert kv_model.expected_kv(config, 16, 2, budget_bytes=None).num_blocks is None  # unknown budget


def test_uneven_pattern_is_split_like_vllm():
    """5 sliding : 1 full (Gemma-3 style): groups of the smaller bucket's size, sliding split in 5."""
    config = hf_config(TinySpec(num_hidden_layers=6))
    config["layer_types"] = ["sliding_attention"] * 5 + ["full_attention"]
    want = kv_model.expected_kv(config, 32, 4, budget_bytes=1 << 20)
    assert want.group_size == 1 and len(want.groups) == 6


@pytest.mark.parametrize(("kind", "computed", "after_decode", "need"), [
    ("full", 291, True, 10),       # ceil(291 / 32)
    ("sliding", 291, True, 5),     # 10 - floor((291 - 128) / 32): blocks wholly behind the window are freed
    ("sliding", 290, False, 10),   # right after prefill nothing has been freed yet
    ("sliding", 100, True, 4),     # shorter than the window: nothing to free
])
def test_blocks_needed(kind, computed, after_decode, need):
    assert kv_model.blocks_needed(kind, computed, 32, 128, after_decode) == need


def test_config_without_layer_types_is_refused():
    config = hf_config(TinySpec())
    del config["layer_types"]
    with pytest.raises(kv_model.KVConfigError, match="layer_types"):
        kv_model.expected_kv(config, 16, 2, 1 << 20)
