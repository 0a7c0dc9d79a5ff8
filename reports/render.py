"""The dashboard page: its shell (inline CSS and JS from `templates/`), opened by the release decision
(`render_decision`, the first screen), then the overview sections — headline tiles (no count of zero over nothing
compared reads as agreement: "no ROCm evidence"), the runs that do not count, pass rates per platform × tier, parity
scores per tier × area and the parity matrix.

The detail sections (disagreements, combinations, failures, what changed, trends, runs) are in
`render_detail`. The page loads nothing from anywhere: a Content-Security-Policy forbids every fetch.
"""

from __future__ import annotations

from collections import Counter
from importlib import resources

from reports import analysis, render_detail, verdict
from reports.analysis import ALL, Column
from reports.htmlbits import check_cell, e, pct, pill, run_link, score_style, section, table, target_badge
from reports.numbers import short_number
from reports.render_decision import decision
from reports.sitedata import SiteData
from reports.telemetry_view import machine_section

TEMPLATES = resources.files("reports") / "templates"  # package data
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")
NAV = (("decision", "Decision"), ("overview", "Overview"), ("platforms", "Platforms"), ("parity", "Parity"),
       ("matrix", "Matrix"), ("rocm-cuda", "ROCm vs CUDA"), ("combos", "Combinations"), ("failures", "Failures"),
       ("changes", "What changed"), ("trends", "Trends"), ("runs", "Runs"), ("machine", "Machine"),
       ("diagnosis", "Diagnosis"))


def column_head(column: Column) -> str:
    run = column.run
    what = f"{run.engine} · {run.model} · {run.dtype or 'dtype ?'}" if run else ""
    return (f'<div class="colhead" title="{e(column.key)}">{target_badge(column.target)}<b>{e(column.label)}</b>'
            f'<small>{e(run.combo if run and run.combo else "installed stack")}</small><small>{e(what)}</small></div>')


def _rocm_tile(data: SiteData) -> tuple[str, str, str, str]:
    lineages, compared = render_detail.rocm_cuda_evidence(data)
    if not lineages:
        return ("ROCm vs CUDA", "no ROCm evidence", "no counted ROCm run: nothing compared", "warn")
    if not compared:
        return ("ROCm vs CUDA", "no evidence", f"{lineages} ROCm lineage(s) but no check also judged on CUDA", "warn")
    failed = sum(1 for d in data.disagreements if d.kind == "failed")
    not_run = sum(1 for d in data.disagreements if d.kind == "not_run")
    return ("ROCm vs CUDA", str(failed), f"checks pass on CUDA, fail on ROCm · {not_run} not run on ROCm · "
            f"{compared} compared", "bad" if failed else "good")


def _tiles(data: SiteData) -> str:
    overall = next((s for s in data.scores if s.tier == ALL and s.area == ALL), None)
    new = sum(1 for checks in data.latest_checks.values() for c in checks
              if data.failure_class(c) in ("new_failure", "crash", "timeout", "could_not_run", "shared_gpu",
                                           "slower_host", "unlike_pin"))
    red = sum(1 for t in data.transitions if t.transition.still_red)
    twice = sum(1 for n in Counter(r.series for r in data.runs).values() if n > 1)
    tiles = [
        ("Parity score", pct(overall.score if overall else None),
         f"{overall.passing} of {overall.ran} checks pass on every platform" if overall and overall.ran
         else "no counted run: no evidence", "good" if overall and overall.score == 1 else "warn"),
        _rocm_tile(data),
        ("Open failures", str(new) if data.runs else "no evidence",
         "new, crashed, timed-out, unrunnable or GPU-shared checks in latest runs" if data.runs
         else "no counted run", ("bad" if new else "good") if data.runs else "warn"),
        ("Regressions", str(red), f"lineages red since a green run ({twice} lineages have two counted runs)",
         "bad" if red else "good" if twice else "neutral"),
        ("History", str(len(data.runs)), f"runs of {len(data.columns)} platform lineages", "neutral"),
    ]
    cards = "".join(f'<div class="tile {tone}" data-tile="{e(name)}"><div class="tname">{e(name)}</div>'
                    f'<div class="tval">{e(value)}</div><div class="tsub">{e(sub)}</div></div>'
                    for name, value, sub, tone in tiles)
    return f'<section id="overview"><div class="tiles">{cards}</div></section>'


