"""A page per run (`runs/<run id>.html`) and a page per check (`checks/<name>-<hash>.html`) beside index.html.

A run page holds the run's header (lineage, options, whether it counts as evidence and why not, the suite that judged
it: version, commit, data hash), every check with its figures and the limits it was judged by **as its record carries
them** (reports/limits.py: never today's data files; "limit not recorded" for a run written before records carried
them), the failure or skip message, links to the run's logs (copied next to the page from its run directory) and
what changed since the previous run on the same platform. A check page holds the check's history across lineages and
each figure some run recorded a limit for, plotted against the limits as recorded.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from reports.history import History
from reports.htmlbits import (
    check_cell,
    clip,
    e,
    link,
    pill,
    run_link,
    section,
    short_check,
    table,
    target_badge,
)
from reports.htmlbits import check_page as check_file
from reports.limits import NOT_RECORDED, Limit, limit_of, recorded
from reports.numbers import short_number
from reports.records import CheckRow, RunInfo, diff_runs
from reports.render import page
from reports.render_decision import coverage_html
from reports.sitedata import SiteData
from reports.stack import flatten
from reports.svg import PALETTE, Series, line_chart
from reports.verdict import coverage

UP = "../"  # pages live one directory below index.html
MAX_HISTORY = 200  # rows of a check's history table (its charts keep every point)


def _nav(anchor_back: str) -> str:
    return f'<a href="{UP}index.html">Dashboard</a><a href="{UP}index.html#{anchor_back}">Back</a>'


def _figures(check: CheckRow) -> str:
    """The check's figures, each beside the limit its run recorded for it (and any recorded limit of a figure the
    check did not measure)."""
    rows = []
    for name in sorted(set(check.figures) | set(check.limits or {})):
        value = check.figures.get(name)
        limit = limit_of(check, name)
        shown = "–" if name not in check.figures else "null" if value is None else short_number(value)
        if limit is None:
            why = NOT_RECORDED if not recorded(check) else "no limit (an input or a count)"
            rows.append(f'<tr data-figure="{e(name)}"><td><code>{e(name)}</code></td><td class="num">{e(shown)}</td>'
                        f'<td class="muted" data-limit-recorded="{int(recorded(check))}">{e(why)}</td></tr>')
            continue
        held = value is not None and limit.holds(value)
        rows.append(f'<tr data-figure="{e(name)}" data-limit="{limit.value:g}" data-limit-kind="{e(limit.kind)}">'
                    f'<td><code>{e(name)}</code></td><td class="num {"held" if held else "broken"}">{e(shown)}</td>'
                    f"<td>{e(limit.describe())}</td></tr>")
    return f'<table class="compact figs">{"".join(rows)}</table>' if rows else '<span class="muted">–</span>'


def _suite(run: RunInfo) -> str:
    suite = run.suite
    if not suite:
        return ('<span class="muted" data-suite="not recorded">not recorded (written before results.json carried '
                "the suite; its limits are shown only where its checks recorded them)</span>")
    parts = [("version", suite.get("version")), ("commit", suite.get("commit")), ("data hash", suite.get("data_hash"))]
    return "<span data-suite=\"recorded\">" + " · ".join(
        f"{name} <code>{e(value if value is not None else 'none')}</code>" for name, value in parts) + "</span>"


def run_page(run: RunInfo, checks: list[CheckRow], data: SiteData, logs: list[tuple[str, str]],
             previous: RunInfo | None) -> str:
    """The page of one run; `logs` are (file name under the page's folder, link text)."""
    status = ("counts as platform evidence" if run.not_evidence is None
              else f"not counted: {run.not_evidence}")
    head = [("Lineage", e(run.series)), ("Platform", f"{target_badge(run.target)}{e(run.platform)}"),
            ("Combination", e(run.combo or "installed stack")), ("Engine", e(run.engine)),
            ("Model", e(f"{run.model} ({run.model_hash or 'no hash'})")), ("Dtype", e(run.dtype or "?")),
            ("Profile", e(run.profile or "–")), ("Tiers", e(", ".join(t.upper() for t in run.tiers))),
            ("Started", e(run.started_at)), ("Complete", e(f"{run.complete} (exit {run.exit_status})")),
            ("Evidence", f'<span data-evidence="{int(run.not_evidence is None)}">{e(status)}</span>'),
            ("Planted fault", e(run.planted_fault or "–")), ("Narrowed by", e(run.narrowed_by or "–")),
            ("Judged by", _suite(run)), ("Coverage", coverage_html(coverage(checks, data.universe).get("all")))]
    header = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in head)
    log_links = " · ".join(f'<a href="{e(run.run_id)}/{e(name)}">{e(text)}</a>' for name, text in logs)
    header += f"<dt>Logs</dt><dd>{log_links or '<span class=muted>none in the run directory</span>'}</dd>"
    rows = [f'<tr data-outcome="{e(c.outcome)}" data-check="{e(c.id)}"><td>{check_cell(c.id, UP)}</td>'
            f"<td>{e(c.tier.upper())}</td><td>{e(c.area)}</td><td>{pill(c.outcome)}</td>"
            f'<td class="num">{c.duration:.1f} s</td><td>{_figures(c)}</td>'
            f"<td>{clip(c.message) if c.message else ''}{'<br>' + link(c.bug_link) if c.bug_link else ''}</td></tr>"
            for c in checks]
    listing = table(["Check", "Tier", "Area", "Outcome", "Time", "Figures (limit as judged)", "Message"], rows, "list",
                    'id="run-checks"')
    fingerprint = "".join(f"<tr><td><code>{e(k)}</code></td><td><code>{e(v)}</code></td></tr>"
                          for k, v in flatten(run.fingerprint).items())
    body = (section("run", f"Run {run.run_id}", f'<dl class="head">{header}</dl>')
            + section("checks", "Checks", listing)
            + _changes(run, previous)
            + section("fingerprint", "Fingerprint", f"<details><summary>Every key ({len(run.fingerprint)} "
                      f"sections)</summary>{table(['Key', 'Value'], [f'<tr>{fingerprint}</tr>'], 'compact')}"
                      "</details>"))
    return page(f"Run {run.run_id}", f"{run.series} · {run.started_at}", _nav("runs"), body, UP)


