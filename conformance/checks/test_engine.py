"""The engine starts, loads the model and greedy-decodes the prompt set."""

import math

import pytest

from conformance.verdicts.verdict import fail

AREA = "engine"


@pytest.mark.p0
def test_engine_starts_and_generates(engine, engine_greedy, prompts, model_under_test, record_figure):
    """The engine under test loads the model and returns max_tokens greedy tokens with logprobs.

    Catches: an engine that cannot load gpt-oss on this stack (missing kernels, unsupported head
    size or sinks, wrong ISA), returns short or empty outputs, out-of-vocab ids or non-finite logprobs.
    Reference: https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html (logprobs, prompt_logprobs)
    Controls: tests/controls/test_engine_controls.py::test_engine_check_rejects_malformed_outputs
    """
    outputs, seconds = engine_greedy
    vocab = int(model_under_test.config["vocab_size"])
    generated = sum(len(c.token_ids) for c in outputs)
    record_figure("generate_s", seconds)
    record_figure("output_tokens_per_s", generated / seconds if seconds else float("nan"))
    if len(outputs) != len(prompts.prompts):
        fail(f"{len(outputs)} completions for {len(prompts.prompts)} prompts")
    for n, c in enumerate(outputs):
        if len(c.token_ids) != prompts.max_tokens:
            fail(f"prompt {n}: {len(c.token_ids)} of {prompts.max_tokens} tokens")
        if not all(0 <= t < vocab for t in c.token_ids):
            fail(f"prompt {n}: token id outside the vocab of {vocab}")
        if len(c.steps) != len(c.token_ids):
            fail(f"prompt {n}: logprobs missing for some steps")
        bad = [v for s in c.steps for v in s.top.values() if not (math.isfinite(v) and v <= 1e-6)]
        if bad:
            fail(f"prompt {n}: logprobs not finite or above 0: {bad[:5]}")
