"""The dashboard's detail sections: ROCm-vs-CUDA disagreements, the per-combination comparison, failures
with their diagnosis, "what changed" between the last green and first red run, trends, runs and the
diagnosis catalogue. Each function takes the `SiteData` and returns one <section>.
"""

from __future__ import annotations

from collections import Counter

from reports import analysis
from reports.analysis import ALL, PASSING
from reports.history import CheckRow
from reports.htmlbits import (
    CLASS_LABEL,
    check_cell,
    class_badge,
    clip,
    e,
    first_line,
    link,
    pill,
    platform_short,
    run_link,
    section,
    table,
    target_badge,
)
from reports.numbers import percent
from reports.render_decision import coverage_html
from reports.signatures import default_signatures
from reports.sitedata import SiteData
from reports.stack import identify
from reports.svg import Series, legend, line_chart
from reports.verdict import coverage

MAX_RUNS_LISTED = 60
# "What changed" lists the machine first, then the Python stack, then how the run was set up.
CHANGE_SECTIONS = {"run": -1, "platform": 0, "packages": 1, "runtime": 2}


def _diagnosis_html(data: SiteData, check: CheckRow) -> str:
    found = data.diagnosis(check)
    if not found:
        return '<span class="muted">no known signature</span>'
    sig = found.signature
    return (f'<div class="diag"><b>{e(sig.cause)}</b><br><span class="remedy">Remedy: {e(sig.remedy)}</span>'
            f'{"<br>" + link(sig.link) if sig.link else ""}</div>')


def rocm_cuda_evidence(data: SiteData) -> tuple[int, int]:
    """(ROCm lineages with a counted run, checks compared between ROCm and CUDA): either 0 means the ROCm-vs-CUDA
    count stands on no evidence and must not read as agreement."""
    rocm = [c.key for c in data.columns if c.target == "rocm"]
    return len(rocm), sum(analysis.agreement(data.matrix, key)[1] for key in rocm)


def disagreements(data: SiteData) -> str:
    lineages, compared = rocm_cuda_evidence(data)
    if not lineages or not compared:
        why = ("no counted ROCm run: no ROCm lineage to hold against CUDA" if not lineages else
               f"{lineages} ROCm lineage(s) with counted runs, but no check judged on both ROCm and CUDA")
        body = (f'<p class="no-evidence" data-rocm-evidence="0"><b id="disagreement-count">'
                f'{"no ROCm evidence" if not lineages else "no evidence"}</b>: {e(why)}. No check was compared, '
                "so nothing here is agreement.</p>")
        return section("rocm-cuda", "ROCm vs CUDA", _compared(data) + body)
    short = {c.key: platform_short(c.target, c.label) for c in data.columns}
    rows = []
    for d in data.disagreements:
        rocm_checks = [data.matrix.cells[(d.check_id, k)] for k in d.rocm]
        worst = next((c for c in rocm_checks if c.outcome not in PASSING), None)
        cuda = "<br>".join(f"{pill(o)} {short[k]}" for k, o in d.cuda.items())
        rocm = "<br>".join(f"{pill(o)} {short[k]}" for k, o in d.rocm.items()) or \
            '<span class="muted">not in any ROCm run</span>'
        detail = f"{clip(worst.message)}{_diagnosis_html(data, worst)}" if worst and worst.message else ""
        kind = "fails on ROCm" if d.kind == "failed" else "not run on ROCm"
        rows.append(f'<tr data-kind="{e(d.kind)}"><td>{check_cell(d.check_id)}</td>'
                    f"<td>{e(d.tier.upper())}</td><td>{e(d.area)}</td><td>{e(kind)}</td><td>{cuda}</td>"
                    f"<td>{rocm}</td><td>{detail}</td></tr>")
    failed = sum(1 for d in data.disagreements if d.kind == "failed")
    not_run = len(data.disagreements) - failed
    intro = (f'<b id="disagreement-count">{failed}</b> checks pass on every CUDA platform that ran them and '
             f"ran but did not pass on ROCm; {not_run} more pass on CUDA and were not run (skipped or "
             f"absent) on ROCm; {compared} checks compared.")
    body = (table(["Check", "Tier", "Area", "Kind", "CUDA", "ROCm", "ROCm message and diagnosis"], rows,
                  "list", 'id="rocm-cuda-table"')
            if rows else f'<p class="ok">ROCm agrees with CUDA on all {compared} checks compared.</p>')
    return section("rocm-cuda", "ROCm vs CUDA", _compared(data) + body, intro)


def _compared(data: SiteData) -> str:
    """Which CUDA columns each ROCm column was held against: like for like (engine, model, dtype), or what differs."""
    runs = {c.key: c.run for c in data.columns}
    items = []
    for column in data.columns:
        if column.target != "rocm":
            continue
        refs, like = analysis.counterparts(data.matrix, column.key)
        if not refs:
            items.append(f"<li>{e(column.key)}: no CUDA lineage to compare with</li>")
            continue
        differs = sorted({d for k in refs for d in analysis.differences(runs[column.key], runs[k])})
        what = ("same engine, model and dtype" if like else
                "no CUDA lineage of the same engine, model and dtype; differs: " + "; ".join(differs))
        items.append(f'<li data-compared="{e(column.key)}">{e(column.key)} against {e(", ".join(refs))} '
                     f"({e(what)})</li>")
    return f'<ul class="compared">{"".join(items)}</ul>' if items else ""


