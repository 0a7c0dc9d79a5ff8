"""Greedy logit parity of the engine against the suite's independent fp64 reference."""

import pytest

from conformance import compare

AREA = "model-math"


@pytest.mark.p0
def test_greedy_logprobs_match_reference(engine_greedy, reference, tolerance, record_figure):
    """Prefill and greedy decode on the engine agree with the fp64 reference, position by position.

    Catches: anything that moves logits — rounded YaRN range, wrong rotation, sliding window off by
    one, sinks dropped or doubled, gate/up de-interleaving, SwiGLU clamp or +1 missing, routing not
    renormalised, dropped biases — on prompts longer than the 128-token window.
    Reference: docs/model.md "The math a reference must reproduce"; vLLM tests/models/utils.py
      check_logprobs_close (https://github.com/vllm-project/vllm/blob/main/tests/models/utils.py)
    Controls: tests/test_check_bodies_math.py::test_parity_check_fails_on_an_engine_without_sinks,
      tests/test_check_bodies_math.py::test_parity_check_fails_on_a_positive_logprob
    """
    outputs, _ = engine_greedy
    tol, top_k = tolerance
    want = [reference.score(c.prompt_ids, c.token_ids, top_k + 5) for c in outputs]
    report = compare.logprobs_close(outputs, want, tol)
    for name, value in report.figures().items():
        record_figure(name, value)
    report.raise_if_failed()
