"""Model-math conformance: the gpt-oss config, RoPE/YaRN tables, the MoE block at many batch sizes,
attention sinks at their extremes, the sliding-window boundary in prefill / decode / chunked prefill,
and which known failure mode a stack is nearest to (docs/failure-modes.md)."""

from __future__ import annotations

import pytest
import torch

from conformance.checkpoints import gptoss_config
from conformance.checkpoints.crafted import crafted
from conformance.checks import call_or_fail
from conformance.engines.engine_configs import LIMITED_SCHEDULER
from conformance.engines.worker import EngineError
from conformance.reference import MUTATIONS, Reference
from conformance.verdicts import compare, mathcheck
from conformance.verdicts.verdict import FigureLimit, fail, record_figures, record_limit

AREA = "model-math"
ROPE_POSITIONS = [0, 1, 2, 63, 127, 128, 129, 255, 256, 257, 511, 1023, 4095, 4096, 4097, 32768, 65535, 100000, 131071]
MOE_BATCH_SIZES = [1, 7, 128, 129, 512]
SINK_VARIANTS = ["sinks_plus20", "sinks_minus_inf"]
# 32-token chunks across the window's edge, two sequences at a time: the scheduling checks' engine, one start for both
WINDOW_CHUNKED = LIMITED_SCHEDULER


def engines_ahead(engines):
    """The engines these checks ask for, in order: the factory starts each one ahead (conformance/run/fixtures.py)."""
    for variant in SINK_VARIANTS:
        yield f"test_attention_sinks_at_extremes[{variant}]", {"model": crafted(variant)}
    yield "test_sliding_window_boundary[chunked-prefill]", WINDOW_CHUNKED


@pytest.mark.p0
def test_model_config_is_gpt_oss(model_under_test, record_figure):
    """The checkpoint's config.json has the gpt-oss architecture: rope (yarn, factor 32, beta 32/1,
    4096, truncate false), window 128 on even layers, head_dim 64, clamp 7, and for a real checkpoint
    the layer/expert counts, vocab, special ids and parameter count of gpt-oss-20b/120b.

    Catches: checkpoints converted with "LLaMA-style" configs (rope_theta 1e6, 80 layers), truncate
    left at true (rounded YaRN), a window or layer pattern changed by a conversion script.
    Reference: docs/model.md "Architecture"; https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json
    Controls: tests/controls/test_model_math_controls.py::test_config_check_fails_on_a_llama_style_rope_theta
    """
    params = gptoss_config.count_params(model_under_test.path)
    record_figure("params_billion", params / 1e9)
    report = gptoss_config.check_config(model_under_test.config, params)
    if not report.ok:
        fail(f"config of {model_under_test.name} ({report.variant or 'not a published size'}): "
             + "; ".join(report.problems))


@pytest.mark.p0
def test_rope_tables_match_reference(engine, reference, limits, call_timeout_s, record_figure):
    """The engine's RoPE cos/sin cache equals the reference's YaRN tables at positions from 0 to
    max_position_embeddings - 1, judged at the storage resolution of the run's dtype: table values, the
    angle of every (cos, sin) pair as it grows with position (figure: angle error at 131071), the
    concentration, and in fp32 inv_freq recovered at position 1.

    Catches: rounded YaRN correction range (vllm#27722), a missing or doubled concentration, a rotary
    buffer left uninitialised after loading (exact at position 0, wrong everywhere else), wrong base, and
    angles computed from a bf16-rounded inv_freq or bf16 positions (exact to 256, wrong beyond: a long-context
    defect told apart from bf16 storage of an fp32 table, which passes).
    Reference: docs/model.md "RoPE with YaRN"; https://github.com/vllm-project/vllm/issues/27722
    Limits: gpt_oss.toml [tolerances.rope.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "RoPE and the model-math checks on the H200")
    Controls: tests/controls/test_model_math_controls.py::test_rope_check_fails_on_an_engine_with_rounded_yarn
    """
    positions = [p for p in ROPE_POSITIONS if p < int(reference.cfg["max_position_embeddings"])]
    got = call_or_fail(engine, "components:rope_tables", positions, timeout_s=call_timeout_s)
    report = mathcheck.rope_close(got, reference.rope_tables(positions), positions, limits.rope, limits.dtype)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
