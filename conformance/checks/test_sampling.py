"""Sampled requests: what a client gets when it does not ask for greedy decoding (gpt-oss is served at temperature
1.0): the draws follow the requested distribution, seeds reproduce, and a request stops where it says."""

from dataclasses import replace

import pytest

from conformance.checks import call_or_fail
from conformance.engines.engine_configs import SMALL_KV_CACHE, preemptible_requests
from conformance.verdicts import compare, sampling
from conformance.verdicts.verdict import FigureLimit, fail, record_figures, record_limit

AREA = "sampling"
# Draws per case. Temperature alone: 6,000 give power 0.99 against a temperature 10 % off at the 1e-6 test (0.35 at
# 2,000; tests/test_sampling_verdicts.py measures it); a truncation is caught by draws outside its support.
DRAWS = {"temperature": 6000}
DRAWS_TRUNCATED = 2000
SEED = 20261203  # the draws are reproducible run to run; tests/test_sampling_verdicts.py varies it


@pytest.mark.p0
@pytest.mark.needs("sampling")
def test_sampled_tokens_follow_the_requested_distribution(engine, reference, prompts, tolerance, call_timeout_s,
                                                          record_figure):
    """At the first generated position of a prompt, 6,000 draws at temperature 0.7 and 2,000 per truncation (top_k,
    min_p and top_p at 1.0, each cut in the widest gap of the position's top logprobs, min_p's 2 nats clear of the
    20th) follow the distribution vLLM's
    sampling parameters define, computed from the engine's own raw logprobs of that position — which must agree
    with the fp64 reference at that position (top-20: greedy parity's rule and its largest-error bound, widened
    at depth to the noise twin as greedy parity is). Chi-square goodness of fit at a false-failure
    rate of 1e-6 per case, rare tokens pooled; one draw outside a truncated support fails.

    Catches: a sampler that ignores the request's temperature, a nucleus (top_p) or min_p not applied, top_k off by
    one, logprobs reported after temperature instead of the model's own.
    Reference: vLLM v1/sample/sampler.py and ops/topk_topp_sampler.py (temperature, min_p, top-k, top-p order);
      https://platform.openai.com/docs/api-reference/chat/create (temperature, top_p); docs/verdicts.md "Sampling"
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_sampling_controls.py::test_sampling_check_fails_on_planted_sampler_faults,
      tests/controls/test_sampling_controls.py::test_sampling_check_fails_when_the_engine_s_logprobs_are_not_the_model_s,
      tests/controls/test_sampling_controls.py::test_sampling_check_at_depth_widens_its_logprob_bound_to_the_noise_twin
    """
    prompt = prompts.prompts[0]
    (greedy,) = call_or_fail(engine, "generate_greedy", [prompt], 1, 20, timeout_s=call_timeout_s)
    if not greedy.steps:
        fail("the engine returned no token for a one-token greedy request: there is no position to sample")
    _raw_logprobs_are_the_model_s(greedy, reference, tolerance[0], record_figure)
    raw = sampling.top(greedy.steps[0].top, 20)
    problems = []
    for case in sampling.cases_for(raw):
        draws = DRAWS.get(case.name, DRAWS_TRUNCATED)
        request = case.params() | {"n": draws, "max_tokens": 1, "seed": SEED}
        (outs,) = call_or_fail(engine, "generate_sampled", [prompt], request, timeout_s=call_timeout_s)
        if len(outs) != draws or any(len(o["token_ids"]) != 1 for o in outs):
            problems.append(f"{case.name}: asked for {draws} draws of one token, got {len(outs)} outputs of "
                            f"{sorted({len(o['token_ids']) for o in outs})} tokens")
            continue
        report = sampling.judge([(o["token_ids"][0], o["logprobs"][0]) for o in outs], case)
        record_figures(record_figure, report)
        if not report.ok:
            problems.append(report.failure_message())
    if problems:
        fail("\n".join(problems))


