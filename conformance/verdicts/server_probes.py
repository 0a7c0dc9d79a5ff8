"""What the server checks ask an OpenAI-compatible server, and how they judge the answers: each
probe takes a client and returns a `VerdictReport` with the problems found and the figures measured, so a
check and its negative control (a deliberately broken server) run exactly the same code."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conformance.engines import openai_api, prom_metrics
from conformance.engines.vllm_server import ServerClient, ServerError
from conformance.verdicts.compare import VerdictReport
from conformance.verdicts.harmony import StopObservation, stop_token_verdict

# The series an operator alerts on (docs/vllm-cpu.md "Gotchas" 7: the same names in-process and in Prometheus).
METRIC_SERIES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
# An oversized prompt must be refused before it reaches the engine: this long at most.
REJECT_WITHIN_S = 10.0


def _error_text(body: Any) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    return str(err.get("message") if isinstance(err, dict) else err or body)[:300]


def health_and_models(client: ServerClient, model: str) -> VerdictReport:
    probe = VerdictReport("/health and /v1/models")
    health = client.get("/health")
    if health.status != 200:
        probe.problems.append(f"/health answered HTTP {health.status}, not 200")
    models = client.get("/v1/models")
    if models.status != 200:
        probe.problems.append(f"/v1/models answered HTTP {models.status}: {_error_text(models.json())}")
        return probe
    ids = [m.get("id") for m in models.json().get("data", [])]
    if model not in ids:
        probe.problems.append(f"/v1/models lists {ids}, not the served model {model!r}")
    return probe


def max_model_len(client: ServerClient, model: str) -> int | None:
    for m in client.get("/v1/models").json().get("data", []):
        if m.get("id") == model and isinstance(m.get("max_model_len"), int):
            return int(m["max_model_len"])
    return None


def chat(client: ServerClient, body: dict, timeout_s: float) -> tuple[VerdictReport, dict]:
    """One non-streaming chat completion; problems if it is not a well-formed 200."""
    probe = VerdictReport("/v1/chat/completions")
    res = client.post("/v1/chat/completions", body, timeout_s=timeout_s)
    data = res.json()
    probe.measured["chat_latency_s"] = res.seconds
    if res.status != 200:
        probe.problems.append(f"HTTP {res.status}: {_error_text(data)}")
        return probe, data
    probe.problems += openai_api.body_problems("chat.completion", data)
    choices = data.get("choices") or []
    if len(choices) != 1 or not isinstance((choices[0].get("message") or {}).get("content"), (str, type(None))):
        probe.problems.append(f"expected one choice with a message, got {str(choices)[:200]}")
    usage = data.get("usage") or {}
    if not usage.get("prompt_tokens") or usage.get("completion_tokens") is None:
        probe.problems.append(f"usage is missing or empty: {usage}")
    elif body.get("max_tokens", 1) > 0 and not usage.get("completion_tokens"):
        probe.problems.append("the reply has 0 completion tokens: nothing was generated")
    message = (choices[0].get("message") or {}) if len(choices) == 1 else {}
    if choices and not any(message.get(k) for k in ("content", "reasoning", "reasoning_content", "tool_calls")):
        probe.problems.append("the reply is empty: no content, reasoning or tool call (content null)")
    return probe, data


def streamed_chat(client: ServerClient, body: dict, timeout_s: float) -> tuple[VerdictReport, str]:
    """A streaming chat completion: SSE chunks, a finish reason, usage, and [DONE] last."""
    probe = VerdictReport("/v1/chat/completions stream=true")
    head, events = client.stream("/v1/chat/completions", body | {"stream_options": {"include_usage": True}},
                                 timeout_s=timeout_s)
    probe.measured["stream_events"] = float(len(events))
    if head.status != 200:
        probe.problems.append(f"HTTP {head.status}: {head.body[:300]!r}")
        return probe, ""
    if not head.headers.get("content-type", "").startswith("text/event-stream"):
        probe.problems.append(f"content-type is {head.headers.get('content-type')!r}, not text/event-stream")
    if not events or events[-1] != "[DONE]":
        probe.problems.append(f"the stream did not end with data: [DONE] (last event {str(events[-1:])[:100]})")
    chunks = [e for e in events if isinstance(e, dict)]
    if any(c.get("object") != "chat.completion.chunk" for c in chunks):
        probe.problems.append("an event is not a chat.completion.chunk")
    # the SDK's type for every chunk; the first chunk unlike it is reported
    probe.problems += next((bad for i, c in enumerate(chunks)
                            if (bad := openai_api.body_problems("chat.completion.chunk", c, f"chunk {i}"))), [])
    text = "".join((ch.get("delta") or {}).get("content") or "" for c in chunks for ch in c.get("choices") or [])
    finishes = [ch.get("finish_reason") for c in chunks for ch in c.get("choices") or [] if ch.get("finish_reason")]
    if len(finishes) != 1:
        probe.problems.append(f"expected one finish_reason in the stream, got {finishes}")
    usage = next((c["usage"] for c in chunks if c.get("usage")), None)
    if not usage:
        probe.problems.append("no usage chunk although stream_options.include_usage was set")
    else:
        probe.measured["stream_completion_tokens"] = float(usage.get("completion_tokens", -1))
    return probe, text


def metrics(client: ServerClient, model: str) -> VerdictReport:
    probe = VerdictReport("/metrics")
    res = client.get("/metrics")
    if res.status != 200:
        probe.problems.append(f"/metrics answered HTTP {res.status}")
        return probe
    try:
        samples = prom_metrics.parse(res.body.decode("utf-8", "replace"), res.headers.get("content-type", ""))
    except prom_metrics.MetricsError as exc:
        probe.problems.append(str(exc))
        return probe
    for series in METRIC_SERIES:
        mine = prom_metrics.values(samples, series, {"model_name": model})
        if not mine:
            probe.problems.append(f"no {series} series for model_name={model!r}")
            continue
        probe.measured[series.removeprefix("vllm:")] = mine[0]
        if series.endswith("_perc") and not 0.0 <= mine[0] <= 1.0:
            probe.problems.append(f"{series} = {mine[0]} is outside 0..1")
        elif mine[0] < 0:
            probe.problems.append(f"{series} = {mine[0]} is negative")
    return probe


def api_key_enforced(client: ServerClient, model: str) -> VerdictReport:
    """Without the key every /v1 endpoint answers 401; with it, 200."""
    probe = VerdictReport("API key")
    requests = (("GET", "/v1/models", None),
                ("POST", "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1}),
                ("POST", "/v1/chat/completions", {"model": model, "max_tokens": 1,
                                                  "messages": [{"role": "user", "content": "Hi"}]}))
    for method, path, body in requests:
        without = client.request(method, path, body, key=False)
        if without.status != 401:
            probe.problems.append(f"{method} {path} without the API key answered HTTP {without.status}, not 401")
        with_key = client.request(method, path, body)
        if with_key.status != 200:
            probe.problems.append(f"{method} {path} with the API key answered HTTP {with_key.status}, not 200")
    return probe


def oversized_prompt_rejected(client: ServerClient, model: str, limit: int) -> VerdictReport:
    """A prompt longer than max_model_len gets a 400 at once, not a hang or a 500."""
    probe = VerdictReport(f"prompt of {limit + 16} tokens against max_model_len {limit}")
    res = client.post("/v1/completions", {"model": model, "prompt": [13] * (limit + 16), "max_tokens": 4},
                      timeout_s=60.0)
    probe.measured["reject_s"] = res.seconds
    if res.status != 400:
        probe.problems.append(f"HTTP {res.status}, not 400: {res.body[:200]!r}")
    if res.seconds > REJECT_WITHIN_S:
        probe.problems.append(f"the refusal took {res.seconds:.1f} s (limit {REJECT_WITHIN_S:.0f} s)")
    return probe


# Bodies that are not UTF-8 JSON (RFC 8259 section 8.1); %s is the model name as a JSON string.
MALFORMED_BODIES = {
    "invalid UTF-8 inside a JSON string": b'{"model": %s, "prompt": "caf\xc3\x28 \xff\xfe", "max_tokens": 4}',
    "JSON cut off mid-string": b'{"model": %s, "prompt": "Hello',
}
# A refusal: vLLM answers 400 for these; FastAPI's default for a body it cannot parse is 422.
CLIENT_ERRORS = (400, 422)


def malformed_bodies_rejected(client: ServerClient, model: str) -> VerdictReport:
    """Each malformed body gets a client error at once, and the server is healthy afterwards."""
    probe = VerdictReport("malformed request bodies")
    name = json.dumps(model).encode()
    for what, template in MALFORMED_BODIES.items():
        res = client.post("/v1/completions", template % name, timeout_s=60.0)
        probe.measured["reject_s"] = max(probe.measured.get("reject_s", 0.0), res.seconds)
        if res.status not in CLIENT_ERRORS:
            probe.problems.append(f"{what}: HTTP {res.status}, not one of {CLIENT_ERRORS}: {res.body[:200]!r}")
        if res.seconds > REJECT_WITHIN_S:
            probe.problems.append(f"{what}: the refusal took {res.seconds:.1f} s (limit {REJECT_WITHIN_S:.0f} s)")
    health = client.get("/health")
    if health.status != 200:
        probe.problems.append(f"after the malformed bodies /health answered HTTP {health.status}, not 200")
    return probe


def _response_text(response: dict) -> str:
    return "".join(part.get("text", "") for item in response.get("output") or [] if item.get("type") == "message"
                   for part in item.get("content") or [] if part.get("type") == "output_text")


def _responses_request(model: str, max_output_tokens: int) -> dict:
    """A greedy /v1/responses request that the token limit cuts off."""
    return {"model": model, "input": "Say hello.", "max_output_tokens": max_output_tokens, "temperature": 0}


def responses_api(client: ServerClient, model: str, max_output_tokens: int, timeout_s: float) -> VerdictReport:
    """/v1/responses plain and streamed, greedy, cut off by max_output_tokens: a message with text, the
    status and usage that say it was cut off, and a stream that starts with response.created and whose
    deltas, output_text.done and final response all carry the plain reply's text."""
    probe = VerdictReport("/v1/responses")
    body = _responses_request(model, max_output_tokens)
    res = client.post("/v1/responses", body, timeout_s=timeout_s)
    probe.measured["responses_latency_s"] = res.seconds
    if res.status != 200:
        probe.problems.append(f"plain: HTTP {res.status}, not 200: {_error_text(res.json())}")
        return probe
    plain = res.json()
    probe.problems += openai_api.body_problems("response", plain, "plain")
    text, usage = _response_text(plain), plain.get("usage") or {}
    if plain.get("object") != "response" or not text:
        probe.problems.append(f"plain: object {plain.get('object')!r} with output text {text!r}: want a response "
                              "with a message")
    out_tokens = int(usage.get("output_tokens", -1))
    if not 0 < out_tokens <= max_output_tokens:
        probe.problems.append(f"plain: usage.output_tokens {out_tokens} outside 1..{max_output_tokens}")
    if usage.get("total_tokens") != usage.get("input_tokens", 0) + out_tokens:
        probe.problems.append(f"plain: usage total_tokens {usage.get('total_tokens')} != input + output")
    reason = (plain.get("incomplete_details") or {}).get("reason")
    if out_tokens == max_output_tokens and (plain.get("status"), reason) != ("incomplete", "max_output_tokens"):
        probe.problems.append(f"plain: stopped by max_output_tokens but status {plain.get('status')!r}, "
                              f"incomplete_details.reason {reason!r}")

    head, events = client.stream("/v1/responses", body, timeout_s=timeout_s)
    kinds = [e.get("type") for e in events if isinstance(e, dict)]
    if head.status != 200 or not kinds:
        probe.problems.append(f"stream: HTTP {head.status} with {len(kinds)} events")
        return probe
    probe.measured["responses_stream_events"] = float(len(kinds))
    if kinds[0] != "response.created":
        probe.problems.append(f"stream: first event {kinds[0]!r}, not response.created")
    deltas = "".join(e.get("delta", "") for e in events if isinstance(e, dict)
                     and e.get("type") == "response.output_text.delta")
    done = [e.get("text") for e in events if isinstance(e, dict) and e.get("type") == "response.output_text.done"]
    final = events[-1].get("response", {}) if isinstance(events[-1], dict) else {}
    probe.problems += openai_api.body_problems("response", final, "stream: the final response")
    for what, got in (("the deltas", deltas), ("output_text.done", done[0] if done else None),
                      ("the final response", _response_text(final))):
        if got != text:
            probe.problems.append(f"stream: {what} give {got!r}, the plain reply {text!r}")
    return probe


