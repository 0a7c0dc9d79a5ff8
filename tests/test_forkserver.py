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
