"""The randomized-mix check holds each request to the model length of the engine under test, not to the
CPU target's table (it once read `targets()["cpu"]` on every target, so a GPU engine with another
`max_model_len` was judged by the CPU's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_reliability as reliability
from conformance.engines.base import KVState
from conformance.run import run_target
from tests.check_fakes import FAILED, Figures, ScriptedEngine


def _engine(max_model_len: int) -> ScriptedEngine:
    """Generates max_tokens tokens whatever the prompt: past the model length when the prompt is long."""

    def generate(prompts: list[list[int]], params: dict) -> list[dict]:
        token = next(t for t in range(200) if t not in (params.get("stop_token_ids") or []))
        return [{"token_ids": [token] * params["max_tokens"], "finish_reason": "length"}]

    return ScriptedEngine({"components:generate": generate, "kv_state": KVState(100, 99, 16),
                           "scheduler_limits": {"max_model_len": max_model_len}})


def test_random_mix_check_judges_by_the_engines_model_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(run_target.data(), "random_mix", {"max_examples": 30})
    engine = _engine(max_model_len=2)  # the CPU table says 1024: every output here would pass by it
    with pytest.raises(FAILED, match="tokens generated, more than max_tokens"):
        reliability.test_randomized_request_mixes_keep_invariants(engine, SimpleNamespace(config={"vocab_size": 200}),
                                                                  1.0, Figures())
    assert ("scheduler_limits", ()) in engine.calls


def test_random_mix_check_passes_an_engine_within_its_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(run_target.data(), "random_mix", {"max_examples": 5})
    figures = Figures()
    reliability.test_randomized_request_mixes_keep_invariants(_engine(max_model_len=4096),
                                                              SimpleNamespace(config={"vocab_size": 200}), 1.0, figures)
    assert figures.values["examples"] >= 1
