"""vLLM's OpenAI-compatible server: the API a user serves gpt-oss through, the prompt ids it feeds
the model for a chat (against openai-harmony) and the tokens it stops on. One server per session."""

import pytest

from conformance.verdicts import harmony
from conformance.verdicts import server_probes as probes
from conformance.verdicts.verdict import fail, record_figures

AREA = "serving"
CASES = harmony.load_cases()
CHAT = [{"role": "user", "content": "Say something."}]


def _record(probe, record_figure):
    record_figures(record_figure, probe)


@pytest.mark.p0
def test_server_starts_and_serves_chat(server, server_call_timeout_s, record_figure):
    """`vllm serve` starts on loopback, /health and /v1/models answer, and a chat completion returns.

    Catches: a server that cannot start on this stack (CLI metadata, wrong ISA library, missing
    tokenizer or harmony vocabulary), a model that is not listed, and chat requests refused with 400.
    Reference: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
    Controls: tests/controls/test_server_controls.py::test_chat_check_fails_on_an_empty_reply
    """
    if server.start_seconds is not None:
        record_figure("server_start_s", server.start_seconds)
    probes.health_and_models(server.client, server.model).raise_if_failed()
    probe, _ = probes.chat(server.client, {"model": server.model, "messages": CHAT, "max_tokens": 4},
                           server_call_timeout_s)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
def test_server_completions_tokenize_like_o200k(server, o200k_harmony, tokenizer_facts, server_call_timeout_s,
                                                record_figure):
    """/v1/completions on a text prompt: the prompt ids the server used are o200k_harmony's, every
    requested token comes back, and the returned text is the decode of the returned ids.

    Catches: a server whose tokenizer differs from the model's (wrong tokenizer dir or revision),
    lost or extra tokens, and detokenisation that garbles multi-byte characters.
    Reference: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html (extra parameters)
    Controls: tests/controls/test_server_controls.py::test_completions_check_fails_on_other_prompt_ids
    """
    prompt = "Tokens 🚀 and 日本語, numbers 12345:"
    res = server.client.post("/v1/completions", {
        "model": server.model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True}, timeout_s=server_call_timeout_s)
    if res.status != 200:
        fail(f"HTTP {res.status}: {res.body[:300]!r}")
    record_figure("completion_latency_s", res.seconds)
    choice = res.json()["choices"][0]
    want = o200k_harmony.encode(prompt)
    if choice.get("prompt_token_ids") != want:
        fail(f"the server tokenized {prompt!r} as {choice.get('prompt_token_ids')}, o200k_harmony gives {want}")
    ids = choice.get("token_ids") or []
    if len(ids) != 8:
        fail(f"{len(ids)} of 8 tokens came back: {ids}")
    # the server skips special tokens when it detokenizes (skip_special_tokens defaults to true)
    decoded = o200k_harmony.decode([t for t in ids if t < int(tokenizer_facts["mergeable_ranks"])])
    if choice["text"] != decoded:
        fail(f"text {choice['text']!r} is not the decode of its ids {decoded!r}")


