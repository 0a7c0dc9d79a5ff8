"""Absolute serving-performance floors (data/perf_floors.toml): what a production stack must reach on the
real model, whatever its history. A new combination with no baseline is judged against these, never skipped."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from conformance import datafiles
from conformance.verdicts.verdict import FigureLimit, Verdict, record_figures


@dataclass(frozen=True)
class Floor:
    sku: str
    model: str
    input_len: int
    output_len: int
    concurrency: int
    figure: str
    per_gpu: bool
    published: float
    floor: float
    source: str


@dataclass
class FloorVerdict(Verdict):
    floor: Floor
    problems: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=dict)

    def figures(self) -> dict[str, float]:
        return dict(self.measured)

    def limits(self) -> dict[str, FigureLimit]:
        f = self.floor
        return {f"{f.figure}_vs_floor": FigureLimit(1.0, "min", f"perf_floors.toml {f.sku} {f.model} {f.input_len}/"
                                                               f"{f.output_len} c{f.concurrency}: {f.floor:g}",
                                                    headroom=False)}

    def failure_message(self) -> str:
        return "; ".join(self.problems) + "\n  " + "\n  ".join(self.details)


@cache
def data() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "perf_floors.toml")


def floors(table: dict[str, Any] | None = None) -> list[Floor]:
    table = table or data()
    sources = table.get("sources", {})
    out = []
    for row in table.get("floor", []):
        if row["source"] not in sources:
            raise datafiles.DataError(f"perf_floors.toml: floor for {row['sku']} {row['model']} cites source "
                                     f"{row['source']!r}, which [sources] does not list")
        out.append(Floor(row["sku"], row["model"], int(row["input_len"]), int(row["output_len"]),
                         int(row["concurrency"]), row["figure"], bool(row["per_gpu"]), float(row["published"]),
                         float(row["floor"]), sources[row["source"]]))
    return out


def floor_for(sku: str, model: str, input_len: int, output_len: int, concurrency: int,
              table: dict[str, Any] | None = None) -> Floor | None:
    for f in floors(table):
        if (f.sku, f.model, f.input_len, f.output_len, f.concurrency) == (sku, model, input_len, output_len,
                                                                          concurrency):
            return f
    return None


def judge(floor: Floor, figures: dict[str, float], tensor_parallel_size: int = 1) -> FloorVerdict:
    """This run's figure (per GPU when the floor is) against the floor; a missing or NaN figure fails."""
    v = FloorVerdict(floor)
    value = figures.get(floor.figure)
    if value is None or not math.isfinite(value):
        v.problems.append(f"this run measured no finite {floor.figure}, so the floor {floor.floor:g} cannot be judged")
        return v
    if floor.per_gpu:
        value = value / max(1, tensor_parallel_size)
    unit = f"{floor.figure}{' per GPU' if floor.per_gpu else ''}"
    v.measured[f"{floor.figure}_vs_floor"] = value / floor.floor
    v.details.append(f"{unit} {value:.4g} vs floor {floor.floor:.4g} (half of the published {floor.published:g}, "
                     f"{floor.sku} {floor.model} {floor.input_len}/{floor.output_len} at concurrency "
                     f"{floor.concurrency}: {floor.source})")
    if value < floor.floor:
        v.problems.append(f"{unit} {value:.4g} is below the floor {floor.floor:.4g} for {floor.sku} {floor.model} "
                          f"{floor.input_len}/{floor.output_len} at concurrency {floor.concurrency}")
    return v


def no_baseline(target: Any, plan: Any, figures: dict[str, float], skip_reason: str, record_figure: Any) -> None:
    """What P2 does without a baseline: judge the real model against its floor; skip only where no floor is
    published for the combination (the tiny model, an SKU or shape without a figure)."""
    import pytest

    from conformance.verdicts import profiles

    prof = target.profile  # the run's RunTarget
    model = profiles.model_key(profiles.read_config(target.model))
    floor = floor_for(prof.sku, model, plan.input_len, plan.output_len, plan.concurrency)
    if floor is None or not target.model:
        pytest.skip(f"{skip_reason}; no absolute floor is published for {prof.sku} {model} "
                    f"{plan.input_len}/{plan.output_len} at concurrency {plan.concurrency} (data/perf_floors.toml)")
    verdict = judge(floor, figures, int(prof.engine_options().get("tensor_parallel_size", 1)))
    record_figures(record_figure, verdict)
    verdict.raise_if_failed()
