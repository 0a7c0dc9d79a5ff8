"""The fit preflight (conformance/checkpoints/fit.py) on gpt-oss-120b's real tensor table: no weights needed."""

from __future__ import annotations

import json
import math
import struct

import pytest

from conformance.checkpoints import fit
from conformance.checkpoints.models import TinySpec, hf_config
from conformance.reference import kv_model
from conformance.verdicts import profiles

MI300X = 192e9


def config_120b() -> dict:
    """gpt-oss-120b's config.json fields the preflight reads (the published config)."""
    cfg = hf_config(TinySpec(num_hidden_layers=36, hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                             num_key_value_heads=8, head_dim=64, num_local_experts=128, vocab_size=201088))
    return cfg | {"torch_dtype": "bfloat16", "dtype": "bfloat16"}


def tensors_120b(cfg: dict) -> list[fit.Tensor]:
    """The 120b checkpoint's tensor table: bf16 everywhere but the MXFP4 experts (u8 blocks [E, out, 90, 16]
    and u8 scales [E, out, 90], as the published checkpoint stores them)."""
    h, e, n_h, n_kv, d, v = 2880, 128, 64, 8, 64, 201088
    t = [fit.Tensor("model.embed_tokens.weight", "BF16", (v, h)), fit.Tensor("lm_head.weight", "BF16", (v, h)),
         fit.Tensor("model.norm.weight", "BF16", (h,))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t += [fit.Tensor(p + "input_layernorm.weight", "BF16", (h,)),
              fit.Tensor(p + "post_attention_layernorm.weight", "BF16", (h,)),
              fit.Tensor(p + "self_attn.q_proj.weight", "BF16", (n_h * d, h)),
              fit.Tensor(p + "self_attn.q_proj.bias", "BF16", (n_h * d,)),
              fit.Tensor(p + "self_attn.k_proj.weight", "BF16", (n_kv * d, h)),
              fit.Tensor(p + "self_attn.k_proj.bias", "BF16", (n_kv * d,)),
              fit.Tensor(p + "self_attn.v_proj.weight", "BF16", (n_kv * d, h)),
              fit.Tensor(p + "self_attn.v_proj.bias", "BF16", (n_kv * d,)),
              fit.Tensor(p + "self_attn.o_proj.weight", "BF16", (h, n_h * d)),
              fit.Tensor(p + "self_attn.o_proj.bias", "BF16", (h,)),
              fit.Tensor(p + "self_attn.sinks", "BF16", (n_h,)),
              fit.Tensor(p + "mlp.router.weight", "BF16", (e, h)), fit.Tensor(p + "mlp.router.bias", "BF16", (e,)),
              fit.Tensor(p + "mlp.experts.gate_up_proj_blocks", "U8", (e, 2 * h, 90, 16)),
              fit.Tensor(p + "mlp.experts.gate_up_proj_scales", "U8", (e, 2 * h, 90)),
              fit.Tensor(p + "mlp.experts.gate_up_proj_bias", "BF16", (e, 2 * h)),
              fit.Tensor(p + "mlp.experts.down_proj_blocks", "U8", (e, h, 90, 16)),
              fit.Tensor(p + "mlp.experts.down_proj_scales", "U8", (e, h, 90)),
              fit.Tensor(p + "mlp.experts.down_proj_bias", "BF16", (e, h))]
    return t


def write_headers_only(path, tensors: list[fit.Tensor]) -> None:
    """A .safetensors file with the real header (dtype, shape, data_offsets) and no data after it."""
    table, offset = {}, 0
    for t in tensors:
        table[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(table).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


@pytest.fixture(scope="module")
def model_120b(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt-oss-120b-headers")
    cfg = config_120b()
    (d / "config.json").write_text(json.dumps(cfg))
    tensors = tensors_120b(cfg)
    half = len(tensors) // 2
    write_headers_only(d / "model-00001-of-00002.safetensors", tensors[:half])
    write_headers_only(d / "model-00002-of-00002.safetensors", tensors[half:])
    return d, cfg


def _verdict(model, utilization, tp=1):
    d, cfg = model
    prof = profiles.profile("mi300x-gpt-oss-120b")
    options = prof.engine_options() | {"dtype": "bfloat16", "gpu_memory_utilization": utilization,
                                       "tensor_parallel_size": tp}
    return fit.for_profile(prof, cfg, fit.checkpoint_tensors(d), options, MI300X, "AMD Instinct MI300X",
                           "gpt-oss-120b")


def test_the_120b_tensor_table_is_the_published_size(model_120b):
    d, _ = model_120b
    tensors = fit.checkpoint_tensors(d)
    # parameters: bf16 tensors one each, MXFP4 blocks two per byte (scales are not parameters)
    params = sum(math.prod(t.shape) * (2 if t.name.endswith("_blocks") else 1) for t in tensors
                 if not t.name.endswith("_scales"))
    assert params == pytest.approx(116.8e9, rel=1e-3)  # the published count
    assert 65.0e9 < fit.weight_bytes(tensors) < 65.5e9  # the ~65 GB checkpoint (vLLM's blog: 63 GiB)


def test_preflight_rejects_120b_at_0_3_on_one_mi300x(model_120b):
    verdict = _verdict(model_120b, 0.3)
    assert not verdict.ok
    s = verdict.sentence
    assert s.count(". ") == 0 and s.endswith(".")  # one sentence
    assert s.startswith("gpt-oss-120b does not fit: 65.2 GB of weights per GPU (TP 1)"), s
    assert "> 57.6 GB (gpu_memory_utilization 0.3 of 192 GB on one AMD Instinct MI300X)" in s, s
    assert "22.2 GB of KV cache for 64 request(s) of 9216 tokens" in s  # the P2 sweep's 8k/1k at c64


def test_preflight_accepts_120b_at_0_9_and_at_tp2_at_0_3(model_120b):
    ok = _verdict(model_120b, 0.9)
    assert ok.ok, ok.sentence
    assert ok.measured["budget_gb_per_gpu"] == pytest.approx(172.8)
    # KV: 64 requests x (18 full layers x 9216 tokens + 18 sliding layers x 3 blocks of 64) x 2 x 8 heads x 64 x 2 B
    assert ok.measured["kv_gb_per_gpu"] == pytest.approx(64 * (18 * 9216 + 18 * 3 * 64) * 2048 / 1e9, rel=1e-9)
    tp2 = _verdict(model_120b, 0.3, tp=2)
    assert tp2.ok, tp2.sentence
    assert tp2.measured["weights_gb_per_gpu"] == pytest.approx(ok.measured["weights_gb_per_gpu"] / 2)
    assert "on each of 2 AMD Instinct MI300X" in tp2.sentence


def test_fp8_kv_halves_the_kv_estimate(model_120b):
    _, cfg = model_120b
    bf16 = fit.kv_bytes_per_gpu(cfg, 131072, 1, kv_model.kv_dtype_bytes("bfloat16", "auto"), 64, 1)
    fp8 = fit.kv_bytes_per_gpu(cfg, 131072, 1, kv_model.kv_dtype_bytes("bfloat16", "fp8"), 64, 1)
    assert fp8 * 2 == bf16


def test_kv_too_large_for_the_budget_fails_with_the_numbers(model_120b):
    d, cfg = model_120b
    prof = profiles.profile("mi300x-gpt-oss-120b")
    verdict = fit.preflight(cfg, fit.checkpoint_tensors(d), device_bytes=MI300X, utilization=0.9, tp=1,
                            requests=[(131072, 64)], kv_dtype_bytes=2, block_size=64,
                            overhead_bytes=prof.fit["overhead_gb"] * 1e9, what="gpt-oss-120b", device="MI300X")
    assert not verdict.ok and "309.7 GB of KV cache for 64 request(s) of 131072 tokens" in verdict.sentence


@pytest.mark.parametrize("blob,words", [(b"\x01\x00", "shorter than a safetensors header"),
                                        (struct.pack("<Q", 5) + b"{oops", "malformed safetensors header"),
                                        (struct.pack("<Q", 10**12), "not a safetensors file")])
def test_bad_headers_fail_in_one_sentence(tmp_path, blob, words):
    (tmp_path / "model.safetensors").write_bytes(blob)
    with pytest.raises(fit.FitError, match=words):
        fit.checkpoint_tensors(tmp_path)


def test_no_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(fit.FitError, match="no .safetensors files"):
        fit.checkpoint_tensors(tmp_path)


def test_cpu_default_kv_fits_and_a_too_small_budget_fails(tiny):
    cfg = hf_config(tiny.spec)
    options = {"dtype": "float32", "kv_cache_memory_bytes": 67108864, "max_model_len": 1024}
    assert fit.cpu_kv_fits(cfg, options, [(1024, 1)]).ok
    bad = fit.cpu_kv_fits(cfg, options | {"kv_cache_memory_bytes": 65536}, [(1024, 1)])
    assert not bad.ok and "need 2.3 MiB > kv_cache_memory_bytes 0.1 MiB" in bad.sentence, bad.sentence
