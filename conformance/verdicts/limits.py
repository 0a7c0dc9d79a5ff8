"""One `Limits` per dtype: every limit a check judges the run's dtype by, read from the data files in one place.

The plugin resolves the run's `Limits` at configure (a dtype without a needed table is refused in one sentence,
before any engine starts) and the `limits` fixture hands it to the checks (conformance/run/fixtures.py); a check
reads `limits.<name>`, never a data file keyed by the dtype. The tables:

- tolerances.toml [logprobs.<dtype>], [depth.<dtype>], [depth_at_limit.<dtype>], [diagnosis.<dtype>], [layers.<dtype>]
- gpt_oss.toml [tolerances.rope.<dtype>], [tolerances.moe] (the dtype's key and router_tie_ulps)
- perf.toml [graph_mode.max_greedy_divergences]
- profiles.toml [kv_fp8.tolerance.<dtype>]: optional (measured for the dtypes an fp8 KV cache was run in); its
  absence fails only the fp8-KV check, with the sentence in `missing`. [kv_fp8.<target>.tolerance.<dtype>] replaces
  the limits it names for that target (whose kernels round more than the cache: fp8 attention on CUDA).
- tolerances.toml [history.<dtype>]: optional as kv_fp8's; its absence fails only the history check.
- tolerances.toml [kernel_paths.<dtype>]: optional as kv_fp8's; its absence fails only the kernel-path sweep."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from conformance import datafiles
from conformance.datafiles import DataError
from conformance.verdicts.compare import BlockLimits, LayerTolerance, LogprobTolerance, largest_stratum_median
from conformance.verdicts.history import HistoryLimits
from conformance.verdicts.kernel_paths import ForwardLimits


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
        return largest_stratum_median(figures, default=float("nan"))

    def resolvable(self, separation: float) -> bool:
        """A mutant this far from the reference can be told from it by a stack within `noise` of the reference."""
        return separation > (self.ratio + 1) * self.noise


@dataclass(frozen=True)
class Limits:
    """The limits of one dtype, read once."""

    dtype: str
    logprobs: tuple[LogprobTolerance, int]  # greedy parity with the reference, and the top-k it compares
    depth: tuple[LogprobTolerance, int]  # the same past position 4096 (long-context checks)
    diagnosis: Diagnosis  # the nearest-mutant check's distance
    layers: LayerTolerance  # the per-layer block check
    rope: Mapping[str, float]  # RoPE/YaRN tables
    moe_rel: float  # one MoE block, relative to the reference's largest magnitude
    router_tie_ulps: float  # router near-ties the MoE check redraws
    graph_divergences: int  # greedy tokens graph mode may part from eager on
    kv_fp8: tuple[LogprobTolerance, int] | None  # fp8 KV cache against its quantised reference; None: not measured
    missing: Mapping[str, str]  # optional limits the dtype lacks: name -> the sentence a check needing one fails with
    history: HistoryLimits | None = None  # one request before and after traffic; None: not measured (see missing)
    kernel_paths: ForwardLimits | None = None  # each forward of the kernel-path sweep; None: not measured (missing)
    # the depth limits at the profile's max_model_len, sampled positions over the whole prompt (long-context checks)
    depth_at_limit: tuple[LogprobTolerance, int] | None = None


def dtypes() -> list[str]:
    """The dtypes a run may take (`--dtype`): those tolerances.toml has logprob limits for."""
    return list(_data("tolerances.toml").get("logprobs", {}))


def limits_for(dtype: str, target: str | None = None) -> Limits:
    """The Limits of `dtype` (on `target`, where a limit differs by target); a needed table it lacks is a DataError
    naming the file and the table."""
    tol = _data("tolerances.toml")
    logprobs, depth = _row(tol, "logprobs", dtype, "tolerances.toml"), _row(tol, "depth", dtype, "tolerances.toml")
    at_limit = _row(tol, "depth_at_limit", dtype, "tolerances.toml")
    moe = _data("gpt_oss.toml").get("tolerances", {}).get("moe", {})
    divergences = _data("perf.toml").get("graph_mode", {}).get("max_greedy_divergences", {})
    for table, where in ((moe, "gpt_oss.toml [tolerances.moe]"),
                         (moe.get("router_tie_ulps", {}), "gpt_oss.toml [tolerances.moe] router_tie_ulps"),
                         (divergences, "perf.toml [graph_mode.max_greedy_divergences]")):
        if dtype not in table:
            raise DataError(f"{where} has no {dtype}: measure that limit on a clean stack and add it first.")
    missing: dict[str, str] = {}

    def optional(name: str, read: Callable[[], Any]) -> Any:
        """A limit only some checks need: None, and the sentence they fail with, where the data lacks it."""
        try:
            return read()
        except DataError as exc:
            missing[name] = str(exc)
            return None

    def kv_fp8_row() -> tuple[LogprobTolerance, int]:
        row = _row(_data("profiles.toml"), "kv_fp8.tolerance", dtype, "profiles.toml")
        row = row | _data("profiles.toml")["kv_fp8"].get(target or "", {}).get("tolerance", {}).get(dtype, {})
        return LogprobTolerance(float(row["max_abs"]), row.get("p99"), row.get("median"),
                                source=f"profiles.toml kv_fp8 tolerance.{dtype}"), int(row["top_k"])

    kv_fp8 = optional("kv_fp8", kv_fp8_row)
    history = optional("history", lambda: HistoryLimits.from_row(_row(tol, "history", dtype, "tolerances.toml"),
                                                                 f"tolerances.toml [history.{dtype}]"))
    kernel_paths = optional("kernel_paths", lambda: ForwardLimits.from_row(
        _row(tol, "kernel_paths", dtype, "tolerances.toml"), f"tolerances.toml [kernel_paths.{dtype}]"))
    parity = _logprob_tolerance(logprobs, f"tolerances.toml logprobs.{dtype}", dtype)
    return Limits(dtype, (parity, int(logprobs["top_k"])),
                  (_logprob_tolerance(depth, f"tolerances.toml depth.{dtype}"), int(depth["top_k"])),
                  _diagnosis(_row(tol, "diagnosis", dtype, "tolerances.toml"), parity, dtype),
                  _layers(tol, dtype, float(moe["router_tie_ulps"][dtype])), MappingProxyType(_rope(dtype)),
                  float(moe[dtype]),
                  float(moe["router_tie_ulps"][dtype]), int(divergences[dtype]), kv_fp8, MappingProxyType(missing),
                  history, kernel_paths,
                  (_logprob_tolerance(at_limit, f"tolerances.toml depth_at_limit.{dtype}"), int(at_limit["top_k"])))


def refusal(requested: str | None, dtype: str, exact: str | None) -> str | None:
    """Why a run in `dtype` (`requested` by --dtype, else its target's), with its exact verdict in `exact`, cannot
    be judged: one sentence, or None when every needed table is there."""
    judged = dtypes()
    if requested is not None and requested not in judged:
        return f"--dtype {requested!r} is not a dtype the suite has limits for: use one of {', '.join(judged)}."
    for each in dict.fromkeys(d for d in (dtype, exact) if d):
        try:
            limits_for(each)
        except DataError as exc:
            return str(exc)
    return None


def _data(name: str) -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / name)


def _row(data: dict[str, Any], table: str, dtype: str, where: str) -> dict[str, Any]:
    """[table.dtype] of a data file: a check judges in the dtype it ran in, so no limits for that dtype is an
    error, never a fallback."""
    for part in table.split("."):
        data = data.get(part, {})
    if dtype not in data:
        have = ", ".join(sorted(k for k in data if isinstance(data[k], dict))) or "none"
        raise DataError(f"{where} has no [{table}.{dtype}] table (it has {have}): measure limits for {dtype} "
                        "on a clean stack and add it first.")
    return data[dtype]


def _logprob_tolerance(row: dict[str, Any], source: str, dtype: str | None = None) -> LogprobTolerance:
    """A [logprobs.<dtype>]-shaped row (`source` names it); `dtype` given (greedy parity's own row), its
    `noise_ratio` names the noise twin of that dtype."""
    ratio = row.get("noise_ratio") if dtype else None
    decode = row.get("decode_noise_depth") if ratio else None
    return LogprobTolerance(row["max_abs"], row.get("p99"), row.get("median"), row.get("stratum_median"),
                            bool(row.get("pairwise_greedy", True)), dtype if ratio else None,
                            float(ratio) if ratio else None, widen_by_band=bool(row.get("widen_by_band", False)),
                            decode_noise_depth=float(decode) if decode else None, source=source)


def _diagnosis(row: dict[str, Any], parity: LogprobTolerance, dtype: str) -> Diagnosis:
    kinds = {"max": parity.max_abs, "stratum_median": parity.stratum_median}
    if kinds.get(row["distance"]) is None:
        raise DataError(f"tolerances.toml [diagnosis.{dtype}] distance {row['distance']!r}: use max or "
                        f"stratum_median, with that limit in [logprobs.{dtype}]")
    return Diagnosis(row["distance"], float(kinds[row["distance"]]), float(row["ratio"]))


EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}  # torch.finfo(dtype).eps


def _layers(tol: dict[str, Any], dtype: str, tie_ulps: float) -> LayerTolerance:
    table, row = tol["layers"], _row(tol, "layers", dtype, "tolerances.toml")
    return LayerTolerance({b: BlockLimits(**row[b]) for b in ("attn", "moe")}, tuple(table["bands"]),
                          row.get("source", ""), float(table.get("position_scale", "inf")),
                          tie_ulps * EPS.get(dtype, 0.0))


def _rope(dtype: str) -> dict[str, float]:
    row = _row(_data("gpt_oss.toml"), "tolerances.rope", dtype, "gpt_oss.toml")
    return {k: v for k, v in row.items() if k != "source"}
