"""Loads the suite's data files (targets, tolerances, prompt sets) with one-sentence errors."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from conformance.datafiles import DATA, DataError, load_toml
from conformance.verdicts.compare import BlockLimits, LayerTolerance, LogprobTolerance


@cache
def targets() -> dict[str, Any]:
    return load_toml(DATA / "targets.toml")


def judged_dtypes() -> list[str]:
    """The dtypes a run may take (`--dtype`): those tolerances.toml has logprob limits for."""
    return list(load_toml(DATA / "tolerances.toml")["logprobs"])


def tolerance(dtype: str) -> tuple[LogprobTolerance, int]:
    table = load_toml(DATA / "tolerances.toml")["logprobs"]
    if dtype not in table:
        raise DataError(f"tolerances.toml has no [logprobs.{dtype}] table: add limits for {dtype} first.")
    row = table[dtype]
    return (LogprobTolerance(row["max_abs"], row.get("p99"), row.get("median"), row.get("stratum_median"),
                             bool(row.get("pairwise_greedy", True))), int(row["top_k"]))


def depth_tolerance(dtype: str) -> tuple[LogprobTolerance, int]:
    """Logprob parity limits for positions past 4096 (long-context checks), per dtype."""
    row = _dtype_row(load_toml(DATA / "tolerances.toml")["depth"], dtype, "tolerances.toml depth")
    return LogprobTolerance(row["max_abs"], row.get("p99"), row.get("median"), row.get("stratum_median")), \
        int(row["top_k"])


def _dtype_row(table: dict[str, Any], dtype: str, where: str) -> dict[str, Any]:
    """A check judges in the dtype it ran in: no limits for that dtype is an error, never a fallback."""
    if dtype not in table:
        have = ", ".join(sorted(k for k in table if isinstance(table[k], dict)))
        raise DataError(f"{where} has no limits for {dtype} (it has {have}): "
                        f"measure them on a clean stack and add [{where.split(' ')[-1]}.{dtype}] first.")
    return table[dtype]


@dataclass(frozen=True)
class Diagnosis:
    """How the nearest-mutant check measures a distance in one dtype (tolerances.toml [diagnosis.<dtype>]):
    `distance` "max" (|Δlogprob| over all steps) or "stratum_median" (the largest median of one position band
    and phase, where a fault lives while near-tie flips stay in the tail), `noise` the distance a healthy stack may
    reach (that dtype's parity limit of the same statistic), `ratio` how much nearer the reference must be."""

    distance: str
    noise: float
    ratio: float

    def of(self, figures: dict[str, float]) -> float:
        if self.distance == "max":
            return figures["max_abs_dlogprob"]
        strata = [v for k, v in figures.items() if k.startswith("median_abs_dlogprob_")]
        return max(strata) if strata else float("nan")

    def resolvable(self, separation: float) -> bool:
        """A mutant this far from the reference can be told from it by a stack within `noise` of the reference."""
        return separation > (self.ratio + 1) * self.noise


def diagnosis(dtype: str) -> Diagnosis:
    row = _dtype_row(load_toml(DATA / "tolerances.toml")["diagnosis"], dtype, "tolerances.toml diagnosis")
    tol, _ = tolerance(dtype)
    kinds = {"max": tol.max_abs, "stratum_median": tol.stratum_median}
    if kinds.get(row["distance"]) is None:
        raise DataError(f"tolerances.toml [diagnosis.{dtype}] distance {row['distance']!r}: use max or "
                        f"stratum_median, with that limit in [logprobs.{dtype}]")
    return Diagnosis(row["distance"], float(kinds[row["distance"]]), float(row["ratio"]))


def rope_tolerance(dtype: str) -> dict[str, float]:
    table = load_toml(DATA / "gpt_oss.toml")["tolerances"]["rope"]
    row = _dtype_row(table, dtype, "gpt_oss.toml tolerances.rope")
    return {k: v for k, v in row.items() if k != "source"}


def layer_tolerance(dtype: str) -> Any:
    table = load_toml(DATA / "tolerances.toml")["layers"]
    row = _dtype_row(table, dtype, "tolerances.toml layers")
    return LayerTolerance({b: BlockLimits(**row[b]) for b in ("attn", "moe")}, tuple(table["bands"]),
                          row.get("source", ""), float(table.get("position_scale", "inf")))


def layer_probe_settings() -> tuple[int, int]:
    """(decode steps, length of the long probe prompt) of the per-layer check."""
    table = load_toml(DATA / "tolerances.toml")["layers"]
    return int(table["decode_steps"]), int(table["long_prompt"])


def tiny_prompts(vocab_size: int, path: Path | None = None) -> tuple[list[list[int]], int]:
    """The deterministic token-id prompt set and its max_tokens."""
    spec = load_toml(path or DATA / "prompts" / "tiny.toml")
    rng = random.Random(spec["seed"])
    # the top few ids are eos/pad in the tiny config; keep prompts clear of them
    prompts = [[rng.randrange(vocab_size - 8) for _ in range(n)] for n in spec["lengths"]]
    prompts += [e["motif"] * e["repeat"] for e in spec.get("explicit", [])]
    return prompts, int(spec["max_tokens"])
