"""Negative controls of the model-math checks: each known-bad stack or input must be rejected."""

from __future__ import annotations

import json

import pytest
import torch

from conformance.checkpoints import gptoss_config
from conformance.checkpoints.crafted import crafted
from conformance.checkpoints.models import write_checkpoint
from conformance.checks.test_model_math import MOE_BATCH_SIZES, ROPE_POSITIONS
from conformance.reference import MUTATIONS, Reference
from conformance.verdicts import compare, mathcheck
from conformance.verdicts.limits import limits_for
from tests.conftest import start_cpu_engine

ROPE_TOL = gptoss_config.spec()["tolerances"]["rope"]["float32"]
MOE_MUTANTS = ["gate_up_halves", "swiglu_no_clamp", "swiglu_no_plus_one", "routing_not_renormalised",
               "router_bias_dropped", "expert_bias_dropped"]


def real_120b_config() -> dict:
    data = gptoss_config.spec()
    cfg = dict(data["shared"]) | dict(data["variants"]["gpt-oss-120b"])
    cfg.pop("params_billion")
    cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)]
    return cfg


def test_config_check_accepts_tiny_and_real_120b(tiny):
    assert gptoss_config.check_config(json.loads((tiny.path / "config.json").read_text())).ok
    report = gptoss_config.check_config(real_120b_config(), params=116_829_156_672)
    assert report.ok and report.variant == "gpt-oss-120b", report.problems


@pytest.mark.parametrize("change", [
    {"rope_theta": 1e6}, {"sliding_window": 127}, {"head_dim": 80}, {"swiglu_limit": None},
    {"layer_types": ["full_attention"] * 36}, {"num_key_value_heads": 64},
], ids=lambda c: next(iter(c)))
def test_config_check_rejects_wrong_configs(change):
    assert not gptoss_config.check_config(real_120b_config() | change).ok


def test_config_check_rejects_truncated_yarn_and_wrong_param_count():
    cfg = real_120b_config()
    cfg["rope_scaling"] = dict(cfg["rope_scaling"], truncate=True)
    assert "rope_scaling.truncate" in "; ".join(gptoss_config.check_config(cfg).problems)
    assert not gptoss_config.check_config(real_120b_config(), params=80_000_000_000).ok


def test_param_count_matches_the_architecture_formula(tiny):
    s = tiny.spec
    h, q, kv, e, i = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim, \
        s.num_local_experts, s.intermediate_size
    layer = 2 * h + (q * h + q) + 2 * (kv * h + kv) + (h * q + h) + s.num_attention_heads + (e * h + e) \
        + e * (h * 2 * i + 2 * i + i * h + h)
    assert gptoss_config.count_params(tiny.path) == 2 * s.vocab_size * h + s.num_hidden_layers * layer + h


def test_rope_check_rejects_rounded_yarn_and_bad_buffers(reference, tiny):
    pos = ROPE_POSITIONS
    good = reference.rope_tables(pos)
    assert mathcheck.rope_close(good, good, pos, ROPE_TOL).ok
    rounded = Reference(tiny.path, "yarn_rounded").rope_tables(pos)
    report = mathcheck.rope_close(rounded, good, pos, ROPE_TOL)
    assert not report.ok and "inv_freq" in report.problems[0]
    no_concentration = (good[0] / reference.concentration, good[1] / reference.concentration)
    assert not mathcheck.rope_close(no_concentration, good, pos, ROPE_TOL).ok
    # one entry off in magnitude alone: the message says where (position, frequency) and what the engine holds
    one = (good[0].clone(), good[1].clone())
    one[0][pos.index(4096), 3] *= 1.001
    one[1][pos.index(4096), 3] *= 1.001
    (problem,) = [p for p in mathcheck.rope_close(one, good, pos, ROPE_TOL).problems if "concentration" in p]
    assert "worst at position 4096, frequency 3, where the engine's (cos, sin) has magnitude" in problem
    # an uninitialised rotary buffer: exact at position 0, garbage after it
    stale = (good[0].clone(), good[1].clone())
    stale[0][1:], stale[1][1:] = 0.5, 0.5
    assert not mathcheck.rope_close(stale, good, pos, ROPE_TOL).ok


@pytest.mark.parametrize("mutation", MOE_MUTANTS)
def test_moe_check_rejects_moe_mutants(mutation, tiny, reference):
    bad = Reference(tiny.path, mutation)
    x = torch.randn(max(MOE_BATCH_SIZES), 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tol = gptoss_config.spec()["tolerances"]["moe"]["float32"]
    assert not mathcheck.moe_close(bad.moe(0, x), reference.moe(0, x), tol, mutation).ok
    assert not mathcheck.moe_close(bad.moe(0, x)[:1], reference.moe(0, x), tol, "shape").ok


@pytest.mark.parametrize("sink_mutant", ["sinks_dropped", "sinks_twice"])
def test_sinks_check_rejects_a_stack_ignoring_or_doubling_large_sinks(sink_mutant, tiny_prompts):
    path = crafted("sinks_plus20")
    tol, top_k = limits_for("float32").logprobs
    prompts = tiny_prompts[0][:3]
    got = [Reference(path, sink_mutant).score(p, [], top_k) for p in prompts]
    want = [Reference(path).score(p, [], top_k + 5) for p in prompts]
    assert not compare.logprobs_close(got, want, tol).ok


@pytest.mark.parametrize("window_mutant", ["window_127", "window_129"])
def test_window_check_rejects_off_by_one(window_mutant, tiny, reference):
    tol, top_k = limits_for("float32").logprobs
    gen = torch.Generator().manual_seed(128)
    prompts = [torch.randint(0, 4088, (n,), generator=gen).tolist() for n in (126, 127, 128, 129, 130)]
    bad = Reference(tiny.path, window_mutant)
    got = [bad.score(p[:-2], p[-2:], top_k) for p in prompts]  # prefill, then two steps across the edge
    want = [reference.score(c.prompt_ids, c.token_ids, top_k + 5) for c in got]
    assert not compare.logprobs_close(got, want, tol).ok


@pytest.mark.slow
def test_real_vllm_with_rounded_yarn_fails_rope_and_is_diagnosed(tiny, reference, tiny_prompts, tmp_path):
    """vLLM told `truncate: true` rounds the YaRN range (vllm#27722): the RoPE table check rejects it and
    the diagnosis names the yarn_rounded mutant as the nearest."""
    rs = json.loads((tiny.path / "config.json").read_text())["rope_scaling"] | {"truncate": True}
    model = write_checkpoint(tiny.spec, tmp_path / "rounded", config_overrides={"rope_scaling": rs})
    proc = start_cpu_engine(str(model), tmp_path / "engine.log")
    try:
        tables = proc.call("components:rope_tables", ROPE_POSITIONS)
        got = proc.call("generate_greedy", [sorted(tiny_prompts[0], key=len)[-3]], 2, 5, prompt_logprobs=True)
    finally:
        proc.close()
    assert not mathcheck.rope_close(tables, reference.rope_tables(ROPE_POSITIONS), ROPE_POSITIONS, ROPE_TOL).ok
    distances = {}
    for name in ["__true__", *MUTATIONS]:
        ref = reference if name == "__true__" else Reference(tiny.path, name)
        want = [ref.score(c.prompt_ids, c.token_ids, 10) for c in got]
        distances[name] = compare.logprobs_close(got, want, compare.LogprobTolerance(float("inf"))).max_abs_dlogprob
    assert mathcheck.nearest(distances)[0] == "yarn_rounded", distances


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