def _platforms(data: SiteData) -> str:
    tiers = data.tiers
    rows = []
    for column in data.columns:
        counts = analysis.tier_counts(data.latest_checks.get(column.key, []))
        coverage = verdict.coverage(data.latest_checks.get(column.key, []), data.universe)
        cells = []
        for tier in [*tiers, ALL]:
            tally = counts.get(tier, {})
            rate = analysis.pass_rate(tally)
            ran = sum(n for o, n in tally.items() if o not in analysis.NOT_RUN)
            passing = sum(tally.get(o, 0) for o in analysis.PASSING)
            bar = (f'<span class="bar"><i style="width:{rate * 100:.0f}%"></i></span>'
                   if rate is not None else "")
            cov = coverage.get(tier)
            cov_html = (f'<small class="cov" data-coverage="{cov.passed}/{cov.failed}/{cov.skipped}/{cov.not_run}">'
                        f"{e(cov.text())}</small>") if cov else ""
            cells.append(f'<td class="num" {score_style(rate)}>{pct(rate)} <small>{passing}/{ran}</small>'
                         f"{bar}{cov_html}</td>" if tally else f'<td class="num muted">–{cov_html}</td>')
        rows.append(f"<tr><th>{column_head(column)}</th>{''.join(cells)}"
                    f"<td>{_source_runs(column, data.tier_runs.get(column.key, {}))}</td></tr>")
    head = ["Platform (latest run of each tier)", *[e(t.upper()) for t in tiers], "All", "Runs"]
    return section("platforms", "Pass rate per platform and tier", table(head, rows, "rates"),
                   "Each tier's figures come from the latest run of that tier on the platform lineage (a P1 "
                   "run does not hide the P0 results before it). Pass rate = passed or xpassed ÷ checks that "
                   "ran; beside it, what it stands on: passed, failed (or errored), skipped (not applicable, "
                   "with their reasons in the decision view) and not run (checks other lineages ran).")


def _source_runs(column: Column, tier_runs: dict) -> str:
    """The run (or runs, one per tier) a platform row's figures come from, newest first."""
    tiers_of: dict[str, list[str]] = {}
    runs = {column.run.run_id: column.run} if column.run else {}
    for tier, run in sorted(tier_runs.items()):
        tiers_of.setdefault(run.run_id, []).append(tier.upper())
        runs[run.run_id] = run
    parts = []
    for run in sorted(runs.values(), key=lambda r: r.started_at, reverse=True):
        status = "" if run.complete else ' <span class="badge c-crash">incomplete</span>'
        tiers = f' <small class="tiers">{e(" ".join(tiers_of[run.run_id]))}</small>' if len(runs) > 1 else ""
        parts.append(f'{run_link(run.run_id)}{tiers}{status}<br><small>{e(run.started_at)}</small>')
    return "<br>".join(parts)


def _parity(data: SiteData) -> str:
    areas = data.areas
    by_key = {(s.tier, s.area): s for s in data.scores}
    rows = []
    for tier in [*data.tiers, ALL]:
        cells = []
        for area in [*areas, ALL]:
            score = by_key.get((tier, area))
            cells.append(f'<td class="num" {score_style(score.score)} data-score="{score.score:.4f}">'
                         f"{pct(score.score)} <small>{score.passing}/{score.ran}</small></td>"
                         if score else '<td class="num muted">–</td>')
        label = "All tiers" if tier == ALL else tier.upper()
        rows.append(f'<tr data-tier="{e(tier)}"><th>{e(label)}</th>{"".join(cells)}</tr>')
    head = ["Tier", *[e(a) for a in areas], "All areas"]
    intro = ("Share of checks passing on <b>every</b> platform that ran them (the latest run of each "
             "lineage), per tier and area — the interop score of wpt.fyi. A check no platform ran is left "
             "out.")
    return section("parity", "Parity score", table(head, rows, "scores", 'id="parity-scores"'), intro)