@pytest.mark.parametrize("m", MOE_BATCH_SIZES)
def test_moe_block_matches_reference(m, engine, reference, limits, call_timeout_s, record_figure):
    """One MoE block (router with bias, top-4 renormalised, interleaved clamped SwiGLU, expert biases)
    of the engine equals the fp64 reference on M tokens, for M in 1, 7, 128, 129, 512, on a sliding
    and a full layer. The reference is fed the hidden states as the engine receives them (rounded to the
    run's dtype), and every token's top-4 experts are decided by more than the dtype's router noise (data:
    gpt_oss.toml router_tie_ulps): a near-tie sends a token to another expert on a healthy bf16 stack, an
    error as large as a real routing bug, so such draws are replaced (figure: moe_tokens_redrawn).

    Catches: fused-MoE kernels wrong at some batch sizes (small-M paths, padding at 129), gate/up
    de-interleaving, a missing clamp or +1, routing not renormalised, dropped router or expert biases.
    Reference: docs/model.md "SwiGLU", "MoE routing"; docs/failure-modes.md, modes 5-8
    Limits: gpt_oss.toml [tolerances.moe.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "The MoE block and router near-ties, measured"); gpt_oss.toml [tolerances.moe.router_tie_ulps.<dtype>]
    Controls: tests/controls/test_model_math_controls.py::test_moe_check_fails_on_an_engine_with_gate_up_halves,
      tests/controls/test_model_math_controls.py::test_moe_check_in_low_precision_passes_clean_and_catches_unrenormalised_routing
    """
    tol = limits.moe_rel
    x, redrawn = mathcheck.decisive_router_inputs(reference, (0, 1), m, getattr(torch, limits.dtype),
                                                  limits.router_tie_ulps)
    record_figure("moe_tokens_redrawn", float(redrawn))
    worst = 0.0
    for layer in (0, 1):
        got = call_or_fail(engine, "components:moe_block", layer, x.float(), timeout_s=call_timeout_s)
        report = mathcheck.moe_close(got, reference.moe(layer, x), tol, f"layer {layer}, M={m}")
        worst = max(worst, report.measured.get("moe_max_rel_err", float("inf")))
        report.raise_if_failed()
    record_figure("moe_max_rel_err", worst)
    where = f"gpt_oss.toml tolerances.moe.{limits.dtype}"
    record_limit(record_figure, "moe_max_rel_err", FigureLimit(tol, "max", where))


