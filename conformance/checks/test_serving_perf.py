"""P2 serving performance: vLLM's own benchmark client against the server under test at concurrency
1/8/32/64 and the standard shapes 1k/1k, 1k/8k, 8k/1k (conformance/verdicts/bench_shapes.py), its figures
compared with the pinned baseline of the same lineage (env_checks.baselines); and graph
mode (CUDA/HIP graphs) against eager on the same prompts. Where vLLM's benchmark client cannot be imported the
benchmark checks are skipped by data/expectations/environment.toml."""

import os
from pathlib import Path

import pytest

from conformance.engines import server_fork
from conformance.engines.worker import EngineError
from conformance.run import runrecord
from conformance.verdicts import bench_shapes, compare, host_speed, perf, perf_floors, shared_gpu
from conformance.verdicts.verdict import fail, raise_all, record_figures
from env_checks import baselines
from env_checks.probes.host import host_speeds

AREA = "performance"
CONCURRENCY = perf.sweep()
BENCH_CHECK_TIMEOUT_S = float(perf.perf_data()["bench"]["check_timeout_s"])  # above one bench run and a server start


@pytest.fixture(scope="module")
def bench_tokenizer(target, server, request) -> Path:
    """The served model's tokenizer, which bench serve needs to build prompts of exact token lengths."""
    if server.managed:
        return request.getfixturevalue("served_model").path
    if target.model and (Path(target.model) / "tokenizer.json").is_file():
        return Path(target.model)
    pytest.skip("bench serve needs the served model's tokenizer: give --model DIR (with tokenizer.json) along "
                "with --server URL")