def _matrix(data: SiteData) -> str:
    matrix = data.matrix
    disagree = {d.check_id for d in data.disagreements if d.kind == "failed"}
    rows = []
    for tier, area, check_id in matrix.rows:
        outcomes = matrix.outcomes(check_id)
        everywhere = analysis.passes_everywhere(outcomes)
        cells = []
        for column in matrix.columns:
            check = matrix.cells.get((check_id, column.key))
            if check is None:
                cells.append('<td class="cell none" title="not in this run">·</td>')
                continue
            tip = f"{column.label}: {check.outcome}"
            if check.message:
                tip += f"\n{check.message[:300]}"
            found = data.diagnosis(check)
            if found:
                tip += f"\nDiagnosis: {found.signature.cause}"
            figure = next((v for v in check.figures.values() if v is not None), None)
            extra = f' <small class="fig">{e(short_number(figure))}</small>' if figure is not None else ""
            cells.append(f'<td class="cell" data-outcome="{e(check.outcome)}" title="{e(tip)}">'
                         f"{pill(check.outcome, extra)}</td>")
        verdict = {True: "yes", False: "no", None: "n/a"}[everywhere]
        flag = (' <span class="flag" title="passes on CUDA, fails on ROCm">≠</span>'
                if check_id in disagree else "")
        rows.append(f'<tr data-tier="{e(tier)}" data-area="{e(area)}" data-everywhere="{verdict}" '
                    f'data-disagree="{int(check_id in disagree)}" data-text="{e(check_id.lower())} '
                    f'{e(area.lower())}"><th class="rowhead">{check_cell(check_id)}{flag}</th>'
                    f'<td>{e(tier.upper())}</td><td>{e(area)}</td>{"".join(cells)}</tr>')
    head = ["Check", "Tier", "Area", *[column_head(c) for c in matrix.columns]]
    tier_options = "".join(f'<option value="{e(t)}">{e(t.upper())}</option>' for t in data.tiers)
    controls = (
        '<div class="controls" role="search">'
        '<input id="q" type="search" placeholder="Filter checks by name or area…" aria-label="filter checks">'
        f'<select id="tier" aria-label="tier"><option value="">All tiers</option>{tier_options}</select>'
        '<label><input id="only-disagree" type="checkbox"> only ROCm ≠ CUDA</label>'
        '<label><input id="only-broken" type="checkbox"> only not passing everywhere</label>'
        f'<span id="shown" class="muted">{len(matrix.rows)} of {len(matrix.rows)} checks shown</span></div>')
    body = controls + table(head, rows, "matrix", f'id="matrix-table" data-total="{len(matrix.rows)}"')
    intro = ("Latest run of each platform lineage. Hover a cell for the message and diagnosis; the small "
             "number is the check's first measured figure. ≠ marks a ROCm-vs-CUDA disagreement.")
    return section("matrix", "Parity matrix", body, intro)


def render_page(data: SiteData) -> str:
    """The whole self-contained index.html."""
    nav = "".join(f'<a href="#{anchor}">{e(name)}</a>' for anchor, name in NAV)
    notices = "".join(f'<div class="notice">{e(n)}</div>' for n in data.notices)
    below = ""  # what does not count goes under the decision, never before it
    if data.skipped_inputs:
        items = "".join(f"<li><code>{e(path)}</code> — {e(why)}</li>" for path, why in data.skipped_inputs)
        below += (f'<div class="notice" id="skipped-inputs"><b>{len(data.skipped_inputs)} run '
                  f"director{'y was' if len(data.skipped_inputs) == 1 else 'ies were'} skipped</b> "
                  f"(left in place, not ingested):<ul>{items}</ul></div>")
    if data.not_counted:
        items = "".join(f"<li>{run_link(r.run_id)} ({e(r.platform)}, {e(r.engine)}) — {e(r.not_evidence)}</li>"
                        for r in data.not_counted)
        below += (f'<div class="notice" id="not-counted"><b>{len(data.not_counted)} run'
                  f"{'' if len(data.not_counted) == 1 else 's'} not counted as platform evidence</b> "
                  f"(shown here and in the decision view only):<ul>{items}</ul></div>")
    body = "".join([
        decision(data), _tiles(data), below, _platforms(data), _parity(data), _matrix(data),
        render_detail.disagreements(data), render_detail.combinations(data), render_detail.failures(data),
        render_detail.what_changed(data), render_detail.trends(data), render_detail.runs(data),
        machine_section(data), render_detail.catalogue(),
    ])
    title = "Inference stack conformance — parity dashboard"
    sub = (f"Generated {data.generated_at} from {len(data.runs)} runs · ROCm, CUDA and CPU stacks compared check "
           "by check")
    return page(title, sub, nav, notices + body)


def page(title: str, sub: str, nav: str, body: str, base: str = "") -> str:
    """A whole self-contained HTML page (CSS and JS inline, a CSP that forbids every fetch); `base` is the way from
    the page to the site's root, for the links in the footer."""
    css = (TEMPLATES / "site.css").read_text(encoding="utf-8")
    js = (TEMPLATES / "site.js").read_text(encoding="utf-8")
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # An inline empty icon: otherwise browsers request /favicon.ico from wherever the site is served.
        '<link rel="icon" href="data:,">'
        f"<title>{e(title)}</title><style>{css}</style></head>"
        f'<body><header class="top"><div class="wrap"><h1>{e(title)}</h1>'
        f'<p class="sub">{e(sub)}</p><nav>{nav}</nav></div></header>'
        f'<main class="wrap">{body}</main>'
        f'<footer class="wrap muted">Built from reports/runs/*/results.json only. Check ids are pytest '
        f'node ids; hover a shortened name for the full id. <a href="{e(base)}index.html">Dashboard</a></footer>'
        f"<script>{js}</script></body></html>\n"
    )
