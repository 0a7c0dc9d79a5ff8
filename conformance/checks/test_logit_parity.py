"""Greedy logit parity of the engine against the suite's independent fp64 reference."""

import pytest

from conformance.checkpoints import exact_slice, slices
from conformance.datafiles import DataError
from conformance.engines.worker import EngineError
from conformance.verdicts import compare, mathcheck, settings
from conformance.verdicts.verdict import fail, record_figures

AREA = "model-math"


@pytest.mark.p0
def test_greedy_logprobs_match_reference(engine_greedy, reference, tolerance, record_figure):
    """Prefill and greedy decode on the engine agree with the fp64 reference, position by position.

    Catches: anything that moves logits — rounded YaRN range, wrong rotation, sliding window off by
    one, sinks dropped or doubled, gate/up de-interleaving, SwiGLU clamp or +1 missing, routing not
    renormalised, dropped biases — on prompts longer than the 128-token window.

    In bf16/fp16 a deep model accumulates noise over its layers on a healthy stack: where the engine exceeds the
    dtype's limits, they widen to tolerances.toml noise_ratio x the figures of the noise twin (the fp64 reference
    holding its weights and activations in the dtype) on the same paths, recorded as noise_twin_* figures (in bf16
    each position band by the twin's same band: tolerances.toml widen_by_band; past decode_noise_depth layers the
    decode bands by a ratio that grows with depth, as a healthy GPU engine's own greedy path does). What drowns in that
    noise at depth is the per-layer blocks', the RoPE tables' and the exact float32 twin's to catch (no error carried).
    Reference: docs/model.md "The math a reference must reproduce"; vLLM tests/models/utils.py
      check_logprobs_close (https://github.com/vllm-project/vllm/blob/main/tests/models/utils.py);
      docs/verdicts.md "Greedy parity at depth"
    Limits: tolerances.toml [logprobs.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "Greedy parity at depth, measured")
    Controls: tests/controls/test_logit_parity_controls.py::test_parity_check_fails_on_an_engine_without_sinks,
      tests/controls/test_logit_parity_controls.py::test_parity_check_fails_on_a_positive_logprob,
      tests/controls/test_logit_parity_controls.py::test_greedy_parity_at_depth_widens_to_the_noise_twin_and_still_fails_a_fault,
      tests/controls/test_logit_parity_controls.py::test_greedy_parity_at_depth_judges_each_band_by_the_twin_s_same_band,
      tests/controls/test_logit_parity_controls.py::test_past_12_layers_the_decode_bands_widen_with_depth_and_still_fail_dropped_sinks
    """
    outputs, _ = engine_greedy
    tol, top_k = tolerance
    compare.greedy_parity(outputs, reference, tol, top_k, record_figure).raise_if_failed()


def _probe_prompts(prompts, model_under_test, engine_max_len: int, decode_steps: int, long_prompt: int):
    """The prompt set plus one long prompt past 1024 positions where the engine's max_model_len allows."""
    length = min(long_prompt, engine_max_len - decode_steps - 1)
    return settings.layer_probe_prompts(prompts.prompts, int(model_under_test.config["vocab_size"]), length)


