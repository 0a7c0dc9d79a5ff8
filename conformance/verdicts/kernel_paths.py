"""Kernel paths by shape: the token counts per forward at which an engine's kernels change path (data/kernel_paths.toml,
per backend row), the sweep of forwards around them (`sweep_plan`: each threshold t gives t-1, t, t+1, capped by the
engine's limits), and its verdict (`forwards_close`): every forward the engine ran, judged against the fp64 reference
on the positions that forward computed, a failure naming the token counts whose forwards disagree."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance import datafiles
from conformance.datafiles import DataError
from conformance.engines.base import Completion
from conformance.engines.observations import ForwardSweep
from conformance.verdicts.compare import LogprobTolerance, ParityReport, _step_deltas, logprobs_close
from conformance.verdicts.verdict import FigureLimit, Verdict

DATA = "kernel_paths.toml"
ENGINE_THRESHOLDS = ("block_size", "max_num_batched_tokens", "max_cudagraph_capture_size", "cudagraph_capture_sizes")


@dataclass(frozen=True)
class PathThresholds:
    """One backend row of kernel_paths.toml, with the sweep's settings."""

    backend: str
    moe_tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    engine: tuple[str, ...]
    around: tuple[int, ...]
    decode_prompt_tokens: int
    seed: int


def thresholds_for(backend: str) -> PathThresholds:
    """The row of `backend` (profiles.toml [backend.<name>]); a backend without one is a DataError in one sentence."""
    table = datafiles.load_toml(datafiles.DATA / DATA)
    rows, sweep = table.get("backend", {}), table.get("sweep", {})
    if backend not in rows:
        raise DataError(f"{DATA} has no [backend.{backend}] row (it has {', '.join(sorted(rows)) or 'none'}): "
                        "name the token counts where this backend's kernels change path first.")
    row = rows[backend]
    unknown = [e for e in row.get("engine", ()) if e not in ENGINE_THRESHOLDS]
    if unknown:
        raise DataError(f"{DATA} [backend.{backend}] engine names {unknown}: use {', '.join(ENGINE_THRESHOLDS)}")
    return PathThresholds(backend, tuple(int(t) for t in row.get("moe_tokens", ())),
                          tuple(int(t) for t in row.get("decode_batch", ())), tuple(row.get("engine", ())),
                          tuple(int(a) for a in sweep.get("around", (-1, 0, 1))),
                          int(sweep.get("decode_prompt_tokens", 4)), int(sweep.get("seed", 0)))


@dataclass(frozen=True)
class PlannedForward:
    """One group of the sweep: `lengths` prompts sent at once, each generating `max_tokens`. kind "prefill": one
    forward of sum(lengths) tokens; "decode": a prefill, then one forward of len(lengths) decode tokens; "chunked":
    one token past the budget offered, which the engine must split into a forward of the budget and one of 1."""

    kind: str
    tokens: int
    lengths: tuple[int, ...]
    max_tokens: int
    why: tuple[str, ...]