@pytest.mark.p1
@pytest.mark.parametrize("variant", SINK_VARIANTS)
def test_attention_sinks_at_extremes(variant, engines, prompts, tolerance, call_timeout_s, record_figure):
    """With every sink at +20 (attention output ~ 0) or -inf (plain softmax), prefill and decode on the
    engine still match the reference for that checkpoint.

    Catches: backends that ignore sinks, count them twice in split-KV decode, overflow on large sinks
    or produce NaN for -inf sinks (several ROCm attention backends added sink support late).
    Reference: docs/model.md "Attention sinks"; docs/failure-modes.md, mode 4
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_model_math_controls.py::test_sinks_check_fails_on_nan_from_extreme_sinks
    """
    path = crafted(variant)
    tol, top_k = tolerance
    try:
        got = engines.get(model=path).call("generate_greedy", prompts.prompts, 4, top_k, prompt_logprobs=True,
                                           timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    ref = Reference(path)
    report = compare.logprobs_close(got, ref.score_all(got, top_k + 5), tol)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
@pytest.mark.parametrize("chunked", [False, pytest.param(True, marks=pytest.mark.needs("chunked_prefill"))],
                         ids=["whole-prefill", "chunked-prefill"])
def test_sliding_window_boundary(chunked, engines, reference, model_under_test, tolerance, call_timeout_s,
                                 record_figure):
    """Around the window edge — key at distance 127 visible, at 128 masked — prefill, decode (prompts
    of 126..130 tokens decoding across position 128) and 32-token chunked prefill (two sequences at a time)
    agree with the reference.

    Catches: a window off by one (Megatron-LM, mlx-lm, LightLLM shipped this), a window applied to
    the wrong layers, or chunked prefill that loses the window across chunk boundaries.
    Reference: docs/model.md "Sliding window"; docs/failure-modes.md, mode 3
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_model_math_controls.py::test_window_check_fails_on_a_window_off_by_one
    """
    vocab = int(model_under_test.config["vocab_size"])
    gen = torch.Generator().manual_seed(128)
    prompts = [torch.randint(0, vocab - 8, (n,), generator=gen).tolist() for n in (126, 127, 128, 129, 130)]
    options = WINDOW_CHUNKED if chunked else {}
    tol, top_k = tolerance
    try:
        got = engines.get(**options).call("generate_greedy", prompts, 6, top_k, prompt_logprobs=True,
                                          timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    report = compare.logprobs_close(got, reference.score_all(got, top_k + 5), tol)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
def test_stack_is_nearest_to_true_reference(engine_greedy, reference, model_under_test, limits, record_figure):
    """Diagnosis: the engine's prompt logprobs are far closer to the true reference than to any mutant;
    the distance to each mutant is recorded, so a failing stack is named ("behaves like yarn_rounded").
    The distance is the dtype's (tolerances.toml [diagnosis]): max |Δlogprob| in fp32; in bf16/fp16, where
    near-tie flips own the tail, the largest median of one position band and phase. A mutant that sits within
    that dtype's noise of the reference cannot be told from it there and is left out (mutants_below_noise);
    none left is a skip that says so.

    Catches: the same failure modes as the parity check, and says which one a failing stack has.
    Reference: docs/failure-modes.md
    Limits: tolerances.toml [diagnosis.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "Naming the likely cause, measured"); tolerances.toml [logprobs.<dtype>]
    Controls:
      tests/controls/test_model_math_controls.py::test_nearest_mutant_check_fails_on_a_stack_that_behaves_like_rounded_yarn,
      tests/controls/test_model_math_controls.py::test_nearest_mutant_check_in_bfloat16_passes_clean_and_names_dropped_expert_biases
    """
    outputs, _ = engine_greedy
    _, top_k = limits.logprobs
    rule, dtype = limits.diagnosis, limits.dtype
    sample = sorted(outputs, key=lambda c: -len(c.prompt_ids))[:3]
    unbounded = compare.LogprobTolerance(float("inf"))

    def scored(ref: Reference) -> list:
        return ref.score_all(sample, top_k + 5)

    def distance(got: list, want: list) -> float:
        return rule.of(compare.logprobs_close(got, want, unbounded).figures())

    truth = scored(reference)
    true = distance(sample, truth)
    mutants, hidden = {}, []
    for mutant in MUTATIONS:
        want = scored(Reference(model_under_test.path, mutant))
        if rule.resolvable(distance(truth, want)):
            mutants[mutant] = distance(sample, want)
        else:
            hidden.append(mutant)
    record_figure("distance_to_reference", true)
    record_figure("mutants_below_noise", float(len(hidden)))
    if not mutants:
        pytest.skip(f"no mutant is farther than {rule.ratio + 1:g} x the {dtype} noise ({rule.noise:g}, "
                    f"{rule.distance}) from the reference on this model: {dtype} cannot name one")
    name, near = mathcheck.nearest(mutants)
    record_figure("distance_to_nearest_mutant", near)
    record_limit(record_figure, "distance_to_nearest_mutant", FigureLimit(
        true * rule.ratio, "min", f"tolerances.toml diagnosis.{dtype}.ratio x the distance to the reference",
        headroom=False))
    if not (true * rule.ratio < near):
        fail(f"the stack is {true:.3g} from the reference but only {near:.3g} from the mutant {name} "
             f"({rule.distance} |Δlogprob|, {dtype}): it behaves like {name}")
