"""Collectives: all_reduce, all_gather and reduce_scatter through torch.distributed (NCCL on CUDA, RCCL
on ROCm, gloo on the CPU default) give exact integer sums and fp32/bf16 results within the bound of
a W-term sum on random data, from a few bytes to hundreds of MB (P1); their bus bandwidth is at or
above a floor (P2). Ranks run in child processes with a deadline (conformance/distributed/__init__.py)."""

from __future__ import annotations

import pytest

from conformance import distributed
from conformance.distributed import collectives
from conformance.verdicts.verdict import at_least, fail, record_figures

AREA = "distributed"


@pytest.fixture(scope="module")
def collective_launch(target) -> tuple[distributed.Launch, dict]:
    if target.problems:
        fail(f"cannot test collectives: {target.report.sentence()}")
    launch, reason = distributed.collective_plan(target.name, len(target.devices))
    if launch is None:
        pytest.skip(reason)
    return launch, distributed.data()["collectives"][target.name]


@pytest.mark.p1
@pytest.mark.parametrize("op", collectives.OPS)
def test_collective_results_exact(op, collective_launch, record_figure):
    """Every rank's result of the collective equals the exact one: integer sums bit-exact, gathers
    bit-exact, fp32/bf16 sums of random data within W x u x sum|x| of the fp64 sum, for every size of
    data/distributed.toml (8 B to 64 MB on the CPU default, to 512 MB on GPUs), W = all visible GPUs.

    Catches: RCCL/NCCL builds or transports that corrupt or drop data (wrong chunk order, stale
    buffers at some sizes, a protocol switching at a size threshold), bf16 reductions accumulated
    wrongly, a rank's contribution counted twice or missing, a collective that hangs (timeout).
    Reference: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md ;
      https://pytorch.org/docs/stable/distributed.html#collective-functions
    Limits: distributed.toml [collectives.tolerance]
    Controls:
      tests/controls/test_collectives_controls.py::test_collective_exact_check_fails_when_a_rank_is_counted_twice
    """
    launch, row = collective_launch
    tol = distributed.data()["collectives"]["tolerance"]
    per_rank = distributed.launch(launch, collectives.run_cases, op, collectives.cases_for(row), 20251129,
                                  tol["unit_roundoff"], float(tol["slack"]))
    report = collectives.verdict(op, per_rank)
    record_figure("world_size", launch.world_size)
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p2
@pytest.mark.parametrize("op", collectives.OPS)
def test_collective_bus_bandwidth(op, collective_launch, record_figure):
    """Bus bandwidth of the collective on the largest message (median of timed iterations after
    warm-up, slowest rank), by nccl-tests' formula: all_reduce busbw = algbw x 2(W-1)/W, all_gather
    and reduce_scatter busbw = algbw x (W-1)/W; at or above the target's floor.

    Catches: NCCL/RCCL falling back to sockets or host staging (P2P or SHM disabled, wrong NIC), a
    link trained down, collectives slowed by an upgrade; the figure feeds the dashboard's trend.
    Reference: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md#bus-bandwidth
    Limits: distributed.toml [collectives.<target>] busbw_floor_gbps
    Controls: tests/controls/test_collectives_controls.py::test_collective_bandwidth_check_fails_below_the_floor
    """
    launch, row = collective_launch
    nbytes = int(row["bandwidth_bytes"])
    seconds = distributed.launch(launch, collectives.time_op, op, row["bandwidth_dtype"], nbytes,
                                 int(row["warmup"]), int(row["iters"]))
    algbw, busbw = distributed.bus_bandwidth(op, nbytes, max(seconds), launch.world_size)
    record_figure("world_size", launch.world_size)
    record_figure("message_bytes", nbytes)
    record_figure("algbw_gbps", algbw)
    record_figure("busbw_gbps", busbw)
    floor = float(row["busbw_floor_gbps"])
    verdict = at_least(busbw, floor, f"{op} of {nbytes} B over {launch.world_size} ranks ({launch.backend}): bus "
                                     f"bandwidth {busbw:.3g} GB/s (algbw {algbw:.3g}, {max(seconds) * 1e3:.1f} ms) is "
                                     f"below the floor {floor:.3g} GB/s", "busbw_gbps",
                       f"distributed.toml collectives ({launch.backend}) busbw_floor_gbps")
    record_figures(record_figure, verdict)  # the floor it was held to
    verdict.raise_if_failed()
