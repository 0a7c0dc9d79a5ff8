"""Session fixtures shared by the checks: the target, the model under test, engines (one per
configuration, in child processes), the fp64 reference, the prompt set and figure recording."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.checkpoints.modeldir import ModelDirError, inspect_model_dir
from conformance.engines import registry
from conformance.engines import worker as engine_worker
from conformance.engines.base import Completion
from conformance.engines.worker import EngineError, EngineProcess
from conformance.run import capabilities
from conformance.run.run_target import RunTarget
from conformance.run.runcontext import RunContext, ctx_of
from conformance.verdicts import settings
from conformance.verdicts.compare import LogprobTolerance
from conformance.verdicts.limits import Limits, limits_for
from conformance.verdicts.verdict import FigureLimit

# Above this many parameters the fp64 reference streams: one layer's weights at a time.
STREAMING_ABOVE_PARAMS = 500_000_000


@dataclass(frozen=True)
class ModelUnderTest:
    name: str
    path: Path
    digest: str | None  # the tiny checkpoint's, known when built; None: --model's, read on first use
    config: dict
    num_params: int

    @property
    def content_hash(self) -> str:
        """The checkpoint's sha256 (datafiles.content_hash). --model's is computed in the background from
        collection on (phases.build_jobs): the first checks and the engine's start overlap its read (a minute at
        gpt-oss-120b's size), and only what needs it waits (the record, the reference's keys, the twin's slice)."""
        from conformance.datafiles import content_hash

        return self.digest or content_hash(self.path)


@pytest.fixture(scope="session")
def run(request: pytest.FixtureRequest) -> RunContext:
    return ctx_of(request.config)


@pytest.fixture(scope="session")
def model_under_test(run: RunContext) -> ModelUnderTest:
    """The checkpoint under test; its `load` phase: the tiny one waited for (it builds in the background), or
    --model's directory inspected (its content hash is read in the background: ModelUnderTest.content_hash)."""
    from conformance.checkpoints.models import tiny_gpt_oss

    started = time.perf_counter()
    if run.model_arg:
        try:
            info = inspect_model_dir(Path(run.model_arg))
        except ModelDirError as exc:
            pytest.fail(str(exc), pytrace=False)
        m = ModelUnderTest(str(info.path), info.path, None, info.config, info.num_params)
    else:
        run.phases.wait_built("tiny")  # built in the background from collection on (phases.py)
        tiny = tiny_gpt_oss()
        info = inspect_model_dir(tiny.path)
        m = ModelUnderTest("tiny-gpt-oss", tiny.path, tiny.content_hash, info.config, info.num_params)
    run.model_meta = {"name": m.name, "content_hash": m.digest, "path": str(m.path) if run.model_arg else None,
                      "num_params": m.num_params}
    run.phases.record("load", time.perf_counter() - started)
    return m


MEMORY_SHARE_MAX = 1.0  # the engines' gpu_memory_utilization together: vLLM refuses to start beyond what is free


class EngineHandle:
    """An engine as a check or fixture holds it: its configuration, resolved to the live engine at every use. The
    factory starts it again where it closed it (to keep `max_alive`, or to make room in the device's memory for
    another engine or the server: EngineFactory.make_room)."""

    __slots__ = ("_factory", "_args")

    def __init__(self, factory: EngineFactory, args: dict[str, Any]) -> None:
        self._factory, self._args = factory, args

    def process(self) -> EngineProcess:
        """The live engine of this configuration, started if it is not."""
        return self._factory.process(**self._args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.process(), name)


