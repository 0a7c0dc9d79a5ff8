"""The fp64 reference: closed-form constants, agreement with a second implementation, and proof
that every mutant is farther from the reference than the parity tolerance (so the P0 prompt set
and tolerance can see each failure mode)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conformance.reference import MUTATIONS, Reference
from conformance.reference.gpt_oss import dequant_mxfp4, yarn_inv_freq
from conformance.verdicts import compare
from conformance.verdicts.limits import limits_for

REAL_ROPE = {"rope_theta": 150000, "rope_scaling": {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                     "original_max_position_embeddings": 4096}}


def test_yarn_constants_match_gpt_oss_md():
    inv_freq, concentration = yarn_inv_freq(REAL_ROPE, 64)
    assert concentration == pytest.approx(0.1 * math.log(32) + 1, abs=1e-12)
    assert concentration == pytest.approx(1.3466, abs=1e-4)
    low = 32 * math.log(4096 / (32 * 2 * math.pi)) / math.log(150000)
    high = 32 * math.log(4096 / (2 * math.pi)) / math.log(150000)
    assert (low, high) == (pytest.approx(8.0928, abs=1e-4), pytest.approx(17.3980, abs=1e-4))
    base = 150000 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.allclose(inv_freq[:8], base[:8])  # below `low`: extrapolation, plain RoPE
    assert torch.allclose(inv_freq[18:], base[18:] / 32)  # above `high`: interpolated by the factor
    rounded, _ = yarn_inv_freq(REAL_ROPE, 64, rounded=True)
    assert (rounded - inv_freq).abs().max() > 1e-6


def test_mxfp4_dequant_nibble_order_and_scale():
    # one block: byte 0x21 -> even element = low nibble (1 -> 0.5), odd = high nibble (2 -> 1.0)
    blocks = torch.zeros(1, 16, dtype=torch.uint8)
    blocks[0, 0] = 0x21
    blocks[0, 1] = 0xF7  # low 7 -> 6.0, high 15 -> -6.0
    out = dequant_mxfp4(blocks, torch.tensor([128], dtype=torch.uint8))  # scale 2^(128-127) = 2
    assert out.shape == (32,)
    assert out[:4].tolist() == [1.0, 2.0, 12.0, -12.0]


def test_dequant_mxfp4_is_every_nibble_times_its_block_s_power_of_two():
    """Every byte value, low nibble first, at the extreme scales: the same bits as the OCP MX formula element by
    element (the one-lookup-per-byte dequantization the CPU's spot checks spend their time in)."""
    from conformance.reference.gpt_oss import FP4_VALUES

    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16).repeat(3, 1, 1)  # [rows, nblocks, 16]
    scales = torch.tensor([[0] * 16, [127] * 16, [255] * 16], dtype=torch.uint8)
    want = torch.tensor([[FP4_VALUES[(int(b) >> (4 * half)) & 0x0F] * 2.0 ** (int(scales[r, k]) - 127)
                          for k in range(16) for b in blocks[r, k] for half in (0, 1)] for r in range(3)],
                        dtype=torch.float64)
    assert torch.equal(dequant_mxfp4(blocks, scales), want)
    # the GPU's lookup (torch.take; the CPU's is index_select) gives the same bits, here on the CPU
    from conformance.reference import gpt_oss

    assert torch.equal(gpt_oss._pairs_by_take(blocks), gpt_oss._pairs_by_index_select(blocks))
    assert gpt_oss.FP4_LOOKUP["cpu"] is gpt_oss._pairs_by_index_select


