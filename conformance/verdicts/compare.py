"""Named comparison helpers. Each returns a report that prints both sides, the error figure and
the tolerance, and raises only through `raise_if_failed` — never a bare == on floats in a check."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from conformance.engines.base import Completion, KVState, StepLogprobs
from conformance.engines.observations import KVLayout, RequestBlocks, StepwiseRun, SubmitOutcome
from conformance.reference import kv_model
from conformance.verdicts.verdict import CheckFailed as CheckFailed  # re-exported: checks import it from here
from conformance.verdicts.verdict import FigureLimit, Verdict, record_figures

POSITION_BANDS = (0, 128, 256, 1024, 4096)  # the window, past 256 (bf16 positions), 1k, the 4k YaRN context
MIN_STRATUM = 20  # |Δlogprob| values a stratum needs before its own median is judged
# The top-k greedy parity asks the reference (and its noise twin) for on every path, each side then cut to its own:
# greedy parity's paths (top-5 + 5) then also answer the sampling check's one-token path through the same prompt (top
# 20 + 5) without another pass through the model (reference/cache.py)
SCORED_TOP_K = 25


@dataclass(frozen=True)
class LogprobTolerance:
    """Limits on |Δlogprob| over the tokens both sides rank in their top-k (data: tolerances.toml)."""

    max_abs: float
    p99: float | None = None
    median: float | None = None
    stratum_median: float | None = None  # per position band and phase (prefill/decode); None: not judged
    # Two engines whose reductions differ (TP = 2 against TP = 1) compared with each other: False where the dtype's
    # noise alone can part their greedy paths (bf16/fp16), so a parting ends that sequence's comparison, counted,
    # instead of failing; each engine still answers to the reference under the full rule. Data: tolerances.toml.
    pairwise_greedy: bool = True
    # Greedy parity at depth: where the engine exceeds these limits, they widen to `noise_ratio` x the figures of
    # the fp64 reference holding its weights and activations in `noise_dtype` (the noise a healthy stack of that dtype
    # accumulates over this model's layers; reference Math.activations), never below the limits above. None: fixed.
    noise_dtype: str | None = None
    noise_ratio: float | None = None
    # widening band by band (data: widen_by_band): each position band's median against the twin's in that band;
    # band_limits holds what above_noise set, (phase_band, limit) per band the twin measured; others: stratum_median
    widen_by_band: bool = False
    band_limits: tuple[tuple[str, float], ...] = ()
    # with `widen_by_band`, the decode bands' ratio grows with the model's depth past `decode_noise_depth` layers:
    # noise_ratio x layers / decode_noise_depth (data; None: noise_ratio at every depth). The engine's decode steps
    # follow its own greedy tokens, chosen under its own rounding, and the twin only scores that path: a healthy GPU
    # engine's decode bands stand further above the twin's the deeper the model (docs/verdicts.md "Greedy parity at
    # depth")
    decode_noise_depth: float | None = None
    widened: bool = False  # set by above_noise: these limits are the noise twin's, not the table's
    # the data row these limits come from, for the run's record (provenance: two equal limits are equal whatever it)
    source: str = field(default="the check's own tolerance", compare=False)

    def decode_ratio(self, layers: int | None) -> float:
        """The ratio the decode bands widen by on a model of `layers` layers (`decode_noise_depth`)."""
        r = float(self.noise_ratio or 0.0)
        if self.decode_noise_depth is None or layers is None:
            return r
        return r * max(1.0, layers / self.decode_noise_depth)

    def above_noise(self, noise: dict[str, float], layers: int | None = None) -> LogprobTolerance:
        """These limits, each raised to noise_ratio x the noise twin's figure of its kind where that is larger; the
        position bands' median to noise_ratio x the twin's largest band median, or with `widen_by_band` each band's
        to noise_ratio x the twin's median in the same band (one the twin did not measure: its largest). Band by
        band, a fault that lives in some bands stands out of the twin's noise there (docs/verdicts.md "Greedy parity
        at depth"); the decode bands by `decode_ratio(layers)`."""
        r = float(self.noise_ratio or 0.0)

        def up(limit: float | None, figure: float, ratio: float = r) -> float | None:
            return None if limit is None else max(limit, ratio * figure)

        band, decode = "median_abs_dlogprob_", self.decode_ratio(layers)
        bands = tuple((k.removeprefix(band), up(self.stratum_median, v, decode if "_decode_" in k else r))
                      for k, v in sorted(noise.items()) if k.startswith(band))
        return replace(self, max_abs=up(self.max_abs, noise["max_abs_dlogprob"]) or self.max_abs,
                       p99=up(self.p99, noise["p99_abs_dlogprob"]),
                       median=up(self.median, noise["median_abs_dlogprob"]),
                       stratum_median=up(self.stratum_median, largest_stratum_median(noise)),
                       band_limits=bands if self.widen_by_band and self.stratum_median is not None else (),
                       widened=True)


