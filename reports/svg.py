"""Small inline-SVG line charts for the dashboard (no plotting library, no scripts, no external assets).

A chart is a time axis (run start times), one polyline per series with a dot per run (each dot carries a
<title> tooltip), horizontal grid lines with tick labels, and a log scale chosen automatically for positive
figures spanning more than three decades (parity errors do).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape

from reports.numbers import tick_number
from reports.results import parse_time

# Okabe–Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7a5195", "#444444")


@dataclass
class Series:
    """One line: a name, a colour and (timestamp, value) points."""

    name: str
    color: str
    points: list[tuple[str, float]] = field(default_factory=list)


def _nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= step * mult:
            step *= mult
            break
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _on_axis(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def line_chart(series: list[Series], *, label: str, y_format: Callable[[float], str] = tick_number,
               y_range: tuple[float, float] | None = None, width: int = 520, height: int = 180,
               limits: list[tuple[float, str]] | None = None) -> str:
    """Render `series` as an inline <svg>; `label` is the accessible name (and the y-axis meaning). Each of `limits`
    (value, text) is drawn as a dashed horizontal line the y-axis always includes. A value that is not finite (an
    infinite error a failed check recorded, a NaN) has no place on an axis: it is left out of the plot, and its run's
    page shows it."""
    points = [(parse_time(t).timestamp(), v, s) for s in series for t, v in s.points if _on_axis(v)]
    if not points:
        return f'<p class="muted">No data for {escape(label)}.</p>'
    limits = limits or []
    values = [v for _, v, _ in points] + [value for value, _ in limits]
    log = y_range is None and min(values) > 0 and max(values) / min(values) > 1e3
    tr = math.log10 if log else (lambda v: v)
    y_low, y_high = y_range if y_range else (min(values), max(values))
    if not y_range and not log:
        pad = (y_high - y_low) * 0.1 or abs(y_high) * 0.1 or 1.0
        y_low, y_high = (0.0 if y_low >= 0 and y_low - pad < 0 else y_low - pad), y_high + pad
    lo, hi = (math.floor(tr(y_low)), math.ceil(tr(y_high))) if log else (y_low, y_high)
    if hi == lo:
        hi = lo + 1
    x_low, x_high = min(p[0] for p in points), max(p[0] for p in points)
    left, right, top, bottom = 58, 22, 10, 26
    inset = 10  # keeps the first and last dots off the axes
    plot_w, plot_h = width - left - right, height - top - bottom

    def x_at(x: float) -> float:
        if x_high == x_low:
            return left + plot_w / 2
        return left + inset + (x - x_low) / (x_high - x_low) * (plot_w - 2 * inset)

    def y_at(y: float) -> float:
        return top + plot_h - (tr(y) - lo) / (hi - lo) * plot_h

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(label)}">']
    y_ticks = [10.0 ** e for e in range(int(lo), int(hi) + 1)] if log else _nice_ticks(lo, hi)
    for tick in y_ticks:
        y = y_at(tick)
        out.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f"{escape(y_format(tick))}</text>")
    span_days = (x_high - x_low) / 86400
    x_fmt = "%H:%M" if span_days < 1.5 else ("%b %d" if span_days < 300 else "%Y-%m")
    x_ticks = [x_low] if x_high == x_low else [x_low + (x_high - x_low) * i / 4 for i in range(5)]
    for index, tick in enumerate(x_ticks):
        text = datetime.fromtimestamp(tick, tz=timezone.utc).strftime(x_fmt)
        # The end labels are anchored inwards so they are not clipped by the chart's edge.
        anchor = "middle" if len(x_ticks) == 1 else ("start" if index == 0 else
                                                      "end" if index == len(x_ticks) - 1 else "middle")
        out.append(f'<text class="tick" x="{x_at(tick):.1f}" y="{height - 8}" text-anchor="{anchor}">'
                   f"{text}</text>")
    for value, text in limits:
        y = y_at(value)
        out.append(f'<line class="limit" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke-dasharray="6 4"><title>{escape(text)}</title></line>'
                   f'<text class="limit" x="{width - right}" y="{y - 3:.1f}" text-anchor="end">{escape(text)}</text>')
    base = top + plot_h
    out.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{base}"/>'
               f'<line class="axis" x1="{left}" x2="{width - right}" y1="{base}" y2="{base}"/>')
    for line in series:
        pts = sorted((parse_time(t).timestamp(), v) for t, v in line.points if _on_axis(v))
        if not pts:
            continue
        coords = " ".join(f"{x_at(x):.1f},{y_at(v):.1f}" for x, v in pts)
        out.append(f'<polyline fill="none" stroke="{line.color}" stroke-width="2" points="{coords}"/>')
        for x, v in pts:
            when = datetime.fromtimestamp(x, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
            out.append(f'<circle cx="{x_at(x):.1f}" cy="{y_at(v):.1f}" r="3.5" fill="{line.color}">'
                       f"<title>{escape(line.name)} — {when} UTC: {escape(y_format(v))}</title></circle>")
    out.append("</svg>")
    return "".join(out)


def legend(series: list[Series]) -> str:
    """An HTML legend (swatch + name) for charts that share `series`' colours."""
    items = "".join(f'<span class="key"><i style="background:{s.color}"></i>{escape(s.name)}</span>'
                    for s in series)
    return f'<div class="legend">{items}</div>'
