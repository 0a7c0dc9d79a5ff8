"""Negative controls of the P2 serving-performance and graph-mode checks: a regression beyond the
tolerance fails, a figure missing from the benchmark's result fails, failed or short requests fail,
the baseline is the latest passing run of the same lineage and model (never a failed one), and a
token mismatch between graph mode and eager fails. One slow control runs the real `vllm bench serve`
against a loopback stub that returns half the tokens it is asked for."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conformance.engines.base import Completion, StepLogprobs
from conformance.run import run_target
from conformance.verdicts import compare, perf
from conformance.verdicts.limits import limits_for
from reports.history import History

CPU_FP = {"platform": {"accelerator": "none", "cpu_flags": ["avx2"]}, "packages": {"torch": "2.13.0+cpu"}}


CHECK = "conformance/checks/test_serving_perf.py::test_serving_perf_against_baseline[c8]"


PLAN = perf.bench_plan("cpu", 8)


def _bench_json(**overrides: object) -> dict:
    data = {"completed": PLAN.num_prompts, "failed": 0, "total_output_tokens": PLAN.num_prompts * PLAN.output_len,
            "errors": [""] * PLAN.num_prompts}
    data |= {key: 10.0 for key in perf.bench_keys(PLAN.percentiles).values()}
    return data | overrides


def test_bench_plan_sizes_come_from_data():
    assert (PLAN.num_prompts, PLAN.input_len, PLAN.output_len) == (8, 32, 16)
    assert [perf.bench_plan("cuda", c).num_prompts for c in (1, 8, 32, 64)] == [4, 8, 32, 64]  # one wave per level
    assert perf.sweep() == [1, 8, 32, 64]


def test_complete_bench_result_parses_every_figure():
    result = perf.parse_bench_result(_bench_json(), PLAN)
    assert result.ok, result.problems
    assert {"output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms",
            "itl_p99_ms"} <= set(result.measured)


def test_a_real_bench_result_records_its_mean_first_token_time_unjudged():
    """The mean TTFT beside p50 and p99 says how much of a wave waited (a kept H200 run's bench serve JSON); no table
    judges it."""
    from dataclasses import replace

    data = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "h200" /
                       "p2-bf16-cut-off-vllm-0.26.0" / "bench-1024x1024-c8.json").read_text())
    result = perf.parse_bench_result(data, replace(perf.bench_plan("cuda", 8), num_prompts=int(data["completed"])))
    assert result.ok, result.problems
    assert result.measured["ttft_mean_ms"] == data["mean_ttft_ms"] != result.measured["ttft_p50_ms"]
    for target, model in (("cuda", None), ("cuda", "tiny-gpt-oss"), ("cpu", None)):
        assert "ttft_mean_ms" not in {lim.name for lim in perf.regression_limits(target, model)}


def test_missing_figure_in_bench_result_fails():
    data = _bench_json()
    del data["p99_ttft_ms"]
    result = perf.parse_bench_result(data, PLAN)
    assert not result.ok and "p99_ttft_ms" in result.problems[0]
    with pytest.raises(compare.CheckFailed, match="p99_ttft_ms"):
        result.raise_if_failed()


def test_failed_or_short_requests_fail():
    failed = perf.parse_bench_result(_bench_json(completed=6, failed=2, errors=["HTTP 500"] * 2), PLAN)
    assert not failed.ok and "2 failed" in failed.problems[0] and "HTTP 500" in failed.problems[0]
    short = perf.parse_bench_result(_bench_json(total_output_tokens=PLAN.num_prompts * 8), PLAN)
    assert not short.ok and "cut short" in short.problems[0]


def _baseline(**figures: float) -> perf.Baseline:
    return perf.Baseline("run-a", "2026-11-01T00:00:00Z", figures)


def test_regression_beyond_tolerance_fails_and_within_passes():
    limits = perf.regression_limits("cuda")  # the default table: throughput may drop 10 %
    base = _baseline(output_tok_s=1000.0, ttft_p50_ms=100.0, tpot_p50_ms=10.0)
    within = perf.regression_verdict({"output_tok_s": 950.0, "ttft_p50_ms": 110.0, "tpot_p50_ms": 10.4, **{
        lim.name: 1.0 for lim in limits if lim.name not in base.figures}}, base, limits)
    assert within.ok, within.problems
    assert within.measured["output_tok_s_vs_baseline"] == pytest.approx(0.95)
    slow = perf.regression_verdict({"output_tok_s": 850.0, "ttft_p50_ms": 150.0, "tpot_p50_ms": 10.0, **{
        lim.name: 1.0 for lim in limits if lim.name not in base.figures}}, base, limits)
    assert len(slow.problems) == 2, slow.problems
    assert any(p.startswith("output_tok_s regressed") for p in slow.problems)
    assert any(p.startswith("ttft_p50_ms regressed") for p in slow.problems)
    with pytest.raises(compare.CheckFailed, match="must be >= 900"):
        slow.raise_if_failed()


def test_cpu_tolerance_catches_a_collapse_only():
    limits = perf.regression_limits("cpu")
    base = _baseline(output_tok_s=1180.0, ttft_p50_ms=29.0, tpot_p50_ms=5.2, itl_p50_ms=0.0025)
    loaded = {"output_tok_s": 297.0, "ttft_p50_ms": 118.0, "tpot_p50_ms": 20.8, "itl_p50_ms": 16.8}  # measured
    assert perf.regression_verdict(loaded, base, limits).ok
    collapsed = loaded | {"output_tok_s": 100.0}
    assert not perf.regression_verdict(collapsed, base, limits).ok
    stuck = loaded | {"tpot_p50_ms": 60.0}
    assert not perf.regression_verdict(stuck, base, limits).ok


def test_missing_figure_in_this_run_fails_the_comparison():
    limits = perf.regression_limits("cpu")
    base = _baseline(output_tok_s=300.0, ttft_p50_ms=50.0, tpot_p50_ms=14.0)
    verdict = perf.regression_verdict({"output_tok_s": 300.0, "ttft_p50_ms": 50.0}, base, limits)
    assert verdict.problems == ["this run measured no tpot_p50_ms, so it cannot be compared"]


def test_nan_figure_is_a_regression():
    lim = perf.FigureLimit("output_tok_s", "higher", 0.1)
    assert lim.regressed(float("nan"), 100.0) and not lim.regressed(95.0, 100.0)


def _record(run_id: str, started: str, outcome: str, figures: dict, model: str = "tiny-gpt-oss",
            fingerprint: dict = CPU_FP, complete: bool = True, dtype: str = "float32") -> dict:
    summary = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0)
    summary[outcome] = 1
    return {"run_id": run_id, "started_at": started, "finished_at": started, "target": "cpu", "engine": "vllm",
            "dtype": dtype, "profile": "cpu",
            "combo": None, "tiers": ["p2"], "complete": complete, "model": {"name": model, "content_hash": None},
            "fingerprint": fingerprint, "summary": summary,
            "checks": [{"id": CHECK, "tier": "p2", "area": "performance", "outcome": outcome, "duration_s": 1.0,
                        "message": "", "reference": "", "figures": figures}]}


def test_baseline_is_the_latest_passing_run_of_the_lineage_and_model():
    from env_checks import baselines

    lineage = baselines.serving_lineage(perf.lineage_of("cpu", CPU_FP, None, "vllm"), "float32", "cpu")
    names = ["output_tok_s"]
    with History.open(":memory:") as history:
        assert perf.find_baseline(history, lineage, "tiny-gpt-oss", CHECK, names) is None
        history.ingest_record(_record("first", "2026-11-01T00:00:00Z", "skipped", {"output_tok_s": 280.0}))
        history.ingest_record(_record("good", "2026-11-02T00:00:00Z", "passed", {"output_tok_s": 300.0}))
        history.ingest_record(_record("regressed", "2026-11-03T00:00:00Z", "failed", {"output_tok_s": 90.0}))
        history.ingest_record(_record("cut", "2026-11-04T00:00:00Z", "passed", {"output_tok_s": 1.0}, complete=False))
        history.ingest_record(_record("other-model", "2026-11-05T00:00:00Z", "passed", {"output_tok_s": 5.0},
                                      model="gpt-oss-120b"))
        history.ingest_record(_record("avx512", "2026-11-06T00:00:00Z", "passed", {"output_tok_s": 900.0},
                                      fingerprint={"platform": {"accelerator": "none", "cpu_flags": ["avx512f"]}}))
        history.ingest_record(_record("no-figure", "2026-11-07T00:00:00Z", "skipped", {}))
        history.ingest_record(_record("bf16", "2026-11-08T00:00:00Z", "passed", {"output_tok_s": 700.0},
                                      dtype="bfloat16"))
        found = perf.find_baseline(history, lineage, "tiny-gpt-oss", CHECK, names)
        assert found is not None and found.run_id == "good" and found.figures["output_tok_s"] == 300.0
        assert perf.find_baseline(history, lineage, "tiny-gpt-oss", CHECK, ["ttft_p50_ms"]) is None


def test_graph_mode_capability_is_data():
    cpu = perf.graph_capability("cpu", "vllm")
    assert not cpu.supported and "TORCH_COMPILE_DISABLE" in cpu.reason
    for target in ("cuda", "rocm"):
        for engine in ("vllm", "transformers"):
            assert perf.graph_capability(target, engine).supported and perf.graph_capability(target, engine).capture_log
    unknown = perf.graph_capability("cuda", "sglang")
    assert not unknown.supported and "names no graph mode for the sglang engine" in unknown.reason


def test_graph_mode_that_captured_nothing_is_detected(tmp_path: Path):
    log = tmp_path / "engine.log"
    log.write_text("INFO Initializing a V1 LLM engine ... cudagraph_mode NONE\n")
    assert not perf.graphs_captured(log, "Graph capturing finished")
    log.write_text("INFO Graph capturing finished in 12 secs, took 0.40 GiB\n")
    assert perf.graphs_captured(log, "Graph capturing finished")


def _completion(tokens: list[int], runner_up: int | None = None) -> Completion:
    steps = []
    for t in tokens:
        top = {t: -0.5, (runner_up if runner_up is not None else t + 1): -0.6}
        steps.append(StepLogprobs(t, top))
    return Completion([1, 2, 3], tokens, steps)


def test_graph_eager_token_mismatch_fails():
    tol = compare.LogprobTolerance(max_abs=1e-3)
    eager = [_completion([10, 11, 12])]
    assert perf.graph_eager_parity([_completion([10, 11, 12])], eager, tol, 0).ok
    far = perf.graph_eager_parity([_completion([10, 99, 12], runner_up=98)], eager, tol, 4)
    assert not far.ok and any("chose 99" in p for p in far.problems)
    # a flip to the eager runner-up (within top-k both ways): tolerated for bf16, not for fp32
    near = [Completion([1, 2, 3], [10, 12, 12], [StepLogprobs(10, {10: -0.5, 11: -0.6}),
                                                  StepLogprobs(12, {12: -0.5, 11: -0.5004}),
                                                  StepLogprobs(12, {12: -0.5, 13: -0.6})])]
    eager_near = [Completion([1, 2, 3], [10, 11, 12], [StepLogprobs(10, {10: -0.5, 11: -0.6}),
                                                        StepLogprobs(11, {11: -0.5, 12: -0.5004}),
                                                        StepLogprobs(12, {12: -0.5, 13: -0.6})])]
    strict = perf.graph_eager_parity(near, eager_near, tol, limits_for("float32").graph_divergences)
    assert not strict.ok and any("differ between graph mode and eager" in p for p in strict.problems)
    assert perf.graph_eager_parity(near, eager_near, tol, limits_for("bfloat16").graph_divergences).ok


class HalfTokensHandler(BaseHTTPRequestHandler):
    """An OpenAI completions server that streams half the tokens it is asked for."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        n = max(1, int(body.get("max_tokens", 2)) // 2)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(n):
            chunk = {"choices": [{"index": 0, "text": " a", "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.002)
        usage = {"choices": [], "usage": {"prompt_tokens": 32, "completion_tokens": n, "total_tokens": 32 + n}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture
def half_tokens_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HalfTokensHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_real_bench_serve_against_short_replies_fails(half_tokens_server: str, tmp_path: Path):
    """vllm bench serve itself (through the launcher, forked from the forkserver as the CPU target runs it)
    measures the stub; its saved JSON is parsed, and the replies of half the asked length fail the check."""
    from conformance.checkpoints.tokenizer import hf_build, vocab
    from conformance.engines import server_fork

    tokenizer = hf_build.hf_tokenizer_dir(vocab.ensure_o200k())
    plan = perf.bench_plan("cpu", 1)
    cpu = run_target.data()["cpu"]
    env = {k: str(v) for k, v in cpu["env"].items()}
    fork_ctx = server_fork.client_context(cpu)
    assert fork_ctx is not None  # the session's forkserver runs with the CPU target's environment (conftest.py)
    result = perf.run_bench(plan, half_tokens_server, "stub", tokenizer, "key", tmp_path, env, fork_ctx)
    assert result.measured["completed"] == plan.num_prompts and result.measured["output_tok_s"] > 0
    assert not result.ok and "cut short" in result.problems[0], result.problems
    assert 0 < result.measured["host_cpu_busy_pct"] <= 100 and 0 <= result.measured["host_cpu_steal_pct"] <= 100


@pytest.mark.slow
def test_real_bench_serve_warms_a_gpu_server_once_and_its_short_replies_fail(half_tokens_server: str, tmp_path: Path,
                                                                              monkeypatch):
    """The server warm-up is real `vllm bench serve` runs (the CUDA target's first: 64 prompts of 1024 tokens at
    once): the stub's half-length replies fail it, its output is saved as server-warmup-c64.json, the runs after a
    failed one are not made, and the same server is not warmed a second time."""
    from conformance.checkpoints.tokenizer import hf_build, vocab
    from conformance.engines import server_fork

    monkeypatch.setattr(perf, "_WARMED", set())
    tokenizer = hf_build.hf_tokenizer_dir(vocab.ensure_o200k())
    cpu = run_target.data()["cpu"]
    args = (half_tokens_server, "stub", tokenizer, "key", tmp_path, {k: str(v) for k, v in cpu["env"].items()},
            server_fork.client_context(cpu))
    warmed = perf.warm_server_once("cuda", *args)
    assert warmed is not None and not warmed.ok and "cut short" in warmed.failure_message()
    assert warmed.measured["server_warmup_s"] > 0 and (tmp_path / "server-warmup-c64.json").is_file()
    assert not (tmp_path / "server-warmup-c32.json").exists()
    assert perf.warm_server_once("cuda", *args) is None


def test_each_level_warms_up_at_its_concurrency_and_the_other_shapes_do_not():
    """perf.toml warmups_per_concurrency: the baseline check's run sends `concurrency` warm-up requests first (a
    cold c8 on the H200 met a Triton JIT compile mid-run: TTFT p99 3076 ms, p50 82 ms); the shape checks run after
    it on the same server and skip them."""
    from conformance.verdicts import bench_shapes

    plan = perf.bench_plan("cuda", 8)
    assert plan.num_warmups == 8
    cmd = perf.bench_command(plan, "http://127.0.0.1:1", "m", Path("tok"), Path("out"), "r.json")
    assert cmd[cmd.index("--num-warmups") + 1] == "8"
    assert bench_shapes.plan("cuda", 8, "1k8k").num_warmups == 0
    assert bench_shapes.plan("cuda", 8, "1k1k").num_warmups == 8


def test_a_vllm_whose_bench_lacks_warmups_runs_cold_without_the_flag(monkeypatch):
    """--num-warmups came with vLLM 0.11.1 (vllm-project/vllm#26943): an older bench serve would refuse the flag and
    fail every perf check of a healthy stack, so there it is left out."""
    spec = perf.perf_data()["bench"]["warmups_need_vllm"]
    assert perf.bench_warms_up(spec, "0.26.0+hopper") and perf.bench_warms_up(spec, "0.32.0")
    assert not perf.bench_warms_up(spec, "0.11.0") and not perf.bench_warms_up(spec, "0.10.1+rocm641")
    monkeypatch.setattr(perf, "bench_warms_up", lambda spec, vllm=None: False)
    plan = perf.bench_plan("cuda", 8)
    assert plan.num_warmups == 0
    assert "--num-warmups" not in perf.bench_command(plan, "http://127.0.0.1:1", "m", Path("t"), Path("o"), "r.json")


def test_kernel_compiles_the_server_logs_during_a_bench_are_counted(tmp_path):
    """The line vLLM 0.26.0's server logged on the H200 mid-bench (fixtures/recorded/h200 P2 run), counted only
    after the mark taken before the run; no log (a --server URL) records nothing."""
    line = ("(EngineCore pid=2782) WARNING 12-03 23:39:15 [jit_monitor.py:135] Triton kernel JIT compilation during "
            "inference: fused_moe_kernel. This causes a latency spike; consider extending warmup to cover this "
            "shape/config.\n")
    log = tmp_path / "vllm-server.log"
    log.write_text(line + "INFO started\n")
    mark = perf.log_size(log)
    assert perf.jit_compiles_since(log, 0) == 1 and perf.jit_compiles_since(log, mark) == 0
    with log.open("a") as f:
        f.write("INFO request\n" + line + line)
    assert perf.jit_compiles_since(log, mark) == 2
    assert perf.jit_compiles_since(None, 0) is None and perf.log_size(None) == 0


def test_triton_s_cache_folders_are_where_triton_and_vllm_keep_them(tmp_path):
    from pathlib import Path

    from conformance.verdicts import perf

    env = {"TRITON_CACHE_DIR": "/c", "TRITON_HOME": "/h", "VLLM_CACHE_ROOT": str(tmp_path)}
    assert perf.triton_cache_dirs(env) == [Path("/c")]
    assert perf.triton_cache_dirs({"TRITON_HOME": "/h", "XDG_CACHE_HOME": str(tmp_path)})[0] == Path("/h/.triton/cache")
    assert perf.triton_cache_dirs({})[0] == Path.home() / ".triton" / "cache"
    compiled = tmp_path / "vllm" / "torch_compile_cache" / "key" / "rank_0_0" / "triton_cache"
    compiled.mkdir(parents=True)
    assert perf.triton_cache_dirs({"TRITON_CACHE_DIR": "/c", "XDG_CACHE_HOME": str(tmp_path)}) == [Path("/c"), compiled]
    assert perf.cache_entries([tmp_path / "none"]) is None and perf.cache_entries([tmp_path / "none", compiled]) == 0