# The stream's last event by the response's final status (OpenAI Responses streaming events).
TERMINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "failed": "response.failed"}


def responses_terminal_event(client: ServerClient, model: str, max_output_tokens: int,
                             timeout_s: float) -> VerdictReport:
    """A stream cut off by max_output_tokens ends with the event of its final status."""
    probe = VerdictReport("/v1/responses stream terminal event")
    body = _responses_request(model, max_output_tokens)
    head, events = client.stream("/v1/responses", body, timeout_s=timeout_s)
    last = next((e for e in reversed(events) if isinstance(e, dict)), None)
    if head.status != 200 or last is None:
        probe.problems.append(f"stream: HTTP {head.status} with no events")
        return probe
    status = (last.get("response") or {}).get("status")
    want = TERMINAL_EVENTS.get(status)
    probe.measured["responses_stream_events"] = float(len(events))
    if want is None:
        probe.problems.append(f"the last event {last.get('type')!r} carries no final status (status {status!r})")
    elif last.get("type") != want:
        probe.problems.append(f"the response ended {status!r} but the stream's last event is {last.get('type')!r}, "
                              f"not {want!r}: clients that read the event type miss the cut-off")
    return probe


def concurrent_completions(client: ServerClient, model: str, clients: int, max_tokens: int,
                           timeout_s: float) -> VerdictReport:
    """`clients` simultaneous completions all succeed with every token they asked for."""
    probe = VerdictReport(f"{clients} concurrent clients")

    def one(i: int) -> tuple[int, int, str]:
        body = {"model": model, "prompt": f"Client {i} says:", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}
        try:
            res = client.post("/v1/completions", body, timeout_s=timeout_s)
        except ServerError as exc:
            return -1, 0, str(exc)
        if res.status != 200:
            return res.status, 0, res.body[:200].decode("utf-8", "replace")
        data = res.json()
        return res.status, (data.get("usage") or {}).get("completion_tokens", 0), "; ".join(
            openai_api.body_problems("text_completion", data))

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, range(clients)))
    wall = time.perf_counter() - started
    for i, (status, n, err) in enumerate(results):
        if status != 200 or n != max_tokens or err:
            probe.problems.append(f"client {i}: HTTP {status}, {n}/{max_tokens} tokens {err}")
    probe.measured |= {"concurrent_wall_s": wall, "concurrent_output_tokens_per_s": clients * max_tokens / wall}
    return probe


def stop_tokens(client: ServerClient, model: str, stop: list[int], not_stop: list[int],
                timeout_s: float) -> VerdictReport:
    """Make the model emit each token first (logit_bias) and see whether the server ends the turn."""
    probe = VerdictReport("assistant stop tokens")
    observed = []
    for token in [*stop, *not_stop]:
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "temperature": 0, "logit_bias": {str(token): 100}, "return_token_ids": True}
        res = client.post("/v1/chat/completions", body, timeout_s=timeout_s)
        if res.status != 200:
            probe.problems.append(f"token {token}: HTTP {res.status}: {_error_text(res.json())}")
            continue
        choice = (res.json().get("choices") or [{}])[0]
        ids = choice.get("token_ids")
        if ids is None:
            probe.problems.append("the server returns no token_ids (return_token_ids): stop tokens unobservable")
            continue
        observed.append(StopObservation(token, choice.get("finish_reason"), list(ids)))
    probe.problems += stop_token_verdict(observed, stop, not_stop)
    return probe