class EngineFactory:
    """Engines keyed by configuration; at most `max_alive` live at once (`engines_alive` in data/targets.toml:
    2 on GPUs, whose memory they share; the default engine stays, the least recently used other is closed), and
    never more than the device's memory between them: where the engines' gpu_memory_utilization would add up past
    1 (gpt-oss-120b's profile gives each 0.9), the least recently used are closed first, the default too. get()
    hands out handles, so an engine closed that way starts again when a check uses it.

    Started ahead: where the target allows it (`engines_ahead` in data/targets.toml, 1 on the CPU default,
    where a vLLM engine runs one thread and the other core waits), the factory starts the next engine a check
    module plans for in the background, so that its start overlaps the checks before it. A module plans with
    `def engines_ahead(engines)`: a generator of `(check name, engines.get() arguments)`, in the order its checks
    ask; the check name is the function's or one item's (`test_x[16]`). Only the selected checks' entries start,
    one at a time, after the engine before them was handed out; one whose check ended without asking is closed.
    A plan changes no verdict: get() hands out the same engine, started earlier."""

    def __init__(self, run: RunContext, model: ModelUnderTest, max_alive: int | None = None,
                 items: list[pytest.Item] | None = None) -> None:
        self.run, self.model = run, model
        self.max_alive = max_alive or int(run.target.table.get("engines_alive", 2))  # data/targets.toml
        self._numbers = itertools.count()  # the engines' log files
        self._last: str | None = None  # the key get() handed out last
        self.live: OrderedDict[str, EngineProcess] = OrderedDict()
        self.ahead: dict[str, tuple[EngineProcess, tuple[str, str]]] = {}  # key -> (engine, its planned check)
        self.ahead_waited = self.ahead_hidden = 0.0
        self.unclaimed = 0  # engines started ahead and closed unasked (a plan that does not match its checks)
        self._closing: list[EngineProcess] = []  # asked to close (_retire), waited for by close()
        self._share: dict[str, float] = {}  # key -> the share of the device's memory its engine was given
        self._others: set[str] = set()  # what else holds a share (the suite's server), by name in _share
        self._depth = int(run.target.table.get("engines_ahead", 0)) if items else 0
        self._remaining: dict[tuple[str, str], int] = {}  # (module, check name) -> its items not yet finished
        self._item_names: dict[str, tuple[tuple[str, str], ...]] = {}
        modules: dict[str, Any] = {}
        for item in (items or []) if self._depth else []:
            plan = getattr(getattr(item, "module", None), "engines_ahead", None)
            if plan is None:
                continue
            mod = item.module.__name__
            modules.setdefault(mod, plan)
            names = tuple({(mod, item.name), (mod, getattr(item, "originalname", item.name))})
            self._item_names[item.nodeid] = names
            for name in names:
                self._remaining[name] = self._remaining.get(name, 0) + 1
        self._plans = [(mod, plan(self)) for mod, plan in modules.items()]
        self._planned = bool(self._plans)  # the phases record the plans' effect only where there were plans

    @property
    def target(self) -> RunTarget:
        """What the run tests (the `target` fixture): what a module's `engines_ahead` plan reads."""
        return self.run.target

    def options(self, kind: str | None = None, **overrides: Any) -> dict[str, Any]:
        kind = kind or self.run.engine
        fault = getattr(self.run, "planted_fault", None)  # --planted-fault: every engine of the kind under test
        planted = {"planted_fault": fault} if fault and kind == self.run.engine else {}
        return self.run.target.process_options(kind, overrides.get("dtype")) | planted | overrides

    def _key(self, model: Path | None, kind: str | None, overrides: dict[str, Any]) -> tuple[str, str, str, dict]:
        kind = kind or self.run.engine
        options = self.options(kind, **overrides)
        model_dir = str(model or self.model.path)
        return json.dumps([kind, model_dir, options], sort_keys=True), kind, model_dir, options

    def _default_key(self) -> str:
        """The key of the engine under test with the run's options: session fixtures hold it, so it is never closed."""
        return self._key(None, None, {})[0]

    def get(self, model: Path | None = None, kind: str | None = None, **overrides: Any) -> EngineProcess:
        """The engine of this kind (default: the one under test) for these options and model dir (default: the
        model under test), started now if it is not alive; handed out as a handle (an EngineProcess to its users)."""
        self.process(model, kind, **overrides)
        return EngineHandle(self, {"model": model, "kind": kind, **overrides})  # type: ignore[return-value]

    @staticmethod
    def share_of(options: dict[str, Any]) -> float:
        """The share of the device's memory an engine with these options takes (vLLM's gpu_memory_utilization;
        0 where the engine takes a fixed budget instead, as vLLM-CPU's kv_cache_memory_bytes)."""
        return float(options.get("gpu_memory_utilization") or 0.0)

    def held(self) -> float:
        """The share of the device's memory the engines alive or starting, and the server, hold together."""
        return sum(self._share.get(k, 0.0) for k in [*self.live, *self.ahead, *self._others])

    def make_room(self, share: float) -> None:
        """Close engines until `share` more of the device's memory fits beside those left: those starting ahead
        first, then the least recently used alive, the default too; each is waited for (vLLM checks the free memory
        as it starts). Nothing closes where the shares fit (vLLM-CPU, the tiny model's 0.3 on a GPU)."""
        over = lambda: self.held() + share > MEMORY_SHARE_MAX + 1e-9  # noqa: E731
        for key in [k for k in self.ahead if over()]:
            self.ahead.pop(key)[0].kill()
            self.unclaimed += 1
        while self.live and over():
            self.live.popitem(last=False)[1].close()

    def hold(self, name: str, share: float | None) -> None:
        """Count (a share) or stop counting (None) what else holds part of the device's memory: the server."""
        if share is None:
            self._others.discard(name)
            return
        self.make_room(share)
        if share:  # the server's engine measures the device's free memory as it starts, as an engine's does
            self._settle()
        self._others.add(name)
        self._share[name] = share

    def process(self, model: Path | None = None, kind: str | None = None, **overrides: Any) -> EngineProcess:
        """The live engine of this configuration, started if it is not (what a handle resolves to)."""
        key, kind, model_dir, options = self._key(model, kind, overrides)
        self._last = key
        if key in self.live:
            self.live.move_to_end(key)
            self.start_ahead()
            return self.live[key]
        default = self._default_key()
        ahead = self.ahead.pop(key)[0] if key in self.ahead else None
        while len(self.live) + len(self.ahead) >= self.max_alive:  # those starting ahead count: they hold memory
            # the default engine stays: most checks use it, so it is the costliest to start again
            victim = next((k for k in self.live if k != default), None)
            if victim is None:
                break
            self._retire(self.live.pop(victim))
        if ahead is None:
            self.make_room(self.share_of(options))  # where two engines cannot share the device
        if ahead is not None:
            proc = ahead
            waited = time.perf_counter()
            try:
                proc.wait_ready(f"{kind} engine start (started ahead)")
            finally:
                waited = time.perf_counter() - waited
                self.ahead_waited += waited
                self.ahead_hidden += max(0.0, (proc.ready_at or time.perf_counter()) - proc.started_at - waited)
        else:
            proc = self._start(kind, model_dir, options)
        self.run.startups.append((f"{kind} engine", (proc.ready_at or time.perf_counter()) - proc.started_at))
        if registry.kind(kind).start_log:  # data/engines.toml: what loading, compiling and graphs took
            self.run.phases.add_vllm_start(proc.log_path)
        self.live[key] = proc
        self._share[key] = self.share_of(options)
        if key == default or (kind == self.run.engine and not self.run.engine_info):
            # the record's runtime.engine: the engine under test (the default one once it starts), never the device
            # probe that P0's GEMM check starts first
            self.run.engine_info = proc.info
        self.start_ahead()
        return proc

    def _start(self, kind: str, model_dir: str, options: dict[str, Any], wait: bool = True) -> EngineProcess:
        if self.share_of(options):  # it measures the device's free memory as it starts
            self._settle()
        target = self.run.target
        # data/targets.toml, data/profiles.toml; what the stack reads only at run time is set after the fork
        env, late = target.fork_env(target.process_env(kind, options.get("dtype")))
        log = self.run.run_dir / f"engine-{kind}-{next(self._numbers)}.log"
        return EngineProcess(kind, model_dir, options, env, log,
                             start_timeout_s=target.timeouts.engine_start_s, start_method=target.start_method(kind),
                             run_time_env=late, wait=wait)

    def wait_built(self, name: str) -> None:
        """Wait for a build the run started in the background (phases.build_jobs): the tiny checkpoint with the
        o200k tokenizer, the exact check's slice; at once when none was started."""
        self.run.phases.wait_built(name)

    def default_info(self) -> dict[str, Any]:
        """What the default engine reported at its start, once it was handed out ({} before)."""
        proc = self.live.get(self._default_key())
        return dict(proc.info) if proc is not None else {}

    def start_ahead(self) -> None:
        """Start the next planned engine in the background, unless one started ahead is still unclaimed or
        `max_alive` engines exist already (an engine in use is never closed to make room for one ahead)."""
        while len(self.ahead) < self._depth and self._plans and self._room_ahead():
            mod, plan = self._plans[0]
            try:
                check, arguments = next(plan)
            except StopIteration:
                self._plans.pop(0)
                continue
            except (Exception, pytest.skip.Exception, pytest.fail.Exception):  # noqa: BLE001 - a plan that cannot
                # say (its checks will skip or fail, a build is missing) starts nothing more
                self._plans.pop(0)
                continue
            if not self._remaining.get((mod, check)):
                continue  # not selected, or its checks are over
            arguments = dict(arguments)
            key, kind, model_dir, options = self._key(arguments.pop("model", None), arguments.pop("kind", None),
                                                      arguments)
            if key not in self.live and key not in self.ahead:
                if self.held() + self.share_of(options) > MEMORY_SHARE_MAX + 1e-9:
                    continue  # no memory for it beside the engines alive: it starts when its check asks
                self.ahead[key] = (self._start(kind, model_dir, options, wait=False), (mod, check))
                self._share[key] = self.share_of(options)

    def _room_ahead(self) -> bool:
        """Whether one more engine may exist: below `max_alive`, or after closing the least recently used one
        that is neither the default nor the one handed out last (the running check may still use that one)."""
        if len(self.live) + len(self.ahead) < self.max_alive:
            return True
        victim = next((k for k in self.live if k not in (self._default_key(), self._last)), None)
        if victim is None:
            return False
        self._retire(self.live.pop(victim))
        return True

    def finished(self, nodeid: str) -> None:
        """A check ended: an engine started ahead for checks that are all over is closed (they did not ask)."""
        for name in self._item_names.get(nodeid, ()):
            self._remaining[name] -= 1
        for key, (proc, check) in list(self.ahead.items()):
            if not self._remaining.get(check):
                del self.ahead[key]
                self.unclaimed += 1
                self._retire(proc)
        self.start_ahead()

    def _retire(self, proc: EngineProcess) -> None:
        """Close an engine no check needs any more without waiting for it (vLLM takes ~2 s to release what it
        holds): it is asked now and waited for before the next engine that takes a share of the device's memory starts
        (`_settle`), else at the end of the run. One still starting is killed."""
        if proc.is_ready():
            proc.begin_close()
            self._closing.append(proc)
        else:
            proc.kill()  # still starting: nothing to wait for

    def _settle(self) -> None:
        """Wait until the engines retired so far have exited. vLLM measures the device's free memory while it starts
        and stops when another process frees memory meanwhile ("Error in memory profiling ... other processes sharing
        the same container release GPU memory"): on the H200, a vLLM engine forked from the forkserver reached that
        measurement about 20 s after its start, while a retired transformers engine was still exiting, and failed."""
        for proc in self._closing:
            proc.close()
        self._closing.clear()

    def close(self) -> None:
        self._plans.clear()
        for proc in [*self.live.values(), *(p for p, _ in self.ahead.values())]:
            self._retire(proc)  # all release at once, then each is waited for
        deadline = time.monotonic() + engine_worker.CLOSE_TIMEOUT_S  # one wait for all: they release side by side
        for proc in self._closing:
            proc.close(max(0.0, deadline - time.monotonic()))
        self._closing.clear()
        if self._planned:
            self.run.phases.record("engines_ahead_waited", self.ahead_waited)
            self.run.phases.record("engines_ahead_hidden", self.ahead_hidden)
            self.run.phases.record("engines_ahead_unclaimed", self.unclaimed + len(self.ahead))
        self.live.clear()
        self.ahead.clear()