def test_reference_agrees_with_transformers_fp32(tiny, reference, tiny_prompts):
    """transformers is a second implementation (not the reference): it must agree to fp32 noise."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny.path, dtype=torch.float32, attn_implementation="eager",
                                              experts_implementation="eager")
    prompt = max(tiny_prompts[0], key=len)
    with torch.no_grad():
        got = hf(torch.tensor([prompt])).logits[0].double().log_softmax(-1)
    want = reference.logprobs(prompt)
    delta = (got - want).abs().max().item()
    if not delta < 5e-4:  # a rare one-off (0.032 twice in ~40 local runs): say which side moved, run again
        with torch.no_grad():
            again = hf(torch.tensor([prompt])).logits[0].double().log_softmax(-1)
        fresh = Reference(tiny.path).logprobs(prompt)
        pytest.fail(f"transformers fp32 vs fp64 reference: max |Δlogprob| {delta:.3g}; transformers again moved "
                    f"{(again - got).abs().max().item():.3g}, a fresh reference {(fresh - want).abs().max().item():.3g}"
                    f", transformers again vs the fresh reference {(again - fresh).abs().max().item():.3g}")


def test_tiny_model_exercises_the_swiglu_clamp(reference, tiny_prompts):
    """The tiny weights must reach the clamp (|gate| > 7), or the clamp mutant could hide."""
    x = reference.w["model.embed_tokens.weight"][torch.tensor(tiny_prompts[0][3])]
    w1, b1, _, _ = reference.w.expert("model.layers.0.mlp.", 0)
    h = x @ w1.T + b1
    assert (h.abs() > 7).float().mean() > 0.01


def test_tiny_checkpoint_is_deterministic(tmp_path, tiny):
    from conformance.checkpoints.models import tiny_gpt_oss
    from conformance.datafiles import content_hash

    again = tiny_gpt_oss(root=tmp_path)
    assert again.content_hash == tiny.content_hash == content_hash(again.path)
    cfg = json.loads((again.path / "config.json").read_text())
    assert cfg["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert cfg["sliding_window"] == 128 and cfg["rope_scaling"]["truncate"] is False
    assert all(cfg[k] % 32 == 0 for k in ("hidden_size", "intermediate_size", "head_dim"))


def test_damaged_cache_is_regenerated(tmp_path):
    from conformance.checkpoints.models import tiny_gpt_oss

    first = tiny_gpt_oss(root=tmp_path)
    with (first.path / "model.safetensors").open("r+b") as fh:
        fh.seek(-4, 2)
        fh.write(b"\0\0\0\1")
    assert tiny_gpt_oss(root=tmp_path).content_hash == first.content_hash


@pytest.fixture(scope="module")
def reference_prefill(reference, tiny_prompts):
    """The true model's prefill of every P0 prompt, computed once for all the mutants below."""
    return [reference.score(p, [], limits_for("float32").logprobs[1] + 5) for p in tiny_prompts[0]]


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_parity_check_rejects_every_mutant(tiny, reference_prefill, tiny_prompts, mutation):
    """Negative control of test_greedy_logprobs_match_reference: a stack that computes like the mutant
    is rejected on the P0 prompt set with the fp32 tolerance, by a wide margin."""
    prompts, _ = tiny_prompts
    tol, top_k = limits_for("float32").logprobs
    bad = Reference(tiny.path, mutation)
    got = [bad.score(p, [], top_k) for p in prompts]  # prefill path, every prompt position
    want = reference_prefill
    report = compare.logprobs_close(got, want, tol, names=(mutation, "reference"))
    assert not report.ok
    assert report.max_abs_dlogprob > 10 * tol.max_abs, report.summary()


def test_parity_check_rejects_mutant_in_decode(tiny, reference, tiny_prompts):
    """Decode path: the window mutant generates past position 128 and is caught there too."""
    prompts, _ = tiny_prompts
    tol, top_k = limits_for("float32").logprobs
    prompt = [p for p in prompts if len(p) == 129][0]
    got = Reference(tiny.path, "window_127").generate_greedy([prompt], 4, top_k)
    want = [reference.score(c.prompt_ids, c.token_ids, top_k + 5) for c in got]
    assert not compare.logprobs_close(got, want, tol).ok


def test_a_store_short_of_memory_keeps_what_fits_and_computes_the_same(tiny_prompts):
    """Where the host cannot hold a layer's experts in fp64 (gpt-oss-120b: about 25 GB a layer), the CPU store keeps
    the tensors it must, keeps experts only while they fit its budget, dequantizes the others where they are used,
    and the reference's logprobs are the very same bits as with every expert kept."""
    from conformance.checkpoints.crafted import mxfp4
    from conformance.reference import gpt_oss

    path = mxfp4()
    ids = tiny_prompts[0][0][:24]
    roomy = Reference(path, streaming=True)
    assert roomy.w.budget is not None and 0 < roomy.w.budget < gpt_oss.host_memory_available()
    roomy.w.budget = None
    before_experts = []  # what the store held when layer 0 asked for its first expert
    expert = roomy.w.expert
    roomy.w.expert = lambda prefix, e: (before_experts.append(roomy.w.held), expert(prefix, e))[1]
    want = roomy.logprobs(ids)
    one = gpt_oss._nbytes(*expert("model.layers.0.mlp.", 0))
    assert roomy.w.experts_not_kept == 0 and len(before_experts) > 3
    short = Reference(path, streaming=True)
    short.w.budget = before_experts[0] + 3 * one
    kept = []  # experts in the store as each layer ends
    done_with = short.w.done_with
    short.w.done_with = lambda prefix: (kept.append(sum("#" in k for k in short.w.cache)), done_with(prefix))
    assert torch.equal(short.logprobs(ids), want)
    layers = int(short.cfg["num_hidden_layers"])
    assert kept == [3] * layers and short.w.experts_not_kept == len(before_experts) - 3 * layers
