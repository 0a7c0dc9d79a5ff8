"""P3 reliability: a soak with leak detection, randomized request mixes, and fault injection."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from conformance.engines.worker import EngineError
from conformance.run import run_target
from conformance.verdicts import reliability
from conformance.verdicts.verdict import Problems, fail, record_figures

AREA = "reliability"


@pytest.mark.p3
@pytest.mark.needs("scheduler", "paged_kv")
def test_soak_no_growth(engine, model_under_test, call_timeout_s, record_figure, target):
    """Rounds of mixed-length requests: engine RSS, VRAM (GPU), open file descriptors and KV blocks in use after
    each round must not grow beyond bounds kept as data once the warm-up rounds are over.

    Catches: memory leaks in the engine (Python objects per request, pinned buffers), file-descriptor
    leaks (sockets, shared memory), KV blocks never returned — failures that only show after hours.
    Reference: https://docs.vllm.ai/en/latest/design/paged_attention.html ; docs/architecture.md "Tiers"
    Limits: targets.toml [soak] warmup_rounds, max_rss_growth_mib, max_fd_growth, max_vram_growth_mib
    Controls: tests/controls/test_reliability_controls.py::test_soak_check_fails_on_growing_memory
    """
    cfg = run_target.data()["soak"]  # suite-wide, not the target's
    vocab = int(model_under_test.config["vocab_size"])
    samples = []
    for r in range(cfg["rounds"]):
        prompts = [[(r * 31 + i * 7 + j) % (vocab - 8) for j in range(5 + 37 * i)]
                   for i in range(cfg["prompts_per_round"])]
        engine.call("generate_greedy", prompts, 8, 1, timeout_s=call_timeout_s)
        usage = engine.call("components:process_usage", timeout_s=call_timeout_s)
        samples.append(usage | {"kv_used": float(engine.call("kv_state", timeout_s=call_timeout_s).used_blocks)})
    vram = cfg["max_vram_growth_mib"] if target.needs_device else None
    report = reliability.soak_verdict(samples, cfg["warmup_rounds"], cfg["max_rss_growth_mib"], cfg["max_fd_growth"],
                                      vram)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p3
@pytest.mark.needs("scheduler", "sampling", "paged_kv")
def test_randomized_request_mixes_keep_invariants(engine, model_under_test, call_timeout_s, record_figure):
    """Hypothesis draws request mixes (lengths, max_tokens, stop tokens, temperature/top-p/top-k, seeds,
    batch sizes); every request finishes with a well-formed output and every KV block is free after.

    Catches: scheduler crashes on unusual mixes, sampling kernels producing out-of-vocab ids, stop
    handling off by one, leaks that only some parameter combinations trigger.
    Reference: https://hypothesis.readthedocs.io/ ; https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html
    Controls: tests/controls/test_reliability_controls.py::test_random_mix_check_fails_on_out_of_vocab_samples
    """
    vocab = int(model_under_test.config["vocab_size"])
    # the engine's own limit, whatever the target (the table of one target does not describe another's engine)
    max_len = int(engine.call("scheduler_limits", timeout_s=call_timeout_s)["max_model_len"])
    runs = {"n": 0}
    request = st.fixed_dictionaries({
        "prompt": st.lists(st.integers(0, vocab - 9), min_size=1, max_size=300),
        "params": st.fixed_dictionaries({
            "max_tokens": st.integers(1, 24),
            "temperature": st.sampled_from([0.0, 0.7, 1.0, 1.5]),
            "top_p": st.sampled_from([1.0, 0.9, 0.5]),
            "top_k": st.sampled_from([-1, 1, 5, 50]),
            "seed": st.integers(0, 2**31 - 1),
            "stop_token_ids": st.lists(st.integers(0, vocab - 9), max_size=3),
        }),
    })

    @hsettings(max_examples=run_target.data()["random_mix"]["max_examples"], deadline=None, database=None,
               suppress_health_check=list(HealthCheck))
    @given(st.lists(request, min_size=1, max_size=6))
    def mix(requests: list[dict]) -> None:
        runs["n"] += 1
        for req in requests:  # one SamplingParams per call; requests of a mix still share the scheduler
            out = engine.call("components:generate", [req["prompt"]], req["params"], timeout_s=call_timeout_s)[0]
            problems = reliability.output_problems(out, len(req["prompt"]), req["params"], vocab, max_len)
            if problems:
                fail(f"{problems} for {req['params']} and a {len(req['prompt'])}-token prompt")
        if engine.call("kv_state", timeout_s=call_timeout_s).used_blocks != 0:
            fail("KV blocks left in use")

    mix()
    record_figure("examples", runs["n"])


@pytest.mark.p3
def test_engine_killed_mid_request_is_reported_promptly(engines, prompts, record_figure):
    """Fault injection: the engine process is killed while it serves a long request; the client must
    get an error naming the death within seconds, not hang, and the run goes on.

    Catches: clients that wait forever on a dead engine (a hung CI job instead of a red one), errors
    that lose the cause (signal, last output).
    Reference: docs/architecture.md "Rule 7: isolation"; https://docs.python.org/3/library/multiprocessing.html
    Controls:
      tests/controls/test_reliability_controls.py::test_engine_kill_check_fails_when_the_request_succeeds_after_the_kill
    """
    victim = engines.get(seed=12345)  # its own engine: the shared one must survive
    result: dict = {}
    # as long as the engine's options allow (ignore_eos), at least 200: a GPU serves 300 requests of 200 tokens
    # within the second before the kill; an engine without max_model_len (transformers) keeps 200
    limit = engines.options(seed=12345).get("max_model_len")
    max_tokens = max(200, int(limit) - max(map(len, prompts.prompts))) if limit else 200

    def long_call() -> None:
        started = time.perf_counter()
        try:
            victim.call("generate_greedy", prompts.prompts * 50, max_tokens, 1, timeout_s=120)
            result["error"] = None
        except EngineError as exc:
            result["error"] = str(exc)
        result["seconds"] = time.perf_counter() - started

    worker = threading.Thread(target=long_call)
    worker.start()
    time.sleep(1.0)
    killed_at = time.perf_counter()
    victim.kill()
    worker.join(60)
    record_figure("seconds_to_error", time.perf_counter() - killed_at)
    if worker.is_alive():
        fail("the client was still waiting 60 s after the engine died")
    if not result.get("error"):
        fail("the request 'succeeded' although its engine was killed")
    if not ("died" in result["error"] or "not running" in result["error"]):
        fail(result["error"])
    if not Path(victim.log_path).exists():
        fail(f"the killed engine left no log at {victim.log_path}")


@pytest.mark.p3
@pytest.mark.needs("server_process")
def test_server_killed_mid_stream_is_reported_promptly(target, run_dir, served_model, o200k_vocab, engines,
                                                       record_figure):
    """Fault injection: the server's whole process group is killed while it streams a long completion;
    the streaming client must end with an error within seconds, never hang or report success.

    Catches: clients (and the suite's own probes) that block forever on a half-open stream, a stream
    that ends "cleanly" without [DONE] after a crash and is taken as a complete reply.
    Reference: https://html.spec.whatwg.org/multipage/server-sent-events.html ; docs/architecture.md "Rule 7: isolation"
    Controls: tests/controls/test_reliability_controls.py::test_server_kill_check_fails_when_its_server_cannot_start
    """
    from conformance.engines.vllm_server import ServerError, _signal_group
    from conformance.run.serving_fixtures import new_server

    proc = new_server(target, served_model, o200k_vocab.parent, run_dir / "vllm-server-fault.log")
    engines.hold("vllm-server-fault", engines.share_of(proc.options))  # its share of the device, beside the others
    try:
        proc.start()
    except ServerError as exc:
        engines.hold("vllm-server-fault", None)
        fail(str(exc))
    import http.client
    import json

    body = {"model": served_model.name, "prompt": "Count:", "max_tokens": 900, "ignore_eos": True,
            "temperature": 0.0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
    events, error = [], None
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {proc.api_key}"})
        resp = conn.getresponse()
        for line in resp:  # read until the stream is surely under way, then kill the server
            if line.startswith(b"data:"):
                events.append(line.strip())
            if len(events) == 3:
                break
        killed_at = time.perf_counter()
        _signal_group(proc._proc.pid, 9)  # SIGKILL to the API server and its engine core
        try:
            for line in resp:
                if line.startswith(b"data:"):
                    events.append(line.strip())
        except (OSError, http.client.HTTPException) as exc:
            error = f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - killed_at
    finally:
        conn.close()
        proc.close(grace_s=5)
        engines.hold("vllm-server-fault", None)
    record_figure("seconds_to_error", seconds)
    record_figure("events_before_end", len(events))
    problems = reliability.killed_stream_problems(events, seconds, limit_s=30.0)
    Problems(problems, note=f" ({error})" if error else "").raise_if_failed()
