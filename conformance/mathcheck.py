"""Comparison helpers for model components — RoPE tables, the MoE block — and the mutant diagnosis
that says which known failure mode a disagreeing stack behaves like. Same contract as compare.py:
reports print both sides, the figure and the tolerance, and raise only via `raise_if_failed`."""

from __future__ import annotations

import math

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
