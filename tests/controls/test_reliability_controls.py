"""Controls of conformance/checks/test_reliability.py: the soak, the randomized mix and the kill checks' own bodies
against scripted engines and servers that grow, sample out of the vocabulary, survive a kill or cannot start;
the mix is judged by the model length of the engine under test."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from conformance.checks import test_reliability as reliability
from conformance.checks import test_reliability as soak_check
from conformance.engines.base import KVState
from conformance.engines.worker import EngineError
from conformance.run import run_target
from tests.check_fakes import FAILED, PROMPTS, Figures, ScriptedEngine, ScriptedEngines, fails, target_of
from tests.test_server_probes import MODEL


def test_soak_check_fails_on_growing_memory(monkeypatch):
    monkeypatch.setitem(run_target.data(), "soak", {"rounds": 5, "prompts_per_round": 2, "warmup_rounds": 1,
                                                     "max_rss_growth_mib": 10, "max_fd_growth": 2})
    rss = iter(range(0, 10_000, 500))
    engine = ScriptedEngine({"generate_greedy": None, "kv_state": KVState(100, 99, 16),
                             "components:process_usage": lambda: {"rss_mib": float(next(rss)), "open_fds": 10.0}})
    with pytest.raises(FAILED, match="engine RSS grew 1500 MiB"):
        reliability.test_soak_no_growth(engine, SimpleNamespace(config={"vocab_size": 200}), 1.0, Figures(),
                                        target_of())


@pytest.fixture
def no_shrinking():
    """Hypothesis without its shrink phase: the control needs the failure, not the smallest example of it."""
    from hypothesis import Phase
    from hypothesis import settings as hsettings

    hsettings.register_profile("control-no-shrink", phases=[Phase.explicit, Phase.generate])
    previous = hsettings._current_profile
    hsettings.load_profile("control-no-shrink")
    yield
    hsettings.load_profile(previous or "default")


def test_random_mix_check_fails_on_out_of_vocab_samples(monkeypatch, no_shrinking):
    monkeypatch.setitem(run_target.data(), "random_mix", {"max_examples": 3})
    out = {"token_ids": [10_000], "finish_reason": "length"}
    engine = ScriptedEngine({"components:generate": lambda ps, params: [out], "kv_state": KVState(100, 99, 16),
                             "scheduler_limits": {"max_model_len": 1024}})
    with pytest.raises(FAILED, match="a token id outside the vocabulary"):
        reliability.test_randomized_request_mixes_keep_invariants(engine, SimpleNamespace(config={"vocab_size": 200}),
                                                                  1.0, Figures())


class _Immortal:
    """An engine that 'succeeds' although it was killed: the client is never told."""

    log_path = __file__

    def call(self, method, *args, **kwargs):
        return []

    def kill(self) -> None:
        pass


def test_engine_kill_check_fails_when_the_request_succeeds_after_the_kill():
    engines = ScriptedEngines(ScriptedEngine(), by_key=lambda o: _Immortal())
    with pytest.raises(FAILED, match="'succeeded' although its engine was killed"):
        reliability.test_engine_killed_mid_request_is_reported_promptly(engines, PROMPTS, Figures())


def test_engine_kill_check_asks_for_as_many_tokens_as_the_engine_allows():
    """A desk check of vLLM 0.26.0 on the H200: 300 requests of 200 tokens can end within the second before the
    kill (CUDA graphs, async scheduling, the tiny model). The request now runs to the engine's max_model_len, and
    keeps 200 tokens on an engine without one (transformers)."""
    asked = []

    class Recording(_Immortal):
        def call(self, method, *args, **kwargs):
            asked.append((method, args))
            return super().call(method, *args)
    for options, want in (({"max_model_len": 32768}, 32768 - max(map(len, PROMPTS.prompts))), ({}, 200)):
        asked.clear()
        with pytest.raises(FAILED):
            reliability.test_engine_killed_mid_request_is_reported_promptly(
                ScriptedEngines(ScriptedEngine(), lambda o: Recording(), options=options), PROMPTS, Figures())
        (prompts, max_tokens, _) = [a for m, a in asked if m == "generate_greedy"][0]
        assert max_tokens == want and len(prompts) == 50 * len(PROMPTS.prompts)


def test_engine_kill_check_accepts_a_prompt_death_report():
    class Dying(_Immortal):
        def call(self, method, *args, **kwargs):
            raise EngineError("engine died (signal 9)")
    figures = Figures()
    engines = ScriptedEngines(ScriptedEngine(), lambda o: Dying())
    reliability.test_engine_killed_mid_request_is_reported_promptly(engines, PROMPTS, figures)
    assert math.isfinite(figures.values["seconds_to_error"])


def test_server_kill_check_fails_when_its_server_cannot_start(monkeypatch, tmp_path):
    from conformance.checks import test_reliability as reliability
    from conformance.engines.vllm_server import ServerError
    from conformance.run import serving_fixtures
    from tests.check_fakes import run_ctx

    class NoStart:
        options = {"gpu_memory_utilization": 0.3}

        def start(self):
            raise ServerError("the vLLM server exited during start-up (code 1): see vllm-server-fault.log.")
    monkeypatch.setattr(serving_fixtures, "new_server", lambda *args, **kwargs: NoStart())
    run = run_ctx(run_dir=tmp_path)
    engines = ScriptedEngines(ScriptedEngine())
    fails(reliability.test_server_killed_mid_stream_is_reported_promptly, run.target, run.run_dir,
          serving_fixtures.ServedModel(MODEL, tmp_path), tmp_path / "o200k_base.tiktoken", engines, Figures(),
          match="exited during start-up")
    # its share was counted beside the engines while it started (the H200 holds 0.3-share engines alive), and freed
    assert engines.held == [("vllm-server-fault", 0.3), ("vllm-server-fault", None)]


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


def test_soak_check_on_a_gpu_target_fails_on_growing_vram(monkeypatch):
    monkeypatch.setitem(run_target.data(), "soak", {"rounds": 5, "prompts_per_round": 2, "warmup_rounds": 1,
                                                     "max_rss_growth_mib": 10, "max_fd_growth": 2,
                                                     "max_vram_growth_mib": 100})
    vram = iter(range(0, 10_000, 400))
    engine = ScriptedEngine({"generate_greedy": None, "kv_state": KVState(100, 99, 16),
                             "components:process_usage": lambda: {"rss_mib": 500.0, "open_fds": 10.0,
                                                                  "vram_mib": float(next(vram))}})
    with pytest.raises(FAILED, match="engine VRAM grew 1200 MiB over 4 rounds"):
        soak_check.test_soak_no_growth(engine, SimpleNamespace(config={"vocab_size": 200}), 1.0, Figures(),
                                       target_of("cuda"))
