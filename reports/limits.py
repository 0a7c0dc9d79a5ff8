"""The limit a measured figure is judged against, where one is known, so trends plot a figure against its limit and
leave out the figures that are inputs or counts (seeds, shapes, steps compared …).

results.json records figures without their limits, so the limits come from the suite's own data files, read as they
are now (a run judged under an older limit is plotted against today's):

* the logprob parity figures (`max_abs_dlogprob`, `p99_abs_dlogprob`, `median_abs_dlogprob`, and the per-stratum
  `median_abs_dlogprob_<phase>_<band>`) of `test_greedy_logprobs_match_reference` (the run's dtype) and
  `test_exact_float32_logprobs_match_reference` (float32): `conformance/data/tolerances.toml` `[logprobs.<dtype>]`
  `max_abs`, `p99`, `median`, `stratum_median`;
* the GEMM numerics figures of `test_gemm_numerics[<dtype>]` (`gemm_rel_err`, `gemm_entry_err`):
  `conformance/data/devices.toml` `[gemm_numerics.tolerance]` `rel_fro`, `entry`;
* the device floors (`tflops_<dtype>`, `hbm_gbps`): `devices.toml` `floor_tflops`, `floor_hbm_gbps` of the SKU whose
  `match` finds the run's GPU name;
* figures that are already a ratio to their limit (`layer_worst_ratio_to_limit`): 1, from the explicit list below.

Serving throughput and latency are judged against pinned baselines and `perf_floors.toml` rows per SKU, model, shape
and concurrency that a figure alone does not name: they get no limit here (docs/dashboard.md).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from reports.records import RunInfo
from reports.stack import flatten, lookup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Figures that are a ratio of something to its own limit: their limit is 1 whatever the check.
RATIO_TO_LIMIT = {"layer_worst_ratio_to_limit": 1.0}
# The checks judged by `[logprobs.<dtype>]` and in which dtype (None: the run's). Other checks record the same figure
# names against other limits (engine against engine, a quantized checkpoint ...): they get none here.
LOGPROB_CHECKS = {"test_greedy_logprobs_match_reference": None,
                  "test_exact_float32_logprobs_match_reference": "float32"}
_LOGPROB_KEYS = {"max_abs_dlogprob": "max_abs", "p99_abs_dlogprob": "p99", "median_abs_dlogprob": "median"}
_STRATUM = re.compile(r"^median_abs_dlogprob_(prefill|decode)_\d+-\d+$")
_GEMM_KEYS = {"gemm_rel_err": "rel_fro", "gemm_entry_err": "entry"}
_PARAM = re.compile(r"\[([^\]]+)\]$")
_GPU_NAME_KEYS = ("nvidia_gpu_names.0", "amd_gpu_names.0", "gpu_names.0", "engine.name", "gpu.name")


@dataclass(frozen=True)
class Limit:
    """A figure's limit: `value`, whether the figure must stay at or below it ("max") or at or above it ("min"), and
    where it comes from."""

    value: float
    kind: str
    source: str

    def holds(self, figure: float) -> bool:
        return figure <= self.value if self.kind == "max" else figure >= self.value

    def describe(self) -> str:
        return f"{'≤' if self.kind == 'max' else '≥'} {self.value:g} ({self.source})"


@cache
def _data(name: str) -> dict[str, Any]:
    text = (resources.files("conformance") / "data" / name).read_text(encoding="utf-8")
    return tomllib.loads(text)


def _gpu_name(run: RunInfo) -> str | None:
    return lookup(flatten(run.fingerprint), _GPU_NAME_KEYS)


def _sku(run: RunInfo) -> dict[str, Any] | None:
    name = _gpu_name(run)
    return next((d for d in _data("devices.toml").get("device", []) if name and re.search(d["match"], name)), None)


def limit_of(check_id: str, figure: str, run: RunInfo) -> Limit | None:
    """The limit `figure` of check `check_id` was judged against in `run`; None where none is known."""
    if figure in RATIO_TO_LIMIT:
        return Limit(RATIO_TO_LIMIT[figure], "max", "a ratio to its own limit")
    key = _LOGPROB_KEYS.get(figure) or ("stratum_median" if _STRATUM.match(figure) else None)
    name = check_id.partition("::")[2]
    if key and name in LOGPROB_CHECKS:
        dtype = LOGPROB_CHECKS[name] or run.dtype or ""
        value = _data("tolerances.toml").get("logprobs", {}).get(dtype, {}).get(key)
        return Limit(float(value), "max", f"tolerances.toml logprobs.{dtype}.{key}") if value is not None else None
    param = _PARAM.search(check_id)
    if figure in _GEMM_KEYS and param and "test_gemm_numerics" in check_id:
        tolerance = _data("devices.toml").get("gemm_numerics", {}).get("tolerance", {}).get(param.group(1), {})
        value = tolerance.get(_GEMM_KEYS[figure])
        source = f"devices.toml gemm_numerics.tolerance.{param.group(1)}.{_GEMM_KEYS[figure]}"
        return Limit(float(value), "max", source) if value is not None else None
    if figure.startswith("tflops_") or figure == "hbm_gbps":
        sku = _sku(run)
        if sku is None:
            return None
        if figure == "hbm_gbps":
            value = sku.get("floor_hbm_gbps")
            where = "floor_hbm_gbps"
        else:
            dtype = figure.removeprefix("tflops_")
            value = sku.get("floor_tflops", {}).get(dtype)
            where = f"floor_tflops.{dtype}"
        return Limit(float(value), "min", f"devices.toml {sku['name']} {where}") if value is not None else None
    return None