def largest_stratum_median(figures: dict[str, float], default: float = 0.0) -> float:
    """The largest per-stratum (phase and position band) median |Δlogprob| of a comparison's figures; `default` if
    none was judged."""
    return max((v for k, v in figures.items() if k.startswith("median_abs_dlogprob_")), default=default)


@dataclass(frozen=True)
class BlockLimits:
    median: float
    p90: float
    max: float


@dataclass(frozen=True)
class LayerTolerance:
    """Limits on the per-position relative error ||engine - reference|| / ||reference|| per block kind (attn,
    moe), judged in every stratum (block, layer type, position band, phase) separately (data: tolerances.toml
    [layers]). In low precision a near-tie in the router picks another expert for a token now and then: such a
    position (its reference top-k decided by no more than `router_tie` x its largest |router logit|) is judged
    against the nearest of the routings rounding could pick (mathcheck.moe_at_near_ties), in every figure, so the
    MoE max needs no room for a token sent elsewhere."""

    blocks: dict[str, BlockLimits]
    bands: tuple[int, ...]
    source: str = ""
    # limits grow with the band's first position, x (1 + start / position_scale): fp32 RoPE angles drift by
    # ~pos x 6e-8 rad, which a healthy engine shows smoothly past 4096 positions (docs/verdicts.md "Long context")
    position_scale: float = math.inf
    router_tie: float = 0.0  # gpt_oss.toml router_tie_ulps x eps(dtype)


@dataclass
class ParityReport(Verdict):
    tolerance: LogprobTolerance
    names: tuple[str, str]
    deltas: list[float] = field(default_factory=list)
    compared_steps: int = 0
    prefill_steps: int = 0
    divergences: int = 0
    problems: list[str] = field(default_factory=list)
    strata: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add_stratum(self, key: tuple[str, str], deltas: list[float]) -> None:
        self.strata.setdefault(key, []).extend(deltas)

    @property
    def max_abs_dlogprob(self) -> float:
        if any(math.isnan(d) for d in self.deltas):
            return float("nan")  # max() would skip a NaN that is not first
        return max(self.deltas, default=float("nan"))

    def _quantile(self, q: float) -> float:
        if not self.deltas:
            return float("nan")
        ordered = sorted(self.deltas)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared_steps > 0

    def figures(self) -> dict[str, float]:
        figs = {
            "max_abs_dlogprob": self.max_abs_dlogprob,
            "p99_abs_dlogprob": self._quantile(0.99),
            "median_abs_dlogprob": statistics.median(self.deltas) if self.deltas else float("nan"),
            "compared_steps": float(self.compared_steps),
            "prefill_steps": float(self.prefill_steps),
            "greedy_divergences": float(self.divergences),
        }
        for (phase, band), values in sorted(self.strata.items()):
            if len(values) >= MIN_STRATUM:  # a smaller stratum is not judged: not recorded, and widens no limit
                figs[f"median_abs_dlogprob_{phase}_{band}"] = statistics.median(values)
        return figs

    def limits(self) -> dict[str, FigureLimit]:
        source = self.tolerance.source + (", widened to noise_ratio x the noise twin's figures"
                                          if self.tolerance.widened else "")
        return {name: FigureLimit(value, "max", source)
                for name, value in figure_limits(self.figures(), self.tolerance).items()}

    def finish(self) -> ParityReport:
        if self.compared_steps == 0:
            self.problems.append("nothing was compared: no steps came back")
        self.problems += over_limits(self.figures(), self.tolerance)
        return self

    def summary(self) -> str:
        a, b = self.names
        f = self.figures()
        return (f"{a} vs {b}: {self.compared_steps} steps, max |Δlogprob| {f['max_abs_dlogprob']:.3g} "
                f"(p99 {f['p99_abs_dlogprob']:.3g}, median {f['median_abs_dlogprob']:.3g}; tolerance "
                f"{self.tolerance.max_abs:.3g}), {self.divergences} greedy divergence(s) within top-k")

    def failure_message(self) -> str:
        return self.summary() + "\n  " + "\n  ".join(self.problems[:10])


