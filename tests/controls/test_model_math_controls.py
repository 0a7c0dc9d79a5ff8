"""Controls of conformance/checks/test_model_math.py: its own bodies against engines with a llama-style rope_theta,
rounded YaRN, swapped gate/up halves, NaN from extreme sinks, a window off by one or a stack that behaves like
rounded YaRN; and, on real engines in low precision, clean stacks pass and planted faults fail."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conformance.checkpoints.crafted import crafted
from conformance.checks import test_model_math as math_checks
from conformance.reference import MUTATIONS, Reference
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, TOL, Figures, ScriptedEngine, ScriptedEngines
from tests.controls.conftest import _hf


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


pytestmark = pytest.mark.slow


def _rope(engine, reference, dtype):
    figures = Figures()
    math_checks.test_rope_tables_match_reference(engine, reference, limits_for(dtype), 600.0, figures)
    return figures.values


def test_rope_check_rejects_real_vllm_with_bf16_positions(tiny, reference, shared_engines):
    engine = shared_engines.get(tiny.path, planted_fault="rope_bf16_positions")
    with pytest.raises(FAILED, match="from position 257 on; the error grows with position"):
        _rope(engine, reference, "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rope_check_passes_tables_stored_in_low_precision_and_rejects_bf16_angles(dtype, tiny, reference,
                                                                                 shared_engines):
    """A table computed in fp32 and stored in bf16/fp16 passes; angles from bf16 positions or a bf16-rounded
    inv_freq fail, named as a long-context defect with the angle error at position 131071."""
    figures = _rope(_hf(shared_engines, tiny, dtype), reference, dtype)
    assert figures["rope_angle_err_rad_at_131071"] < limits_for(dtype).rope["angle_abs"] + 0.04
    for fault in ("rope_bf16_positions", "rope_bf16_inv_freq"):
        with pytest.raises(FAILED, match="grows with position.*long-context defect"):
            _rope(_hf(shared_engines, tiny, dtype, fault), reference, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_moe_check_in_low_precision_passes_clean_and_catches_unrenormalised_routing(dtype, tiny, reference,
                                                                                   shared_engines):
    """transformers in bf16/fp16 on the CPU: the MoE block on 4096 tokens passes, where drawing inputs without
    regard to router near-ties failed it (tokens sent to another expert by rounding: 0.10 in bf16, 0.16 in fp16
    against 0.03 and 0.01; the H200 false-failed at M = 128, 129 and 512); a router that does not renormalise
    over the top-4 fails."""
    figures = Figures()
    math_checks.test_moe_block_matches_reference(4096, _hf(shared_engines, tiny, dtype), reference,
                                                 limits_for(dtype), 600.0, figures)
    assert figures.values["moe_tokens_redrawn"] > 0
    with pytest.raises(FAILED, match="MoE block layer 0, M=512"):
        math_checks.test_moe_block_matches_reference(512, _hf(shared_engines, tiny, dtype, "routing_not_renormalised"),
                                                     reference, limits_for(dtype), 600.0, Figures())


def test_nearest_mutant_check_in_bfloat16_passes_clean_and_names_dropped_expert_biases(tiny, reference, prompts,
                                                                                       shared_engines):
    """transformers in bf16 on the CPU: the clean engine is nearer the reference than any mutant bf16 can resolve
    (its max |Δlogprob| was no nearer than a mutant's on the H200), and an engine whose expert biases are dropped is
    named as behaving like expert_bias_dropped."""
    model = SimpleNamespace(path=tiny.path, config=reference.cfg)
    bf16 = limits_for("bfloat16")
    for fault in (None, "expert_bias_dropped"):
        engine = _hf(shared_engines, tiny, "bfloat16", fault)
        outputs = engine.call("generate_greedy", prompts.prompts, 4, bf16.logprobs[1], prompt_logprobs=True,
                              timeout_s=600.0)
        if fault is None:
            figures = Figures()
            math_checks.test_stack_is_nearest_to_true_reference((outputs, 1.0), reference, model, bf16, figures)
            assert figures.values["distance_to_reference"] * 2 < figures.values["distance_to_nearest_mutant"]
            assert figures.values["mutants_below_noise"] < len(MUTATIONS)
        else:
            with pytest.raises(FAILED, match="it behaves like expert_bias_dropped"):
                math_checks.test_stack_is_nearest_to_true_reference((outputs, 1.0), reference, model, bf16, Figures())
