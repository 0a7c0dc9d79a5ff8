"""The dashboard's first view: the release decision (reports/verdict.py), one row per combination of ci/matrix.toml
(never run: no evidence) and one per installed lineage, ROCm first, each with its reasons, the coverage behind it and
its CUDA counterpart beside it. Rows stay short (the reasons open on a click) so that the certified combinations fit
the first screen of a laptop; what the levels require is spelled out under the table."""

from __future__ import annotations

from reports.analysis import ALL
from reports.htmlbits import e, pct, run_link, section, verdict_badge
from reports.sitedata import SiteData
from reports.stack import identify
from reports.verdict import NO_EVIDENCE, NOT_SAFE, SAFE, TEST_MODEL, TIERS, Coverage, Verdict

HEAD = ("Combination / lineage (newest counted run)", "Stack", "Verdict", "Why (click for every reason)",
        "Coverage: passed/failed/skipped/not run", "CUDA counterpart")
WIDTHS = ("20%", "15%", "10%", "22%", "19%", "14%")  # a fixed layout keeps every row to two or three lines
LEVEL_RULES = (
    (NOT_SAFE, "a check failed or errored in the newest counted run of its tier (fail closed: could not run, timed "
               "out, crashed), P0 the gate first; or a check is <b>flaky</b>: it passed, failed and passed again (or "
               "the reverse) across the lineage's counted runs, each flip named with its runs. A flaky check blocks "
               "whatever the newest run says: one run alone does not decide a check that does not follow the stack."),
    (NO_EVIDENCE, "nothing failed, but what a decision needs is missing: no run counts (a combination never run, "
                  "or only refused, interrupted, narrowed, contradicted or planted-fault runs); P0 or P1 incomplete "
                  "(a check other lineages ran was not run here, each named; the tier never ran; or every check of it "
                  "was skipped); a measurement not like for like; a planted fault the suite did not see; or, on the "
                  "real model, P3 accuracy not judged."),
    (TEST_MODEL, "P0 and P1 complete, nothing failed or flipped, on a test model (the suite's tiny gpt-oss, random "
                 "weights at the real dimensions): the stack computes what the reference does, but a test model "
                 "says nothing of the real model's answers. Never production-safe."),
    (SAFE, "all of the above on the real model, and P3 accuracy judged: in the newest counted P3 run the accuracy "
           "checks (lm-eval against published figures) passed, at least one, none failed. Known bugs (xfail with "
           "a link) do not block and are listed; P2 not run is named, not required."),
)


def coverage_html(cov: Coverage | None) -> str:
    """A pass rate with the coverage it stands on: passed / failed / skipped / not run."""
    if cov is None or (cov.judged + cov.skipped + cov.not_run) == 0:
        return '<span class="muted">–</span>'
    return (f'<span class="rate">{pct(cov.rate)}</span>'
            f'<small class="cov" data-coverage="{cov.passed}/{cov.failed}/{cov.skipped}/{cov.not_run}">'
            f"{e(cov.text())}</small>")


def _tier_coverage(verdict: Verdict) -> str:
    """Each tier's pass rate and counts on one short line, the full sentence in its title."""
    cells = []
    for tier in (*TIERS, ALL):
        cov = verdict.coverage.get(tier)
        name = "all" if tier == ALL else tier.upper()
        if cov is None or (cov.judged + cov.skipped + cov.not_run) == 0:
            cells.append(f'<span class="tcov none" data-tier="{e(tier)}"><b>{e(name)}</b> –</span>')
            continue
        cells.append(f'<span class="tcov" data-tier="{e(tier)}" title="{e(cov.text())}"><b>{e(name)}</b> '
                     f'<span class="rate">{pct(cov.rate)}</span> <small class="cov" '
                     f'data-coverage="{cov.passed}/{cov.failed}/{cov.skipped}/{cov.not_run}">'
                     f"{cov.passed}/{cov.failed}/{cov.skipped}/{cov.not_run}</small></span>")
    return f'<div class="tiers">{"".join(cells)}</div>'


def _stack(verdict: Verdict) -> str:
    run = verdict.any_run
    if run is None:
        combo = verdict.certified
        if combo is None:
            return f"{_badge(verdict.target)}–"
        runtime = f" {combo.target.upper()} {combo.runtime}" if combo.runtime else ""
        engine = f"vLLM {combo.vllm}" if combo.vllm else combo.engine
        return (f"{_badge(verdict.target)}{e(combo.platform)}<small>{e(runtime)}</small><br>"
                f"<small>torch {e(combo.torch)} · {e(engine)}</small>")
    ident = identify(run.target, run.fingerprint)
    runtime = f" {run.target.upper()} {ident.runtime_version or '?'}" if run.target != "cpu" else ""
    return (f"{_badge(run.target)}{e(ident.device)}<small>{e(runtime)}</small><br>"
            f"<small>{e(f'torch {ident.torch or chr(8211)} · vLLM {ident.vllm or chr(8211)}')}</small>")


def _badge(target: str) -> str:
    return f'<span class="tgt t-{e(target)}">{e(target)}</span>'