def figure_limits(figs: dict[str, float], tol: LogprobTolerance) -> dict[str, float]:
    """Each figure of a comparison (`ParityReport.figures`) that `tol` judges, with its limit: the global ones, then
    each judged stratum's median against its band's limit (`band_limits`) or `stratum_median`."""
    out = {name: float(limit) for name, limit in (("max_abs_dlogprob", tol.max_abs), ("p99_abs_dlogprob", tol.p99),
                                                 ("median_abs_dlogprob", tol.median)) if limit is not None}
    bands = dict(tol.band_limits)
    for key in figs:
        # strata too small for a median say nothing (figures() leaves them out); the global limits still hold
        if key.startswith("median_abs_dlogprob_") and tol.stratum_median is not None:
            out[key] = float(bands.get(key.removeprefix("median_abs_dlogprob_"), tol.stratum_median))
    return out


def over_limits(figs: dict[str, float], tol: LogprobTolerance) -> list[str]:
    """What of a comparison's figures (`ParityReport.figures`, as a run records them) exceeds `tol` (figure_limits);
    a NaN exceeds every limit."""
    problems = []
    for name, limit in figure_limits(figs, tol).items():
        if figs[name] <= limit:
            continue
        if name.startswith("median_abs_dlogprob_"):
            phase, band = name.removeprefix("median_abs_dlogprob_").split("_")
            problems.append(f"{phase} positions {band}: median |Δlogprob| {figs[name]:.3g} "
                            f"exceeds the stratum tolerance {limit:.3g}")
        else:
            problems.append(f"{name} = {figs[name]:.3g} exceeds the tolerance {limit:.3g}")
    return problems


def _step_deltas(got: StepLogprobs, want: StepLogprobs) -> list[float]:
    return [abs(got.top[t] - want.top[t]) for t in got.top if t in want.top]


def _step_problem(gs: StepLogprobs, ws: StepLogprobs, where: str, names: tuple[str, str],
                  greedy_rule: bool = True) -> str | None:
    """A step that cannot be judged fails: a NaN or inf logprob on either side, or (under the greedy rule) top-k
    sets with no token in common (nothing to compare at that step)."""
    for side, step in zip(names, (gs, ws)):
        bad = [t for t, v in step.top.items() if not math.isfinite(v) or v > 1e-6]
        if bad:
            return f"{where}: {side} gives token {bad[0]} the logprob {step.top[bad[0]]} (NaN, inf or > 0)"
    if greedy_rule and not set(gs.top) & set(ws.top):
        return f"{where}: the top-k sets of {names[0]} and {names[1]} share no token"
    return None


def position_band(t: int, edges: tuple[int, ...] = POSITION_BANDS) -> str:
    lo = max((e for e in edges if e <= t), default=0)
    hi = min((e for e in edges if e > t), default=None)
    return f"{lo}-{hi - 1}" if hi is not None else f"{lo}+"


