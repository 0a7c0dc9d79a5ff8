"""`--compile-cache DIR`: the run points vLLM's, Inductor's and Triton's caches into DIR, says whether it found them
filled, and puts the variables back; a folder it cannot write is one sentence before anything starts. (The run's
engine writing there is shown end to end in tests/test_run_end_to_end.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engines import compile_cache


@pytest.fixture
def clean_env(monkeypatch):
    for var in compile_cache.FOLDERS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "node-triton")  # one the node set itself: put back at the end
    yield
    compile_cache.release()


def test_points_the_three_caches_into_the_folder_and_puts_them_back(tmp_path, clean_env):
    compile_cache.use(tmp_path / "fleet")
    assert {var: os.environ[var] for var in compile_cache.FOLDERS} == {
        "VLLM_CACHE_ROOT": str(tmp_path / "fleet" / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fleet" / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "fleet" / "triton")}
    assert compile_cache.summary() == {"path": str(tmp_path / "fleet"), "warm": False, "files_at_start": 0,
                                       "files_at_end": 0}
    (tmp_path / "fleet" / "triton" / "kernel.cubin").write_bytes(b"\0")
    assert compile_cache.summary()["files_at_end"] == 1
    compile_cache.release()
    assert "VLLM_CACHE_ROOT" not in os.environ and os.environ["TRITON_CACHE_DIR"] == "node-triton"
    assert compile_cache.summary() is None


def test_a_filled_folder_is_a_warm_start(tmp_path, clean_env):
    (tmp_path / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (tmp_path / "vllm" / "torch_compile_cache" / "artifact").write_text("x")
    compile_cache.use(tmp_path)
    assert compile_cache.summary() == {"path": str(tmp_path), "warm": True, "files_at_start": 1,
                                           "files_at_end": 1}


def test_an_unwritable_folder_is_one_sentence(tmp_path, clean_env):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(compile_cache.CompileCacheError) as caught:
        compile_cache.use(blocker / "cache")
    message = str(caught.value)
    assert message.startswith(f"--compile-cache {blocker / 'cache'}: the folder cannot be created or written")
    assert message.count(". ") == 0 and message.endswith(".")
    assert os.environ["TRITON_CACHE_DIR"] == "node-triton" and compile_cache.summary() is None


def test_the_run_refuses_it_before_anything_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--tier", "p0", "--reports-dir",
                           str(tmp_path / "runs"), "--compile-cache", str(blocker / "cache")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "the folder cannot be created or written" in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _start(tmp_path: Path, name: str, key: str, env: dict, code: str = "c1") -> Path:
    """A vLLM start's log naming its torch.compile cache folder, and the factors vLLM 0.26.0 writes there."""
    local = tmp_path / "vllm" / "torch_compile_cache" / key / "rank_0_0" / "backbone"
    local.mkdir(parents=True)
    (local / "cache_key_factors.json").write_text(json.dumps(
        {"env": env, "config_hash": "cfg", "code_hash": code, "compiler_hash": "comp"}))
    log = tmp_path / name
    log.write_text(f"INFO 12-05 16:43:11 [backends.py:1094] Using cache directory: {local} for vLLM's torch.compile\n"
                   "INFO 12-05 16:43:23 [monitor.py:53] torch.compile took 16.94 s in total\n")
    return log


def test_each_vllm_start_s_compile_key_is_recorded_with_what_differs(tmp_path, monkeypatch):
    """On the H100 on 2026-12-05 the server compiled again beside the engine (keys 8385f6e0eb and 0fecc1a111) and
    nothing in the run said why. Each start's key and vLLM's own factors of it go to results.json `compile_keys`, the
    environment cut to the variables that differ; a start that compiled nothing adds none."""
    from conformance.run import phases

    run = phases.Phases()
    compile_cache.forget_keys()
    run.add_vllm_start(_start(tmp_path, "engine-vllm-0.log", "0fecc1a111", {"VLLM_A": "1", "VLLM_B": "x"}))
    run.add_vllm_start(_start(tmp_path, "vllm-server.log", "8385f6e0eb", {"VLLM_A": "1", "VLLM_B": "y"}, "c2"))
    eager = tmp_path / "engine-vllm-1.log"
    eager.write_text("WARNING Enforce eager set, disabling torch.compile and CUDAGraphs.\n")
    run.add_vllm_start(eager)
    keys = compile_cache.keys()
    assert [(k["process"], k["key"], k["code_hash"], k["env"]) for k in keys] == [
        ("engine-vllm-0.log", "0fecc1a111", "c1", {"VLLM_B": "x"}),
        ("vllm-server.log", "8385f6e0eb", "c2", {"VLLM_B": "y"})]
    assert run.seconds["vllm start: compile"] == pytest.approx(2 * 16.94)
    (line,) = compile_cache.recompiled()
    assert line == ("compile: vllm-server.log compiled again under key 8385f6e0eb, not engine-vllm-0.log's "
                    "0fecc1a111, for the same config: code_hash, VLLM_B ('x' against 'y')")
    compile_cache.forget_keys()
    assert compile_cache.keys() == []


def test_the_compile_keys_of_an_h100_server_and_engine_s_logs_are_read():
    """The H100's own logs (factor files not kept): the engine's and the server's keys, which differ."""
    logs = (Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "h100"
            / "p0-realdim-16-layers-round-nineteen-vllm-0.26.0")
    compile_cache.forget_keys()
    for name in ("fixes/engine-vllm-0.log", "fixes/vllm-server.log"):
        compile_cache.note_start(name, (logs / name).read_text())
    assert [(k["process"], k["key"]) for k in compile_cache.keys()] == [
        ("fixes/engine-vllm-0.log", "0fecc1a111"), ("fixes/vllm-server.log", "8385f6e0eb")]
    compile_cache.forget_keys()


def test_a_secret_in_vllm_s_factors_is_kept_as_a_digest(tmp_path):
    """On the H100 (2026-12-05): vLLM 0.26.0 writes VLLM_API_KEY into its factors in plain text, and the server's key
    differed from the engine's by it alone. results.json and the console keep a digest: the difference shows, the
    key not."""
    compile_cache.forget_keys()
    for name, key, env in (("engine-vllm-1.log", "83c1b194a5", {"VLLM_API_KEY": None}),
                           ("vllm-server.log", "9a35432acf", {"VLLM_API_KEY": "e0d2d912"})):
        compile_cache.note_start(name, _start(tmp_path, name, key, env).read_text())
    (line,) = compile_cache.recompiled()
    assert "e0d2d912" not in json.dumps(compile_cache.keys()) + line
    assert line.endswith("for the same config: VLLM_API_KEY (None against 'sha256:"
                         f"{hashlib.sha256(b'e0d2d912').hexdigest()[:12]}')")
    compile_cache.forget_keys()


@pytest.mark.parametrize("run", ["20261205T181030-bench-p0-L16-0", "20261205T182524-bench-p0-L2-0"])
def test_the_h100_s_first_nodes_server_compiled_again_for_its_api_key_alone(run):
    """The H100's first nodes: the server's config, code and compiler hashes equal the engine's; only the API key
    the suite handed the server differs (the key recorded as a digest)."""
    data = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "device_runs" / run
                       / "results.json").read_text())
    engine, _twin, server = data["compile_keys"]
    assert server["process"] == "vllm-server.log" and engine["key"] != server["key"]
    assert all(engine[f] == server[f] for f in compile_cache.FACTORS)
    assert engine["env"] == {"VLLM_API_KEY": None} and server["env"]["VLLM_API_KEY"].startswith("sha256:")