def combinations(data: SiteData) -> str:
    rows = []
    tiers = data.tiers
    for column in data.columns:
        run = column.run
        if run is None:
            continue
        ident = identify(run.target, run.fingerprint)
        cov = coverage(data.latest_checks.get(column.key, []), data.universe)
        cells = []
        for tier in [*tiers, ALL]:
            cells.append(f'<td class="num">{coverage_html(cov.get(tier))}</td>')
        agree, compared = analysis.agreement(data.matrix, column.key)
        agree_html = f"{agree}/{compared}" if compared else '<span class="muted">no evidence</span>'
        rows.append(f"<tr><td>{e(run.combo or 'installed')}</td><td>{target_badge(run.target)} "
                    f"{e(ident.device)}</td><td>{e(ident.runtime_version or '–')}</td>"
                    f"<td>{e(ident.torch or '–')}</td><td>{e(ident.vllm or '–')}</td><td>{e(run.engine)}</td>"
                    f'{"".join(cells)}<td class="num">{agree_html}</td>'
                    f"<td><small>{e(run.started_at)}</small></td></tr>")
    head = ["Combination", "Device", "ROCm / CUDA", "PyTorch", "vLLM", "Engine",
            *[f"{e(t.upper())} pass" for t in tiers], "All pass", "Agrees with CUDA", "Last run"]
    intro = ("Each ROCm × PyTorch × vLLM (or CUDA / CPU) combination's latest run. “Agrees with CUDA” counts "
             "checks whose pass/not-pass verdict matches every CUDA platform that ran them.")
    return section("combos", "Per-combination comparison", table(head, rows, "list"), intro)


def failures(data: SiteData) -> str:
    rows, classes = [], Counter()
    for column in data.columns:
        for check in data.latest_checks.get(column.key, []):
            cls = data.failure_class(check)
            if cls is None:
                continue
            classes[(column.key, cls)] += 1
            if check.outcome == "skipped" and not data.diagnosis(check):
                continue  # plain not-applicable skips are counted above, not listed
            rows.append(f'<tr data-text="{e((check.id + " " + check.message).lower())}">'
                        f"<td>{platform_short(column.target, column.label)}</td>"
                        f"<td>{check_cell(check.id)}</td><td>{pill(check.outcome)}</td><td>{class_badge(cls)}"
                        f'{"<br>" + link(check.bug_link) if check.bug_link else ""}</td>'
                        f"<td>{clip(check.message)}</td><td>{_diagnosis_html(data, check)}</td></tr>")
    order = list(CLASS_LABEL)
    class_rows = [f"<tr><th>{target_badge(c.target)} {e(c.label)}</th>"
                  + "".join(f'<td class="num">{classes.get((c.key, k), 0) or ""}</td>' for k in order)
                  + "</tr>" for c in data.columns]
    summary = table(["Platform", *[e(CLASS_LABEL[k]) for k in order]], class_rows, "compact counts")
    listing = (table(["Platform", "Check", "Outcome", "Class", "Message", "Diagnosis"], rows, "list",
                     'id="failures-table"') if rows else '<p class="ok">No failures in the latest runs.</p>')
    intro = ("Failure classes of the latest runs: capability gap (not applicable on this hardware), known "
             "bug (xfail with a link), new failure, timeout, crash, could not run. Messages are matched "
             'against the <a href="#diagnosis">known error signatures</a>.')
    return section("failures", "Failures and diagnosis", summary + listing, intro)


def what_changed(data: SiteData) -> str:
    if not data.transitions:
        return section("changes", "What changed", '<p class="ok">No lineage went from green to red.</p>')
    cards = []
    for view in data.transitions:
        t = view.transition
        state = ('<span class="badge c-new_failure">still red</span>' if t.still_red
                 else '<span class="badge c-ok">green again</span>')
        change_rows = [f'<tr><td><code>{e(c.path)}</code></td>'
                       f'<td class="before">{e(c.before or "(absent)")}</td>'
                       f'<td class="after">{e(c.after or "(absent)")}</td></tr>'
                       for c in sorted(t.changes, key=lambda c: CHANGE_SECTIONS.get(c.path.split(".")[0], 9))]
        changes = (table(["Option or fingerprint key", "Last green", "First red"], change_rows, "diff")
                   if change_rows else '<p class="muted">The runs\' options and fingerprints are identical: '
                                        "suspect the checks or flakiness.</p>")
        flipped = "".join(f"<li>{check_cell(red.id)}: {pill(old.outcome) if old else 'new'} → "
                          f'{pill(red.outcome)} <span class="muted">{e(first_line(red.message))}</span></li>'
                          for old, red in view.flipped)
        cards.append(
            f'<div class="card change" data-lineage="{e(t.lineage)}"><h3>{e(t.lineage)} {state}</h3>'
            f"<p>Last green {run_link(t.last_green.run_id)} ({e(t.last_green.started_at)}) → first red "
            f"{run_link(t.first_red.run_id)} ({e(t.first_red.started_at)})</p>{changes}"
            f'<h4>Checks that stopped passing</h4><ul class="flips">{flipped or "<li>none recorded</li>"}'
            "</ul></div>")
    intro = ("The options (run.engine, run.dtype, run.profile, run.model, run.planted_fault, run.narrowed_by …) and "
             "fingerprints of the last green and the first red run of each lineage, flattened to key paths and "
             "diffed.")
    return section("changes", "What changed", "".join(cards), intro)