def logprobs_close(got: list[Completion], want: list[Completion], tol: LogprobTolerance,
                   names: tuple[str, str] = ("engine", "reference"), greedy_rule: bool = True,
                   prompt_positions: list[int] | None = None,
                   bands: tuple[int, ...] = POSITION_BANDS) -> ParityReport:
    """vLLM's check_logprobs_close rule plus figures: greedy tokens may differ only where each side's
    token is in the other's top-k, and comparison of a sequence stops at its first divergence.
    Prompt (prefill) steps are compared too, position by position; a side with fewer prefill steps, a NaN,
    or top-k sets with no common token fail. The figures are also given per position band and phase
    (`strata`), and the distribution limits apply to every stratum: a fault that lives past position 256
    or in the prefill alone moves its stratum, not only the global median. `greedy_rule=False` (two noisy
    engines, `LogprobTolerance.pairwise_greedy`): top-k sets with no common token and greedy tokens outside each
    other's top-k end that sequence's comparison as a counted divergence instead of failing; NaN still fails.
    `prompt_positions`: the position each prompt step stands at where the steps are a sample of the prompt's
    (longctx.sampled_parity), not every position from 0; `bands`: the edges of the strata's position bands."""
    report = ParityReport(tol, names)
    if len(got) != len(want):
        report.problems.append(f"{names[0]} returned {len(got)} completions, {names[1]} {len(want)}")
    for n, (g, w) in enumerate(zip(got, want)):
        if len(g.prompt_steps) != len(w.prompt_steps):
            report.problems.append(f"prompt {n}: {names[0]} has {len(g.prompt_steps)} prefill steps, {names[1]} "
                                   f"{len(w.prompt_steps)}: prefill parity would silently become decode-only")
        for t, (gs, ws) in enumerate(zip(g.prompt_steps, w.prompt_steps)):
            pos = t if prompt_positions is None else prompt_positions[t]
            problem = _step_problem(gs, ws, f"prompt {n} prefill position {pos + 1}", names, greedy_rule)
            if problem:
                report.problems.append(problem)
            d = _step_deltas(gs, ws)
            report.deltas.extend(d)
            report.add_stratum(("prefill", position_band(pos + 1, bands)), d)
            report.compared_steps += 1
            report.prefill_steps += 1
        if len(g.steps) != len(w.steps):
            report.problems.append(f"prompt {n}: {len(g.steps)} vs {len(w.steps)} generated steps")
        for t, (gs, ws) in enumerate(zip(g.steps, w.steps)):
            report.compared_steps += 1
            problem = _step_problem(gs, ws, f"prompt {n} step {t}", names, greedy_rule)
            if problem:
                report.problems.append(problem)
            d = _step_deltas(gs, ws)
            report.deltas.extend(d)
            report.add_stratum(("decode", position_band(len(g.prompt_ids) + t, bands)), d)
            if gs.token != ws.token:
                if (gs.token in ws.top and ws.token in gs.top) or not greedy_rule:
                    report.divergences += 1
                else:
                    report.problems.append(
                        f"prompt {n} step {t}: {names[0]} chose {gs.token} (rank {ws.rank_of(gs.token)} in "
                        f"{names[1]}'s top-{len(ws.top)}), {names[1]} chose {ws.token} (rank "
                        f"{gs.rank_of(ws.token)} in {names[0]}'s top-{len(gs.top)})")
                break
    return report.finish()


