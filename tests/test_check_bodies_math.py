"""Negative controls that run the model-math and logit-parity checks' own bodies against a known-bad stack:
an engine whose answers are the fp64 reference with one of the failure modes of docs/failure-modes.md built in (the
reference's mutants: rounded YaRN, gate/up halves, a window off by one), NaN logprobs from -inf sinks, a
LLaMA-style config. Each check must fail, and say what is wrong."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from conformance.checkpoints.crafted import crafted
from conformance.checks import test_logit_parity as parity
from conformance.checks import test_model_math as math_checks
from conformance.engines.base import StepLogprobs
from conformance.reference import Reference
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines, target_of

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


class FlippedRouter(Reference):
    """A router that sends a token to its (k+1)-th expert instead of its k-th where `flip(i, x)` says so: what
    rounding noise does to a near-tie on a healthy bf16 stack, and what a routing bug does to any token."""

    def __init__(self, model_dir, flip) -> None:
        super().__init__(model_dir)
        self.flip = flip

    def router_logits(self, i, x):
        logits = super().router_logits(i, x).clone()
        k = int(self.cfg["num_experts_per_tok"])
        idx = torch.topk(logits, k + 1, dim=-1).indices
        rows = torch.tensor(self.flip(i, x), dtype=torch.bool)
        a, b = idx[rows, k - 1], idx[rows, k]
        la, lb = logits[rows, a], logits[rows, b]
        logits[rows, a], logits[rows, b] = lb, la
        return logits


def _moe_probe(reference, engine_ref, dtype, positions: int = 200):
    """One prompt's probe as the engine answers `components:layer_io`: each layer's blocks on hidden states rounded
    to `dtype` (what the engine feeds them), attention from the reference, MoE from `engine_ref`."""
    gen = torch.Generator().manual_seed(7)
    hidden, layers = int(reference.cfg["hidden_size"]), int(reference.cfg["num_hidden_layers"])
    cos, sin = reference.rope_tables(list(range(positions)))
    attn, moe = [], []
    for i in range(layers):
        x = torch.randn(positions, hidden, generator=gen, dtype=torch.float64).to(dtype).to(torch.float64)
        attn.append((x, reference.attention(i, x, cos, sin)))
        moe.append((x, engine_ref.moe(i, x)))
    return {"positions": list(range(positions)), "prefill_len": positions - 8, "attn": attn, "moe": moe}


def _run_layer_check(engine_ref, reference, limits, figures=None):
    """The per-layer check's own body on a scripted probe whose MoE outputs come from `engine_ref`, in bf16."""
    engine = ScriptedEngine({"components:layer_io": [_moe_probe(reference, engine_ref, torch.bfloat16)]})
    parity.test_layer_blocks_match_reference(
        engine, ScriptedEngines(engine, options={"max_model_len": 1024}), reference, target_of(dtype="bfloat16"),
        limits, SimpleNamespace(prompts=[[1, 2, 3]], max_tokens=2), SimpleNamespace(config=reference.cfg), 600.0,
        figures if figures is not None else Figures())


class MoeOffOnTheDevice(Reference):
    """A "device" whose MoE blocks come out 1e-8 (of the row's largest entry) off at the last row (the per-layer
    check runs the router's own routing and the near-ties' others in one call, `mathcheck.moe_at_near_ties`)."""

    def moe_routed(self, i, x, top_idx):
        out = super().moe_routed(i, x, top_idx)
        out[-1, 3] += 1e-8 * out[-1].abs().max()
        return out


def test_layer_check_stops_at_the_device_reference_s_disagreement_before_judging_the_engine(tiny, reference):
    """The per-layer check on a GPU runs its blocks on a device reference whose CPU rows are recomputed beside the
    device (reference/device.py checked_beside): with the device's MoE off, the check stops with the device's
    sentence, raised before any stratum judges the (healthy) engine."""
    from conformance.reference.device import DeviceMismatch, DeviceReference

    ref = DeviceReference(tiny.path, device="cpu")
    ref.on_device = MoeOffOnTheDevice(tiny.path, streaming=True)
    with pytest.raises(DeviceMismatch, match=r"^layer 0 moe \(given routing\): .* hidden 3, .*not trusted\.$"):
        _run_layer_check(reference, ref, limits_for("bfloat16"))
    _run_layer_check(reference, DeviceReference(tiny.path, device="cpu"), limits_for("bfloat16"))  # a sound device


def test_layer_check_runs_a_layer_s_moe_and_its_near_ties_other_routings_in_one_call(tiny, reference):
    """#38: a device reference widens a layer's MXFP4 experts at each MoE call that it cannot keep them for (beside a
    90% engine most of a layer's experts); the per-layer check sends the router's own routing of every position and
    the near-ties' other routings through the layer's experts in one call (mathcheck.moe_at_near_ties), not one for
    the block and more for the ties."""
    from collections import Counter

    from conformance.reference.device import DeviceReference

    calls: Counter = Counter()

    class Counted(Reference):
        def moe_routed(self, i, x, top_idx):
            calls[i] += 1
            return super().moe_routed(i, x, top_idx)

    ref = DeviceReference(tiny.path, device="cpu")
    ref.on_device = Counted(tiny.path, streaming=True)
    figures = Figures()
    _run_layer_check(reference, ref, limits_for("bfloat16"), figures)
    assert figures.values["layer_moe_router_ties"] > 0
    assert calls and set(calls.values()) == {1}


