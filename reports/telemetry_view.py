"""The dashboard's machine section: per run (each lineage's latest), the machine-health verdict and small inline
SVG plots of the GPU telemetry sampled during it (temperature, power, SM clock, VRAM used; one line per GPU,
seconds since the run began on the x axis). The series come from results.json `telemetry` via the history store.
"""

from __future__ import annotations

from html import escape

from reports.htmlbits import e, section, target_badge
from reports.numbers import tick_number
from reports.sitedata import SiteData
from reports.svg import PALETTE, _nice_ticks

METRICS = (("temp_c", "Temperature", "°C"), ("power_w", "Power", "W"), ("sm_clock_mhz", "SM / GFX clock", "MHz"),
           ("vram_used_mib", "VRAM used", "MiB"))


def series_plot(lines: list[tuple[str, list[tuple[float, float]]]], label: str, unit: str, width: int = 360,
                height: int = 150) -> str:
    """An inline <svg>: one polyline per (name, [(seconds, value)]), linear axes with tick labels."""
    pts = [(x, y) for _, line in lines for x, y in line]
    if not pts:
        return f'<p class="muted">No {escape(label.lower())} samples.</p>'
    x_hi = max(x for x, _ in pts) or 1.0
    y_lo, y_hi = min(y for _, y in pts), max(y for _, y in pts)
    pad = (y_hi - y_lo) * 0.1 or abs(y_hi) * 0.1 or 1.0
    y_lo, y_hi = max(0.0, y_lo - pad) if y_lo >= 0 else y_lo - pad, y_hi + pad
    left, right, top, bottom = 52, 10, 8, 24
    pw, ph = width - left - right, height - top - bottom

    def at(x: float, y: float) -> str:
        return f"{left + x / x_hi * pw:.1f},{top + ph - (y - y_lo) / (y_hi - y_lo) * ph:.1f}"

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(label)} ({escape(unit)}) over the run">']
    for tick in _nice_ticks(y_lo, y_hi):
        y = top + ph - (tick - y_lo) / (y_hi - y_lo) * ph
        out.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">{tick_number(tick)}</text>')
    for tick in _nice_ticks(0.0, x_hi):
        x = left + tick / x_hi * pw
        out.append(f'<text class="tick" x="{x:.1f}" y="{height - 8}" text-anchor="middle">{tick_number(tick)} s</text>')
    base = top + ph
    out.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{base}"/>'
               f'<line class="axis" x1="{left}" x2="{width - right}" y1="{base}" y2="{base}"/>')
    for i, (name, line) in enumerate(lines):
        if not line:
            continue
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(at(x, y) for x, y in sorted(line))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}">'
                   f"<title>{escape(name)}: {min(v for _, v in line):.4g}–{max(v for _, v in line):.4g} "
                   f"{escape(unit)}</title></polyline>")
    out.append("</svg>")
    return "".join(out)


def run_plots(telemetry: dict) -> str:
    """The four plots of one run's telemetry series, or the reason there is none."""
    samples = telemetry.get("samples") or []
    if not samples:
        return f'<p class="muted">No telemetry: {e(telemetry.get("status") or "not recorded")}.</p>'
    devices = telemetry.get("devices") or []
    gpus = sorted({s["gpu"] for s in samples})
    cards = []
    for key, label, unit in METRICS:
        lines = [(f"GPU {g} {devices[g] if g < len(devices) else ''}".strip(),
                  [(s["t_s"], s[key]) for s in samples if s["gpu"] == g and s.get(key) is not None]) for g in gpus]
        cards.append(f'<div class="card" data-metric="{key}"><h4>{e(label)} ({e(unit)})</h4>'
                     f"{series_plot(lines, label, unit)}</div>")
    throttled = sorted({r for s in samples for r in s.get("throttle") or []} - {"gpu_idle"})
    note = f'<p class="muted">Throttle reasons seen: {e(", ".join(throttled))}.</p>' if throttled else ""
    return f'<div class="charts">{"".join(cards)}</div>{note}'


def machine_section(data: SiteData) -> str:
    cards = []
    for column in data.columns:
        run = column.run
        if run is None or run.run_id not in data.health:
            continue
        verdict, telemetry = data.health[run.run_id]
        cards.append(f'<div class="card" data-run="{e(run.run_id)}"><h3>{target_badge(run.target)} {e(column.label)} '
                     f'<small>machine health: {e((verdict or "not recorded").upper())}</small></h3>'
                     f"<p><code>{e(run.run_id)}</code></p>{run_plots(telemetry)}</div>")
    body = "".join(cards) or '<p class="muted">No run recorded machine health yet.</p>'
    return section("machine", "Machine", body, "Each platform's latest run: the machine-health verdict (kernel log, "
                   "RAS, retired pages, GPU count before and after) and the GPU telemetry sampled during it.")