def greedy_parity(outputs: list[Completion], reference: Any, tol: LogprobTolerance, top_k: int,
                  record_figure: Callable[[str, float], Any], prefill: bool = True,
                  names: tuple[str, str] = ("engine", "reference")) -> ParityReport:
    """Greedy parity's verdict (checks/test_logit_parity.py::test_greedy_logprobs_match_reference; P2's graph-mode
    paths; the run's depth-noise measurement, conformance/lab/depth_noise.py): the engine's paths scored by the fp64
    reference. Where the engine exceeds `tol` and the dtype names a noise twin, the limits widen to noise_ratio x the
    twin's figures on the same paths (docs/verdicts.md "Greedy parity at depth"); the report's `tolerance` is the one
    that judged. Figures recorded, problems reported. `prefill=False`: the generated steps alone (outputs asked
    without prompt logprobs)."""
    def scored(ref: Any, k: int) -> list[Completion]:
        got = [replace(c, steps=[s.cut(k) for s in c.steps], prompt_steps=[s.cut(k) for s in c.prompt_steps])
               for c in ref.score_all(outputs, max(k, SCORED_TOP_K))]
        return got if prefill else [replace(c, prompt_steps=[]) for c in got]

    want = scored(reference, top_k + 5)
    report = logprobs_close(outputs, want, tol, names)
    if not report.ok and tol.noise_dtype:
        from conformance.reference.device import noise_twin

        twin = noise_twin(reference, tol.noise_dtype)
        noise = logprobs_close(scored(twin, top_k), want, tol, greedy_rule=False).figures()
        noise["stratum_median_abs_dlogprob"] = largest_stratum_median(noise)
        # every band's median too: bf16 widens each band by the twin's same band (widen_by_band), and whether fp16
        # could (docs/verdicts.md "Greedy parity at depth") rests on these figures from GPU runs
        bands = [k for k in noise if k.startswith("median_abs_dlogprob_")]
        for name in ("max_abs_dlogprob", "p99_abs_dlogprob", "median_abs_dlogprob", "stratum_median_abs_dlogprob",
                     *bands):
            record_figure(f"noise_twin_{name}", noise[name])
        layers = int(reference.cfg["num_hidden_layers"])
        if tol.widen_by_band:  # the record says what judged the decode bands (docs/verdicts.md)
            record_figure("noise_ratio_decode_bands", tol.decode_ratio(layers))
        report = logprobs_close(outputs, want, tol.above_noise(noise, layers), names)
        if not report.ok:
            labels = {"median": "median", "p99": "p99", "max": "max", "stratum_median": "largest band median"}
            figures = ", ".join(f"{label} {noise[f'{k}_abs_dlogprob']:.3g}" for k, label in labels.items())
            figures += "; each band by its own" if tol.widen_by_band else ""
            decode = tol.decode_ratio(layers)
            figures += f", decode bands by {decode:.3g} at {layers} layers" if tol.widen_by_band and decode != \
                tol.noise_ratio else ""
            report.problems.insert(0, f"limits widened to {tol.noise_ratio:g} x the {tol.noise_dtype} noise twin's "
                                      f"({figures}) and still exceeded:")
    record_figures(record_figure, report)
    return report


@dataclass
class KVReport(Verdict):
    during: KVState
    after: KVState
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        return {"kv_blocks_total": float(self.after.num_blocks),
                "kv_blocks_used_during": float(self.during.used_blocks),
                "kv_blocks_used_after": float(self.after.used_blocks)}

    def failure_message(self) -> str:
        return "KV cache check failed: " + "; ".join(self.problems)


def kv_blocks_released(during: KVState, after: KVState, min_used_during: int) -> KVReport:
    """Blocks were allocated while a request ran, and all are free again once it finished."""
    report = KVReport(during, after)
    if after.num_blocks <= after.reserved_blocks:
        report.problems.append(f"the engine reports {after.num_blocks} KV blocks: no cache was allocated")
    if during.used_blocks < min_used_during:
        report.problems.append(f"a running request held {during.used_blocks} blocks, fewer than the "
                               f"{min_used_during} its length needs")
    if after.num_blocks != during.num_blocks:
        report.problems.append(f"the pool changed size from {during.num_blocks} to {after.num_blocks} blocks")
    if after.used_blocks != 0:
        report.problems.append(f"{after.used_blocks} of {after.num_blocks} blocks still in use after every "
                               f"request finished ({after.free_blocks} free, {after.reserved_blocks} reserved)")
    if after.running_requests:
        report.problems.append(f"{after.running_requests} request(s) still running or waiting")
    return report


# --- Engine conformance: KV accounting, scheduling, prefix cache, bad requests. ---


@dataclass
class VerdictReport(Verdict):
    """A verdict with its figures; `details` print both sides when it fails. With `require_figures`
    a report that measured nothing fails too (a comparison that compared nothing proves nothing)."""

    what: str
    measured: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    require_figures: bool = False
    judged_by: dict[str, FigureLimit] = field(default_factory=dict)  # figure -> the limit it was held to

    @property
    def ok(self) -> bool:
        return not self.problems and (bool(self.measured) or not self.require_figures)

    def figures(self) -> dict[str, float]:
        return dict(self.measured)

    def limits(self) -> dict[str, FigureLimit]:
        return dict(self.judged_by)

    def failure_message(self) -> str:
        more = ("\n  " + "\n  ".join(self.details[:12])) if self.details else ""
        problems = "; ".join(self.problems[:10]) or "nothing was compared"
        return f"{self.what}: {problems}{more}"