def _changes(run: RunInfo, previous: RunInfo | None) -> str:
    if previous is None:
        return section("changes", "What changed", '<p class="muted">No earlier run on this platform.</p>')
    rows = [f'<tr><td><code>{e(c.path)}</code></td><td class="before">{e(c.before or "(absent)")}</td>'
            f'<td class="after">{e(c.after or "(absent)")}</td></tr>' for c in diff_runs(previous, run)]
    body = (table(["Option or fingerprint key", "Before", "This run"], rows, "diff") if rows
            else '<p class="muted">The runs\' options and fingerprints are identical.</p>')
    return section("changes", "What changed", body, f"Since {run_link(previous.run_id, UP)}, the previous run on "
                   "the same platform, engine and combination (another model, dtype or profile shows here).")


def check_page(check_id: str, history: list[tuple[RunInfo, CheckRow]], data: SiteData) -> str:
    """The page of one check: its outcomes across lineages (newest first) and its limited figures over time."""
    def figures(check: CheckRow) -> str:
        return ", ".join(f"{k}={short_number(v)}" for k, v in sorted(check.figures.items()) if v is not None)

    rows = [f'<tr data-outcome="{e(c.outcome)}"><td>{run_link(r.run_id, UP)}</td><td>{e(r.started_at)}</td>'
            f"<td><small>{e(r.series)}</small>{'' if r.not_evidence is None else ' <small>(not counted)</small>'}"
            f"</td><td>{pill(c.outcome)}</td><td>{e(figures(c))}</td>"
            f"<td>{clip(c.message, 200) if c.message else ''}</td></tr>"
            for r, c in sorted(history, key=lambda rc: rc[0].started_at, reverse=True)[:MAX_HISTORY]]
    listing = table(["Run", "Started", "Lineage", "Outcome", "Figures", "Message"], rows, "list", 'id="check-history"')
    charts = []
    by_figure: dict[str, dict[str, list[tuple[str, float]]]] = defaultdict(lambda: defaultdict(list))
    limits: dict[str, list[Limit]] = defaultdict(list)
    for run, check in sorted(history, key=lambda rc: rc[0].started_at):
        if run.not_evidence is not None:
            continue
        for name, value in check.figures.items():
            limit = limit_of(check, name)
            if value is not None:
                by_figure[name][run.series].append((run.started_at, value))
            if limit is not None and limit not in limits[name]:
                limits[name].append(limit)
    for name in sorted(n for n in by_figure if limits[n]):
        lineages = by_figure[name]
        series = [Series(k, data.colors.get(k, PALETTE[i % len(PALETTE)]), pts)
                  for i, (k, pts) in enumerate(sorted(lineages.items()))]
        chart = line_chart(series, label=f"{name} of {check_id}",
                           limits=[(limit.value, f"limit {limit.describe()}") for limit in limits[name]])
        keys = "".join(f"<li>{e(s.name)}</li>" for s in series)
        newest = limits[name][-1]
        charts.append(f'<div class="card" data-figure="{e(name)}" data-limit="{newest.value:g}" data-limits="'
                      f'{" ".join(f"{limit.value:g}" for limit in limits[name])}"><h3><code>{e(name)}'
                      f"</code> <small>{e(newest.describe())}</small></h3>{chart}<ul>{keys}</ul></div>")
    trend = (f'<div class="charts">{"".join(charts)}</div>' if charts
             else '<p class="muted">No run of this check recorded a limit for a figure (limits are shown as each '
                  "run recorded them, never read from today's data).</p>")
    body = (section("history", short_check(check_id), f"<p><code>{e(check_id)}</code></p>{listing}")
            + section("figures", "Figures against their limits", trend,
                      "Counted runs only, one line per lineage; each dashed line is a limit as a run recorded it."))
    return page(short_check(check_id), check_id, _nav("matrix"), body, UP)