def _raw_logprobs_are_the_model_s(greedy, reference, tol, record_figure) -> None:
    """The distribution the draws are judged against is the engine's own: it must be the model's. Greedy parity's
    verdict (compare.greedy_parity) on the sampled position (the prompt's are greedy parity's own check), judged
    by its largest error alone (the catastrophe bound), widened to noise_ratio x the noise twin's where the engine
    exceeds it: at 24 layers of gpt-oss-120b's dimensions a healthy H200 in bf16 put a token of its top-5 outside
    the fp64 reference's top-25 (docs/verdicts.md "Sampling")."""
    figures: dict[str, float] = {}
    bound = replace(tol, p99=None, median=None, stratum_median=None, widen_by_band=False)
    report = compare.greedy_parity([greedy], reference, bound, 20, figures.__setitem__, prefill=False)
    record_figure("raw_logprob_max_abs_err", figures.get("max_abs_dlogprob", float("inf")))
    if "max_abs_dlogprob" in report.limits():
        record_limit(record_figure, "raw_logprob_max_abs_err", report.limits()["max_abs_dlogprob"])
    if "noise_twin_max_abs_dlogprob" in figures:
        record_figure("raw_logprob_noise_twin_max_abs_err", figures["noise_twin_max_abs_dlogprob"])
    if not report.ok:
        fail("the engine's raw logprobs at the sampled position are not the fp64 reference's: the distribution the "
             "sampler draws from is not the model's: " + "; ".join(report.problems[:3]))


def _short(max_tokens: int, outputs: list[dict]) -> list[str]:
    """Outputs of ignore_eos requests that are not max_tokens long: two empty outputs must not agree into a pass."""
    lengths = sorted({len(o["token_ids"]) for o in outputs})
    return [] if lengths == [max_tokens] else [f"asked for {max_tokens} tokens (ignore_eos), got {lengths}"]


@pytest.mark.p0
@pytest.mark.needs("sampling")
def test_seeded_requests_reproduce_alone_and_in_a_batch(engine, prompts, tolerance, call_timeout_s, record_figure):
    """A seeded request at temperature 1.0 gives the same tokens when sent again and when batched beside other
    seeded requests; four different seeds do not all give one output. Batched beside others, a kernel may compute
    the logits a little otherwise (vLLM promises batch invariance only in its batch-invariant mode): a batched
    output may part from the lone one only where the logits moved enough to flip that very draw, by no more than the
    dtype's noise (`sampling.flip_explained`, proven on its own in tests/test_sampling_verdicts.py).

    Catches: a request's seed dropped or shared across a batch (the global generator used instead), sampling that
    depends on a request's batch neighbours.
    Reference: https://platform.openai.com/docs/api-reference/chat/create (`seed`); vLLM SamplingParams.seed,
      https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_sampling_controls.py::test_seed_check_fails_when_the_seed_is_dropped
    """
    params = {"temperature": 1.0, "max_tokens": 12, "ignore_eos": True}
    batch = prompts.prompts[:3]

    def draw(ps, seeds):
        requests = [params | {"seed": s} for s in seeds]
        return [o[0] for o in call_or_fail(engine, "generate_sampled", ps, requests, timeout_s=call_timeout_s)]

    alone = draw(batch[:1], [7])[0]
    again = draw(batch[:1], [7])[0]
    batched = draw(batch, [7, 8, 9])[0]
    four = draw(batch[:1] * 4, [1, 2, 3, 4])
    others = {tuple(o["token_ids"]) for o in four}
    record_figure("distinct_outputs_of_4_seeds", len(others))
    record_limit(record_figure, "distinct_outputs_of_4_seeds", FigureLimit(2.0, "min", "four seeds give more than one "
                                                                                       "output", headroom=False))
    problems = _short(params["max_tokens"], [alone, again, batched, *four])
    if again["token_ids"] != alone["token_ids"]:
        problems.append(f"seed 7 sent twice gave {alone['token_ids']} then {again['token_ids']}")
    noise, noise_limit = sampling.flip_noise(tolerance[0])
    record_figure("batched_flip_gap_move", sampling.largest_flip_move([(alone, batched)], params["temperature"]))
    record_limit(record_figure, "batched_flip_gap_move", noise_limit)
    why = sampling.flip_explained(alone, batched, params["temperature"], noise)
    if why:
        problems.append(f"seed 7 alone gave {alone['token_ids']}, batched with two other requests "
                        f"{batched['token_ids']}: {why}")
    if len(others) < 2:
        problems.append("four different seeds gave one and the same output: the seed does not reach the sampler")
    if problems:
        fail("; ".join(problems))