def _group_kind(kind: str) -> str:
    return "sliding" if "Sliding" in kind else "full" if "FullAttention" in kind else kind


def kv_layout_matches(layout: KVLayout, want: kv_model.ExpectedKV) -> VerdictReport:
    """The engine's KV groups, page size and block count equal what the model config implies."""
    r = VerdictReport("KV-cache accounting")
    r.measured = {"kv_blocks_total": float(layout.num_blocks),
                 "kv_blocks_expected": float(want.num_blocks or -1),
                 "kv_bytes_per_block": float(want.bytes_per_block), "kv_groups": float(len(layout.groups)),
                 "kv_budget_bytes": float(layout.budget_bytes or -1),
                 "kv_block_size": float(layout.block_size)}
    r.details = [f"engine: {layout.num_blocks} blocks of {layout.block_size} tokens from a "
                 f"{layout.budget_source} budget of {layout.budget_bytes} B; groups "
                 + ", ".join(f"{g.kind}{sorted(kv_model.layer_index(n) for n in g.layer_names)} page "
                             f"{g.page_size_bytes} B" for g in layout.groups),
                 f"config implies: {want.num_blocks} blocks = budget // ({want.group_size} layers x page "
                 f"{want.page_size_bytes} B); groups "
                 + ", ".join(f"{g.kind}{list(g.layers)}" for g in want.groups)]
    if layout.requested_budget_bytes is not None and layout.budget_bytes != layout.requested_budget_bytes:
        r.problems.append(f"the suite asked for a {layout.requested_budget_bytes} B KV budget but the engine "
                          f"used {layout.budget_bytes} B ({layout.budget_source}): a setting overrode it")
    want_groups = {(g.kind, frozenset(g.layers), g.sliding_window) for g in want.groups}
    got_groups = {(_group_kind(g.kind), frozenset(kv_model.layer_index(n) for n in g.layer_names),
                   g.sliding_window if _group_kind(g.kind) == "sliding" else None) for g in layout.groups}
    if got_groups != want_groups:
        r.problems.append("the KV-cache groups differ from the layer types of the config")
    for g in layout.groups:
        if g.page_size_bytes != want.page_size_bytes or g.block_size != want.block_size:
            r.problems.append(f"group {g.kind} has {g.page_size_bytes} B pages of {g.block_size} tokens; 2 x "
                              f"{want.block_size} x kv_heads x head_dim x dtype = {want.page_size_bytes} B")
    if want.num_blocks is None:
        r.problems.append(f"the engine did not report its KV budget ({layout.budget_source}): cannot verify")
    elif layout.num_blocks != want.num_blocks:
        r.problems.append(f"{layout.num_blocks} blocks allocated, the configuration implies "
                          f"{want.num_blocks}")
    return r


def request_blocks_match(samples: list[RequestBlocks], layout: KVLayout, prompt_len: int,
                         only_request: bool = True, release_lag: int = 0) -> VerdictReport:
    """At each sample a live request holds exactly the blocks its length needs in every group. `release_lag`: decode
    steps by which an engine that schedules asynchronously frees the blocks behind the window (vLLM on GPUs
    schedules step N+1 before step N's output is in: the sliding group then holds, for that many steps, what the
    length of that many tokens earlier needed, never more)."""
    r = VerdictReport("blocks held by a request")
    decode_samples = 0
    for s in samples:
        c = s.num_computed_tokens
        if c < prompt_len:
            continue  # mid-prefill (chunked): the sliding group's lazy frees are not pinned down here
        decode_samples += c > prompt_len
        for g, held in zip(layout.groups, s.held):
            kind = _group_kind(g.kind)
            need = kv_model.blocks_needed(kind, c, layout.block_size, g.sliding_window,
                                          after_decode=c > prompt_len)
            low = kv_model.blocks_needed(kind, c, layout.block_size, g.sliding_window, after_decode=True)
            ok = held == need if c > prompt_len or kind != "sliding" else low <= held <= need
            if not ok and kind == "sliding" and c > prompt_len and release_lag:
                earlier = {kv_model.blocks_needed(kind, c - k, layout.block_size, g.sliding_window,
                                                  after_decode=c - k > prompt_len) for k in range(1, release_lag + 1)}
                ok = held in earlier
            r.details.append(f"{c} tokens computed: {kind} group holds {held}, needs {need}")
            if not ok:
                r.problems.append(f"with {c} tokens computed the {kind} group holds {held} blocks, its "
                                  f"length needs {need} (block size {layout.block_size}, window "
                                  f"{g.sliding_window})")
        if only_request and s.free_blocks != layout.num_blocks - 1 - sum(s.held):
            r.problems.append(f"the pool reports {s.free_blocks} free blocks but {layout.num_blocks} - 1 "
                              f"null - {sum(s.held)} held = {layout.num_blocks - 1 - sum(s.held)}")
    if decode_samples == 0:
        r.problems.append("no sample was taken after a decode step: nothing was verified")
    last = samples[-1] if samples else None
    r.measured = {"kv_blocks_held_" + _group_kind(g.kind): float(h)
                 for g, h in zip(layout.groups, last.held if last else [])}
    return r