def _split(total: int, longest: int) -> tuple[int, ...]:
    """`total` tokens as few prompts of at most `longest`, as even as they come."""
    n = math.ceil(total / longest)
    return tuple(total // n + (1 if i < total % n else 0) for i in range(n))


def sweep_plan(th: PathThresholds, limits: Mapping[str, Any]) -> list[PlannedForward]:
    """The sweep's forwards for an engine of `limits` (its scheduler_limits): prefill forwards of t-1, t, t+1 tokens
    for each MoE and engine threshold t, up to the token budget (t + 1 past the budget: the chunked group, where the
    engine chunks prefill); decode forwards of b-1, b, b+1 sequences for each decode batch, up to max_num_seqs."""
    budget, seqs = int(limits["max_num_batched_tokens"]), int(limits["max_num_seqs"])
    longest = int(limits["max_model_len"]) - 2  # room for the decode groups' two tokens
    graphs = [int(s) for s in limits.get("cudagraph_capture_sizes") or ()]
    engine: dict[str, list[int]] = {
        "block_size": [int(limits["block_size"])], "max_num_batched_tokens": [budget],
        "max_cudagraph_capture_size": [max(graphs)] if graphs else [], "cudagraph_capture_sizes": []}
    prefill: dict[int, list[str]] = {}
    for name, values in [("moe", list(th.moe_tokens))] + [(e, engine[e]) for e in th.engine]:
        for t in values:
            for a in th.around:
                prefill.setdefault(t + a, []).append(f"{name} {t}")
    decode: dict[int, list[str]] = {}
    batches = [("decode", list(th.decode_batch))]
    if "cudagraph_capture_sizes" in th.engine:
        batches.append(("graph", graphs))
    for name, values in batches:
        for b in values:
            for a in th.around:
                decode.setdefault(b + a, []).append(f"{name} {b}")
    plan = [PlannedForward("prefill", n, _split(n, longest), 1, tuple(why))
            for n, why in sorted(prefill.items()) if 1 <= n <= budget]
    if limits.get("enable_chunked_prefill") and budget + 1 in prefill:
        plan.append(PlannedForward("chunked", budget + 1, _split(budget + 1, longest), 1, tuple(prefill[budget + 1])))
    per = th.decode_prompt_tokens
    plan += [PlannedForward("decode", b, (per,) * b, 2, tuple(why))
             for b, why in sorted(decode.items()) if 1 <= b <= seqs and b * per <= budget]
    return plan


@dataclass(frozen=True)
class SweepPrompts:
    """The groups `forward_sweep` runs, and where each request's prompt comes from: the i-th prompt of a prefill group
    is a prefix of base i (`base_of`: its index; -1 for a decode group's own short prompt). Prompts that share a base
    share its reference: the fp64 reference runs each base once and every prefix reads its rows (a causal model's
    logprobs of a prefix are the prefix of its logprobs), so the reference scores about 4,400 positions and 33 short
    decode paths for the CPU default's 25,000-token sweep; sequences of one forward come from different bases (or
    pool prompts), so no two rows of a forward are the same.
    (vLLM reads no prefix cache for a request that asks for prompt logprobs: every prefix is computed in full.)"""

    groups: list[tuple[list[list[int]], int]]
    bases: list[list[int]]
    base_of: list[int]

    @classmethod
    def build(cls, plan: list[PlannedForward], vocab: int, seed: int) -> SweepPrompts:
        import torch

        gen = torch.Generator().manual_seed(seed)
        width = max((len(p.lengths) for p in plan if p.kind != "decode"), default=0)
        longest = [max((p.lengths[i] for p in plan if p.kind != "decode" and len(p.lengths) > i), default=0)
                   for i in range(width)]
        bases = [torch.randint(0, vocab - 8, (n,), generator=gen).tolist() for n in longest]
        # a decode group of b sequences takes the first b of one pool: distinct within a forward, the same paths
        # across groups (the reference scores each once)
        decode = [p for p in plan if p.kind == "decode"]
        pool = [torch.randint(0, vocab - 8, (n,), generator=gen).tolist()
                for n in max((p.lengths for p in decode), key=len, default=())]
        groups, base_of = [], []
        for p in plan:
            if p.kind == "decode":
                groups.append(([pool[i][:n] for i, n in enumerate(p.lengths)], p.max_tokens))
                base_of += [-1] * len(p.lengths)
            else:
                groups.append(([bases[i][:n] for i, n in enumerate(p.lengths)], p.max_tokens))
                base_of += list(range(len(p.lengths)))
        return cls(groups, bases, base_of)


def reference_paths(completions: list[Completion], prompts: SweepPrompts, reference: Any,
                    top_k: int) -> list[Completion]:
    """The reference's logprobs on each completion's path: a prefix of a base read from the base's scoring (its
    prompt positions, and the distribution after its last token, under the engine's chosen token), a decode
    group's request scored on its own path (reference.score_all: cached per token ids)."""
    from dataclasses import replace

    scored_bases = reference.score_all([Completion(list(b), [0]) for b in prompts.bases], top_k)
    rows = [c.prompt_steps + c.steps for c in scored_bases]  # rows[b][t]: the distribution after position t
    paths: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}  # each distinct path once
    for i, b in enumerate(prompts.base_of):
        if b < 0:
            paths.setdefault((tuple(completions[i].prompt_ids), tuple(completions[i].token_ids)), i)
    scored = dict(zip(paths, reference.score_all([completions[i] for i in paths.values()], top_k)))
    scored_own = {i: scored[(tuple(completions[i].prompt_ids), tuple(completions[i].token_ids))]
                  for i, b in enumerate(prompts.base_of) if b < 0}
    out = []
    for i, (c, b) in enumerate(zip(completions, prompts.base_of)):
        if b < 0:
            out.append(scored_own[i])
            continue
        n = len(c.prompt_ids)
        steps = [replace(rows[b][n - 1 + j], token=t) for j, t in enumerate(c.token_ids[:1])]
        out.append(Completion(list(c.prompt_ids), list(c.token_ids[:1]), steps, rows[b][:n - 1]))
    return out