@pytest.fixture(scope="session")
def engines(request: pytest.FixtureRequest, run: RunContext, model_under_test: ModelUnderTest) -> Any:
    target = run.resolved()
    if target.problems:
        pytest.fail(f"cannot test the engine: {target.sentence()}", pytrace=False)
    factory = EngineFactory(run, model_under_test, items=request.session.items)
    if capabilities.declared().has(run.engine, "memory_budget"):  # the fit preflight: fail closed, in one
        # sentence, before any engine starts
        from conformance.checkpoints import fit

        try:
            verdict = fit.gate(run.target, model_under_test.path, model_under_test.config, factory.options(),
                               model_under_test.name)
        except fit.FitError as exc:
            pytest.fail(f"the fit preflight could not run: {exc}", pytrace=False)
        if not verdict.ok:
            pytest.fail(f"fit preflight (profile {run.profile}): {verdict.sentence}", pytrace=False)
    run.engine_factory = factory
    factory.start_ahead()
    yield factory
    run.engine_factory = None
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
def run_dir(run: RunContext) -> Path:
    """The folder this run writes into (engine and server logs, lm-eval's and bench's outputs, the record)."""
    return run.run_dir


@pytest.fixture(scope="session")
def engine_options(run: RunContext, model_under_test: ModelUnderTest) -> dict[str, Any]:
    """What the engines fixture will start the default engine with (the run's --planted-fault included), for a
    check that must judge it before any engine starts."""
    return EngineFactory(run, model_under_test).options()