def kv_no_leak(rounds: list[KVState]) -> VerdictReport:
    """After every round of traffic all blocks are free, nothing is queued and the pool keeps its size."""
    r = VerdictReport("KV blocks over repeated rounds")
    worst = max((s.used_blocks for s in rounds), default=-1)
    r.measured = {"rounds": float(len(rounds)), "max_used_after_round": float(worst)}
    if not rounds:
        r.problems.append("no round was recorded")
    for n, s in enumerate(rounds):
        if s.used_blocks or s.running_requests or s.num_blocks != rounds[0].num_blocks:
            r.problems.append(f"after round {n}: {s.used_blocks} blocks still used, {s.running_requests} "
                              f"request(s) left, pool {s.num_blocks} blocks (first: {rounds[0].num_blocks})")
    return r


def completions_equivalent(got: list[Completion], want: list[Completion], tol: LogprobTolerance,
                           names: tuple[str, str], greedy_rule: bool = True) -> ParityReport:
    """Same prompts in the same order, then logprobs_close: greedy tokens and logprobs agree."""
    report = logprobs_close(got, want, tol, names, greedy_rule)
    for n, (g, w) in enumerate(zip(got, want)):
        if g.prompt_ids != w.prompt_ids:
            report.problems.append(f"completion {n} answers a different prompt: outputs were reordered or "
                                   f"mixed up")
        if not g.token_ids:
            report.problems.append(f"completion {n}: {names[0]} returned no tokens (unfinished or dropped)")
    return report


def _bounded(r: VerdictReport, name: str, minimum: float | None, maximum: float | None, source: str) -> None:
    """`r`'s figure `name` is judged against `minimum` or `maximum`: the limit it was held to, for its record (a
    threshold: a count or a time that passes or breaks it, its distance to it no measure of the stack)."""
    for bound, kind in ((minimum, "min"), (maximum, "max")):
        if bound is not None:
            r.judged_by[name] = FigureLimit(float(bound), kind, source, headroom=False)


def cached_tokens(label: str, completions: list[Completion], minimum: int | None = None,
                  maximum: int | None = None) -> VerdictReport:
    """The prompt tokens the engine served from its prefix cache for these requests, by its own per-request count,
    at least `minimum` (or at most `maximum`). A request whose count the engine does not report fails: the check
    cannot tell a hit from a miss."""
    r = VerdictReport(f"prefix-cache hits ({label})")
    counts = [c.cached_tokens for c in completions]
    if not counts or any(n is None for n in counts):
        r.problems.append(f"the engine reported no cached-token count for {counts.count(None)} of {len(counts)} "
                          "requests, so a cache hit cannot be told from a miss")
        return r
    total = sum(int(n) for n in counts if n is not None)
    r.measured = {"cached_tokens": float(total)}
    _bounded(r, "cached_tokens", minimum, maximum, "the check's own bound on prompt tokens served from the cache")
    if minimum is not None and not total >= minimum:
        r.problems.append(f"{label}: {total} prompt tokens served from the prefix cache, expected at least {minimum}")
    if maximum is not None and not total <= maximum:
        r.problems.append(f"{label}: {total} prompt tokens served from the prefix cache, expected at most {maximum}")
    return r


