"""Comparison helpers for model components — RoPE tables, the MoE block — and the mutant diagnosis
that says which known failure mode a disagreeing stack behaves like. Same contract as compare.py:
reports print both sides, the figure and the tolerance, and raise only via `raise_if_failed`."""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
from typing import Any

import torch

from conformance.reference.gpt_oss import top_experts
from conformance.verdicts.compare import LayerTolerance, VerdictReport, position_band
from conformance.verdicts.verdict import FigureLimit

MANTISSA_BITS = {"float32": (23, -126), "bfloat16": (7, -126), "float16": (10, -14)}


def spacing(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """The gap between adjacent numbers of `dtype` at each value (subnormals included)."""
    bits, emin = MANTISSA_BITS[dtype]
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0 ** (emin - bits)))).clamp_min(emin)
    return torch.pow(2.0, exponent - bits)


def _round_to(values: torch.Tensor, dtype: str) -> torch.Tensor:
    return values.to(getattr(torch, dtype)).to(torch.float64)


def rope_close(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
               positions: list[int], tol: dict[str, float], dtype: str = "float32") -> VerdictReport:
    """Engine cos/sin tables [P, D/2] against the reference's, judged at the storage resolution of `dtype`:
    each entry within `storage_ulps` spacings of the reference rounded to that dtype (plus the fp32 angle error
    that grows with position), the angle recovered from each (cos, sin) pair within `angle_abs +
    angle_per_position * pos`, and the concentration (YaRN mscale). Position 1 must be among the positions:
    its angle is inv_freq itself, judged relatively where the dtype has an exact limit (fp32)."""
    report = VerdictReport(f"RoPE/YaRN tables ({dtype} storage)", require_figures=True)
    if dtype not in MANTISSA_BITS:
        report.problems.append(f"no storage model for dtype {dtype}")
        return report
    (gc, gs), (wc, ws) = [(c.double(), s.double()) for c, s in (got, want)]
    if gc.shape != wc.shape:
        report.problems.append(f"table shape {tuple(gc.shape)} vs reference {tuple(wc.shape)}")
        return report
    if not (torch.isfinite(gc).all() and torch.isfinite(gs).all()):
        report.problems.append("the engine's table holds NaN or inf")
        return report
    pos = torch.tensor(positions, dtype=torch.float64)[:, None]
    # storage: the reference rounded to the engine's dtype is what a correct fp32-computed table stores
    rc, rs = _round_to(wc, dtype), _round_to(ws, dtype)
    allowed_c = tol["storage_ulps"] * spacing(rc, dtype) + tol["table_abs_floor"] + tol["table_abs_per_position"] * pos
    allowed_s = tol["storage_ulps"] * spacing(rs, dtype) + tol["table_abs_floor"] + tol["table_abs_per_position"] * pos
    excess = torch.maximum((gc - rc).abs() / allowed_c, (gs - rs).abs() / allowed_s)
    # angles: wrapped difference of atan2, per position (worst over frequencies)
    d_angle = torch.remainder(torch.atan2(gs, gc) - torch.atan2(ws, wc) + math.pi, 2 * math.pi) - math.pi
    angle_err = d_angle.abs().max(dim=1).values
    angle_allowed = tol["angle_abs"] + tol["angle_per_position"] * pos[:, 0]
    magnitude_err = (torch.hypot(gc, gs) - torch.hypot(wc, ws)).abs()
    conc_abs = magnitude_err.max().item()
    i1 = positions.index(1)
    g_inv, w_inv = torch.atan2(gs[i1], gc[i1]), torch.atan2(ws[i1], wc[i1])
    inv_rel = ((g_inv - w_inv).abs() / w_inv.abs()).max().item()
    far = int(pos[:, 0].argmax())
    report.measured = {"rope_inv_freq_max_rel_err": inv_rel, "rope_concentration_abs_err": conc_abs,
                      "rope_table_max_abs_err": torch.maximum((gc - wc).abs(), (gs - ws).abs()).max().item(),
                      "rope_table_max_storage_excess": excess.max().item(),
                      f"rope_angle_err_rad_at_{positions[far]}": angle_err[far].item(),
                      "rope_angle_err_rad_max": angle_err.max().item()}
    where = f"gpt_oss.toml tolerances.rope.{dtype}"
    report.judged_by = {
        "rope_concentration_abs_err": FigureLimit(tol["concentration_abs"], "max", f"{where}.concentration_abs"),
        "rope_table_max_storage_excess": FigureLimit(1.0, "max", f"a ratio to the allowed error ({where})"),
        f"rope_angle_err_rad_at_{positions[far]}": FigureLimit(angle_allowed[far].item(), "max",
                                                               f"{where}.angle_abs + angle_per_position x position")}
    if "inv_freq_rel" in tol:
        report.judged_by["rope_inv_freq_max_rel_err"] = FigureLimit(tol["inv_freq_rel"], "max", f"{where}.inv_freq_rel")
    report.details = ["angle error by position: " + ", ".join(
        f"{p}: {e:.2g} rad" for p, e in zip(positions, angle_err.tolist()))]
    if "inv_freq_rel" in tol and not inv_rel <= tol["inv_freq_rel"]:
        worst = int(((g_inv - w_inv).abs() / w_inv.abs()).argmax())
        report.problems.append(f"inv_freq[{worst}] is {g_inv[worst].item():.8g}, reference {w_inv[worst].item():.8g} "
                               f"(relative error {inv_rel:.3g} > {tol['inv_freq_rel']:.3g})")
    if not conc_abs <= tol["concentration_abs"]:
        want_conc = torch.hypot(wc[i1], ws[i1]).mean().item()
        at, freq = divmod(int(magnitude_err.argmax()), magnitude_err.shape[1])
        report.problems.append(f"concentration (YaRN mscale) is off by {conc_abs:.3g} (limit "
                               f"{tol['concentration_abs']:.3g}); reference {want_conc:.6f}, worst at position "
                               f"{positions[at]}, frequency {freq}, where the engine's (cos, sin) has magnitude "
                               f"{torch.hypot(gc[at, freq], gs[at, freq]).item():.6f}")
    bad = (angle_err > angle_allowed).nonzero().flatten().tolist()
    if bad:
        near = [i for i in range(len(positions)) if positions[i] <= 256]
        floor = max((angle_err[i].item() for i in near), default=0.0)
        grows = angle_err[far].item() > 4 * max(floor, tol["angle_abs"])
        first = positions[bad[0]]
        cause = (f"the error grows with position ({floor:.2g} rad up to 256, {angle_err[far].item():.3g} rad at "
                 f"{positions[far]}): the engine's angles come from a rounded inv_freq or low-precision positions, "
                 f"a long-context defect that {dtype} storage cannot explain (it bounds the error by "
                 f"{tol['angle_abs']:.2g} rad)") if grows else (
                 f"the error is {angle_err.max().item():.3g} rad already at low positions: wrong base, YaRN range or "
                 f"concentration")
        report.problems.append(f"RoPE angles differ from the reference from position {first} on; {cause}")
    if excess.max().item() > 1.0 and not bad:
        p = positions[int(excess.max(dim=1).values.argmax())]
        report.problems.append(f"cos/sin differ from the reference rounded to {dtype} by more than "
                               f"{tol['storage_ulps']} spacing(s) at position {p} (the worst)")
    return report


