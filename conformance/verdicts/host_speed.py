"""The host's own speed beside each serving measurement. A server's scheduler, tokenizer and sampler run on one host
core per step, so where the model is small for its GPU (the tiny model on an H200: 1.4-2.3 ms a token) the serving
figures measure the host as much as the GPU. Three whole P2 runs of one stack on H200 nodes that fingerprint alike
(the same CPU model string, core count, flags, kernel, driver) lay 0.66-0.88 apart in output throughput at
concurrency 8 and up, with GEMM within 5%, clocks at 1980 MHz and no other process on the GPU; every start-up was
slower on the slow node too. A pin is therefore a figure of its host as well as of its stack.

Each level records `host_single_thread_mops` (env_checks.host.single_thread_mops: the best of a few timings of a
fixed pure-Python loop) and `host_copy_gbs` (env_checks.host.copy_gbs: one core's memcpy of a buffer larger than the
caches; two H100 nodes alike in the first lay 1.8x apart in the second), and pins take their
medians like any figure; the run's fingerprint records them once too. A level that misses its pin on a host
measurably slower than the pinned runs' by either probe (perf.toml [host_speed]) fails as `slower_host`, saying by
how much, not as the stack's failure: it is not a like-for-like comparison. A level that meets its pin stands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conformance.verdicts.verdict import CheckFailed
from env_checks.baselines import HOST_FIGURES


class SlowerHost(CheckFailed):
    """A figure missed against a pin measured on a faster host. A run record classes the check `slower_host`
    (runrecord.classify)."""

    failure_class = "slower_host"


def slower_by(measured: dict[str, float], baseline: Any, tolerance: float) -> tuple[str, float] | None:
    """The host figure (baselines.HOST_FIGURES) by which this run's host is slowest against the pinned runs', with
    its ratio, where that is below 1 - tolerance (or below the figure's own spread, where that is wider); None where
    no figure is, or where no figure was measured on both sides."""
    slower = []
    for figure in HOST_FIGURES:
        here, there = measured.get(figure), baseline.figures.get(figure)
        if here and there and here / there < 1.0 - max(tolerance, baseline.spread.get(figure, 0.0)):
            slower.append((here / there, figure))
    if not slower:
        return None
    ratio, figure = min(slower)
    return figure, ratio


@contextmanager
def explains(measured: dict[str, float], baseline: Any, tolerance: float) -> Iterator[None]:
    """A verdict against `baseline` (perf.Baseline) that fails inside the block fails as `slower_host` where this
    host measured slower than the pinned runs' host; where the pin measured no host speed, the failure says so."""
    try:
        yield
    except CheckFailed as exc:
        if isinstance(exc, SlowerHost):
            raise
        slower = slower_by(measured, baseline, tolerance)
        if slower is not None:
            figure, ratio = slower
            probe, unit = HOST_FIGURES[figure]
            raise SlowerHost(
                f"{exc} — but this host ran the suite's {probe} at {ratio:.2f} of the speed of the pinned runs' host "
                f"({measured[figure]:.3g} against {baseline.figures[figure]:.3g} {unit}): a slower host alone slows "
                "serving, most where the model is small for its GPU, so this is not a like-for-like comparison. Pin "
                "this machine's own runs (`conformance baseline promote`), or measure on the pinned host.") from exc
        if not any(f in baseline.figures for f in HOST_FIGURES) and type(exc) is CheckFailed:
            raise CheckFailed(f"{exc} (the pinned runs measured no host speed ({', '.join(HOST_FIGURES)}), so a "
                              "slower host cannot be told apart from a slower stack)") from exc
        raise
