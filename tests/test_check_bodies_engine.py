"""Negative controls that run the engine checks' own bodies (KV cache, KV accounting, scheduling, prefix
cache, bad requests, tensor parallelism, the reliability probes) against a scripted engine that shows
a known-bad behaviour, and see each check fail with a message naming the fault. The verdict helpers
they call are the real ones; tests/check_mutation.py reruns these with each check's body removed."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from conformance.checks import test_bad_requests as bad_requests
from conformance.checks import test_kv_accounting as kv_accounting
from conformance.checks import test_kv_cache as kv_cache
from conformance.checks import test_prefix_cache as prefix_cache
from conformance.checks import test_reliability as reliability
from conformance.checks import test_scheduling as scheduling
from conformance.checks import test_tp_sharding as tp_sharding
from conformance.engines.base import Completion, KVState, StepLogprobs
from conformance.engines.engine_configs import LIMITED_SCHEDULER, SMALL_KV_CACHE
from conformance.engines.observations import (
    KVGroupLayout,
    KVLayout,
    RequestBlocks,
    StepCounts,
    StepwiseRun,
    SubmitOutcome,
)
from conformance.engines.worker import EngineError
from conformance.run import run_target
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines, scoring, target_of

TOL = limits_for("float32").logprobs
PROMPTS = SimpleNamespace(prompts=[list(range(1, 40)), list(range(50, 60)), list(range(70, 90))], max_tokens=4)


def completion(prompt: list[int], tokens: list[int], lp: float = -0.5) -> Completion:
    return Completion(list(prompt), list(tokens), [StepLogprobs(t, {t: lp, t + 1: lp - 3}) for t in tokens])


def greedy(reqs, tokens_of=lambda p: [p[-1] % 90 + 1, 2, 3, 4]):
    return [completion(p, tokens_of(p)) for p in reqs]


def sequence(*answers):
    """An answer that gives `answers` one after the other (the last one repeats)."""
    it = iter(answers)
    last = {}

    def next_answer(*args, **kwargs):
        last["v"] = next(it, last.get("v"))
        return last["v"]
    return next_answer


# ------------------------------------------------------------------ KV cache / KV accounting


def test_kv_released_check_fails_on_a_leaking_pool():
    during = KVState(num_blocks=100, free_blocks=90, block_size=16)
    leaked = KVState(num_blocks=100, free_blocks=95, block_size=16)
    engine = ScriptedEngine({"add_request": "r1", "step": None, "kv_state": sequence(during, leaked)})
    with pytest.raises(FAILED, match="4 of 100 blocks still in use"):
        kv_cache.test_kv_blocks_released_after_requests(engine, None, PROMPTS, MODEL, 1.0, Figures())


def test_kv_released_check_holds_a_sliding_only_model_to_its_window():
    """vLLM-CPU on a 1-layer slice of gpt-oss-120b (sliding attention alone, window 128, blocks of 128) held 2 blocks
    for a 290-token prompt: the window's, not the 3 a full-attention layer needs. A model with a full-attention layer
    holding as few still fails."""
    prompts = SimpleNamespace(prompts=[list(range(290))], max_tokens=4)
    window = {"sliding_window": 128}

    def run(layer_types):
        during, after = (KVState(num_blocks=256, free_blocks=free, block_size=128) for free in (253, 255))
        engine = ScriptedEngine({"add_request": "r1", "step": None, "kv_state": sequence(during, after)})
        kv_cache.test_kv_blocks_released_after_requests(
            engine, None, prompts, SimpleNamespace(config=window | {"layer_types": layer_types}), 1.0, Figures())
    run(["sliding_attention"])
    with pytest.raises(FAILED, match="a running request held 2 blocks, fewer than the 3 its length needs"):
        run(["sliding_attention", "full_attention"])


@pytest.fixture(scope="module")
def tiny_config(tiny) -> dict:
    return json.loads((tiny.path / "config.json").read_text())


def layout_of(config: dict, num_blocks: int, block_size: int = 16, budget: int | None = 64 << 20) -> KVLayout:
    page = 2 * block_size * int(config["num_key_value_heads"]) * int(config["head_dim"]) * 4
    kinds = ["SlidingWindowSpec" if "sliding" in t else "FullAttentionSpec" for t in config["layer_types"]]
    groups = [KVGroupLayout(kind, [f"model.layers.{i}.self_attn.attn" for i, k in enumerate(kinds) if k == kind],
                            int(config["sliding_window"]) if "Sliding" in kind else None, block_size,
                            int(config["num_key_value_heads"]), int(config["head_dim"]), 4, page)
              for kind in dict.fromkeys(kinds)]
    return KVLayout(num_blocks, block_size, block_size, budget, "kv_cache_memory_bytes", budget, None, groups)


MODEL = SimpleNamespace(config={})


def test_kv_block_count_check_fails_on_a_pool_of_the_wrong_size(tiny_config):
    engine = ScriptedEngine({"kv_layout": layout_of(tiny_config, num_blocks=7)})
    model = SimpleNamespace(config=tiny_config)
    with pytest.raises(FAILED, match="7 blocks allocated, the configuration implies"):
        kv_accounting.test_kv_block_count_matches_config(engine, ScriptedEngines(engine), target_of(), model, 1.0,
                                                         Figures())


def blocks_engine(config: dict, layout: KVLayout, held: list[int]) -> ScriptedEngine:
    computed = {"n": 0}

    def request_blocks(rid):
        computed["n"] += 1
        length = int(config["sliding_window"]) + 2 * layout.block_size + layout.block_size // 2
        return RequestBlocks(rid, length + computed["n"] - 1, length + computed["n"], held,
                             layout.num_blocks - 1 - sum(held))
    during = KVState(layout.num_blocks, layout.num_blocks - 1 - sum(held), layout.block_size)
    after = KVState(layout.num_blocks, layout.num_blocks - 1, layout.block_size)
    return ScriptedEngine({"kv_layout": layout, "scheduler_limits": {"max_model_len": 4096}, "add_request": "r1",
                           "step": None, "request_blocks": request_blocks, "kv_state": sequence(during, after)},
                          block_size=layout.block_size)


def test_request_blocks_check_fails_when_the_sliding_group_never_frees(tiny_config):
    engine = blocks_engine(tiny_config, layout_of(tiny_config, 256), held=[99, 99])
    with pytest.raises(FAILED, match="group holds 99 blocks"):
        kv_accounting.test_request_holds_blocks_per_group(engine, SimpleNamespace(config=tiny_config), 1.0, Figures())


def test_kv_abort_check_fails_when_aborted_requests_keep_blocks():
    during = KVState(num_blocks=100, free_blocks=80, block_size=16)
    kept = KVState(num_blocks=100, free_blocks=80, block_size=16, running_requests=3)
    engine = ScriptedEngine({"add_request": "r", "step": None, "abort": None, "kv_state": sequence(during, kept)})
    with pytest.raises(FAILED, match="19 of 100 blocks still in use"):
        kv_accounting.test_kv_blocks_free_after_abort(engine, PROMPTS, 1.0, Figures())


def test_kv_block_size_check_fails_on_wrong_counts(tiny_config):
    default = blocks_engine(tiny_config, layout_of(tiny_config, 256, block_size=16), held=[2, 4])
    other = blocks_engine(tiny_config, layout_of(tiny_config, 5, block_size=32), held=[2, 4])
    engines = ScriptedEngines(default, by_key=lambda o: other)
    with pytest.raises(FAILED, match="5 blocks allocated, the configuration implies"):
        kv_accounting.test_kv_accounting_at_block_size(32, engines, target_of(), SimpleNamespace(config=tiny_config),
                                                       1.0, Figures())
    assert engines.asked == [{}, {"block_size": 32}]


def test_kv_rounds_check_fails_on_a_slow_leak():
    states = [KVState(100, 99, 16)] + [KVState(100, 99 - n, 16) for n in range(1, 7)]
    engine = ScriptedEngine({"kv_state": sequence(*states), "run_stepwise": None, "add_request": "r", "step": None,
                             "abort": None})
    with pytest.raises(FAILED, match="after round 1: 1 blocks still used"):
        kv_accounting.test_kv_blocks_do_not_leak_over_rounds(engine, PROMPTS, 1.0, Figures())


# ------------------------------------------------------------------ scheduling


def stepwise(completions, trace=(), first=None, arrivals=None, unfinished=0) -> StepwiseRun:
    n = len(completions)
    return StepwiseRun(completions, list(trace), first or [0] * n, [5] * n, arrivals or [0] * n, [], 8, unfinished)


def test_concurrent_check_fails_when_batching_changes_tokens():
    reqs, _, _ = scheduling._mixed_requests(PROMPTS)
    batched = stepwise(greedy(reqs, lambda p: [7, 7, 7, 7]))
    engine = ScriptedEngine({"run_stepwise": batched,
                             "generate_greedy": lambda ps, *a, **k: greedy(ps, lambda p: [20, 20, 20, 20])})
    with pytest.raises(FAILED, match="batched chose 7"):
        scheduling.test_concurrent_requests_match_each_alone(engine, PROMPTS, TOL, 1.0, Figures())


def test_max_num_seqs_check_fails_when_the_limit_is_exceeded():
    limit = LIMITED_SCHEDULER["max_num_seqs"]
    run = stepwise(greedy(PROMPTS.prompts), trace=[StepCounts(0, limit + 3, 0)])
    engine = ScriptedEngine({"run_stepwise": run})
    with pytest.raises(FAILED, match=f"{limit + 3} requests ran at once, above max_num_seqs={limit}"):
        scheduling.test_max_num_seqs_is_respected(ScriptedEngines(engine), PROMPTS, 1.0, Figures())


def test_chunked_prefill_check_fails_when_chunking_changes_tokens():
    lens = [len(p) for p in PROMPTS.prompts]
    whole = stepwise(greedy(PROMPTS.prompts), first=[0, 0, 0])
    chunked = stepwise(greedy(PROMPTS.prompts, lambda p: [9, 9, 9, 9]),
                       first=[-(-n // LIMITED_SCHEDULER["max_num_batched_tokens"]) for n in lens])
    default = ScriptedEngine({"scheduler_limits": {"max_num_batched_tokens": 8192}, "run_stepwise": whole})
    small = ScriptedEngine({"run_stepwise": chunked})
    with pytest.raises(FAILED, match="chunked chose 9"):
        scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL,
                                                          1.0, Figures())


def _async_prefill(first_chunked: list[int]) -> tuple[ScriptedEngine, ScriptedEngine]:
    """Engines under async scheduling (vLLM on GPUs): a step returns the outputs of the step before it, so an
    unchunked first token is seen one step after the request's arrival step."""
    whole = stepwise(greedy(PROMPTS.prompts), first=[1] * len(PROMPTS.prompts))
    default = ScriptedEngine({"scheduler_limits": {"max_num_batched_tokens": 8192}, "run_stepwise": whole},
                             async_scheduling=True)
    small = ScriptedEngine({"run_stepwise": stepwise(greedy(PROMPTS.prompts), first=first_chunked)},
                           async_scheduling=True)
    return default, small