def counter_delta(metric: str, before: dict[str, float], after: dict[str, float],
                  minimum: float | None = None, maximum: float | None = None) -> VerdictReport:
    """A metrics counter moved by at least `minimum` (or at most `maximum`) between two snapshots."""
    r = VerdictReport(f"counter {metric}")
    if metric not in after:
        r.problems.append(f"the engine reports no metric {metric} (has: {', '.join(sorted(after)[:12])} ...)")
        return r
    delta = after[metric] - before.get(metric, 0.0)
    name = metric.split(":")[-1] + "_delta"
    r.measured = {name: delta}
    _bounded(r, name, minimum, maximum, f"the check's own bound on {metric}")
    if minimum is not None and not delta >= minimum:
        r.problems.append(f"{metric} moved by {delta:g}, expected at least {minimum:g}")
    if maximum is not None and not delta <= maximum:
        r.problems.append(f"{metric} moved by {delta:g}, expected at most {maximum:g}")
    return r


def concurrency_within(run: StepwiseRun, limit: int) -> VerdictReport:
    """Never more than `limit` requests running, the limit reached, the rest queued, all finished."""
    r = VerdictReport(f"max_num_seqs={limit}")
    r.measured = {"max_running": float(run.max_running), "max_waiting": float(run.max_waiting),
                 "steps": float(run.steps)}
    r.details = ["running per step: " + " ".join(str(c.running) for c in run.trace[:80])]
    if run.max_running > limit:
        r.problems.append(f"{run.max_running} requests ran at once, above max_num_seqs={limit}")
    if run.max_running < limit or run.max_waiting == 0:
        r.problems.append(f"the limit was never exercised (max running {run.max_running}, max waiting "
                          f"{run.max_waiting}): give it more requests than {limit}")
    if run.unfinished:
        r.problems.append(f"{run.unfinished} request(s) never finished")
    return r


def prefill_steps(run: StepwiseRun, prompt_lens: list[int], token_budget: int,
                  chunked: bool, output_lag: int = 0) -> VerdictReport:
    """Chunked: a prompt over the token budget needs ceil(len / budget) steps before its first token.
    Unchunked: every first token comes out in the request's arrival step. `output_lag`: the steps an engine
    returns a step's outputs after it (1 under vLLM's async scheduling, the GPU default: a step returns the batch
    before it), taken off every span."""
    r = VerdictReport("chunked prefill" if chunked else "unchunked prefill")
    spans = [f - a + 1 - output_lag if f >= 0 else -1 for f, a in zip(run.first_token_step, run.arrivals)]
    r.measured = {"max_prefill_steps": float(max(spans, default=-1))}
    r.details = [f"prompt of {n} tokens: first token after {s} step(s)" for n, s in zip(prompt_lens, spans)]
    for n, s in zip(prompt_lens, spans):
        need = -(-n // token_budget) if chunked else 1
        if s < 0 or (chunked and s < need) or (not chunked and s != 1):
            r.problems.append(f"a {n}-token prompt gave its first token after {s} step(s); "
                              f"{'at least' if chunked else 'exactly'} {need} expected with a "
                              f"{token_budget}-token budget")
    return r


def rejected_clearly(outcome: SubmitOutcome, max_seconds: float, words: tuple[str, ...]) -> VerdictReport:
    """The engine refused the request at submission, quickly, with a message that names the problem."""
    r = VerdictReport(f"bad request '{outcome.label}'")
    r.measured = {"reject_s": outcome.seconds}
    _bounded(r, "reject_s", None, max_seconds, "the check's bound on how long a rejection may take")
    r.details = [f"{outcome.error_type or 'accepted'}: {outcome.message[:300]}"]
    if outcome.accepted:
        r.problems.append("it was accepted" + (" (the probe aborted it at once)" if outcome.aborted else ""))
        return r
    if outcome.seconds > max_seconds:
        r.problems.append(f"the rejection took {outcome.seconds:.2f} s (limit {max_seconds} s)")
    if not any(w.lower() in outcome.message.lower() for w in words):
        r.problems.append(f"the error does not name the problem (expected one of {words}): "
                          f"{outcome.error_type}: {outcome.message[:200]!r}")
    return r