def trends(data: SiteData) -> str:
    series = [Series(c.key, data.colors[c.key], data.pass_trend.get(c.key, [])) for c in data.columns]
    overall = line_chart(series, label="pass rate", y_format=percent, y_range=(0, 1))
    parts = [legend(series), '<div class="charts">',
             f'<div class="card"><h3>Pass rate, all tiers</h3>{overall}</div>']
    for tier in data.tiers:
        tier_series = [Series(c.key, data.colors[c.key], data.tier_trend.get((tier, c.key), []))
                       for c in data.columns]
        chart = line_chart(tier_series, label=f"{tier} pass rate", y_format=percent, y_range=(0, 1))
        parts.append(f'<div class="card"><h3>Pass rate, {e(tier.upper())}</h3>{chart}</div>')
    parts.append("</div><h3 class=\"sub\">Measured figures per check</h3><div class=\"charts\">")
    for trend in data.figure_trends:
        fig_series = [Series(k, data.colors.get(k, "#444"), pts) for k, pts in trend.lineages.items()]
        newest = trend.limits[-1]
        chart = line_chart(fig_series, label=f"{trend.name} of {trend.check_id}",
                           limits=[(limit.value, f"limit {limit.describe()}") for limit in trend.limits])
        parts.append(f'<div class="card" data-figure="{e(trend.name)}" data-limit="{newest.value:g}" '
                     f'data-limits="{" ".join(f"{limit.value:g}" for limit in trend.limits)}">'
                     f"<h3><code>{e(trend.name)}</code> <small>{e(newest.describe())}</small></h3>"
                     f'<p class="figcheck">{check_cell(trend.check_id)}</p>{chart}</div>')
    parts.append("</div>")
    intro = ("Every counted run of each lineage over time; hover a dot for its value. Figures are plotted where a "
             "run recorded the limit it was judged by (the dashed line, as recorded: a limit that moved shows as "
             "two lines; runs that recorded none add their points without a line); inputs and counts are on the "
             "run and check pages. Figures spanning decades use a log axis.")
    return section("trends", "Trends", "".join(parts), intro)


def runs(data: SiteData) -> str:
    rows = []
    for run in reversed(data.runs[-MAX_RUNS_LISTED:]):
        s = run.summary
        verdict = ('<span class="pill o-passed">green</span>' if run.green
                   else '<span class="pill o-failed">red</span>')
        rows.append(f"<tr><td>{run_link(run.run_id)}</td><td>{e(run.started_at)}</td>"
                    f"<td>{target_badge(run.target)} {e(run.platform)}</td>"
                    f"<td>{e(run.combo or 'installed')}</td>"
                    f"<td>{e(', '.join(t.upper() for t in run.tiers))}</td><td>{verdict}"
                    f'{"" if run.complete else " incomplete"}</td>'
                    + "".join(f'<td class="num">{s[k]}</td>' for k in ("passed", "failed", "error", "skipped",
                                                                     "xfailed", "xpassed")) + "</tr>")
    head = ["Run", "Started", "Platform", "Combination", "Tiers", "Verdict", "pass", "fail", "error", "skip",
            "xfail", "xpass"]
    more = len(data.runs) - MAX_RUNS_LISTED
    intro = f"Newest first{f'; {more} older runs are in the history store' if more > 0 else ''}."
    return section("runs", "Runs", table(head, rows, "list compact"), intro)


def catalogue() -> str:
    rows = [f"<tr><td><code>{e(s.id)}</code></td><td><code>{e(s.pattern.pattern)}</code></td>"
            f"<td>{e(s.cause)}</td><td>{e(s.remedy)}</td><td>{class_badge(s.failure_class)}</td>"
            f"<td>{link(s.link)}</td></tr>" for s in default_signatures()]
    listing = table(["Id", "Pattern", "Cause", "Remedy", "Class", "Link"], rows, "list")
    body = f"<details><summary>Show the known error signatures ({len(rows)})</summary>{listing}</details>"
    return section("diagnosis", "Diagnosis catalogue", body,
                   "Kept as data in env_checks/signatures.toml: add a signature there when a new failure is "
                   "understood.")
