"""Negative controls of the collective and tensor-parallel checks: wrong reductions, misplaced chunks,
hung / raising / dying ranks and sharding bugs must each fail the verdict (or the launch), and the
sharding arithmetic must reproduce vLLM's uneven MXFP4 split of gpt-oss-120b."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from conformance import distributed
from conformance.distributed import collectives
from conformance.distributed import tp_reference as tpref
from conformance.distributed.tp_checkpoints import tp_checkpoint
from conformance.distributed.tp_engine import cpu_bind
from conformance.reference import Reference
from conformance.run import runrecord
from conformance.verdicts.compare import VerdictReport

TOL = distributed.data()["collectives"]["tolerance"]
TP = distributed.data()["tp"]
SMALL_CASES = [("int32", 8), ("int32", 4096), ("float32", 4096), ("bfloat16", 4096)]


def _cpu_plan(timeout_s: float = 60.0, world_size: int = 2) -> distributed.Launch:
    return distributed.host_plan(world_size, timeout_s)


def _run(op: str, fault: str | None, cases=SMALL_CASES) -> VerdictReport:
    per_rank = distributed.launch(_cpu_plan(), collectives.run_cases, op, cases, 7, TOL["unit_roundoff"],
                                  float(TOL["slack"]), fault)
    return collectives.verdict(op, per_rank)


@pytest.mark.parametrize("op", collectives.OPS)
def test_correct_collectives_pass(op):
    report = _run(op, None)
    assert report.ok, report.problems
    assert report.measured["cases"] == 2 * len(SMALL_CASES)


def test_all_reduce_with_a_rank_counted_twice_fails():
    report = _run("all_reduce", "rank_counted_twice")
    assert not report.ok
    assert report.measured["int32_mismatches"] > 0 and report.measured["float32_max_err_over_bound"] > 1
    assert any("rank 0" in p for p in report.problems) and any("rank 1" in p for p in report.problems)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_chunks_in_the_wrong_order_fail(op):
    report = _run(op, "chunks_rotated")
    assert not report.ok
    assert report.measured["int32_mismatches"] > 0
    with pytest.raises(AssertionError, match=op):
        report.raise_if_failed()


def test_a_nan_in_a_float_result_fails():
    exact, allowed = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.full((2,), 1e-6, dtype=torch.float64)
    case = collectives._judge("all_reduce", "float32", 8, 0, torch.tensor([1.0, float("nan")]), exact, allowed)
    assert not case.ok and case.first_bad == 1


def test_a_hung_rank_is_a_timeout_failure_within_the_limit():
    timeout_s = 6.0
    started = time.monotonic()
    with pytest.raises(distributed.DistributedFailure) as info:
        distributed.launch(_cpu_plan(timeout_s), collectives.run_cases, "all_reduce", SMALL_CASES, 7,
                           TOL["unit_roundoff"], float(TOL["slack"]), "rank_sleeps", 600.0)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert elapsed < timeout_s + 15, f"the launch took {elapsed:.1f} s to give up"
    assert message.startswith("Timeout") and "rank 1: 'sleeping" in message
    assert runrecord.classify("failed", message, runrecord.exception_chain(info.value)) == "timeout"
    assert not [p for p in mp.active_children() if p.name.startswith("rank-")], "a hung rank was left running"


@pytest.mark.parametrize(("fault", "words"), [("rank_raises", "injected failure"), ("rank_dies", "exit code 3")])
def test_a_rank_that_raises_or_dies_fails_with_its_story(fault, words):
    started = time.monotonic()
    with pytest.raises(distributed.DistributedFailure, match=f"^rank 1 of a gloo group of 2 failed: .*{words}"):
        _run("all_reduce", fault)
    assert time.monotonic() - started < 30


def test_bus_bandwidth_follows_nccl_tests():
    assert distributed.bus_bandwidth("all_reduce", 10**9, 1.0, 8) == pytest.approx((1.0, 1.75))
    assert distributed.bus_bandwidth("all_gather", 10**9, 0.5, 4) == pytest.approx((2.0, 1.5))
    assert distributed.bus_bandwidth("reduce_scatter", 10**9, 1.0, 2) == pytest.approx((1.0, 0.5))


def test_world_size_and_skip_come_from_data():
    launch, reason = distributed.collective_plan("cpu", 0)
    assert launch is not None and launch.backend == "gloo" and launch.world_size == 2 and not reason
    launch, reason = distributed.collective_plan("cuda", 1)
    assert launch is None and "at least 2" in reason
    launch, _ = distributed.collective_plan("rocm", 8)
    assert launch.world_size == 8 and launch.backend == "nccl"
    assert distributed.collective_plan("cuda", 2)[0].env["NCCL_NVLS_ENABLE"] == "0"


# --- tensor parallelism -------------------------------------------------------------------------


def test_uneven_mxfp4_split_of_gpt_oss_120b_matches_vllm():
    def sizes(tp: int) -> list[int]:
        return [e - s for s, e in tpref.intermediate_ranges(2880, tp, mxfp4=True)]

    assert sizes(2) == [1440, 1440]
    assert sizes(4) == [736, 736, 736, 672]
    assert sizes(8) == [384] * 7 + [192]
    for tp in (2, 4, 8):
        ranges = tpref.intermediate_ranges(2880, tp, mxfp4=True)
        assert ranges[0][0] == 0 and ranges[-1][1] == 2880
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert sum(e - s for s, e in tpref.intermediate_ranges(2880, 4, True, "tail_block_dropped")) == 2816
    # the per-rank partition vLLM really allocates is judged on the engine's shapes:
    # tests/controls/test_tp_sharding_controls.py


def test_kv_heads_are_replicated_as_qkv_parallel_linear_does():
    cfg = {"num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 160}
    assert [tpref.plan_for(cfg, 8, r, True, 32).kv_heads[0] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [tpref.plan_for(cfg, 2, r, True, 32).kv_heads for r in range(2)] == [(0, 1), (1, 2)]
    assert [tpref.plan_for(cfg, 8, r, True, 32, "kv_head_modulo").kv_heads[0] for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="does not divide"):
        tpref.plan_for(cfg | {"num_attention_heads": 6}, 4, 0, True, 32)


@pytest.fixture(scope="module")
def tiny_tp():
    path = tp_checkpoint("tiny", "mxfp4")
    ref = Reference(path)
    layers = list(range(int(ref.cfg["num_hidden_layers"])))
    return path, layers, tpref.layer_outputs(ref, layers, TP["tokens"], TP["seed"])


def _sharded(path, layers, tp: int, mutation: str | None) -> dict:
    alignment = int(TP["mxfp4_pad_alignment"][TP["compute_alignment"]])
    blob = distributed.launch(_cpu_plan(120.0, tp), tpref.tp_rank, str(path), layers, alignment, TP["tokens"],
                              TP["seed"], mutation)[0]
    return tpref.load_outputs(blob)


def test_correct_sharding_recombines_exactly(tiny_tp):
    path, layers, want = tiny_tp
    report = tpref.recombined_close(_sharded(path, layers, 4, None), want, float(TP["rel_tol"]), "tiny TP 4")
    assert report.ok, report.problems
    assert report.measured["moe_max_rel_err"] < 1e-13 and report.measured["attention_max_rel_err"] < 1e-13


@pytest.mark.parametrize("mutation", tpref.MUTATIONS)
def test_sharding_bugs_fail_the_tp_verdict(mutation, tiny_tp):
    path, layers, want = tiny_tp
    report = tpref.recombined_close(_sharded(path, layers, 4, mutation), want, float(TP["rel_tol"]), mutation)
    assert not report.ok
    worst = max(report.measured.values())
    assert worst > 1e4 * float(TP["rel_tol"]), f"{mutation} moved the outputs by only {worst:.3g}"


@pytest.fixture(scope="module")
def slice_120b():
    path = tp_checkpoint("slice_120b", "mxfp4")
    return path, tpref.layer_outputs(Reference(path), [0], TP["tokens"], TP["seed"])


@pytest.mark.parametrize("tp", [4, 8])
def test_dropping_the_tail_block_of_120b_fails(tp, slice_120b):
    """The real uneven split: 90 blocks floor-divided loses 2 blocks (64 units) at TP 4 and at TP 8."""
    path, want = slice_120b
    got = _sharded(path, [0], tp, "tail_block_dropped")
    report = tpref.recombined_close(got, want, float(TP["rel_tol"]), f"120b slice TP {tp}, tail dropped")
    assert not report.ok and report.measured["moe_max_rel_err"] > 1e-4
    assert report.measured["attention_max_rel_err"] < 1e-12  # attention is untouched by the MoE split


def test_cpu_bind_gives_each_rank_its_own_cores():
    assert cpu_bind(2, [0, 1]) == "0|1"
    assert cpu_bind(2, list(range(16))) == "0-7|8-15"
    assert cpu_bind(2, [0, 2, 4, 6]) == "0,2|4,6"
    assert cpu_bind(4, [0, 1]) is None


def test_chunked_mxfp4_writer_equals_the_one_shot_quantizer():
    from conformance.checkpoints.models import _weights
    from conformance.checkpoints.quant.mxfp4 import quantize
    from conformance.distributed.tp_checkpoints import _quantize_expert_stack, spec_of

    t = _weights(spec_of("tiny"))["model.layers.0.mlp.experts.gate_up_proj"]
    chunked, whole = _quantize_expert_stack(t), quantize(t.transpose(1, 2))
    assert all(torch.equal(a, b) for a, b in zip(chunked, whole))
