"""Each verdict names the limit every figure it judges was held to (`Verdict.limits()`, recorded by record_figures
as the run's `checks[].limits`): the value that decides, which side passes, and where the value came from. A figure
exactly at its limit passes and one just past it fails, so the recorded limit is the one that judged."""

from __future__ import annotations

import math

import pytest

from conformance.distributed import tp_reference as tpref
from conformance.engines.base import Completion
from conformance.engines.observations import SubmitOutcome
from conformance.verdicts import compare, perf_floors, reliability, sampling
from conformance.verdicts.verdict import FigureLimit


def test_a_sampling_verdict_names_its_p_value_floor_its_draws_and_a_truncated_supports_zero():
    raw = {1000 + i: math.log(p) for i, p in enumerate((0.5, 0.3, 0.2))}
    truncated = sampling.Case("top_k", 1.0, top_k=2)
    report = sampling.judge([(1000, raw)] * 300 + [(1002, raw)], truncated, k=3, min_samples=200)
    limits = report.limits()
    assert limits["top_k_p_value"] == FigureLimit(sampling.ALPHA, "min", limits["top_k_p_value"].source, False)
    assert limits["top_k_samples"].value == 200 and limits["top_k_samples"].kind == "min"
    assert limits["top_k_impossible"] == FigureLimit(0.0, "max", "a draw outside a truncated support", False)
    assert report.figures()["top_k_impossible"] == 1 and not report.ok  # one draw past the limit fails
    assert "temperature_impossible" not in sampling.judge([(1000, raw)] * 300, sampling.Case("temperature", 1.0),
                                                          k=3).limits()


def test_a_soak_names_the_growth_bounds_of_its_data():
    samples = [{"rss_mib": 1000.0, "open_fds": 10.0, "kv_used": 0.0, "vram_mib": 500.0}] * 3
    limits = reliability.soak_verdict(samples, 1, 64.0, 4.0, 128.0).limits()
    assert {k: (v.value, v.kind) for k, v in limits.items()} == {
        "rss_growth_mib": (64.0, "max"), "fd_growth": (4.0, "max"), "max_kv_used_after_round": (0.0, "max"),
        "vram_growth_mib": (128.0, "max")}
    assert "max_vram_growth_mib" in limits["vram_growth_mib"].source


def test_a_floor_names_the_ratio_it_must_reach_and_the_floor_behind_it():
    floor = perf_floors.floor_for("H200", "gpt-oss-120b", 1024, 1024, 8)
    verdict = perf_floors.judge(floor, {"output_tok_s": floor.floor})
    assert verdict.ok and verdict.limits() == {"output_tok_s_vs_floor": FigureLimit(
        1.0, "min", f"perf_floors.toml H200 gpt-oss-120b 1024/1024 c8: {floor.floor:g}", headroom=False)}
    assert not perf_floors.judge(floor, {"output_tok_s": floor.floor * 0.999}).ok


@pytest.mark.parametrize(("minimum", "maximum", "delta", "ok"), [(1, None, 1, True), (1, None, 0, False),
                                                                  (None, 0, 0, True), (None, 0, 1, False)])
def test_a_counter_bound_is_the_limit_its_delta_was_held_to(minimum, maximum, delta, ok):
    report = compare.counter_delta("vllm:num_preemptions", {}, {"vllm:num_preemptions": float(delta)}, minimum,
                                   maximum)
    limit = report.limits()["num_preemptions_delta"]
    assert report.ok is ok and (limit.value, limit.kind) == ((minimum, "min") if minimum is not None else
                                                             (maximum, "max"))


def test_cached_tokens_and_a_rejection_name_their_bounds():
    hit = Completion(prompt_ids=[1, 2], token_ids=[3], steps=[], cached_tokens=16)
    assert compare.cached_tokens("again", [hit], minimum=16).limits()["cached_tokens"].kind == "min"
    assert not compare.cached_tokens("fresh", [hit], maximum=0).ok
    refused = SubmitOutcome(label="empty_prompt", accepted=False, aborted=False, seconds=0.5,
                            error_type="ValueError", message="the prompt is empty")
    report = compare.rejected_clearly(refused, 2.0, ("empty",))
    assert report.ok and report.limits()["reject_s"] == FigureLimit(2.0, "max", report.limits()["reject_s"].source,
                                                                    headroom=False)


def test_tp_recombination_names_its_relative_tolerance():
    import torch

    want = {"attn.0": torch.ones(4, dtype=torch.float64), "moe.0": torch.ones(4, dtype=torch.float64)}
    got = {"attn.0": want["attn.0"] * (1 + 1e-11), "moe.0": want["moe.0"] * (1 + 1e-9)}
    report = tpref.recombined_close(got, want, 1e-10, "TP 2")
    assert set(report.limits()) == {"attn_max_rel_err", "moe_max_rel_err"}
    assert report.limits()["moe_max_rel_err"] == FigureLimit(1e-10, "max", "distributed.toml tp.rel_tol")
    assert not report.ok and report.problems[0].startswith("moe.0")


def test_a_logprob_tolerance_names_its_data_row_in_the_record():
    tol = compare.LogprobTolerance(1.0, source="quant.toml format.awq")
    assert tol == compare.LogprobTolerance(1.0)  # provenance, not a limit: equal limits compare equal
    steps = [Completion(prompt_ids=[1], token_ids=[2], steps=[])]
    report = compare.logprobs_close(steps, steps, tol)
    assert all(limit.source == "quant.toml format.awq" for limit in report.limits().values())


def test_a_seeded_flip_is_held_to_the_dtype_s_noise_from_its_row():
    noise, limit = sampling.flip_noise(compare.LogprobTolerance(3.0, 0.5, source="tolerances.toml logprobs.bfloat16"))
    assert noise == 0.5 and (limit.value, limit.kind) == (0.5, "max") and limit.source.startswith(
        "tolerances.toml logprobs.bfloat16 p99")
    assert sampling.flip_noise(compare.LogprobTolerance(2e-3))[0] == 2e-3  # no p99: its max_abs


def test_a_threshold_is_recorded_as_one_and_read_back_as_one():
    """A p-value floor, a count's or a time's bound passes or breaks: recorded with `headroom: false`, which the
    history store keeps and `conformance compare` reads (only breaking it is a regression); error limits keep the
    headroom rule and are recorded as before."""
    from reports.limits import limits_from_json, limits_json

    raw = {"x_p_value": sampling.SamplingReport(sampling.Case("x", 1.0)).limits()["x_p_value"].as_dict(),
           "max_abs_dlogprob": FigureLimit(2e-3, "max", "tolerances.toml logprobs.float32").as_dict()}
    assert raw["x_p_value"]["headroom"] is False and "headroom" not in raw["max_abs_dlogprob"]
    kept = limits_from_json(limits_json(raw))
    assert kept["x_p_value"].headroom is False and kept["max_abs_dlogprob"].headroom is True
    assert compare.counter_delta("m:n", {}, {"m:n": 2.0}, minimum=1).limits()["n_delta"].headroom is False

