"""Absolute performance floors (conformance/verdicts/perf_floors.py, data/perf_floors.toml)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance import datafiles
from conformance.verdicts import perf_floors
from tests.check_fakes import Figures, target_of


def test_every_floor_cites_a_source_and_is_half_the_published_figure():
    floors = perf_floors.floors()
    assert {f.sku for f in floors} >= {"MI300X", "MI325X", "H200", "H100"}
    for f in floors:
        assert f.source.startswith("https://") and f.floor <= 0.5 * f.published + 1, f


def test_floor_passes_and_fails_with_the_numbers():
    f = perf_floors.floor_for("H200", "gpt-oss-120b", 1024, 1024, 8)
    assert f is not None
    perf_floors.judge(f, {"output_tok_s": 800.0}).raise_if_failed()
    slow = perf_floors.judge(f, {"output_tok_s": 300.0})
    assert not slow.ok and "output_tok_s 300 is below the floor 424 for H200 gpt-oss-120b 1024/1024" in slow.problems[0]
    missing = perf_floors.judge(f, {"output_tok_s": float("nan")})
    assert not missing.ok and "no finite output_tok_s" in missing.problems[0]


def test_per_gpu_floor_divides_by_tp():
    f = perf_floors.floor_for("MI325X", "gpt-oss-120b", 1024, 1024, 64)
    assert perf_floors.judge(f, {"total_tok_s": 8 * 1200.0}, tensor_parallel_size=8).ok
    assert not perf_floors.judge(f, {"total_tok_s": 8 * 900.0}, tensor_parallel_size=8).ok


def test_a_source_missing_from_the_table_is_a_data_error():
    table = {"floor": [{"sku": "H200", "model": "gpt-oss-120b", "input_len": 1, "output_len": 1, "concurrency": 1,
                        "figure": "output_tok_s", "per_gpu": False, "published": 2.0, "floor": 1.0, "source": "x"}],
             "sources": {}}
    with pytest.raises(datafiles.DataError, match="cites source 'x'"):
        perf_floors.floors(table)


def test_a_new_combo_of_the_real_model_is_judged_not_skipped(tmp_path):
    """No baseline, real 120b on an H200: the floor judges it (and a slow stack fails)."""
    model = tmp_path / "gpt-oss-120b"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 2880, "num_local_experts": 128}')
    target = target_of("cuda", dtype="bfloat16", devices=["NVIDIA H200"], model_arg=str(model))
    plan = SimpleNamespace(input_len=1024, output_len=1024, concurrency=8)
    figs = Figures()
    perf_floors.no_baseline(target, plan, {"output_tok_s": 900.0}, "no baseline", figs)
    assert figs.values["output_tok_s_vs_floor"] == pytest.approx(900 / 424)
    with pytest.raises(AssertionError, match="below the floor 424"):
        perf_floors.no_baseline(target, plan, {"output_tok_s": 100.0}, "no baseline", figs)


def test_the_tiny_model_without_a_baseline_still_skips_with_the_reason():
    target = target_of("cpu")
    plan = SimpleNamespace(input_len=32, output_len=16, concurrency=8)
    with pytest.raises(pytest.skip.Exception, match="no absolute floor is published for cpu tiny 32/16"):
        perf_floors.no_baseline(target, plan, {"output_tok_s": 1.0}, "no baseline", Figures())
