"""The engine factory starts the engines a check module plans for ahead of the checks that ask for them
(conformance/run/fixtures.py EngineFactory, `engines_ahead` in data/targets.toml): real engines (the transformers
engine on the tiny model, ~0.5 s each), stand-in pytest items."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.checks import (
    test_bad_requests,
    test_kv_accounting,
    test_long_context,
    test_model_math,
    test_scheduling,
)
from conformance.engines.worker import EngineError, EngineProcess
from conformance.run import fixtures
from conformance.run.fixtures import EngineFactory, ModelUnderTest
from tests.check_fakes import run_ctx

T = {"kind": "transformers"}


def _items(module: types.ModuleType, names: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(module=module, name=n, originalname=n.split("[")[0], nodeid=f"{module.__name__}::{n}")
            for n in names]


def _factory(tiny, tmp_path: Path, items, target: str = "cpu", depth: int | None = 1) -> EngineFactory:
    """A factory over real engines; `depth` engines start ahead (None: as the target's data says)."""
    run = run_ctx(target, run_dir=tmp_path)
    if depth is not None:
        run.target = dataclasses.replace(run.target, table=run.target.table | {"engines_ahead": depth})
    run.startups, run.engine_info = [], {}
    model = ModelUnderTest("tiny", tiny.path, None, {}, 0)
    return EngineFactory(run, model, items=items)


def test_planned_engines_start_ahead_in_order_and_unclaimed_ones_are_closed(tiny, tmp_path):
    plan_module = types.ModuleType("planned")

    def engines_ahead(engines):
        yield "check_a", T
        yield "check_b", T | {"dtype": "float64"}
        yield "check_c", T | {"dtype": "bfloat16"}   # deselected: never started
        yield "check_d", T | {"dtype": "float16"}    # selected, but its check ends without asking
        pytest.skip("the rest of this module skips")  # a plan that cannot go on starts nothing more

    plan_module.engines_ahead = engines_ahead
    items = _items(plan_module, ["check_a", "check_b", "check_d", "check_e"])
    factory = _factory(tiny, tmp_path, items)
    try:
        factory.start_ahead()
        assert len(factory.ahead) == 1, "the first planned engine starts ahead, and only it"
        first = next(iter(factory.ahead.values()))[0]
        got = factory.process(**T)
        assert got is first and got.info["engine"] == "transformers", "get() hands out the engine started ahead"
        second = next(iter(factory.ahead.values()))[0]
        factory.finished(items[0].nodeid)
        assert factory.process(**T, dtype="float64") is second
        third = next(iter(factory.ahead.values()))[0]
        assert len(factory.ahead) == 1 and "float16" in next(iter(factory.ahead)), (
            f"check_c is not selected, so check_d's engine starts next: {list(factory.ahead)}")
        factory.finished(items[1].nodeid)
        factory.finished(items[2].nodeid)  # check_d ended without asking: its engine is closed
        assert not factory.ahead, "the engine of a check that is over stays unclaimed"
        third._proc.join(10)
        assert not third._proc.is_alive(), "an unclaimed engine started ahead is stopped"
        assert factory.unclaimed == 1
        factory.finished(items[3].nodeid)
        assert not factory.ahead and not factory._plans, "the plan that skipped starts nothing more"
        assert [what for what, _ in factory.run.startups] == ["transformers engine"] * 2
        assert factory.ahead_hidden >= 0 and factory.ahead_waited >= 0
    finally:
        factory.close()


def _abc_items():
    """Items of checks a, b and c, whose module plans an engine each: float32, float64, bfloat16."""
    plan_module = types.ModuleType("planned")
    plan_module.engines_ahead = lambda engines: iter([("a", T), ("b", T | {"dtype": "float64"}),
                                                      ("c", T | {"dtype": "bfloat16"})])
    return _items(plan_module, ["a", "b", "c"])


def test_engines_started_ahead_count_toward_max_alive_and_never_displace_the_one_in_use(tiny, tmp_path):
    items = _abc_items()
    factory = _factory(tiny, tmp_path, items)
    factory.max_alive = 2
    try:
        factory.start_ahead()
        a = factory.process(**T)
        assert len(factory.live) + len(factory.ahead) == 2, "one engine live, the next starting ahead"
        b = factory.process(**T, dtype="float64")
        assert len(factory.live) + len(factory.ahead) == 2 and b in factory.live.values()
        a._proc.join(10)
        assert not a._proc.is_alive(), "the least recently used engine made room for the one ahead"
        assert list(factory.live.values()) == [b] and len(factory.ahead) == 1, "c starts while b runs"
    finally:
        factory.close()
    single = _factory(tiny, tmp_path / "single", items)
    single.max_alive = 1
    try:
        single.start_ahead()
        only = single.process(**T)
        assert not single.ahead and only._proc.is_alive(), "no room: the engine handed out last is not closed"
    finally:
        single.close()


def test_the_cpu_target_starts_two_ahead_and_closes_engines_without_waiting_for_each(tiny, tmp_path):
    items = _abc_items()
    factory = _factory(tiny, tmp_path, items, depth=None)
    assert int(factory.run.target.table["engines_ahead"]) == 2  # data/targets.toml [cpu]
    factory.max_alive = 2
    try:
        factory.start_ahead()
        assert len(factory.ahead) == 2, "the next two planned engines start at once"
        a = factory.process(**T)
        factory.process(**T, dtype="float64")  # no room for c: a, least recently used, is asked to close
        assert factory._closing == [a] and a._closing, "an engine made room for another is retired, not waited for"
    finally:
        factory.close()
    assert not factory._closing and not a._proc.is_alive(), "the end of the run waits for every retired engine"


def test_an_engine_that_fails_to_start_ahead_fails_the_check_that_asks_for_it(tiny, tmp_path):
    plan_module = types.ModuleType("planned")
    plan_module.engines_ahead = lambda engines: iter([("check_a", T | {"enforce_eager": "sometimes"})])
    factory = _factory(tiny, tmp_path, _items(plan_module, ["check_a"]))
    try:
        factory.start_ahead()
        assert len(factory.ahead) == 1
        with pytest.raises(EngineError, match="enforce_eager must be true, false or absent"):
            factory.process(**T, enforce_eager="sometimes")
        assert not factory.ahead and not factory.live
    finally:
        factory.close()


def test_nothing_starts_ahead_where_the_target_says_0(tiny, tmp_path):
    plan_module = types.ModuleType("planned")
    plan_module.engines_ahead = lambda engines: iter([("check_a", T)])
    factory = _factory(tiny, tmp_path, _items(plan_module, ["check_a"]), target="cuda", depth=None)
    factory.start_ahead()
    assert not factory.ahead and not factory._plans
    assert int(factory.run.target.table.get("engines_ahead", 0)) == 0


def test_the_check_modules_plans_name_their_own_checks(tiny, tmp_path):
    """Each planned entry names a check of its module (a typo would start an engine nobody asks for) and
    gives get() arguments the factory accepts."""
    modules = [test_bad_requests, test_kv_accounting, test_long_context, test_model_math, test_scheduling]
    run = run_ctx("cpu", run_dir=tmp_path)
    config = json.loads((tiny.path / "config.json").read_text())
    model = ModelUnderTest("tiny", tiny.path, None, config, 0)
    factory = EngineFactory(run, model)
    engines = SimpleNamespace(target=run.target, model=model, options=factory.options,
                              default_info=lambda: {"block_size": 128}, wait_built=factory.wait_built)
    for module in modules:
        entries = list(module.engines_ahead(engines))
        assert entries, module.__name__
        for check, arguments in entries:
            assert callable(getattr(module, check.split("[")[0], None)), f"{module.__name__} plans for {check}"
            assert set(arguments) - {"model", "kind"} <= set(EngineFactory(run, model).options(**arguments)), check


@pytest.mark.parametrize("target", ["cuda", "rocm"])
def test_float32_engines_of_gpu_targets_get_ieee_triton_dots(target, tiny, tmp_path, monkeypatch):
    """First contact on the H200: vLLM's float32 engine ran its Triton kernels with TF32 dots (Triton's default) and
    the exact verdict failed (max |dlogprob| 1.06 against 0.002); targets.toml [<target>.env_by_dtype.float32] now
    gives float32 engines TRITON_F32_DEFAULT=ieee, and engines of other dtypes keep Triton's default. Triton reads it
    as it compiles (targets.toml `run_time_env`), so the float32 engine gets it after its fork and starts with the
    forkserver's environment: it forks as the others do, instead of spawning (about 22 s of imports at real size)."""
    from conformance.run import fixtures

    started: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    monkeypatch.setattr(fixtures, "EngineProcess", lambda kind, model, options, env, log, run_time_env, **_:
                        started.setdefault(options["dtype"], (env, run_time_env)))
    factory = _factory(tiny, tmp_path, [], target=target, depth=0)
    for dtype in ("float32", "bfloat16"):
        factory._start("vllm", str(tiny.path), {"dtype": dtype})
    (f32_env, f32_late), (bf16_env, bf16_late) = started["float32"], started["bfloat16"]
    assert (f32_env | f32_late)["TRITON_F32_DEFAULT"] == "ieee"
    assert "TRITON_F32_DEFAULT" not in bf16_env | bf16_late
    assert f32_late == {"TRITON_F32_DEFAULT": "ieee"} and f32_env == bf16_env == dict(factory.target.env)
    # a variable the stack reads at import still keeps the child from forking
    env, late = factory.target.fork_env(dict(factory.target.env) | {"VLLM_USE_V1": "0"})
    assert late == {} and env != dict(factory.target.env)  # forkserver.context(env) is None: it spawns


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_server_starts_with_the_options_and_environment_of_the_engines(tiny, tmp_path, dtype, monkeypatch):
    """One place builds what a vLLM process starts with (RunTarget.process_options/process_env): the engines and the
    suite's server of one run agree on every option and variable but the server's own (first contact on the H200
    in fp16: the server, built apart, took FA3 while the engines ran the profile's TRITON_ATTN row)."""
    from conformance.run import fixtures, serving_fixtures

    started: dict[str, dict[str, str]] = {}
    monkeypatch.setattr(fixtures, "EngineProcess",
                        lambda kind, model, options, env, log, **_: started.setdefault("env", env))
    run = run_ctx("cuda", dtype=dtype, devices=["NVIDIA H200"], run_dir=tmp_path)  # the h200-tiny profile
    run.target = dataclasses.replace(run.target, table=run.target.table | {"engines_ahead": 0})
    run.startups, run.engine_info = [], {}
    factory = EngineFactory(run, ModelUnderTest("tiny", tiny.path, None, {}, 0), items=[])
    engine_options = factory.options("vllm")
    assert engine_options.get("attention_backend") == ("TRITON_ATTN" if dtype == "float16" else None)
    factory._start("vllm", str(tiny.path), engine_options)
    server = serving_fixtures.new_server(factory.target, SimpleNamespace(path=tiny.path, name="tiny"), tmp_path,
                                         tmp_path / "server.log")
    assert server.options == engine_options and engine_options["dtype"] == dtype
    kept = {k: v for k, v in started["env"].items() if k not in serving_fixtures.NOT_FOR_SERVER}
    assert kept.items() <= server.env.items()
    # and vLLM's torch.compile cache key sees the same variables: the server reads what the engine compiled
    assert _compile_factors(server.env, monkeypatch) == _compile_factors(started["env"], monkeypatch)


def _compile_factors(env: dict[str, str], monkeypatch) -> dict:
    """What vLLM hashes of a process environment into its torch.compile cache key (vllm.envs.compile_factors)."""
    import os

    from vllm import envs

    with monkeypatch.context() as m:
        for key in [k for k in os.environ if k.startswith("VLLM_")]:
            m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        return envs.compile_factors()


class _FakeProcess:
    """A stand-in engine process: what the factory reads of one (ready, info, its log, close)."""

    def __init__(self, kind, model_dir, options, log_path, *args, **kwargs) -> None:
        self.options, self.closed, self.info, self.log_path = options, False, {"engine": kind}, log_path
        self.started_at = self.ready_at = 0.0

    def call(self, method, *args, **kwargs):
        if self.closed:
            raise EngineError("the engine process exited")
        return method

    def close(self, timeout_s=None) -> None:
        self.closed = True

    def is_ready(self) -> bool:
        return not self.closed

    def begin_close(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.closed = True


def _share_factory(tiny, tmp_path, share: float, monkeypatch) -> EngineFactory:
    run = run_ctx("cuda", run_dir=tmp_path)
    run.startups, run.engine_info = [], {}
    factory = EngineFactory(run, ModelUnderTest("tiny", tiny.path, None, {}, 0))
    started = []

    def start(kind, model_dir, options, wait=True):
        started.append(options)
        return _FakeProcess(kind, model_dir, options, tmp_path / f"engine-{len(started)}.log")  # never written
    monkeypatch.setattr(factory, "_start", start)
    monkeypatch.setattr(factory, "options", lambda kind=None, **o: {"gpu_memory_utilization": share} | o)
    factory.started = started
    return factory


def test_engines_that_cannot_share_the_device_take_turns_and_handles_start_them_again(tiny, tmp_path, monkeypatch):
    """gpt-oss-120b's profile gives each engine 0.9 of the device: the default engine is closed (and waited for)
    to start another, and the `engine` handle starts it again when a check uses it; the server's share counts
    too. With the tiny model's 0.3 on an H200 two engines and the server fit, and nothing is closed."""
    big = _share_factory(tiny, tmp_path, 0.9, monkeypatch)
    engine = big.get()
    default = engine.process()
    other = big.get(block_size=16)
    assert default.closed and list(big.live) == [big._key(None, None, {"block_size": 16})[0]]
    assert engine.call("generate_greedy") == "generate_greedy", "the handle started the default again"
    assert other.process() is not None and len(big.live) == 1 and len(big.started) == 4, "and the other again"
    big.hold("vllm-server", 0.9)
    assert not big.live, "the server's share leaves no room for an engine beside it"
    big.hold("vllm-server", None)
    assert big.held() == 0.0

    small = _share_factory(tiny, tmp_path / "small", 0.3, monkeypatch)
    first = small.get()
    small.get(block_size=16)
    small.hold("vllm-server", 0.3)
    assert len(small.live) == 2 and not first.process().closed and len(small.started) == 2


def test_three_tiny_gpu_engines_stay_alive_and_a_fourth_closes_by_share(tiny, tmp_path, monkeypatch):
    """targets.toml engines_alive = 3 on GPUs: P1 on the H200 started two engines twice at 2 (about 65 s each); the
    tiny model's three 0.3 engines now stay, and a fourth beside the server closes the least recently used."""
    factory = _share_factory(tiny, tmp_path, 0.3, monkeypatch)
    assert factory.max_alive == 3
    factory.get()
    factory.get(block_size=16)
    factory.get(block_size=32)
    assert len(factory.live) == 3 and len(factory.started) == 3
    factory.get(block_size=16)  # asked again: alive, not started again
    assert len(factory.started) == 3
    factory.hold("vllm-server", 0.3)  # 4 x 0.3 > 1: the least recently used goes
    assert len(factory.live) == 2 and factory.held() <= 1.0


def test_an_engine_that_measures_the_device_memory_starts_after_the_retired_ones_exited(tiny, tmp_path, monkeypatch):
    """An engine given a share of the device's memory (vLLM's gpu_memory_utilization) starts only once every engine
    retired before it has exited: vLLM stops when memory is freed while it measures (fixtures.py `_settle`). Real
    transformers engines stand in (they ignore the share); what was still closing is noted as each engine starts."""
    factory = _factory(tiny, tmp_path, items=None)
    factory.max_alive = 1
    alive_at_start: list[list[bool]] = []

    def noted(*args, **kwargs):
        alive_at_start.append([p._proc.is_alive() for p in factory._closing])
        return EngineProcess(*args, **kwargs)

    monkeypatch.setattr(fixtures, "EngineProcess", noted)
    try:
        first = factory.process(**T)
        factory.process(**T, dtype="float64")  # no share: the first is retired and not waited for
        assert alive_at_start[-1] == [True], "an engine without a share starts beside one still closing"
        factory.process(**T, dtype="bfloat16", gpu_memory_utilization=0.3)
        assert alive_at_start[-1] == [], f"an engine with a share started beside a closing one: {alive_at_start}"
        assert not first._proc.is_alive()
    finally:
        factory.close()
