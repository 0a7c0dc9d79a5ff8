"""The configuration a vLLM engine really runs, read back from the engine inside its child process: the attention
backend each attention layer was built with, the block size and KV cache dtype its cache uses, the MoE method and
kernel its experts run, its graph mode, and the AITER switches as the process sees them (the environment, vLLM's
`envs` module, vLLM's `rocm_aiter_ops`). `VllmOffline.info()` carries it as `running`, so the run's fingerprint
records it (runtime.engine.running) and checks/test_running_config.py judges it against what the run asked.

Every field is read on its own: an internal renamed in another vLLM release leaves that field out and names why
under `unreadable`, so a check that needs the field fails in one sentence, and the engine still starts."""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import Enum
from typing import Any

from conformance import datafiles


def env_prefixes(engine: str = "vllm") -> tuple[str, ...]:
    """The environment variables the report carries, by prefix (data/engines.toml [engines.<engine>.running])."""
    table = datafiles.load_toml(datafiles.DATA / "engines.toml")
    return tuple(table["engines"][engine].get("running", {}).get("env_prefixes", ()))


def _name(value: Any) -> Any:
    """An enum by its name, a torch dtype without its module, a plain value as it is."""
    if isinstance(value, Enum):
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value).removeprefix("torch.")


def _joined(values: list[Any]) -> Any:
    """One value where every layer agrees, else the distinct values, sorted and joined with ', '."""
    distinct = sorted({str(v) for v in values})
    return values[0] if len(distinct) == 1 else ", ".join(distinct)


def backend_enum_name(backend: type) -> str:
    """The AttentionBackendEnum member whose class path is this backend class (the name `attention_backend` takes;
    ROCM_AITER_FA's class names itself FLASH_ATTN), else the class's own get_name()."""
    path = f"{backend.__module__}.{backend.__qualname__}"
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        from vllm.attention.backends.registry import AttentionBackendEnum  # type: ignore[no-redef]
    for member in AttentionBackendEnum:
        try:
            if member.get_path() == path:
                return member.name
        except ValueError:  # CUSTOM, not registered
            continue
    return str(backend.get_name())


def _moe_kernel(method: Any) -> dict[str, Any]:
    """What a MoE quant method chose: its `*_backend` enums (unquantized_backend, mxfp4_backend …) and experts class."""
    found = {k: _name(v) for k, v in vars(method).items() if k.endswith("backend") and isinstance(v, Enum)}
    experts = getattr(method, "experts_cls", None)
    if experts is not None:
        found["experts"] = getattr(experts, "__name__", str(experts))
    return found


def model_side(model: Any) -> dict[str, Any]:
    """Per module of the loaded model (run by `LLM.apply_model` in the worker): the attention layers' backend, impl
    and KV cache dtype, and the MoE layers' method and kernel."""
    backends, impls, kv_dtypes, methods, kernels = [], [], [], [], []
    for name, mod in model.named_modules():
        if hasattr(mod, "impl") and hasattr(mod, "attn_backend"):
            backends.append(backend_enum_name(mod.attn_backend))
            impls.append(type(mod.impl).__name__)
            kv_dtypes.append(str(getattr(mod, "kv_cache_dtype", None)))
        elif hasattr(mod, "quant_method") and "experts" in name:
            methods.append(type(mod.quant_method).__name__)
            kernels.append(" ".join(f"{k}={v}" for k, v in sorted(_moe_kernel(mod.quant_method).items())))
    out: dict[str, Any] = {}
    if backends:
        out |= {"attention_backend": _joined(backends), "attention_impl": _joined(impls),
                "attention_kv_cache_dtype": _joined(kv_dtypes)}
    if methods:
        out |= {"moe": _joined(methods), "moe_kernel": _joined(kernels)}
    return out


def _aiter_switches() -> dict[str, Any]:
    """What vLLM's rocm_aiter_ops decides (None where AITER is not found or not supported here: its
    `if_aiter_supported` answers None), which is what the kernels follow, not the variables."""
    from vllm._aiter_ops import rocm_aiter_ops

    probes = {"enabled": "is_enabled", "fused_moe": "is_fused_moe_enabled", "mha": "is_mha_enabled",
              "unified_attention": "is_triton_unified_attn_enabled", "linear": "is_linear_enabled"}
    return {key: _name(getattr(rocm_aiter_ops, method)()) for key, method in probes.items()
            if hasattr(rocm_aiter_ops, method)}


def _vllm_envs(prefixes: tuple[str, ...]) -> dict[str, Any]:
    """vLLM's own reading of its variables under `prefixes` (vllm.envs; set or at their defaults)."""
    import vllm.envs as envs

    names = sorted(n for n in getattr(envs, "environment_variables", {}) if n.startswith(prefixes))
    return {n: _name(getattr(envs, n)) for n in names}


def read(llm: Any, core: Any, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The configuration the engine (`llm`, its in-process engine core `core`) runs; fields that could not be read
    are named under `unreadable`."""
    vllm_config = core.vllm_config
    groups = lambda: core.scheduler.kv_cache_config.kv_cache_groups  # noqa: E731
    cache, model = vllm_config.cache_config, vllm_config.model_config
    compilation, parallel = vllm_config.compilation_config, vllm_config.parallel_config
    attention_config = getattr(vllm_config, "attention_config", None)
    readers: dict[str, Callable[[], Any]] = {
        "dtype": lambda: _name(model.dtype),
        "block_size": lambda: int(cache.block_size),
        "kv_group_block_sizes": lambda: _joined([int(g.kv_cache_spec.block_size)
                                                 for g in groups()]),
        "kv_cache_dtype": lambda: _name(cache.cache_dtype),
        "kv_cache_storage": lambda: _joined([_name(g.kv_cache_spec.dtype) for g in groups()]),
        "kv_cache_bytes": lambda: _joined([int(g.kv_cache_spec.dtype.itemsize)
                                           for g in groups()]),
        "attention_backend_config": lambda: _name(attention_config.backend),
        "enforce_eager": lambda: bool(model.enforce_eager),
        "cudagraph_mode": lambda: _name(compilation.cudagraph_mode),
        "compilation_mode": lambda: _name(compilation.mode if hasattr(compilation, "mode") else compilation.level),
        "max_cudagraph_capture_size": lambda: _name(compilation.max_cudagraph_capture_size),
        "tensor_parallel_size": lambda: int(parallel.tensor_parallel_size),
        "max_model_len": lambda: int(model.max_model_len),
        "env": lambda: {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)},
        "envs": lambda: _vllm_envs(prefixes),
        "aiter": _aiter_switches,
    }
    out: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for field, reader in readers.items():
        try:
            out[field] = reader()
        except Exception as exc:  # noqa: BLE001 - a renamed internal is one unreadable field, not a failed start
            unreadable[field] = f"{type(exc).__name__}: {exc}"
    try:
        out |= llm.apply_model(model_side)[0]
    except Exception as exc:  # noqa: BLE001
        unreadable["model"] = f"{type(exc).__name__}: {exc}"
    for field in ("attention_backend", "attention_impl", "moe", "moe_kernel"):
        if field not in out and "model" not in unreadable:
            unreadable[field] = "no module of the loaded model reports it"
    return out | ({"unreadable": unreadable} if unreadable else {})
