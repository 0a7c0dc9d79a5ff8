"""The run's one multiprocessing forkserver. Engine children and distributed ranks fork from it
instead of starting fresh interpreters: it has imported torch, vLLM and transformers once (importing
vLLM alone takes ~9 s on a 2-core host, and P1 starts ~16 engines). torch and vLLM read some
environment variables at import (TORCH_COMPILE_DISABLE), so it is started with the target's engine
environment, and an engine that needs another environment is spawned instead. It never touches a
GPU: CUDA/HIP is initialised in the children, after the fork. On CUDA vLLM engines fork from it too; on ROCm only
the transformers engine and the device probe do (targets.toml engine_start_by_kind), and it does not import vLLM there.
Where it imports vLLM, a child of it runs vLLM's model inspection before the first vLLM engine starts."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import threading
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
    forked server dies with it (engines/server_fork.py). A fresh interpreter still inspecting is killed too."""
    global _env, started_at, imports_vllm
    stop_inspection()
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


def stop_inspection() -> None:
    """The run's end: a fresh interpreter still inspecting is killed; nothing is waited for any more."""
    child = _inspection.get("child")
    if isinstance(child, _Interpreter) and child.proc.poll() is None:
        child.proc.kill()
        child.proc.wait()
    _inspection.clear()


def inspect_architectures(env: dict[str, str] | None = None) -> None:
    """In a child forked from it once its imports are done (phases.forkserver_ready), or in a fresh interpreter where
    vLLM engines spawn (`inspect_in_a_fresh_interpreter`): vLLM's inspection of the gpt-oss
    model class, which vLLM keeps in its cache root (`modelinfos`) and which the first engine of a cold cache would
    otherwise run in a fresh interpreter: 15-22 s before its "Resolved architecture" on the H200 and H100 nodes
    (fixtures/recorded/h100/p0-realdim-16-layers-round-twenty-vllm-0.26.0/first-node/engine-vllm-1.log). vLLM's own
    code runs it (its module hash, its cache, its file), in this child itself instead of the fresh interpreter vLLM
    starts to keep CUDA out of its caller: this child has vLLM and the model's module imported already and ends
    before an engine starts (`wait_inspected`). A fresh interpreter here took as long as the engine's own and lost
    the race to it on every cold node. A warm-up only: any failure is left for the engine to meet. `env` is set
    first (a test's cache root)."""
    os.environ.update(env or {})
    try:
        from vllm.model_executor.models import registry
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # as vLLM's fresh interpreter does before it inspects
        registry._run_in_subprocess = lambda fn: fn()  # this child is the separate process vLLM wants
        for arch in datafiles.load_toml(datafiles.DATA / "gpt_oss.toml")["shared"]["architectures"]:
            registry.ModelRegistry._try_inspect_model_cls(arch)  # vLLM's own path: its cache, else inspect and save
    except Exception:  # noqa: BLE001, S110 - the engine that needs it reports it with context
        pass


INSPECT_WAIT_S = 60.0  # the longest a vLLM engine waits for the inspection ahead of it (under a second in its child)
_inspection: dict[str, Any] = {}  # "ready": an Event set once the imports are done; "child": the inspecting child


def expect_inspection(ready: threading.Event) -> None:
    """phases.forkserver_ready: the inspection ahead of the engines is started once `ready` is set."""
    _inspection.clear()
    _inspection["ready"] = ready


def inspect_ahead(ctx: Any) -> None:
    """Start the child that runs vLLM's model inspection ahead of the engines (`inspect_architectures`)."""
    child = ctx.Process(target=inspect_architectures, daemon=True, name="inspect-model")
    child.start()
    _inspection["child"] = child


class _Interpreter:
    """A fresh interpreter running `inspect_architectures`, joined as a forked child is."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)


def inspect_in_a_fresh_interpreter(env: dict[str, str]) -> None:
    """Where vLLM engines spawn (targets.toml engine_start: ROCm), the forkserver does not import vLLM: the inspection
    runs now in a fresh interpreter of its own, with the engines' environment (`env` on top of ours: their cache root),
    while the first checks run; a spawned engine would import vLLM and then start vLLM's own fresh interpreter for
    it. vLLM engines wait for it as for the forked child (`wait_inspected`)."""
    code = "from conformance.engines.forkserver import inspect_architectures; inspect_architectures()"
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ | _text(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready = threading.Event()
    ready.set()
    _inspection.clear()
    _inspection.update(ready=ready, child=_Interpreter(proc))


def wait_inspected() -> None:
    """Before a vLLM engine starts: let the inspection ahead of it end (within INSPECT_WAIT_S). An engine forks only
    once the forkserver's imports are done, as that child does; started side by side, the engine would not find the
    cache and would run vLLM's fresh interpreter itself."""
    ready = _inspection.get("ready")
    if ready is None or not ready.wait(INSPECT_WAIT_S):
        return
    child = _inspection.get("child")
    if child is not None:
        child.join(INSPECT_WAIT_S)


def _text(env: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in env.items()}


def context(env: dict[str, str] | None = None) -> Any:
    """The forkserver context (started here, with `env`, if nobody started it); None when it runs
    with another environment than `env` (None: the caller sets what it needs in the child)."""
    if _env is None:
        start(env or {})
    return mp.get_context("forkserver") if env is None or _text(env) == _env else None