@pytest.mark.p2
@pytest.mark.timeout(BENCH_CHECK_TIMEOUT_S)
@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=[f"c{c}" for c in CONCURRENCY])
def test_serving_perf_against_baseline(concurrency, target, run_dir, server, bench_tokenizer, model_under_test,
                                       run_lineage, record_figure, request):
    """`vllm bench serve` (random prompts of fixed length, greedy, ignore_eos) at this concurrency: every request
    completes, and TTFT, TPOT, inter-token latency P50/P99 and output tokens/s are within the tolerance (data/perf.toml)
    of the pinned baseline of this check, lineage and model (the median of accepted runs, promoted with `conformance
    baseline promote`; a run never becomes the baseline by itself), with the drift over the runs since the pin. The tiny
    model on a GPU is host-bound and judged for a collapse only (perf.toml [serving_host_bound]: one H100 node's runs of
    one stack swung 0.45-1.0x). Without a pin the real model is judged against its absolute floor
    (data/perf_floors.toml); only a combination without one skips. The first level on a GPU server first warms it once,
    unmeasured, with distinct prompts at each concurrency of the sweep (perf.toml [bench.server_warmup]); a server that
    fails those requests fails here. Where another process held the GPU while the level ran (NVML or amdsmi, on a server
    the suite started), a level that still meets its pin passes (sharing only slows), one that misses fails as
    `shared_gpu`, naming the process, not as the stack's failure; the measurement is never a baseline. Each level
    records the host's single-thread and memory-copy speeds as it starts (conformance/verdicts/host_speed.py); one that
    misses a pin measured on a host faster by either (perf.toml [host_speed]) fails as `slower_host`, saying by how
    much: not a like-for-like comparison. A pin that measured another number of requests (perf.toml's mix changed since)
    fails the level as `unlike_pin`, saying so. Recorded, not judged: the host's speeds again as the level ends
    (`*_after`) and, on a server the suite started, the Triton kernels it built while measured (new entries in
    Triton's cache folders), which vLLM's once-a-kernel compile log misses.

    Catches: a stack that is correct but slow — attention or MoE backends falling back to slow paths
    after an upgrade, lost kernel tuning, scheduler regressions that starve decode under concurrency,
    requests failing or truncated under load; and it tells a slow stack from a shared GPU (a CI runner that
    placed two jobs on one device) and from a slower host than the pin's.
    Reference: https://docs.vllm.ai/en/latest/contributing/benchmarks.html (vllm bench serve);
      docs/figures.md "Reference figures" (MI300X output tok/s at concurrency 1/8/32)
    Limits: perf.toml [regression.<table>]; perf.toml [regression_spread]; perf.toml [host_speed];
      perf_floors.toml [floor] sku, model, input_len, output_len, concurrency, figure, per_gpu, floor
    Controls: tests/controls/test_serving_perf_controls.py::test_serving_perf_check_fails_when_requests_fail_under_load,
      tests/controls/test_serving_perf_controls.py::test_a_drop_that_compounds_over_runs_fails_against_the_pin,
      tests/controls/test_serving_perf_controls.py::test_a_damaged_pin_file_fails_the_check_in_one_sentence,
      tests/controls/test_serving_perf_controls.py::test_a_server_that_fails_its_warm_up_fails_the_check,
      tests/controls/test_serving_perf_controls.py::test_serving_perf_check_on_a_shared_gpu_fails_as_shared_not_as_the_stack,
      tests/controls/test_serving_perf_controls.py::test_a_level_missed_against_a_pin_from_a_faster_host_fails_as_slower_host,
      tests/controls/test_serving_perf_controls.py::test_a_pin_of_another_request_count_fails_the_level_as_unlike,
      tests/controls/test_serving_perf_controls.py::test_the_tiny_model_on_a_gpu_is_judged_for_a_collapse_not_for_its_hosts_swings
    """
    plan = bench_shapes.plan(target.name, concurrency, bench_shapes.shape_of(request))  # the first shape: the mix
    env = {k: str(v) for k, v in target.env.items()}
    server_log = getattr(server, "log_path", None)
    bench_args = (server.client.base_url, server.model, bench_tokenizer, server.api_key, run_dir / "bench", env,
                  server_fork.client_context(target.table))
    try:
        warmed = perf.warm_server_once(target.name, *bench_args)  # the first level on this server warms it
        if warmed is not None:
            record_figures(record_figure, warmed)
            warmed.raise_if_failed()
        log_start = perf.log_size(server_log)
        triton_caches = perf.triton_cache_dirs(os.environ | target.process_env("vllm")) if server.managed else []
        kernels_before = perf.cache_entries(triton_caches)
        watch = shared_gpu.Watch(judge=server.managed)  # a server of the suite's: its processes are known
        host = host_speeds()  # the host as the level starts: pins are figures of their host too
        result = perf.run_bench(plan, *bench_args)
        watch.stop()
        host_after = {f"{figure}_after": speed for figure, speed in host_speeds().items()}  # recorded, not judged
    except perf.PerfError as exc:
        fail(str(exc))
    result.measured["num_warmups"] = float(plan.num_warmups)
    if (jit := perf.jit_compiles_since(server_log, log_start)) is not None:
        result.measured["jit_compiles_during_run"] = float(jit)
    if (kernels_after := perf.cache_entries(triton_caches)) is not None:  # recorded, not judged yet
        result.measured["triton_kernels_built_during_run"] = float(kernels_after - (kernels_before or 0))
    result.measured |= watch.figures() | host | host_after
    record_figures(record_figure, result)
    with watch.explains():
        result.raise_if_failed()

    check_id, model = runrecord.check_id(request.node.nodeid), model_under_test.name
    limits = perf.regression_limits(target.name, model)
    pins, db = perf.pins_path(), perf.history_path()
    try:
        baseline = perf.pinned_baseline(pins, check_id, run_lineage, model, limits)
    except baselines.PinError as exc:
        fail(str(exc))
    if baseline is None:
        with watch.explains():
            perf_floors.no_baseline(target, plan, result.measured, f"no pinned baseline for lineage {run_lineage!r} "
                                    f"and model {model!r} in {pins} (promote one from accepted runs with `conformance "
                                    f"baseline promote`, docs/results.md)", record_figure)
        return
    verdict = perf.regression_verdict(result.measured, baseline, limits)
    since: list[baselines.AcceptedRun] = []
    if db.is_file():  # the drift since the pin; the verdict is the pin's alone
        from reports.history import History, HistoryError  # the one read of the history store (docs/architecture.md)

        try:
            with History.open(db) as history:
                since = baselines.runs_of(history, run_lineage, model, check_id, since=baseline.started_at)
        except HistoryError as exc:
            fail(str(exc))
    perf.drift_since_pin(verdict, result.measured, baseline, since, limits)
    record_figures(record_figure, verdict)
    with perf.explains_mix(result.measured, baseline), watch.explains(), \
            host_speed.explains(result.measured, baseline, perf.host_speed_tolerance()):
        verdict.raise_if_failed()


SHAPES = bench_shapes.shape_sweep()


@pytest.mark.p2
@pytest.mark.timeout(BENCH_CHECK_TIMEOUT_S)
@pytest.mark.parametrize(("shape", "concurrency"), SHAPES, ids=[f"{s}-c{c}" for s, c in SHAPES])
def test_serving_perf_at_shape(shape, concurrency, target, run_dir, server, bench_tokenizer, model_under_test,
                               run_lineage, record_figure, request):
    """The long-output and long-input standard shapes (1k in / 8k out, 8k in / 1k out; data/perf.toml
    [bench.shapes], scaled down on the CPU default) at each concurrency, judged as the 1k/1k sweep is: every
    request completes, figures within the tolerance of this check's pinned baseline, else the real model
    against its absolute floor at this shape (data/perf_floors.toml).

    Catches: decode that slows down deep into a long output (KV growth, attention over thousands of keys),
    prefill-bound stalls on long prompts that starve decoding requests under concurrency, a server that
    truncates or rejects long requests under load.
    Reference: https://docs.vllm.ai/en/latest/contributing/benchmarks.html (vllm bench serve, random dataset);
      https://inferencex.semianalysis.com (the 1k/1k, 1k/8k, 8k/1k shapes)
    Limits: perf.toml [regression.<table>]; perf.toml [regression_spread]; perf.toml [host_speed];
      perf_floors.toml [floor] sku, model, input_len, output_len, concurrency, figure, per_gpu, floor
    Controls: tests/controls/test_serving_perf_controls.py::test_shape_check_fails_when_requests_fail_at_a_long_shape
    """
    input_len, output_len = bench_shapes.lengths(target.name, shape)
    limit = target.profile.engine_options().get("max_model_len", target.options_for("vllm").get("max_model_len"))
    if limit is not None and int(limit) < input_len + output_len:
        pytest.skip(f"shape {shape} needs {input_len + output_len} tokens per request; the served profile "
                    f"{target.profile.label} has max_model_len {limit}")
    test_serving_perf_against_baseline(concurrency, target, run_dir, server, bench_tokenizer, model_under_test,
                                       run_lineage, record_figure, request)