@pytest.mark.p1
def test_server_chat_plain_and_streaming_agree(server, server_call_timeout_s, record_figure):
    """A greedy chat completion, plain and streamed: both well formed, streamed as SSE chunks ending in
    [DONE] with usage, and the streamed text equal to the plain text.

    Catches: streaming that drops or duplicates deltas, a missing finish_reason or usage chunk, a
    stream that never sends [DONE] (clients hang), wrong content type.
    Reference: https://platform.openai.com/docs/api-reference/chat/streaming
    Controls: tests/controls/test_server_controls.py::test_streaming_check_fails_when_the_stream_differs,
      tests/controls/test_server_controls.py::test_streaming_check_fails_when_both_replies_are_empty
    """
    body = {"model": server.model, "messages": CHAT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    plain, data = probes.chat(server.client, body, server_call_timeout_s)
    streamed, text = probes.streamed_chat(server.client, body, server_call_timeout_s)
    _record(plain, record_figure)
    _record(streamed, record_figure)
    plain.raise_if_failed()
    streamed.raise_if_failed()
    content = data["choices"][0]["message"].get("content") or ""
    if text != content:
        fail(f"streamed text {text!r} differs from the plain reply {content!r}")
    if not text:
        fail("the plain and streamed replies agree only in being empty: 12 tokens were asked for, no text came")


@pytest.mark.p1
def test_server_metrics_expose_kv_and_queue_series(server, record_figure):
    """/metrics serves the Prometheus series an operator alerts on: KV-cache usage (0..1) and the
    running / waiting request gauges, labelled with the served model.

    Catches: metrics renamed or dropped in a vLLM upgrade (alerts silently stop firing), values out of range.
    Reference: docs/vllm-cpu.md "Gotchas" 7; https://docs.vllm.ai/en/latest/usage/metrics.html
    Controls: tests/controls/test_server_controls.py::test_metrics_check_fails_on_missing_series
    """
    probe = probes.metrics(server.client, server.model)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
def test_server_requires_api_key(server):
    """With an API key configured, /v1/models, /v1/completions and /v1/chat/completions answer 401
    without it and 200 with it.

    Catches: a server that ignores --api-key (an open endpoint on a shared host), or rejects the right key.
    Reference: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html (--api-key)
    Controls: tests/controls/test_server_controls.py::test_api_key_check_fails_on_a_server_that_ignores_the_key
    """
    if not server.api_key:
        pytest.skip("no API key is configured for this server (set CONFORMANCE_SERVER_API_KEY)")
    probes.api_key_enforced(server.client, server.model).raise_if_failed()


@pytest.mark.p1
def test_server_rejects_oversized_prompt(server, record_figure):
    """A prompt longer than the server's max_model_len is refused with HTTP 400 within seconds.

    Catches: over-long prompts that crash the engine, hang, come back as 500, or are silently truncated.
    Reference: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
    Controls: tests/controls/test_server_controls.py::test_oversized_prompt_check_fails_when_the_server_accepts_it
    """
    limit = probes.max_model_len(server.client, server.model)
    if not limit:
        fail("/v1/models does not say the model's max_model_len")
    probe = probes.oversized_prompt_rejected(server.client, server.model, limit)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
def test_server_rejects_malformed_bodies(server, record_figure):
    """A request body that is not valid UTF-8, or JSON cut off mid-string, is refused with a client
    error (400/422) within seconds, and /health still answers 200 afterwards.

    Catches: a decode error in the API server that becomes a 500, hangs the request, or takes the
    server down for every other client.
    Reference: https://www.rfc-editor.org/rfc/rfc8259#section-8.1 (JSON between systems is UTF-8);
      https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
    Controls: tests/controls/test_server_controls.py::test_malformed_body_check_fails_when_the_server_crashes
    """
    probe = probes.malformed_bodies_rejected(server.client, server.model)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
def test_server_responses_api(server, server_call_timeout_s, record_figure):
    """/v1/responses, plain and streamed, greedy and cut off by max_output_tokens: a message with text,
    status "incomplete" with reason max_output_tokens, consistent usage, and a stream whose deltas,
    output_text.done and final response carry the plain reply's text.

    Catches: a Responses endpoint that drops or duplicates streamed text, reports the final response
    without its output, miscounts usage, or hides that the reply was cut off.
    Reference: https://platform.openai.com/docs/api-reference/responses ;
      https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
    Controls: tests/controls/test_server_controls.py::test_responses_check_fails_on_a_stream_that_drops_text
    """
    probe = probes.responses_api(server.client, server.model, 16, server_call_timeout_s)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
def test_server_responses_stream_ends_with_its_status(server, server_call_timeout_s, record_figure):
    """A streamed response cut off by max_output_tokens ends with `response.incomplete`, the event of
    its final status, not `response.completed`.

    Catches: streams whose terminal event says "completed" for a truncated reply, so clients (and
    gateways translating to finish_reason) report a cut-off answer as a normal one.
    Reference: https://platform.openai.com/docs/api-reference/responses-streaming/response/incomplete
    Controls: tests/controls/test_server_controls.py::test_responses_terminal_event_check_fails_on_completed
    """
    probe = probes.responses_terminal_event(server.client, server.model, 16, server_call_timeout_s)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
def test_server_concurrent_clients_succeed(server, server_call_timeout_s, record_figure):
    """Eight clients at once each get all 16 tokens they asked for.

    Catches: scheduler or batching failures under concurrency (500s, truncated replies, deadlocks).
    Reference: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
    Controls: tests/controls/test_server_controls.py::test_concurrent_check_fails_when_clients_get_fewer_tokens
    """
    probe = probes.concurrent_completions(server.client, server.model, 8, 16, server_call_timeout_s)
    _record(probe, record_figure)
    probe.raise_if_failed()


@pytest.mark.p1
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_server_prompt_matches_harmony(case, server, harmony_encoding, server_call_timeout_s):
    """The token ids the server feeds the model for a chat request equal openai-harmony's rendering.

    Catches: reasoning_effort ignored or written `reasoning: low`, instructions in the wrong message,
    history turns ending in <|return|>, tool calls without `<|constrain|>json` — docs/failure-modes.md,
    modes 10 and 11: the model is served prompts it was never trained on.
    Reference: docs/failure-modes.md, modes 10-11; https://github.com/openai/harmony
    Controls: tests/controls/test_server_controls.py::test_prompt_rendering_check_fails_on_a_prompt_unlike_harmony
    """
    res = server.client.post("/v1/chat/completions", case.request(server.model) | {
        "max_tokens": 1, "return_token_ids": True}, timeout_s=server_call_timeout_s)
    if res.status != 200:
        fail(f"HTTP {res.status}: {res.body[:300]!r}")
    got = res.json().get("prompt_token_ids")
    date = server.date or (got and harmony.date_of(got, harmony_encoding)) or harmony.today()
    want = harmony.render_reference(case, harmony_encoding, date)
    harmony.compare_rendering(case.name, "server prompt", got, want, harmony_encoding).raise_if_failed()


@pytest.mark.p1
def test_server_stops_on_harmony_stop_tokens(server, tokenizer_facts, server_call_timeout_s):
    """Made to emit it first, <|return|> 200002 and <|call|> 200012 each end the assistant turn;
    <|end|> 200007 does not.

    Catches: docs/failure-modes.md, mode 12 — a server that stops on <|end|> cuts every reply after its
    analysis channel; one that ignores <|call|> runs tool calls on into garbage.
    Reference: docs/failure-modes.md, mode 12; https://github.com/openai/harmony
    Controls: tests/controls/test_server_controls.py::test_stop_token_check_fails_on_a_server_that_stops_on_end
    """
    probes.stop_tokens(server.client, server.model, list(tokenizer_facts["stop_tokens"]),
                       list(tokenizer_facts["not_stop_tokens"]), server_call_timeout_s).raise_if_failed()
