"""Process groups in child processes: a launcher that starts W ranks on 127.0.0.1, runs one function
in each and brings back what rank 0..W-1 returned, with a deadline. A hung collective becomes a
`Timeout` failure naming the ranks that never finished; a rank that raises or dies becomes a failure
with its traceback or signal (docs/architecture.md, rules 5 and 7). Also: the per-target plans read from
data/distributed.toml and nccl-tests' bus-bandwidth formulas.

Ranks are forked from the run's forkserver (conformance/engines/forkserver.py), which has imported torch once,
so a launch costs well under a second after the first (spawning 8 fresh interpreters costs ~15 s on
2 cores). The forkserver never touches a GPU, so CUDA/HIP is initialised only in the ranks.
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from typing import Any

from conformance import datafiles
from conformance.engines import forkserver
from conformance.verdicts.compare import CheckFailed

# Rank 0 has already failed: how long the others get to report before they are killed (they are
# usually blocked in a collective waiting for it).
PEER_GRACE_S = 3.0


class DistributedFailure(CheckFailed):
    """A launch that did not bring back a result from every rank: timeout, exception or crash."""


class DistributedTimeout(DistributedFailure):
    failure_class = "timeout"


@dataclass(frozen=True)
class Launch:
    """How to start one process group."""

    world_size: int
    backend: str
    device: str  # "cpu" or "cuda" (HIP devices are "cuda" in torch)
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RankContext:
    """What a rank function is given: its rank, the group size, its device and a progress channel."""

    rank: int
    world_size: int
    device: str
    _queue: Any = None

    def progress(self, what: str) -> None:
        """Say what the rank is about to do, so a timeout can name the step that hung."""
        if self._queue is not None:
            self._queue.put(("progress", self.rank, what))

    @property
    def torch_device(self) -> Any:
        import torch

        return torch.device("cpu") if self.device == "cpu" else torch.device(self.device, self.rank)


@cache
def data() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "distributed.toml")


def world_size_for(value: int | str, gpus: int) -> int:
    """A world size from data: a number, or "gpus" for one process per visible GPU."""
    return gpus if value == "gpus" else int(value)


def collective_plan(target: str, gpus: int) -> tuple[Launch | None, str]:
    """The launch for the collective checks on this target, or None and the reason it does not apply."""
    row = data()["collectives"][target]
    world = world_size_for(row["world_size"], gpus)
    if world < 2:
        return None, (f"target {target}: {gpus} GPU(s) visible; collectives need at least 2 "
                      f"(run on a multi-GPU machine)")
    return Launch(world, row["backend"], row["device"], float(row["timeout_s"]), dict(row.get("env", {}))), ""


def host_plan(world_size: int, timeout_s: float) -> Launch:
    """W ranks on the host's CPU with the CPU target's backend (gloo): for reference math that is
    sharded across processes on any target."""
    row = data()["collectives"]["cpu"]
    return Launch(world_size, row["backend"], "cpu", timeout_s, dict(row.get("env", {})))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _context() -> Any:
    return forkserver.context()


def _rank_main(rank: int, port: int, plan: Launch, target: Callable[..., Any], args: tuple, out: Any) -> None:
    # The forkserver's environment is the parent's at its start: set everything the backend reads here.
    os.environ.update(plan.env)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(plan.world_size), "LOCAL_RANK": str(rank)})
    import torch
    import torch.distributed as dist

    ctx = RankContext(rank, plan.world_size, plan.device, out)
    # W ranks share the host's cores: without this each starts a full-size thread pool and they thrash
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // plan.world_size))
    try:
        ctx.progress("init_process_group")
        if plan.device != "cpu":
            torch.cuda.set_device(rank)
        # The parent's deadline decides hangs; the group's own timeout only has to be longer.
        dist.init_process_group(plan.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=plan.world_size, timeout=timedelta(seconds=plan.timeout_s + 60))
        ctx.progress("started")
        out.put(("ok", rank, target(ctx, *args)))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        out.put(("error", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _how_it_died(proc: Any) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _kill(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(10)


def launch(plan: Launch, target: Callable[..., Any], *args: Any) -> list[Any]:
    """Run target(ctx, *args) in plan.world_size ranks; return the ranks' results in rank order.

    Raises DistributedFailure when a rank raises, dies, or the whole launch outlives plan.timeout_s
    (every rank still running is killed first)."""
    ctx = _context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, plan, target, args, out), name=f"rank-{r}")
             for r in range(plan.world_size)]
    for p in procs:
        p.start()  # the first launch also starts the forkserver (imports torch): not part of the deadline
    started = time.monotonic()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    last: dict[int, str] = dict.fromkeys(range(plan.world_size), "not started")
    deadline = started + plan.timeout_s
    try:
        while len(results) + len(errors) < plan.world_size:
            now = time.monotonic()
            if now >= deadline:
                missing = [r for r in range(plan.world_size) if r not in results and r not in errors]
                where = "; ".join(f"rank {r}: {last[r]!r}" for r in missing)
                raise DistributedTimeout(
                    f"Timeout: {plan.backend} group of {plan.world_size} did not finish within {plan.timeout_s:.0f} s; "
                    f"rank(s) {missing} never reported (last step {where}); all ranks were killed")
            try:
                kind, rank, payload = out.get(timeout=min(0.5, deadline - now))
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    if r not in results and r not in errors and not p.is_alive() and p.exitcode is not None:
                        time.sleep(0.2)  # a result may still be in the pipe: only call it dead if none is
                        if out.empty():
                            errors[r] = f"died ({_how_it_died(p)}) during {last[r]!r} without reporting"
                if errors:
                    deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
                continue
            if kind == "progress":
                last[rank] = payload
            elif kind == "ok":
                results[rank] = payload
            else:
                errors[rank] = payload
                deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
    except DistributedFailure:
        if not errors:
            raise
    finally:
        _kill(procs)
    if errors:
        raise DistributedFailure(_failure_story(plan, errors))
    return [results[r] for r in range(plan.world_size)]


def _failure_story(plan: Launch, errors: dict[int, str]) -> str:
    """The root cause first: a rank that died, else the first to report (peers that lost their
    connection to it report after it); the others in one line each."""
    order = sorted(errors, key=lambda r: not errors[r].startswith("died"))  # stable: arrival order kept
    root, rest = order[0], order[1:]
    also = "".join(f"\n  then rank {r}: {errors[r].splitlines()[0][:300]}" for r in rest)
    return f"rank {root} of a {plan.backend} group of {plan.world_size} failed: {errors[root]}{also}"


# nccl-tests' bus bandwidth (doc/PERFORMANCE.md): the bytes each link carries relative to algbw.
# Sizes are the full buffer: all_reduce's tensor, all_gather's output, reduce_scatter's input.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda w: 2 * (w - 1) / w,
    "all_gather": lambda w: (w - 1) / w,
    "reduce_scatter": lambda w: (w - 1) / w,
}


def bus_bandwidth(op: str, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one collective of nbytes that took `seconds`."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUSBW_FACTOR[op](world_size)
