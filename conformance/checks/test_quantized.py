"""Quantized checkpoints: gpt-oss ships its experts in MXFP4; loading paths are where stacks break
silently. The engine's outputs must match the reference computed from the dequantized weights."""

from __future__ import annotations

import pytest

from conformance import compare, settings
from conformance.crafted import mxfp4
from conformance.engines.worker import EngineError
from conformance.reference import Reference

AREA = "quantization"


@pytest.mark.p1
@pytest.mark.parametrize("engine_kind", ["under-test", "transformers"])
def test_mxfp4_checkpoint_matches_reference(engine_kind, engines, run, prompts, call_timeout_s, record_figure):
    """The tiny model saved in the real on-disk MXFP4 layout (E2M1 blocks, UE8M0 scales, low nibble
    first, [experts, out, in/32, 16]) loads and its logprobs match the fp64 reference that dequantizes
    the same file; experts run in bf16 on every backend, so the bf16 limits apply.

    Catches: nibble order or scale bias wrong in a loader, blocks read transposed, an MXFP4 MoE
    backend that corrupts outputs (GPT_OSS.md failure mode 8), a format silently not applied.
    Reference: https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf ;
      GPT_OSS.md "MXFP4"
    """
    kind = None if engine_kind == "under-test" else engine_kind
    path = mxfp4()
    tol, top_k = settings.tolerance("bfloat16")
    try:
        engine = engines.get(model=path, kind=kind, dtype="bfloat16")
        got = engine.call("generate_greedy", prompts.prompts[:4], 4, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    record_figure("engine_is_" + (kind or run.engine), 1.0)
    ref = Reference(path)
    report = compare.logprobs_close(got, [ref.score(c.prompt_ids, c.token_ids, top_k + 5) for c in got], tol)
    for name, value in report.figures().items():
        record_figure(name, value)
    report.raise_if_failed()
