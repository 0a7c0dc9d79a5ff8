"""A checkpoint's first layers as a checkpoint of its own (conformance/checkpoints/slices.py), for the exact
float32 verdict of a model too big to hold in float32 (#38)."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from conformance.checkpoints import slices
from conformance.datafiles import DataError


def _names(model_dir) -> set[str]:
    out = set()
    for shard in model_dir.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            out |= set(f.keys())
    return out


def test_a_slice_keeps_the_first_layers_and_everything_outside_them(tiny, tmp_path):
    source = _names(tiny.path)
    cut = slices.slice_layers(tiny.path, 1, "abc", root=tmp_path)
    kept = _names(cut)
    assert kept == {n for n in source if not n.startswith("model.layers.") or n.startswith("model.layers.0.")}
    assert any(n.startswith("model.layers.1.") for n in source) and "model.embed_tokens.weight" in kept
    config = json.loads((cut / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and len(config.get("layer_types", [None])) == 1
    with safe_open(str(next(cut.glob("*.safetensors"))), "pt") as f, \
            safe_open(str(next(tiny.path.glob("*.safetensors"))), "pt") as g:
        assert f.get_tensor("model.embed_tokens.weight").equal(g.get_tensor("model.embed_tokens.weight"))
    assert slices.slice_layers(tiny.path, 1, "abc", root=tmp_path) == cut  # cached by key and count


@pytest.mark.parametrize("layers", [0, 99])
def test_a_layer_count_the_model_does_not_have_is_refused_in_one_sentence(tiny, tmp_path, layers):
    with pytest.raises(DataError, match=rf"has \d+ layers: a slice of {layers} cannot be cut from it"):
        slices.slice_layers(tiny.path, layers, "abc", root=tmp_path)


def test_layers_that_fit_counts_the_embeddings_whole_and_each_layer_its_share():
    cfg = {"num_hidden_layers": 36, "vocab_size": 201088, "hidden_size": 2880}
    params = 116_829_156_672  # gpt-oss-120b
    outside = 2 * 201088 * 2880
    per_layer = (params - outside) // 36
    budget = 0.8 * 143_771_172_864  # 80% of an H200, float32 weights
    assert slices.layers_that_fit(cfg, params, budget) == int((budget / 4 - outside) // per_layer) == 8
    assert slices.layers_that_fit(cfg, params, 10e9) == 0 and slices.layers_that_fit(cfg, params, 1e15) == 36
