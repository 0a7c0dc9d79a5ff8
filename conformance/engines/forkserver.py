"""The run's one multiprocessing forkserver. Engine children and distributed ranks fork from it
instead of starting fresh interpreters: it has imported torch, vLLM and transformers once (importing
vLLM alone takes ~9 s on a 2-core host, and P1 starts ~16 engines). torch and vLLM read some
environment variables at import (TORCH_COMPILE_DISABLE), so it is started with the target's engine
environment, and an engine that needs another environment is spawned instead. It never touches a
GPU: CUDA/HIP is initialised in the children, after the fork. On GPU targets only the transformers engine and the
device probe fork from it (targets.toml engine_start_by_kind), and it does not import vLLM there."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from conformance import datafiles

# preload.py last: it freezes what all of them imported out of the garbage collector
PRELOAD = ["torch.distributed", "conformance.distributed", "conformance.distributed.collectives",
           "conformance.distributed.tp_reference", "conformance.engines.preload"]
_env: dict[str, str] | None = None
started_at: float | None = None  # perf_counter() when it was started (phases.py times its imports)
imports_vllm = False  # whether it imports vLLM (forkserver.start(vllm=...))


SKIP_ENV = "CONFORMANCE_PRELOAD_SKIP"  # preload.py: the stacks it leaves out (comma-separated import names)
MORE_ENV = "CONFORMANCE_PRELOAD_MORE"  # preload.py: modules it imports too (comma-separated), the target's data


def environment(row: Mapping[str, Any]) -> dict[str, str]:
    """The engines' environment of a targets.toml table, the forkserver's among them: [<target>.env], plus
    [<target>.env_without_modules.MODULE] where MODULE is not installed (found, not imported): vLLM's default path on
    CUDA imports FlashInfer's sampler, which a node may lack."""
    import importlib.util

    env = dict(row.get("env", {}))
    for module, extra in row.get("env_without_modules", {}).items():
        if importlib.util.find_spec(module) is None:
            env |= dict(extra)
    return env


def start(env: dict[str, str], vllm: bool = True, more: Sequence[str] = ()) -> None:
    """Start it now, with `env` on top of ours, unless it runs already; its imports go on in the
    background while the caller continues. `vllm=False`: it does not import vLLM (a target whose vLLM
    engines start otherwise: no child needs it there). `more`: modules the children would import each
    (targets.toml `forkserver_preload`)."""
    global _env, started_at, imports_vllm
    if _env is not None:
        return
    started_at, imports_vllm = time.perf_counter(), vllm
    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
    saved = dict(os.environ)
    os.environ.update(_text(env))
    if not vllm:
        os.environ[SKIP_ENV] = "vllm"
    os.environ[MORE_ENV] = ",".join(more)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _env = _text(env)


def stop() -> None:
    """Kill the forkserver this process started, if it still runs, and reap it. A run that ends early (a
    damaged model dir, a refused target) would otherwise leave it importing vLLM for ~20 s more, holding the
    run's stdout and stderr open all that time (a pipe reader such as nox or `| tee` waits for it). Call it
    once the engines and the server are closed: its forked children are processes of their own, and a
    forked server dies with it (engines/server_fork.py)."""
    global _env, started_at, imports_vllm
    if _env is None:
        return
    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError, AttributeError):
            server._stop()  # closes our end of its pipes, waits for it, removes its socket
    _env = started_at = None
    imports_vllm = False


def inspect_architectures(env: dict[str, str] | None = None) -> None:
    """In a child forked from it once its imports are done (phases.forkserver_ready): vLLM's inspection of the gpt-oss
    model class, which vLLM runs in a fresh interpreter the first time an engine starts under a vLLM install and then
    keeps in its cache root (`modelinfos`). The first engine of a run on a fresh node spent about 15 s on it
    (fixtures/recorded/h200/p0-realdim-8-layers-vllm-0.26.0/engine-vllm-1.log, before "Resolved architecture");
    done here, it overlaps the checks before that engine. A warm-up only: any failure is left for the engine to meet.
    `env` is set first (a test's cache root)."""
    os.environ.update(env or {})
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        for arch in datafiles.load_toml(datafiles.DATA / "gpt_oss.toml")["shared"]["architectures"]:
            ModelRegistry._try_inspect_model_cls(arch)  # vLLM's own path: its cache, else its subprocess
    except Exception:  # noqa: BLE001, S110 - the engine that needs it reports it with context
        pass


def _text(env: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in env.items()}


def context(env: dict[str, str] | None = None) -> Any:
    """The forkserver context (started here, with `env`, if nobody started it); None when it runs
    with another environment than `env` (None: the caller sets what it needs in the child)."""
    if _env is None:
        start(env or {})
    return mp.get_context("forkserver") if env is None or _text(env) == _env else None
