"""The dashboard's first view: the release decision per ROCm × PyTorch × vLLM combo (or per lineage where no combo
is recorded), with its reasons, the coverage behind it and the CUDA counterpart beside it (reports/verdict.py)."""

from __future__ import annotations

from reports.analysis import ALL
from reports.htmlbits import e, pct, run_link, section, table, target_badge, verdict_badge
from reports.sitedata import SiteData
from reports.stack import identify
from reports.verdict import Coverage, Verdict


def coverage_html(cov: Coverage | None) -> str:
    """A pass rate with the coverage it stands on: passed / failed / skipped / not run."""
    if cov is None or (cov.judged + cov.skipped + cov.not_run) == 0:
        return '<span class="muted">–</span>'
    return (f'<span class="rate">{pct(cov.rate)}</span>'
            f'<small class="cov" data-coverage="{cov.passed}/{cov.failed}/{cov.skipped}/{cov.not_run}">'
            f"{e(cov.text())}</small>")


def _stack(verdict: Verdict) -> str:
    run = verdict.any_run
    ident = identify(run.target, run.fingerprint)
    parts = [f"{run.target.upper()} {ident.runtime_version or '?'}" if run.target != "cpu" else "CPU",
             f"torch {ident.torch or '–'}", f"vLLM {ident.vllm or '–'}"]
    return f"{target_badge(run.target)}{e(ident.device)}<br><small>{e(' · '.join(parts))}</small>"


def _counterpart(verdict: Verdict) -> str:
    if verdict.target == "cuda":
        return '<span class="muted">(the reference)</span>'
    other = verdict.counterpart
    if other is None:
        return '<span class="muted">no CUDA lineage has runs</span>'
    differs = ("<br><small>same engine, model and dtype</small>" if not verdict.counterpart_differs else
               f'<br><small class="differs">differs: {e("; ".join(verdict.counterpart_differs))}</small>')
    return f"{verdict_badge(other.state)}<br><small>{e(other.key)}</small>{differs}"


def reasons_html(verdict: Verdict) -> str:
    items = "".join(f"<li>{e(reason)}</li>" for reason in verdict.reasons)
    return f'<ul class="reasons">{items}</ul>' if items else '<span class="muted">nothing to report</span>'


def decision(data: SiteData) -> str:
    rows = []
    for verdict in data.verdicts:
        run = verdict.any_run
        tiers = "".join(f"<div><b>{e(t.upper() if t != ALL else 'all')}</b> {coverage_html(verdict.coverage.get(t))}"
                        "</div>" for t in ("p0", "p1", "p2", "p3", ALL) if t in verdict.coverage)
        newest = run_link(verdict.run.run_id) if verdict.run else '<span class="muted">none counts</span>'
        label = (f"<b>{e(verdict.combo)}</b><br>" if verdict.combo else "") + f"<small>{e(verdict.key)}</small>"
        rows.append(f'<tr data-lineage="{e(verdict.key)}" data-target="{e(run.target)}" '
                    f'data-verdict="{e(verdict.state)}"><td>{label}</td><td>{_stack(verdict)}</td>'
                    f"<td>{verdict_badge(verdict.state)}</td><td>{reasons_html(verdict)}</td>"
                    f'<td class="tiers">{tiers}</td><td>{_counterpart(verdict)}</td><td>{newest}</td></tr>')
    head = ["Combination / lineage", "Stack", "Verdict", "Reasons", "Coverage (pass rate: passed · failed · skipped "
            "· not run)", "CUDA counterpart", "Newest counted run"]
    body = (table(head, rows, "list", 'id="decision-table"') if rows
            else '<p class="muted">No runs yet.</p>')
    intro = ("Only platform evidence decides: refused, interrupted, narrowed (-k/-m) and planted-fault runs are "
             "named among the reasons and change nothing. <b>Not safe</b>: a check failed or errored in the newest "
             "counted run of its tier (P0, the gate, first). <b>Not enough evidence</b>: nothing failed, but P0 or P1 "
             "has no judged check in a counted run. <b>Production-safe</b>: P0 and P1 judged, nothing failed in any "
             "tier (known bugs with a link do not block). The CUDA counterpart is the CUDA lineage of the same "
             "engine, model and dtype, or the nearest one with what differs.")
    return section("decision", "Release decision per combination", body, intro)
