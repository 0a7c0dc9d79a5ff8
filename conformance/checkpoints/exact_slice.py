"""Which checkpoint the exact float32 verdict runs (`test_exact_float32_logprobs_match_reference`), and its slice
built in the background from collection on.

A model too big for the float32 engine's share of the device, or a real model (tolerances.toml [exact_twin]), runs
the verdict on a slice of its first layers (conformance/checkpoints/slices.py); a model the engine does not serve in
float32 (MXFP4 on vLLM) on its weights dequantized, in bf16 on disk. At gpt-oss-120b's dimensions that slice is 2
layers, 15 GB written, and its writing was on the check's critical path: an H100 spent about 30-40 s of the exact
check beyond its engine start and its decode, on a first node and a second. The check and the background
job ask `plan` the same question, so the check finds the slice the job built (`phases.wait_built("exact slice")`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.checkpoints import slices
from conformance.checkpoints.quant.limits import format_not_served
from conformance.datafiles import cache_root
from conformance.verdicts import settings

JOB = "exact slice"  # the background build (phases.build_jobs) and its phase
CHECK = "test_exact_float32_logprobs_match_reference"  # the check that runs the slice


@dataclass(frozen=True)
class ExactPlan:
    layers: int  # the layers the float32 engine runs (all of them: no slice)
    total: int
    dequantized_from: str | None  # the format the engine does not serve in float32, its weights then dequantized
    skip: str | None = None  # why the verdict cannot run here (then nothing is built)

    @property
    def sliced(self) -> bool:
        return self.skip is None and (self.layers < self.total or self.dequantized_from is not None)


def device_memory_bytes() -> int:
    """The device's whole memory (0 where there is no GPU: no device bound)."""
    try:
        import torch

        return int(torch.cuda.mem_get_info()[1]) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no device memory figure: the check runs
        return 0


def plan(config: dict[str, Any], num_params: int, engine: str, exact: str, options: dict[str, Any],
         name: str, key: str | None = None) -> ExactPlan:
    """The float32 engine's checkpoint for a model of `config` and `num_params` on engine `engine` in dtype
    `exact`, its process options `options` (its gpu_memory_utilization: the share of the device it takes, at most
    80%): every layer, or the first layers that fit the device (and, dequantized, the disk: 9/10 of what is free).
    A dequantized slice already written for the model of content hash `key` (the run's background build) is taken
    as it is: the disk it fills is not counted against it (else a 12-layer run skips the exact check, its own slice
    having filled the disk the check then asks for)."""
    total = int(config["num_hidden_layers"])
    layers, have = total, device_memory_bytes()
    budget = min(0.8, float(options.get("gpu_memory_utilization", 0.8))) * have
    if have and num_params * 4 > budget:
        layers = slices.layers_that_fit(config, num_params, budget)
        if layers < 1:
            why = (f"not even one layer of {name} fits the float32 engine's {budget / 2**30:.0f} GiB of the device "
                   "beside its embeddings and lm_head")
            return ExactPlan(0, total, None, why)
    at_most = settings.exact_twin_layers_at_most(config)  # a real model: one layer of each type
    layers = min(layers, at_most or layers)
    fmt = format_not_served(config, engine, exact)
    if fmt:  # its dequantized slice is written to disk in bf16: as many layers as the disk holds
        built = [n for n in range(layers, 0, -1)
                 if (slices.slice_path(key, n, total, True) / "config.json").is_file()] if key else []
        if built:
            return ExactPlan(built[0], total, fmt)
        cache_root().mkdir(parents=True, exist_ok=True)
        disk = 0.9 * shutil.disk_usage(cache_root()).free
        layers = min(layers, slices.layers_that_fit(config, num_params, disk, 2))
        if layers < 1:
            why = (f"not even one layer of {name} dequantized from {fmt} fits the {disk / 2**30:.0f} GiB free on the "
                   "disk beside its embeddings and lm_head")
            return ExactPlan(0, total, fmt, why)
    return ExactPlan(layers, total, fmt)


def prebuild(run: Any, model_dir: Path) -> Path | None:
    """The background job: the slice the exact check of this run will ask for (None where it runs no slice)."""
    from conformance.checkpoints.modeldir import inspect_model_dir
    from conformance.datafiles import content_hash

    target = run.target
    info = inspect_model_dir(model_dir)
    key = content_hash(model_dir)
    exact = plan(info.config, info.num_params, target.engine, target.exact_dtype,
                 target.process_options(target.engine, target.exact_dtype), str(info.path), key)
    if not exact.sliced:
        return None
    return slices.slice_layers(model_dir, exact.layers, key,  # the job before read the hash
                               dequantize=exact.dequantized_from is not None)


def wanted(run: Any, items: list[Any]) -> bool:
    """Whether the run will build a slice for its exact check: a --model run that selected the check, on a target
    whose exact dtype is not the run's."""
    if run.model_arg is None or not any(getattr(i, "originalname", i.name) == CHECK for i in items):
        return False
    target = run.target
    return not target.problems and bool(target.exact_dtype) and target.exact_dtype != target.dtype

