"""Controls of conformance/checks/test_bad_requests.py: its own body against scripted engines that accept an
invalid prompt, disturb the good requests beside a bad one, or crash; a model without a tokenizer skips."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_bad_requests as bad_requests
from conformance.engines.observations import (
    SubmitOutcome,
)
from conformance.engines.worker import EngineError
from tests.check_fakes import (
    FAILED,
    PROMPTS,
    TOL,
    Figures,
    ScriptedEngine,
    ScriptedEngines,
    greedy,
    stepwise,
    target_of,
)


def test_bad_request_check_fails_when_an_invalid_prompt_is_accepted():
    good = sorted(PROMPTS.prompts, key=len)[:3]
    served = stepwise(greedy(good))
    served.intruders = [SubmitOutcome("empty_prompt", accepted=True, seconds=0.01, aborted=True)]
    engine = ScriptedEngine({"scheduler_limits": {"max_model_len": 512}, "run_stepwise": served,
                             "generate_greedy": lambda ps, *a, **k: greedy(ps)})
    with pytest.raises(FAILED, match="bad request 'empty_prompt': it was accepted"):
        bad_requests.test_bad_request_rejected_while_serving("empty_prompt", target_of(), ScriptedEngines(engine),
                                                             PROMPTS, SimpleNamespace(config={"vocab_size": 200}),
                                                             TOL, 1.0, Figures())


def _token_id_engines(tmp_path, run_stepwise, alone=lambda ps, *a, **k: greedy(ps)):
    """A --model dir with a tokenizer and an engine that refuses the id cleanly, as vLLM with its tokenizer does."""
    (tmp_path / "tokenizer.json").write_text("{}")
    engine = ScriptedEngine({"scheduler_limits": {"max_model_len": 512}, "run_stepwise": run_stepwise,
                             "generate_greedy": alone})
    return ScriptedEngines(engine, by_key=lambda overrides: engine), engine


def _refused(label: str) -> SubmitOutcome:
    return SubmitOutcome(label, accepted=False, seconds=0.01, error_type="VLLMValidationError",
                         message="Token id 200 is out of vocabulary")


def test_token_id_check_fails_when_the_good_requests_are_disturbed(tmp_path):
    """The id refused cleanly, yet the good requests beside it changed: the check fails (no xfail covers it)."""
    good = sorted(PROMPTS.prompts, key=len)[:3]
    served = stepwise(greedy(good, lambda p: [9, 9, 9, 9]))
    served.intruders = [_refused("token_id_above_vocab")]
    engines, engine = _token_id_engines(tmp_path, served)
    with pytest.raises(FAILED, match="beside the bad request chose 9"):
        bad_requests.test_bad_request_rejected_while_serving(
            "token_id_above_vocab", target_of(model_arg=str(tmp_path)), engines, PROMPTS,
            SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())
    assert engines.asked[0] == {"model": tmp_path, "skip_tokenizer_init": False}  # the tokenizer loaded, as users run
    intruder = next(args for method, args in engine.calls if method == "run_stepwise")[4][0]
    assert intruder[2][4] == 200  # the id == vocab_size of the model served


def test_token_id_check_fails_when_the_engine_crashes(tmp_path):
    """An engine that dies on the out-of-vocabulary id fails the check with the engine's own error."""
    def crash(*args, **kwargs):
        raise EngineError("the engine process died: IndexError: index out of range in self")

    engines, _ = _token_id_engines(tmp_path, crash)
    with pytest.raises(EngineError, match="index out of range in self"):
        bad_requests.test_bad_request_rejected_while_serving(
            "token_id_negative", target_of(model_arg=str(tmp_path)), engines, PROMPTS,
            SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())


def test_token_id_check_skips_a_model_without_a_tokenizer(tmp_path):
    engines, _ = _token_id_engines(tmp_path, None)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(pytest.skip.Exception, match="has no tokenizer"):
        bad_requests.test_bad_request_rejected_while_serving(
            "token_id_negative", target_of(model_arg=str(tmp_path)), engines, PROMPTS,
            SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())
