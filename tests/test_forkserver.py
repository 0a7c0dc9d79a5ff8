"""The run's forkserver: children fork with the target's environment already applied at import time
and the stacks already imported; an engine needing another environment is spawned instead."""

from __future__ import annotations

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


@pytest.mark.slow
def test_a_forked_child_fills_vllms_model_info_cache_for_the_engines(tmp_path):
    """vLLM inspects the gpt-oss model class in a fresh interpreter the first time an engine starts under an install
    (about 15 s before the first engine's "Resolved architecture" on the H200 node) and caches what it found. A child
    of the forkserver does it ahead (phases.forkserver_ready): real vLLM-CPU, an empty cache root, filled."""
    ctx = forkserver.context(run_target.data()["cpu"]["env"])
    assert ctx is not None and forkserver.imports_vllm  # the session's forkserver (conftest.py)
    root = tmp_path / "vllm-cache"
    child = ctx.Process(target=forkserver.inspect_architectures, args=({"VLLM_CACHE_ROOT": str(root)},))
    child.start()
    child.join(300)
    assert child.exitcode == 0
    cached = [p.name for p in (root / "modelinfos").iterdir()]
    assert any("gpt_oss" in name and "GptOssForCausalLM" in name for name in cached), cached


def test_once_its_imports_are_timed_a_child_inspects_the_model_for_vllm(monkeypatch):
    """phases.forkserver_ready: the probe child times the imports, then (where the forkserver imports vLLM) one more
    child runs vLLM's model inspection, not waited for; without vLLM in the forkserver, none."""
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
        monkeypatch.setattr(phases, "_forkserver_probe", {})
        monkeypatch.setattr(phases, "record", lambda name, seconds: None)
        monkeypatch.setattr(forkserver, "started_at", 0.0)
        monkeypatch.setattr(forkserver, "imports_vllm", with_vllm)
        monkeypatch.setattr(forkserver, "context", lambda env=None: Ctx())
        event = phases.forkserver_ready()
        assert event is not None and event.wait(10)
        assert started == want