@pytest.mark.p2
def test_graph_mode_matches_eager(target, prompts, limits, call_timeout_s, record_figure, request):
    """The prompt set run greedy with CUDA/HIP graphs captured (enforce_eager=False) gives the eager
    engine's tokens (exactly in fp32) and logprobs within the dtype's tolerance, and its tokens and logprobs
    agree with the fp64 reference by greedy parity's rule. In bf16/fp16 graph mode answers to eager by the
    distribution limits and a count of partings: two engines of that dtype part greedy paths on noise alone
    (vLLM 0.26.0 on the H200, bf16: graph mode's token ranked 2nd in eager's top-5, eager's outside graph mode's,
    twice in two runs), so there the tokens answer to the reference, as the TP check's do. At depth the limits are
    greedy parity's: where graph mode's paths exceed the dtype's fixed limits against the reference they widen to the
    noise twin's on those paths (decode bands by depth), and graph mode against eager is judged by the same widened
    limits (on an H100 in bf16 at 24 layers of 120b's dimensions a healthy engine pair differed by a median 1.43 and
    each stood a median 1.16 / 1.40 from the reference, against the fixed 0.15: docs/verdicts.md "Two engines
    against each other in low precision"). With the
    transformers engine both sides decode from the same static KV cache, step by step or by replaying the decode
    step captured as one graph. The eager engine's own paths against the reference are recorded too
    (eager_reference_* figures), not judged: beside graph mode's, where a deep model's decode noise lives.

    Catches: graph capture replaying stale buffers, padded graph batch sizes that pick different or
    broken kernels, sink or sliding-window metadata frozen at capture time — bugs that exist only in
    production mode, since correctness checks run eager.
    Reference: https://docs.vllm.ai/en/latest/design/cuda_graphs.html
    Limits: perf.toml [graph_mode.max_greedy_divergences.<dtype>] (measured: docs/notebook/2026-12-measurements.md
      "Two engines against each other, measured"); tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_serving_perf_controls.py::test_graph_mode_check_fails_when_graphs_change_tokens,
      tests/controls/test_serving_perf_controls.py::test_graph_mode_check_fails_when_graph_tokens_leave_the_reference,
      tests/controls/test_serving_perf_controls.py::test_graph_mode_check_in_bfloat16_counts_a_parting_on_noise,
      tests/controls/test_serving_perf_controls.py::test_graph_mode_check_at_depth_judges_by_the_noise_twin_and_still_fails_a_fault
    """
    capability = perf.graph_capability(target.name, target.engine)
    if not capability.supported:
        pytest.skip(f"target {target.name}: {capability.reason} (perf.toml [graph_mode.{target.name}])")
    engines = request.getfixturevalue("engines")
    tol, top_k = limits.logprobs
    try:
        # vLLM: the default engine (enforce_eager is its default); transformers: its static-cache decode
        eager = engines.get(enforce_eager=True).call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k,
                                                     prompt_logprobs=True, timeout_s=call_timeout_s)
        graph_engine = engines.get(enforce_eager=False)
        graph = graph_engine.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k,
                                  prompt_logprobs=True, timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    if not perf.graphs_captured(graph_engine.log_path, capability.capture_log):
        fail(f"the enforce_eager=False engine logged no {capability.capture_log!r} ({graph_engine.log_path}): it "
             "ran without graphs, so graph mode was not compared")
    reference = request.getfixturevalue("reference")  # after the skip: a target without graphs loads no reference
    vs_ref = compare.greedy_parity(graph, reference, tol, top_k, lambda k, v: record_figure(f"reference_{k}", v),
                                   names=("graph mode", "fp64 reference"))
    # graph mode against eager by the limits that judged graph mode against the reference (widened at depth)
    report = perf.graph_eager_parity(graph, eager, vs_ref.tolerance, limits.graph_divergences)
    # eager's own paths against the reference: recorded, not judged. Beside graph mode's bands they say whether what
    # a GPU engine's decode bands add at depth lives in its compiled decode path (docs/verdicts.md "Greedy parity at
    # depth")
    eager_vs_ref = compare.logprobs_close(eager, reference.score_all(eager, top_k + 5), tol,
                                          ("eager", "fp64 reference"))
    record_figures(record_figure, report)
    record_figures(record_figure, eager_vs_ref, prefix="eager_reference_")
    raise_all(report, vs_ref)