def _layer_blocks(engine, engines, reference, target, limits, prompts, model_under_test, call_timeout_s,
                  record_figure, layers: list[int] | None) -> None:
    """The per-layer verdict over `layers` (None: every layer), as the two checks below run it."""
    decode_steps, long_prompt = settings.layer_probe_settings()
    max_len = int(engines.options().get("max_model_len") or model_under_test.config["max_position_embeddings"])
    probe_prompts = _probe_prompts(prompts, model_under_test, max_len, decode_steps, long_prompt)
    # targets.toml: per engine kind, eager where graphs hide the blocks from the probe's hooks
    probe_options = dict(target.table.get("probe_options", {}).get(target.engine, {}))
    probe_engine = engines.get(**probe_options) if probe_options else engine
    try:
        probes = probe_engine.call("components:layer_io", probe_prompts, decode_steps, layers,
                                   timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    record_figure("layers_probed", float(len(probes[0]["attn"]) if probes else 0))
    record_figure("layers_total", float(model_under_test.config["num_hidden_layers"]))
    report = mathcheck.layers_close(probes, reference, limits.layers)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.own_engine
@pytest.mark.p0
def test_layer_blocks_match_reference(engine, engines, reference, target, limits, prompts, model_under_test,
                                      call_timeout_s, record_figure):
    """Every attention and MoE block of the engine, fed during a real prefill and greedy decode, agrees with
    the fp64 reference fed the engine's own input to that block — judged per stratum (block, sliding/full
    layer, position band 0-127/128-255/256-1023/1024+, prefill/decode) against limits of the run's dtype. A
    model deeper than tolerances.toml [layers] p0_every_layer_up_to is probed at a sample of layers (both
    types at five depths: 10 of gpt-oss-120b's 36); P1 probes every one (the figure layers_probed says which).
    A MoE position at a router near-tie (its reference top-4 decided within gpt_oss.toml router_tie_ulps), which
    rounding noise may route to another expert on a healthy stack, is judged against the nearest routing the tie
    leaves open (layer_moe_router_ties counts them, layer_moe_rerouted those another routing matched better).

    Catches: in bf16/fp16 as sharply as in fp32 (no error carried across layers): a sliding window off by
    one (only sliding layers past position 127 disagree), sinks dropped or doubled (low positions), RoPE
    wrong beyond some position (positions rounded through bf16: exact to 256), interleaved rotation, every
    MoE mistake (gate/up halves, clamp, +1, routing not renormalised, biases), a decode-only kernel bug, a MoE
    block wrong at a few positions only (one in sixteen: the max).
    Reference: docs/verdicts.md "Per-layer blocks"; docs/model.md "The math a reference must reproduce"
    Limits: tolerances.toml [layers.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "Per-layer blocks, measured"); tolerances.toml [layers] bands, position_scale;
      gpt_oss.toml [tolerances.moe.router_tie_ulps.<dtype>]
    Controls: tests/controls/test_logit_parity_controls.py::test_layer_check_fails_on_planted_engine_faults,
      tests/controls/test_logit_parity_controls.py::test_layer_check_passes_clean_and_rejects_reference_mutants,
      tests/controls/test_logit_parity_controls.py::test_layer_check_at_p0_probes_a_sample_that_still_sees_the_fault,
      tests/controls/test_logit_parity_controls.py::test_layer_check_judges_near_ties_by_their_nearest_routing_and_fails_a_router_that_flips_decided_tokens,
      tests/controls/test_logit_parity_controls.py::test_layer_check_fails_a_moe_block_wrong_at_one_position_in_sixteen
    """
    _layer_blocks(engine, engines, reference, target, limits, prompts, model_under_test, call_timeout_s,
                  record_figure, settings.layers_probed_at_p0(model_under_test.config))


@pytest.mark.own_engine
@pytest.mark.p1
def test_every_layer_block_matches_reference(engine, engines, reference, target, limits, prompts, model_under_test,
                                             call_timeout_s, record_figure):
    """Where P0 probed a sample of the layers (a model deeper than tolerances.toml [layers] p0_every_layer_up_to),
    every layer's attention and MoE block against the fp64 reference, judged as at P0.

    Catches: what the P0 sample cannot: a fault in layers it did not probe (a kernel choice that changes with
    the layer index, one layer's weights loaded wrong: a wrong shard, a dequantization of one expert block).
    Reference: docs/verdicts.md "Per-layer blocks"
    Limits: tolerances.toml [layers.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "Per-layer blocks, measured"); tolerances.toml [layers] bands, position_scale;
      gpt_oss.toml [tolerances.moe.router_tie_ulps.<dtype>]
    Controls:
      tests/controls/test_logit_parity_controls.py::test_layer_check_at_p0_probes_a_sample_that_still_sees_the_fault
    """
    if settings.layers_probed_at_p0(model_under_test.config) is None:
        pytest.skip(f"P0's per-layer check probes every one of this model's "
                    f"{model_under_test.config['num_hidden_layers']} layers")
    _layer_blocks(engine, engines, reference, target, limits, prompts, model_under_test, call_timeout_s,
                  record_figure, None)


@pytest.mark.own_engine
@pytest.mark.p0
def test_exact_float32_logprobs_match_reference(target, exact_limits, engines, reference, prompts, model_under_test,
                                                call_timeout_s, record_figure):
    """On a target whose production dtype is not float32, the same engine also runs the prompt set in float32
    (tf32 off) and must match the fp64 reference within the exact fp32 limits — the run shows both verdicts.
    A model whose float32 weights exceed the float32 engine's share of the device (its gpu_memory_utilization,
    at most 80%), or a real model deeper than tolerances.toml [exact_twin] real_size_layers, runs it on a slice of
    its first layers that fits
    (conformance/checkpoints/slices.py: the real dimensions, kernels and weights of those layers), judged against
    the fp64 reference of the same slice; the record says how many layers (exact_layers of exact_layers_of). A
    quantized model the engine does not run in float32 (vLLM serves MXFP4 in bf16 only: data/quant.toml `serves`)
    runs on its weights dequantized, exactly, in the unquantized layout; the record says so
    (exact_weights_dequantized), and its MXFP4 kernel is judged by greedy parity in bf16 and the MXFP4 check.

    Catches: every math bug the low-precision verdicts can only bound statistically (a window off by one,
    rounded YaRN, sinks counted twice), on the GPU and kernels the production dtype uses, at the model's size.
    Reference: docs/verdicts.md "Two dtypes per GPU run"; targets.toml `exact_dtype`
    Limits: tolerances.toml [logprobs.float32]
    Controls: tests/controls/test_logit_parity_controls.py::test_exact_float32_check_rejects_an_engine_without_sinks,
      tests/controls/test_logit_parity_controls.py::test_exact_float32_check_runs_on_a_slice_of_a_model_too_big_for_the_device,
      tests/controls/test_logit_parity_controls.py::test_exact_float32_check_runs_an_mxfp4_model_on_its_weights_dequantized
    """
    exact = target.exact_dtype
    if not exact:
        pytest.skip(f"targets.toml names no exact_dtype for {target.name}")
    if exact == target.dtype:
        pytest.skip(f"the run's dtype is {target.dtype}: test_greedy_logprobs_match_reference is the exact verdict")
    engines.wait_built(exact_slice.JOB)  # written in the background from collection on (checkpoints/exact_slice.py)
    key = model_under_test.content_hash or model_under_test.name
    exact_plan = exact_slice.plan(model_under_test.config, model_under_test.num_params, target.engine, exact,
                                  engines.options(dtype=exact), model_under_test.name, key)
    if exact_plan.skip:
        pytest.skip(exact_plan.skip)
    layers, total, fmt = exact_plan.layers, exact_plan.total, exact_plan.dequantized_from
    if fmt:
        record_figure("exact_weights_dequantized", 1.0)
    record_figure("exact_layers", float(layers))
    record_figure("exact_layers_of", float(total))
    engine_model, judge = None, reference
    if exact_plan.sliced:
        from conformance.reference.device import reference_for
        from conformance.run.fixtures import STREAMING_ABOVE_PARAMS

        try:
            engine_model = slices.slice_layers(model_under_test.path, layers, key, dequantize=bool(fmt))
        except (DataError, OSError) as exc:
            fail(f"the {layers}-layer {'dequantized ' if fmt else ''}slice for the exact verdict could not be cut: "
                 f"{exc}")
        if layers < total:
            judge = reference_for(engine_model, model_under_test.num_params > STREAMING_ABOVE_PARAMS,
                                  target.table.get("reference_device"))
    tol, top_k = exact_limits.logprobs
    try:
        out = engines.get(dtype=exact, **({"model": engine_model} if engine_model else {})).call(
            "generate_greedy", prompts.prompts, prompts.max_tokens, top_k, prompt_logprobs=True,
            timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    what = (f"engine ({exact}{f', {fmt} dequantized' if fmt else ''}"
            f"{f', first {layers} of {total} layers' if layers < total else ''})")
    report = compare.logprobs_close(out, judge.score_all(out, top_k + 5), tol,
                                    names=(what, "reference"))
    record_figures(record_figure, report)
    report.raise_if_failed()
