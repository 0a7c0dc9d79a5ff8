"""Session fixtures shared by the checks: the target, the model under test, engines (one per
configuration, in child processes), the fp64 reference, the prompt set and figure recording."""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.checkpoints.modeldir import ModelDirError, inspect_model_dir
from conformance.engines.base import Completion
from conformance.engines.worker import EngineError, EngineProcess
from conformance.run import capabilities, phases
from conformance.run.run_target import RunTarget
from conformance.run.runcontext import RunContext, ctx_of
from conformance.verdicts import profiles, settings

# Above this many parameters the fp64 reference streams: one layer's weights at a time.
STREAMING_ABOVE_PARAMS = 500_000_000


@dataclass(frozen=True)
class ModelUnderTest:
    name: str
    path: Path
    content_hash: str | None
    config: dict
    num_params: int


@pytest.fixture(scope="session")
def run(request: pytest.FixtureRequest) -> RunContext:
    return ctx_of(request.config)


@pytest.fixture(scope="session")
def model_under_test(run: RunContext) -> ModelUnderTest:
    from conformance.checkpoints.models import content_hash, tiny_gpt_oss

    if run.model_arg:
        try:
            info = inspect_model_dir(Path(run.model_arg))
        except ModelDirError as exc:
            pytest.fail(str(exc), pytrace=False)
        m = ModelUnderTest(str(info.path), info.path, content_hash(info.path), info.config, info.num_params)
    else:
        phases.wait_built("tiny")  # built in the background from collection on (phases.py)
        tiny = tiny_gpt_oss()
        info = inspect_model_dir(tiny.path)
        m = ModelUnderTest("tiny-gpt-oss", tiny.path, tiny.content_hash, info.config, info.num_params)
    run.model_meta = {"name": m.name, "content_hash": m.content_hash, "path": str(m.path) if run.model_arg else None,
                      "num_params": m.num_params}
    return m


class EngineFactory:
    """Engines keyed by configuration; at most `max_alive` live at once (GPU memory)."""

    def __init__(self, run: RunContext, model: ModelUnderTest, max_alive: int = 2) -> None:
        self.run, self.model, self.max_alive = run, model, max_alive
        self.live: OrderedDict[str, EngineProcess] = OrderedDict()
        self.start_seconds: dict[str, float] = {}

    def options(self, kind: str | None = None, **overrides: Any) -> dict[str, Any]:
        kind = kind or self.run.engine
        profile = profiles.of(self.run).engine_options() if kind == "vllm" else {}  # data/profiles.toml
        return self.run.spec.options_for(kind) | profile | {"dtype": self.run.dtype_name} | overrides

    def get(self, model: Path | None = None, kind: str | None = None, **overrides: Any) -> EngineProcess:
        """The engine of this kind (default: the one under test) for these options and model dir
        (default: the model under test), started once."""
        kind = kind or self.run.engine
        options = self.options(kind, **overrides)
        model_dir = str(model or self.model.path)
        key = json.dumps([kind, model_dir, options], sort_keys=True)
        if key in self.live:
            self.live.move_to_end(key)
            return self.live[key]
        default = json.dumps([self.run.engine, str(self.model.path), self.options()], sort_keys=True)
        while len(self.live) >= self.max_alive:
            # the default engine stays: session fixtures (engine, engine_greedy) hold it
            victim = next((k for k in self.live if k != default), None)
            if victim is None:
                break
            self.live.pop(victim).close()
        target = self.run.spec
        started = time.perf_counter()
        proc = EngineProcess(
            kind, model_dir, options, dict(target.env) | (profiles.of(self.run).engine_env() if kind == "vllm" else {}),
            self.run.run_dir / f"engine-{kind}-{len(self.start_seconds)}.log",
            start_timeout_s=target.timeouts.engine_start_s, start_method=target.engine_start)
        self.start_seconds[key] = time.perf_counter() - started
        self.run.startups.append((f"{kind} engine", self.start_seconds[key]))
        self.live[key] = proc
        if not self.run.engine_info:
            self.run.engine_info = proc.info
        return proc

    def close(self) -> None:
        for proc in self.live.values():
            proc.close()
        self.live.clear()


@pytest.fixture(scope="session")
def engines(run: RunContext, model_under_test: ModelUnderTest) -> Any:
    target = run.resolved()
    if target.problems:
        pytest.fail(f"cannot test the engine: {target.sentence()}", pytrace=False)
    factory = EngineFactory(run, model_under_test)
    if capabilities.declared().has(run.engine, "memory_budget"):  # the fit preflight: fail closed, in one
        # sentence, before any engine starts
        from conformance.run import fit

        try:
            verdict = fit.gate(run, model_under_test.path, model_under_test.config, factory.options(),
                               model_under_test.name)
        except fit.FitError as exc:
            pytest.fail(f"the fit preflight could not run: {exc}", pytrace=False)
        if not verdict.ok:
            pytest.fail(f"fit preflight (profile {run.profile}): {verdict.sentence}", pytrace=False)
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def engine(engines: EngineFactory) -> EngineProcess:
    try:
        return engines.get()
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def fingerprint(run: RunContext, engine: EngineProcess) -> dict[str, Any]:
    """The stack's fingerprint, collected once the engine has reported its backends."""
    from conformance.run.recorder import fingerprint as collect

    if run.fingerprint is None:
        run.fingerprint = collect(run)
    return run.fingerprint


@pytest.fixture(scope="session")
def target(run: RunContext) -> RunTarget:
    """The run's target, resolved once (conformance/run/run_target.py): name, dtype, engine options, timeouts."""
    return run.spec


@pytest.fixture(scope="session")
def call_timeout_s(target: RunTarget) -> float:
    return target.timeouts.engine_call_s


@dataclass(frozen=True)
class PromptSet:
    prompts: list[list[int]]
    max_tokens: int


@pytest.fixture(scope="session")
def prompts(model_under_test: ModelUnderTest) -> PromptSet:
    ids, max_tokens = settings.tiny_prompts(int(model_under_test.config["vocab_size"]))
    return PromptSet(ids, max_tokens)


@pytest.fixture(scope="session")
def tolerance(run: RunContext) -> Any:
    return settings.tolerance(run.dtype_name)


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


@pytest.fixture(scope="session")
def reference(model_under_test: ModelUnderTest) -> Any:
    """The fp64 reference; streaming (one layer and only routed experts resident) for big checkpoints."""
    from conformance.reference import Reference

    cfg = model_under_test.config
    resident = 2 * int(cfg["vocab_size"]) * int(cfg["hidden_size"]) * 8  # embeddings + lm_head in fp64
    host = _host_memory_bytes()
    if host and resident > host // 2:
        pytest.skip(f"the fp64 reference needs {resident / 2**30:.0f} GiB resident for embeddings and lm_head; "
                    f"this host has {host / 2**30:.0f} GiB")
    return Reference(model_under_test.path, streaming=model_under_test.num_params > STREAMING_ABOVE_PARAMS)


@pytest.fixture(scope="session")
def engine_greedy(engine: EngineProcess, prompts: PromptSet, tolerance: Any,
                  call_timeout_s: float) -> tuple[list[Completion], float]:
    """One greedy run of the prompt set with prompt logprobs, shared by the checks; and its seconds."""
    _, top_k = tolerance
    started = time.perf_counter()
    try:
        out = engine.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    phases.record("parity_decode", time.perf_counter() - started)
    return out, time.perf_counter() - started


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> Callable[[str, float], None]:
    """Record a measured figure; it lands in results.json and the junit properties."""

    def record(name: str, value: float) -> None:
        request.node.user_properties.append((f"figure:{name}", float(value)))

    return record
