"""Negative controls of the quantized loading checks. MXFP4: the writer round-trips through the reference's
independent dequantizer, the streaming reference reads the real on-disk layout exactly, and a loader with
swapped nibbles or an off-by-one scale bias is rejected. GPTQ/AWQ/FP8: a loader that misreads the bytes is
rejected by each format's limits (also against real vLLM-CPU output), bad checkpoints get one sentence from the
validator, accepted-but-not-applied quantization fails, and FP8-activation backends are labelled."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conformance.checkpoints.crafted import mxfp4
from conformance.checkpoints.quant import limits as quant_limits
from conformance.checkpoints.quant.checkpoint import dequantized_copy, quantized
from conformance.checkpoints.quant.mxfp4 import quantize
from conformance.checkpoints.quant.validate import QuantCheckpointError, validate
from conformance.reference import Reference
from conformance.reference.gpt_oss import FP4_VALUES, dequant_mxfp4
from conformance.verdicts import compare
from conformance.verdicts.limits import limits_for


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
    tol, top_k = limits_for("bfloat16").logprobs
    prompts = tiny_prompts[0][:4]
    got = [Reference(bad).score(p, [], top_k) for p in prompts]
    want = [Reference(src).score(p, [], top_k + 5) for p in prompts]
    assert not compare.logprobs_close(got, want, tol).ok


MISREAD_OF = {"gptq": "gptq_nibbles_reversed", "awq": "awq_plain_order", "fp8-channel": "fp8_scales_inverted",
              "fp8-tensor": "fp8_scales_inverted"}


@pytest.mark.parametrize("fmt", sorted(MISREAD_OF))
def test_quantized_check_rejects_a_broken_loader(fmt, tiny_prompts, tmp_path):
    """A loader that reads the same bytes wrongly (nibbles reversed, AWQ interleave ignored, scales inverted)
    stands in for the engine: the check's comparison with the format's limits must fail, and by a margin."""
    path = quantized(fmt)
    lim = quant_limits.format_limits(fmt)
    prompts = tiny_prompts[0][:4]
    good = Reference(dequantized_copy(path))
    bad = Reference(dequantized_copy(path, tmp_path / "misread", misread=MISREAD_OF[fmt]))
    want = [good.score(p, [], lim.top_k + 5) for p in prompts]
    report = compare.logprobs_close([bad.score(p, [], lim.top_k) for p in prompts], want, lim.tolerance)
    assert not report.ok
    assert report.figures()["median_abs_dlogprob"] > 3 * lim.tolerance.median


def _rewrite_header(path: Path, change) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    change(header)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])


def _damaged(tmp_path: Path, fmt: str, how: str) -> Path:
    bad = tmp_path / how
    shutil.copytree(quantized(fmt), bad)
    shard = bad / "model.safetensors"
    name = "model.layers.0.self_attn.q_proj.qweight"
    if how == "dtype_wrong_size":  # I32 declared as F16: the bytes span twice what the header says
        _rewrite_header(shard, lambda h: h[name].update(dtype="F16"))
    elif how == "dtype_same_size":  # I32 declared as F32: same span, wrong type for GPTQ
        _rewrite_header(shard, lambda h: h[name].update(dtype="F32"))
    elif how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-4096])
    elif how == "missing_scale":
        w = load_file(str(shard))
        del w["model.layers.2.self_attn.o_proj.scales"]
        save_file(w, str(shard))
    elif how == "unknown_method":
        cfg = json.loads((bad / "config.json").read_text())
        cfg["quantization_config"]["quant_method"] = "fancy4"
        (bad / "config.json").write_text(json.dumps(cfg))
    return bad


@pytest.mark.parametrize(("how", "words"), [
    ("dtype_wrong_size", "declared F16"), ("dtype_same_size", "stored as F32"), ("truncated", "truncated"),
    ("missing_scale", "o_proj.scales"), ("unknown_method", "'fancy4'")])
def test_bad_quantized_checkpoint_gets_one_sentence(how, words, tmp_path):
    bad = _damaged(tmp_path, "gptq", how)
    with pytest.raises(QuantCheckpointError) as exc:
        validate(bad)
    message = str(exc.value)
    assert words in message and "\n" not in message and message.endswith(".")


def test_missing_fp8_scale_and_mxfp4_scales_are_named(tmp_path):
    for fmt, drop in (("fp8-channel", "model.layers.1.self_attn.k_proj.weight_scale"),
                      ("mxfp4", "model.layers.0.mlp.experts.down_proj_scales")):
        bad = tmp_path / fmt
        shutil.copytree(quantized(fmt) if fmt != "mxfp4" else mxfp4(), bad)
        w = load_file(str(bad / "model.safetensors"))
        del w[drop]
        save_file(w, str(bad / "model.safetensors"))
        with pytest.raises(QuantCheckpointError, match=drop.replace(".", r"\.")):
            validate(bad)


def test_validation_passes_the_plain_and_mxfp4_checkpoints(tiny):
    assert validate(tiny.path).method is None
    assert validate(mxfp4()).method == "mxfp4"


def test_fp8_activation_backends_are_labelled_not_reference_numerics():
    mi355x = {"model.layers.0.mlp.experts.routed_experts": "GptOssMxfp4MoEMethod/AITER_MXFP4_FP8/AiterW4A8Experts"}
    label = quant_limits.numerics_label("mxfp4", mi355x)
    assert label is not None and not label.reference_numerics and "not reference numerics" in label.text
    cpu = {"model.layers.0.mlp.experts.routed_experts": "GptOssMxfp4MoEMethod/EMULATION"}
    assert quant_limits.numerics_label("mxfp4", cpu) is None
    assert quant_limits.numerics_label("gptq", mi355x) is None  # the label applies to MXFP4 only


def test_quantization_not_applied_is_a_failure():
    patterns = quant_limits.format_limits("gptq").quantized_layers["vllm"]
    silent = {"model.layers.0.attn.qkv_proj": "UnquantizedLinearMethod",
              "model.layers.0.attn.o_proj": "AutoGPTQLinearMethod/CPUWNA16LinearKernel"}
    assert not quant_limits.quantization_applied(silent, patterns, "vllm").ok
    assert not quant_limits.quantization_applied({"model.layers.0.mlp.router": "X"}, patterns, "vllm").ok
    applied = {k: "AutoGPTQLinearMethod/CPUWNA16LinearKernel" for k in silent}
    assert quant_limits.quantization_applied(applied, patterns, "vllm").ok


@pytest.mark.slow
def test_real_vllm_fp8_output_rejected_against_a_misreading_reference(tiny_prompts, tmp_path):
    """With real vLLM-CPU output (FP8 W8A8 runs on AVX2 and AVX-512 hosts), the format's limits pass the correct
    reference and reject a reference that reads the scales inverted: the limits discriminate on real numerics."""
    from tests.conftest import start_cpu_engine

    path = quantized("fp8-channel")
    lim = quant_limits.format_limits("fp8-channel")
    engine = start_cpu_engine(str(path), tmp_path / "engine.log", dtype=lim.dtype)
    try:
        got = engine.call("generate_greedy", tiny_prompts[0][:4], 2, lim.top_k, prompt_logprobs=True)
    finally:
        engine.close()
    scored = [(c.prompt_ids, c.token_ids) for c in got]
    good = Reference(dequantized_copy(path))
    bad = Reference(dequantized_copy(path, tmp_path / "misread", misread="fp8_scales_inverted"))
    assert compare.logprobs_close(got, [good.score(p, t, lim.top_k + 5) for p, t in scored], lim.tolerance).ok
    assert not compare.logprobs_close(got, [bad.score(p, t, lim.top_k + 5) for p, t in scored], lim.tolerance).ok
