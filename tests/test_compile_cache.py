"""`--compile-cache DIR`: the run points vLLM's, Inductor's and Triton's caches into DIR, says whether it found them
filled, and puts the variables back; a folder it cannot write is one sentence before anything starts. (The run's
engine writing there is shown end to end in tests/test_run_end_to_end.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conformance.run import compile_cache


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
