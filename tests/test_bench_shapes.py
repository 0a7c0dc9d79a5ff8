"""The standard serving shapes as data (conformance/verdicts/bench_shapes.py, data/perf.toml [bench.shapes]); the
shape check's own control is in tests/controls/test_serving_perf_controls.py."""

from __future__ import annotations

import json

import pytest

from conformance import datafiles
from conformance.verdicts import bench_shapes, perf

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
