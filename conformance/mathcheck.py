"""Comparison helpers for model components — RoPE tables, the MoE block — and the mutant diagnosis
that says which known failure mode a disagreeing stack behaves like. Same contract as compare.py:
reports print both sides, the figure and the tolerance, and raise only via `raise_if_failed`."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from conformance.compare import VerdictReport


def rope_close(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
               positions: list[int], tol: dict[str, float]) -> VerdictReport:
    """Engine cos/sin tables [P, D/2] against the reference's. Position 1 must be among the positions:
    there the angle is inv_freq itself, so the engine's inv_freq and concentration are recovered."""
    report = VerdictReport("RoPE/YaRN tables", require_figures=True)
    (gc, gs), (wc, ws) = [(c.double(), s.double()) for c, s in (got, want)]
    if gc.shape != wc.shape:
        report.problems.append(f"table shape {tuple(gc.shape)} vs reference {tuple(wc.shape)}")
        return report
    i1 = positions.index(1)
    g_conc, w_conc = torch.hypot(gc[i1], gs[i1]), torch.hypot(wc[i1], ws[i1])
    g_inv, w_inv = torch.atan2(gs[i1], gc[i1]), torch.atan2(ws[i1], wc[i1])
    inv_rel = ((g_inv - w_inv).abs() / w_inv.abs()).max().item()
    conc_abs = (g_conc - w_conc).abs().max().item()
    pos = torch.tensor(positions, dtype=torch.float64)[:, None]
    allowed = tol["table_abs_floor"] + tol["table_abs_per_position"] * pos
    excess = torch.maximum((gc - wc).abs(), (gs - ws).abs()) / allowed
    report.figures = {"rope_inv_freq_max_rel_err": inv_rel, "rope_concentration_abs_err": conc_abs,
                      "rope_table_max_abs_err": torch.maximum((gc - wc).abs(), (gs - ws).abs()).max().item()}
    if not inv_rel <= tol["inv_freq_rel"]:
        worst = int(((g_inv - w_inv).abs() / w_inv.abs()).argmax())
        report.problems.append(f"inv_freq[{worst}] is {g_inv[worst].item():.8g}, reference {w_inv[worst].item():.8g} "
                               f"(relative error {inv_rel:.3g} > {tol['inv_freq_rel']:.3g})")
    if not conc_abs <= tol["concentration_abs"]:
        report.problems.append(f"concentration (YaRN mscale) is {g_conc.mean().item():.6f}, "
                               f"reference {w_conc.mean().item():.6f}")
    if not excess.max().item() <= 1.0:
        p = positions[int(excess.max(dim=1).values.argmax())]
        report.problems.append(f"cos/sin differ beyond the tolerance at position {p} (the worst)")
    return report


def moe_close(got: torch.Tensor, want: torch.Tensor, rel_tol: float, label: str) -> VerdictReport:
    """Max |engine - reference| over the block output, relative to the reference's largest magnitude."""
    report = VerdictReport(f"MoE block {label}", require_figures=True)
    if got.shape != want.shape:
        report.problems.append(f"output shape {tuple(got.shape)} vs reference {tuple(want.shape)}")
        return report
    scale = want.abs().max().item() or 1.0
    rel = ((got.double() - want.double()).abs().max().item()) / scale
    report.figures = {"moe_max_rel_err": rel if math.isfinite(rel) else float("inf")}
    if not rel <= rel_tol:
        report.problems.append(f"max |Δ| / max |reference| = {rel:.3g} exceeds {rel_tol:.3g}")
    return report


def nearest(distances: dict[str, float]) -> tuple[str, float]:
    """The name and distance of the closest candidate (NaN counts as infinitely far)."""
    name = min(distances, key=lambda k: distances[k] if math.isfinite(distances[k]) else math.inf)
    return name, distances[name]


@dataclass(frozen=True)
class BlockLimits:
    median: float
    p90: float
    max: float


@dataclass(frozen=True)
class LayerTolerance:
    """Limits on the per-position relative error ||engine - reference|| / ||reference|| per block kind (attn,
    moe), judged in every stratum (block, layer type, position band, phase) separately (data: tolerances.toml
    [layers]). The MoE max is loose on purpose: in low precision a near-tie in the router picks another
    expert for a token now and then, which the median and p90 absorb."""

    blocks: dict[str, BlockLimits]
    bands: tuple[int, ...]
    source: str = ""


def _band(t: int, edges: tuple[int, ...]) -> str:
    lo = max((e for e in edges if e <= t), default=0)
    hi = min((e for e in edges if e > t), default=None)
    return f"{lo}-{hi - 1}" if hi is not None else f"{lo}+"


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
            for i, (x, y) in enumerate(probe[block]):
                if x.shape[0] != count or y.shape != x.shape:
                    report.problems.append(f"prompt {n}: {block} of layer {i} saw {x.shape[0]} positions, "
                                           f"not {count}")
                    continue
                want = reference.attention(i, x, cos, sin) if block == "attn" else reference.moe(i, x)
                rel = (y - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)
                rel = torch.nan_to_num(rel, nan=math.inf, posinf=math.inf)  # a NaN output fails
                kind = reference.layer_type(i)
                for t, value in enumerate(rel.tolist()):
                    phase = "prefill" if t < prefill else "decode"
                    strata.setdefault((block, kind, _band(t, tol.bands), phase), []).append(value)
    worst = 0.0
    for (block, kind, band, phase), values in sorted(strata.items()):
        med, p90, top = statistics.median(values), _quantile(values, 0.9), max(values)
        lim = tol.blocks[block]
        name = f"layer_{block}_{kind}_{band}_{phase}"
        report.figures[name + "_p90"] = p90
        ratio = max(med / lim.median, p90 / lim.p90, top / lim.max)
        worst = max(worst, ratio if math.isfinite(ratio) else math.inf)
        line = (f"{block:4s} {kind:7s} positions {band:9s} {phase:7s}: median {med:.3g} p90 {p90:.3g} max {top:.3g} "
                f"over {len(values)} positions")
        report.details.append(line)
        if not (med <= lim.median and p90 <= lim.p90 and top <= lim.max):
            report.problems.append(f"{block} blocks of {kind} layers at positions {band} ({phase}) disagree: median "
                                   f"{med:.3g} (limit {lim.median:.3g}), p90 {p90:.3g} (limit {lim.p90:.3g}), max "
                                   f"{top:.3g} (limit {lim.max:.3g})")
    if strata:
        report.figures["layer_worst_ratio_to_limit"] = worst
        every = [v for values in strata.values() for v in values]
        report.figures["layer_rel_err_median"] = statistics.median(every)
        report.figures["layer_rel_err_max"] = max(every)
    if tol.source:
        report.details.append(f"limits: {tol.source}")
    return report