@pytest.mark.p1
@pytest.mark.needs("sampling")
def test_requests_stop_where_they_say(engine, prompts, call_timeout_s, record_figure):
    """max_tokens is exact (1 and 5: that many tokens, finish_reason "length"); a stop token id ends the output at
    its first occurrence (finish_reason "stop", stop_reason the token); min_tokens holds the stop token back.

    Catches: max_tokens off by one, a stop token id ignored or reported with the wrong reason, min_tokens ignored.
    Reference: https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html (max_tokens, stop_token_ids,
      min_tokens; v1/core/sched/utils.py check_stop); OpenAI API `max_completion_tokens`, `finish_reason`
    Controls: tests/controls/test_sampling_controls.py::test_stop_check_fails_on_max_tokens_off_by_one
    """
    prompt, base = prompts.prompts[0], {"temperature": 1.0, "seed": 11, "ignore_eos": True}

    def one(**params):
        (outs,) = call_or_fail(engine, "generate_sampled", [prompt], base | params, timeout_s=call_timeout_s)
        return outs[0]

    problems = []
    for n in (1, 5):
        out = one(max_tokens=n)
        if len(out["token_ids"]) != n or out["finish_reason"] != "length":
            problems.append(f"max_tokens {n}: {len(out['token_ids'])} tokens, finish_reason {out['finish_reason']!r}")
    free = one(max_tokens=16)["token_ids"]
    at = next((i for i in range(3, len(free)) if free[i] not in free[:i]), None)
    if at is None:
        fail(f"no token of {free} occurs first after position 3: no stop token to test")
    stop = free[at]
    out = one(max_tokens=16, stop_token_ids=[stop])
    if out["token_ids"] != free[: at + 1] or out["finish_reason"] != "stop" or out["stop_reason"] != stop:
        problems.append(f"stop_token_ids [{stop}]: got {out['token_ids']} ({out['finish_reason']!r}, stop_reason "
                        f"{out['stop_reason']!r}), want {free[: at + 1]} ('stop', {stop})")
    held = one(max_tokens=16, stop_token_ids=[stop], min_tokens=at + 3)
    if stop in held["token_ids"][: at + 3] or len(held["token_ids"]) < at + 3:
        problems.append(f"min_tokens {at + 3} with stop token {stop}: got {held['token_ids']}")
    record_figure("stop_position", at)
    if problems:
        fail("; ".join(problems))


@pytest.mark.p1
@pytest.mark.needs("sampling")
@pytest.mark.needs("scheduler")
def test_seeded_requests_reproduce_after_preemption_and_a_restart(engines, prompts, tolerance, call_timeout_s,
                                                                  record_figure):
    """Six seeded requests at temperature 1.0 give the same tokens on the engine under test, on an engine whose
    KV cache of 12 blocks forces preemptions (the counter proves it), and on an engine started again with another
    global seed — or part only where the logits moved enough to flip a draw (`sampling.flip_explained`).

    Catches: a request's generator reset or advanced twice when it is preempted and recomputed, a per-request seed
    that depends on the engine's global seed or on its start.
    Reference: https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html (seed);
      https://docs.vllm.ai/en/latest/configuration/optimization.html#preemption
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_sampling_controls.py::test_restart_check_fails_when_the_seed_is_dropped
    """
    reqs, max_tokens = preemptible_requests(prompts.prompts)
    requests = [{"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, "seed": 100 + i}
                for i in range(len(reqs))]

    def sample(engine):
        return [o[0] for o in call_or_fail(engine, "generate_sampled", reqs, requests, timeout_s=call_timeout_s)]

    want = sample(engines.get())
    small = engines.get(**SMALL_KV_CACHE)
    before = call_or_fail(small, "metrics", timeout_s=call_timeout_s)
    preempted_outs = sample(small)
    preempted = compare.counter_delta("vllm:num_preemptions", before,
                                      call_or_fail(small, "metrics", timeout_s=call_timeout_s), minimum=1)
    restarted = sample(engines.get(seed=12345))  # another global seed: a second start of the same config
    noise, noise_limit = sampling.flip_noise(tolerance[0])
    problems = _short(max_tokens, [*want, *preempted_outs, *restarted])
    for where, outs in (("preempted", preempted_outs), ("engine started again", restarted)):
        problems += [f"request {i} ({where}): {why}" for i, (a, b) in enumerate(zip(want, outs))
                     if (why := sampling.flip_explained(a, b, 1.0, noise))]
    record_figure("largest_flip_gap_move", sampling.largest_flip_move(
        [*zip(want, preempted_outs), *zip(want, restarted)], 1.0))
    record_limit(record_figure, "largest_flip_gap_move", noise_limit)
    record_figure("requests_compared", float(len(reqs)))
    record_figures(record_figure, preempted)
    preempted.raise_if_failed()
    if problems:
        fail("; ".join(problems))

