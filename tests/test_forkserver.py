"""The run's forkserver: children fork with the target's environment already applied at import time
and the stacks already imported; an engine needing another environment is spawned instead."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conformance.engines import forkserver, worker
from conformance.run import run_target


def _report(queue) -> None:
    import gc

    preloaded = [m for m in run_target.data()["cpu"]["forkserver_preload"] if m in sys.modules]
    queue.put((os.environ.get("TORCH_COMPILE_DISABLE"), "torch" in sys.modules, "vllm" in sys.modules,
               gc.get_freeze_count(), len(gc.get_objects()), preloaded))


def test_children_fork_with_the_target_environment_and_the_stacks_imported():
    env = run_target.data()["cpu"]["env"]
    ctx = forkserver.context(env)
    assert ctx is not None and ctx.get_start_method() == "forkserver"
    queue = ctx.Queue()
    child = ctx.Process(target=_report, args=(queue,))
    child.start()
    compile_disabled, has_torch, has_vllm, frozen, tracked, preloaded = queue.get(timeout=120)
    child.join(30)
    assert compile_disabled == env["TORCH_COMPILE_DISABLE"]
    assert has_torch and has_vllm, "the forkserver did not preload the stacks: each engine would import them again"
    assert preloaded == run_target.data()["cpu"]["forkserver_preload"]  # the target's modules, imported once
    # what it imported is out of the collector's reach: a full collection walks what the child made, not vLLM
    assert frozen > 10 * tracked, (frozen, tracked)


def test_another_environment_is_spawned_not_forked():
    env = dict(run_target.data()["cpu"]["env"]) | {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert forkserver.context(env) is None
    assert worker.start_context("forkserver", env).get_start_method() == "spawn"
    assert worker.start_context("forkserver", run_target.data()["cpu"]["env"]).get_start_method() == "forkserver"
    with pytest.raises(ValueError, match="unknown engine start method"):
        worker.start_context("fork", {})


def test_a_module_s_variables_apply_only_where_it_is_not_installed():
    """vLLM's default sampler on CUDA imports FlashInfer's, and the first vLLM runs on the H200 died there with "No
    module named 'flashinfer'" (fixtures/device_runs/20261203T115147-cuda-2d9224): targets.toml turns that sampler off
    where flashinfer is not installed ([cuda.env_without_modules.flashinfer]), and keeps it where it is."""
    row = run_target.data()["cuda"]
    assert row["env_without_modules"]["flashinfer"] == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    absent = forkserver.environment(row | {"env_without_modules": {"no_such_module_here": {"X": "1"}}})
    assert absent["X"] == "1"
    present = forkserver.environment(row | {"env_without_modules": {"json": {"X": "1"}}})
    assert "X" not in present


def _vllms_own_inspection(env: dict[str, str]) -> None:
    os.environ.update(env)
    from vllm.model_executor.models.registry import ModelRegistry

    ModelRegistry._try_inspect_model_cls("GptOssForCausalLM")  # in the fresh interpreter vLLM starts for it


@pytest.mark.slow
def test_a_forked_child_fills_vllms_model_info_cache_as_vllm_itself_would(tmp_path):
    """vLLM inspects the gpt-oss model class in a fresh interpreter the first time an engine starts under a cache root
    (15-22 s before the first engine's "Resolved architecture" on the GPU nodes) and caches what it found. A child of
    the forkserver does it ahead (phases.forkserver_ready), in itself: real vLLM-CPU, an empty cache root, filled
    with the very file (module hash and model info) that vLLM's own fresh interpreter writes, which is what the
    engine reads."""
    ctx = forkserver.context(run_target.data()["cpu"]["env"])
    assert ctx is not None and forkserver.imports_vllm  # the session's forkserver (conftest.py)
    written = {}
    for how, target in (("ahead", forkserver.inspect_architectures), ("vllm", _vllms_own_inspection)):
        root = tmp_path / how
        child = ctx.Process(target=target, args=({"VLLM_CACHE_ROOT": str(root)},))
        child.start()
        child.join(300)
        assert child.exitcode == 0
        written[how] = {p.name: json.loads(p.read_text()) for p in (root / "modelinfos").iterdir()}
    assert any("gpt_oss" in name and "GptOssForCausalLM" in name for name in written["ahead"]), written
    assert written["ahead"] == written["vllm"]


@pytest.mark.slow
def test_where_vllm_engines_spawn_a_fresh_interpreter_fills_the_same_cache(tmp_path, monkeypatch):
    """ROCm's vLLM engines spawn and its forkserver leaves vLLM out: the inspection runs in a fresh interpreter of its
    own from collection on (plugin.py), with the engines' environment, and writes the file vLLM's own writes; a vLLM
    engine waits for it (`wait_inspected`); the run's end kills one still running."""
    monkeypatch.setattr(forkserver, "_inspection", {})
    root = tmp_path / "ahead"
    forkserver.inspect_in_a_fresh_interpreter({"VLLM_CACHE_ROOT": str(root)})
    forkserver.wait_inspected()
    ahead = {p.name: json.loads(p.read_text()) for p in (root / "modelinfos").iterdir()}
    ctx = forkserver.context(run_target.data()["cpu"]["env"])
    child = ctx.Process(target=_vllms_own_inspection, args=({"VLLM_CACHE_ROOT": str(tmp_path / "vllm")},))
    child.start()
    child.join(300)
    assert child.exitcode == 0
    assert ahead == {p.name: json.loads(p.read_text()) for p in (tmp_path / "vllm" / "modelinfos").iterdir()}
    assert any("GptOssForCausalLM" in name for name in ahead)

    forkserver.inspect_in_a_fresh_interpreter({"VLLM_CACHE_ROOT": str(tmp_path / "stopped")})
    proc = forkserver._inspection["child"].proc
    forkserver.stop_inspection()
    assert proc.poll() is not None and forkserver._inspection == {}


def test_a_vllm_engine_waits_for_the_inspection_ahead_of_it(monkeypatch):
    """forkserver.wait_inspected: once the imports are done (the event), the inspecting child is joined before a vLLM
    engine forks; without a forkserver probe (spawned engines, no vLLM in the forkserver) nothing is waited for."""
    import threading

    joined: list = []

    class Ctx:
        class Process:
            def __init__(self, target, daemon, name):
                assert target is forkserver.inspect_architectures

            def start(self):
                pass

            def join(self, timeout):
                joined.append(timeout)

    monkeypatch.setattr(forkserver, "_inspection", {})
    forkserver.wait_inspected()
    assert joined == []
    ready = threading.Event()
    forkserver.expect_inspection(ready)
    monkeypatch.setattr(forkserver, "INSPECT_WAIT_S", 0.2)
    forkserver.wait_inspected()  # the imports never finished: it gives up on its bound, joins nothing
    assert joined == []
    forkserver.inspect_ahead(Ctx())
    ready.set()
    forkserver.wait_inspected()
    assert joined == [0.2]


def test_once_its_imports_are_timed_a_child_inspects_the_model_for_vllm(monkeypatch):
    """phases.forkserver_ready: the probe child times the imports, then (where the forkserver imports vLLM) one more
    child runs vLLM's model inspection, which the vLLM engines wait for (forkserver.wait_inspected); without vLLM in
    the forkserver, none."""
    from conformance.run import phases

    started: list = []

    class Ctx:
        class Process:
            def __init__(self, target, daemon, name=None):
                self.target = target

            def start(self):
                started.append(self.target)

            def join(self, timeout):
                pass

    for with_vllm, want in ((True, [os.getpid, forkserver.inspect_architectures]), (False, [os.getpid])):
        started.clear()
        run = phases.Phases()
        monkeypatch.setattr(forkserver, "_inspection", {})
        monkeypatch.setattr(run, "record", lambda name, seconds: None)
        monkeypatch.setattr(forkserver, "started_at", 0.0)
        monkeypatch.setattr(forkserver, "imports_vllm", with_vllm)
        monkeypatch.setattr(forkserver, "context", lambda env=None: Ctx())
        event = run.forkserver_ready()
        assert event is not None and event.wait(10)
        assert started == want