def test_chunked_prefill_check_counts_steps_as_an_async_engine_schedules_them():
    """First contact on the H200 (fixtures/device_runs/20261203T215707-cuda-f40b72): every unchunked first token
    was seen after 2 steps, the async scheduler's lag; taken off, the same engines pass."""
    lens = [len(p) for p in PROMPTS.prompts]
    default, small = _async_prefill([-(-n // LIMITED_SCHEDULER["max_num_batched_tokens"]) for n in lens])
    figures = Figures()
    scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL, 1.0,
                                                      figures)
    assert figures.values["max_prefill_steps_chunked"] == max(-(-n // LIMITED_SCHEDULER["max_num_batched_tokens"])
                                                              for n in lens)
    with pytest.raises(FAILED, match=r"after 2 step\(s\); exactly 1 expected"):  # the lag not taken off
        default.info["async_scheduling"] = False
        scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL,
                                                          1.0, Figures())


def test_chunked_prefill_check_fails_when_an_async_engine_does_not_chunk():
    """The lag taken off does not blind the check: an async engine that prefills a long prompt in one step (its
    first token seen one step late, as an unchunked one's) fails the chunked count."""
    default, small = _async_prefill([1] * len(PROMPTS.prompts))
    with pytest.raises(FAILED, match=r"chunked prefill: a \d+-token prompt gave its first token after 1 step\(s\); "
                                     r"at least \d+ expected"):
        scheduling.test_chunked_prefill_matches_unchunked(ScriptedEngines(default, lambda o: small), PROMPTS, TOL,
                                                          1.0, Figures())


def test_preemption_check_fails_when_no_preemption_happened():
    metrics = {"vllm:num_preemptions": 0.0}
    default = ScriptedEngine({"metrics": metrics, "generate_greedy": lambda ps, *a, **k: greedy(ps)})
    small = ScriptedEngine({"metrics": metrics, "generate_greedy": lambda ps, *a, **k: greedy(ps),
                            "kv_layout": SimpleNamespace(num_blocks=SMALL_KV_CACHE.get("num_gpu_blocks_override", 8))})
    with pytest.raises(FAILED, match="num_preemptions moved by 0, expected at least 1"):
        scheduling.test_preemption_keeps_outputs(ScriptedEngines(default, lambda o: small), PROMPTS, TOL, 1.0,
                                                 Figures())


# ------------------------------------------------------------------ prefix cache


def prefix_engine(hits_per_call: list[int], outputs_of, counter_moves: bool = True) -> ScriptedEngine:
    """Each call reports its hits on the request (cached_tokens) and, unless `counter_moves` is False (vLLM before
    0.32 under async scheduling, vllm#48668), on the hit counter too."""
    counter = {"hits": 0.0, "calls": 0}

    def metrics():
        return {prefix_cache.HITS: counter["hits"]}

    def generate(ps, *args, **kwargs):
        hits = hits_per_call[min(counter["calls"], len(hits_per_call) - 1)]
        counter["hits"] += hits if counter_moves else 0
        counter["calls"] += 1
        return [dataclasses.replace(c, cached_tokens=hits) for c in outputs_of(ps, counter["calls"])]
    return ScriptedEngine({"scheduler_limits": {"enable_prefix_caching": True},
                           "kv_layout": SimpleNamespace(block_size=16), "metrics": metrics,
                           "generate_greedy": generate, "reset_prefix_cache": True})


def test_prefix_hit_check_fails_when_cached_blocks_change_the_output():
    """Wrong blocks served from the cache: the counter moves as it should, but the cached run's tokens differ."""
    engine = prefix_engine([0, 48, 32, 0], lambda ps, n: greedy(ps, lambda p: [5, 6, 7, 8] if n == 2 else [1, 2, 3, 4]))
    with pytest.raises(FAILED, match="cached chose 5"):
        prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
            ScriptedEngines(engine), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())


def test_prefix_reset_check_fails_when_the_reset_keeps_old_blocks():
    engine = prefix_engine([0, 48, 48], lambda ps, n: greedy(ps))
    with pytest.raises(FAILED, match="after the reset: 48 prompt tokens served from the prefix cache, expected at"):
        prefix_cache.test_prefix_cache_reset_forgets_blocks(
            ScriptedEngines(engine), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())


def test_prefix_hit_check_fails_on_a_cache_that_never_hits_and_holds_where_only_the_counter_stands_still():
    """A cache that never hits fails on the requests' own counts; hits that vLLM's counter lost (vllm#48668) pass,
    the counter recorded as it moved; a request whose count the engine does not report fails: no blind pass."""
    never = prefix_engine([0], lambda ps, n: greedy(ps))
    with pytest.raises(FAILED, match="the same prompt again: 0 prompt tokens served from the prefix cache"):
        prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
            ScriptedEngines(never), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())
    figures = Figures()
    lost = prefix_engine([0, 48, 32, 0], lambda ps, n: greedy(ps), counter_moves=False)
    prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
        ScriptedEngines(lost), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, figures)
    assert figures.values["prefix_hit_tokens_same_prompt"] == 48 and figures.values["counter_hits_same_prompt"] == 0
    silent = ScriptedEngine({"scheduler_limits": {"enable_prefix_caching": True},
                             "kv_layout": SimpleNamespace(block_size=16), "metrics": lambda: {},
                             "generate_greedy": lambda ps, *a, **k: greedy(ps), "reset_prefix_cache": True})
    with pytest.raises(FAILED, match="reported no cached-token count for 1 of 1 requests"):
        prefix_cache.test_repeated_prefix_hits_cache_with_identical_outputs(
            ScriptedEngines(silent), SimpleNamespace(config={"vocab_size": 200}), TOL, 1.0, Figures())


