"""The host's CPU shares between two readings (conformance/engines/host_cpu.py), which every `vllm bench serve` level
records beside its figures and the GPU telemetry samples: on known counters, and on this machine's real ones."""

from __future__ import annotations

import os
import time
from collections import namedtuple

from conformance.engines import host_cpu

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_busy_and_steal_shares_of_known_counters():
    before = Times(100, 0, 50, 1000, 10, 0, 0, 5, 20, 0)
    after = Times(130, 0, 60, 1050, 10, 0, 0, 15, 40, 0)  # 100 s of CPU time: 50 not idle, 10 of them stolen
    assert host_cpu.shares(before, after) == {"host_cpu_busy_pct": 50.0, "host_cpu_steal_pct": 10.0}
    assert host_cpu.shares(before, before) == {} and host_cpu.shares(None, after) == {}


def test_a_busy_host_reads_busy():
    before = host_cpu.read()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    got = host_cpu.shares(before, host_cpu.read())
    assert got["host_cpu_busy_pct"] > 50 / (os.cpu_count() or 1), got  # one core spun: 100 / cores, less noise
    assert 0 <= got["host_cpu_steal_pct"] <= 100, got
