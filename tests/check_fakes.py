"""Stand-ins for the fixtures a check receives, so a control can call the check function itself with a
known-bad observation: a scripted engine answering `call(method, ...)` from a table, an engine factory,
the run context and a figure recorder, and the prompts, completions and stepwise runs such an engine answers
with. They replace the stack, never the check or its verdict helpers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.engines.base import Completion, StepLogprobs
from conformance.engines.observations import StepwiseRun
from conformance.run import run_target
from conformance.run.phases import Phases
from conformance.run.run_target import TargetReport
from conformance.verdicts.limits import limits_for

FAILED = (AssertionError, pytest.fail.Exception)  # how a check says no: assert, CheckFailed, pytest.fail


class ScriptedEngine:
    """An engine whose `call(method, *args)` answers from `answers` (a value, or a callable of the args)."""

    def __init__(self, answers: dict[str, Any] | None = None, **info: Any) -> None:
        self.answers = dict(answers or {})
        self.info = {"engine": "vllm", "platform": "cpu", "backends": {"attention": "CPU_ATTN"}} | info
        self.calls: list[tuple[str, tuple]] = []

    def call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        self.calls.append((method, args))
        if method not in self.answers:
            raise AssertionError(f"the control's engine was asked {method!r}, which it has no answer for")
        answer = self.answers[method]
        return answer(*args, **kwargs) if callable(answer) else answer

    def close(self) -> None:
        pass


class ScriptedEngines:
    """The `engines` fixture: `get(**overrides)` hands out `by_options[frozenset(overrides)]` or the default."""

    def __init__(self, default: ScriptedEngine, by_key: Callable[[dict], ScriptedEngine] | None = None,
                 options: dict | None = None, model_path: str | Path = "-") -> None:
        self.default, self.by_key, self._options = default, by_key, dict(options or {})
        self.model = SimpleNamespace(path=Path(model_path))
        self.asked: list[dict] = []

    def wait_built(self, name: str) -> None:
        """Nothing is built in the background for a scripted engine."""

    def get(self, **overrides: Any) -> ScriptedEngine:
        self.asked.append(overrides)
        if overrides and self.by_key is not None:
            return self.by_key(overrides)
        return self.default

    def options(self, **overrides: Any) -> dict:
        return self._options | overrides

    share_of = staticmethod(lambda options: float(options.get("gpu_memory_utilization") or 0.0))

    def hold(self, name: str, share: float | None) -> None:
        """What the factory counts beside its engines (EngineFactory.hold): recorded, in order."""
        self.held = [*getattr(self, "held", []), (name, share)]


class Figures:
    """The `record_figure` fixture: figures kept in a dict, and the limit each was judged by in another."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.limits: dict[str, Any] = {}

    def __call__(self, name: str, value: Any) -> None:
        self.values[name] = value

    def limit(self, name: str, limit: Any) -> None:
        self.limits[name] = limit


def target_of(target: str = "cpu", engine: str = "vllm", dtype: str = "float32", devices: list[str] | None = None,
              model_arg: str | None = None) -> run_target.RunTarget:
    """The `target` fixture: the RunTarget the plugin builds at configure, with torch's facts for these devices."""
    report = TargetReport(target, target, devices=list(devices or []))
    return run_target.build(target, engine, dtype, report, model=model_arg)


def run_ctx(target: str = "cpu", engine: str = "vllm", dtype: str = "float32", devices: list[str] | None = None,
            run_dir: Path | None = None, model_arg: str | None = None) -> SimpleNamespace:
    """The `run` fixture (the run's state), for the checks that write under the run's folder: its `target` is
    target_of(...), its views of the target as RunContext has them."""
    spec = target_of(target, engine, dtype, devices, model_arg)
    return SimpleNamespace(resolved=lambda: spec.report, engine=engine, dtype_name=dtype, run_dir=run_dir or Path("."),
                           model_arg=model_arg, target=spec, profile=spec.profile and spec.profile.label,
                           phases=Phases())


class CollectedItem:
    """What `expectations.apply_expectations` reads and writes on a collected item."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid, self.markers, self.stash = nodeid, [], {}

    def add_marker(self, marker) -> None:
        self.markers.append(marker)


def scoring(score: Callable[[list[int], list[int], int], Any]) -> SimpleNamespace:
    """A reference that scores a path with `score(prompt, tokens, top_k)`, one path or all of a list (`score_all`)."""
    return SimpleNamespace(score=score, score_all=lambda outs, k: [score(c.prompt_ids, c.token_ids, k) for c in outs])


TOL = limits_for("float32").logprobs
PROMPTS = SimpleNamespace(prompts=[list(range(1, 40)), list(range(50, 60)), list(range(70, 90))], max_tokens=4)


def completion(prompt: list[int], tokens: list[int], lp: float = -0.5) -> Completion:
    return Completion(list(prompt), list(tokens), [StepLogprobs(t, {t: lp, t + 1: lp - 3}) for t in tokens])


def greedy(reqs, tokens_of=lambda p: [p[-1] % 90 + 1, 2, 3, 4]):
    return [completion(p, tokens_of(p)) for p in reqs]


def sequence(*answers):
    """An answer that gives `answers` one after the other (the last one repeats)."""
    it = iter(answers)
    last = {}

    def next_answer(*args, **kwargs):
        last["v"] = next(it, last.get("v"))
        return last["v"]
    return next_answer


def stepwise(completions, trace=(), first=None, arrivals=None, unfinished=0) -> StepwiseRun:
    n = len(completions)
    return StepwiseRun(completions, list(trace), first or [0] * n, [5] * n, arrivals or [0] * n, [], 8, unfinished)


def fails(check, *args, match: str) -> None:
    """Run a check's body and require it to say no, with a message matching `match`."""
    with pytest.raises(FAILED, match=match):
        check(*args)
