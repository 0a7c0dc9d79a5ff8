"""Engines run in a child process: a crash, a hang or an OOM kill in the stack under test becomes
the failure of the check that was talking to it, with the child's captured output, and the run
goes on (docs/architecture.md "Rule 7: isolation")."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from conformance.engines import forkserver, heartbeat, registry

# How long close() waits for an engine to stop cleanly; a cancelled run (SIGTERM) shortens it, since the engines
# got the signal too and one still importing vLLM would hold each close for the whole wait.
CLOSE_TIMEOUT_S = 30.0

class EngineError(RuntimeError):
    """The engine under test raised, crashed or hung; the message says which and shows its output. Its
    `failure_class` is how a run record classes a check that failed on it (runrecord.classify)."""

    failure_class: str | None = None


class EngineHung(EngineError):
    failure_class = "timeout"


class EngineDied(EngineError):
    failure_class = "crash"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output captured)"


def _build(kind: registry.EngineKind, model: str, options: dict[str, Any], env: dict[str, str]) -> Any:
    options = dict(options)
    fault = options.pop("planted_fault", None)  # negative controls only (engines/faults.py)
    engine = _construct(kind, model, options, env)
    if fault:
        from conformance.engines import faults

        faults.plant(engine, fault)
        info = engine.info
        engine.info = lambda: info() | {"planted_fault": fault}
    return engine


def _construct(kind: registry.EngineKind, model: str, options: dict[str, Any], env: dict[str, str]) -> Any:
    """The engine kind's adapter (data/engines.toml `adapter`, resolved by the parent), built in this child with the
    run's environment."""
    os.environ.update(env)
    return kind.construct(model, options)


def start_context(start_method: str, env: dict[str, str]) -> Any:
    """`spawn`, or `forkserver`: fork from the run's forkserver (conformance/engines/forkserver.py) when it runs
    with this environment, else spawn."""
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"unknown engine start method {start_method!r}: use spawn or forkserver")
    return (start_method == "forkserver" and forkserver.context(env)) or mp.get_context("spawn")


def _serve(conn: Any, kind: registry.EngineKind, model: str, options: dict, env: dict, log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        engine = _build(kind, model, options, env)
        conn.send(("ok", engine.info()))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    while True:
        try:
            method, args, kwargs = conn.recv()
        except EOFError:
            return
        if method == "close":
            # Release the engine before the child exits: a forked child ends with os._exit, which skips
            # the finalizers that would free what the engine holds (vLLM's semaphores among them).
            try:
                engine.close()
                del engine
                gc.collect()
            finally:
                conn.send(("ok", None))
            return
        try:
            if method.startswith("components:"):  # component probes take the engine as first argument
                from conformance.engines import components

                result = getattr(components, method.removeprefix("components:"))(engine, *args, **kwargs)
            else:
                result = getattr(engine, method)(*args, **kwargs)
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))


class EngineProcess:
    """A live engine in a child process; `call` forwards a method call with a timeout.

    `env` is set in the child, and the child forks from the forkserver when that runs with `env`;
    `run_time_env` is added in the child only: variables the stack reads at run time, not at import, so they
    do not keep the child from forking."""

    serve = staticmethod(_serve)  # the child's entry point
    daemonic = True
    name = "engine"
    starting = "starting"

    def __init__(self, kind: str, model: str, options: dict[str, Any], env: dict[str, str],
                 log_path: Path, start_timeout_s: float, start_method: str = "spawn",
                 run_time_env: dict[str, str] | None = None, wait: bool = True) -> None:
        """Start the engine and wait until it is ready; with `wait=False` return at once (an engine started
        ahead of the check that needs it): `wait_ready()` waits later, and `ready_at` stamps when it was ready."""
        self.kind, self.model, self.log_path = kind, model, log_path
        self.start_timeout_s = start_timeout_s
        self.info: dict[str, Any] = {}
        self.ready_at: float | None = None
        self._started = False  # its start answered, with its info
        self._closing = False  # asked to close (begin_close)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()  # by the parent, as it decides to launch: the log's existence dates the launch, not the child
        self.started_at = time.perf_counter()
        spec = registry.kind(kind)  # data/engines.toml: the child builds its adapter
        if spec.inspects_model:  # its start counts the wait: it would wait for the forkserver's imports anyway
            forkserver.wait_inspected()  # vLLM's model inspection ahead of it, not a second one of its own
        # never plain fork: it would copy the parent's torch state (and threads) into the engine
        ctx = start_context(start_method, env)
        self._conn, child = ctx.Pipe()
        child_env = env | (run_time_env or {})
        self._proc = ctx.Process(target=self.serve, args=(child, spec, model, options, child_env, str(log_path)),
                                 daemon=self.daemonic, name=f"{self.name}-{kind}")
        self._proc.start()
        child.close()
        if wait:
            self.wait_ready()
        else:
            threading.Thread(target=self._stamp_ready, name=f"{self.name}-ready", daemon=True).start()

    def _stamp_ready(self) -> None:
        try:
            if self._conn.poll(self.start_timeout_s):
                self.ready_at = self.ready_at or time.perf_counter()
        except (OSError, ValueError):  # closed meanwhile
            pass

    def wait_ready(self, what: str | None = None) -> dict[str, Any]:
        """Wait for the engine's start (within its start timeout, counted from its start); its info."""
        if not self._started:
            left = max(1.0, self.start_timeout_s - (time.perf_counter() - self.started_at))
            with heartbeat.phase(what or f"{self.kind} engine start", self.log_path):
                self.info = self._receive(left, self.starting)
            self._started = True
            self.ready_at = self.ready_at or time.perf_counter()
        return self.info

    def is_ready(self) -> bool:
        """Whether its start has ended (ready, or failed): wait_ready() would not wait."""
        try:
            return self._started or not self._proc.is_alive() or self._conn.poll(0)
        except (OSError, ValueError):
            return True

    def _receive(self, timeout_s: float, what: str) -> Any:
        if not self._conn.poll(timeout_s):
            self.kill()
            raise EngineHung(f"{self.kind} engine hung: no answer after {timeout_s:.0f} s while {what}; "
                              f"it was killed. Its last output:\n{_tail(self.log_path)}")
        try:
            status, payload = self._conn.recv()
        except (EOFError, ConnectionError):
            self._proc.join(5)
            code = self._proc.exitcode
            how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            raise EngineDied(f"{self.kind} engine died ({how}) while {what}. "
                              f"Its last output:\n{_tail(self.log_path)}") from None
        if status == "error":
            raise EngineError(f"{self.kind} engine raised while {what}: {payload}")
        return payload

    def call(self, method: str, *args: Any, timeout_s: float = 300.0, **kwargs: Any) -> Any:
        if not self._proc.is_alive():
            raise EngineError(f"{self.kind} engine is not running (exit code {self._proc.exitcode}); "
                              f"its last output:\n{_tail(self.log_path)}")
        self._conn.send((method, args, kwargs))
        return self._receive(timeout_s, f"running {method}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(10)

    def begin_close(self) -> None:
        """Ask the engine to release what it holds and exit, without waiting for it (`close` waits): releasing
        takes vLLM ~2 s, so a run asks all its engines first and then waits for each."""
        if self._closing or not self._proc.is_alive():
            return
        self._closing = True
        try:
            self._conn.send(("close", (), {}))
        except (BrokenPipeError, OSError):
            pass

    def close(self, timeout_s: float | None = None) -> None:
        timeout_s = CLOSE_TIMEOUT_S if timeout_s is None else timeout_s
        if self._proc.is_alive():
            self.begin_close()
            try:
                self._conn.poll(timeout_s)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout_s)
        self.kill()
