"""The standard serving shapes as data (conformance/verdicts/bench_shapes.py, data/perf.toml [bench.shapes]) and the
control of the shape check: its own body fails when requests fail at a long shape, and runs that shape."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conformance import datafiles
from conformance.checks import test_serving_perf as perf_checks
from conformance.verdicts import bench_shapes, compare, perf
from tests.check_fakes import FAILED, Figures, run_ctx

STANDARD = {"1k1k": (1024, 1024), "1k8k": (1024, 8192), "8k1k": (8192, 1024)}


def test_the_standard_shapes_and_concurrencies_are_data():
    assert bench_shapes.shapes() == STANDARD
    assert perf.sweep() == [1, 8, 32, 64]
    assert bench_shapes.shape_sweep() == [(s, c) for s in ("1k8k", "8k1k") for c in (1, 8, 32, 64)]


@pytest.mark.parametrize("target", ["cuda", "rocm"])
def test_gpu_targets_run_the_real_shapes(target):
    for shape, (inp, out) in STANDARD.items():
        plan = bench_shapes.plan(target, 64, shape)
        assert (plan.input_len, plan.output_len) == (inp, out), shape
    base = perf.bench_plan(target, 8)
    assert (base.input_len, base.output_len) == STANDARD["1k1k"]  # the cN ids are the 1k/1k shape there


def test_the_cpu_default_scales_the_shapes_down_and_keeps_their_ratios():
    cpu = {s: bench_shapes.lengths("cpu", s) for s in STANDARD}
    assert cpu["1k1k"] == (perf.bench_plan("cpu", 1).input_len, perf.bench_plan("cpu", 1).output_len)
    assert cpu["1k8k"][1] == 8 * cpu["1k1k"][1] and cpu["8k1k"][0] == 8 * cpu["1k1k"][0]
    assert all(i + o <= 1024 for i, o in cpu.values())  # targets.toml [cpu.vllm] max_model_len


def test_an_unknown_shape_fails_in_one_sentence():
    with pytest.raises(datafiles.DataError, match="has no shape '2k2k'"):
        bench_shapes.lengths("cuda", "2k2k")


def _request(shape: str, concurrency: int) -> SimpleNamespace:
    nodeid = f"conformance/checks/test_serving_perf.py::test_serving_perf_at_shape[{shape}-c{concurrency}]"
    return SimpleNamespace(node=SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(
        params={"shape": shape, "concurrency": concurrency})))


def test_shape_check_fails_when_requests_fail_at_a_long_shape(monkeypatch, tmp_path):
    """The 8k/1k shape at c8 (the CPU's scaled 256/16): bench serve reports failed requests; the check's own
    body fails with them, and the plan it ran had the shape's lengths, not the 1k/1k mix."""
    ran = []

    def bench(plan, *args, **kwargs):
        ran.append(plan)
        return compare.VerdictReport("vllm bench serve c8", measured={"completed": 5.0},
                                     problems=["3 of 8 requests failed under load"])

    monkeypatch.setattr(perf, "run_bench", bench)
    server = SimpleNamespace(client=SimpleNamespace(base_url="http://127.0.0.1:9"), model="tiny", api_key=None,
                             managed=False)
    run = run_ctx(run_dir=tmp_path)
    with pytest.raises(FAILED, match="3 of 8 requests failed under load"):
        perf_checks.test_serving_perf_at_shape("8k1k", 8, run.target, run.run_dir, server, tmp_path,
                                               SimpleNamespace(name="tiny-gpt-oss"), "cpu/avx2", Figures(),
                                               _request("8k1k", 8))
    assert [(p.input_len, p.output_len, p.concurrency) for p in ran] == [(*bench_shapes.lengths("cpu", "8k1k"), 8)]


def test_each_shape_and_level_keeps_its_own_result_and_log(monkeypatch, tmp_path):
    """The three shapes at one concurrency once wrote one bench-cN.json over another (and appended to one log):
    each run now saves under its shape's lengths and its level."""
    written = []

    def fake_group(what, cmd, env, log_path, timeout_s, fork_ctx=None):
        result = tmp_path / cmd[cmd.index("--result-filename") + 1]
        written.append((result.name, log_path.name))
        result.write_text(json.dumps({"completed": 0, "failed": 0}))
        return 0
    monkeypatch.setattr(perf, "run_in_group", fake_group)
    for shape in bench_shapes.shapes():
        plan = bench_shapes.plan("cuda", 8, shape)
        perf.run_bench(plan, "http://127.0.0.1:1", "m", tmp_path, None, tmp_path, {})
    assert len({r for r, _ in written}) == len({g for _, g in written}) == len(bench_shapes.shapes()) == 3
    assert ("bench-1024x8192-c8.json", "bench-1024x8192-c8.log") in written


def test_a_bench_check_outlasts_its_bench_run_and_a_server_start():
    """A slow bench run ends in its own PerfError (with its log), not in pytest's timeout: the bench checks' own
    timeout is above one bench run plus the server start the first of them pays."""
    from conformance.run import run_target

    timeout = float(perf.perf_data()["bench"]["check_timeout_s"])
    engine_start = float(run_target.data()["timeouts"]["engine_start_s"])
    assert timeout > perf.bench_plan("cuda", 64).timeout_s + engine_start
    for check in (perf_checks.test_serving_perf_against_baseline, perf_checks.test_serving_perf_at_shape):
        (marker,) = [m for m in check.pytestmark if m.name == "timeout"]
        assert marker.args == (timeout,)
