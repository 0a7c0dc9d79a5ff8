"""A measurement taken while another job held the GPU (conformance/engines/gpu_sharers.py). Sharing only ever slows
the stack down, so a figure that meets its floor or its pin on a shared GPU stands; one that misses is not the
stack's verdict: it fails as `shared_gpu`, naming the other processes, not as a new failure. Either way the
measurement records `gpu_foreign_processes` and is never a baseline (env_checks.baselines.unpinnable_because)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from conformance.engines import gpu_sharers
from conformance.verdicts.verdict import CheckFailed
from env_checks.baselines import SHARED_FIGURE


class GpuShared(CheckFailed):
    """A figure missed on a GPU another process held. A run record classes the check `shared_gpu`
    (runrecord.classify)."""

    failure_class = "shared_gpu"


class Watch:
    """The GPU's other processes before and after a measurement. `judge` False (a server the suite did not start:
    its processes are not known) reads nothing; so does a host where NVML and amdsmi cannot tell."""

    def __init__(self, judge: bool = True) -> None:
        self.sharers = gpu_sharers.now() if judge else None

    def stop(self) -> None:
        if self.sharers is not None:
            self.sharers = gpu_sharers.merge(self.sharers, gpu_sharers.now())

    def figures(self) -> dict[str, float]:
        return {} if self.sharers is None else {SHARED_FIGURE: float(len(self.sharers))}

    @contextmanager
    def explains(self) -> Iterator[None]:
        """A verdict that fails inside the block fails as `shared_gpu` where the GPU was shared."""
        try:
            yield
        except CheckFailed as exc:
            if not self.sharers or isinstance(exc, GpuShared):
                raise
            raise GpuShared(f"{exc} — but another process held the GPU while this was measured: "
                            + "; ".join(p.describe() for p in self.sharers)
                            + ". A shared GPU is slower for every job on it, so this is not a verdict on the stack: "
                            "measure again on a GPU nothing else uses.") from exc