def check_histories(runs: list[RunInfo], checks: dict[str, list[CheckRow]]) -> Iterator[tuple[str, list]]:
    """(check id, [(run, check) …]) for every check of every run."""
    by_check: dict[str, list[tuple[RunInfo, CheckRow]]] = defaultdict(list)
    for run in runs:
        for check in checks.get(run.run_id, []):
            by_check[check.id].append((run, check))
    yield from sorted(by_check.items())


LOG_CAP = 8 * 1024 * 1024  # bytes of one log copied beside its run page (the end of a longer one)


def _copy_logs(run_dir: Path | None, dest: Path) -> list[tuple[str, str]]:
    """Copy the run directory's *.log files (its engines', the server's, bench/) to `dest`; (file name, link text)."""
    if run_dir is None or not run_dir.is_dir():
        return []
    out = []
    for log in sorted(run_dir.rglob("*.log")):
        name = log.relative_to(run_dir).as_posix().replace("/", "--")
        size = log.stat().st_size
        with open(log, "rb") as handle:
            handle.seek(max(0, size - LOG_CAP))
            content = handle.read()
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / name
        if not target.exists() or target.read_bytes() != content:
            target.write_bytes(content)
        out.append((name, name if size <= LOG_CAP else f"{name} (its last {LOG_CAP >> 20} MiB)"))
    return out


def _write(path: Path, text: str) -> None:
    """Write `path` through a temporary file, leaving an unchanged page untouched."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_pages(history: History, data: SiteData, runs_dirs: list[Path], out_dir: Path) -> int:
    """Write every run's and every check's page under `out_dir`; the number of pages."""
    every = history.runs()
    checks = history.checks(r.run_id for r in every)
    previous: dict[str, RunInfo] = {}
    for run in every:
        source = run.source or run.run_id
        run_dir = next((d / source for d in runs_dirs if (d / source / "results.json").exists()), None)
        logs = _copy_logs(run_dir, out_dir / "runs" / run.run_id)
        _write(out_dir / "runs" / f"{run.run_id}.html",
               run_page(run, checks.get(run.run_id, []), data, logs, previous.get(run.lineage)))
        previous[run.lineage] = run
    count = len(every)
    for check_id, rows in check_histories(every, checks):
        _write(out_dir / "checks" / check_file(check_id), check_page(check_id, rows, data))
        count += 1
    return count
