"""vLLM at tensor_parallel_size > 1 as an engine under test (data/distributed.toml [tp.vllm]).

Two things differ from engines.worker's EngineProcess, both because vLLM's multiprocessing executor
starts one worker process per rank: the engine's child process must not be daemonic (a daemonic
process may not have children), and the model probe that `info()` runs through `apply_model` must be
a module-level function, because vLLM pickles it to the workers. On the CPU each rank gets its own
set of cores through VLLM_CPU_OMP_THREADS_BIND (vLLM refuses to auto-bind 2 ranks on one NUMA node).
Where the target forks its engines (targets.toml engine_start), the engine process forks from the run's
forkserver and its rank workers fork from it in turn (data/distributed.toml [tp.vllm.cpu.env]), so no
process imports vLLM again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from conformance.distributed import data, world_size_for
from conformance.engines import worker
from conformance.engines.vllm_offline import VllmOffline
from conformance.engines.worker import EngineProcess


def model_backends(model: Any) -> dict[str, str]:
    """Attention and MoE implementations of one rank's model (runs inside each vLLM worker)."""
    found: dict[str, str] = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "impl") and hasattr(mod, "attn_backend"):
            found[f"attention.{name}"] = type(mod.impl).__name__
        elif hasattr(mod, "quant_method") and "experts" in name:
            found[f"moe.{name}"] = type(mod.quant_method).__name__
    return found


class TPVllmOffline(VllmOffline):
    def info(self) -> dict[str, Any]:
        import vllm
        from vllm.platforms import current_platform

        cfg = self._core().vllm_config
        per_rank = self.llm.apply_model(model_backends)
        return {"engine": "vllm", "vllm_version": vllm.__version__, "platform": str(current_platform.device_type),
                "dtype": str(cfg.model_config.dtype).removeprefix("torch."), "block_size": cfg.cache_config.block_size,
                "tensor_parallel_size": cfg.parallel_config.tensor_parallel_size, "backends": per_rank[0],
                "ranks_reporting": len(per_rank)}


def _build_tp(kind: Any, model: str, options: dict[str, Any], env: dict[str, str]) -> Any:
    os.environ.update(env)
    from conformance.engines.server_fork import keep_engine_core_start

    keep_engine_core_start()  # rank workers fork from this process when the env says so (vLLM-CPU would spawn)
    options = dict(options)
    fault = options.pop("planted_fault", None)  # negative controls only (engines/faults.py), planted in every rank
    engine = TPVllmOffline(model, options)
    if fault:
        from conformance.engines import faults

        faults.plant(engine, fault)
        info = engine.info
        engine.info = lambda: info() | {"planted_fault": fault}
    return engine


def _serve_tp(*args: Any) -> None:
    worker._build = _build_tp  # this child builds the TP engine; the request loop is the worker's own
    worker._serve(*args)


class TPEngineProcess(EngineProcess):
    """EngineProcess whose child may start vLLM's rank workers (kind vllm)."""

    serve = staticmethod(_serve_tp)
    daemonic = False
    name = "engine-tp"
    starting = "starting with tensor parallelism"

    def __init__(self, model: str, options: dict[str, Any], env: dict[str, str], log_path: Path,
                 start_timeout_s: float, start_method: str = "spawn",
                 run_time_env: dict[str, str] | None = None) -> None:
        super().__init__("vllm", model, options, env, log_path, start_timeout_s, start_method, run_time_env)


def cpu_bind(tp: int, cores: list[int] | None = None) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND for tp ranks: the allowed cores cut into tp contiguous sets ("0|1",
    "0-7|8-15"); None when there are fewer cores than ranks."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if len(cores) < tp:
        return None
    per = len(cores) // tp
    sets = [cores[r * per:(r + 1) * per] for r in range(tp)]
    return "|".join(str(s[0]) if len(s) == 1 else f"{s[0]}-{s[-1]}" if s[-1] - s[0] == len(s) - 1
                    else ",".join(map(str, s)) for s in sets)


def tp_settings(target: str, gpus: int) -> tuple[dict[str, Any], dict[str, str], str]:
    """(engine option overrides, extra env, reason it does not apply or "") for vLLM TP on a target."""
    row = dict(data()["tp"]["vllm"][target])
    env = dict(row.pop("env", {}))
    tp = world_size_for(row["tensor_parallel_size"], gpus)
    row["tensor_parallel_size"] = tp
    if tp < 2:
        return row, env, f"target {target}: {gpus} GPU(s) visible; tensor parallelism needs at least 2"
    if target == "cpu":
        bind = cpu_bind(tp)
        if bind is None:
            return row, env, f"{len(os.sched_getaffinity(0))} core(s) here: vLLM-CPU needs one per TP rank"
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return row, env, ""