@pytest.fixture(scope="session")
def run_lineage(target: RunTarget, run: RunContext) -> str:
    """The lineage of this run's performance figures: target, the stack's fingerprint (collected now if the run
    has not yet), --combo and engine (conformance/verdicts/perf.py), the dtype and the serving profile
    (env_checks/baselines.py serving_lineage)."""
    from conformance.run.recorder import fingerprint
    from conformance.verdicts import perf
    from env_checks import baselines

    platform = perf.lineage_of(target.name, run.fingerprint or fingerprint(run), run.combo, target.engine)
    return baselines.serving_lineage(platform, target.dtype, run.profile)


@pytest.fixture(scope="session")
def target(run: RunContext) -> RunTarget:
    """What the run tests, built and validated once at configure (conformance/run/run_target.py): the target's
    name and table, torch's facts, the engine, the dtypes, the serving profile and the model."""
    return run.target


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
def limits(target: RunTarget) -> Limits:
    """Every limit of the run's dtype (conformance/verdicts/limits.py), validated at configure by the plugin."""
    return limits_for(target.dtype, target.name)


@pytest.fixture(scope="session")
def exact_limits(target: RunTarget) -> Limits | None:
    """The limits of the exact verdict's dtype (targets.toml `exact_dtype`); None where the target names none."""
    return limits_for(target.exact_dtype) if target.exact_dtype else None