def _router_ties(reference: Any, layer: int, x: torch.Tensor, k: int, margin: float,
                 logits: torch.Tensor | None = None) -> torch.Tensor:
    """Per position of x: whether the reference's top-k experts of `layer` are decided by no more than `margin` x
    the position's largest |router logit| (rounding noise can route it either way on a healthy stack). `logits`:
    the reference's router logits of x where the caller has them."""
    if margin <= 0 or k < 1:
        return torch.zeros(x.shape[0], dtype=torch.bool)
    logits = reference.router_logits(layer, x) if logits is None else logits
    top = torch.topk(logits, k + 1, dim=-1).values
    return (top[:, k - 1] - top[:, k]) <= margin * logits.abs().amax(dim=-1)


REROUTE_CHUNK = 4096  # rows of (position, routing) a MoE call of moe_at_near_ties takes at least: 94 MB of fp64 at
# hidden 2880


def admissible_routings(logits: torch.Tensor, k: int, margin: float, widest: int = 8) -> list[list[int]]:
    """The top-k expert sets [each k ids] that a router whose logits (one position's, fp64) are off by rounding within
    `margin` could choose: the zone is the chosen experts that an unchosen one lies within `margin` of (the best
    unchosen, so at least the k-th) and the unchosen ones within `margin` of the weakest chosen; every expert above the
    zone is kept, and any of the zone's fill the rest. A decided position has one, the router's own. The zone is cut to
    the `widest` places nearest the k-th."""
    vals, idx = torch.sort(logits, descending=True, stable=True)
    near = range(max(0, k - widest // 2), min(len(vals), k + widest // 2))
    zone = [j for j in near if (j < k and float(vals[j] - vals[k]) <= margin)
            or (j >= k and float(vals[k - 1] - vals[j]) <= margin)]
    if not any(j < k for j in zone) or not any(j >= k for j in zone):
        return [[int(e) for e in idx[:k]]]
    sure = [int(idx[j]) for j in range(zone[0])]
    return [sure + [int(idx[j]) for j in chosen] for chosen in itertools.combinations(zone, k - len(sure))]


def moe_at_near_ties(reference: Any, layer: int, x: torch.Tensor, y: torch.Tensor, k: int,
                     margin: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's MoE block of `layer` on x [T, H] (the engine's inputs; y: its outputs there), and at the rows
    whose router near-ties (`_router_ties`, margin x the row's largest |logit|) rounding could decide either way:
    the smallest ||y - reference|| / ||reference|| over the row's admissible routings (`admissible_routings`) and
    whether that nearest routing is another than the router's own top-k (on equal errors the router's own wins).
    Returns (reference [T, H], tied [T] bool, best [tied], other [tied]). The router's own routing of every row and
    the near-ties' other routings go through the layer's experts in one call (in parts of at least REROUTE_CHUNK
    rows, bounded memory beside an engine): a device reference widens each MXFP4 expert of the layer once for all
    of them, not once for the block and again for each part of the near-ties' routings."""
    x = x.to(torch.float64)
    if k < 1 or margin <= 0:
        return reference.moe(layer, x), torch.zeros(x.shape[0], dtype=torch.bool), torch.empty(0), torch.empty(0)
    logits = reference.router_logits(layer, x).cpu()
    tied = _router_ties(reference, layer, x, k, margin, logits)
    mine = top_experts(logits, k)
    tied_rows = tied.nonzero().flatten().tolist()
    sets, owner, own = [], [], []
    for n, r in enumerate(tied_rows):
        for routing in admissible_routings(logits[r], k, margin * float(logits[r].abs().max())):
            sets.append(routing)
            owner.append(n)
            own.append(set(routing) == set(mine[r].tolist()))
    rows, own = torch.tensor(owner, dtype=torch.long), torch.tensor(own, dtype=torch.bool)
    every_x = torch.cat([x, x[tied][rows]])
    every_routing = torch.cat([mine, torch.tensor(sets, dtype=mine.dtype).reshape(-1, k)])
    part = max(REROUTE_CHUNK, x.shape[0])
    out = torch.cat([reference.moe_routed(layer, every_x[s:s + part], every_routing[s:s + part]).cpu()
                     for s in range(0, every_x.shape[0], part)])
    want, alternatives = out[:x.shape[0]], out[x.shape[0]:]
    scale = want[tied].norm(dim=-1).clamp_min(1e-30)
    err = torch.nan_to_num((y[tied][rows].double() - alternatives).norm(dim=-1) / scale[rows], nan=math.inf)
    best = torch.full((len(tied_rows),), math.inf, dtype=torch.float64).scatter_reduce(0, rows, err, "amin")
    mine_err = torch.full((len(tied_rows),), math.inf, dtype=torch.float64)
    mine_err[rows[own]] = err[own]  # every row's own top-k is among its routings
    return want, tied, best, mine_err > best


def decisive_router_inputs(reference: Any, layers: tuple[int, ...], m: int, dtype: torch.dtype,
                           tie_ulps: float) -> tuple[torch.Tensor, int]:
    """M hidden states [M, H], fp64 holding values of `dtype` (what an engine in that dtype receives), drawn
    from a normal seeded with M, whose top-k experts are decided in every layer of `layers`: the k-th and
    (k+1)-th router logits of the reference differ by more than `tie_ulps` x eps(dtype) x the token's largest
    |logit|. Returns them and how many draws were passed over. A near-tie is decided by rounding noise."""
    hidden, k = int(reference.cfg["hidden_size"]), int(reference.cfg["num_experts_per_tok"])
    gen = torch.Generator().manual_seed(m)
    eps = torch.finfo(dtype).eps
    rows: list[torch.Tensor] = []
    decided: list[torch.Tensor] = []
    while sum(int(d.sum()) for d in decided) < m:
        if sum(len(r) for r in rows) > 64 * m + 4096:
            raise ValueError(f"the router's top-{k} ties within {tie_ulps} ulps of {dtype} for almost every draw: "
                             f"no {m} tokens with decided experts")
        x = torch.randn(max(m, 64), hidden, generator=gen, dtype=torch.float64).to(dtype).to(torch.float64)
        ok = torch.ones(len(x), dtype=torch.bool)
        for layer in layers:
            ok &= ~_router_ties(reference, layer, x, k, tie_ulps * eps)
        rows.append(x)
        decided.append(ok)
    ok = torch.cat(decided)
    last = int(ok.nonzero()[m - 1])  # the M-th decided draw: the ones passed over before it are the redrawn
    return torch.cat(rows)[: last + 1][ok[: last + 1]], last + 1 - m


def moe_close(got: torch.Tensor, want: torch.Tensor, rel_tol: float, label: str) -> VerdictReport:
    """Max |engine - reference| over the block output, relative to the reference's largest magnitude."""
    report = VerdictReport(f"MoE block {label}", require_figures=True)
    if got.shape != want.shape:
        report.problems.append(f"output shape {tuple(got.shape)} vs reference {tuple(want.shape)}")
        return report
    scale = want.abs().max().item() or 1.0
    rel = ((got.double() - want.double()).abs().max().item()) / scale
    report.measured = {"moe_max_rel_err": rel if math.isfinite(rel) else float("inf")}
    if not rel <= rel_tol:
        report.problems.append(f"max |Δ| / max |reference| = {rel:.3g} exceeds {rel_tol:.3g}")
    return report


def nearest(distances: dict[str, float]) -> tuple[str, float]:
    """The name and distance of the closest candidate (NaN counts as infinitely far)."""
    name = min(distances, key=lambda k: distances[k] if math.isfinite(distances[k]) else math.inf)
    return name, distances[name]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def layers_close(probes: list[dict], reference: Any, tol: LayerTolerance) -> VerdictReport:
    """Each attention and MoE block of the engine against the fp64 reference fed the engine's own input to
    that block, stratified by block, layer type (sliding/full), position band and phase (prefill/decode).
    A fault that lives in one stratum (positions past 256, sliding layers past the window, decode only)
    moves that stratum's figures while the rest stay at the dtype's noise floor."""
    report = VerdictReport("per-layer blocks against the fp64 reference", require_figures=True)
    strata: dict[tuple[str, str, str, str], list[float]] = {}
    tied_in: dict[tuple[str, str, str, str], int] = {}  # per stratum: MoE positions at a router near-tie
    ties: dict[str, int] = {}  # near-ties in all, and those another admissible routing matched better
    k = int(reference.cfg.get("num_experts_per_tok", 0))
    moe_at: dict[int, list[tuple[int, torch.Tensor, torch.Tensor, int]]] = {}  # layer -> (prefill, x, y, positions)

    def judge(block: str, i: int, x: torch.Tensor, y: torch.Tensor, want: torch.Tensor,
              prefills: list[tuple[int, int]], near_ties: tuple[torch.Tensor, ...] | None = None) -> None:
        """The rows of x (prompts' positions 0..n-1 one prompt after another; `prefills`: each prompt's prefill
        length and position count) into their strata; a MoE position at a near-tie (`near_ties`: what
        moe_at_near_ties found beside `want`) judged against the nearest routing the tie leaves open."""
        scale = want.norm(dim=-1).clamp_min(1e-30)
        rel = torch.nan_to_num((y - want).norm(dim=-1) / scale, nan=math.inf, posinf=math.inf)  # NaN fails
        tied = torch.zeros(x.shape[0], dtype=torch.bool)
        if near_ties is not None and bool(near_ties[0].any()):
            tied, best, other = near_ties
            ties["rerouted"] = ties.get("rerouted", 0) + int(other.sum())
            ties["tied"] = ties.get("tied", 0) + int(tied.sum())
            rel[tied] = torch.minimum(rel[tied], best.to(rel.dtype))
        kind, values, at = reference.layer_type(i), rel.tolist(), tied.tolist()
        row = 0
        for prefill, count in prefills:
            for t in range(count):
                phase = "prefill" if t < prefill else "decode"
                key = (block, kind, position_band(t, tol.bands), phase)
                strata.setdefault(key, []).append(values[row])
                if at[row]:
                    tied_in[key] = tied_in.get(key, 0) + 1
                row += 1

    # a device reference recomputes its blocks' rows on the CPU beside the device and raises a disagreement on
    # leaving (reference/device.py checked_beside): before any stratum below judges the engine
    with getattr(reference, "checked_beside", contextlib.nullcontext)():
        for n, probe in enumerate(probes):
            positions, prefill = list(probe["positions"]), int(probe["prefill_len"])
            count = len(positions)
            if count == 0 or positions != list(range(count)):
                report.problems.append(f"prompt {n}: the engine ran positions {positions[:6]}... not 0..{count - 1} in "
                                       f"order: the probe cannot line them up with the reference")
                continue
            if count <= prefill and probe.get("decode_expected", True):
                report.problems.append(f"prompt {n}: no decode step was captured (only the {prefill}-token prefill)")
            cos, sin = reference.rope_tables(list(range(count)))
            for block in ("attn", "moe"):
                for i, (x, y) in zip(probe.get("layers", range(len(probe[block]))), probe[block]):
                    if x.shape[0] != count or y.shape != x.shape:
                        report.problems.append(f"prompt {n}: {block} of layer {i} saw {x.shape[0]} positions, "
                                               f"not {count}")
                    elif block == "attn":  # causal over the prompt's own positions: one prompt at a time
                        judge("attn", i, x, y, reference.attention(i, x, cos, sin), [(prefill, count)])
                    else:
                        moe_at.setdefault(i, []).append((prefill, x, y, count))
        for i, rows in moe_at.items():  # a MoE is per token: one call a layer for every prompt, its experts read once
            x, y = torch.cat([r[1] for r in rows]), torch.cat([r[2] for r in rows])
            want, *near_ties = moe_at_near_ties(reference, i, x, y, k, tol.router_tie)
            judge("moe", i, x, y, want, [(r[0], r[3]) for r in rows], tuple(near_ties))
    worst = 0.0
    for key in sorted(strata):
        block, kind, band, phase = key
        values = strata[key]
        top, med, p90 = max(values), statistics.median(values), _quantile(values, 0.9)
        grow = 1.0 + int(band.split("-")[0].rstrip("+")) / tol.position_scale
        base = tol.blocks[block]
        lim = type(base)(base.median * grow, base.p90 * grow, base.max * grow)
        name = f"layer_{block}_{kind}_{band}_{phase}"
        report.measured[name + "_p90"] = p90
        report.judged_by[name + "_p90"] = FigureLimit(lim.p90, "max", "tolerances.toml layers p90, grown with position")
        ratio = max(med / lim.median, p90 / lim.p90, top / lim.max)
        worst = max(worst, ratio if math.isfinite(ratio) else math.inf)
        line = (f"{block:4s} {kind:7s} positions {band:9s} {phase:7s}: median {med:.3g} p90 {p90:.3g} max {top:.3g} "
                f"over {len(values)} positions" + (f" ({tied_in[key]} at a router near-tie)" if key in tied_in else ""))
        report.details.append(line)
        if not (med <= lim.median and p90 <= lim.p90 and top <= lim.max):
            report.problems.append(f"{block} blocks of {kind} layers at positions {band} ({phase}) disagree: median "
                                   f"{med:.3g} (limit {lim.median:.3g}), p90 {p90:.3g} (limit {lim.p90:.3g}), max "
                                   f"{top:.3g} (limit {lim.max:.3g})")
    if strata:
        report.measured["layer_worst_ratio_to_limit"] = worst
        report.judged_by["layer_worst_ratio_to_limit"] = FigureLimit(1.0, "max", "a ratio to its own limit")
        report.measured["layer_moe_router_ties"] = float(ties.get("tied", 0))
        report.measured["layer_moe_rerouted"] = float(ties.get("rerouted", 0))
        every = [v for values in strata.values() for v in values]
        report.measured["layer_rel_err_median"] = statistics.median(every)
        report.measured["layer_rel_err_max"] = max(every)
        for block in ("attn", "moe"):  # each block's largest error over every position
            report.measured[f"layer_{block}_max"] = max((v for key, values in strata.items() if key[0] == block
                                                         for v in values), default=float("nan"))
    if tol.source:
        report.details.append(f"limits: {tol.source}")
    return report