@pytest.mark.parametrize("where", ["near_ties", "decided"])
def test_layer_check_judges_near_ties_by_their_nearest_routing_and_fails_a_router_that_flips_decided_tokens(
        where, tiny, reference):
    """#38: at gpt-oss-120b's dimensions in bf16 on the H200 (fixtures/device_runs/20261204T202034-bench-p0-L8-0) the
    MoE stratum of sliding layers' decode positions 0-127 (36 positions) had p90 0.163 against 0.03, every other
    stratum about 0.01: tokens whose 4th and 5th router logits lie within rounding noise went to the 5th expert. A
    position whose reference top-k is decided by no more than gpt_oss.toml router_tie_ulps (4) x eps(bf16) x its
    largest |logit| is judged against the nearest of the routings that rounding could pick, in every figure. Here an
    engine that flips exactly those positions passes, each flip matched by another routing and its error at
    bf16's noise (it would fail the p90 otherwise, and the max if judged against the reference's own routing); one
    that flips as many decided positions fails in the MoE stratum."""
    from conformance.verdicts import mathcheck

    bf16 = limits_for("bfloat16")
    k = int(reference.cfg["num_experts_per_tok"])
    tied = lambda i, x: mathcheck._router_ties(reference, i, x, k, bf16.layers.router_tie).tolist()  # noqa: E731
    if where == "near_ties":
        flip = tied
    else:  # as many positions per layer as there are near-ties, among the decided ones
        def flip(i, x):
            t = tied(i, x)
            decided = [n for n, v in enumerate(t) if not v]
            chosen = set(decided[:max(sum(t), len(t) // 5)])
            return [n in chosen for n in range(len(t))]
    probe = _moe_probe(reference, FlippedRouter(tiny.path, flip), torch.bfloat16)
    shares = [sum(tied(i, x)) / len(x) for i, (x, _) in enumerate(probe["moe"])]
    assert min(shares) > 0.1, f"the control needs near-ties above p90's 10% in every layer, got {shares}"
    if where == "near_ties":
        blind_to_ties = replace(bf16, layers=replace(bf16.layers, router_tie=0.0))
        with pytest.raises(FAILED, match="moe blocks of"):  # the false failure the near-tie rule removes
            _run_layer_check(FlippedRouter(tiny.path, flip), reference, blind_to_ties)
        figures = Figures()
        _run_layer_check(FlippedRouter(tiny.path, flip), reference, bf16, figures)
        flipped = sum(sum(tied(i, x)) for i, (x, _) in enumerate(probe["moe"]))
        assert figures.values["layer_moe_router_ties"] == flipped
        assert 0.9 * flipped <= figures.values["layer_moe_rerouted"] <= flipped  # the rest: flips of equal experts
        # each flip swapped two logits, so its weights differ a little from the nearest routing's: a third of the max
        assert figures.values["layer_worst_ratio_to_limit"] < 1.0 and figures.values["layer_rel_err_max"] < 0.05
        # each block's own maximum is recorded, and the larger of the two is the largest of all
        assert max(figures.values["layer_attn_max"], figures.values["layer_moe_max"]) == figures.values[
            "layer_rel_err_max"]
    else:
        with pytest.raises(FAILED, match="moe blocks of"):
            _run_layer_check(FlippedRouter(tiny.path, flip), reference, bf16)


class TileTailDropsAnExpert(Reference):
    """A MoE kernel whose last token of every 16-token tile loses its 4th expert (the other 3 renormalised): wrong at
    one position in 16, fewer than a stratum's p90 ever sees, as one expert block dequantized wrong is at 128
    experts."""

    def moe(self, i, x):
        out = super().moe(i, x)
        x = x.to(torch.float64)
        rows = torch.arange(15, len(x), 16)
        top = torch.topk(self.router_logits(i, x[rows]), int(self.cfg["num_experts_per_tok"]), dim=-1).indices
        out[rows] = self.moe_routed(i, x[rows], top[:, :-1])
        return out


def test_layer_check_fails_a_moe_block_wrong_at_one_position_in_sixteen(tiny, reference):
    """With near-ties judged against their nearest routing, the MoE max needs no room for a token sent to another
    expert: bf16's is the attention's (0.15, healthy engines 0.02), where it was 1.0. One position in sixteen with an
    expert dropped stays under every stratum's median and p90, and under a max of 1.0; it fails the max."""
    bf16 = limits_for("bfloat16")
    loose = replace(bf16, layers=replace(bf16.layers, blocks=dict(bf16.layers.blocks) | {
        "moe": replace(bf16.layers.blocks["moe"], max=1.0)}))
    figures = Figures()
    _run_layer_check(TileTailDropsAnExpert(tiny.path), reference, loose, figures)  # the old limit lets it through
    assert 0.15 < figures.values["layer_rel_err_max"] < 1.0
    with pytest.raises(FAILED, match=r"moe blocks of .* max [\d.e-]+ \(limit 0\.15\)"):
        _run_layer_check(TileTailDropsAnExpert(tiny.path), reference, bf16)


def test_admissible_routings_are_the_experts_above_the_tie_zone_and_any_of_the_zones():
    """What rounding within the margin could make a router pick: a clear top-k gives itself alone; a tie between the
    k-th and (k+1)-th gives both; three logits within the margin at the k-th place give each of them."""
    from conformance.verdicts.mathcheck import admissible_routings

    experts = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    assert admissible_routings(experts(5, 4, 3, 2, 1, 0), 3, 0.1) == [[0, 1, 2]]
    assert sorted(map(sorted, admissible_routings(experts(5, 4, 3, 2.0, 1.99, 0), 4, 0.05))) == [
        [0, 1, 2, 3], [0, 1, 2, 4]]
    assert sorted(map(sorted, admissible_routings(experts(0, 5, 4, 2.0, 1.99, 1.98), 3, 0.03))) == [
        [1, 2, 3], [1, 2, 4], [1, 2, 5]]
