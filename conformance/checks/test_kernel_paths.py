"""Kernel paths by shape: the engine's forwards at the token counts where kernels change path (data/kernel_paths.toml,
per backend), each judged against the fp64 reference. The same sweep at TP > 1: checks/test_tp_sharding.py."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.checks import call_or_fail
from conformance.datafiles import DataError
from conformance.verdicts import kernel_paths
from conformance.verdicts.verdict import fail, record_figures

AREA = "model-math"


def backend_of(target: Any) -> str:
    """The backend row the engine runs (profiles.toml [backend.<name>]): the key of its kernel-path thresholds."""
    if target.profile is None:
        fail(f"the run has no serving profile for the {target.engine} engine: no backend row names its kernel paths")
    return target.profile.backend.name


def sweep_forwards(engine: Any, reference: Any, backend: str, limits: Any, call_timeout_s: float,
                   record_figure: Any, name: str = "engine") -> kernel_paths.KernelPathReport:
    """The sweep on `engine` and its verdict, figures recorded (this check's body, and the TP check's)."""
    bounds = limits.kernel_paths
    if bounds is None:
        fail(limits.missing["kernel_paths"])
    try:
        thresholds = kernel_paths.thresholds_for(backend)
    except DataError as exc:
        fail(str(exc))
    engine_limits = call_or_fail(engine, "scheduler_limits", timeout_s=call_timeout_s)
    plan = kernel_paths.sweep_plan(thresholds, engine_limits)
    prompts = kernel_paths.SweepPrompts.build(plan, int(reference.cfg["vocab_size"]), thresholds.seed)
    sweep = call_or_fail(engine, "forward_sweep", prompts.groups, bounds.top_k, timeout_s=call_timeout_s)
    want = kernel_paths.reference_paths(sweep.completions, prompts, reference, bounds.top_k + 5)
    report = kernel_paths.forwards_close(sweep, want, plan, int(engine_limits["max_num_batched_tokens"]), bounds,
                                         (name, "fp64 reference"))
    record_figures(record_figure, report)
    return report


@pytest.mark.p1
@pytest.mark.needs("scheduler")
def test_forwards_match_reference_across_kernel_thresholds(engine, target, reference, limits, call_timeout_s,
                                                           record_figure):
    """A sweep of forwards of t-1, t and t+1 tokens for every threshold t where the backend's kernels change path
    (data/kernel_paths.toml, per backend row: MoE token counts around powers of two and the MoE kernel's tuned M
    buckets, decode batches at the sizes graphs are captured at, and read from the engine: its KV block size, its
    chunk (the token budget: one token past it must be split) and its largest captured graph), capped by the engine's
    limits, run on the engine under test one group at a time (a forward of more tokens than one prompt holds is
    several prompts in one forward); the scheduler's own record says which forward computed which positions. Every
    forward is judged against the fp64 reference on the positions it computed, the failure naming the token counts
    whose forwards disagree; a planned forward the engine ran otherwise fails too (the threshold was not crossed).
    On the CPU default: 49 groups, 64 forwards of 1-4096 tokens at 42 token counts (4097 offered once: chunked),
    25,482 positions, in one engine call; at TP 2 the TP engine's budget (8192) adds forwards up to 8192.

    Catches: a kernel path taken at some token counts only — a fused-MoE tile config, padding or kernel chosen by M
    (vllm-project/vllm#44679: AITER dispatching another MoE kernel at another shape, GSM8K 0.896 -> 0.684), an
    attention path wrong across a KV block boundary or in the second chunk of a split prefill, a graph replayed at a
    padded batch size that computes the padding into real rows — none of which the fixed prompt set crosses on purpose.
    Reference: https://github.com/vllm-project/vllm/issues/44679 ;
      https://docs.vllm.ai/en/latest/configuration/optimization.html#chunked-prefill ; docs/model.md
      "The math a reference must reproduce"
    Limits: tolerances.toml [kernel_paths.<dtype>]
    Controls:
      tests/controls/test_kernel_paths_controls.py::test_kernel_path_check_fails_on_a_moe_wrong_above_512_tokens,
      tests/controls/test_kernel_paths_controls.py::test_kernel_path_check_passes_a_clean_engine
    """
    sweep_forwards(engine, reference, backend_of(target), limits, call_timeout_s, record_figure).raise_if_failed()
