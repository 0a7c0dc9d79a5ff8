"""What a request promises an OpenAI-API client of vLLM's server: stop strings end the text before
them, streamed or not; max_tokens is exact; usage adds up and streams alike; n choices are n separate replies,
whatever else the server is serving. Asked of the suite's one server (conformance/run/serving_fixtures.py)."""

import pytest

from conformance.verdicts import server_requests
from conformance.verdicts.verdict import record_figures

AREA = "serving"


@pytest.mark.p1
@pytest.mark.needs("server")
def test_server_stop_strings_end_the_text(server, server_call_timeout_s, record_figure):
    """A greedy /v1/completions reply, then the same request with a 2-3 character stop string taken from that
    reply across a token boundary (beside one that never occurs), plain and streamed: the text is the first
    reply cut before the stop string (up to its end with include_stop_str_in_output), finish_reason is "stop",
    and the streamed text equals the plain text byte for byte.

    Catches: a stop string left in the returned text, a stop matched only inside one token's text (missed where
    it spans two), a streamed reply that emits the held-back characters of a partial stop match, or cuts
    elsewhere than the plain one, and a finish_reason of "length" for a reply a stop string ended.
    Reference: https://platform.openai.com/docs/api-reference/completions/create (stop);
      https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html (include_stop_str_in_output);
      docs/verdicts.md "Response fields and stop strings"
    Controls: tests/controls/test_server_responses_controls.py::test_stop_check_fails_when_the_stop_string_is_kept,
      tests/controls/test_server_responses_controls.py::test_stop_check_fails_when_the_stream_differs
    """
    probe = server_requests.stop_strings(server.client, server.model, server_call_timeout_s)
    record_figures(record_figure, probe)
    probe.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("server")
def test_server_max_tokens_is_exact(server, server_call_timeout_s, record_figure):
    """max_tokens 1 and 7, greedy with EOS ignored, on /v1/completions and /v1/chat/completions, plain and
    streamed: usage.completion_tokens equals max_tokens and finish_reason is "length".

    Catches: a token limit applied off by one (the API's max_tokens against the engine's count), usage that
    counts other tokens than those generated, and a cut-off reply reported as finished ("stop").
    Reference: https://platform.openai.com/docs/api-reference/chat/create (max_tokens, finish_reason);
      https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html (ignore_eos)
    Controls: tests/controls/test_server_responses_controls.py::test_max_tokens_check_fails_when_off_by_one
    """
    probe = server_requests.max_tokens_exact(server.client, server.model, server_call_timeout_s)
    record_figures(record_figure, probe)
    probe.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("server")
def test_server_usage_adds_up_and_streams_alike(server, server_call_timeout_s, record_figure):
    """A seeded sampled request on /v1/completions and /v1/chat/completions, plain and streamed with
    stream_options.include_usage: prompt_tokens + completion_tokens == total_tokens, completion_tokens counts
    the token ids returned, one usage chunk, and the streamed usage and text equal the plain reply's.

    Catches: usage that does not add up (billing and rate limits built on it are wrong), a stream without its
    usage chunk or with another count than the same request unstreamed, and a seed that streaming ignores.
    Reference: https://platform.openai.com/docs/api-reference/chat/object (usage);
      https://platform.openai.com/docs/api-reference/chat/create (stream_options.include_usage, seed)
    Controls: tests/controls/test_server_responses_controls.py::test_usage_check_fails_on_a_wrong_total
    """
    probe = server_requests.usage_consistent(server.client, server.model, server_call_timeout_s)
    record_figures(record_figure, probe)
    probe.raise_if_failed()


@pytest.mark.p1
@pytest.mark.needs("server")
def test_server_n_choices_are_separate(server, server_call_timeout_s, tolerance, record_figure):
    """Four seeded /v1/completions requests with n=3, each sent alone, then all four at once, then the first
    streamed: three choices with indices 0..2, one finish_reason each, usage counting all of them, distinct
    response ids, the same choices alone, among the others and streamed, and not all three alike in every request.
    Among the others a choice may part from the lone one only where the logits moved enough to flip that very draw
    (`sampling.flip_explained`, within the dtype's noise: bf16 kernels on a GPU need not be batch-invariant).

    Catches: a choice dropped or duplicated, n choices drawn as one (one seed for all), replies of concurrent requests
    mixed up (ids repeated, one request's choices in another's response), and seeded replies that depend on what
    else is batched with them.
    Reference: https://platform.openai.com/docs/api-reference/completions/create (n, seed);
      vLLM v1 parallel sampling (vllm/v1/engine/parallel_sampling.py)
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_server_responses_controls.py::test_n_check_fails_when_a_choice_is_missing,
      tests/controls/test_server_responses_controls.py::test_n_check_fails_when_the_choices_are_one_draw,
      tests/controls/test_server_responses_controls.py::test_n_check_fails_when_seeded_draws_depend_on_neighbours
    """
    probe = server_requests.n_choices(server.client, server.model, server_call_timeout_s, tolerance[0])
    record_figures(record_figure, probe)
    probe.raise_if_failed()
