"""One run as GitHub-flavoured Markdown, for a CI job summary ($GITHUB_STEP_SUMMARY).

`python -m reports.job_summary RUN_DIR` appends the summary to $GITHUB_STEP_SUMMARY when it is set and
prints it otherwise. Text from the run is escaped: GitHub renders HTML inside Markdown, and a `|` would
break a table row.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reports import analysis
from reports.history import CheckRow
from reports.htmlbits import CLASS_LABEL, first_line, link_text
from reports.results import OUTCOMES, ResultsError, load_run
from reports.signatures import diagnose
from reports.stack import identify

FAILING = ("failed", "error")


def md(text: str) -> str:
    """Escape run text for a Markdown table cell."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("`", "\\`").replace("\n", " "))


def code(text: str) -> str:
    """A code span: its content is shown literally, so only backticks and table pipes need care."""
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def job_summary(record: dict) -> str:
    """The Markdown summary of one validated results record."""
    ident = identify(record["target"], record["fingerprint"])
    summary = record["summary"]
    red = not record["complete"] or summary["failed"] + summary["error"] > 0
    verdict = "FAIL" if red else "PASS"
    heading = f"## {'❌' if red else '✅'} Conformance {verdict}: {md(ident.label)}"
    if record.get("planted_fault"):  # a negative control: its checks are meant to fail on the fault
        fault = code(record["planted_fault"])
        heading = (f"## 🧪 Negative control, fault {fault} planted: "
                   + ("a check failed on it (see `conformance drill` for the verdict)" if summary["failed"] else
                      "**no check failed on it**" if record["complete"] else "**incomplete**")
                   + f" · {md(ident.label)}")
    lines = [
        heading,
        "",
        f"Run {code(record['run_id'])} · tiers {', '.join(t.upper() for t in record['tiers'])} · engine "
        f"{md(record['engine'])} · model {md(record['model']['name'])} · "
        f"{md(record['combo'] or 'installed stack')}{'' if record['complete'] else ' · **incomplete**'}",
        "",
        _row(list(OUTCOMES)),
        _row(["---:"] * len(OUTCOMES)),
        _row([str(summary[o]) for o in OUTCOMES]),
        "",
    ]
    checks = [CheckRow(record["run_id"], c["id"], c["tier"], c["area"], c["outcome"], c["duration_s"],
                       c["message"], c.get("failure_class"), c.get("bug_link"), c["reference"], c["figures"])
              for c in record["checks"]]
    failing = [c for c in checks if c.outcome in FAILING]
    if failing:
        lines += ["### Failures", "", _row(["Check", "Tier", "Outcome", "Class", "Message", "Diagnosis"]),
                  _row(["---"] * 6)]
        for check in failing:
            found = diagnose(check.message)
            cls = analysis.failure_class(check, found.signature.failure_class if found else None)
            diagnosis = md(found.signature.cause) if found else ""
            if found and found.signature.link:
                diagnosis += f" [{md(link_text(found.signature.link))}]({found.signature.link})"
            lines.append(_row([code(check.id), check.tier.upper(), check.outcome,
                               md(CLASS_LABEL.get(cls or "", cls or "")), md(first_line(check.message, 200)),
                               diagnosis]))
        lines.append("")
    known = [c for c in checks if c.outcome in ("xfailed", "xpassed")]
    if known:
        lines += ["<details><summary>Known bugs (xfail / xpass)</summary>", ""]
        for check in known:
            bug = f" — [{md(link_text(check.bug_link))}]({check.bug_link})" if check.bug_link and \
                check.bug_link.startswith("https://") else ""
            lines.append(f"- {code(check.id)}: {check.outcome}{bug}")
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.job_summary",
                                     description="Write one run's Markdown summary for a CI job page.")
    parser.add_argument("run_dir", type=Path, help="a run directory holding results.json")
    args = parser.parse_args(argv)
    try:
        text = job_summary(load_run(args.run_dir))
    except ResultsError as exc:
        print(f"job summary: {exc}", file=sys.stderr)
        return 2
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