@dataclass(frozen=True)
class ForwardLimits:
    """The largest and the median |Δlogprob| one forward's positions may have against the reference (tolerances.toml
    [kernel_paths.<dtype>]), and the top-k compared."""

    max_abs: float
    median: float
    top_k: int
    source: str = ""
    table: str = "tolerances.toml [kernel_paths]"  # where they were read: the record names it beside each limit

    @classmethod
    def from_row(cls, row: Mapping[str, Any], where: str) -> ForwardLimits:
        try:
            return cls(float(row["forward_max_abs"]), float(row["forward_median"]), int(row["top_k"]),
                       str(row.get("source", "")), where)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where} needs forward_max_abs, forward_median and top_k: {exc!r}") from exc


@dataclass
class ForwardFigures:
    index: int
    tokens: int
    kind: str
    sequences: int
    after: tuple[int, ...] = ()  # earlier forwards that computed its sequences' first positions (their KV cache)
    deltas: list[float] = field(default_factory=list)

    @property
    def max(self) -> float:
        return max(self.deltas) if self.deltas and not any(math.isnan(d) for d in self.deltas) else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.deltas) if self.deltas else float("nan")

    def label(self) -> str:
        return f"{self.tokens} ({self.kind})"


@dataclass
class KernelPathReport(Verdict):
    """Every forward of the sweep against the reference, and the whole sweep by the parity rule."""

    bounds: ForwardLimits
    forwards: list[ForwardFigures]
    parity: ParityReport
    planned: int
    names: tuple[str, str] = ("engine", "fp64 reference")
    problems: list[str] = field(default_factory=list)

    def failing(self) -> list[ForwardFigures]:
        return [f for f in self.forwards if not (f.max <= self.bounds.max_abs and f.median <= self.bounds.median)]

    def first_failing(self) -> list[ForwardFigures]:
        """The failing forwards whose sequences' KV came from no failing forward before them: where it went wrong (a
        decode or a later chunk reads what a wrong forward wrote into the cache, and fails with it)."""
        bad = {f.index for f in self.failing()}
        return [f for f in self.failing() if not bad & set(f.after)]

    def figures(self) -> dict[str, float]:
        judged = [f for f in self.forwards if f.deltas]
        worst_max = max(judged, key=lambda f: (math.isnan(f.max), f.max), default=None)
        worst_median = max(judged, key=lambda f: (math.isnan(f.median), f.median), default=None)
        bad = self.failing()
        out = {"forwards_planned": float(self.planned), "forwards_run": float(len(self.forwards)),
               "forward_token_counts": float(len({f.tokens for f in self.forwards})),
               "largest_forward_tokens": float(max((f.tokens for f in self.forwards), default=0)),
               "forwards_failing": float(len(bad)),
               "max_abs_dlogprob_worst_forward": worst_max.max if worst_max else float("nan"),
               "worst_forward_tokens": float(worst_max.tokens) if worst_max else float("nan"),
               "median_abs_dlogprob_worst_forward": worst_median.median if worst_median else float("nan")}
        if self.first_failing():
            out["smallest_failing_forward_tokens"] = float(min(f.tokens for f in self.first_failing()))
        return out | {f"sweep_{k}": v for k, v in self.parity.figures().items()
                      if k in ("max_abs_dlogprob", "p99_abs_dlogprob", "median_abs_dlogprob", "compared_steps")}

    def limits(self) -> dict[str, FigureLimit]:
        where = self.bounds.table
        return {"max_abs_dlogprob_worst_forward": FigureLimit(self.bounds.max_abs, "max", f"{where} forward_max_abs"),
                "median_abs_dlogprob_worst_forward": FigureLimit(self.bounds.median, "max", f"{where} forward_median")}

    def failure_message(self) -> str:
        bad = self.first_failing()
        head = (f"{self.names[0]} vs {self.names[1]} over {len(self.forwards)} forwards of "
                f"{min((f.tokens for f in self.forwards), default=0)}-"
                f"{max((f.tokens for f in self.forwards), default=0)} tokens")
        if bad:
            good = sorted({f.tokens for f in self.forwards} - {f.tokens for f in self.failing()})
            head += (f": forwards of {', '.join(f.label() for f in sorted(bad, key=lambda f: f.tokens))} tokens "
                     f"disagree (a kernel path wrong at those token counts); forwards of "
                     f"{_ranges(good) or 'no count'} tokens agree")
        return head + "\n  " + "\n  ".join(self.problems[:12])


