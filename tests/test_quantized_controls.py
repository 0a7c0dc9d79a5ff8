"""MXFP4 writer self-tests and negative controls of the MXFP4 loading check: the writer round-trips
through the reference's independent dequantizer, the streaming reference reads the real on-disk
layout exactly, and a loader with swapped nibbles or an off-by-one scale bias is rejected."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conformance import compare, settings
from conformance.crafted import mxfp4
from conformance.quant.mxfp4 import quantize
from conformance.reference import Reference
from conformance.reference.gpt_oss import FP4_VALUES, dequant_mxfp4


def test_representable_values_round_trip_exactly():
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 16, (4, 8, 64), generator=gen)
    exps = torch.randint(-6, 6, (4, 8, 2, 1), generator=gen).double()
    values = (torch.tensor(FP4_VALUES, dtype=torch.float64)[idx].view(4, 8, 2, 32) * 2.0**exps).view(4, 8, 64)
    values[..., 0::32] = 6.0 * 2.0 ** exps[..., 0]  # make each block's max the E2M1 max, so the scale is exact
    blocks, scales = quantize(values)
    assert torch.equal(dequant_mxfp4(blocks, scales), values)
    again = quantize(dequant_mxfp4(blocks, scales))
    assert torch.equal(again[0], blocks) and torch.equal(again[1], scales)


def test_quantizer_follows_the_spec_on_a_known_block():
    block = torch.zeros(1, 32, dtype=torch.float64)
    # amax 100 -> exp floor(log2 100) - 2 = 4; 12/16 = 0.75 ties 0.5 / 1.0 and goes to the even 1.0;
    # -1/16 rounds to 0; 100/16 = 6.25 saturates at 6
    block[0, :4] = torch.tensor([12.0, -1.0, 0.3, 100.0])
    blocks, scales = quantize(block)
    assert scales.item() == 127 + 4
    assert dequant_mxfp4(blocks, scales)[0, :4].tolist() == [16.0, -1.0 * 0, 0.0, 96.0]


def test_streaming_reference_reads_the_mxfp4_layout_exactly(tmp_path, tiny_prompts):
    """The tiny model in MXFP4 and a plain copy holding exactly the dequantized experts agree to fp64."""
    src = mxfp4()
    plain = tmp_path / "plain"
    shutil.copytree(src, plain)
    w = load_file(str(src / "model.safetensors"))
    out = {}
    for name, t in w.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            stem = name.removesuffix("_blocks")
            out[stem] = dequant_mxfp4(t, w[stem + "_scales"]).transpose(1, 2).float().contiguous()
        else:
            out[name] = t
    save_file(out, str(plain / "model.safetensors"))
    prompt = tiny_prompts[0][3]
    streaming = Reference(src, streaming=True).logprobs(prompt)
    assert (streaming - Reference(plain).logprobs(prompt)).abs().max().item() < 1e-9


@pytest.mark.parametrize("damage", ["nibbles_swapped", "scale_bias_off_by_one"])
def test_mxfp4_check_rejects_a_broken_loader(damage, tmp_path, tiny_prompts):
    src = mxfp4()
    bad = tmp_path / damage
    shutil.copytree(src, bad)
    w = load_file(str(src / "model.safetensors"))
    for name in [n for n in w if n.endswith("_blocks")]:
        if damage == "nibbles_swapped":
            w[name] = ((w[name] & 0x0F) << 4) | (w[name] >> 4)
        else:
            stem = name.removesuffix("_blocks")
            w[stem + "_scales"] = w[stem + "_scales"] + 1
    save_file(w, str(bad / "model.safetensors"))
    tol, top_k = settings.tolerance("bfloat16")
    prompts = tiny_prompts[0][:4]
    got = [Reference(bad).score(p, [], top_k) for p in prompts]
    want = [Reference(src).score(p, [], top_k + 5) for p in prompts]
    assert not compare.logprobs_close(got, want, tol).ok
