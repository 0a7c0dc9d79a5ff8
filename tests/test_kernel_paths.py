"""The kernel-path sweep's plan and verdict on crafted sweeps (conformance/verdicts/kernel_paths.py): thresholds for
every backend row, the forwards planned around them within the engine's limits, each forward judged on the positions
it computed, a wrong forward named by its token count and the forwards that read its cache told apart."""

from __future__ import annotations

import pytest

from conformance import datafiles
from conformance.datafiles import DataError
from conformance.engines.base import Completion, StepLogprobs
from conformance.engines.observations import Forward, ForwardSpan, ForwardSweep
from conformance.verdicts import kernel_paths as kp

CPU_LIMITS = {"max_num_seqs": 256, "max_num_batched_tokens": 4096, "enable_chunked_prefill": True,
              "max_model_len": 1024, "block_size": 128, "cudagraph_capture_sizes": []}
BOUNDS = kp.ForwardLimits(5e-3, 2e-4, 5)


def test_every_backend_row_of_the_profiles_has_thresholds():
    backends = datafiles.load_toml(datafiles.DATA / "profiles.toml")["backend"]
    for name in backends:
        assert kp.thresholds_for(name).moe_tokens
    with pytest.raises(DataError, match=r"kernel_paths.toml has no \[backend.nope\] row"):
        kp.thresholds_for("nope")


def test_the_cpu_plan_crosses_each_threshold_within_the_engine_limits():
    plan = kp.sweep_plan(kp.thresholds_for("cpu"), CPU_LIMITS)
    prefill = {p.tokens for p in plan if p.kind == "prefill"}
    assert {511, 512, 513, 127, 128, 129, 4095, 4096} <= prefill and max(prefill) == 4096
    assert all(sum(p.lengths) == p.tokens and max(p.lengths) <= 1022 for p in plan if p.kind != "decode")
    chunked = [p for p in plan if p.kind == "chunked"]
    assert [p.tokens for p in chunked] == [4097]
    assert {p.tokens for p in plan if p.kind == "decode"} == {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33}
    graphs = kp.sweep_plan(kp.thresholds_for("cuda-triton"), CPU_LIMITS | {"cudagraph_capture_sizes": [1, 2, 512]})
    assert {511, 512, 513} <= {p.tokens for p in graphs if p.kind == "prefill"}


def _step(token: int, lp: float) -> StepLogprobs:
    return StepLogprobs(token, {token: lp, token + 1: lp - 1.0})


def _sweep(bad_forward: int | None) -> tuple[ForwardSweep, list[Completion], list[kp.PlannedForward]]:
    """Two groups: a prefill of 3 tokens; a prefill of 600 tokens chunked as 512 + 88 (the budget 512)."""
    plan = [kp.PlannedForward("prefill", 3, (3,), 1, ("moe 4",)),
            kp.PlannedForward("chunked", 600, (600,), 1, ("max_num_batched_tokens 512",))]
    forwards = [Forward(3, [ForwardSpan(0, 0, 3)]), Forward(512, [ForwardSpan(1, 0, 512)]),
                Forward(88, [ForwardSpan(1, 512, 88)])]
    got, want = [], []
    for r, n in enumerate((3, 600)):
        prompt = list(range(n))
        off = [0.0] * n
        if bad_forward == 1 and r == 1:
            off = [0.5 if t < 512 else 0.05 for t in range(n)]
        got.append(Completion(prompt, [7], [_step(7, -1.0 + off[-1])],
                              [_step(t + 1, -2.0 + off[t]) for t in range(n - 1)]))
        want.append(Completion(prompt, [7], [_step(7, -1.0)], [_step(t + 1, -2.0) for t in range(n - 1)]))
    return ForwardSweep(got, forwards, [0, 1]), want, plan


def test_a_clean_sweep_passes_with_each_forward_judged():
    sweep, want, plan = _sweep(None)
    report = kp.forwards_close(sweep, want, plan, 512, BOUNDS)
    assert report.ok, report.failure_message()
    assert [f.kind for f in report.forwards] == ["prefill", "prefill", "chunk"]
    assert report.figures()["forwards_run"] == 3


def test_a_wrong_forward_is_named_and_the_chunk_after_it_told_apart():
    sweep, want, plan = _sweep(1)
    report = kp.forwards_close(sweep, want, plan, 512, BOUNDS)
    message = report.failure_message()
    assert not report.ok and "forwards of 512 (prefill) tokens disagree" in message
    assert "forwards of 3 tokens agree" in message
    assert "its sequences' cache was written by failing forward(s) [1]" in message
    assert report.figures()["smallest_failing_forward_tokens"] == 512


def test_a_threshold_the_engine_did_not_cross_fails():
    sweep, want, plan = _sweep(None)
    sweep.forwards[1:] = [Forward(600, [ForwardSpan(1, 0, 600)])]
    report = kp.forwards_close(sweep, want, plan, 512, BOUNDS)
    assert "ran as forwards of [600] tokens, not [512, 88]" in report.failure_message()
