"""Controls of conformance/checks/test_collectives.py: its own bodies on gloo ranks, one of which is counted twice,
and below the bandwidth floor."""

from __future__ import annotations

import pytest

from conformance import distributed
from conformance.checks import test_collectives as collective_checks
from conformance.distributed import collectives
from tests.check_fakes import FAILED, Figures


@pytest.fixture(scope="module")
def gloo_launch():
    launch, reason = distributed.collective_plan("cpu", 0)
    assert launch is not None, reason
    return launch, distributed.data()["collectives"]["cpu"]


def test_collective_exact_check_fails_when_a_rank_is_counted_twice(gloo_launch, monkeypatch):
    """A real 2-rank gloo all_reduce with rank 0's contribution added twice (collectives.run_op's fault)."""
    real = distributed.launch
    monkeypatch.setattr(collectives, "cases_for", lambda row: [("int32", 4096)])
    monkeypatch.setattr(distributed, "launch", lambda launch, fn, *args: real(launch, fn, *args, "rank_counted_twice"))
    with pytest.raises(FAILED, match="all_reduce int32 4096 B: .* elements wrong"):
        collective_checks.test_collective_results_exact("all_reduce", gloo_launch, Figures())


def test_collective_bandwidth_check_fails_below_the_floor(gloo_launch, monkeypatch):
    """Ranks that took 100 s for the message (sockets instead of shared memory, say)."""
    monkeypatch.setattr(distributed, "launch", lambda launch, fn, *args: [100.0, 100.0])
    with pytest.raises(FAILED, match="bus bandwidth .* is below the floor"):
        collective_checks.test_collective_bus_bandwidth("all_reduce", gloo_launch, Figures())
