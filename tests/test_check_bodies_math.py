"""Negative controls that run the model-math and logit-parity checks' own bodies against a known-bad stack:
an engine whose answers are the fp64 reference with one of the failure modes of docs/failure-modes.md built in (the
reference's mutants: rounded YaRN, gate/up halves, a window off by one), NaN logprobs from -inf sinks, a
LLaMA-style config. Each check must fail, and say what is wrong."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conformance.checkpoints.crafted import crafted
from conformance.checks import test_logit_parity as parity
from conformance.checks import test_model_math as math_checks
from conformance.engines.base import StepLogprobs
from conformance.reference import Reference
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines

TOL = limits_for("float32").logprobs


@pytest.fixture(scope="module")
def short_prompts(tiny_prompts) -> SimpleNamespace:
    return SimpleNamespace(prompts=[p[:40] for p in tiny_prompts[0][:3]], max_tokens=2)


def test_config_check_fails_on_a_llama_style_rope_theta(tiny):
    config = json.loads((tiny.path / "config.json").read_text()) | {"rope_theta": 1e6}
    model = SimpleNamespace(path=tiny.path, config=config, name="converted")
    with pytest.raises(FAILED, match="config of converted .*rope_theta"):
        math_checks.test_model_config_is_gpt_oss(model, Figures())


def test_rope_check_fails_on_an_engine_with_rounded_yarn(tiny, reference):
    rounded = Reference(tiny.path, "yarn_rounded")
    engine = ScriptedEngine({"components:rope_tables": rounded.rope_tables})
    with pytest.raises(FAILED, match="inv_freq"):
        math_checks.test_rope_tables_match_reference(engine, reference, limits_for("float32"), 1.0, Figures())


def test_moe_check_fails_on_an_engine_with_gate_up_halves(tiny, reference):
    halves = Reference(tiny.path, "gate_up_halves")
    engine = ScriptedEngine({"components:moe_block": lambda layer, x: halves.moe(layer, x.double()).float()})
    with pytest.raises(FAILED, match="layer 0, M=7"):
        math_checks.test_moe_block_matches_reference(7, engine, reference, limits_for("float32"), 1.0, Figures())


def _nan_logprobs(completions):
    for c in completions:
        for s in c.prompt_steps + c.steps:
            s.top = dict.fromkeys(s.top, float("nan"))
    return completions


@pytest.mark.parametrize("variant", ["sinks_minus_inf", "sinks_plus20"])
def test_sinks_check_fails_on_nan_from_extreme_sinks(variant, short_prompts):
    """The -inf variant: a backend computing exp(-inf - max) badly returns NaN logprobs for every position."""
    ref = Reference(crafted(variant))
    engine = ScriptedEngine({"generate_greedy": lambda ps, n, k, prompt_logprobs=False:
                             _nan_logprobs([ref.score(p, [], k) for p in ps])})
    with pytest.raises(FAILED, match=r"max_abs_dlogprob = nan|logprob nan"):
        math_checks.test_attention_sinks_at_extremes(variant, ScriptedEngines(engine, lambda o: engine),
                                                     short_prompts, TOL, 1.0, Figures())


@pytest.mark.parametrize("chunked", [False, True], ids=["whole-prefill", "chunked-prefill"])
def test_window_check_fails_on_a_window_off_by_one(chunked, tiny, reference):
    """The chunked variant asks for a 32-token chunked-prefill engine: the one handed out has the window at 129."""
    bad = Reference(tiny.path, "window_129")
    asked = []

    def engine_for(options):
        asked.append(options)
        return ScriptedEngine({"generate_greedy": lambda ps, n, k, prompt_logprobs=False:
                               [bad.score(p, [], k) for p in ps]})
    engines = ScriptedEngines(engine_for({}), by_key=engine_for)
    model = SimpleNamespace(config=reference.cfg)
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        math_checks.test_sliding_window_boundary(chunked, engines, reference, model, TOL, 1.0, Figures())
    if chunked:
        assert asked[-1]["enable_chunked_prefill"] and asked[-1]["max_num_batched_tokens"] == 32, asked[-1]


def test_nearest_mutant_check_fails_on_a_stack_that_behaves_like_rounded_yarn(tiny, reference, short_prompts):
    rounded = Reference(tiny.path, "yarn_rounded")
    outputs = [rounded.score(p, [], TOL[1] + 5) for p in short_prompts.prompts]
    model = SimpleNamespace(path=tiny.path, config=reference.cfg)
    with pytest.raises(FAILED, match="it behaves like yarn_rounded"):
        math_checks.test_stack_is_nearest_to_true_reference((outputs, 1.0), reference, model, limits_for("float32"),
                                                             Figures())


def test_parity_check_fails_on_an_engine_without_sinks(tiny, reference, short_prompts):
    dropped = Reference(tiny.path, "sinks_dropped")
    outputs = [dropped.score(p, [], TOL[1]) for p in short_prompts.prompts]
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        parity.test_greedy_logprobs_match_reference((outputs, 1.0), reference, TOL, Figures())


def test_parity_check_fails_on_a_positive_logprob(reference, short_prompts):
    outputs = [reference.score(p, [], TOL[1]) for p in short_prompts.prompts]
    step = outputs[0].prompt_steps[3]
    outputs[0].prompt_steps[3] = StepLogprobs(step.token, {t: v + 1.0 for t, v in step.top.items()})
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        parity.test_greedy_logprobs_match_reference((outputs, 1.0), reference, TOL, Figures())
