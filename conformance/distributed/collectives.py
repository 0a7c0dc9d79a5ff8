"""Collectives under test: all_reduce, all_gather and reduce_scatter through torch.distributed, run
inside the ranks of a `distributed.launch`, and the verdict on what the ranks saw.

Every rank can regenerate every other rank's input (integer patterns, or seeded random tensors made
on the same device), so each rank computes the exact expectation locally: integer sums exactly,
floating-point sums in fp64 with the error bound of a W-term sum, gathers bitwise. `FAULTS` are
deliberately wrong collectives (a rank counted twice, chunks rotated, a rank that sleeps, raises or
dies) that the negative controls feed to the same verdict.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from conformance.distributed import RankContext
from conformance.verdicts.compare import VerdictReport
from conformance.verdicts.verdict import FigureLimit

OPS = ("all_reduce", "all_gather", "reduce_scatter")
FAULTS = ("rank_counted_twice", "chunks_rotated", "rank_sleeps", "rank_raises", "rank_dies")
DTYPES = {"int32": torch.int32, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class CaseResult:
    """One collective on one rank: how far its output is from the exact expectation."""

    op: str
    dtype: str
    nbytes: int
    numel: int
    rank: int
    mismatches: int  # elements outside the allowed error (0 for a pass)
    max_abs_err: float
    worst_ratio: float  # max |err| / allowed over the elements (<= 1 passes); integers: 0 or inf
    first_bad: int  # index of the first bad element, -1 if none

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def numel_for(nbytes: int, dtype: str, world_size: int) -> int:
    """Elements of the full buffer: at least one per rank, a multiple of the world size."""
    per = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    return max(world_size, (nbytes // per) // world_size * world_size)


def rank_input(dtype: str, numel: int, rank: int, seed: int, device: Any) -> torch.Tensor:
    """Rank r's contribution, reproducible on any rank: integers in [-1000, 1000] (W x 1000 fits int32
    exactly) or seeded standard-normal values rounded to the dtype."""
    if dtype == "int32":
        # a multiplicative hash (int32 wraps): no short period, so chunks rotated by one always differ
        idx = torch.arange(numel, dtype=torch.int32, device=device)
        return (idx * 1103515245 + (12345 + 7919 * rank)).remainder(2001) - 1000
    gen = torch.Generator(device=device).manual_seed(seed * 1009 + rank)
    return torch.randn(numel, generator=gen, device=device, dtype=torch.float32).to(DTYPES[dtype])


def _fn(name: str) -> Any:
    import torch.distributed as dist

    # torch 2.13 renamed the tensor variants; older stacks (GPU images) only have the old names
    new = {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single"}[name]
    old = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}[name]
    return getattr(dist, new, None) or getattr(dist, old)


def run_op(ctx: RankContext, op: str, inp: torch.Tensor, fault: str | None = None) -> torch.Tensor:
    """The collective itself (with a fault injected, for the negative controls)."""
    import torch.distributed as dist

    w = ctx.world_size
    if op == "all_reduce":
        out = inp.clone()
        if fault == "rank_counted_twice" and ctx.rank == 0:
            out = out * 2  # rank 0 contributes its input twice
        dist.all_reduce(out)
        return out
    if op == "all_gather":
        out = torch.empty(inp.numel() * w, dtype=inp.dtype, device=inp.device)
        _fn("all_gather")(out, inp)
        if fault == "chunks_rotated":
            out = out.view(w, -1).roll(1, dims=0).flatten()  # rank chunks land one slot off
        return out
    chunk = inp.numel() // w
    src = inp.view(w, chunk).roll(1, dims=0).flatten() if fault == "chunks_rotated" else inp
    out = torch.empty(chunk, dtype=inp.dtype, device=inp.device)
    _fn("reduce_scatter")(out, src)
    return out


def _judge(op: str, dtype: str, nbytes: int, rank: int, got: torch.Tensor, exact: torch.Tensor,
           allowed: torch.Tensor | None) -> CaseResult:
    if allowed is None and got.shape == exact.shape and torch.equal(got, exact.to(got.dtype)):
        return CaseResult(op, dtype, nbytes, got.numel(), rank, 0, 0.0, 0.0, -1)  # the common case, cheaply
    err = (got.double() - exact.double()).abs()
    if allowed is None:  # integers and gathers: bit-exact
        bad = err > 0
        ratio = float("inf") if bool(bad.any()) else 0.0
    else:
        bad = ~(err <= allowed)  # NaN counts as bad
        ratio = float((err / allowed.clamp_min(1e-300)).max()) if err.numel() else 0.0
    n_bad = int(bad.sum())
    first = int(bad.nonzero()[0, 0]) if n_bad else -1
    return CaseResult(op, dtype, nbytes, got.numel(), rank, n_bad, float(err.max()) if err.numel() else 0.0,
                      ratio, first)


def check_case(ctx: RankContext, op: str, dtype: str, nbytes: int, seed: int, unit_roundoff: dict[str, float],
               slack: float, fault: str | None = None) -> CaseResult:
    """Run one collective and compare this rank's output with the exact result."""
    w, dev = ctx.world_size, ctx.torch_device
    numel = numel_for(nbytes, dtype, w)
    per_rank = numel // w if op == "all_gather" else numel
    mine = rank_input(dtype, per_rank, ctx.rank, seed, dev)
    got = run_op(ctx, op, mine, fault)
    inputs = (mine if r == ctx.rank else rank_input(dtype, per_rank, r, seed, dev) for r in range(w))
    if op == "all_gather":
        return _judge(op, dtype, nbytes, ctx.rank, got, torch.cat(list(inputs)), None)
    chunk = slice(ctx.rank * (numel // w), (ctx.rank + 1) * (numel // w)) if op == "reduce_scatter" else slice(None)
    if dtype == "int32":  # |sum| <= W x 1000: exact in int32 itself, no fp64 copy needed
        return _judge(op, dtype, nbytes, ctx.rank, got, sum(x[chunk] for x in inputs), None)
    exact = torch.zeros(got.numel(), dtype=torch.float64, device=dev)
    magnitude = torch.zeros_like(exact)
    for x in inputs:
        exact += x[chunk]
        magnitude += x[chunk].abs()
    allowed = slack * w * unit_roundoff[dtype] * magnitude
    return _judge(op, dtype, nbytes, ctx.rank, got, exact, allowed)


def cases_for(row: dict[str, Any]) -> list[tuple[str, int]]:
    """(dtype, bytes) pairs of a target's data row: integers at every size, floats (whose fp64
    verification costs more) up to float_max_bytes."""
    cap = int(row.get("float_max_bytes", max(row["sizes_bytes"])))
    return [(d, n) for d in row["dtypes"] for n in row["sizes_bytes"] if d == "int32" or n <= cap]


def run_cases(ctx: RankContext, op: str, cases: list[tuple[str, int]], seed: int, unit_roundoff: dict[str, float],
              slack: float, fault: str | None = None, sleep_s: float = 0.0) -> list[dict[str, Any]]:
    """The (dtype, bytes) cases of one op on this rank; a rank function for `distributed.launch`."""
    if fault == "rank_sleeps" and ctx.rank == ctx.world_size - 1:
        ctx.progress(f"sleeping {sleep_s:.0f} s instead of joining the collective")
        time.sleep(sleep_s)
    if fault == "rank_raises" and ctx.rank == ctx.world_size - 1:
        raise RuntimeError("injected failure in the last rank")
    if fault == "rank_dies" and ctx.rank == ctx.world_size - 1:
        import os

        os._exit(3)
    out = []
    for dtype, nbytes in cases:
        ctx.progress(f"{op} {dtype} {nbytes} B")
        out.append(asdict(check_case(ctx, op, dtype, nbytes, seed, unit_roundoff, slack, fault)))
    return out


def time_op(ctx: RankContext, op: str, dtype: str, nbytes: int, warmup: int, iters: int) -> float:
    """Median seconds of one collective of nbytes (full buffer) on this rank, after warm-up."""
    import torch.distributed as dist

    numel = numel_for(nbytes, dtype, ctx.world_size)
    inp = rank_input(dtype, numel // ctx.world_size if op == "all_gather" else numel, ctx.rank, 0, ctx.torch_device)
    sync = torch.cuda.synchronize if ctx.device != "cpu" else (lambda: None)
    times = []
    for i in range(warmup + iters):
        ctx.progress(f"timing {op} {nbytes} B, iteration {i}")
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        run_op(ctx, op, inp)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def verdict(op: str, per_rank: list[list[dict[str, Any]]]) -> VerdictReport:
    """Every rank's every case within its bound; figures per dtype (worst error over the bound)."""
    r = VerdictReport(f"{op} across {len(per_rank)} ranks")
    cases = [CaseResult(**c) for rank_cases in per_rank for c in rank_cases]
    if not cases:
        r.problems.append("no case was run")
        return r
    for dtype in sorted({c.dtype for c in cases}):
        mine = [c for c in cases if c.dtype == dtype]
        key = "mismatches" if dtype == "int32" or op == "all_gather" else "max_err_over_bound"
        r.measured[f"{dtype}_{key}"] = float(sum(c.mismatches for c in mine)) if key == "mismatches" \
            else max(c.worst_ratio for c in mine)
        r.judged_by[f"{dtype}_{key}"] = (
            FigureLimit(0.0, "max", "bit-exact", headroom=False) if key == "mismatches" else
            FigureLimit(1.0, "max", "distributed.toml collectives.tolerance: W x unit_roundoff x slack x sum|x|"))
    r.measured["cases"] = float(len(cases))
    r.measured["max_bytes"] = float(max(c.nbytes for c in cases))
    for c in cases:
        if not c.ok:
            r.problems.append(f"rank {c.rank}: {op} {c.dtype} {c.nbytes} B: {c.mismatches} of {c.numel} elements "
                              f"wrong (first at {c.first_bad}, max |err| {c.max_abs_err:.3g}, "
                              f"{c.worst_ratio:.3g} x the allowed error)")
    r.details = [f"rank {c.rank} {c.dtype} {c.nbytes} B: max |err| {c.max_abs_err:.3g}" for c in cases if not c.ok]
    return r
