"""The standard serving shapes of P2 (data/perf.toml [bench.shapes]): 1k/1k, 1k/8k and 8k/1k input/output
tokens at every concurrency of the sweep. The first shape is each target's own request mix and keeps the
check ids test_serving_perf_against_baseline[cN]; the others are test_serving_perf_at_shape[<shape>-cN]. A
target may scale the shapes down in [bench.<target>.shapes] (the CPU default does); GPU targets run them as
published, so their figures meet the floors of data/perf_floors.toml at the real lengths."""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance import datafiles
from conformance.verdicts import perf


def shapes(data: dict[str, Any] | None = None) -> dict[str, tuple[int, int]]:
    """The standard shapes in data order: name -> (input_len, output_len)."""
    table = (data or perf.perf_data())["bench"].get("shapes")
    if not table:
        raise datafiles.DataError("perf.toml has no [bench.shapes] table: the standard serving shapes are data there")
    return {name: (int(row["input_len"]), int(row["output_len"])) for name, row in table.items()}


def default_shape(data: dict[str, Any] | None = None) -> str:
    return next(iter(shapes(data)))


def shape_sweep(data: dict[str, Any] | None = None) -> list[tuple[str, int]]:
    """(shape, concurrency) for every shape but the first (which the baseline check's cN ids run)."""
    conc = [int(c) for c in (data or perf.perf_data())["bench"]["concurrency"]]
    return [(name, c) for name in list(shapes(data))[1:] for c in conc]


def lengths(target: str, shape: str, data: dict[str, Any] | None = None) -> tuple[int, int]:
    """The shape's lengths on this target: its own [bench.<target>.shapes] row, else the standard one."""
    data = data or perf.perf_data()
    standard = shapes(data)
    if shape not in standard:
        raise datafiles.DataError(f"perf.toml [bench.shapes] has no shape {shape!r} (has {', '.join(standard)})")
    own = data["bench"].get(target, {}).get("shapes", {})
    row = own.get(shape)
    return (int(row["input_len"]), int(row["output_len"])) if row else standard[shape]


def plan(target: str, concurrency: int, shape: str | None = None, data: dict[str, Any] | None = None
         ) -> perf.BenchPlan:
    """perf.bench_plan (the target's mix: prompt counts, seed, percentiles) at the shape's lengths."""
    base = perf.bench_plan(target, concurrency, data)
    if shape is None or shape == default_shape(data):
        return base
    input_len, output_len = lengths(target, shape, data)
    # No warm-up: the level's own mix (the baseline check) ran first on the same server and warmed its batch sizes.
    return dataclasses.replace(base, input_len=input_len, output_len=output_len, num_warmups=0)


def shape_of(request: Any) -> str | None:
    """The `shape` parameter of the running check, or None (the baseline check has none)."""
    callspec = getattr(getattr(request, "node", None), "callspec", None)
    return getattr(callspec, "params", {}).get("shape")