def _label(verdict: Verdict) -> str:
    newest = (f'<br><small class="newest">{run_link(verdict.run.run_id)}</small>' if verdict.run else
              "" if verdict.any_run is None else '<br><small class="muted">no counted run</small>')
    if verdict.certified is not None:
        what = "never run" if verdict.any_run is None else verdict.key
        return f'<b>{e(verdict.certified.id)}</b><br><small class="key">{e(what)}</small>{newest}'
    combo = verdict.combo
    note = f"<b>{e(combo)}</b> <small>(not in ci/matrix.toml)</small><br>" if combo else ""
    return f'{note}<small class="key">{e(verdict.key)}</small>{newest}'


def _counterpart(verdict: Verdict) -> str:
    if verdict.target == "cuda":
        return '<span class="muted">(the reference)</span>'
    other = verdict.counterpart
    if other is None:
        return '<span class="muted">no CUDA lineage has runs</span>'
    name = other.certified.id if other.certified and other.any_run is None else other.key
    differs = ("" if not verdict.counterpart_differs else
               f'<br><small class="differs">differs: {e("; ".join(verdict.counterpart_differs))}</small>')
    return f'{verdict_badge(other.state)}<br><small class="key">{e(name)}</small>{differs}'


def reasons_html(verdict: Verdict) -> str:
    """The first reason on one line; every reason, and each flaky check's flips, when it is opened."""
    if not verdict.reasons:
        return '<span class="muted">nothing to report</span>'
    items = "".join(f"<li>{e(reason)}</li>" for reason in verdict.reasons)
    flips = "".join(f'<li data-flaky="{e(f.check_id)}"><code>{e(f.check_id)}</code> ({e(f.tier.upper())}): '
                    + " → ".join(f"{e(outcome)} in {run_link(run_id)}" for run_id, outcome in f.steps) + "</li>"
                    for f in verdict.flaky)
    flaky = f'<h4>Flaky checks and their flips</h4><ul class="flaky">{flips}</ul>' if flips else ""
    return (f'<details class="why"><summary>{e(verdict.reasons[0])}</summary>'
            f'<ul class="reasons">{items}</ul>{flaky}</details>')


def _row(verdict: Verdict) -> str:
    flaky = f' <span class="badge c-new_failure" title="flaky checks">{len(verdict.flaky)} flaky</span>' \
        if verdict.flaky else ""
    return (f'<tr data-lineage="{e(verdict.key)}" data-target="{e(verdict.target)}" data-verdict="{e(verdict.state)}" '
            f'data-combo="{e(verdict.combo or "installed")}" data-certified="{int(verdict.certified is not None)}" '
            f'data-flaky="{len(verdict.flaky)}"><td class="label">{_label(verdict)}</td><td>{_stack(verdict)}</td>'
            f"<td>{verdict_badge(verdict.state)}{flaky}</td><td class=\"why\">{reasons_html(verdict)}</td>"
            f"<td>{_tier_coverage(verdict)}</td><td>{_counterpart(verdict)}</td></tr>")


def decision(data: SiteData) -> str:
    groups = (("certified", "Combinations ci/matrix.toml certifies", [v for v in data.verdicts if v.certified]),
              ("installed", "Installed stacks and other lineages", [v for v in data.verdicts if not v.certified]))
    bodies = "".join(f'<tbody class="{cls}"><tr class="group"><th colspan="{len(HEAD)}">{e(title)} '
                     f'<small>({len(rows)})</small></th></tr>{"".join(_row(v) for v in rows)}</tbody>'
                     for cls, title, rows in groups if rows)
    header = "".join(f"<th>{e(h)}</th>" for h in HEAD)
    cols = "".join(f'<col style="width:{w}">' for w in WIDTHS)
    body = (f'<table class="list decision" id="decision-table"><colgroup>{cols}</colgroup><thead><tr>{header}</tr>'
            f"</thead>{bodies}</table>"
            if bodies else '<p class="muted">No runs yet and no combination listed.</p>')
    rules = "".join(f'<dt>{verdict_badge(level)}</dt><dd>{text}</dd>' for level, text in LEVEL_RULES)
    body += (f'<details class="levels" id="decision-levels" open><summary>What each level requires</summary>'
             f'<dl class="levels">{rules}</dl><p class="muted">Only counted runs decide: refused, interrupted, '
             "narrowed, contradicted (a target or combination its own fingerprint denies) and planted-fault runs are "
             "named among the reasons and change nothing. Each tier is judged on its newest counted run; flips are "
             "read across all of them. The CUDA counterpart of a certified combination is its CUDA pair in the "
             "matrix (same engine, then the same torch and vLLM); of any other lineage, the CUDA lineage of the "
             "same engine, model and dtype, or the nearest one with what differs.</p></details>")
    intro = ("Per combination of ci/matrix.toml (never run: <b>no evidence</b>) and per installed lineage, CUDA "
             "counterpart beside it. <b>production-safe</b> needs the real model, P0 and P1 complete and P3 accuracy "
             "judged; a test model is at best <b>stack conformant</b>. A <b>flaky</b> check (passed, failed, passed "
             "again across counted runs) makes a lineage <b>not safe</b>: the newest run alone does not decide. "
             "Rules under the table.")
    return section("decision", "Release decision per combination", body, intro)
