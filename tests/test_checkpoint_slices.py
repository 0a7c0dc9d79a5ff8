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


def test_a_dequantized_slice_holds_the_mxfp4_experts_exactly_in_the_unquantized_layout(tiny, tmp_path, monkeypatch):
    """The MXFP4 experts come back as the unquantized HF tensors [E, in, out] in bf16, bit for bit the values the
    fp64 reference dequantizes, the quantization_config dropped; a scale that overflows bf16 and a checkpoint that
    is not MXFP4 are refused in one sentence."""
    import torch
    from safetensors.torch import save_file

    from conformance.checkpoints import crafted
    from conformance.reference.gpt_oss import dequant_mxfp4

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))
    source = crafted.mxfp4()
    cut = slices.slice_layers(source, 1, "mx", root=tmp_path, dequantize=True)
    assert "quantization_config" not in json.loads((cut / "config.json").read_text())
    stem = "model.layers.0.mlp.experts.gate_up_proj"
    with safe_open(str(next(cut.glob("*.safetensors"))), "pt") as f, \
            safe_open(str(next(source.glob("*.safetensors"))), "pt") as g:
        got = f.get_tensor(stem)
        want = dequant_mxfp4(g.get_tensor(stem + "_blocks"), g.get_tensor(stem + "_scales")).transpose(1, 2)
        assert got.dtype == torch.bfloat16 and torch.equal(got.double(), want)
        assert stem + "_blocks" not in f.keys() and "model.layers.1.mlp.experts.down_proj" not in f.keys()
        tensors = {n: g.get_tensor(n) for n in g.keys()}
    tensors[stem + "_scales"] = torch.full_like(tensors[stem + "_scales"], 255)  # 6 x 2^128: past bf16 (and fp32)
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text((source / "config.json").read_text())
    save_file(tensors, str(wide / "model.safetensors"))
    with pytest.raises(DataError, match="bf16 cannot hold exactly"):
        slices.slice_layers(wide, 1, "wide", root=tmp_path, dequantize=True)
    with pytest.raises(DataError, match="is not an MXFP4 checkpoint"):
        slices.slice_layers(tiny.path, 1, "plain", root=tmp_path, dequantize=True)


def test_the_bf16_dequantization_equals_the_references_for_every_scale_and_byte():
    """The slice dequantizes in bf16 (faster than the reference's fp64 by about three); every byte at every E8M0
    scale gives the fp64 reference's values bit for bit, and a product past bf16's range is not finite (refused), as
    is every value under E8M0's NaN scale."""
    import torch

    from conformance.reference.gpt_oss import dequant_mxfp4

    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16).expand(256, 16, 16).contiguous()  # every byte
    scales = torch.arange(256, dtype=torch.uint8).reshape(256, 1).expand(256, 16).contiguous()  # at every scale
    got, want = slices._mxfp4_bf16(blocks, scales), dequant_mxfp4(blocks, scales)
    finite = torch.isfinite(got)
    assert torch.equal(got[finite].double(), want[finite])
    bf16_max = torch.finfo(torch.bfloat16).max
    assert torch.equal(~finite[:255], want[:255].abs() > bf16_max)  # only what overflows bf16 is refused
    assert bool(finite[:253].all()) and not bool(finite[255].any())  # E8M0 255 (NaN in OCP MX): refused whole


def test_a_slice_left_half_written_by_a_stopped_run_is_removed_and_a_fresh_one_kept(tiny, tmp_path):
    """The exact check's slice is written in the background (checkpoints/exact_slice.py); a stopped run leaves its
    temporary folder (15 GB at 120b's dimensions). The next slice written removes those over an hour old and leaves a
    younger one, which another run may be writing."""
    import os
    import time

    stale, fresh = tmp_path / ".slice-stopped", tmp_path / ".slice-writing"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    old = time.time() - slices.STALE_S - 60
    os.utime(stale, (old, old))
    out = slices.slice_layers(tiny.path, 1, "k" * 16, root=tmp_path)
    assert (out / "config.json").is_file() and not stale.exists() and fresh.is_dir()
