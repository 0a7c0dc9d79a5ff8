"""The collective controls again on real GPUs through NCCL/RCCL (skipped without 2 GPUs): a rank
counted twice and rotated chunks fail the verdict, and a rank hung inside a GPU collective becomes a
timeout failure within the limit with every rank killed, as on the CPU with gloo."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time

import pytest
import torch

from conformance import distributed
from conformance.distributed import collectives
from conformance.run import runrecord

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS < 2, reason="needs 2 or more GPUs (NCCL/RCCL)")
TOL = distributed.data()["collectives"]["tolerance"]
CASES = [("int32", 4096), ("float32", 1 << 20), ("bfloat16", 1 << 20)]


def _plan(timeout_s: float = 120.0) -> distributed.Launch:
    plan, reason = distributed.collective_plan("rocm" if torch.version.hip else "cuda", GPUS)
    assert plan is not None, reason
    return dataclasses.replace(plan, timeout_s=timeout_s)


def _run(op: str, fault: str | None):
    per_rank = distributed.launch(_plan(), collectives.run_cases, op, CASES, 7, TOL["unit_roundoff"],
                                  float(TOL["slack"]), fault)
    return collectives.verdict(op, per_rank)


def test_gpu_collectives_pass_and_planted_faults_fail():
    for op in collectives.OPS:
        report = _run(op, None)
        assert report.ok, (op, report.problems)
    assert not _run("all_reduce", "rank_counted_twice").ok
    for op in ("reduce_scatter", "all_gather"):
        bad = _run(op, "chunks_rotated")
        assert not bad.ok and bad.measured["int32_mismatches"] > 0


def test_a_rank_hung_in_a_gpu_collective_is_a_timeout_failure():
    timeout_s = 20.0
    started = time.monotonic()
    with pytest.raises(distributed.DistributedFailure) as info:
        distributed.launch(_plan(timeout_s), collectives.run_cases, "all_reduce", CASES, 7, TOL["unit_roundoff"],
                           float(TOL["slack"]), "rank_sleeps", 600.0)
    elapsed = time.monotonic() - started
    assert elapsed < timeout_s + 30, f"the launch took {elapsed:.1f} s to give up"
    chain = runrecord.exception_chain(info.value)
    assert str(info.value).startswith("Timeout") and runrecord.classify("failed", str(info.value), chain) == "timeout"
    assert not [p for p in mp.active_children() if p.name.startswith("rank-")], "a hung rank was left running"
