"""P2 serving performance: vLLM's own benchmark client against the server under test at concurrency
1/8/32, its figures compared with the baseline of the same lineage from the history store; and graph
mode (CUDA/HIP graphs) against eager on the same prompts."""

import importlib.util
from pathlib import Path

import pytest

from conformance import perf, perf_floors, runrecord, settings
from conformance.engines.worker import EngineError

AREA = "performance"
CONCURRENCY = perf.sweep()


@pytest.fixture(scope="module")
def bench_tokenizer(run, server, request) -> Path:
    """The served model's tokenizer, which bench serve needs to build prompts of exact token lengths."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM's benchmark client (vllm bench serve) is not installed here")
    if server.managed:
        return request.getfixturevalue("served_model").path
    if run.model_arg and (Path(run.model_arg) / "tokenizer.json").is_file():
        return Path(run.model_arg)
    pytest.skip("bench serve needs the served model's tokenizer: give --model DIR (with tokenizer.json) along "
                "with --server URL")


@pytest.fixture(scope="module")
def run_lineage(run) -> str:
    from conformance.recorder import fingerprint

    return perf.lineage_of(run.resolved().resolved, run.fingerprint or fingerprint(run), run.combo)


@pytest.mark.p2
@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=[f"c{c}" for c in CONCURRENCY])
def test_serving_perf_against_baseline(concurrency, run, server, bench_tokenizer, model_under_test, run_lineage,
                                       record_figure, request):
    """`vllm bench serve` (random prompts of fixed length, greedy, ignore_eos) at this concurrency:
    every request completes, and TTFT, TPOT, inter-token latency P50/P99 and output tokens/s are
    within the tolerance (data/perf.toml) of the latest passing run of the same lineage and model in
    the history store. Without a baseline the figures are recorded and the check skips.

    Catches: a stack that is correct but slow — attention or MoE backends falling back to slow paths
    after an upgrade, lost kernel tuning, scheduler regressions that starve decode under concurrency,
    requests failing or truncated under load.
    Reference: https://docs.vllm.ai/en/latest/contributing/benchmarks.html (vllm bench serve);
      docs/figures.md "Reference figures" (MI300X output tok/s at concurrency 1/8/32)
    Controls: tests/test_check_bodies_server.py::test_serving_perf_check_fails_when_requests_fail_under_load
    """
    target = run.resolved().resolved
    plan = perf.bench_plan(target, concurrency)
    env = {k: str(v) for k, v in settings.targets()[target].get("env", {}).items()}
    try:
        result = perf.run_bench(plan, server.client.base_url, server.model, bench_tokenizer, server.api_key,
                                run.run_dir / "bench", env)
    except perf.PerfError as exc:
        pytest.fail(str(exc), pytrace=False)
    for name, value in result.figures.items():
        record_figure(name, value)
    result.raise_if_failed()

    limits = perf.regression_limits(target)
    db = perf.history_path()
    if not db.is_file():
        perf_floors.no_baseline(run, plan, result.figures, f"no baseline: there is no history store at {db} (build "
                                f"it with `conformance dashboard`, or name it in ${perf.HISTORY_ENV})", record_figure)
        return
    check_id = runrecord.check_id(request.node.nodeid)
    from reports.history import History, HistoryError  # the one read of the history store (docs/architecture.md)

    try:
        with History.open(db) as history:
            baseline = perf.find_baseline(history, run_lineage, run.model_meta["name"], check_id,
                                          [lim.name for lim in limits])
    except HistoryError as exc:
        pytest.fail(str(exc), pytrace=False)
    if baseline is None:
        perf_floors.no_baseline(run, plan, result.figures, f"no baseline: no complete run of lineage {run_lineage!r} "
                                f"and model {run.model_meta['name']!r} in {db} has this check passed with its figures",
                                record_figure)
        return
    verdict = perf.regression_verdict(result.figures, baseline, limits)
    for name, value in verdict.figures.items():
        record_figure(name, value)
    verdict.raise_if_failed()


@pytest.mark.p2
def test_graph_mode_matches_eager(run, prompts, tolerance, call_timeout_s, record_figure, request):
    """The prompt set run greedy with CUDA/HIP graphs captured (enforce_eager=False) gives the eager
    engine's tokens (exactly in fp32) and logprobs within the dtype's tolerance. With the transformers
    engine both sides decode from the same static KV cache, step by step or by replaying the decode
    step captured as one graph.

    Catches: graph capture replaying stale buffers, padded graph batch sizes that pick different or
    broken kernels, sink or sliding-window metadata frozen at capture time — bugs that exist only in
    production mode, since correctness checks run eager.
    Reference: https://docs.vllm.ai/en/latest/design/cuda_graphs.html
    Controls: tests/test_check_bodies_server.py::test_graph_mode_check_fails_when_graphs_change_tokens
    """
    target = run.resolved().resolved
    capability = perf.graph_capability(target, run.engine)
    if not capability.supported:
        pytest.skip(f"target {target}: {capability.reason} (perf.toml [graph_mode.{target}])")
    engines = request.getfixturevalue("engines")
    tol, top_k = tolerance
    try:
        # vLLM: the default engine (enforce_eager is its default); transformers: its static-cache decode
        eager = engines.get(enforce_eager=True).call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k,
                                                     prompt_logprobs=True, timeout_s=call_timeout_s)
        graph_engine = engines.get(enforce_eager=False)
        graph = graph_engine.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k,
                                  prompt_logprobs=True, timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    assert perf.graphs_captured(graph_engine.log_path, capability.capture_log), (
        f"the enforce_eager=False engine logged no {capability.capture_log!r} ({graph_engine.log_path}): it ran "
        "without graphs, so graph mode was not compared")
    report = perf.graph_eager_parity(graph, eager, tol, perf.max_greedy_divergences(run.dtype_name))
    for name, value in report.figures().items():
        record_figure(name, value)
    report.raise_if_failed()
