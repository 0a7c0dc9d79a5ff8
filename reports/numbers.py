"""How figures are written on the dashboard: short, aligned and never misleading about magnitude."""

from __future__ import annotations

import math


def sci(value: float) -> str:
    """Scientific notation without padding: 1e-4, 2.5e-6, -3.1e7."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def short_number(value: float) -> str:
    """A figure in a few characters for table cells: 0.0029, 0.84, 861, 1.4k, 2.1e-6 (inf and nan as such)."""
    magnitude = abs(value)
    if not math.isfinite(value):
        return str(value)
    if magnitude == 0:
        return "0"
    if magnitude < 1e-3:
        return sci(value)
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.3g}"


def tick_number(value: float) -> str:
    """A chart axis label: full digits where they fit (4,250), scientific for extremes."""
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 1e5 or magnitude < 1e-3:
        return sci(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def percent(value: float) -> str:
    return f"{value * 100:.0f}%"