def _ranges(values: list[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    out: list[str] = []
    for v in values:
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def _coverage(sweep: ForwardSweep, plan: list[PlannedForward], budget: int) -> list[str]:
    """Each planned forward ran as planned: a forward of its token count (a decode one of one token per sequence),
    the chunked group as a forward of the budget and one of the rest; else the sweep did not cross that threshold."""
    sizes: dict[int, list[list[int]]] = {}
    for fwd in sweep.forwards:
        groups = {sweep.group_of[s.request] for s in fwd.spans if s.request >= 0}
        for g in groups:
            sizes.setdefault(g, []).append([fwd.tokens, max(s.tokens for s in fwd.spans)])
    problems = []
    for g, p in enumerate(plan):
        ran = sizes.get(g, [])
        want = {"prefill": [[p.tokens, max(p.lengths)]], "decode": [[sum(p.lengths), p.lengths[0]], [p.tokens, 1]],
                "chunked": [[budget, max(p.lengths)], [p.tokens - budget, p.tokens - budget]]}[p.kind]
        if [r[0] for r in ran] != [w[0] for w in want]:
            problems.append(f"the sweep's {p.kind} forward of {p.tokens} tokens ({', '.join(p.why)}) ran as "
                            f"forwards of {[r[0] for r in ran] or 'nothing'} tokens, not {[w[0] for w in want]}: "
                            "that threshold was not crossed as planned")
    return problems


def forwards_close(sweep: ForwardSweep, want: list[Completion], plan: list[PlannedForward], budget: int,
                   limits: ForwardLimits,
                   names: tuple[str, str] = ("engine", "fp64 reference")) -> KernelPathReport:
    """Each forward of `sweep` against the reference's scoring of the same paths (`want`): the |Δlogprob| of every
    position that forward computed (a prompt position's logprobs come from the forward that computed the token
    before it, a generated token's from the forward of the token before it), its max and median within `limits`;
    the whole sweep by vLLM's top-k rule (a NaN, top-k sets with nothing in common fail); every planned forward ran."""
    forwards = []
    where: list[dict[int, int]] = [{} for _ in sweep.completions]  # per request: position -> forward
    prompt_len = [len(c.prompt_ids) for c in sweep.completions]
    for i, fwd in enumerate(sweep.forwards):
        spans = [s for s in fwd.spans if 0 <= s.request < len(where)]
        kind = ("decode" if spans and all(s.start >= prompt_len[s.request] for s in spans)
                else "chunk" if any(0 < s.start < prompt_len[s.request] for s in spans) else "prefill")
        forwards.append(ForwardFigures(i, fwd.tokens, kind, len(fwd.spans),
                                       after=tuple(sorted({where[s.request][0] for s in spans if s.start > 0
                                                           and 0 in where[s.request]}))))
        for s in spans:
            where[s.request].update({pos: i for pos in range(s.start, s.start + s.tokens)})
    for r, (got, ref) in enumerate(zip(sweep.completions, want)):
        n = len(got.prompt_ids)
        steps = [(t, g, w) for t, (g, w) in enumerate(zip(got.prompt_steps, ref.prompt_steps))]
        steps += [(n - 1 + j, g, w) for j, (g, w) in enumerate(zip(got.steps, ref.steps))]
        for pos, g, w in steps:
            i = where[r].get(pos)
            if i is not None:
                forwards[i].deltas.extend(_step_deltas(g.cut(limits.top_k), w))
    parity = logprobs_close(sweep.completions, want, LogprobTolerance(math.inf), names)
    report = KernelPathReport(limits, forwards, parity, len(plan), names)
    report.problems += [p for p in parity.problems if "exceeds" not in p]
    report.problems += _coverage(sweep, plan, budget)
    if sweep.unfinished:
        report.problems.append(f"{sweep.unfinished} request(s) of the sweep never finished")
    first = {f.index for f in report.first_failing()}
    for f in sorted(report.failing(), key=lambda f: (f.index not in first, f.tokens)):
        report.problems.append(f"forward {f.index} of {f.tokens} tokens ({f.kind}, {f.sequences} sequence(s)): max "
                               f"|Δlogprob| {f.max:.3g} (limit {limits.max_abs:.3g}), median {f.median:.3g} (limit "
                               f"{limits.median:.3g}) over {len(f.deltas)} values"
                               + ("" if f.index in first else
                                  f"; its sequences' cache was written by failing forward(s) {list(f.after)}"))
    return report
