"""The host's CPU time between two readings: the share busy (not idle) and the share stolen by the hypervisor, over
all cores, from psutil's absolute counters (psutil comes with vLLM; without it there is no reading). A serving figure
that is the host's Python and launch time (a small model at concurrency 1) moves with these, not with the GPU."""

from __future__ import annotations

from typing import Any


def read() -> Any | None:
    """The host's CPU time counters now (psutil's scputimes), or None where psutil is missing."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.cpu_times()


def shares(before: Any | None, after: Any | None) -> dict[str, float]:
    """`host_cpu_busy_pct` and `host_cpu_steal_pct` between two readings ({} without both, or without time
    between them)."""
    if before is None or after is None:
        return {}
    delta = {name: getattr(after, name) - getattr(before, name) for name in after._fields}
    # guest and guest_nice are counted inside user and nice already (Linux)
    total = sum(v for name, v in delta.items() if name not in ("guest", "guest_nice"))
    if total <= 0:
        return {}
    idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
    return {"host_cpu_busy_pct": round(100.0 * (1 - idle / total), 1),
            "host_cpu_steal_pct": round(100.0 * delta.get("steal", 0.0) / total, 1)}