@pytest.fixture(scope="session")
def tolerance(limits: Limits) -> tuple[LogprobTolerance, int]:
    """The run's greedy-parity limits and top-k: `limits.logprobs`, the view most checks need."""
    return limits.logprobs


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


@pytest.fixture(scope="session")
def reference(run: RunContext, model_under_test: ModelUnderTest, target: RunTarget) -> Iterator[Any]:
    """The fp64 reference; streaming (one layer and only routed experts resident) for big checkpoints; on the
    target's `reference_device` where it names one (data/targets.toml), spot-checked against the CPU. Its
    `reference` phase: its set-up plus every result the run computed (not those read from the cache or a pack;
    the computes happen inside the checks, so the phase overlaps their durations)."""
    from conformance.reference import cache as reference_cache
    from conformance.reference.device import SPENT, reference_for

    started, computed_before = time.perf_counter(), reference_cache.counts.compute_s
    spent_before = dict(SPENT)
    cfg = model_under_test.config
    resident = 2 * int(cfg["vocab_size"]) * int(cfg["hidden_size"]) * 8  # embeddings + lm_head in fp64
    host = _host_memory_bytes()
    if host and resident > host // 2:
        pytest.skip(f"the fp64 reference needs {resident / 2**30:.0f} GiB resident for embeddings and lm_head; "
                    f"this host has {host / 2**30:.0f} GiB")
    ref = reference_for(model_under_test.path, model_under_test.num_params > STREAMING_ABOVE_PARAMS,
                        target.table.get("reference_device"))
    set_up_s = time.perf_counter() - started
    yield ref
    run.phases.record("reference", set_up_s + reference_cache.counts.compute_s - computed_before)
    for what, seconds in SPENT.items():
        if seconds > spent_before[what]:
            run.phases.record(f"reference: {what}", seconds - spent_before[what])


@pytest.fixture(scope="session")
def engine_greedy(run: RunContext, engine: EngineProcess, prompts: PromptSet, tolerance: Any,
                  call_timeout_s: float) -> tuple[list[Completion], float]:
    """One greedy run of the prompt set with prompt logprobs, shared by the checks; and its seconds."""
    _, top_k = tolerance
    started = time.perf_counter()
    try:
        out = engine.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k, prompt_logprobs=True,
                          timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    run.phases.record("parity_decode", time.perf_counter() - started)
    return out, time.perf_counter() - started


@dataclass(frozen=True)
class FigureRecorder:
    """`record_figure(name, value)`: a measured figure, into results.json and the junit properties;
    `record_figure.limit(name, FigureLimit)`: the limit that figure was judged by, into the check's `limits`
    (record_figures calls it with each verdict's limits())."""

    node: pytest.Item

    def __call__(self, name: str, value: float) -> None:
        self.node.user_properties.append((f"figure:{name}", float(value)))

    def limit(self, name: str, limit: FigureLimit) -> None:
        self.node.user_properties.append((f"limit:{name}", limit.as_dict()))


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> FigureRecorder:
    """Record a measured figure (and, through record_figures, the limit it was judged by)."""
    return FigureRecorder(request.node)