# ------------------------------------------------------------------ bad requests


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


# ------------------------------------------------------------------ tensor parallelism


class _TPProc:
    """TPEngineProcess stand-in: a TP=2 engine whose greedy tokens differ from TP=1."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def call(self, method, prompts, *args, **kwargs):
        return greedy(prompts, lambda p: [11, 11, 11, 11])

    def close(self) -> None:
        pass


def test_vllm_tp_check_fails_when_tp2_generates_other_tokens():
    reference = scoring(lambda prompt, tokens, k: completion(prompt, tokens))  # agrees with TP=2
    with pytest.raises(FAILED, match="vLLM TP=2 chose 11"):
        tp_sharding.test_vllm_tp_greedy_matches_tp1((_TPProc(), 2), (greedy(PROMPTS.prompts), 1.0), PROMPTS, TOL,
                                                    reference, 1.0, Figures())


# ------------------------------------------------------------------ reliability probes


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


def _lagging_engine(config: dict, layout: KVLayout, lag: int, async_scheduling: bool) -> ScriptedEngine:
    """A request whose sliding group frees the blocks behind the window `lag` decode steps late."""
    from conformance.reference import kv_model

    length = int(config["sliding_window"]) + 2 * layout.block_size + layout.block_size // 2
    computed = {"n": 0}

    def need(kind: str, c: int) -> int:
        window = int(config["sliding_window"]) if kind == "sliding" else None
        return kv_model.blocks_needed(kind, c, layout.block_size, window, after_decode=c > length)

    def request_blocks(rid):
        c = length + computed["n"]
        computed["n"] += 1
        held = [need("sliding", max(length, c - lag)) if "Sliding" in g.kind else need("full", c)
                for g in layout.groups]
        return RequestBlocks(rid, c, c + 1, held, layout.num_blocks - 1 - sum(held))
    during = KVState(layout.num_blocks, layout.num_blocks - 20, layout.block_size)
    after = KVState(layout.num_blocks, layout.num_blocks - 1, layout.block_size)
    return ScriptedEngine({"kv_layout": layout, "scheduler_limits": {"max_model_len": 4096}, "add_request": "r1",
                           "step": None, "request_blocks": request_blocks, "kv_state": sequence(during, after)},
                          block_size=layout.block_size, async_scheduling=async_scheduling)


def test_request_blocks_check_allows_an_async_scheduler_one_step_of_lag_and_no_more(tiny_config):
    """First contact with vLLM 0.26.0 on the H200 (asynchronous scheduling): with 169 of a 168-token prompt's tokens
    computed the sliding group still held 11 blocks where its length needs 9, and 9 from the next step on."""
    layout = layout_of(tiny_config, 256)
    model = SimpleNamespace(config=tiny_config)
    kv_accounting.test_request_holds_blocks_per_group(_lagging_engine(tiny_config, layout, 1, True), model, 1.0,
                                                     Figures())
    with pytest.raises(FAILED, match="sliding group holds"):  # the same lag where the engine schedules in step
        kv_accounting.test_request_holds_blocks_per_group(_lagging_engine(tiny_config, layout, 1, False), model, 1.0,
                                                         Figures())
    with pytest.raises(FAILED, match="sliding group holds"):  # two steps late is a fault even when asynchronous
        kv_accounting.test_request_holds_blocks_per_group(_lagging_engine(tiny_config, layout, 2, True), model, 1.0,
                                                         Figures())
